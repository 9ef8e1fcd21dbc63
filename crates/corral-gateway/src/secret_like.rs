//! Whether a string field of a credential or state file looks like a secret corral does not
//! know: such a value gets a placeholder that is never swapped for anything (the gateway does not
//! know where it may go), so the jail never reads it. One pure rule for every file corral
//! rewrites this way.
//!
//! A value looks like a secret when
//! - its field's name says so: it holds `key`, `token`, `secret`, `password`, `passwd`,
//!   `credential`, `cookie`, `session`, `access` or `refresh` (case, `_`, `-` and `.` ignored), or
//! - the value itself says so: a known vendor prefix (`sk-`, `ghp_`, `xoxb-`, `AIza`, a JWT's
//!   `eyJ`, ...), or a long run of token characters with upper case, lower case and digits
//!   mixed;
//!
//! and it is none of what a harness keeps beside its credentials in the same fields:
//! - shorter than 8 characters (`Bearer`, `api`, `oauth`: no credential is that short);
//! - a shell command (`!pass show x`: pi runs a key that starts with `!`; the command is kept
//!   as it is and never swapped or written);
//! - an environment variable's name (`ANTHROPIC_API_KEY`: pi reads the variable of that name);
//! - prose (holds a space);
//! - a URL without credentials in it (`https://company.ghe.com`; one with a `user:pass@` is a
//!   secret).

/// Field-name words that mark a secret (compared without case and separators).
const SECRET_WORDS: &[&str] = &[
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "cookie",
    "session",
    "access",
    "refresh",
];

/// Field names holding one of [`SECRET_WORDS`] that never carry a secret.
const NOT_SECRET_NAMES: &[&str] = &["tokentype", "keytype", "sessionid"];

/// Prefixes of vendors' credentials.
const VENDOR_PREFIXES: &[&str] = &[
    "sk-",
    "sk_",
    "pk_",
    "rk_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "AIza",
    "ya29.",
    "1//",
    "eyJ",
    "hf_",
    "gsk_",
    "xai-",
    "AKIA",
];

/// Shortest value taken for a secret.
const MIN_LEN: usize = 8;
/// Shortest value taken for a secret by its shape alone.
const MIN_SHAPE_LEN: usize = 32;

/// Whether the string `value` of the field `name` looks like a secret (see the module docs).
pub fn looks_like_secret(name: &str, value: &str) -> bool {
    if value.len() < MIN_LEN
        || value.starts_with('!')
        || is_env_name(value)
        || value.chars().any(char::is_whitespace)
    {
        return false;
    }
    if let Some((_, rest)) = value.split_once("://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        return authority.contains('@');
    }
    secret_name(name) || secret_shape(value)
}

fn secret_name(name: &str) -> bool {
    let norm: String = name
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    !NOT_SECRET_NAMES.contains(&norm.as_str()) && SECRET_WORDS.iter().any(|w| norm.contains(w))
}

/// `FOO_BAR`, `OPENAI_API_KEY`: upper case, digits and `_`, starting with a letter.
fn is_env_name(value: &str) -> bool {
    let mut bytes = value.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_uppercase())
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

fn secret_shape(value: &str) -> bool {
    if VENDOR_PREFIXES.iter().any(|p| value.starts_with(p)) && value.len() >= 20 {
        return true;
    }
    let token_chars = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_./+=~".contains(&b));
    let has = |f: fn(&u8) -> bool| value.as_bytes().iter().any(f);
    value.len() >= MIN_SHAPE_LEN
        && token_chars
        && !value.contains("://")
        && has(u8::is_ascii_uppercase)
        && has(u8::is_ascii_lowercase)
        && has(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::looks_like_secret;

    #[test]
    fn the_rule_as_a_table() {
        let long_mixed = "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"; // 32, upper+lower+digits
        let table: &[(&str, &str, bool, &str)] = &[
            // Named like a secret.
            ("key", "abcdefgh", true, "a key, 8 characters"),
            ("apiKey", "whatever-value", true, "camelCase name"),
            ("client_secret", "GOCSPX-abcdefgh", true, "snake_case name"),
            ("X-Auth-Token", "abcdefghij", true, "header-like name"),
            ("password", "hunter2hunter2", true, "a password"),
            ("refresh", "opaque-refresh", true, "an OAuth refresh field"),
            ("access", "opaque-access", true, "an OAuth access field"),
            ("accountId", "acct-12345678", false, "an account id"),
            ("baseUrl", "https://api.example.com/v1", false, "a URL"),
            (
                "url",
                "https://user:pw@example.com/",
                true,
                "a URL with credentials",
            ),
            ("url", "https://example.com/a@b", false, "an @ in the path"),
            ("sessionCookie", "abcdefghijk", true, "a cookie"),
            // Named like a secret, but not one.
            ("key", "short", false, "shorter than 8"),
            ("token_type", "Bearer-ish-value", false, "token_type"),
            (
                "key",
                "!pass show anthropic",
                false,
                "a shell command pi runs",
            ),
            (
                "key",
                "!op read op://x",
                false,
                "a command, no spaces needed",
            ),
            (
                "key",
                "ANTHROPIC_API_KEY",
                false,
                "an environment variable's name",
            ),
            ("token", "some words in a sentence", false, "prose"),
            (
                "sessionId",
                "0f3a9c1d-1234-5678-9abc-def012345678",
                false,
                "an id",
            ),
            // Shaped like a secret, whatever the name.
            (
                "value",
                "sk-ant-api03-abcdefghijklmnop",
                true,
                "vendor prefix",
            ),
            ("x", "ghp_0123456789abcdefghij", true, "GitHub token"),
            ("x", "AIzaSyA-0123456789abcdefgh", true, "Google key"),
            (
                "x",
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
                true,
                "a JWT",
            ),
            ("x", long_mixed, true, "long, mixed case and digits"),
            // Not shaped like one.
            (
                "accountId",
                "0f3a9c1d-1234-5678-9abc-def012345678",
                false,
                "a UUID",
            ),
            ("x", "sk-short", false, "prefix but short"),
            (
                "enterpriseUrl",
                "https://company.ghe.com/Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
                false,
                "a URL",
            ),
            ("x", &long_mixed[..31], false, "31 characters"),
            (
                "x",
                "abcdefghijklmnopqrstuvwxyz0123456789",
                false,
                "no upper case",
            ),
            ("x", "0123456789abcdef0123456789abcdef0123", false, "hex"),
            ("type", "oauth", false, "a type"),
            ("scopes", "user:inference", false, "a scope"),
            ("x", "", false, "empty"),
        ];
        for (name, value, want, why) in table {
            assert_eq!(
                looks_like_secret(name, value),
                *want,
                "{why}: {name:?} = {value:?}"
            );
        }
    }
}
