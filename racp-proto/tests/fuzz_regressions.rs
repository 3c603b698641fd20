//! Every input the fuzzers (`fuzz/`, run by `scripts/fuzz`) ever crashed on, and their
//! committed corpus, run through the same checks as the fuzz targets, on the stable toolchain.
//!
//! A crash found by `scripts/fuzz` is copied to `fuzz/regressions/<target>/` (give it a name
//! that says what it found); from then on this test holds the fix.

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../../fuzz/src/checks.rs"]
mod checks;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir/<target>` (none when the directory does not exist).
fn inputs(dir: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
        return Vec::new();
    };
    let mut inputs: Vec<_> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect();
    inputs.sort();
    inputs
}

fn run(target: &str, check: fn(&[u8])) -> usize {
    let mut count = 0;
    for dir in ["regressions", "corpus"] {
        for (path, data) in inputs(dir, target) {
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{} fails its check", path.display());
            count += 1;
        }
    }
    count
}

#[test]
fn frame_codec_inputs_hold() {
    assert!(run("frame_codec", checks::client_frame) > 0);
}

#[test]
fn method_params_inputs_hold() {
    assert!(run("method_params", checks::method_params) > 0);
}

#[test]
fn host_frames_inputs_hold() {
    assert!(run("host_frames", checks::host_frame) > 0);
}

#[test]
fn every_regression_belongs_to_a_target() {
    let targets = ["frame_codec", "method_params", "host_frames"];
    let Ok(entries) = std::fs::read_dir(fuzz_dir().join("regressions")) else {
        return;
    };
    for entry in entries {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            targets.contains(&name.as_str()),
            "fuzz/regressions/{name} is not a fuzz target"
        );
    }
}

/// The crashes found so far, spelled out so that a reader sees what each one was.
#[test]
fn an_overlong_id_in_an_invalid_envelope_is_not_echoed() {
    let id = "i".repeat(133);
    let text = format!(r#"{{"id":"{id}","methAAAAod":"session/list"}}"#);
    let rejected = racp_proto::codec::decode_request(&text, usize::MAX).unwrap_err();
    assert_eq!(rejected.id, None);
    checks::client_frame(text.as_bytes());
}

#[test]
fn errors_about_huge_names_stay_small() {
    let big = "f".repeat(100_000);
    for text in [
        format!(r#"{{"id":1,"method":"session/list","params":{{"{big}":1}}}}"#),
        format!(r#"{{"id":1,"method":"pairing/create","params":{{"roles":["{big}"]}}}}"#),
        format!(r#"{{"id":1,"{big}":1,"method":"hello"}}"#),
    ] {
        checks::client_frame(text.as_bytes());
    }
}

#[test]
fn numbers_in_event_data_arrive_as_written() {
    let path = fuzz_dir().join("regressions/host_frames/number-rounded-twice-in-event-data");
    let text = std::fs::read_to_string(path).unwrap();
    let event: racp_proto::events::Event = serde_json::from_str(&text).unwrap();
    let digits = text
        .split(r#""data":{"at":"#)
        .nth(1)
        .unwrap()
        .trim_end_matches('}');
    assert_eq!(digits.len(), 162);
    // Relayed as text: the integer is exactly as the host sent it, and encodes back the same.
    assert_eq!(event.data.get(), format!(r#"{{"at":{digits}}}"#));
    assert!(
        serde_json::to_string(&event)
            .unwrap()
            .ends_with(&format!("{digits}}}}}"))
    );
    // A Value would round it: refused rather than rounded.
    assert!(matches!(
        event.data.to_value(),
        Err(racp_proto::events::DataError::WideInteger(_))
    ));
    // Read as a double it is the nearest one, and stays that one through encode and decode.
    let nearest: f64 = digits.parse().unwrap();
    let parsed: f64 = serde_json::from_str(digits).unwrap();
    assert_eq!(parsed, nearest);
    let again: f64 = serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
    assert_eq!(again, parsed);
    checks::host_frame(text.as_bytes());
}

/// Integers the host reads itself are 64-bit at most: a larger one is refused, never rounded
/// (docs/protocol.md §1, "Numbers").
#[test]
fn an_integer_param_beyond_its_range_is_invalid_params() {
    for big in ["18446744073709551616", "4294967296", "1e3"] {
        let text = format!(
            r#"{{"id":1,"method":"hello","params":{{"protocol":{{"min":{big},"max":1}},"client":{{"name":"c","version":"1"}}}}}}"#
        );
        let request = racp_proto::codec::decode_request(&text, usize::MAX).unwrap();
        let error = racp_proto::Call::decode(request.method, request.params).unwrap_err();
        assert_eq!(error.code(), racp_proto::ErrorCode::InvalidParams, "{big}");
    }
}
