//! Per-run placeholders that keep the shape of the real value.
//!
//! Harnesses sniff credentials: pi tells an Anthropic OAuth token from an API key by the
//! `sk-ant-oat` in the value, some tools check a prefix or a length. So a placeholder keeps:
//!
//! - the real value's *vendor prefix*: its leading segments ending in `-` or `_`, each 1 to 8
//!   characters of `[a-z0-9]` with at least one letter beyond `f` (so no segment of a UUID or
//!   a hex or decimal value is kept), at most 4 of them (`sk-ant-api03-`, `sk-ant-oat01-`,
//!   `sk-proj-`, `ghp_`, `github_pat_`, `xoxb-`); a value with no such prefix (`AIza...`) keeps
//!   none;
//! - its length, and the position of every character that is not ASCII alphanumeric (`-`, `_`,
//!   `.`) in the rest;
//! - its alphabet: a rest made only of lower-case hex digits gets hex digits, any other rest gets
//!   ASCII letters and digits.
//!
//! Every alphanumeric character after the prefix is drawn fresh from the OS random source, so
//! the placeholder tells nothing about the real value beyond that shape. When the real value
//! leaves fewer than [`MIN_RANDOM`] characters to randomise, the placeholder is longer than the
//! real value (shape given up for uniqueness: a short placeholder could appear by chance in
//! unrelated header values).

use crate::GatewayError;

/// Fewest random characters a placeholder carries.
pub const MIN_RANDOM: usize = 20;

/// Longest vendor prefix segment kept.
const MAX_SEGMENT: usize = 8;
/// Most vendor prefix segments kept.
const MAX_SEGMENTS: usize = 4;

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const HEX: &[u8] = b"0123456789abcdef";

/// The vendor prefix of a credential (see the module docs), possibly empty.
pub fn vendor_prefix(real: &str) -> &str {
    let bytes = real.as_bytes();
    let mut end = 0;
    let mut segments = 0;
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'-' || b == b'_' {
            let seg = &bytes[start..i];
            // A segment made of hex digits only (a UUID's `3f2a9c1d-`, a number) is part of
            // the secret, not a vendor's name: it is never kept.
            let ok = !seg.is_empty()
                && seg.len() <= MAX_SEGMENT
                && seg
                    .iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && seg.iter().any(|c| (b'g'..=b'z').contains(c));
            if !ok || segments == MAX_SEGMENTS {
                break;
            }
            segments += 1;
            end = i + 1;
            start = i + 1;
        } else if !(b.is_ascii_lowercase() || b.is_ascii_digit()) {
            break;
        }
    }
    &real[..end]
}

/// A fresh placeholder shaped like `real`.
pub fn placeholder_for(real: &str) -> Result<String, GatewayError> {
    let prefix = vendor_prefix(real);
    let rest = &real[prefix.len()..];
    let alphabet = if !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        HEX
    } else {
        ALNUM
    };
    // Shape of the rest: keep separators, randomise alphanumerics.
    let mut shape: Vec<Option<u8>> = rest
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || !b.is_ascii_graphic() {
                None
            } else {
                Some(b)
            }
        })
        .collect();
    let random = shape.iter().filter(|s| s.is_none()).count();
    if random < MIN_RANDOM {
        shape.extend(std::iter::repeat_n(None, MIN_RANDOM - random));
    }
    loop {
        let mut out = String::with_capacity(prefix.len() + shape.len());
        out.push_str(prefix);
        let mut rnd = vec![0u8; shape.len()];
        getrandom::fill(&mut rnd).map_err(|e| GatewayError::Random(e.to_string()))?;
        for (slot, r) in shape.iter().zip(rnd) {
            match slot {
                Some(sep) => out.push(*sep as char),
                // 256 is a multiple of 16 (hex); for 62 symbols the bias is < 1.6 %, harmless
                // for a placeholder whose only job is to be unique and unguessable enough.
                None => out.push(alphabet[usize::from(r) % alphabet.len()] as char),
            }
        }
        if out != real {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_of_known_credentials() {
        assert_eq!(vendor_prefix("sk-ant-api03-AbCdEf0123"), "sk-ant-api03-");
        assert_eq!(vendor_prefix("sk-ant-oat01-AbCdEf0123"), "sk-ant-oat01-");
        assert_eq!(vendor_prefix("sk-proj-AbCdEf"), "sk-proj-");
        assert_eq!(vendor_prefix("ghp_AbCdEf"), "ghp_");
        assert_eq!(vendor_prefix("github_pat_11AbCd_xyz"), "github_pat_");
        assert_eq!(vendor_prefix("AIzaSyAbCdEf"), "");
        assert_eq!(vendor_prefix("plainsecretvalue"), "");
        assert_eq!(vendor_prefix(""), "");
        // Segments of the secret itself are never kept.
        assert_eq!(vendor_prefix("3f2a9c1d-8b7e-4f6a-9c2d-1e3b5a7f9d0c"), "");
        assert_eq!(vendor_prefix("abcd1234-8b7e-4f6a-9c2d-1e3b5a7f9d0c"), "");
        assert_eq!(vendor_prefix("1234_5678_9012"), "");
        assert_eq!(vendor_prefix("sk-3f2a9c1d-8b7e"), "sk-");
    }

    #[test]
    fn placeholder_keeps_shape_and_differs() {
        let real = "sk-ant-oat01-Zx9_yQ8wV7uT6sR5qP4oN3mL2kJ1iH0gF-abcdefgh";
        let p1 = placeholder_for(real).unwrap();
        let p2 = placeholder_for(real).unwrap();
        assert_ne!(p1, real);
        assert_ne!(p1, p2, "placeholders are fresh per call");
        assert_eq!(p1.len(), real.len());
        assert!(p1.starts_with("sk-ant-oat01-"), "{p1}");
        for (a, b) in p1.bytes().zip(real.bytes()) {
            assert_eq!(a.is_ascii_alphanumeric(), b.is_ascii_alphanumeric());
        }
        // The random part shares no long run with the real value.
        let rest = &real[13..];
        assert!(!p1.contains(&rest[..12]));
    }

    #[test]
    fn hex_stays_hex_and_short_values_grow() {
        let real = "0123456789abcdef0123456789abcdef";
        let p = placeholder_for(real).unwrap();
        assert_eq!(p.len(), real.len());
        assert!(p.bytes().all(|b| HEX.contains(&b)), "{p}");
        let p = placeholder_for("short").unwrap();
        assert_eq!(p.len(), MIN_RANDOM);
    }
}
