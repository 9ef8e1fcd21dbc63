use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use corral_policy::domain::{DomainPattern, normalize_host};
use corral_policy::signin::{ProviderPlan, SigninFormat, SigninPlan, parse_token_url};
use serde_json::{Value, json};

use super::*;

const ACCESS: &str = "sk-ant-oat01-REALaccessREALaccessREALaccess0123456789abcdefABCDEF";
const REFRESH: &str = "sk-ant-ort01-REALrefreshREALrefreshREALrefresh0123456789abcdefAB";

fn plan(dir: &Path, format: SigninFormat, file: &str) -> SigninPlan {
    let (token_host, token_path) = parse_token_url("https://auth.example/oauth/token").unwrap();
    SigninPlan {
        name: "h".into(),
        format,
        file: dir.join(file),
        api_hosts: vec![DomainPattern::parse("api.example").unwrap()],
        token_host: Some(token_host),
        token_path: Some(token_path),
        api_key_hosts: vec![],
        providers: vec![],
    }
}

/// The one-sign-in formats' refresh: a call of the plan's token endpoint.
fn refresh(s: &Signin, body: &[u8], form: bool) -> Option<Vec<u8>> {
    let host = normalize_host("auth.example").unwrap();
    let (r, out) = s.swap_refresh((&host, 443, "/oauth/token"), body, form)?;
    assert_eq!(r, Refreshing::of(None));
    Some(out)
}

fn whole() -> Refreshing {
    Refreshing::of(None)
}

fn claude_file(dir: &Path) -> SigninPlan {
    let p = plan(dir, SigninFormat::Claude, ".credentials.json");
    let v = json!({"claudeAiOauth": {
        "accessToken": ACCESS, "refreshToken": REFRESH, "expiresAt": 1000,
        "scopes": ["user:inference", "user:profile"], "subscriptionType": "max"
    }, "other": {"kept": true}});
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    std::fs::set_permissions(&p.file, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn file_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn has(hay: &[u8], needle: &str) -> bool {
    contains(hay, needle.as_bytes())
}

#[test]
fn a_missing_file_is_no_signin_and_a_wrong_shape_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), SigninFormat::Claude, "absent.json");
    assert!(Signin::load(p.clone()).unwrap().is_none());
    std::fs::write(&p.file, br#"{"claudeAiOauth": {"accessToken": 3}}"#).unwrap();
    let e = Signin::load(p).unwrap_err().to_string();
    assert!(
        e.contains("absent.json") && e.contains("/claudeAiOauth/accessToken"),
        "{e}"
    );
}

#[test]
fn the_jails_file_has_the_same_shape_and_placeholders_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = Signin::load(claude_file(dir.path())).unwrap().unwrap();
    let jailed = s.placeholder_file().unwrap();
    assert!(
        !has(&jailed, "REAL"),
        "{}",
        String::from_utf8_lossy(&jailed)
    );
    let v: Value = serde_json::from_slice(&jailed).unwrap();
    let o = &v["claudeAiOauth"];
    let (a, r) = (
        o["accessToken"].as_str().unwrap(),
        o["refreshToken"].as_str().unwrap(),
    );
    assert!(
        a.starts_with("sk-ant-oat01-") && a.len() == ACCESS.len(),
        "{a}"
    );
    assert!(
        r.starts_with("sk-ant-ort01-") && r.len() == REFRESH.len(),
        "{r}"
    );
    assert_eq!(o["scopes"], json!(["user:inference", "user:profile"]));
    assert_eq!(
        (o["expiresAt"].clone(), o["subscriptionType"].clone()),
        (json!(1000), json!("max"))
    );
    assert_eq!(v["other"], json!({"kept": true}));
}

/// The placeholders the jail's file holds: (access, refresh).
fn jail_tokens(s: &Signin) -> (String, String) {
    let v: Value = serde_json::from_slice(&s.placeholder_file().unwrap()).unwrap();
    let o = &v["claudeAiOauth"];
    (
        o["accessToken"].as_str().unwrap().to_string(),
        o["refreshToken"].as_str().unwrap().to_string(),
    )
}

#[test]
fn access_placeholder_is_swapped_only_in_credential_headers_to_bound_hosts_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let s = Signin::load(claude_file(dir.path())).unwrap().unwrap();
    let (ph, _) = jail_tokens(&s);
    let headers = || {
        vec![
            Header {
                name: "Authorization".into(),
                value: format!("Bearer {ph}").into_bytes(),
            },
            Header {
                name: "X-Echo".into(),
                value: ph.clone().into_bytes(),
            },
        ]
    };
    let signins = [s];
    let api = normalize_host("api.example").unwrap();
    let mut h = headers();
    let mut report = RewriteReport::default();
    swap_access(&signins, &mut h, (&api, 443), false, &mut report);
    assert_eq!(h[0].value, format!("Bearer {ACCESS}").into_bytes());
    assert_eq!(h[1].value, ph.as_bytes(), "non-credential header left");
    assert_eq!(
        report.injected,
        vec![("signin.h".into(), "authorization".into())]
    );
    for (host, plain) in [("evil.example", false), ("api.example", true)] {
        let mut h = headers();
        let mut report = RewriteReport::default();
        let host = normalize_host(host).unwrap();
        swap_access(&signins, &mut h, (&host, 443), plain, &mut report);
        assert_eq!(h, headers(), "{host} plain={plain}");
        assert!(report.injected.is_empty() && !report.left.is_empty());
    }
}

#[test]
fn a_refresh_gets_the_real_token_and_the_answer_reaches_the_jail_as_new_placeholders() {
    let dir = tempfile::tempdir().unwrap();
    let p = claude_file(dir.path());
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let (_, ph_refresh) = jail_tokens(&s);
    let req = format!(
        r#"{{"grant_type":"refresh_token","refresh_token":"{ph_refresh}","client_id":"c"}}"#
    );
    let up = refresh(&s, req.as_bytes(), false).unwrap();
    assert_eq!(up, req.replace(&ph_refresh, REFRESH).into_bytes());
    assert!(refresh(&s, b"refresh_token=somethingelse", true).is_none());

    let (new_a, new_r) = (
        "sk-ant-oat01-NEWaccessNEWaccessNEWaccess01",
        "sk-ant-ort01-NEWrefreshNEWrefreshNEWref01",
    );
    let answer = json!({"access_token": new_a, "refresh_token": new_r, "expires_in": 28800, "scope": "user:inference"});
    let (jailed, expires) = s
        .take_response(&whole(), &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    assert_eq!(expires, Some(28800));
    assert!(
        !has(&jailed, "NEW") && !has(&jailed, "REAL"),
        "{}",
        String::from_utf8_lossy(&jailed)
    );
    let jv: Value = serde_json::from_slice(&jailed).unwrap();
    let (pa, pr) = (
        jv["access_token"].as_str().unwrap(),
        jv["refresh_token"].as_str().unwrap(),
    );
    assert!(
        pa.starts_with("sk-ant-oat01-") && pa.len() == new_a.len(),
        "{pa}"
    );
    assert_eq!(jv["scope"], json!("user:inference"));
    // Old and new real tokens are all scrubbed from later answers.
    let pairs = s.scrub_pairs();
    for real in [ACCESS, REFRESH, new_a, new_r] {
        assert!(
            pairs.iter().any(|(r, _)| r == real.as_bytes()),
            "{real} not scrubbed"
        );
    }
    // The next refresh carries the new real refresh token.
    let next = refresh(&s, format!("refresh_token={pr}").as_bytes(), true).unwrap();
    assert_eq!(next, format!("refresh_token={new_r}").into_bytes());

    // Write-back: tokens and expiry updated, every other field and the mode kept.
    let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    s.write_back(&whole(), expires, now).unwrap();
    let v = file_json(&p.file);
    let o = &v["claudeAiOauth"];
    assert_eq!(
        (o["accessToken"].as_str(), o["refreshToken"].as_str()),
        (Some(new_a), Some(new_r))
    );
    assert_eq!(o["expiresAt"], json!(2_000_000_000_000u64 + 28_800_000));
    assert_eq!(o["scopes"], json!(["user:inference", "user:profile"]));
    assert_eq!(v["other"], json!({"kept": true}));
    let mode = std::fs::metadata(&p.file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
}

#[test]
fn a_refresh_on_the_host_meanwhile_is_adopted_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let p = claude_file(dir.path());
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let (_, ph_refresh) = jail_tokens(&s);
    // The host's Claude Code refreshed: the file holds a newer refresh token.
    let host_r = "sk-ant-ort01-HOSTrefreshHOSTrefreshHOSTrefresh01";
    let mut v = file_json(&p.file);
    v["claudeAiOauth"]["refreshToken"] = json!(host_r);
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    let up = refresh(&s, format!("refresh_token={ph_refresh}").as_bytes(), true).unwrap();
    assert_eq!(
        up,
        format!("refresh_token={host_r}").into_bytes(),
        "the host's token is used"
    );
    assert!(s.scrub_pairs().iter().any(|(r, _)| r == REFRESH.as_bytes()));

    // Changed again between the refresh and the write-back: left alone.
    let answer = json!({"access_token": "sk-ant-oat01-NEWaccessNEWaccessNEW", "expires_in": 10});
    s.take_response(&whole(), &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    v["claudeAiOauth"]["refreshToken"] = json!("sk-ant-ort01-OTHERotherOTHERotherOTHER01");
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = s
        .write_back(&whole(), Some(10), std::time::SystemTime::now())
        .unwrap_err();
    assert!(matches!(e, SigninError::Changed { .. }), "{e}");
    assert_eq!(file_json(&p.file), v);
}

#[test]
fn a_token_response_without_an_access_token_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Signin::load(claude_file(dir.path())).unwrap().unwrap();
    let before = s.scrub_pairs();
    assert!(
        s.take_response(&whole(), br#"{"error":"invalid_grant"}"#)
            .is_err()
    );
    assert!(s.take_response(&whole(), b"not json").is_err());
    assert_eq!(s.scrub_pairs(), before);
}

fn jwt(claims: &str, sig: &str) -> String {
    use base64::Engine as _;
    let e = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.{sig}",
        e(r#"{"alg":"RS256","typ":"JWT"}"#),
        e(claims)
    )
}

#[test]
fn codex_keeps_jwt_claims_and_replaces_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), SigninFormat::Codex, "auth.json");
    let sig = "SIGrealSIGrealSIGrealSIGrealSIGrealSIGreal-_0123";
    let (id, access) = (
        jwt(
            r#"{"email":"u@example.com","chatgpt_plan_type":"plus"}"#,
            sig,
        ),
        jwt(r#"{"exp":1900000000}"#, sig),
    );
    let v = json!({"OPENAI_API_KEY": null, "tokens": {"id_token": id, "access_token": access,
        "refresh_token": "rt_REALrefreshREALrefreshREAL0123", "account_id": "acc-1"},
        "last_refresh": "2026-01-01T00:00:00Z"});
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let jailed = s.placeholder_file().unwrap();
    assert!(!has(&jailed, "SIGreal") && !has(&jailed, "REALrefresh"));
    let jv: Value = serde_json::from_slice(&jailed).unwrap();
    let jid = jv["tokens"]["id_token"].as_str().unwrap();
    let keep = id.rsplit_once('.').unwrap().0;
    assert!(jid.starts_with(keep) && jid.len() == id.len(), "{jid}");
    assert_eq!(jv["tokens"]["account_id"], json!("acc-1"));
    let ph_r = jv["tokens"]["refresh_token"].as_str().unwrap();
    let up = refresh(
        &s,
        format!("grant_type=refresh_token&refresh_token={ph_r}").as_bytes(),
        true,
    );
    assert!(has(&up.unwrap(), "rt_REALrefresh"));
    let answer = json!({"access_token": jwt(r#"{"exp":1900009999}"#, "NEWsigNEWsigNEWsigNEWsigNEWsig01"), "id_token": id});
    let (out, _) = s
        .take_response(&whole(), &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    assert!(!has(&out, "NEWsig") && !has(&out, "SIGreal"));
    s.write_back(
        &whole(),
        None,
        UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    )
    .unwrap();
    let w = file_json(&p.file);
    assert!(
        w["tokens"]["access_token"]
            .as_str()
            .unwrap()
            .ends_with("NEWsigNEWsigNEWsigNEWsigNEWsig01")
    );
    assert_eq!(
        w["tokens"]["refresh_token"],
        json!("rt_REALrefreshREALrefreshREAL0123")
    );
    assert_eq!(w["last_refresh"], json!("2027-01-15T08:00:00.000000Z"));
}

#[test]
fn gemini_tokens_are_replaced_and_the_expiry_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), SigninFormat::Gemini, "oauth_creds.json");
    let v = json!({"access_token": "ya29.REALaccessREALaccessREALaccess_0123", "refresh_token": "1//REALrefreshREALrefreshREAL-0123",
        "scope": "https://www.googleapis.com/auth/cloud-platform", "token_type": "Bearer", "expiry_date": 1});
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let jailed = s.placeholder_file().unwrap();
    assert!(
        !has(&jailed, "REAL"),
        "{}",
        String::from_utf8_lossy(&jailed)
    );
    let jv: Value = serde_json::from_slice(&jailed).unwrap();
    let ph_r = jv["refresh_token"].as_str().unwrap();
    // Form-encoded: `/` of the real refresh token is percent-encoded.
    let up = refresh(
        &s,
        format!("refresh_token={ph_r}&grant_type=refresh_token").as_bytes(),
        true,
    )
    .unwrap();
    assert!(
        has(&up, "refresh_token=1%2F%2FREALrefresh"),
        "{}",
        String::from_utf8_lossy(&up)
    );
    // The placeholder itself percent-encoded by the jail's form encoder (curl, URLSearchParams).
    let encoded = ph_r.replace('/', "%2F");
    let up = refresh(&s, format!("refresh_token={encoded}").as_bytes(), true).unwrap();
    assert!(
        has(&up, "refresh_token=1%2F%2FREALrefresh"),
        "{}",
        String::from_utf8_lossy(&up)
    );
    let answer = json!({"access_token": "ya29.NEWaccessNEWaccessNEWaccess", "expires_in": 3599, "token_type": "Bearer"});
    let (out, exp) = s
        .take_response(&whole(), &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    assert!(!has(&out, "NEWaccess"));
    s.write_back(&whole(), exp, UNIX_EPOCH + Duration::from_secs(100))
        .unwrap();
    let w = file_json(&p.file);
    assert_eq!(w["access_token"], json!("ya29.NEWaccessNEWaccessNEWaccess"));
    assert_eq!(w["expiry_date"], json!(100_000 + 3_599_000));
    assert_eq!(w["scope"], v["scope"]);
}

#[test]
fn token_fields_corral_does_not_take_are_found_at_any_depth() {
    let stray = |v: Value| crate::signin::stray_token_field(&v, true);
    // Real answers: Anthropic's (nested account data), Google's (a token-named number).
    let anthropic = json!({"token_type": "Bearer", "access_token": "a", "refresh_token": "r",
        "expires_in": 28800, "scope": "user:inference",
        "organization": {"uuid": "o", "name": "n"}, "account": {"uuid": "u", "email_address": "e"}});
    assert_eq!(stray(anthropic), None);
    let google = json!({"access_token": "a", "expires_in": 3599, "scope": "s",
        "token_type": "Bearer", "id_token": null, "refresh_token_expires_in": 604799});
    assert_eq!(stray(google), None);
    for (v, field) in [
        (
            json!({"access_token": "a", "data": {"refresh_token": "r"}}),
            "data",
        ),
        (
            json!({"access_token": "a", "refreshToken": "r"}),
            "refreshToken",
        ),
        (json!({"access_token": "a", "tokens": ["r"]}), "tokens"),
        (json!({"access_token": "a", "x": [{"id-token": "i"}]}), "x"),
        (json!({"access_token": {"value": "a"}}), "access_token"),
        (
            json!({"access_token": "a", "session_token": "s"}),
            "session_token",
        ),
    ] {
        let found = stray(v.clone());
        assert!(found.is_some(), "{v}");
        if field != "data" && field != "x" {
            assert_eq!(found.as_deref(), Some(field), "{v}");
        }
    }
}

const PI_ACCESS: &str = "sk-ant-oat01-PIaccessPIaccessPIaccess0123456789abcdefABCDEF";
const PI_REFRESH: &str = "sk-ant-ort01-PIrefreshPIrefreshPIrefresh0123456789abcdefAB";
const PI_KEY: &str = "sk-proj-PIkeyPIkeyPIkeyPIkey0123456789abcdefABCDEF";
const UNKNOWN_KEY: &str = "gsk_UNKNOWNkeyUNKNOWNkeyUNKNOWN0123456789";
const UNKNOWN_ACCESS: &str = "tid=UNKNOWNaccess;exp=1;UNKNOWNaccessUNKNOWN01";

/// A by-provider plan: `anthropic` (API and token endpoint), `openai` (API only).
fn by_provider(dir: &Path, format: SigninFormat, file: &str) -> SigninPlan {
    let (token_host, token_path) = parse_token_url("https://auth.example/v1/oauth/token").unwrap();
    let (o_host, o_path) = parse_token_url("https://auth.openai.example/oauth/token").unwrap();
    SigninPlan {
        name: "pi".into(),
        format,
        file: dir.join(file),
        api_hosts: vec![],
        token_host: None,
        token_path: None,
        api_key_hosts: vec![],
        providers: vec![
            ProviderPlan {
                id: "anthropic".into(),
                api_hosts: vec![DomainPattern::parse("api.example").unwrap()],
                token_host: Some(token_host),
                token_path: Some(token_path),
            },
            ProviderPlan {
                id: "openai".into(),
                api_hosts: vec![DomainPattern::parse("api.openai.example").unwrap()],
                token_host: Some(o_host),
                token_path: Some(o_path),
            },
        ],
    }
}

/// pi's auth.json as pi-coding-agent 0.73.1 writes it: OAuth, an API key, a `!command` key, a
/// variable's name, a provider corral does not know.
fn pi_file(dir: &Path) -> SigninPlan {
    let p = by_provider(dir, SigninFormat::Pi, "auth.json");
    let v = json!({
        "anthropic": {"type": "oauth", "access": PI_ACCESS, "refresh": PI_REFRESH, "expires": 5},
        "openai": {"type": "api_key", "key": PI_KEY},
        "groq": {"type": "api_key", "key": UNKNOWN_KEY},
        "github-copilot": {"type": "oauth", "access": UNKNOWN_ACCESS,
            "refresh": "gho_UNKNOWNrefreshUNKNOWNrefresh01", "expires": 1,
            "enterpriseUrl": "company.ghe.com"},
        "google": {"type": "api_key", "key": "!pass show google-api-key"},
        "xai": {"type": "api_key", "key": "XAI_API_KEY"},
    });
    std::fs::write(&p.file, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    std::fs::set_permissions(&p.file, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn jail_value(s: &Signin) -> Value {
    serde_json::from_slice(&s.placeholder_file().unwrap()).unwrap()
}

#[test]
fn pi_every_credential_is_a_placeholder_and_commands_and_variable_names_stay() {
    let dir = tempfile::tempdir().unwrap();
    let s = Signin::load(pi_file(dir.path())).unwrap().unwrap();
    let jailed = s.placeholder_file().unwrap();
    for real in ["PIaccess", "PIrefresh", "PIkey", "UNKNOWN"] {
        assert!(
            !has(&jailed, real),
            "{real} in {}",
            String::from_utf8_lossy(&jailed)
        );
    }
    let v = jail_value(&s);
    let a = v["anthropic"]["access"].as_str().unwrap();
    assert!(
        a.starts_with("sk-ant-oat01-") && a.len() == PI_ACCESS.len(),
        "{a}"
    );
    assert!(v["openai"]["key"].as_str().unwrap().starts_with("sk-proj-"));
    assert!(v["groq"]["key"].as_str().unwrap().starts_with("gsk_"));
    // Kept as they are: pi runs the command / reads the variable in the jail.
    assert_eq!(v["google"]["key"], json!("!pass show google-api-key"));
    assert_eq!(v["xai"]["key"], json!("XAI_API_KEY"));
    assert_eq!(v["anthropic"]["expires"], json!(5));
    assert_eq!(
        v["github-copilot"]["enterpriseUrl"],
        json!("company.ghe.com")
    );
    assert_eq!(v["anthropic"]["type"], json!("oauth"));
}

#[test]
fn pi_keys_and_tokens_go_to_their_providers_hosts_only_and_unknown_ones_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let s = Signin::load(pi_file(dir.path())).unwrap().unwrap();
    let v = jail_value(&s);
    let ph = |p: &str, f: &str| v[p][f].as_str().unwrap().to_string();
    let (access, key, unknown, unknown_access) = (
        ph("anthropic", "access"),
        ph("openai", "key"),
        ph("groq", "key"),
        ph("github-copilot", "access"),
    );
    let signins = [s];
    let send = |host: &str, value: &str| {
        let mut h = vec![Header {
            name: "Authorization".into(),
            value: format!("Bearer {value}").into_bytes(),
        }];
        let mut report = RewriteReport::default();
        let host = normalize_host(host).unwrap();
        swap_access(&signins, &mut h, (&host, 443), false, &mut report);
        (String::from_utf8(h.remove(0).value).unwrap(), report)
    };
    let (out, report) = send("api.example", &access);
    assert_eq!(out, format!("Bearer {PI_ACCESS}"));
    assert_eq!(
        report.injected,
        vec![("signin.pi.anthropic".into(), "authorization".into())]
    );
    assert_eq!(
        send("api.openai.example", &key).0,
        format!("Bearer {PI_KEY}")
    );
    // Crossed: anthropic's token to openai's host, openai's key to anthropic's: left.
    assert_eq!(
        send("api.openai.example", &access).0,
        format!("Bearer {access}")
    );
    assert_eq!(send("api.example", &key).0, format!("Bearer {key}"));
    // A provider corral does not know: never swapped, to any host, audited.
    for host in ["api.example", "api.openai.example", "api.groq.com"] {
        for ph in [&unknown, &unknown_access] {
            let (out, report) = send(host, ph);
            assert_eq!(out, format!("Bearer {ph}"), "{host}");
            assert!(report.injected.is_empty() && !report.left.is_empty());
        }
    }
    // Every real value is scrubbed from answers, the unknown ones too.
    let pairs = signins[0].scrub_pairs();
    for real in [PI_ACCESS, PI_REFRESH, PI_KEY, UNKNOWN_KEY, UNKNOWN_ACCESS] {
        assert!(pairs.iter().any(|(r, _)| r == real.as_bytes()), "{real}");
    }
}

#[test]
fn pi_refresh_goes_to_its_providers_endpoint_only_and_is_written_back_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let p = pi_file(dir.path());
    let before = file_json(&p.file);
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let v = jail_value(&s);
    let ph_r = v["anthropic"]["refresh"].as_str().unwrap().to_string();
    let unknown_r = v["github-copilot"]["refresh"].as_str().unwrap().to_string();
    let body = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{ph_r}"}}"#);
    let auth = normalize_host("auth.example").unwrap();
    let openai = normalize_host("auth.openai.example").unwrap();
    // Another provider's endpoint, another path, an unknown provider's token: nothing swapped.
    assert!(
        s.swap_refresh((&openai, 443, "/oauth/token"), body.as_bytes(), false)
            .is_none()
    );
    assert!(
        s.swap_refresh((&auth, 443, "/other"), body.as_bytes(), false)
            .is_none()
    );
    let unknown = format!(r#"{{"refresh_token":"{unknown_r}"}}"#);
    assert!(
        s.swap_refresh((&auth, 443, "/v1/oauth/token"), unknown.as_bytes(), false)
            .is_none()
    );
    let (r, up) = s
        .swap_refresh((&auth, 443, "/v1/oauth/token?x=1"), body.as_bytes(), false)
        .unwrap();
    assert_eq!(r.provider(), Some("anthropic"));
    assert_eq!(up, body.replace(&ph_r, PI_REFRESH).into_bytes());
    let (new_a, new_r) = (
        "sk-ant-oat01-NEWpiNEWpiNEWpiNEWpiNEWpi01",
        "sk-ant-ort01-NEWpiRefreshNEWpiRefresh0001",
    );
    // OpenAI-style answers carry an id_token too: kept and scrubbed, never written (pi's entry
    // has no place for it).
    let id = jwt(r#"{"sub":"u"}"#, "PIidSIGPIidSIGPIidSIGPIidSIG01");
    let answer = json!({"access_token": new_a, "refresh_token": new_r, "id_token": id,
        "expires_in": 3600});
    let (out, exp) = s
        .take_response(&r, &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    assert!(
        !has(&out, "NEWpi") && !has(&out, "PIidSIG"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let inode = std::fs::metadata(&p.file).unwrap().ino();
    let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    s.write_back(&r, exp, now).unwrap();
    let w = file_json(&p.file);
    assert_eq!(
        w["anthropic"],
        json!({"type": "oauth", "access": new_a, "refresh": new_r,
               "expires": 2_000_000_000_000u64 + 3_600_000 - 300_000})
    );
    // Every other provider as it was, byte for byte in value.
    for other in ["openai", "groq", "github-copilot", "google", "xai"] {
        assert_eq!(w[other], before[other], "{other}");
    }
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&p.file).unwrap().ino(), inode);
    let mode = std::fs::metadata(&p.file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_write_back_never_lands_in_an_api_key_a_command_or_another_provider() {
    let dir = tempfile::tempdir().unwrap();
    let p = pi_file(dir.path());
    let before = file_json(&p.file);
    let tokens = |a: &str| {
        vec![
            (TokenKind::Access, a.to_string()),
            (TokenKind::Refresh, "r2".into()),
        ]
    };
    let now = std::time::SystemTime::now();
    // An API-key provider, an unknown provider, a `!` value, a key kind: refused, file unchanged.
    for (provider, toks) in [
        (Some("openai"), tokens("a2")),
        (Some("groq"), tokens("a2")),
        (Some("github-copilot"), tokens("a2")),
        (Some("anthropic"), tokens("!touch /tmp/pwned")),
        (Some("anthropic"), vec![(TokenKind::Key, "k".to_string())]),
        (
            Some("anthropic"),
            vec![(TokenKind::Opaque, "k".to_string())],
        ),
        (None, tokens("a2")),
    ] {
        let e = write_tokens(&p, provider, PI_REFRESH, &toks, Some(1), now);
        assert!(e.is_err(), "{provider:?} {toks:?}");
        assert_eq!(file_json(&p.file), before, "{provider:?}");
    }
    // The host's pi switched anthropic to an API key meanwhile: left alone.
    let mut v = before.clone();
    v["anthropic"] = json!({"type": "api_key", "key": "!security find-generic-password"});
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = write_tokens(
        &p,
        Some("anthropic"),
        PI_REFRESH,
        &tokens("a2"),
        Some(1),
        now,
    );
    assert!(matches!(e, Err(SigninError::Changed { .. })), "{e:?}");
    assert_eq!(file_json(&p.file), v);
}

#[test]
fn hostile_by_provider_files_are_refused_or_placeholdered_whole() {
    let dir = tempfile::tempdir().unwrap();
    let p = by_provider(dir.path(), SigninFormat::Pi, "auth.json");
    // Not a map of providers: refused (the run does not start with the real file exposed).
    for bad in [
        &b"[1,2]"[..],
        b"\"sk-ant-api03-xxxxxxxxxxxxxxxxxxxx\"",
        b"{",
        b"null",
    ] {
        std::fs::write(&p.file, bad).unwrap();
        assert!(
            Signin::load(p.clone()).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    // Shapes corral does not expect: every secret-looking string a placeholder anyway.
    let v = json!({
        "anthropic": {"type": "oauth", "access": 7, "refresh": PI_REFRESH},
        "openai": {"type": "oauth", "access": PI_ACCESS},
        "a/b~c": {"type": "api_key", "key": PI_KEY},
        "weird": ["sk-ant-api03-NESTEDnestedNESTEDnested01", {"deep": {"secret": "hunter2hunter2"}}],
        "toplevel": "ghp_TOPLEVELtoplevelTOPLEVEL0001",
    });
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let jailed = s.placeholder_file().unwrap();
    for real in [
        PI_REFRESH,
        PI_ACCESS,
        PI_KEY,
        "NESTEDnested",
        "hunter2hunter2",
        "TOPLEVEL",
    ] {
        assert!(
            !has(&jailed, real),
            "{real} in {}",
            String::from_utf8_lossy(&jailed)
        );
    }
    let jv: Value = serde_json::from_slice(&jailed).unwrap();
    assert_eq!(jv["anthropic"]["access"], json!(7));
    // None of them is swapped: anthropic's entry is not a whole OAuth sign-in.
    let auth = normalize_host("auth.example").unwrap();
    let ph_r = jv["anthropic"]["refresh"].as_str().unwrap();
    let body = format!("refresh_token={ph_r}");
    assert!(
        s.swap_refresh((&auth, 443, "/v1/oauth/token"), body.as_bytes(), true)
            .is_none()
    );
    let st = s.state();
    assert!(
        st.current
            .iter()
            .all(|(slot, _)| slot.kind == TokenKind::Opaque),
        "{:?}",
        st.current.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );
    assert!(
        st.current
            .iter()
            .any(|(slot, _)| slot.ptr == "/a~1b~0c/key")
    );
}

#[test]
fn opencode_oauth_api_and_wellknown_entries() {
    let dir = tempfile::tempdir().unwrap();
    let p = by_provider(dir.path(), SigninFormat::Opencode, "auth.json");
    let v = json!({
        "anthropic": {"type": "oauth", "access": PI_ACCESS, "refresh": PI_REFRESH, "expires": 9},
        "openai": {"type": "api", "key": PI_KEY, "metadata": {"org": "org-1"}},
        "https://wk.example": {"type": "wellknown", "key": "WK_TOKEN", "token": "wkTOKENwkTOKENwkTOKEN0001"},
        "github-copilot": {"type": "oauth", "access": "gho_COPILOTcopilotCOPILOT01",
            "refresh": "gho_COPILOTcopilotCOPILOT01", "expires": 0},
        // pi's spelling is not opencode's: an unknown entry shape, a placeholder never swapped.
        "groq": {"type": "api_key", "key": UNKNOWN_KEY},
    });
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let jailed = s.placeholder_file().unwrap();
    for real in [
        "PIaccess",
        "PIrefresh",
        "PIkey",
        "wkTOKEN",
        "COPILOT",
        "UNKNOWN",
    ] {
        assert!(
            !has(&jailed, real),
            "{real} in {}",
            String::from_utf8_lossy(&jailed)
        );
    }
    let jv: Value = serde_json::from_slice(&jailed).unwrap();
    assert_eq!(jv["https://wk.example"]["key"], json!("WK_TOKEN"));
    assert_eq!(jv["openai"]["metadata"], json!({"org": "org-1"}));
    let kinds: Vec<(Option<String>, TokenKind)> = s
        .state()
        .current
        .iter()
        .map(|(slot, _)| (slot.provider.clone(), slot.kind))
        .collect();
    for (provider, kind) in [
        (Some("anthropic"), TokenKind::Access),
        (Some("anthropic"), TokenKind::Refresh),
        (Some("openai"), TokenKind::Key),
        (Some("https://wk.example"), TokenKind::Opaque),
        (Some("github-copilot"), TokenKind::Opaque),
        (Some("groq"), TokenKind::Opaque),
    ] {
        let want = (provider.map(str::to_string), kind);
        assert!(kinds.contains(&want), "{want:?} not in {kinds:?}");
    }
    // Refresh and write-back as pi's; opencode's entry gets the same three fields.
    let auth = normalize_host("auth.example").unwrap();
    let body = format!(
        r#"{{"refresh_token":"{}"}}"#,
        jv["anthropic"]["refresh"].as_str().unwrap()
    );
    let (r, _) = s
        .swap_refresh((&auth, 443, "/v1/oauth/token"), body.as_bytes(), false)
        .unwrap();
    let answer = json!({"access_token": "sk-ant-oat01-OCnewOCnewOCnewOCnew01", "refresh_token": "sk-ant-ort01-OCnewrOCnewrOCnewr01", "expires_in": 60});
    s.take_response(&r, &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    s.write_back(&r, Some(60), UNIX_EPOCH + Duration::from_secs(1000))
        .unwrap();
    let w = file_json(&p.file);
    assert_eq!(
        w["anthropic"]["access"],
        json!("sk-ant-oat01-OCnewOCnewOCnewOCnew01")
    );
    assert_eq!(
        w["anthropic"]["expires"],
        json!(1_000_000u64 + 60_000 - 300_000)
    );
    assert_eq!(w["openai"], v["openai"]);
    assert_eq!(w["github-copilot"], v["github-copilot"]);
}

#[test]
fn a_refresh_with_a_token_not_of_this_run_is_answered_but_never_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = claude_file(dir.path());
    let before = std::fs::read(&p.file).unwrap();
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let auth = normalize_host("auth.example").unwrap();
    // The jail's own refresh token: nothing of this run to swap.
    let body = br#"{"refresh_token":"sk-ant-ort01-JAILSOWNjailsownJAILSOWN01"}"#;
    assert!(
        s.swap_refresh((&auth, 443, "/oauth/token"), body, false)
            .is_none()
    );
    let r = s.refresh_at(&auth, 443, "/oauth/token").unwrap();
    assert!(s.refresh_at(&auth, 443, "/elsewhere").is_none());
    let answer = json!({"access_token": "sk-ant-oat01-JAILSOWNaccessJAILSOWN01",
        "refresh_token": "sk-ant-ort01-JAILSOWNjailsownJAILSOWN01", "expires_in": 60});
    let (out, exp) = s
        .take_response(&r, &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    assert!(!has(&out, "JAILSOWN"));
    let e = s
        .write_back(&r, exp, std::time::SystemTime::now())
        .unwrap_err();
    assert!(matches!(e, SigninError::Foreign { .. }), "{e}");
    assert_eq!(std::fs::read(&p.file).unwrap(), before);
    // Its placeholders are swapped for nothing: a refresh with the one the jail got goes out
    // as it is, and this run's refresh still carries the user's token.
    let jv: Value = serde_json::from_slice(&out).unwrap();
    let theirs = format!(
        r#"{{"refresh_token":"{}"}}"#,
        jv["refresh_token"].as_str().unwrap()
    );
    assert!(
        s.swap_refresh((&auth, 443, "/oauth/token"), theirs.as_bytes(), false)
            .is_none()
    );
    let (_, ph_refresh) = jail_tokens(&s);
    let ours = format!(r#"{{"refresh_token":"{ph_refresh}"}}"#);
    let (r, up) = s
        .swap_refresh((&auth, 443, "/oauth/token"), ours.as_bytes(), false)
        .unwrap();
    assert!(has(&up, REFRESH));
    // Control: the same answer to a refresh that carried this run's token is written.
    s.take_response(&r, &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    s.write_back(&r, exp, std::time::SystemTime::now()).unwrap();
    assert!(has(&std::fs::read(&p.file).unwrap(), "JAILSOWNaccess"));
}

/// Send `Authorization: Bearer VALUE` to `host:port` through [`swap_access`] (over TLS unless
/// `plain`): the header as it goes out, and the report.
fn send_to(
    signins: &[Signin],
    (host, port): (&str, u16),
    plain: bool,
    value: &str,
) -> (String, RewriteReport) {
    let mut h = vec![Header {
        name: "Authorization".into(),
        value: format!("Bearer {value}").into_bytes(),
    }];
    let mut report = RewriteReport::default();
    let host = normalize_host(host).unwrap();
    swap_access(signins, &mut h, (&host, port), plain, &mut report);
    (String::from_utf8(h.remove(0).value).unwrap(), report)
}

const CODEX_KEY: &str = "sk-proj-REALkeyREALkeyREALkeyREALkey0123456789abcdefABCDEF";

fn codex_key_plan(dir: &Path) -> SigninPlan {
    let mut p = plan(dir, SigninFormat::Codex, "auth.json");
    p.api_key_hosts = vec![DomainPattern::parse("api.openai.example").unwrap()];
    p
}

#[test]
fn codex_api_key_goes_to_its_own_hosts_only_never_to_the_sign_ins() {
    let dir = tempfile::tempdir().unwrap();
    let p = codex_key_plan(dir.path());
    let sig = "SIGrealSIGrealSIGrealSIGrealSIGrealSIGreal-_0123";
    let access = jwt(r#"{"exp":1900000000}"#, sig);
    let v = json!({"OPENAI_API_KEY": CODEX_KEY, "tokens": {"access_token": access,
        "refresh_token": "rt_REALrefreshREALrefreshREAL0123", "account_id": "acc-1"},
        "last_refresh": "2026-01-01T00:00:00Z"});
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let jv: Value = serde_json::from_slice(&s.placeholder_file().unwrap()).unwrap();
    let key = jv["OPENAI_API_KEY"].as_str().unwrap().to_string();
    let ph_access = jv["tokens"]["access_token"].as_str().unwrap().to_string();
    assert!(key.starts_with("sk-proj-") && key.len() == CODEX_KEY.len() && !key.contains("REAL"));
    assert!(s.binds(&normalize_host("api.openai.example").unwrap(), 443));
    assert!(s.names().contains(&"api.openai.example".to_string()));
    let signins = [s];
    // To its own host, over TLS: the real key.
    let (out, report) = send_to(&signins, ("api.openai.example", 443), false, &key);
    assert_eq!(out, format!("Bearer {CODEX_KEY}"));
    assert_eq!(
        report.injected,
        vec![("signin.h/OPENAI_API_KEY".into(), "authorization".into())]
    );
    // To the sign-in's own API host (intercepted for the access token), its token host, plain
    // HTTP, a host it does not name: the placeholder, audited.
    for (host, port, plain) in [
        ("api.example", 443, false),
        ("auth.example", 443, false),
        ("api.openai.example", 443, true),
        ("evil.example", 443, false),
    ] {
        let (out, report) = send_to(&signins, (host, port), plain, &key);
        assert_eq!(out, format!("Bearer {key}"), "{host}:{port} plain={plain}");
        assert!(report.injected.is_empty(), "{host}");
        assert!(
            report
                .left
                .iter()
                .any(|(id, _)| id == "signin.h/OPENAI_API_KEY"),
            "{host}: {:?}",
            report.left
        );
    }
    // Crossed the other way: the ChatGPT access token is never sent to the key's host.
    let (out, _) = send_to(&signins, ("api.openai.example", 443), false, &ph_access);
    assert_eq!(out, format!("Bearer {ph_access}"));
    // Control: the access token still goes to the sign-in's host.
    let (out, _) = send_to(&signins, ("api.example", 443), false, &ph_access);
    assert_eq!(out, format!("Bearer {access}"));
    // The key is scrubbed from answers and is never written back by a refresh.
    assert!(
        signins[0]
            .scrub_pairs()
            .iter()
            .any(|(r, _)| r == CODEX_KEY.as_bytes())
    );
    let answer =
        json!({"access_token": jwt(r#"{"exp":1900009999}"#, "NEWsigNEWsigNEWsigNEWsigNEWsig01")});
    signins[0]
        .take_response(&whole(), &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    signins[0]
        .write_back(
            &whole(),
            None,
            UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        )
        .unwrap();
    assert_eq!(file_json(&p.file)["OPENAI_API_KEY"], json!(CODEX_KEY));
}

#[test]
fn an_api_key_only_codex_file_is_served_and_handed_to_a_gateway_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let p = codex_key_plan(dir.path());
    for v in [
        json!({"OPENAI_API_KEY": CODEX_KEY}),
        json!({"OPENAI_API_KEY": CODEX_KEY, "tokens": null, "last_refresh": null}),
        json!({"auth_mode": "apikey", "OPENAI_API_KEY": CODEX_KEY, "tokens": null}),
    ] {
        std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
        let s = Signin::load(p.clone()).unwrap().unwrap();
        let jv: Value = serde_json::from_slice(&s.placeholder_file().unwrap()).unwrap();
        let key = jv["OPENAI_API_KEY"].as_str().unwrap().to_string();
        assert!(!key.contains("REAL"), "{jv}");
        // The container backends' gateway gets the tokens through a file: the hosts go along.
        let handed: SigninTokens =
            serde_json::from_slice(&serde_json::to_vec(&s.tokens()).unwrap()).unwrap();
        let remote = Signin::from_tokens(p.clone(), handed, FileAccess::Local).unwrap();
        for g in [s, remote] {
            let signins = [g];
            let (out, _) = send_to(&signins, ("api.openai.example", 443), false, &key);
            assert_eq!(out, format!("Bearer {CODEX_KEY}"), "{v}");
            let (out, _) = send_to(&signins, ("api.example", 443), false, &key);
            assert_eq!(out, format!("Bearer {key}"), "{v}");
        }
    }
    // Neither a sign-in nor a key (logged out): served as it is, nothing to hide.
    let empty = json!({"OPENAI_API_KEY": null, "tokens": null});
    std::fs::write(&p.file, serde_json::to_vec(&empty).unwrap()).unwrap();
    let s = Signin::load(p.clone()).unwrap().unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&s.placeholder_file().unwrap()).unwrap(),
        empty
    );
    // Half a sign-in beside a key: refused, as without the key.
    for v in [
        json!({"OPENAI_API_KEY": CODEX_KEY, "tokens": {"access_token": "x"}}),
        json!({"OPENAI_API_KEY": CODEX_KEY, "tokens": {}}),
    ] {
        std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
        assert!(Signin::load(p.clone()).is_err(), "{v}");
    }
    // Control: an entry that names no key hosts keeps the key a placeholder swapped for nothing.
    let mut no_hosts = p.clone();
    no_hosts.api_key_hosts.clear();
    std::fs::write(
        &p.file,
        serde_json::to_vec(
            &json!({"OPENAI_API_KEY": CODEX_KEY, "tokens": {"access_token": "a-real-access-token",
            "refresh_token": "a-real-refresh-token"}}),
        )
        .unwrap(),
    )
    .unwrap();
    let s = Signin::load(no_hosts).unwrap().unwrap();
    let jv: Value = serde_json::from_slice(&s.placeholder_file().unwrap()).unwrap();
    let key = jv["OPENAI_API_KEY"].as_str().unwrap().to_string();
    let signins = [s];
    for host in ["api.openai.example", "api.example"] {
        let (out, report) = send_to(&signins, (host, 443), false, &key);
        assert_eq!(out, format!("Bearer {key}"), "{host}");
        assert!(report.injected.is_empty());
    }
}

const MCP_ACCESS: &str = "mcpREALaccessMCPrealACCESSmcp0123456789abcdefABCDEF";
const MCP_REFRESH: &str = "mcpREALrefreshMCPrealREFRESHmcp0123456789abcdefABCD";
const PORT_ACCESS: &str = "portREALaccessPORTrealACCESS0123456789abcdefABCDEF";
const LOCAL_ACCESS: &str = "localREALaccessLOCALrealACCESS0123456789abcdefABCD";
const USERINFO_ACCESS: &str = "userinfoREALaccessUSERINFOreal0123456789abcdefABCD";

/// Claude Code's file with its sign-in (or without) and remote MCP servers' OAuth tokens.
fn claude_mcp_file(dir: &Path, signed_in: bool) -> SigninPlan {
    let p = plan(dir, SigninFormat::Claude, ".credentials.json");
    let entry = |url: &str, access: &str, refresh: &str| {
        json!({"serverName": "s", "serverUrl": url, "clientId": "client-1",
            "accessToken": access, "refreshToken": refresh, "expiresAt": 1771535707586u64,
            "scope": ""})
    };
    let mut v = json!({"mcpOAuth": {
        "notion|abc123": entry("https://MCP.Notion.example/mcp", MCP_ACCESS, MCP_REFRESH),
        "port|def456": entry("https://mcp.port.example:8443/v1/mcp?x=1", PORT_ACCESS, ""),
        "local|0a1b": entry("http://mcp.local.example:3000/mcp", LOCAL_ACCESS, ""),
        "ip|0a1c": entry("https://127.0.0.1/mcp", LOCAL_ACCESS, ""),
        "userinfo|0a1d": entry("https://u:p@mcp.notion.example/", USERINFO_ACCESS, ""),
        "star|0a1e": entry("https://*.example/", USERINFO_ACCESS, ""),
    }});
    if signed_in {
        v["claudeAiOauth"] = json!({"accessToken": ACCESS, "refreshToken": REFRESH,
            "expiresAt": 1000});
    }
    std::fs::write(&p.file, serde_json::to_vec(&v).unwrap()).unwrap();
    p
}

#[test]
fn mcp_servers_access_tokens_go_to_their_own_server_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = claude_mcp_file(dir.path(), true);
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let jailed = s.placeholder_file().unwrap();
    assert!(
        !has(&jailed, "REAL"),
        "{}",
        String::from_utf8_lossy(&jailed)
    );
    let jv: Value = serde_json::from_slice(&jailed).unwrap();
    let mcp = |id: &str, f: &str| jv["mcpOAuth"][id][f].as_str().unwrap().to_string();
    let (notion, notion_refresh, port, local, userinfo, star) = (
        mcp("notion|abc123", "accessToken"),
        mcp("notion|abc123", "refreshToken"),
        mcp("port|def456", "accessToken"),
        mcp("local|0a1b", "accessToken"),
        mcp("userinfo|0a1d", "accessToken"),
        mcp("star|0a1e", "accessToken"),
    );
    assert_eq!(
        mcp("notion|abc123", "serverUrl"),
        "https://MCP.Notion.example/mcp"
    );
    let claude_access = jv["claudeAiOauth"]["accessToken"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(s.binds(&normalize_host("mcp.notion.example").unwrap(), 443));
    assert!(!s.binds(&normalize_host("mcp.notion.example").unwrap(), 8443));
    assert!(s.binds(&normalize_host("mcp.port.example").unwrap(), 8443));
    assert!(!s.binds(&normalize_host("mcp.local.example").unwrap(), 3000));
    let signins = [s];
    let id = "signin.h/mcpOAuth/notion|abc123/accessToken";
    let (out, report) = send_to(&signins, ("mcp.notion.example", 443), false, &notion);
    assert_eq!(out, format!("Bearer {MCP_ACCESS}"));
    assert_eq!(report.injected, vec![(id.into(), "authorization".into())]);
    let (out, _) = send_to(&signins, ("mcp.port.example", 8443), false, &port);
    assert_eq!(out, format!("Bearer {PORT_ACCESS}"));
    // Anywhere else (Claude's own API host, the token host, another server, another port,
    // plain HTTP): the placeholder.
    for (host, port_no, plain) in [
        ("api.example", 443, false),
        ("auth.example", 443, false),
        ("mcp.port.example", 8443, false),
        ("mcp.notion.example", 8443, false),
        ("mcp.notion.example", 443, true),
    ] {
        let (out, report) = send_to(&signins, (host, port_no), plain, &notion);
        assert_eq!(out, format!("Bearer {notion}"), "{host}:{port_no}");
        assert!(
            report.injected.is_empty() && !report.left.is_empty(),
            "{host}"
        );
    }
    let (out, _) = send_to(&signins, ("mcp.notion.example", 443), false, &port);
    assert_eq!(out, format!("Bearer {port}"));
    // Claude's own token never goes to an MCP server; the refresh token and the tokens of
    // servers corral cannot bind (plain HTTP, an IP, credentials in the URL, a wildcard) go
    // nowhere.
    for ph in [&claude_access, &notion_refresh, &local, &userinfo, &star] {
        for (host, port_no) in [
            ("mcp.notion.example", 443),
            ("mcp.local.example", 3000),
            ("api.example", 443),
        ] {
            let (out, report) = send_to(&signins, (host, port_no), false, ph);
            let swapped_claude = ph == &claude_access && host == "api.example";
            if !swapped_claude {
                assert_eq!(out, format!("Bearer {ph}"), "{host}");
                assert!(report.injected.is_empty());
            }
        }
    }
    let pairs = signins[0].scrub_pairs();
    for real in [
        MCP_ACCESS,
        MCP_REFRESH,
        PORT_ACCESS,
        LOCAL_ACCESS,
        USERINFO_ACCESS,
    ] {
        assert!(pairs.iter().any(|(r, _)| r == real.as_bytes()), "{real}");
    }
    // A refresh of Claude's sign-in writes its own fields only: the servers' real tokens stay.
    let ph_r = jv["claudeAiOauth"]["refreshToken"].as_str().unwrap();
    refresh(
        &signins[0],
        format!(r#"{{"refresh_token":"{ph_r}"}}"#).as_bytes(),
        false,
    )
    .unwrap();
    let answer = json!({"access_token": "sk-ant-oat01-NEWaccessNEWaccess0123456789abcdefABCDEF"});
    signins[0]
        .take_response(&whole(), &serde_json::to_vec(&answer).unwrap())
        .unwrap();
    signins[0]
        .write_back(
            &whole(),
            Some(3600),
            UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        )
        .unwrap();
    let w = file_json(&p.file);
    assert_eq!(
        w["mcpOAuth"]["notion|abc123"]["accessToken"],
        json!(MCP_ACCESS)
    );
    assert_eq!(
        w["mcpOAuth"]["notion|abc123"]["refreshToken"],
        json!(MCP_REFRESH)
    );
}

#[test]
fn a_claude_file_with_mcp_servers_only_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let p = claude_mcp_file(dir.path(), false);
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let jv: Value = serde_json::from_slice(&s.placeholder_file().unwrap()).unwrap();
    let notion = jv["mcpOAuth"]["notion|abc123"]["accessToken"]
        .as_str()
        .unwrap()
        .to_string();
    let handed: SigninTokens =
        serde_json::from_slice(&serde_json::to_vec(&s.tokens()).unwrap()).unwrap();
    let remote = Signin::from_tokens(p.clone(), handed, FileAccess::Local).unwrap();
    for g in [s, remote] {
        let signins = [g];
        let (out, _) = send_to(&signins, ("mcp.notion.example", 443), false, &notion);
        assert_eq!(out, format!("Bearer {MCP_ACCESS}"));
    }
    // No sign-in and no server corral can serve (plain HTTP; a stale entry with an empty
    // token, as Claude Code leaves behind): served, every secret-like value a placeholder that
    // goes nowhere.
    let stale = json!({"mcpOAuth": {
        "x|1": {"serverUrl": "http://a.example/", "accessToken": LOCAL_ACCESS},
        "y|2": {"serverUrl": "https://b.example/", "accessToken": "", "expiresAt": 0}}});
    std::fs::write(&p.file, serde_json::to_vec(&stale).unwrap()).unwrap();
    let s = Signin::load(p.clone()).unwrap().unwrap();
    let jv: Value = serde_json::from_slice(&s.placeholder_file().unwrap()).unwrap();
    let ph = jv["mcpOAuth"]["x|1"]["accessToken"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(ph, LOCAL_ACCESS);
    assert_eq!(jv["mcpOAuth"]["y|2"], stale["mcpOAuth"]["y|2"]);
    let handed: SigninTokens =
        serde_json::from_slice(&serde_json::to_vec(&s.tokens()).unwrap()).unwrap();
    let remote = Signin::from_tokens(p.clone(), handed, FileAccess::Local).unwrap();
    for g in [s, remote] {
        let signins = [g];
        for (host, port) in [("a.example", 80), ("a.example", 443), ("b.example", 443)] {
            let (out, report) = send_to(&signins, (host, port), false, &ph);
            assert_eq!(out, format!("Bearer {ph}"), "{host}");
            assert!(report.injected.is_empty());
        }
    }
}

#[test]
fn https_hosts_of_server_urls() {
    let table: &[(&str, Option<&str>)] = &[
        ("https://mcp.notion.com/mcp", Some("mcp.notion.com:443")),
        ("HTTPS://MCP.Notion.com", Some("mcp.notion.com:443")),
        ("https://a.example:8443/x?y#z", Some("a.example:8443")),
        ("https://a.example?x=1", Some("a.example:443")),
        ("http://a.example/", None),
        ("https://127.0.0.1/", None),
        ("https://[::1]:443/", None),
        ("https://u:p@a.example/", None),
        ("https://*.example/", None),
        ("https://a.example:0/", None),
        ("https://a.example:x/", None),
        ("https:///x", None),
        ("wss://a.example/", None),
        ("", None),
    ];
    for (url, want) in table {
        let got = https_host(url).map(|p| p.to_string());
        assert_eq!(got.as_deref(), *want, "{url}");
    }
}
