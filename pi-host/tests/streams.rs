//! Compact streams (docs/protocol.md §8.1) through a real host with the stand-in agent, which
//! writes pi's own shapes (each `message_update` with the whole message so far, each tool update
//! with the whole output so far): the bytes on the wire and in the store grow linearly with a
//! reply, and a client rebuilds exactly what pi held, across a cut and from a snapshot.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::calls;
use racp_proto::client::{RacpClient, Subscription, SubscriptionItem};
use racp_proto::events::Event;
use racp_proto::methods::session::{SessionCreateParams, SessionRef, SessionSubscribeParams};
use racp_proto::methods::turn::TurnStartParams;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tests::{FaultProxy, HostProcess, PATIENCE};

/// Bytes an event may cost beyond its share of the text: the envelope (seq, cursor, type, at,
/// turnId) and the compact update's own fields (docs/protocol.md §8.1, "Bounds").
const PER_EVENT_OVERHEAD: usize = 320;
/// The same for a tool output update, which also carries pi's `details` (its truncation
/// figures) each time.
const PER_UPDATE_OVERHEAD: usize = 512;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

async fn host() -> HostProcess {
    let agent = tests::stand_in_agent();
    HostProcess::start_with(
        bin(),
        &["--agent", agent.to_str().unwrap(), "--heartbeat-ms", "200"],
    )
    .await
}

async fn create_session(client: &RacpClient, host: &HostProcess) -> (String, racp_proto::Cursor) {
    let created = client
        .call::<calls::SessionCreate>(SessionCreateParams {
            workspace: host.workspace("w"),
            title: None,
            ..Default::default()
        })
        .await
        .unwrap();
    (created.session.session_id, created.session.cursor)
}

async fn subscribe(
    client: &RacpClient,
    session_id: &str,
    cursor: racp_proto::Cursor,
) -> Subscription {
    client
        .subscribe(SessionSubscribeParams {
            session_id: session_id.to_string(),
            cursor: Some(cursor),
        })
        .await
        .unwrap()
}

async fn start_turn(client: &RacpClient, session_id: &str, text: &str) {
    client
        .call::<calls::TurnStart>(TurnStartParams {
            session_id: session_id.to_string(),
            idempotency_key: text.to_string(),
            text: text.to_string(),
            images: Vec::new(),
        })
        .await
        .unwrap();
}

async fn next_event(sub: &mut Subscription) -> Box<Event> {
    match tokio::time::timeout(PATIENCE, sub.next()).await {
        Ok(Some(SubscriptionItem::Event(event))) => event,
        other => panic!("expected an event, got {other:?}"),
    }
}

fn data(event: &Event) -> Value {
    serde_json::to_value(&event.data).unwrap()
}

/// The bytes of an event as the host sent it.
fn wire_bytes(event: &Event) -> usize {
    serde_json::to_string(event).unwrap().len()
}

/// The bytes the host stored for a session's events.
fn stored_bytes(host: &HostProcess, session_id: &str) -> usize {
    let db = rusqlite::Connection::open(host.data_dir.path().join("pi-host.db")).unwrap();
    let bytes: i64 = db
        .query_row(
            "SELECT COALESCE(SUM(LENGTH(body)), 0) FROM event_chunks WHERE session_id = ?1",
            [session_id],
            |r| r.get(0),
        )
        .unwrap();
    usize::try_from(bytes).unwrap()
}

fn text_of(message: &Value) -> String {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|block| block["text"].as_str())
        .collect()
}

#[tokio::test]
async fn a_long_reply_costs_linear_bytes_and_rebuilds_exactly_across_a_cut() {
    let host = host().await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let proxy = FaultProxy::start(host.addr).await;
    let client = RacpClient::connect(tests::client_options(proxy.url(), &token))
        .await
        .unwrap();
    let (session_id, cursor) = create_session(&client, &host).await;
    let mut sub = subscribe(&client, &session_id, cursor).await;
    start_turn(&client, &session_id, "deltas:1000:1").await;

    let (mut events, mut wire, mut cut) = (0usize, 0usize, false);
    let mut last_seq = 0;
    let message_end = loop {
        let event = next_event(&mut sub).await;
        if last_seq > 0 {
            assert_eq!(event.seq, last_seq + 1, "no gap or repeat");
        }
        last_seq = event.seq;
        events += 1;
        wire += wire_bytes(&event);
        if event.kind == "agent.message_update" && !cut && events > 300 {
            // Mid-message: the client resumes by cursor and keeps rebuilding.
            proxy.cut();
            cut = true;
        }
        if event.kind == "agent.message_end" && data(&event)["message"]["role"] == "assistant" {
            break data(&event)["message"].clone();
        }
    };
    assert!(cut);
    assert_eq!(
        sub.stream().finished_message(),
        Some(&message_end),
        "the message rebuilt from compact updates is pi's message_end"
    );
    let text = text_of(&message_end).len();
    assert!(text > 8000, "a reply of {text} bytes");
    let bound = 3 * text + PER_EVENT_OVERHEAD * events;
    assert!(
        wire <= bound,
        "{wire} bytes on the wire for {text} of text in {events} events"
    );
    // Until turn.finished: the turn's last events name the message, they do not repeat it.
    loop {
        let event = next_event(&mut sub).await;
        events += 1;
        wire += wire_bytes(&event);
        if event.kind == "turn.finished" {
            break;
        }
    }
    let bound = 3 * text + PER_EVENT_OVERHEAD * events;
    assert!(
        wire <= bound,
        "{wire} bytes on the wire for the turn ({events} events)"
    );
    let stored = stored_bytes(&host, &session_id);
    assert!(stored <= bound, "{stored} bytes stored for {text} of text");
    tests::record_figures(
        "streams_1000_deltas",
        &serde_json::json!({"text": text, "events": events, "wire": wire, "stored": stored}),
    );
}

#[tokio::test]
async fn tool_output_streams_as_appends() {
    let host = host().await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let client = RacpClient::connect(tests::client_options(host.url(), &token))
        .await
        .unwrap();
    let (session_id, cursor) = create_session(&client, &host).await;
    let mut sub = subscribe(&client, &session_id, cursor).await;
    const OUTPUT: usize = 1_000_000;
    start_turn(&client, &session_id, &format!("output:{OUTPUT}")).await;
    let (mut updates, mut wire) = (0usize, 0usize);
    let result = loop {
        let event = next_event(&mut sub).await;
        if event.kind == "agent.tool_execution_update" {
            updates += 1;
            wire += wire_bytes(&event);
            let data = data(&event);
            assert!(data.get("args").is_none());
            assert!(data.get("partialResult").is_none(), "an append: {data}");
            let id = data["toolCallId"].as_str().unwrap();
            let text = sub.stream().tool_output(id).unwrap()["content"][0]["text"]
                .as_str()
                .unwrap()
                .to_string();
            // pi's window: its last 2000 lines or 50 KiB.
            assert!(text.len() <= 50 * 1024 && text.ends_with('\n'));
        }
        if event.kind == "agent.tool_execution_end" {
            break data(&event)["result"].clone();
        }
    };
    assert!(updates > 200, "{updates} updates");
    assert!(
        wire <= OUTPUT + PER_UPDATE_OVERHEAD * updates,
        "{wire} bytes for {OUTPUT} of output in {updates} updates"
    );
    // The last update rebuilt is the tool's final window.
    let last_window: Vec<&str> = result["content"][0]["text"]
        .as_str()
        .unwrap()
        .lines()
        .collect();
    assert_eq!(last_window.len(), 50 * 1024 / 64);
    tests::record_figures(
        "streams_tool_output",
        &serde_json::json!({"output": OUTPUT, "updates": updates, "wire": wire}),
    );
}

#[tokio::test]
async fn a_snapshot_mid_message_holds_the_message_so_far() {
    let host = host().await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let client = RacpClient::connect(tests::client_options(host.url(), &token))
        .await
        .unwrap();
    let (session_id, cursor) = create_session(&client, &host).await;
    let mut first = subscribe(&client, &session_id, cursor).await;
    start_turn(&client, &session_id, "deltas:400:3").await;
    let mut deltas = 0;
    while deltas < 50 {
        if next_event(&mut first).await.kind == "agent.message_update" {
            deltas += 1;
        }
    }
    let got = client
        .call::<calls::SessionGet>(SessionRef {
            session_id: session_id.clone(),
        })
        .await
        .unwrap();
    let partial = got
        .snapshot
        .streaming_message
        .clone()
        .expect("a message in progress");
    assert!(text_of(&partial).starts_with("chunk0 chunk1 "), "{partial}");
    let mut late = subscribe(&client, &session_id, got.cursor).await;
    late.resume_stream(&got.snapshot);
    let message_end = loop {
        let event = next_event(&mut late).await;
        if event.kind == "agent.message_end" && data(&event)["message"]["role"] == "assistant" {
            break data(&event)["message"].clone();
        }
    };
    assert_eq!(late.stream().finished_message(), Some(&message_end));
    assert_eq!(text_of(&message_end).matches("chunk").count(), 400);
    // After the turn, nothing streams.
    loop {
        if next_event(&mut late).await.kind == "turn.finished" {
            break;
        }
    }
    let got = client
        .call::<calls::SessionGet>(SessionRef { session_id })
        .await
        .unwrap();
    assert!(got.snapshot.streaming_message.is_none());
    assert!(got.snapshot.tool_outputs.is_empty());
}

#[tokio::test]
async fn session_stream_tells_what_was_streaming_at_any_retained_cursor() {
    let host = host().await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let client = RacpClient::connect(tests::client_options(host.url(), &token))
        .await
        .unwrap();
    let (session_id, cursor) = create_session(&client, &host).await;
    let mut sub = subscribe(&client, &session_id, cursor).await;
    start_turn(&client, &session_id, "deltas:20").await;
    // Rebuilt here event by event, as a subscriber from the start sees it; at every cursor the
    // host's answer must be the same state.
    let mut rebuilt = racp_proto::pi::stream::StreamState::default();
    let mut checked = 0;
    loop {
        let event = next_event(&mut sub).await;
        rebuilt.apply_event(&event);
        let at = client
            .call::<calls::SessionStream>(racp_proto::methods::session::SessionStreamParams {
                session_id: session_id.clone(),
                cursor: event.cursor,
            })
            .await
            .unwrap();
        assert_eq!(at.cursor, event.cursor);
        assert_eq!(
            at.streaming_message.as_ref(),
            rebuilt.message(),
            "at {}",
            event.seq
        );
        assert_eq!(&at.tool_outputs, rebuilt.tool_outputs(), "at {}", event.seq);
        if rebuilt.message().is_some() {
            checked += 1;
        }
        if event.kind == "turn.finished" {
            break;
        }
    }
    assert!(checked >= 20, "{checked} cursors mid-message");

    // A cursor the host does not have.
    let ahead = racp_proto::Cursor::new(cursor.epoch, cursor.seq + 10_000);
    let err = client
        .call::<calls::SessionStream>(racp_proto::methods::session::SessionStreamParams {
            session_id,
            cursor: ahead,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), racp_proto::ErrorCode::CursorExpired);
}

#[tokio::test]
async fn a_stream_that_began_before_the_retained_window_is_cursor_expired() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(
        bin(),
        &["--agent", agent.to_str().unwrap(), "--retain-events", "10"],
    )
    .await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let client = RacpClient::connect(tests::client_options(host.url(), &token))
        .await
        .unwrap();
    let (session_id, _) = create_session(&client, &host).await;
    start_turn(&client, &session_id, "deltas:60").await;
    let head = loop {
        let got = client
            .call::<calls::SessionGet>(SessionRef {
                session_id: session_id.clone(),
            })
            .await
            .unwrap();
        if got.snapshot.state == racp_proto::methods::session::SessionState::Idle
            && !got.snapshot.turns.is_empty()
        {
            break got.cursor;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Inside the window of 10, in a turn whose turn.started has left it.
    let mid_message = racp_proto::Cursor::new(head.epoch, head.seq - 3);
    let err = client
        .call::<calls::SessionStream>(racp_proto::methods::session::SessionStreamParams {
            session_id,
            cursor: mid_message,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), racp_proto::ErrorCode::CursorExpired, "{err:?}");
}

#[tokio::test]
async fn the_rust_client_rebuilds_a_reply_in_progress_from_its_own_cursor() {
    let host = host().await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let client = RacpClient::connect(tests::client_options(host.url(), &token))
        .await
        .unwrap();
    let (session_id, cursor) = create_session(&client, &host).await;
    let mut first = subscribe(&client, &session_id, cursor).await;
    start_turn(&client, &session_id, "deltas:300:3").await;
    let (mut updates, mut stored) = (0, None);
    while updates < 40 {
        let event = first.next().await;
        let Some(SubscriptionItem::Event(event)) = event else {
            panic!("expected an event, got {event:?}");
        };
        if event.kind == "agent.message_update" {
            updates += 1;
            stored = Some(event.cursor);
        }
    }
    let expected = first.stream().message().cloned();
    assert!(expected.is_some());
    drop(first);
    let reloaded = subscribe(&client, &session_id, stored.unwrap()).await;
    assert_eq!(reloaded.stream().message(), expected.as_ref());
}
