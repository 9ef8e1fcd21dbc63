//! Names as bytes, written in the record as text: a path is any bytes but NUL, JSON holds
//! UTF-8. Valid UTF-8 is kept as it is except `\`, written `\\`; any other byte is `\xNN`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes (a path, a link's target) as the record writes them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Bytes(pub Vec<u8>);

/// `b` as text: UTF-8 runs kept (backslash doubled), other bytes `\xNN`.
pub fn encode(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    let mut rest = b;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                push_escaped(&mut out, s);
                break;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                // SAFETY-free: `good` is valid UTF-8 by `valid_up_to`.
                push_escaped(&mut out, std::str::from_utf8(good).unwrap_or_default());
                let n = e.error_len().unwrap_or(bad.len());
                for byte in &bad[..n] {
                    out.push_str(&format!("\\x{byte:02x}"));
                }
                rest = &bad[n..];
            }
        }
    }
    out
}

fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else {
            out.push(c);
        }
    }
}

/// The inverse of [`encode`]; `None` for text [`encode`] cannot have written.
pub fn decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b'\\') => {
                out.push(b'\\');
                i += 2;
            }
            Some(b'x') => {
                let hex = s.get(i + 2..i + 4)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 4;
            }
            _ => return None,
        }
    }
    Some(out)
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        decode(&s)
            .map(Bytes)
            .ok_or_else(|| serde::de::Error::custom("a name with a malformed escape"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_bytes_round_trip() {
        for b in [
            &b""[..],
            b"src/main.rs",
            b"a\\b",
            b"\\x41",
            b"\xff\xfe/\x00x",
            "caf\u{e9}/\u{1b}[2J".as_bytes(),
            b"a\xc3",
        ] {
            let text = encode(b);
            assert_eq!(decode(&text).as_deref(), Some(b), "{text}");
        }
        assert_eq!(encode(b"a\\b\xff"), "a\\\\b\\xff");
        assert_eq!(decode("a\\q"), None);
        assert_eq!(decode("a\\x4"), None);
    }
}
