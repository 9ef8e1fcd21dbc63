//! The executor's instructions in the manifests: `SKILL.md` (`corral skill`, the text the
//! native and container backends write) as the ConfigMap `NAME-skill`, mounted read-only in the
//! sandbox where the plan's skill directory is, and the skill's arguments (pi: `--skill DIR`)
//! after the harness's. Carried only with the executor's Pod: it teaches `corral exec`, which
//! finds no executor without it.

use std::collections::BTreeMap;

use corral_policy::plan::Plan;
use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapVolumeSource, PodSpec, Volume, VolumeMount};

use crate::{Options, meta};

const VOLUME: &str = "skill";
/// The file's name in the skill directory.
pub const FILE: &str = "SKILL.md";

fn name(opts: &Options) -> String {
    format!("{}-skill", opts.name)
}

/// Whether the sandbox gets the skill: the plan has one and the executor is rendered.
pub fn carried(plan: &Plan, opts: &Options) -> bool {
    plan.skill.is_some() && crate::executor::jail(plan, opts).is_some()
}

/// The ConfigMap holding `SKILL.md`.
pub fn config_map(opts: &Options) -> ConfigMap {
    ConfigMap {
        metadata: meta(opts, name(opts), "sandbox"),
        data: Some(BTreeMap::from([(
            FILE.into(),
            corral_exec::SKILL_MD.into(),
        )])),
        ..Default::default()
    }
}

/// The skill directory read-only in the harness's container, and the skill's arguments after
/// the harness's own (as the native runner appends them).
pub(crate) fn attach_sandbox(spec: &mut PodSpec, plan: &Plan, opts: &Options) {
    let Some(skill) = &plan.skill else {
        return;
    };
    let Some(c) = spec.containers.first_mut() else {
        return;
    };
    c.args
        .get_or_insert_with(Vec::new)
        .extend(skill.args.iter().cloned());
    c.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: VOLUME.into(),
            mount_path: skill.dir.display().to_string(),
            read_only: Some(true),
            ..Default::default()
        });
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: name(opts),
            default_mode: Some(0o444),
            ..Default::default()
        }),
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use corral_policy::plan::SkillPlan;

    use super::*;
    use crate::tests::with_executor;
    use crate::{Object, render, to_yaml};

    fn with_skill() -> (Plan, Options) {
        let (mut p, o) = with_executor();
        p.skill = Some(SkillPlan {
            dir: PathBuf::from("/run/corral/skill"),
            args: vec!["--skill".into(), "/run/corral/skill".into()],
        });
        (p, o)
    }

    fn sandbox_spec(objects: &[Object]) -> PodSpec {
        match objects.last() {
            Some(Object::Pod(p)) => p.spec.clone().unwrap(),
            other => panic!("the sandbox is last: {other:?}"),
        }
    }

    /// With the executor, the sandbox gets SKILL.md (the text `corral skill` prints) read-only
    /// at the plan's skill directory, and the harness the skill's arguments after its own.
    #[test]
    fn the_skill_is_carried_with_the_executor() {
        let (p, o) = with_skill();
        let objects = render(&p, &o).unwrap();
        let cm = objects
            .iter()
            .find_map(|x| match x {
                Object::ConfigMap(c) if c.metadata.name.as_deref() == Some("corral-demo-skill") => {
                    Some(c.clone())
                }
                _ => None,
            })
            .expect("the skill's ConfigMap");
        assert_eq!(
            cm.data.unwrap(),
            BTreeMap::from([(FILE.to_string(), corral_exec::SKILL_MD.to_string())])
        );
        let spec = sandbox_spec(&objects);
        let c = &spec.containers[0];
        similar_asserts::assert_eq!(
            c.args.clone().unwrap(),
            ["--verbose", "--skill", "/run/corral/skill"]
        );
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == VOLUME)
            .unwrap();
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            ("/run/corral/skill", Some(true))
        );
        let vol = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == VOLUME)
            .unwrap();
        assert_eq!(
            vol.config_map.as_ref().map(|c| c.name.as_str()),
            Some("corral-demo-skill")
        );
        assert!(
            crate::not_carried(&p, &o)
                .iter()
                .all(|l| !l.contains("SKILL"))
        );
        // The executor's own Pod does not get it.
        let yaml = to_yaml(&objects).unwrap();
        assert_eq!(yaml.matches("name: skill").count(), 2, "{yaml}");
    }

    /// Without the executor there is no `corral exec` to teach: no skill, and said so.
    #[test]
    fn no_executor_no_skill() {
        let (p, mut o) = with_skill();
        o.executor = None;
        let objects = render(&p, &o).unwrap();
        assert!(!to_yaml(&objects).unwrap().contains("SKILL"));
        let c = &sandbox_spec(&objects).containers[0];
        assert_eq!(c.args.clone().unwrap(), ["--verbose"]);
        assert!(
            crate::not_carried(&p, &o)
                .iter()
                .any(|l| l.contains("SKILL.md at /run/corral/skill"))
        );
    }
}
