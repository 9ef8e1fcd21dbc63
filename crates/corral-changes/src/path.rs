//! Project-relative paths as the record keeps them: components joined by `/`, none empty,
//! `.` or `..`; the empty path is the project's root.

/// `dir` joined with `name` (`dir` empty: the root).
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    if name.is_empty() {
        return dir.to_vec();
    }
    [dir, b"/", name].concat()
}

/// The directory part and the last component of `rel` (not empty).
pub fn split(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&b""[..], rel),
    }
}

/// Is `rel` a path the record may hold? Read back from the record, anything else is damage.
pub fn valid(rel: &[u8]) -> bool {
    rel.is_empty()
        || (!rel.contains(&0)
            && rel
                .split(|&b| b == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b".."))
}

/// How many components `rel` has (the root: 0).
pub fn depth(rel: &[u8]) -> usize {
    if rel.is_empty() {
        0
    } else {
        rel.iter().filter(|&&b| b == b'/').count() + 1
    }
}

/// Is `rel` `dir` or below it?
pub fn within(rel: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || rel == dir || (rel.starts_with(dir) && rel.get(dir.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_are_valid() {
        for ok in [&b""[..], b"a", b"a/b", b"a b/.c", b"..a/b.."] {
            assert!(valid(ok), "{ok:?}");
        }
        for bad in [
            &b"/a"[..],
            b"a/",
            b"a//b",
            b".",
            b"a/..",
            b"../a",
            b"a/./b",
            b"a\0b",
        ] {
            assert!(!valid(bad), "{bad:?}");
        }
        assert_eq!(split(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split(b"c"), (&b""[..], &b"c"[..]));
        assert_eq!(join(b"", b"x"), b"x");
        assert_eq!(join(b"a", b"x"), b"a/x");
        assert_eq!(depth(b"a/b"), 2);
        assert!(within(b"a/b", b"a") && !within(b"ab", b"a") && within(b"a", b"a"));
    }
}
