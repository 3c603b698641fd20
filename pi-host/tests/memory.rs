//! The host's memory under large requests (docs/reliability.md §4.18;
//! docs/benchmarks.md, "Memory under large requests"), read from `/proc/PID/status` of the real
//! host process: frames near the hard cap on many connections, and many large history pages
//! asked at once, each keep the host within +128 MiB of its RSS before them while they are
//! held, and within +32 MiB of it within 10 s of their connections closing.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tests::{Client, HostProcess, PATIENCE, memory_kib, rss_falls_to};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

const HELD_BOUND_KIB: u64 = 128 << 10;
const AFTER_BOUND_KIB: u64 = 32 << 10;
const SETTLE: Duration = Duration::from_secs(10);

/// `observers` connections of one observer device each send one frame of `frame_bytes` after
/// `hello`, and each gets the frame refused; returns the connections (still open) and the
/// codes they got.
async fn frames_on_many_connections(
    url: &str,
    token: &str,
    observers: usize,
    frame_bytes: usize,
) -> (Vec<Client>, Vec<String>) {
    // One payload for every connection: a request whose size is all its text.
    let mut payload = r#"{"id":1,"method":"session/list","params":{"pad":""#.to_string();
    payload.push_str(&"x".repeat(frame_bytes - payload.len() - 3));
    payload.push_str(r#""}}"#);
    assert_eq!(payload.len(), frame_bytes);
    let mut clients = Vec::with_capacity(observers);
    let mut codes = Vec::with_capacity(observers);
    for _ in 0..observers {
        let mut client = Client::connect(url, token).await.expect("upgrade");
        client.hello().await;
        client.send_raw_text(payload.as_bytes()).await;
        let reply = client.next_frame().await.expect("an answer to the frame");
        codes.push(
            reply["error"]["code"]
                .as_str()
                .unwrap_or("result")
                .to_string(),
        );
        clients.push(client);
    }
    (clients, codes)
}

/// One figure of the report: KiB above the baseline.
fn above(kib: u64, baseline: u64) -> Value {
    json!(kib.saturating_sub(baseline))
}

#[tokio::test]
async fn two_hundred_observers_sending_frames_near_the_cap_leave_the_host_near_its_baseline() {
    let host = HostProcess::start_with(bin(), &["--plain"]).await;
    let (_, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let pid = host.pid();
    let (baseline, _) = memory_kib(pid);
    let started = Instant::now();
    // Just under the hard cap: four times the default 1 MiB frame bound.
    let frame_bytes = (4 << 20) - 64;
    let (clients, codes) = frames_on_many_connections(&host.url(), &token, 200, frame_bytes).await;
    assert!(codes.iter().all(|c| c == "PAYLOAD_TOO_LARGE"), "{codes:?}");
    let (held, peak) = memory_kib(pid);
    let sent = started.elapsed();
    drop(clients);
    let after = rss_falls_to(pid, baseline + AFTER_BOUND_KIB, SETTLE).await;
    let figures = json!({
        "baselineKib": baseline,
        "heldAboveKib": above(held, baseline),
        "peakAboveKib": above(peak, baseline),
        "afterCloseAboveKib": above(after, baseline),
        "seconds": sent.as_secs_f64(),
    });
    tests::record_figures("memory_frames_near_the_cap", &figures);
    assert!(peak <= baseline + HELD_BOUND_KIB, "{figures}");
    assert!(after <= baseline + AFTER_BOUND_KIB, "{figures}");
}

/// A session with more than 16 MiB of history: turns of 3 MB replies by the stand-in agent.
async fn session_with_large_history(host: &HostProcess, token: &str) -> String {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = &created["result"]["session"];
    let id = session["sessionId"].as_str().unwrap().to_string();
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": id, "cursor": session["cursor"]}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    for turn in 0..6 {
        let started = client
            .call(
                "turn/start",
                json!({"sessionId": id, "text": "big:3000000", "idempotencyKey": format!("k{turn}")}),
            )
            .await;
        assert!(started.get("result").is_some(), "{started}");
        client
            .events_until(PATIENCE * 2, |e| e["type"] == "turn.finished")
            .await;
    }
    id
}

#[tokio::test]
async fn many_large_history_pages_at_once_leave_the_host_near_its_baseline() {
    let agent = tests::stand_in_agent();
    let args = ["--plain", "--agent", agent.to_str().unwrap()];
    let host = HostProcess::start_with(bin(), &args).await;
    let (_, owner) = host.pair_device("laptop", &[]).await;
    let (_, observer) = host.pair_device("phone", &["--roles", "observer"]).await;
    let id = session_with_large_history(&host, &owner).await;
    let pid = host.pid();
    let (baseline, _) = memory_kib(pid);
    let (_, peak_before) = memory_kib(pid);

    // 160 calls pipelined on one connection (within a device's burst of 200), each for a page
    // of up to 16 MiB; every one is answered.
    let mut client = Client::connect(&host.url(), &observer).await.unwrap();
    client.hello().await;
    let calls = 160u64;
    for n in 0..calls {
        let params = json!({"sessionId": id, "limit": 1000, "maxBytes": 16 << 20});
        let request = json!({"id": 1000 + n, "method": "session/history", "params": params});
        client.send_text(request.to_string()).await;
    }
    let mut answers = std::collections::BTreeMap::<String, u64>::new();
    let mut pages = 0;
    let mut max_held_peak = 0;
    while pages < calls {
        let frame = client.next_frame().await.expect("connection open");
        if frame.get("id").is_none() {
            continue;
        }
        pages += 1;
        let key = frame["error"]["code"]
            .as_str()
            .unwrap_or("result")
            .to_string();
        *answers.entry(key).or_default() += 1;
        max_held_peak = max_held_peak.max(memory_kib(pid).0);
    }
    let (_, peak) = memory_kib(pid);
    client.close_normally().await;
    drop(client);
    let after = rss_falls_to(pid, baseline + AFTER_BOUND_KIB, SETTLE).await;
    let figures = json!({
        "baselineKib": baseline,
        "peakAboveKib": above(peak, baseline),
        "peakBeforeAboveKib": above(peak_before, baseline),
        "afterCloseAboveKib": above(after, baseline),
        "answers": answers,
    });
    tests::record_figures("memory_history_pages", &figures);
    for code in answers.keys() {
        assert!(
            ["result", "HOST_OVERLOADED", "PAYLOAD_TOO_LARGE"].contains(&code.as_str()),
            "{figures}"
        );
    }
    // The peak is the process's own: reading the history before the baseline may have been
    // higher, so the bound is on what was resident while the pages were held.
    assert!(max_held_peak <= baseline + HELD_BOUND_KIB, "{figures}");
    assert!(
        peak <= peak_before.max(baseline + HELD_BOUND_KIB),
        "{figures}"
    );
    assert!(after <= baseline + AFTER_BOUND_KIB, "{figures}");
}

/// A request of `bytes` bytes whose size is all its text.
fn padded_request(method: &str, bytes: usize) -> String {
    let mut text = format!(r#"{{"id":7,"method":"{method}","params":{{"pad":""#);
    text.push_str(&"x".repeat(bytes - text.len() - 3));
    text.push_str(r#""}}"#);
    text
}

/// Whether the log has a line ending a connection with `code`.
fn ended_with(log: &str, code: &str) -> bool {
    log.lines()
        .any(|l| l.contains("ending a connection") && l.contains(&format!("code={code}")))
}

#[tokio::test]
async fn the_byte_budget_takes_exactly_its_bound_and_refuses_one_byte_more() {
    let held = 1 << 20;
    let agent = tests::stand_in_agent();
    let args = ["--plain", "--agent", agent.to_str().unwrap()];
    let max_held = held.to_string();
    let host = HostProcess::start_with(
        bin(),
        &[&args[..], &["--max-held-bytes", &max_held]].concat(),
    )
    .await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let id = created["result"]["session"]["sessionId"].clone();
    assert!(id.is_string(), "{created}");

    // A history page is charged three times its bound before a row is read.
    let page = |max_bytes: usize| json!({"sessionId": id, "maxBytes": max_bytes});
    let fits = client.call("session/history", page(held / 3)).await;
    assert!(fits.get("result").is_some(), "{fits}");
    let over = client.call("session/history", page(held / 3 + 1)).await;
    assert_eq!(over["error"]["code"], "HOST_OVERLOADED", "{over}");
    assert_eq!(over["error"]["details"]["reason"], "memory", "{over}");
    assert!(over["error"]["retryAfterMs"].as_u64() > Some(0), "{over}");

    // A request frame is charged as it arrives: exactly the budget is read (and answered), one
    // byte more ends the connection with HOST_OVERLOADED before the frame is held whole.
    client
        .send_raw_text(padded_request("session/list", held).as_bytes())
        .await;
    let answered = client.next_frame().await.expect("an answer to the frame");
    assert!(answered.get("error").is_some(), "{answered}");
    assert!(!ended_with(&host.log(), "HOST_OVERLOADED"));
    client
        .send_raw_text(padded_request("session/list", held + 1).as_bytes())
        .await;
    let logged = "a connection ended with HOST_OVERLOADED";
    let deadline = Instant::now() + PATIENCE;
    while !ended_with(&host.log(), "HOST_OVERLOADED") {
        assert!(Instant::now() < deadline, "{logged}: {}", host.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
