//! `filesystem.hide`'s patterns and their one matcher. The walk that masks the project's
//! matching files at start (`resolve::find_masked`), the name gate that refuses the jail
//! creating a matching name during the run (corral-namegate `namegate.rs`) and the check at the
//! end of the run for matching files nobody masked (corral-session `replaced.rs`) all ask it.

use std::path::Path;

use crate::error::PolicyError;

/// The `hide` glob of one pattern: without a slash it matches at any depth; with one it is
/// anchored at the project root. A trailing slash is dropped: a pattern names files and
/// directories alike.
pub(crate) fn glob(pattern: &str) -> Result<globset::Glob, String> {
    let p = pattern.trim_end_matches('/');
    if p.is_empty() || p == "/" {
        return Err(format!("filesystem.hide: empty pattern {pattern:?}"));
    }
    let g = if let Some(anchored) = p.strip_prefix('/') {
        anchored.to_string()
    } else if p.contains('/') {
        p.to_string()
    } else {
        format!("**/{p}")
    };
    globset::GlobBuilder::new(&g)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("filesystem.hide: invalid pattern {pattern:?}: {e}"))
}

/// The `hide` patterns of a Plan, compiled.
#[derive(Debug, Clone)]
pub struct HideSet {
    patterns: Vec<String>,
    set: globset::GlobSet,
}

impl HideSet {
    /// Compile `patterns` (as the Plan's `hide` holds them).
    pub fn new(patterns: &[String]) -> Result<HideSet, PolicyError> {
        let mut b = globset::GlobSetBuilder::new();
        for p in patterns {
            b.add(glob(p).map_err(PolicyError::Invalid)?);
        }
        let set = b
            .build()
            .map_err(|e| PolicyError::Invalid(format!("filesystem.hide: {e}")))?;
        Ok(HideSet {
            patterns: patterns.to_vec(),
            set,
        })
    }

    /// That each of `patterns` is a valid `hide` pattern, without compiling the set (which
    /// [`HideSet::new`] does, and may be put off until a name is matched).
    pub fn check(patterns: &[String]) -> Result<(), PolicyError> {
        for p in patterns {
            glob(p).map_err(PolicyError::Invalid)?;
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Does a pattern match `rel`, a path relative to the project root?
    pub fn is_match(&self, rel: &Path) -> bool {
        self.set.is_match(rel)
    }

    /// The first pattern that matches `rel` (as written in the policy), if one does.
    pub fn matching(&self, rel: &Path) -> Option<&str> {
        self.set
            .matches(rel)
            .first()
            .map(|&i| self.patterns[i].as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_at_any_depth_or_from_the_root() {
        let set = HideSet::new(&[
            ".env".into(),
            ".env.*".into(),
            "*.pem".into(),
            "config/secrets.yml".into(),
            "/top.key".into(),
            "secrets/".into(),
        ])
        .unwrap();
        let table = [
            (".env", Some(".env")),
            ("sub/deep/.env", Some(".env")),
            (".env.local", Some(".env.*")),
            ("a/.env.d", Some(".env.*")),
            ("cert.pem", Some("*.pem")),
            ("a/b/cert.pem", Some("*.pem")),
            ("config/secrets.yml", Some("config/secrets.yml")),
            ("other/config/secrets.yml", None),
            ("top.key", Some("/top.key")),
            ("sub/top.key", None),
            ("secrets", Some("secrets/")),
            ("a/secrets", Some("secrets/")),
            (".envrc", None),
            ("env", None),
            ("x.env", None),
            ("a.pem/inner", None),
        ];
        for (rel, want) in table {
            assert_eq!(set.matching(Path::new(rel)), want, "{rel}");
            assert_eq!(set.is_match(Path::new(rel)), want.is_some(), "{rel}");
        }
    }

    #[test]
    fn a_bad_pattern_is_an_error() {
        for bad in ["", "/", "a[", "//"] {
            assert!(HideSet::new(&[bad.into()]).is_err(), "{bad:?}");
        }
    }
}
