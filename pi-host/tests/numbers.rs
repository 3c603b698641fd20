//! Numbers in relayed agent payloads arrive exactly as the agent wrote them, byte for byte: live,
//! replayed by cursor, cut to a small frame bound, after a kill -9 and restart (replayed from
//! the durable store), and through the Rust client (docs/protocol.md §1, "Numbers").

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::Cursor;
use racp_proto::client::{RacpClient, SubscriptionItem};
use racp_proto::methods::session::SessionSubscribeParams;
use serde_json::{Value, json};
use std::path::Path;
use tests::{Client, EDGE_NUMBERS, HostProcess, PATIENCE};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

fn agent_args() -> Vec<String> {
    let agent = tests::stand_in_agent();
    vec!["--agent".into(), agent.to_str().unwrap().into()]
}

/// The stand-in agent's `numbers` line with `pad` x's, as it writes it.
fn agent_line(pad: usize) -> String {
    format!(
        r#"{{"type":"stand_in_numbers","values":[{}],"pad":"{}"}}"#,
        EDGE_NUMBERS.join(","),
        "x".repeat(pad)
    )
}

/// `"values":[…]` as the agent writes it.
fn values_text() -> String {
    format!(r#""values":[{}]"#, EDGE_NUMBERS.join(","))
}

async fn connect(host: &HostProcess, token: &str, max_frame_bytes: Option<u64>) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    let mut params =
        json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "numbers", "version": "0"}});
    if let Some(bound) = max_frame_bytes {
        params["maxFrameBytes"] = json!(bound);
    }
    let reply = client.call("hello", params).await;
    assert!(reply.get("result").is_some(), "{reply}");
    client
}

/// Subscribes from `cursor` and returns the raw text of every frame up to and including the
/// one holding the `count`-th `agent.stand_in_numbers` event.
async fn frames_until_numbers(
    client: &mut Client,
    session_id: &str,
    cursor: &str,
    count: usize,
) -> Vec<String> {
    let reply = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": cursor}),
        )
        .await;
    assert!(reply.get("result").is_some(), "{reply}");
    let mut frames = Vec::new();
    let mut seen = 0;
    tokio::time::timeout(PATIENCE * 2, async {
        while seen < count {
            let text = client.next_text().await.expect("connection open");
            seen += text.matches(r#""type":"agent.stand_in_numbers""#).count();
            frames.push(text);
        }
    })
    .await
    .expect("the numbers events came");
    frames
}

/// The `data` of every `agent.stand_in_numbers` event a Rust client subscribed from `cursor`
/// receives, until `count` of them came.
async fn rust_client_data(
    host: &HostProcess,
    token: &str,
    session_id: &str,
    cursor: Cursor,
    count: usize,
) -> Vec<String> {
    let client = RacpClient::connect(tests::client_options(host.url(), token))
        .await
        .unwrap();
    let mut sub = client
        .subscribe(SessionSubscribeParams {
            session_id: session_id.into(),
            cursor: Some(cursor),
        })
        .await
        .unwrap();
    let mut data = Vec::new();
    while data.len() < count {
        let item = tokio::time::timeout(PATIENCE, sub.items.recv())
            .await
            .expect("an item in time")
            .expect("the subscription is open");
        match item {
            SubscriptionItem::Event(event) if event.kind == "agent.stand_in_numbers" => {
                data.push(event.data.get().to_string());
            }
            SubscriptionItem::Event(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    data
}

async fn run_turn(client: &mut Client, session_id: &str, key: &str, text: &str) {
    let reply = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
        )
        .await;
    assert!(reply.get("result").is_some(), "{reply}");
    let turn_id = reply["result"]["turnId"].clone();
    client
        .events_until(PATIENCE * 2, |e| {
            e["type"] == "turn.finished" && e["turnId"] == turn_id
        })
        .await;
}

/// Every delivery path of the host, checked on the raw text a subscriber reads.
async fn check_every_path(host: &HostProcess, token: &str, session_id: &str, start: &str) {
    let small = agent_line(0);
    let large = agent_line(8000);

    // Replay by cursor, on a connection with the default frame bound: both events whole.
    let mut replay = connect(host, token, None).await;
    let frames = frames_until_numbers(&mut replay, session_id, start, 2)
        .await
        .concat();
    assert!(frames.contains(&format!(r#""data":{small}"#)), "{frames}");
    assert!(frames.contains(&format!(r#""data":{large}"#)), "{frames}");

    // A connection whose bound the large event does not fit: `pad` is cut, the numbers stay.
    let mut narrow = connect(host, token, Some(4096)).await;
    let frames = frames_until_numbers(&mut narrow, session_id, start, 2).await;
    let cut = frames.last().unwrap();
    assert!(cut.len() <= 4096, "{}", cut.len());
    assert!(cut.contains(r#""elided""#), "{cut}");
    assert!(
        cut.contains(&format!(
            r#""data":{{"type":"stand_in_numbers",{},"pad":"xxx"#,
            values_text()
        )),
        "{cut}"
    );
    let event: Value = serde_json::from_str(cut).unwrap();
    let elided = &event["params"]["events"][0]["elided"];
    assert_eq!(elided["cut"][0]["path"], "data.pad", "{cut}");

    // The Rust client hands `data` over as the text it received.
    let start: Cursor = start.parse().unwrap();
    let data = rust_client_data(host, token, session_id, start, 2).await;
    assert_eq!(data, [small, large]);
}

#[tokio::test]
async fn numbers_at_the_edges_arrive_exactly_as_the_agent_wrote_them() {
    let args = agent_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let host = HostProcess::start_with(bin(), &args).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut live = connect(&host, &token, None).await;
    let created = live
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["session"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let start = created["result"]["session"]["cursor"]
        .as_str()
        .unwrap()
        .to_string();

    // Live: the subscriber's frame holds the agent's line byte for byte.
    let reply = live
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": start}),
        )
        .await;
    assert!(reply.get("result").is_some(), "{reply}");
    let reply = live
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "numbers"}),
        )
        .await;
    assert!(reply.get("result").is_some(), "{reply}");
    let frames = tokio::time::timeout(PATIENCE * 2, async {
        let mut frames = String::new();
        while !frames.contains(r#""type":"turn.finished""#) {
            frames.push_str(&live.next_text().await.expect("connection open"));
        }
        frames
    })
    .await
    .expect("the turn finished");
    assert!(
        frames.contains(&format!(r#""data":{}"#, agent_line(0))),
        "{frames}"
    );
    run_turn(&mut live, &session_id, "k2", "numbers:8000").await;

    check_every_path(&host, &token, &session_id, &start).await;

    // kill -9 and restart: the log is read back from the store, and replays the same bytes.
    drop(live);
    let host = host.restart(&args).await;
    check_every_path(&host, &token, &session_id, &start).await;
}
