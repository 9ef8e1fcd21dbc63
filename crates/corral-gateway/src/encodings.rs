//! The forms in which a real value may come back from an origin, each paired with the same form
//! of the placeholder the jail knows: every encoding corral itself produced when it put the value
//! into a request (the raw value into a header, the percent-encoded value into a form-encoded
//! refresh, the JSON-escaped value into a JSON one), and the usual re-encodings of those by an
//! origin that quotes them (lower-case hex, `\/`, `\u00XX`, base64). The scrubber replaces
//! each; an origin that transforms a value in some other way (hashes, reverses, splits it over
//! two answers) is out of its reach.

use base64::Engine as _;

/// `s` percent-encoded as corral encodes form values: unreserved bytes (RFC 3986) kept, every
/// other byte `%XX` with upper-case hex.
pub(crate) fn percent_encode(s: &[u8]) -> Vec<u8> {
    percent(s, true, false)
}

/// Percent-encoding with upper- or lower-case hex; `plus`: a space is `+` (form encoding).
fn percent(s: &[u8], upper: bool, plus: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b);
        } else if plus && b == b' ' {
            out.push(b'+');
        } else if upper {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.extend_from_slice(format!("%{b:02x}").as_bytes());
        }
    }
    out
}

/// The inside of the JSON string corral's serializer writes for `s` (serde_json: `"`, `\` and
/// control characters escaped), for a value that is UTF-8; `None` otherwise.
pub(crate) fn json_escaped(s: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(s).ok()?;
    let quoted = serde_json::to_string(s).ok()?;
    Some(quoted.as_bytes()[1..quoted.len() - 1].to_vec())
}

/// JSON escaping of every byte that is not alphanumeric as `\u00XX` (upper or lower hex), as
/// serializers that escape HTML-sensitive characters write them; ASCII values only.
fn json_unicode(s: &[u8], upper: bool) -> Option<Vec<u8>> {
    if !s.is_ascii() {
        return None;
    }
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        if b.is_ascii_alphanumeric() {
            out.push(b);
        } else if upper {
            out.extend_from_slice(format!("\\u{b:04X}").as_bytes());
        } else {
            out.extend_from_slice(format!("\\u{b:04x}").as_bytes());
        }
    }
    Some(out)
}

/// Each form of `value`: raw, percent-encoded (upper and lower hex, `+` for a space),
/// JSON-escaped (serde_json's form, with `\/` for `/`, and `\u00XX` for every other byte),
/// base64 (standard and URL-safe, with and without padding).
pub(crate) fn forms(value: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![
        value.to_vec(),
        percent(value, true, false),
        percent(value, false, false),
        percent(value, true, true),
        percent(value, false, true),
    ];
    if let Some(j) = json_escaped(value) {
        let slashed = crate::replace(&j, b"/", b"\\/");
        out.push(j);
        out.push(slashed);
    }
    out.extend([true, false].iter().filter_map(|&u| json_unicode(value, u)));
    for engine in [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        out.push(engine.encode(value).into_bytes());
    }
    out
}

/// Each form of `real` ([`forms`]) paired with the same form of `placeholder`.
pub(crate) fn scrub_pairs(real: &[u8], placeholder: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let (r, p) = (forms(real), forms(placeholder));
    debug_assert_eq!(r.len(), p.len());
    r.into_iter()
        .zip(p)
        .filter(|(r, _)| !r.is_empty())
        .collect()
}

/// The URL-safe spelling of a standard base64 string corral produced (a `Basic` credential),
/// which an origin may quote that way.
pub(crate) fn url_safe(b64: &[u8]) -> Vec<u8> {
    b64.iter()
        .map(|&b| match b {
            b'+' => b'-',
            b'/' => b'_',
            b => b,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_a_google_style_token() {
        let real = b"1//0gAb+c=d e\"f";
        let pairs = scrub_pairs(real, b"1//0gXYZWVUTSRQ");
        let needles: Vec<String> = pairs
            .iter()
            .map(|(r, _)| String::from_utf8(r.clone()).unwrap())
            .collect();
        for want in [
            "1//0gAb+c=d e\"f",
            "1%2F%2F0gAb%2Bc%3Dd%20e%22f",
            "1%2f%2f0gAb%2bc%3dd%20e%22f",
            "1%2F%2F0gAb%2Bc%3Dd+e%22f",
            "1//0gAb+c=d e\\\"f",
            "1\\/\\/0gAb+c=d e\\\"f",
            "1\\u002F\\u002F0gAb\\u002Bc\\u003Dd\\u0020e\\u0022f",
            "MS8vMGdBYitjPWQgZSJm",
        ] {
            assert!(
                needles.iter().any(|n| n == want),
                "{want} not in {needles:?}"
            );
        }
        assert_eq!(url_safe(b"a+b/c="), b"a-b_c=".to_vec());
    }
}
