//! Fuzz the credential gateway's answer path with `corral_gateway::scrub_check`: the input
//! picks the path (stream scrubber, chunked relay, response head, websocket fragments, token
//! answer, OAuth error), the new tokens a refresh brings, the answer's pieces (a real value of
//! the run in one of its encodings, or arbitrary bytes), the read sizes, the frame cuts, masks
//! and pings. Property: nothing panics, and no real value in any encoding corral produces or
//! scrubs reaches the jail (the check panics when one does).
#![no_main]

use std::sync::OnceLock;

use corral_gateway::scrub_check::{World, check};
use libfuzzer_sys::fuzz_target;

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("corral-fuzz-gateway-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        World::new(&dir)
    })
}

fuzz_target!(|data: &[u8]| {
    check(world(), data);
});
