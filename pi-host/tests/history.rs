//! A session's history over a real host with the stand-in agent (docs/protocol.md §7.24): the
//! snapshot carries the recent entries with large ones cut, `session/history` pages back and
//! reads a cut entry whole, bad params and cursors are refused, and the owner's bound holds.
//! tests real_pi.rs shows the same with the real pi, past the replay window, a kill -9 and an
//! idle stop.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use tests::{Client, HostProcess, PATIENCE};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

/// A host whose agent is the stand-in, with `extra` serve arguments.
async fn host(extra: &[&str]) -> HostProcess {
    let agent = tests::stand_in_agent();
    let mut args = vec!["--agent", agent.to_str().unwrap()];
    args.extend_from_slice(extra);
    HostProcess::start_with(bin(), &args).await
}

/// A subscribed session on `host` after one turn per prompt; returns the client, the session
/// id and every event the subscription delivered.
async fn session_after(host: &HostProcess, prompts: &[&str]) -> (Client, String, Vec<Value>) {
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = created["result"]["session"].clone();
    let id = session["sessionId"].as_str().unwrap().to_string();
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": id, "cursor": session["cursor"]}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let mut events = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let turn = client
            .call(
                "turn/start",
                json!({"sessionId": id, "idempotencyKey": format!("k{i}"), "text": prompt}),
            )
            .await;
        assert!(turn.get("result").is_some(), "{turn}");
        events.extend(
            client
                .events_until(PATIENCE * 2, |e| e["type"] == "turn.finished")
                .await,
        );
    }
    (client, id, events)
}

fn messages(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] == "agent.message_end")
        .cloned()
        .collect()
}

async fn history(client: &mut Client, params: Value) -> Value {
    client.call("session/history", params).await
}

#[tokio::test]
async fn the_snapshot_cuts_large_entries_and_a_page_reads_them_whole() {
    let host = host(&[]).await;
    let (mut client, id, events) = session_after(&host, &["big:40000", "deltas:2"]).await;
    let live = messages(&events);
    assert_eq!(live.len(), 4, "two prompts, two replies");

    let got = client.call("session/get", json!({"sessionId": id})).await;
    let snapshot = &got["result"]["snapshot"]["history"];
    let entries = snapshot["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 4, "{snapshot}");
    assert!(snapshot.get("earlier").is_none(), "the whole history fits");
    let big = &entries[1];
    assert_eq!(big["seq"], live[1]["seq"]);
    let cut = &big["elided"];
    assert!(cut["bytes"].as_u64().unwrap() > 40_000, "{cut}");
    assert!(big.to_string().len() <= 16 << 10, "cut to 16 KiB");
    for i in [0, 2, 3] {
        assert_eq!(entries[i], live[i], "small entries are whole");
    }

    // The cut entry, whole: the page that ends at it, one entry, with room for it.
    let whole = history(
        &mut client,
        json!({"sessionId": id, "upTo": big["cursor"], "limit": 1, "maxBytes": 1 << 20}),
    )
    .await;
    assert_eq!(whole["result"]["entries"], json!([live[1]]), "{whole}");
    // The page before it ends with the message before it.
    let before = history(
        &mut client,
        json!({"sessionId": id, "upTo": whole["result"]["earlier"], "limit": 1}),
    )
    .await;
    assert_eq!(before["result"]["entries"], json!([live[0]]), "{before}");
    assert!(before["result"].get("earlier").is_none(), "{before}");
    // A page smaller than the entry carries it alone, cut to the page.
    let small = history(
        &mut client,
        json!({"sessionId": id, "upTo": big["cursor"], "maxBytes": 4096}),
    )
    .await;
    let small = small["result"]["entries"].as_array().unwrap();
    assert_eq!(small.len(), 1);
    assert!(small[0]["elided"].is_object() && small[0].to_string().len() <= 4096);

    // Paging back one entry at a time from the head gives every message once, in order.
    let mut walked = Vec::new();
    let mut up_to = Value::Null;
    loop {
        let mut params = json!({"sessionId": id, "limit": 1, "maxBytes": 1 << 20});
        if !up_to.is_null() {
            params["upTo"] = up_to.clone();
        }
        let page = history(&mut client, params).await;
        walked.splice(0..0, page["result"]["entries"].as_array().unwrap().clone());
        up_to = page["result"]["earlier"].clone();
        if up_to.is_null() {
            break;
        }
    }
    assert_eq!(walked, live);
}

#[tokio::test]
async fn bad_pages_and_cursors_are_refused() {
    let host = host(&[]).await;
    let (mut client, id, events) = session_after(&host, &["deltas:1"]).await;
    let head = events.last().unwrap()["cursor"]
        .as_str()
        .unwrap()
        .to_string();
    let (epoch, seq) = head.rsplit_once('-').unwrap();
    let other_epoch = format!("{:016x}-{seq}", u64::from_str_radix(epoch, 16).unwrap() ^ 1);
    let ahead = format!("{epoch}-{}", seq.parse::<u64>().unwrap() + 1);
    for (params, code, path) in [
        (
            json!({"sessionId": id, "limit": 0}),
            "INVALID_PARAMS",
            Some("params.limit"),
        ),
        (
            json!({"sessionId": id, "limit": 1001}),
            "INVALID_PARAMS",
            Some("params.limit"),
        ),
        (
            json!({"sessionId": id, "maxBytes": 100}),
            "INVALID_PARAMS",
            Some("params.maxBytes"),
        ),
        (
            json!({"sessionId": id, "upTo": "nope"}),
            "INVALID_PARAMS",
            Some("params.upTo"),
        ),
        (
            json!({"sessionId": id, "upTo": other_epoch}),
            "CURSOR_EXPIRED",
            None,
        ),
        (
            json!({"sessionId": id, "upTo": ahead}),
            "CURSOR_EXPIRED",
            None,
        ),
        (json!({"sessionId": "ses_none"}), "SESSION_NOT_FOUND", None),
    ] {
        let reply = history(&mut client, params.clone()).await;
        assert_eq!(reply["error"]["code"], code, "{params}: {reply}");
        if let Some(path) = path {
            assert_eq!(reply["error"]["details"]["path"], path, "{reply}");
        }
        assert!(
            !reply["error"]["message"].as_str().unwrap().is_empty(),
            "{reply}"
        );
    }
    // Before the first entry: an empty page with nothing earlier.
    let start = format!("{epoch}-0");
    let page = history(&mut client, json!({"sessionId": id, "upTo": start})).await;
    assert_eq!(page["result"]["entries"], json!([]), "{page}");
    assert!(page["result"].get("earlier").is_none(), "{page}");
}

#[tokio::test]
async fn the_owners_byte_bound_drops_the_oldest_entries() {
    let host = host(&["--history-max-bytes", "3000"]).await;
    let prompts = ["deltas:40", "deltas:40", "deltas:40"];
    let (mut client, id, events) = session_after(&host, &prompts).await;
    let live = messages(&events);
    let page = history(&mut client, json!({"sessionId": id})).await;
    let kept = page["result"]["entries"].as_array().unwrap();
    let bytes: usize = kept.iter().map(|e| e.to_string().len()).sum();
    assert!(bytes <= 3000, "{bytes} bytes kept");
    assert!(!kept.is_empty() && kept.len() < live.len(), "{page}");
    assert_eq!(kept[..], live[live.len() - kept.len()..], "the newest stay");
    assert_eq!(page["result"]["truncated"], true, "{page}");
    assert!(page["result"].get("earlier").is_none(), "{page}");
}

/// What a clone's history holds of an entry: its type and data (the clone's own events carry
/// their own seq, time and no turn).
fn conversation(entries: &Value) -> Vec<(Value, Value)> {
    entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["type"].clone(), e["data"].clone()))
        .collect()
}

/// A clone's history is its source's, entry for entry (docs/protocol.md §7.32): over more than
/// one batch of the copy (256 entries), and up to the newest entry, here a shell command, the
/// source's last event.
#[tokio::test]
async fn a_clone_holds_every_history_entry_of_its_source_up_to_the_newest() {
    const SHELL_COMMANDS: usize = 256;
    // Its 260 calls in a row stay inside one device's burst, on a fast machine too.
    let host = host(&["--request-burst", "1000"]).await;
    let (mut client, id, _) = session_after(&host, &["deltas:1"]).await;
    for i in 0..SHELL_COMMANDS {
        let ran = client
            .call(
                "session/bash",
                json!({"sessionId": id, "command": format!("echo {i}")}),
            )
            .await;
        assert!(ran.get("result").is_some(), "{ran}");
    }
    let page = json!({"sessionId": id, "limit": 1000, "maxBytes": 16 << 20});
    let source = history(&mut client, page).await;
    let source = conversation(&source["result"]["entries"]);
    assert_eq!(source.len(), 2 + SHELL_COMMANDS);
    assert_eq!(
        source.last().unwrap().1["command"],
        format!("echo {}", SHELL_COMMANDS - 1)
    );

    let cloned = client.call("session/clone", json!({"sessionId": id})).await;
    let clone_id = cloned["result"]["session"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{cloned}"))
        .to_string();
    let page = json!({"sessionId": clone_id, "limit": 1000, "maxBytes": 16 << 20});
    let copy = history(&mut client, page).await;
    assert_eq!(conversation(&copy["result"]["entries"]), source);
}
