//! Fuzz the request-path normaliser and the rules by method and path (issue #17 part 3): the
//! request target is chosen by the jail, the rule by the policy.
//!
//! Input: `RULE\nMETHOD\nTARGET`. Properties: nothing panics; a normalised target has no `.`,
//! `..` or empty segment (but a trailing one), holds no escaped `/`, `\`, `;` or `%`, and
//! normalises again to itself (the form decided is the form forwarded); a parsed rule re-parses
//! from its canonical form to the same rule; a rule never allows a path its literal prefix does
//! not start with, nor a path of another length when it has no `**`.
#![no_main]

use corral_policy::pathrule::PathRule;
use corral_policy::reqpath::normalize;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = s.splitn(3, '\n');
    let (rule, method, target) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );

    let norm = normalize(target).ok();
    if let Some(n) = &norm {
        let last = n.segments.len().saturating_sub(1);
        for (i, seg) in n.segments.iter().enumerate() {
            assert!(seg != "." && seg != "..", "{target:?} -> {:?}", n.segments);
            assert!(
                !seg.is_empty() || i == last,
                "{target:?} -> {:?}",
                n.segments
            );
            let up = seg.to_ascii_uppercase();
            for bad in ["%2F", "%5C", "%3B", "%25", "/", "\\", ";"] {
                assert!(!up.contains(bad), "{target:?} -> {:?}", n.segments);
            }
        }
        assert_eq!(
            normalize(&n.target()).as_ref(),
            Ok(n),
            "{target:?} does not normalise to a fixed point"
        );
    }

    let Ok(r) = PathRule::parse(rule) else {
        return;
    };
    let canon = r.to_string();
    assert_eq!(
        PathRule::parse(&canon),
        Ok(r.clone()),
        "{rule:?} -> {canon:?}"
    );
    let Some(n) = norm else {
        return;
    };
    if !r.allows(method, &n.segments) {
        return;
    }
    assert!(r.methods().is_empty() || r.methods().iter().any(|m| m == method));
    let glob = r.path();
    // `/` alone is the empty glob: the root only.
    let glob: Vec<&str> = match glob.as_str() {
        "/" => Vec::new(),
        g => g.split('/').skip(1).collect(),
    };
    if !glob.contains(&"**") {
        assert_eq!(
            glob.len(),
            n.segments.len(),
            "{canon:?} allowed {:?}",
            n.segments
        );
    }
    for (g, seg) in glob.iter().take_while(|g| **g != "**").zip(&n.segments) {
        match *g {
            "*" => assert!(!seg.is_empty(), "{canon:?} allowed {:?}", n.segments),
            lit => assert_eq!(lit, seg, "{canon:?} allowed {:?}", n.segments),
        }
    }
});
