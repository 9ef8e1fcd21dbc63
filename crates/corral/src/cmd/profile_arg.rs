//! The PROFILE word of `run`, `shell` and `plan`, checked before anything is resolved. The
//! usual slip is a command written without `--`: `corral run make test` names a profile
//! `make`; the error says so and gives the line that runs it (`corral run -- make test`). A
//! name close to a profile's gets "did you mean" (the policy crate's profile error).

use anyhow::bail;

/// Refuse `profile`/`extra` of `corral <cmd>` when they are not a profile alone.
pub fn check(cmd: &str, profile: Option<&str>, extra: &[String]) -> anyhow::Result<()> {
    let Some(name) = profile else {
        return Ok(());
    };
    // `shell` runs a shell: a command goes to `run`.
    let run_cmd = if cmd == "shell" { "run" } else { cmd };
    let p = match corral_policy::profile::profile(name) {
        Ok(p) => p,
        Err(e) => {
            let words = quoted(std::iter::once(name).chain(extra.iter().map(String::as_str)));
            bail!(
                "{e}\nto run `{words}` jailed, put the command after `--`:  corral {run_cmd} -- {words}"
            );
        }
    };
    if extra.is_empty() {
        return Ok(());
    }
    let args = quoted(extra.iter().map(String::as_str));
    let fix = if cmd == "shell" {
        format!("corral run {name} -- {args}")
    } else {
        let command = quoted(p.command.iter().map(String::as_str));
        format!("corral {cmd} {name} -- {command} {args}")
    };
    bail!(
        "unexpected {} after the profile {name:?}: a command goes after `--`, and replaces the \
         profile's; to run {:?} with them:  {fix}",
        if extra.len() == 1 {
            format!("argument {:?}", extra[0])
        } else {
            format!("arguments {args}")
        },
        p.command.join(" ")
    )
}

/// Words as a shell would need them written, joined by spaces.
fn quoted<'a>(words: impl Iterator<Item = &'a str>) -> String {
    words
        .map(corral_engine::shell_quote)
        .collect::<Vec<_>>()
        .join(" ")
}
