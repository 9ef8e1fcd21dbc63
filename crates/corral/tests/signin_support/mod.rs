//! Shared by the sign-in tests (jail_signin.rs for the native jail, engine_signin.rs for the
//! container engines): Claude Code's tokens and their scan markers, the TLS mock of an API and
//! a token endpoint, the script that does Claude Code's exchange, and the host-side memory scan.

#![allow(dead_code)]

use crate::jail_support::children_of;

// Distinct markers per token: a scan for a marker finds any copy of that token.
pub const ACCESS: &str =
    "sk-ant-oat01-ACCESSrealACCESSrealACCESSreal0123456789abcdefghijklmnopqrstuv";
pub const REFRESH: &str =
    "sk-ant-ort01-REFRESHrealREFRESHrealREFRESHreal0123456789abcdefghijklmnop";
pub const NEW_ACCESS: &str =
    "sk-ant-oat01-NEWACCESSnewACCESSnewACCESS0123456789abcdefghijklmnopqrstu";
pub const NEW_REFRESH: &str =
    "sk-ant-ort01-NEWREFRESHnewREFRESHnewREFRESH0123456789abcdefghijklmnopq";
pub const MARKERS: [&str; 4] = [
    "ACCESSrealACCESSreal",
    "REFRESHrealREFRESHreal",
    "NEWACCESSnewACCESS",
    "NEWREFRESHnewREFRESH",
];

pub const MOCK: &str = r#"import http.server, ssl, json, sys, urllib.parse
tok = json.load(open("tokens.json"))
state = {"access": tok["access"], "refresh": tok["refresh"]}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, code, body):
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log(self, **kw):
        with open("seen.jsonl", "a") as f:
            f.write(json.dumps(dict(path=self.path, **kw)) + "\n")
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        self.log(auth=auth)
        if self.path == "/echo":
            text = json.dumps({"you_sent": auth})
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes="):
                a, b = (int(x) for x in rng[6:].split("-"))
                b = min(b, len(text) - 1)
                return self.answer(206, text[a:b + 1])
            return self.answer(200, text)
        ok = auth == "Bearer " + state["access"]
        self.answer(200 if ok else 401, '"api-ok"' if ok else '"bad-token"')
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.log(body=body.decode(errors="replace"), accept=self.headers.get("Accept", ""))
        if tok.get("quote_errors"):
            why = "cannot use " + body.decode(errors="replace")
            return self.answer(400, json.dumps({"error": "invalid_request", "error_description": why}))
        form = self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded")
        try:
            if form:
                req = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
            else:
                req = json.loads(body)
        except ValueError:
            return self.answer(400, '{"error":"invalid_request"}')
        # `foreign_refresh`: an account of the jail's own, accepted as well (not rotated).
        if tok.get("foreign_refresh") and req.get("refresh_token") == tok["foreign_refresh"]:
            return self.answer(200, json.dumps({"token_type": "Bearer",
                "access_token": tok["foreign_access"], "refresh_token": tok["foreign_refresh"],
                "expires_in": 28800}))
        if self.path != tok["token_path"] or req.get("refresh_token") != state["refresh"]:
            return self.answer(400, '{"error":"invalid_grant"}')
        state["access"], state["refresh"] = tok["new_access"], tok["new_refresh"]
        answer = {"token_type": "Bearer", "access_token": state["access"],
            "refresh_token": state["refresh"], "expires_in": 28800,
            "scope": "user:inference user:profile"}
        if "new_id" in tok:
            answer["id_token"] = tok["new_id"]
        # GitHub-style endpoints answer form-encoded when asked; `always_form`: whatever asked.
        if tok.get("always_form") or "x-www-form-urlencoded" in self.headers.get("Accept", ""):
            b = urllib.parse.urlencode(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-www-form-urlencoded")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            return self.wfile.write(b)
        self.answer(200, json.dumps(answer))
    def log_message(self, *a):
        pass
# `python3 mock.py [ADDRESS PORT]`: loopback and a free port unless given (a container's mock).
bind = (sys.argv[1], int(sys.argv[2])) if len(sys.argv) > 2 else ("127.0.0.1", 0)
s = http.server.HTTPServer(bind, H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain("leaf.pem", "leaf.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// Whether `needle` is anywhere in the readable memory of process `pid`; `None` when its memory
/// cannot be read at all.
pub fn memory_holds(pid: u32, needle: &[u8]) -> Option<bool> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut read_any = false;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if !perms.starts_with('r') || hi - lo > 1 << 30 {
            continue;
        }
        let mut region = vec![0u8; (hi - lo) as usize];
        if mem.read_exact_at(&mut region, lo).is_err() {
            continue;
        }
        read_any = true;
        if region.windows(needle.len()).any(|w| w == needle) {
            return Some(true);
        }
    }
    read_any.then_some(false)
}

/// Every descendant of `pid`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = children_of(pid);
    while let Some(p) = stack.pop() {
        stack.extend(children_of(p));
        out.push(p);
    }
    out
}

/// The user's signed-in Claude Code file's contents (`~/.claude/.credentials.json`).
pub fn claude_credentials() -> serde_json::Value {
    serde_json::json!({"claudeAiOauth": {"accessToken": ACCESS, "refreshToken": REFRESH,
        "expiresAt": 1_700_000_000_000u64, "scopes": ["user:inference", "user:profile"],
        "subscriptionType": "max"}})
}

/// Shell lines doing what Claude Code does with its credential file against the mock at `url`:
/// read the placeholders, call the API and `/echo`, refresh (JSON body), write the new tokens
/// into the file its way (rename, then in-place copy on EBUSY), call the API with the new
/// access placeholder, and replay the old refresh placeholder. Prints `PH_ACCESS=`, `API1=`,
/// `ECHO=`, `TOKENRESP=`, `RENAME=`, `API2=`, `REPLAY=` lines. Never spells a real token.
pub fn claude_exchange(url: &str) -> String {
    format!(
        r#"F=~/.claude/.credentials.json
get() {{ python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["claudeAiOauth"][sys.argv[2]])' "$F" "$1"; }}
A=$(get accessToken); R=$(get refreshToken)
echo "PH_ACCESS=$A"
echo "API1=$(curl -sS {url}/v1/messages -H "Authorization: Bearer $A")"
echo "ECHO=$(curl -sS {url}/echo -H "Authorization: Bearer $A")"
RESP=$(curl -sS -X POST {url}/v1/oauth/token -H 'Content-Type: application/json' -d "{{\"grant_type\":\"refresh_token\",\"refresh_token\":\"$R\",\"client_id\":\"9d1c250a\"}}")
echo "TOKENRESP=$RESP"
# Claude Code's write: a temporary file renamed over the credential file (EBUSY on the bind
# over it), then the in-place copy.
echo "$RESP" | python3 -c '
import json, os, shutil, sys
r = json.load(sys.stdin); f = sys.argv[1]
d = json.load(open(f)); o = d["claudeAiOauth"]
o["accessToken"], o["refreshToken"] = r["access_token"], r["refresh_token"]
tmp = f + ".tmp.1"
open(tmp, "w").write(json.dumps(d))
try:
    os.replace(tmp, f); print("RENAME=ok")
except OSError as e:
    shutil.copyfile(tmp, f); os.unlink(tmp); print("RENAME=" + os.strerror(e.errno))
' "$F"
A2=$(get accessToken)
echo "API2=$(curl -sS {url}/v1/messages -H "Authorization: Bearer $A2")"
echo "REPLAY=$(curl -sS -X POST {url}/v1/oauth/token -H 'Content-Type: application/json' -d "{{\"grant_type\":\"refresh_token\",\"refresh_token\":\"$R\"}}")"
"#
    )
}
