//! Rules by method and path through the policy's layers: where they land in the Plan, what a
//! project file grants with them, and the flag.

use std::collections::BTreeMap;
use std::path::PathBuf;

use corral_policy::domain::DomainPattern;
use corral_policy::pathrule::PathRule;
use corral_policy::{Flags, Request, resolve};
use similar_asserts::assert_eq;

struct Fx {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
    corral: PathBuf,
}

fn fx() -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let root = base.join("proj");
    let home = base.join("home");
    std::fs::create_dir_all(root.join(".git")).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let corral = base.join("corral-bin");
    std::fs::write(&corral, "").unwrap();
    Fx {
        _tmp: tmp,
        root,
        home,
        corral,
    }
}

impl Fx {
    fn req(&self, flags: Flags) -> Request {
        Request {
            cwd: self.root.clone(),
            profile: None,
            command: Vec::new(),
            flags,
            env: BTreeMap::from([("PATH".to_string(), "/nonexistent".to_string())]),
            home: self.home.clone(),
            uid: 1000,
            gid: 1000,
            corral_exe: self.corral.clone(),
            user_config: Some(self.home.join("none/config.toml")),
        }
    }
}

#[test]
fn path_rules_land_in_allow_paths_and_a_project_file_grants_them() {
    let f = fx();
    std::fs::write(
        f.root.join("corral.toml"),
        "[network]\nmode = \"proxy\"\nallow = [\"api.example.com\", \"GET,POST Evil.Example.com/x/**\"]\n",
    )
    .unwrap();
    let plan = resolve(&f.req(Flags::default())).unwrap();
    assert_eq!(
        plan.network.allow,
        vec![DomainPattern::parse("api.example.com").unwrap()]
    );
    assert_eq!(
        plan.network.allow_paths,
        vec![PathRule::parse("GET,POST evil.example.com/x/**").unwrap()]
    );
    let d = f.root.join("corral.toml").display().to_string();
    assert_eq!(
        plan.project_grants,
        vec![
            format!("{d}:3:10: network.allow lets the jail reach api.example.com"),
            format!("{d}:3:29: network.allow lets the jail reach GET,POST evil.example.com/x/**"),
        ]
    );
}

#[test]
fn the_allow_flag_takes_a_path_rule() {
    let f = fx();
    let flags = Flags {
        allow: vec!["GET api.example.com/repos/**".into()],
        ..Flags::default()
    };
    let plan = resolve(&f.req(flags)).unwrap();
    assert!(plan.network.allow.is_empty());
    assert_eq!(
        plan.network.allow_paths,
        vec![PathRule::parse("GET api.example.com/repos/**").unwrap()]
    );
    let flags = Flags {
        allow: vec!["GET api.example.com".into()],
        ..Flags::default()
    };
    let e = resolve(&f.req(flags)).unwrap_err().to_string();
    assert!(
        e.starts_with("--allow \"GET api.example.com\": invalid network rule"),
        "{e}"
    );
}
