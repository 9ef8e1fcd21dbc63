//! The answer path's property (`corral_gateway::scrub_check`): origin answers built from the
//! run's real values in every encoding corral produces or scrubs, mixed with arbitrary bytes,
//! split, chunked, framed as websocket fragments, or put into token answers and OAuth errors,
//! never bring a real value to the jail. The `gateway_scrub` fuzz target drives the same check
//! (docs/FUZZING.md).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use corral_gateway::scrub_check::{World, check};
use proptest::prelude::*;

fn world() -> &'static World {
    static WORLD: OnceLock<(World, tempfile::TempDir)> = OnceLock::new();
    &WORLD
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            (World::new(dir.path()), dir)
        })
        .0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_real_value_in_any_encoding_reaches_the_jail(data in proptest::collection::vec(any::<u8>(), 0..160)) {
        check(world(), &data);
    }
}

/// An input for `mode` whose answer is the value `value` (0 the secret, 1 the access token,
/// 2 the refresh token) in form `form` between two bytes of noise, split in 3-byte pieces.
fn input(mode: u8, value: u8, form: u8) -> Vec<u8> {
    let mut v = vec![mode, 1, 2, 3, 4];
    v.extend([3, 0x81, b'<', value, form, 0x81, b'>']);
    v.extend([0, 2, 3, 3]);
    v.extend([2, 3, 9]);
    v
}

#[test]
fn every_path_and_every_form_is_checked() {
    let mut paths = Vec::new();
    for mode in 0..6 {
        for value in 0..3 {
            for form in 0..15 {
                paths.push(check(world(), &input(mode, value, form)));
            }
        }
    }
    paths.dedup();
    assert_eq!(
        paths,
        [
            "stream",
            "relay",
            "head",
            "websocket",
            "token answer",
            "token error"
        ]
    );
}

#[test]
fn control_a_scrubber_of_raw_values_only_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let control = World::raw_only(dir.path());
    // The refresh token percent-encoded (form 1), as corral sends it in a form-encoded refresh.
    for mode in 0..6 {
        let data = input(mode, 2, 1);
        let caught = catch_unwind(AssertUnwindSafe(|| check(&control, &data)));
        assert!(
            caught.is_err(),
            "mode {mode}: the check missed a percent-encoded token"
        );
        check(world(), &data);
    }
}
