//! `/proc/self/mountinfo`, the fields the name gate needs: which file systems are the jail's
//! own (corral-sandbox gatexec.rs) and which files are read-only binds of one file
//! (namegate/protected.rs); its path escapes for the cgroup hierarchies too (corral-sandbox
//! cgroup.rs); and how corral reads such files.

/// A file of /proc (or /sys) whole. Such files report no size, so `std::fs::read` starts with
/// 32-byte reads and doubles (eight calls for a 2 KB mountinfo); this has room for 16 KiB from
/// the first read (two calls).
pub fn read_proc(path: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::with_capacity(16 * 1024);
    std::fs::File::open(path)?.read_to_end(&mut out)?;
    Ok(out)
}

/// The fields of a mountinfo line the gate reads.
pub struct Mount {
    /// The mounted file system's directory (or file) that is mounted: `/` for a whole one.
    pub root: Vec<u8>,
    /// Where it is mounted, as this process sees it.
    pub point: Vec<u8>,
    /// Whether the mount itself is read-only (its per-mount `ro`, not the super block's).
    pub read_only: bool,
    pub fstype: Vec<u8>,
}

impl Mount {
    /// `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER`.
    pub fn parse(line: &[u8]) -> Option<Mount> {
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let dash = fields.iter().position(|f| *f == b"-")?;
        Some(Mount {
            root: unescape(fields.get(3)?),
            point: unescape(fields.get(4)?),
            read_only: fields.get(5)?.split(|&b| b == b',').any(|o| o == b"ro"),
            fstype: fields.get(dash + 1)?.to_vec(),
        })
    }
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
pub fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_decoded() {
        assert_eq!(unescape(br"/a\040b\134c\011"), b"/a b\\c\t");
        assert_eq!(unescape(br"/x\04"), br"/x\04");
        assert_eq!(unescape(br"/x\999"), br"/x\999");
    }

    #[test]
    fn the_mounts_own_read_only_flag_is_read() {
        let m = Mount::parse(
            br"58 40 254:0 /p/.git/config /p/.git/config ro,nosuid,relatime shared:1 - ext4 /dev/vda rw",
        )
        .unwrap();
        assert!(m.read_only);
        assert_eq!(m.point, b"/p/.git/config");
        assert_eq!(m.fstype, b"ext4");
        // The super block's `ro` is not the mount's.
        let m = Mount::parse(br"58 40 254:0 / /p rw,relatime - ext4 /dev/vda ro").unwrap();
        assert!(!m.read_only);
        assert!(Mount::parse(b"58 40 254:0 / /p rw").is_none());
    }
}
