//! The sample frames in tests/samples/frames.json are read by the Rust codec here and validated
//! against the generated JSON Schema by Node (tests/node/validate.mjs). Both must reach the
//! verdict the sample declares, so the schema and the code cannot drift apart.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::codec::{decode_request, decode_server_frame};
use racp_proto::events::PushMethod;
use racp_proto::frame::ServerFrame;
use racp_proto::{Call, Method};
use serde_json::Value;

fn samples() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/samples/frames.json");
    let text = std::fs::read_to_string(path).expect("read samples");
    serde_json::from_str(&text).expect("samples are JSON")
}

/// The codec's verdict on one sample: Ok when the frame is accepted.
fn rust_verdict(schema: &str, frame: &Value) -> Result<(), String> {
    let text = frame.to_string();
    match schema {
        "ClientFrame" => {
            let request = decode_request(&text, 1 << 20).map_err(|r| r.error.to_string())?;
            Call::decode(request.method, request.params)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        "HostFrame" => {
            // What a host may send is strict; the client alone tolerates newer error codes.
            if let Some(error) = frame.get("error") {
                serde_json::from_value::<racp_proto::AppError>(error.clone())
                    .map_err(|e| e.to_string())?;
            }
            match decode_server_frame(&text).map_err(|e| e.to_string())? {
                ServerFrame::Push { method, params } => {
                    let push = PushMethod::from_name(&method).ok_or("unknown push")?;
                    push.check_params(params.get()).map_err(|e| e.to_string())
                }
                _ => Ok(()),
            }
        }
        other => {
            let name = other
                .strip_prefix("result:")
                .ok_or("unknown sample schema")?;
            let method = Method::from_name(name).ok_or("unknown method")?;
            method.check_result(&text).map_err(|e| e.to_string())
        }
    }
}

#[test]
fn codec_agrees_with_every_sample() {
    let samples = samples();
    assert!(samples.len() >= 50, "the sample set shrank");
    let mut wrong = Vec::new();
    for sample in &samples {
        let name = sample["name"].as_str().unwrap_or("?");
        let schema = sample["schema"].as_str().unwrap_or("?");
        let valid = sample["valid"].as_bool().unwrap_or(false);
        let verdict = rust_verdict(schema, &sample["frame"]);
        if verdict.is_ok() != valid {
            wrong.push(format!("{name}: expected valid={valid}, got {verdict:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} samples disagree:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn every_method_and_push_has_a_valid_sample() {
    let samples = samples();
    let valid_frames: Vec<&Value> = samples
        .iter()
        .filter(|s| s["valid"] == true)
        .map(|s| &s["frame"])
        .collect();
    for method in Method::ALL {
        assert!(
            valid_frames.iter().any(|f| f["method"] == method.as_str()),
            "no valid sample request for {}",
            method.as_str()
        );
    }
    for push in PushMethod::ALL {
        assert!(
            valid_frames.iter().any(|f| f["method"] == push.as_str()),
            "no valid sample push for {}",
            push.as_str()
        );
    }
}
