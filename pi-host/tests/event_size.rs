//! The size policy for events: no frame exceeds the connection's negotiated bound, even when a
//! single event is larger; such an event arrives with its large values cut and an `elided`
//! marker, and a connection with a larger bound reads it whole from `elided.from`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use tests::{Client, HostProcess, PATIENCE};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

/// A device connection whose hello asks for `max_frame_bytes` (`None`: the host's bound).
async fn connect(host: &HostProcess, token: &str, max_frame_bytes: Option<u64>) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    let mut params =
        json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "t", "version": "0"}});
    if let Some(max) = max_frame_bytes {
        params["maxFrameBytes"] = json!(max);
    }
    let hello = client.call("hello", params).await;
    assert!(hello.get("result").is_some(), "{hello}");
    client
}

/// Reads `session/events` pushes until `turn.finished`; returns the events and the size of
/// the largest push (as JSON text; serde_json writes the same bytes the host did).
async fn read_turn(client: &mut Client) -> (Vec<Value>, usize) {
    let mut events = Vec::new();
    let mut largest = 0;
    let read = async {
        loop {
            let frame = client.next_frame().await.expect("connection open");
            if frame["method"] != "session/events" {
                continue;
            }
            largest = largest.max(serde_json::to_string(&frame).unwrap().len());
            for event in frame["params"]["events"].as_array().unwrap() {
                events.push(event.clone());
                if event["type"] == "turn.finished" {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(PATIENCE * 2, read)
        .await
        .expect("the turn did not finish in time");
    (events, largest)
}

fn assert_contiguous(events: &[Value], first: u64) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["seq"], first + i as u64, "gap or duplicate at {i}");
    }
}

#[tokio::test]
async fn events_over_the_frame_bound_arrive_cut_with_a_marker_and_can_be_read_whole() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut small = connect(&host, &token, Some(8192)).await;
    let mut large = connect(&host, &token, None).await;
    let created = small
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["session"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let start = created["result"]["session"]["cursor"].clone();
    for client in [&mut small, &mut large] {
        let sub = client
            .call(
                "session/subscribe",
                json!({"sessionId": session_id, "cursor": start}),
            )
            .await;
        assert!(sub.get("result").is_some(), "{sub}");
    }
    // A 100 kB delta (over 8 KiB, under 1 MiB), a small message, and a 1.5 MB delta (over
    // even the host's own 1 MiB bound).
    let started = small
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k",
                   "text": "big:100000 deltas:3 big:1500000"}),
        )
        .await;
    assert!(started.get("result").is_some(), "{started}");

    let (events, largest) = read_turn(&mut small).await;
    assert!(
        largest <= 8192,
        "a push of {largest} bytes on an 8 KiB link"
    );
    assert_contiguous(&events, 1);
    let elided: Vec<&Value> = events
        .iter()
        .filter(|e| e.get("elided").is_some())
        .collect();
    assert!(!elided.is_empty());
    for event in &events {
        if event.get("elided").is_none() {
            continue;
        }
        let marker = &event["elided"];
        assert_eq!(marker["limit"], 8192);
        assert!(marker["bytes"].as_u64().unwrap() > 8192);
        assert!(!marker["cut"].as_array().unwrap().is_empty());
        assert!(event["type"].as_str().unwrap().starts_with("agent."));
    }
    // The 100 kB delta: the delta itself is cut to a prefix of x's, its path named.
    let delta = events
        .iter()
        .find(|e| {
            e["data"]["assistantMessageEvent"]["type"] == "text_delta"
                && e["elided"]["bytes"].as_u64().is_some_and(|b| b < 1 << 20)
        })
        .expect("the 100 kB delta, cut");
    let kept = delta["data"]["assistantMessageEvent"]["delta"]
        .as_str()
        .unwrap();
    assert!(kept.chars().all(|c| c == 'x'));
    let cut = delta["elided"]["cut"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "data.assistantMessageEvent.delta")
        .expect("the delta's path is named");
    assert_eq!(cut["kept"], kept.chars().count());
    assert_eq!(cut["bytes"], 100_002);
    // Small events are whole.
    let small_deltas = events
        .iter()
        .filter(|e| {
            e["data"]["assistantMessageEvent"]["delta"]
                .as_str()
                .is_some_and(|d| d.starts_with("chunk"))
        })
        .count();
    assert_eq!(small_deltas, 3);
    assert!(
        events
            .iter()
            .filter(|e| e["type"] == "turn.started" || e["type"] == "turn.finished")
            .all(|e| e.get("elided").is_none())
    );

    // The host's own bound is 1 MiB: the 100 kB event is whole there, the 1.5 MB one is not.
    let (whole, largest) = read_turn(&mut large).await;
    assert!(
        largest <= 1 << 20,
        "a push of {largest} bytes on a 1 MiB link"
    );
    assert_contiguous(&whole, 1);
    let same = &whole[delta["seq"].as_u64().unwrap() as usize - 1];
    assert!(same.get("elided").is_none());
    assert_eq!(
        same["data"]["assistantMessageEvent"]["delta"]
            .as_str()
            .unwrap()
            .len(),
        100_000
    );
    let huge = whole
        .iter()
        .find(|e| e["elided"]["bytes"].as_u64().is_some_and(|b| b > 1 << 20))
        .expect("the 1.5 MB delta is cut even at the host's bound");
    assert_eq!(huge["elided"]["limit"], 1 << 20);

    // `elided.from` is where a connection with a larger bound reads the event whole.
    let mut reader = connect(&host, &token, None).await;
    let sub = reader
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": delta["elided"]["from"]}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let first = reader.events_until(PATIENCE, |_| true).await.pop().unwrap();
    assert_eq!(first["seq"], delta["seq"]);
    assert_eq!(first, *same);
}

#[tokio::test]
async fn replies_over_the_frame_bound_are_cut_or_refused_never_oversized() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut small = connect(&host, &token, Some(8192)).await;
    let mut large = connect(&host, &token, None).await;
    let created = large
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["session"]["sessionId"].clone();
    // Three turns with 7000-character prompts: the snapshot holds them all (21 kB).
    for key in ["a", "b", "c"] {
        let text = format!("deltas:1 {}", "p".repeat(7000));
        let started = large
            .call(
                "turn/start",
                json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
            )
            .await;
        assert!(started.get("result").is_some(), "{started}");
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let got = large
                .call("session/get", json!({"sessionId": session_id}))
                .await;
            if got["result"]["snapshot"]["state"] == "idle" {
                break;
            }
            assert!(std::time::Instant::now() < deadline);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    let whole = large
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert!(whole["result"].get("elided").is_none());
    let cut = small
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert!(serde_json::to_string(&cut).unwrap().len() <= 8192);
    let result = &cut["result"];
    assert_eq!(
        result["cursor"], whole["result"]["cursor"],
        "cursors stay whole"
    );
    assert_eq!(result["session"]["sessionId"], session_id);
    let turns = result["snapshot"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    for (turn, original) in turns
        .iter()
        .zip(whole["result"]["snapshot"]["turns"].as_array().unwrap())
    {
        assert_eq!(turn["turnId"], original["turnId"]);
        assert!(
            original["text"]
                .as_str()
                .unwrap()
                .starts_with(turn["text"].as_str().unwrap())
        );
    }
    let marker = &result["elided"];
    assert_eq!(marker["limit"], 8192);
    assert!(marker["bytes"].as_u64().unwrap() > 8192);
    assert!(
        marker["cut"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["path"] == "result.snapshot.turns.0.text")
    );

    // A listing of many small entries cannot be cut: PAYLOAD_TOO_LARGE, the connection lives.
    let dir = host.workspace("many");
    for i in 0..400 {
        std::fs::write(format!("{dir}/file-{i:04}.txt"), "x").unwrap();
    }
    let refused = small.call("fs/list", json!({"path": dir})).await;
    assert_eq!(
        refused["error"]["code"], "PAYLOAD_TOO_LARGE",
        "{refused:.300}"
    );
    assert_eq!(refused["error"]["details"]["reason"], "reply_too_large");
    assert!(refused["error"]["details"]["size"].as_u64().unwrap() > 8192);
    let listed = large.call("fs/list", json!({"path": dir})).await;
    assert_eq!(listed["result"]["entries"].as_array().unwrap().len(), 400);
    let still = small.call("host/info", json!({})).await;
    assert!(still.get("result").is_some(), "{still}");
}

#[tokio::test]
async fn heartbeats_for_many_subscriptions_are_split_to_fit_the_bound() {
    let host = HostProcess::start_with(bin(), &["--heartbeat-ms", "100"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token, Some(4096)).await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["session"]["sessionId"].clone();
    let mut ids = std::collections::BTreeSet::new();
    for _ in 0..60 {
        let sub = client
            .call("session/subscribe", json!({"sessionId": session_id}))
            .await;
        ids.insert(
            sub["result"]["subscriptionId"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // One heartbeat round covers every subscription, over pushes that each fit 4 KiB.
    let mut seen = std::collections::BTreeSet::new();
    let mut pushes = 0;
    let read = async {
        while seen != ids {
            let frame = client.next_frame().await.expect("connection open");
            if frame["method"] != "heartbeat" {
                continue;
            }
            assert!(serde_json::to_string(&frame).unwrap().len() <= 4096);
            pushes += 1;
            for entry in frame["params"]["subscriptions"].as_array().unwrap() {
                seen.insert(entry["subscriptionId"].as_str().unwrap().to_string());
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("every subscription in the heartbeats");
    assert!(
        pushes >= 2,
        "60 subscriptions need more than one 4 KiB push"
    );
}
