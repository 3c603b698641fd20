//! Turns, approvals, replay, backpressure and durability, driven over RACP-WS against a real
//! host running the stand-in agent (a test fixture speaking pi's RPC subset).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

async fn start_host(extra: &[&str]) -> HostProcess {
    let agent = tests::stand_in_agent();
    let mut args = vec!["--agent", agent.to_str().unwrap()];
    args.extend_from_slice(extra);
    HostProcess::start_with(bin(), &args).await
}

struct Setup {
    host: HostProcess,
    token: String,
    client: Client,
    session_id: String,
    start: Value,
}

impl Setup {
    /// Kills the host and starts it again on the same data directory (with the stand-in
    /// agent); returns it with the device token and the session id.
    async fn restart(self) -> (HostProcess, String, String) {
        let agent = tests::stand_in_agent();
        let host = self
            .host
            .restart(&["--agent", agent.to_str().unwrap()])
            .await;
        (host, self.token, self.session_id)
    }
}

async fn setup(extra: &[&str]) -> Setup {
    let host = start_host(extra).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = &created["result"]["session"];
    Setup {
        session_id: session["sessionId"].as_str().unwrap().to_string(),
        start: session["cursor"].clone(),
        host,
        token,
        client,
    }
}

async fn connect(s: &Setup) -> Client {
    let mut client = Client::connect(&s.host.url(), &s.token).await.unwrap();
    client.hello().await;
    client
}

async fn subscribe(client: &mut Client, session_id: &str, cursor: Option<&Value>) -> Value {
    let mut params = json!({"sessionId": session_id});
    if let Some(cursor) = cursor {
        params["cursor"] = cursor.clone();
    }
    client.call("session/subscribe", params).await
}

async fn start_turn(client: &mut Client, session_id: &str, key: &str, text: &str) -> Value {
    client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
        )
        .await
}

/// Collects events until one satisfies `done` (inclusive).
async fn events_until(client: &mut Client, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    client.events_until(tests::PATIENCE * 4, done).await
}

fn is_text_delta(event: &Value) -> bool {
    event["type"] == "agent.message_update"
        && event["data"]["assistantMessageEvent"]["type"] == "text_delta"
}

fn is_turn_finished(event: &Value) -> bool {
    event["type"] == "turn.finished"
}

fn assert_contiguous(events: &[Value], first_seq: u64) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event["seq"],
            first_seq + i as u64,
            "gap or duplicate at index {i}"
        );
    }
}

#[tokio::test]
async fn a_turn_streams_agent_events_between_turn_started_and_turn_finished() {
    let mut s = setup(&[]).await;
    let sub = subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    assert!(sub.get("result").is_some(), "{sub}");
    let turn = start_turn(&mut s.client, &s.session_id, "k1", "deltas:5").await;
    let turn_id = turn["result"]["turnId"].as_str().unwrap().to_string();
    let events = events_until(&mut s.client, is_turn_finished).await;
    assert_contiguous(&events, 1);
    assert_eq!(events[0]["type"], "turn.started");
    assert_eq!(events[0]["data"]["text"], "deltas:5");
    let last = events.last().unwrap();
    assert_eq!(last["data"]["outcome"], "completed");
    assert!(events.iter().all(|e| e["turnId"] == turn_id.as_str()));
    let deltas = events.iter().filter(|e| is_text_delta(e)).count();
    assert_eq!(deltas, 5);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let agent_end = kinds.iter().position(|k| *k == "agent.agent_end").unwrap();
    assert_eq!(
        agent_end + 1,
        kinds.len() - 1,
        "turn.finished follows agent_end"
    );

    let got = s
        .client
        .call("session/get", json!({"sessionId": s.session_id}))
        .await;
    let snapshot = &got["result"]["snapshot"];
    assert_eq!(snapshot["state"], "idle");
    assert_eq!(snapshot["turns"][0]["state"], "completed");
    assert_eq!(got["result"]["cursor"], last["cursor"]);
}

#[tokio::test]
async fn turn_start_is_idempotent_by_key() {
    let mut s = setup(&[]).await;
    let first = start_turn(&mut s.client, &s.session_id, "same", "deltas:1").await;
    let again = start_turn(&mut s.client, &s.session_id, "same", "deltas:1").await;
    assert_eq!(first["result"]["turnId"], again["result"]["turnId"]);
    let other = start_turn(&mut s.client, &s.session_id, "same", "deltas:2").await;
    assert_eq!(other["error"]["code"], "IDEMPOTENCY_CONFLICT");
    let sub = subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    assert!(sub.get("result").is_some());
    let events = events_until(&mut s.client, is_turn_finished).await;
    let started = events
        .iter()
        .filter(|e| e["type"] == "turn.started")
        .count();
    assert_eq!(started, 1, "one turn despite the resend");

    // A key is scoped to its session (docs/protocol.md §6.3): the same key, even with the same
    // text, starts a turn of its own in another session, and resends there find that turn.
    let created = s
        .client
        .call(
            "session/create",
            json!({"workspace": s.host.workspace("w2")}),
        )
        .await;
    let second = created["result"]["session"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let there = start_turn(&mut s.client, &second, "same", "deltas:1").await;
    let there_id = &there["result"]["turnId"];
    assert!(there_id.is_string(), "{there}");
    assert_ne!(there_id, &first["result"]["turnId"], "{there}");
    let resent = start_turn(&mut s.client, &second, "same", "deltas:1").await;
    assert_eq!(&resent["result"]["turnId"], there_id, "{resent}");
    let other = start_turn(&mut s.client, &second, "same", "deltas:3").await;
    assert_eq!(other["error"]["code"], "IDEMPOTENCY_CONFLICT", "{other}");
    assert_eq!(other["error"]["details"]["turnId"], *there_id, "{other}");
}

#[tokio::test]
async fn busy_steer_abort_and_crash() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    let turn = start_turn(&mut s.client, &s.session_id, "a", "hang").await;
    let turn_id = turn["result"]["turnId"].clone();
    let busy = start_turn(&mut s.client, &s.session_id, "b", "deltas:1").await;
    assert_eq!(busy["error"]["code"], "AGENT_BUSY");
    let steer = s
        .client
        .call(
            "turn/steer",
            json!({"sessionId": s.session_id, "turnId": turn_id, "text": "hurry"}),
        )
        .await;
    assert!(steer.get("result").is_some(), "{steer}");
    let unknown = s
        .client
        .call(
            "turn/steer",
            json!({"sessionId": s.session_id, "turnId": "turn_nope", "text": "x"}),
        )
        .await;
    assert_eq!(unknown["error"]["code"], "TURN_NOT_FOUND");
    let abort = s
        .client
        .call(
            "turn/abort",
            json!({"sessionId": s.session_id, "turnId": turn_id}),
        )
        .await;
    assert!(abort.get("result").is_some(), "{abort}");
    let events = events_until(&mut s.client, is_turn_finished).await;
    let last = events.last().unwrap();
    assert_eq!(last["data"]["outcome"], "aborted");
    assert_eq!(last["data"]["error"]["code"], "TURN_ABORTED");
    let again = s
        .client
        .call(
            "turn/abort",
            json!({"sessionId": s.session_id, "turnId": turn_id}),
        )
        .await;
    assert!(
        again.get("result").is_some(),
        "aborting a finished turn is fine: {again}"
    );

    start_turn(&mut s.client, &s.session_id, "c", "deltas:1 crash").await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    let last = events.last().unwrap();
    // A crash settles the turn as aborted (docs/protocol.md §8.7).
    assert_eq!(last["data"]["outcome"], "aborted");
    assert_eq!(last["data"]["error"]["code"], "AGENT_SIDECAR_CRASHED");
    assert!(last["data"]["error"]["traceId"].is_string(), "{last}");
    assert!(
        last["data"]["error"]["details"]["stderrTail"]
            .as_str()
            .unwrap()
            .contains("scripted crash")
    );

    // The next turn restarts the agent.
    start_turn(&mut s.client, &s.session_id, "d", "deltas:2").await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
}

#[tokio::test]
async fn a_missing_agent_is_agent_unavailable() {
    let host = HostProcess::start_with(bin(), &["--agent", "/nonexistent/pi --mode rpc"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let id = created["result"]["session"]["sessionId"].clone();
    let reply = client
        .call(
            "turn/start",
            json!({"sessionId": id, "idempotencyKey": "k", "text": "hi"}),
        )
        .await;
    assert_eq!(reply["error"]["code"], "AGENT_UNAVAILABLE", "{reply}");
    assert!(reply["error"]["details"]["suggestion"].as_str().is_some());
}

#[tokio::test]
async fn approvals_first_answer_wins_and_others_are_stale() {
    let mut s = setup(&[]).await;
    // Another device answers first: the approval records which one settled it.
    let (other_id, other_token) = s.host.pair_device("phone", &["--roles", "operator"]).await;
    let mut other = Client::connect(&s.host.url(), &other_token).await.unwrap();
    other.hello().await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "approve:confirm").await;
    let events = events_until(&mut s.client, |e| e["type"] == "approval.requested").await;
    let approval_id = events.last().unwrap()["data"]["approvalId"].clone();
    let got = s
        .client
        .call("session/get", json!({"sessionId": s.session_id}))
        .await;
    assert_eq!(
        got["result"]["snapshot"]["pendingApprovals"][0]["approvalId"],
        approval_id
    );

    let wrong = other
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": {"value": "x"}}),
        )
        .await;
    assert_eq!(wrong["error"]["code"], "INVALID_PARAMS");
    let first = other
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "allow"}),
        )
        .await;
    assert_eq!(first["result"]["approval"]["state"], "allowed", "{first}");
    assert_eq!(
        first["result"]["approval"]["settledBy"], other_id,
        "{first}"
    );
    let second = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "deny"}),
        )
        .await;
    assert_eq!(second["error"]["code"], "APPROVAL_STALE");
    assert_eq!(
        second["error"]["details"]["settledBy"], other_id,
        "{second}"
    );
    let events = events_until(&mut s.client, is_turn_finished).await;
    let settled = events
        .iter()
        .find(|e| e["type"] == "approval.settled")
        .unwrap();
    assert_eq!(settled["data"]["outcome"], "allowed");
    let tool_end = events
        .iter()
        .find(|e| e["type"] == "agent.tool_execution_end")
        .unwrap();
    assert!(
        tool_end.to_string().contains("stand-in tool ran"),
        "{tool_end}"
    );
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
}

/// Who acted is named in the events themselves, for every reader: an observer, who may not
/// list devices, reads the operator's name in `turn.started` and `approval.settled`.
#[tokio::test]
async fn an_operators_events_carry_its_name_for_an_observer_too() {
    let s = setup(&[]).await;
    let (phone_id, phone_token) = s.host.pair_device("phone", &["--roles", "operator"]).await;
    let (_, tablet_token) = s.host.pair_device("tablet", &["--roles", "observer"]).await;
    let mut phone = Client::connect(&s.host.url(), &phone_token).await.unwrap();
    phone.hello().await;
    subscribe(&mut phone, &s.session_id, Some(&s.start)).await;
    start_turn(&mut phone, &s.session_id, "k", "approve:confirm").await;
    let events = events_until(&mut phone, |e| e["type"] == "approval.requested").await;
    let approval_id = events.last().unwrap()["data"]["approvalId"].clone();
    let answered = phone
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "allow"}),
        )
        .await;
    assert_eq!(
        answered["result"]["approval"]["settledByName"], "phone",
        "{answered}"
    );
    events_until(&mut phone, is_turn_finished).await;

    let mut tablet = Client::connect(&s.host.url(), &tablet_token).await.unwrap();
    tablet.hello().await;
    let listed = tablet.call("device/list", json!({})).await;
    assert_eq!(listed["error"]["code"], "FORBIDDEN", "{listed}");
    subscribe(&mut tablet, &s.session_id, Some(&s.start)).await;
    let logged = events_until(&mut tablet, is_turn_finished).await;
    for kind in ["turn.started", "approval.settled"] {
        let event = logged.iter().find(|e| e["type"] == kind).unwrap();
        assert_eq!(event["data"]["deviceId"], phone_id.as_str(), "{event}");
        assert_eq!(event["data"]["deviceName"], "phone", "{event}");
    }
}

#[tokio::test]
async fn approvals_expire_at_their_deadline() {
    let mut s = setup(&["--approval-timeout-ms", "300"]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "approve:confirm").await;
    let events = events_until(&mut s.client, |e| e["type"] == "approval.settled").await;
    let requested = events
        .iter()
        .find(|e| e["type"] == "approval.requested")
        .unwrap();
    let settled = events.last().unwrap();
    assert_eq!(settled["data"]["outcome"], "expired");
    assert!(settled["at"].as_u64().unwrap() >= requested["data"]["deadline"].as_u64().unwrap());
    // The host settled it: no device is named; the turn's device is.
    assert!(settled["data"].get("deviceName").is_none(), "{settled}");
    let started = events.iter().find(|e| e["type"] == "turn.started").unwrap();
    assert_eq!(started["data"]["deviceName"], "laptop", "{started}");
    let late = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": requested["data"]["approvalId"], "decision": "allow"}),
        )
        .await;
    assert_eq!(late["error"]["code"], "APPROVAL_EXPIRED");
    let events = events_until(&mut s.client, is_turn_finished).await;
    let tool_end = events
        .iter()
        .find(|e| e["type"] == "agent.tool_execution_end")
        .unwrap();
    assert!(
        tool_end.to_string().contains("Blocked"),
        "the agent was told no: {tool_end}"
    );
}

/// An answer after the deadline is APPROVAL_EXPIRED even while the deadline's timer has not
/// fired yet (held here by a test hook, as on a busy runtime): the deadline rules, not the
/// timer, and the approval is settled once.
#[tokio::test]
async fn an_answer_past_the_deadline_is_expired_before_the_timer_fires() {
    let agent = tests::stand_in_agent();
    let hold = [("PI_HOST_TEST_EXPIRY_DELAY_MS", "60000")];
    let args = [
        "--agent",
        agent.to_str().unwrap(),
        "--approval-timeout-ms",
        "300",
    ];
    let host = HostProcess::start_with_env(bin(), &args, &hold).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let session_id = client.open_session(&host.workspace("w")).await;
    start_turn(&mut client, &session_id, "k", "approve:confirm").await;
    let events = events_until(&mut client, |e| e["type"] == "approval.requested").await;
    let requested = &events.last().unwrap()["data"];
    let deadline = requested["deadline"].as_u64().unwrap();
    // The deadline is the condition under test: wait for the clock to pass it.
    while racp_server::clock::now_ms() <= deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let late = client
        .call(
            "approval/respond",
            json!({"approvalId": requested["approvalId"], "decision": "allow"}),
        )
        .await;
    assert_eq!(late["error"]["code"], "APPROVAL_EXPIRED", "{late}");
    let events = events_until(&mut client, is_turn_finished).await;
    let settles: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "approval.settled")
        .collect();
    assert_eq!(settles.len(), 1, "{settles:?}");
    assert_eq!(settles[0]["data"]["outcome"], "expired");
}

#[tokio::test]
async fn no_event_is_seen_before_the_store_has_it() {
    let mut s = setup(&[]).await;
    let mut watcher = connect(&s).await;
    subscribe(&mut watcher, &s.session_id, Some(&s.start)).await;
    // A paced reply, so the store can be taken away in its middle.
    start_turn(&mut s.client, &s.session_id, "k", "deltas:400:10").await;
    let mut live = events_until(&mut watcher, is_text_delta).await;
    // Another writer takes the database's write lock, as a stuck disk would: each commit of the
    // host's writer now waits out SQLite's busy timeout, fails, and is tried again.
    let db = rusqlite::Connection::open(s.host.data_dir.path().join("pi-host.db")).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let committed: u64 = db
        .query_row(
            "SELECT max(last_seq) FROM event_chunks WHERE session_id = ?1",
            [&s.session_id],
            |row| row.get(0),
        )
        .unwrap();
    s.host
        .until_logged(
            "cannot commit events; retrying",
            tests::PATIENCE * 2,
            "the writer never met the refusing store",
        )
        .await;
    // The agent went on; what it said since is only in the writer's queue: no snapshot and no
    // subscriber has any of it.
    let mut probe = connect(&s).await;
    let got = probe
        .call("session/get", json!({"sessionId": s.session_id}))
        .await;
    assert_eq!(
        seq_of(&got["result"]["cursor"]),
        committed,
        "the head is not what the store holds: {got}"
    );
    let settle = tokio::time::timeout(std::time::Duration::from_millis(500), async {
        while let Some(frame) = watcher.next_frame().await {
            if let Some(events) = frame["params"]["events"].as_array() {
                live.extend(events.iter().cloned());
            }
        }
    })
    .await;
    assert!(settle.is_err(), "the watcher's connection ended");
    let beyond: Vec<_> = live
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap() > committed)
        .collect();
    assert!(
        beyond.is_empty(),
        "{} events were pushed before they were committed (store holds up to {committed})",
        beyond.len()
    );
    // Once the store takes writes again, every event arrives, in order, and stays.
    db.execute_batch("ROLLBACK").unwrap();
    live.extend(events_until(&mut watcher, is_turn_finished).await);
    assert_contiguous(&live, seq_of(&s.start) + 1);
    let start = s.start.clone();
    let (host, token, session_id) = s.restart().await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    subscribe(&mut client, &session_id, Some(&start)).await;
    let replayed = events_until(&mut client, is_turn_finished).await;
    assert_eq!(replayed, live, "what was seen live is what the store kept");
}

#[tokio::test]
async fn a_subscriber_that_drops_mid_stream_resumes_with_every_event_once() {
    let mut s = setup(&[]).await;
    let mut reader = connect(&s).await;
    subscribe(&mut reader, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "burst:10000").await;
    let mut seen = events_until(&mut reader, |e| e["seq"].as_u64().unwrap() >= 3000).await;
    drop(reader);
    let last_cursor = seen.last().unwrap()["cursor"].clone();
    let mut reader = connect(&s).await;
    let sub = subscribe(&mut reader, &s.session_id, Some(&last_cursor)).await;
    assert_eq!(sub["result"]["cursor"], last_cursor);
    seen.extend(events_until(&mut reader, is_turn_finished).await);
    assert_contiguous(&seen, 1);
    let deltas = seen.iter().filter(|e| is_text_delta(e)).count();
    assert_eq!(deltas, 10_000);
}

#[tokio::test]
async fn the_oldest_retained_cursor_resumes_and_the_one_before_it_is_expired() {
    let mut s = setup(&["--retain-events", "100"]).await;
    start_turn(&mut s.client, &s.session_id, "k1", "burst:500").await;
    let head = until_idle(&mut s).await;
    let head_seq = seq_of(&head);
    let expired = subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    assert_eq!(expired["error"]["code"], "CURSOR_EXPIRED", "{expired}");
    let oldest = expired["error"]["details"]["oldest"].clone();
    let oldest_seq = seq_of(&oldest);
    assert!(
        oldest_seq > 1 && oldest_seq < head_seq,
        "the window moved: oldest {oldest}"
    );
    // The cursor of the event just before the window: one event is missing after it.
    let epoch = oldest
        .as_str()
        .unwrap()
        .rsplit_once('-')
        .unwrap()
        .0
        .to_string();
    let one_past = json!(format!("{epoch}-{}", oldest_seq - 1));
    let refused = subscribe(&mut s.client, &s.session_id, Some(&one_past)).await;
    assert_eq!(refused["error"]["code"], "CURSOR_EXPIRED", "{refused}");
    assert_eq!(refused["error"]["details"]["reason"], "older_than_window");
    assert_eq!(refused["error"]["details"]["oldest"], oldest);
    // The oldest cursor itself resumes with the next event, and every retained one follows.
    let mut reader = connect(&s).await;
    let sub = subscribe(&mut reader, &s.session_id, Some(&oldest)).await;
    assert_eq!(sub["result"]["cursor"], oldest, "{sub}");
    let replayed = events_until(&mut reader, is_turn_finished).await;
    assert_contiguous(&replayed, oldest_seq + 1);
    assert_eq!(replayed.last().unwrap()["cursor"], head);
}

/// Waits until the session's turn is over (watching a live subscription started at the head, so
/// it never falls behind a small window) and returns the session's cursor then.
async fn until_idle(s: &mut Setup) -> Value {
    let mut watcher = connect(s).await;
    subscribe(&mut watcher, &s.session_id, None).await;
    loop {
        let got = s
            .client
            .call("session/get", json!({"sessionId": s.session_id}))
            .await;
        if got["result"]["snapshot"]["state"] == "idle" {
            return got["result"]["cursor"].clone();
        }
        watcher.next_frame().await;
    }
}

fn seq_of(cursor: &Value) -> u64 {
    cursor
        .as_str()
        .and_then(|c| c.rsplit('-').next())
        .and_then(|seq| seq.parse().ok())
        .unwrap_or_else(|| panic!("not a cursor: {cursor}"))
}

#[tokio::test]
async fn an_expired_cursor_recovers_through_a_snapshot_without_a_gap() {
    let mut s = setup(&["--retain-events", "100"]).await;
    start_turn(&mut s.client, &s.session_id, "k1", "burst:500").await;
    until_idle(&mut s).await;
    let expired = subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    assert_eq!(expired["error"]["code"], "CURSOR_EXPIRED");
    assert_eq!(expired["error"]["details"]["reason"], "older_than_window");
    let got = s
        .client
        .call("session/get", json!({"sessionId": s.session_id}))
        .await;
    let cursor = got["result"]["cursor"].clone();
    assert_eq!(expired["error"]["details"]["head"], cursor);
    let sub = subscribe(&mut s.client, &s.session_id, Some(&cursor)).await;
    assert!(sub.get("result").is_some(), "{sub}");
    start_turn(&mut s.client, &s.session_id, "k2", "deltas:3").await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    assert_contiguous(&events, seq_of(&cursor) + 1);
}

#[tokio::test]
async fn a_subscriber_that_reads_steadily_but_too_slowly_is_cut_at_the_lag_bound() {
    // The stall cut is a minute away, so only the lag bound can end this subscriber: it never
    // stops reading, it reads slower than the agent writes. The proxy's small buffers on the
    // host's side make the host's writes wait on that reader after a few MiB, not tens.
    let mut s = setup(&[
        "--plain",
        "--send-stall-ms",
        "60000",
        "--max-lag-events",
        "50",
    ])
    .await;
    let proxy = tests::FaultProxy::start_with_small_buffers(s.host.addr).await;
    proxy.delay(10);
    let mut slow = Client::connect(&proxy.url(), &s.token).await.unwrap();
    slow.hello().await;
    // At the head, so the subscription is caught up from its first delivery.
    let sub = subscribe(&mut slow, &s.session_id, Some(&s.start)).await;
    assert!(sub.get("result").is_some(), "{sub}");
    // About 14 MB of events, written by the agent as fast as it can.
    let started = start_turn(&mut s.client, &s.session_id, "k", "stream:40000").await;
    assert!(started.get("result").is_some(), "{started}");
    let mut last_error = None;
    let mut finished = false;
    let read = tokio::time::timeout(tests::PATIENCE * 4, async {
        while let Some(frame) = slow.next_frame().await {
            if frame.get("error").is_some() {
                last_error = Some(frame);
            } else if frame["method"] == "session/events"
                && frame["params"]["events"]
                    .as_array()
                    .is_some_and(|events| events.iter().any(is_turn_finished))
            {
                finished = true;
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the slow subscriber was neither cut nor done");
    assert!(
        !finished,
        "a subscriber thousands of events behind the head was served the whole turn"
    );
    let log = s.host.log();
    assert!(
        log.lines()
            .any(|l| l.contains("code=CLIENT_TOO_SLOW")
                && l.contains("fell too far behind the head")),
        "the host did not cut the subscriber for its lag"
    );
    // The final error reaches a reader that gets through its socket buffers in time.
    if let Some(error) = last_error {
        assert_eq!(error["error"]["code"], "CLIENT_TOO_SLOW", "{error}");
        assert!(
            error["error"]["details"]["lastCursor"].is_object(),
            "{error}"
        );
    }
}

#[tokio::test]
async fn a_slow_subscriber_is_cut_off_and_a_healthy_one_keeps_up() {
    // Plain: the healthy subscriber must read ~25 MB within a 300 ms stall bound, and this
    // test's TLS (a debug build of rustls) can be slower than that on a loaded machine. The
    // cut-off is the host's, whatever the transport.
    let mut s = setup(&[
        "--plain",
        "--send-stall-ms",
        "300",
        "--max-lag-events",
        "2000",
    ])
    .await;
    let mut slow = connect(&s).await;
    subscribe(&mut slow, &s.session_id, Some(&s.start)).await;
    let mut healthy = connect(&s).await;
    subscribe(&mut healthy, &s.session_id, Some(&s.start)).await;
    // Big events fill the slow client's socket buffers quickly.
    start_turn(&mut s.client, &s.session_id, "k", "big:60000 big:60000 big:60000 big:60000 big:60000 big:60000 big:60000 big:60000 big:60000 big:60000 burst:20000 big:60000 big:60000 big:60000 big:60000 big:60000 big:60000 big:60000 big:60000").await;
    let rss_before = s.host.rss_kib();
    let reading = tokio::spawn(async move {
        let events = events_until(&mut healthy, is_turn_finished).await;
        (healthy, events)
    });
    // Once the host has cut the slow one off, its final error waits in the socket for a
    // limited time (10 s): read it while the healthy one reads, not after (a loaded machine
    // may take longer than that to read ~25 MB).
    s.host
        .until_logged(
            "code=CLIENT_TOO_SLOW",
            tests::PATIENCE,
            "the slow client was not cut off",
        )
        .await;
    let draining = tokio::spawn(async move { slow.until_close().await });
    let (mut healthy, events) = reading.await.unwrap();
    assert_contiguous(&events, 1);
    // The stream is ~25 MB of events. The session log keeps it once, shared by both
    // subscribers, within the retention bound; the stalled one adds no buffer of its own.
    let growth_kib = s.host.rss_kib().saturating_sub(rss_before);
    assert!(growth_kib < 64 << 10, "host grew by {growth_kib} KiB");
    let (frames, close) = draining.await.unwrap();
    let error = frames
        .iter()
        .rev()
        .find(|f| f.get("error").is_some())
        .expect("a connection error");
    assert_eq!(error["error"]["code"], "CLIENT_TOO_SLOW");
    assert!(
        error["error"]["details"]["lastCursor"]
            .as_object()
            .unwrap()
            .len()
            == 1
    );
    assert_eq!(u16::from(close.expect("close frame").code), 4015);
    // The host is fine: the healthy client still works.
    let got = healthy
        .call("session/get", json!({"sessionId": s.session_id}))
        .await;
    assert!(got.get("result").is_some());
}

/// A client cut off while a large event was going out to it in fragments still reads a
/// well-formed stream and its CLIENT_TOO_SLOW: the host finishes the message it began before
/// the final error (racp-server's `socket.rs`, RFC 6455 §5.4). Every event here is many
/// fragments long, so the stall lands inside one.
#[tokio::test]
async fn a_client_cut_inside_a_fragmented_event_still_reads_its_error() {
    let mut s = setup(&[
        "--plain",
        "--send-stall-ms",
        "300",
        "--max-lag-events",
        "2000",
    ])
    .await;
    let mut slow = connect(&s).await;
    subscribe(&mut slow, &s.session_id, Some(&s.start)).await;
    let events = vec!["big:200000"; 60].join(" ");
    start_turn(&mut s.client, &s.session_id, "k", &events).await;
    s.host
        .until_logged(
            "code=CLIENT_TOO_SLOW",
            tests::PATIENCE,
            "the slow client was not cut off",
        )
        .await;
    let (frames, close) = slow.until_close().await;
    let error = frames
        .iter()
        .rev()
        .find(|f| f.get("error").is_some())
        .unwrap_or_else(|| panic!("no connection error in {} frames", frames.len()));
    assert_eq!(error["error"]["code"], "CLIENT_TOO_SLOW");
    assert_eq!(u16::from(close.expect("close frame").code), 4015);
}

#[tokio::test]
async fn kill_9_mid_stream_loses_nothing_a_client_saw() {
    let mut s = setup(&[]).await;
    let mut reader = connect(&s).await;
    subscribe(&mut reader, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "burst:20000").await;
    let mut seen = events_until(&mut reader, |e| e["seq"].as_u64().unwrap() >= 2000).await;
    let (host, token, session_id) = s.restart().await;
    // Keep reading what the first host sent before it died.
    while let Some(frame) = reader.next_frame().await {
        if frame["method"] == "session/events" {
            seen.extend(
                frame["params"]["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .cloned(),
            );
        }
    }
    assert_contiguous(&seen, 1);
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let last = seen.last().unwrap()["cursor"].clone();
    let sub = subscribe(&mut client, &session_id, Some(&last)).await;
    assert!(
        sub.get("result").is_some(),
        "every cursor a client saw is still valid: {sub}"
    );
    // The interrupted turn is ended by the restart; replay continues exactly after `last`.
    seen.extend(events_until(&mut client, is_turn_finished).await);
    assert_contiguous(&seen, 1);
    let finished = seen.last().unwrap();
    // The host, not the agent, cut the turn off (docs/protocol.md §8.7).
    assert_eq!(finished["data"]["outcome"], "aborted");
    assert_eq!(
        finished["data"]["error"]["code"], "HOST_UNAVAILABLE",
        "{finished}"
    );
}

#[tokio::test]
async fn sigterm_drains_cleanly_and_loses_nothing() {
    let mut s = setup(&[]).await;
    let mut reader = connect(&s).await;
    subscribe(&mut reader, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "deltas:3").await;
    let seen = events_until(&mut reader, is_turn_finished).await;
    assert!(s.host.terminate().await, "clean exit on SIGTERM");
    let (frames, close) = reader.until_close().await;
    let error = frames
        .iter()
        .rev()
        .find(|f| f.get("error").is_some())
        .expect("a connection error");
    assert_eq!(error["error"]["code"], "HOST_SHUTTING_DOWN");
    assert_eq!(u16::from(close.expect("close frame").code), 1001);
    let host = s.host.restart(&[]).await;
    let mut client = Client::connect(&host.url(), &s.token).await.unwrap();
    client.hello().await;
    // Nothing lost: after the last event seen comes only the restart's word that the
    // workspace was not watched meanwhile (docs/protocol.md §8.9).
    subscribe(
        &mut client,
        &s.session_id,
        seen.last().map(|e| &e["cursor"]),
    )
    .await;
    let after = client.events_to_head(&s.session_id, None).await;
    let kinds: Vec<(&Value, &Value)> = after
        .iter()
        .map(|e| (&e["type"], &e["data"]["reason"]))
        .collect();
    assert_eq!(
        kinds,
        [(&json!("workspace.changed"), &json!("host_restarted"))]
    );
}

#[tokio::test]
async fn closing_a_session_ends_the_agent_process_tree() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "spawn-child hang").await;
    let events = events_until(&mut s.client, |e| e["type"] == "agent.stand_in_child").await;
    let pid = events.last().unwrap()["data"]["pid"].as_u64().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let closed = s
        .client
        .call("session/close", json!({"sessionId": s.session_id}))
        .await;
    assert!(closed.get("result").is_some(), "{closed}");
    let events = events_until(&mut s.client, |e| e["type"] == "session.closed").await;
    let finished = events.iter().find(|e| is_turn_finished(e)).unwrap();
    assert_eq!(finished["data"]["outcome"], "aborted");
    let deadline = std::time::Instant::now() + tests::PATIENCE;
    while is_alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "child {pid} outlived its session"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A process that exited but was not reaped yet is a zombie: it counts as gone.
fn is_alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

#[tokio::test]
async fn the_agent_and_roots_can_come_from_a_config_file() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("w")).unwrap();
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "agent = {:?}\nroots = [{:?}]\n",
            tests::stand_in_agent().to_str().unwrap(),
            root.path().to_str().unwrap()
        ),
    )
    .unwrap();
    let host = HostProcess::start_with(bin(), &["--config", config.path().to_str().unwrap()]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    // The harness also passes --root (its own temp dir); a flag wins over the file, so the
    // file's root is refused and the flag's root accepted.
    let in_file_root = root.path().join("w");
    let reply = client
        .call(
            "session/create",
            json!({"workspace": in_file_root.to_str().unwrap()}),
        )
        .await;
    assert_eq!(reply["error"]["code"], "REMOTE_PATH_FORBIDDEN");
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["session"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    subscribe(
        &mut client,
        &session_id,
        Some(&created["result"]["session"]["cursor"]),
    )
    .await;
    start_turn(&mut client, &session_id, "k", "deltas:1").await;
    let events = events_until(&mut client, is_turn_finished).await;
    assert_eq!(
        events.last().unwrap()["data"]["outcome"],
        "completed",
        "agent from the file"
    );
}

#[tokio::test]
async fn an_answer_for_an_ended_turn_is_stale() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    let turn = start_turn(&mut s.client, &s.session_id, "k", "approve:confirm").await;
    let events = events_until(&mut s.client, |e| e["type"] == "approval.requested").await;
    let approval_id = events.last().unwrap()["data"]["approvalId"].clone();
    s.client
        .call(
            "turn/abort",
            json!({"sessionId": s.session_id, "turnId": turn["result"]["turnId"]}),
        )
        .await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    let settled = events
        .iter()
        .find(|e| e["type"] == "approval.settled")
        .unwrap();
    assert_eq!(settled["data"]["outcome"], "cancelled");
    let late = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "allow"}),
        )
        .await;
    assert_eq!(late["error"]["code"], "APPROVAL_STALE");
    let got = s
        .client
        .call("session/get", json!({"sessionId": s.session_id}))
        .await;
    assert_eq!(got["result"]["snapshot"]["pendingApprovals"], json!([]));
}

/// An abort cancels the turn's pending dialog before pi can end its run: the cancel's
/// `approval.settled` is in the log before the run's end and `turn.finished`, however late its
/// commit (held a second here by a test hook). An abort that told the agent first let the turn
/// finish ahead of the settle, and a client reading to the settle missed the turn's end.
#[tokio::test]
async fn an_aborts_cancelled_dialog_is_settled_before_the_turn_ends() {
    let agent = tests::stand_in_agent();
    let hold = [("PI_HOST_TEST_SETTLE_DELAY_MS", "1000")];
    let host =
        HostProcess::start_with_env(bin(), &["--agent", agent.to_str().unwrap()], &hold).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let session_id = client.open_session(&host.workspace("w")).await;
    let turn = start_turn(&mut client, &session_id, "k", "approve:confirm").await;
    events_until(&mut client, |e| e["type"] == "approval.requested").await;
    let aborted = client
        .call(
            "turn/abort",
            json!({"sessionId": session_id, "turnId": turn["result"]["turnId"]}),
        )
        .await;
    assert!(aborted.get("result").is_some(), "{aborted}");
    let events = events_until(&mut client, is_turn_finished).await;
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let settled = types.iter().position(|t| *t == "approval.settled");
    let run_end = types.iter().position(|t| *t == "agent.agent_end");
    assert!(settled.is_some(), "{types:?}");
    assert!(settled < run_end, "{types:?}");
    assert_eq!(events.last().unwrap()["data"]["outcome"], "aborted");
}

#[tokio::test]
async fn approvals_pending_at_a_crash_are_cancelled_and_answers_to_them_are_stale() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "approve:confirm").await;
    let seen = events_until(&mut s.client, |e| e["type"] == "approval.requested").await;
    let approval_id = seen.last().unwrap()["data"]["approvalId"].clone();
    let last = seen.last().unwrap()["cursor"].clone();
    let (host, token, session_id) = s.restart().await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let reply = client
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "allow"}),
        )
        .await;
    assert_eq!(reply["error"]["code"], "APPROVAL_STALE", "{reply}");
    subscribe(&mut client, &session_id, Some(&last)).await;
    let events = events_until(&mut client, is_turn_finished).await;
    let settled = events
        .iter()
        .find(|e| e["type"] == "approval.settled")
        .unwrap();
    assert_eq!(settled["data"]["outcome"], "cancelled");
    assert_eq!(
        events.last().unwrap()["data"]["error"]["code"],
        "HOST_UNAVAILABLE"
    );
    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert_eq!(got["result"]["snapshot"]["state"], "idle");
}

#[tokio::test]
async fn a_call_racing_sigterm_is_either_done_and_durable_or_refused() {
    let mut s = setup(&[]).await;
    let created_before = s.client.call("session/list", json!({})).await["result"]["sessions"]
        .as_array()
        .unwrap()
        .len();
    // Pipelined behind the signal: the host must answer it fully or refuse it, never half-do it.
    let pid = s.host.pid();
    let workspace = s.host.workspace("raced");
    tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .unwrap();
    let raced = s
        .client
        .try_send_text(
            json!({"id": 777, "method": "session/create", "params": {"workspace": workspace}})
                .to_string(),
        )
        .await;
    let mut answered = None;
    if raced.is_ok() {
        while let Some(frame) = s.client.next_frame().await {
            if frame["id"] == 777 {
                answered = Some(frame);
                break;
            }
            if frame.get("error").is_some() && frame.get("id").is_none() {
                assert_eq!(frame["error"]["code"], "HOST_SHUTTING_DOWN");
            }
        }
    }
    let created = match &answered {
        Some(reply) if reply.get("result").is_some() => true,
        Some(reply) => {
            assert_eq!(reply["error"]["code"], "HOST_SHUTTING_DOWN", "{reply}");
            false
        }
        None => false,
    };
    let host = s.host.restart(&[]).await;
    let mut client = Client::connect(&host.url(), &s.token).await.unwrap();
    client.hello().await;
    let after = client.call("session/list", json!({})).await["result"]["sessions"]
        .as_array()
        .unwrap()
        .len();
    if created {
        assert_eq!(
            after,
            created_before + 1,
            "an acknowledged create survives the drain"
        );
    } else {
        assert!(after <= created_before + 1);
    }
}

#[tokio::test]
async fn a_restarted_agent_resumes_its_own_session_files() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "a", "whoami").await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    let first = events
        .iter()
        .find(|e| e["type"] == "agent.stand_in_whoami")
        .unwrap()["data"]
        .clone();
    // Every start loads the host's extensions (docs/architecture.md, "Agent lifecycle").
    let extensions = s.host.data_dir.path().join("pi-extensions");
    let preload = extensions.join("pi-host-preload.ts");
    let settings = extensions.join("pi-host-settings.ts");
    let permissions = extensions.join("pi-host-permissions.ts");
    let (preload, settings) = (preload.to_str().unwrap(), settings.to_str().unwrap());
    let permissions = permissions.to_str().unwrap();
    assert_eq!(
        first["args"],
        json!([
            "--extension",
            preload,
            "--extension",
            settings,
            "--extension",
            permissions
        ]),
        "the first start resumes nothing"
    );
    let session_dir = first["sessionDir"].as_str().unwrap().to_string();
    assert!(session_dir.ends_with(&s.session_id), "{session_dir}");
    assert!(
        first["cwd"].as_str().unwrap().ends_with("/w"),
        "runs in the workspace"
    );

    start_turn(&mut s.client, &s.session_id, "b", "crash").await;
    events_until(&mut s.client, is_turn_finished).await;
    start_turn(&mut s.client, &s.session_id, "c", "whoami").await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    let again = events
        .iter()
        .find(|e| e["type"] == "agent.stand_in_whoami")
        .unwrap()["data"]
        .clone();
    assert_eq!(
        again["args"],
        json!([
            "--extension",
            preload,
            "--extension",
            settings,
            "--extension",
            permissions,
            "--continue"
        ])
    );
    assert_eq!(again["sessionDir"], session_dir.as_str());
}

#[tokio::test]
async fn a_drain_ends_every_agent_process_tree() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "spawn-child hang").await;
    let events = events_until(&mut s.client, |e| e["type"] == "agent.stand_in_child").await;
    let pid = events.last().unwrap()["data"]["pid"].as_u64().unwrap();
    assert!(is_alive(pid));
    assert!(s.host.terminate().await, "clean exit on SIGTERM");
    assert!(!is_alive(pid), "the agent's child outlived the host");
    // The aborted turn was recorded before the host exited.
    let host = s.host.restart(&[]).await;
    let mut client = Client::connect(&host.url(), &s.token).await.unwrap();
    client.hello().await;
    let got = client
        .call("session/get", json!({"sessionId": s.session_id}))
        .await;
    assert_eq!(got["result"]["snapshot"]["turns"][0]["state"], "aborted");
}

#[tokio::test]
async fn select_and_input_dialogs_take_values_and_notices_become_events() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(
        &mut s.client,
        &s.session_id,
        "k",
        "notify approve:select approve:input",
    )
    .await;
    let events = events_until(&mut s.client, |e| e["type"] == "approval.requested").await;
    let notice = events
        .iter()
        .find(|e| e["type"] == "agent.extension_ui_request")
        .expect("a notice event");
    assert_eq!(notice["data"]["method"], "notify");
    let select = &events.last().unwrap()["data"];
    assert_eq!(select["kind"], "select");
    let options = select["options"].as_array().unwrap().clone();
    let id = select["approvalId"].clone();
    let bad = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": id, "decision": {"value": "not-an-option"}}),
        )
        .await;
    assert_eq!(bad["error"]["code"], "INVALID_PARAMS");
    let allow = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": id, "decision": "allow"}),
        )
        .await;
    assert_eq!(
        allow["error"]["code"], "INVALID_PARAMS",
        "a select takes a value"
    );
    let picked = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": id, "decision": {"value": options[0]}}),
        )
        .await;
    assert_eq!(picked["result"]["approval"]["state"], "answered");
    assert_eq!(picked["result"]["approval"]["value"], options[0]);

    let events = events_until(&mut s.client, |e| e["type"] == "approval.requested").await;
    let input = &events.last().unwrap()["data"];
    assert_eq!(input["kind"], "input");
    let typed = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": input["approvalId"], "decision": {"value": "typed text"}}),
        )
        .await;
    assert_eq!(typed["result"]["approval"]["value"], "typed text");
    let events = events_until(&mut s.client, is_turn_finished).await;
    let ran = events
        .iter()
        .filter(|e| e["type"] == "agent.tool_execution_end")
        .map(|e| e.to_string())
        .collect::<Vec<_>>();
    assert!(ran.iter().any(|t| t.contains("typed text")), "{ran:?}");
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
}

#[tokio::test]
async fn a_run_whose_end_is_too_long_to_read_still_ends_the_turn() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    // Sixty 300 kB messages: each event stays under the frame bound, but pi's agent_end
    // repeats them all, past the 16 MiB line bound.
    let script = "big:300000 ".repeat(60);
    start_turn(&mut s.client, &s.session_id, "k", &script).await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    let dropped = events
        .iter()
        .find(|e| e["type"] == "agent.invalid_output")
        .expect("the over-long line is reported");
    assert!(dropped["data"]["bytes"].as_u64().unwrap() > 16 << 20);
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
}

/// A failed run ends the turn with the classified code (docs/protocol.md §8.7); one pi may
/// retry ends it only after pi stayed silent; an OOM death is AGENT_SIDECAR_OOM.
#[tokio::test]
async fn agent_failures_are_classified_and_an_oom_is_told_from_a_crash() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    let cases = [
        (
            "fail:401_Incorrect_API_key_provided:_sk-proj-abcdefghijklmnopqrstuv",
            "PROVIDER_UNAUTHORIZED",
            false,
        ),
        // pi may retry a 502: the turn waits for its decision, then ends.
        ("fail:502_Bad_Gateway", "PROVIDER_ERROR", true),
        ("fail:terminated", "STREAM_FAILED", true),
    ];
    for (i, (text, code, retriable)) in cases.iter().enumerate() {
        start_turn(&mut s.client, &s.session_id, &format!("f{i}"), text).await;
        let events = events_until(&mut s.client, is_turn_finished).await;
        let last = events.last().unwrap();
        assert_eq!(last["data"]["outcome"], "failed", "{last}");
        let error = &last["data"]["error"];
        assert_eq!(error["code"], *code, "{last}");
        assert_eq!(error["retriable"], *retriable, "{last}");
        assert_eq!(error["source"], "agent", "{last}");
        assert!(error["traceId"].is_string(), "{last}");
        assert!(
            !error.to_string().contains("abcdefghijklmnop"),
            "the key is redacted: {last}"
        );
    }
    start_turn(&mut s.client, &s.session_id, "oom", "deltas:1 oom").await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    let last = events.last().unwrap();
    assert_eq!(last["data"]["outcome"], "failed", "{last}");
    assert_eq!(last["data"]["error"]["code"], "AGENT_SIDECAR_OOM", "{last}");
    assert_eq!(last["data"]["error"]["retriable"], false);
    assert!(
        last["data"]["error"]["details"]["stderrTail"]
            .as_str()
            .unwrap()
            .contains("JavaScript heap out of memory"),
        "{last}"
    );
}

/// pi's automatic retries stay inside the turn (docs/protocol.md §8.7): a retry that succeeds
/// completes it; one pi gives up on fails it with `details.retryAttempt`.
#[tokio::test]
async fn pi_retries_stay_in_the_turn_and_a_give_up_counts_them() {
    let mut s = setup(&[]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    let started = start_turn(&mut s.client, &s.session_id, "r", "retry:2").await;
    let turn_id = started["result"]["turnId"].clone();
    let events = events_until(&mut s.client, is_turn_finished).await;
    let last = events.last().unwrap();
    assert_eq!(last["data"]["outcome"], "completed", "{last}");
    let agent_ends = events
        .iter()
        .filter(|e| e["type"] == "agent.agent_end")
        .count();
    assert_eq!(agent_ends, 3, "two failed runs and the retried one");
    assert!(
        events.iter().all(|e| e["turnId"] == turn_id),
        "every retry belongs to the turn"
    );
    start_turn(&mut s.client, &s.session_id, "g", "gaveup:3").await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    let last = events.last().unwrap();
    assert_eq!(last["data"]["outcome"], "failed", "{last}");
    let error = &last["data"]["error"];
    assert_eq!(error["code"], "PROVIDER_RATE_LIMITED", "{last}");
    assert_eq!(error["retriable"], true);
    assert_eq!(error["retryAfterMs"], 2000, "{last}");
    assert_eq!(error["details"]["retryAttempt"], 3, "{last}");
    assert_eq!(error["details"]["providerStatus"], 429, "{last}");
    let before = &events[events.len() - 2];
    assert_eq!(before["type"], "agent.auto_retry_end", "{before}");
}

#[tokio::test]
async fn a_heartbeat_names_the_cursor_of_the_last_event_delivered() {
    let mut s = setup(&["--heartbeat-ms", "200"]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "echo hi").await;
    let events = events_until(&mut s.client, is_turn_finished).await;
    let mut last = events.last().unwrap()["cursor"].clone();
    // Frames in arrival order: each heartbeat after the turn names the last event before it.
    let deadline = tokio::time::Instant::now() + tests::PATIENCE * 4;
    loop {
        let frame = tokio::time::timeout_at(deadline, s.client.next_frame())
            .await
            .expect("a heartbeat within the deadline")
            .expect("the host closed the connection");
        match frame["method"].as_str() {
            Some("session/events") => {
                last = frame["params"]["events"]
                    .as_array()
                    .unwrap()
                    .last()
                    .unwrap()["cursor"]
                    .clone();
            }
            Some("heartbeat") => {
                let subscriptions = frame["params"]["subscriptions"].as_array().unwrap();
                assert_eq!(subscriptions.len(), 1, "{frame}");
                assert_eq!(subscriptions[0]["cursor"], last, "{frame}");
                return;
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn an_answered_approval_stays_answered_past_its_deadline() {
    let mut s = setup(&["--approval-timeout-ms", "1500"]).await;
    subscribe(&mut s.client, &s.session_id, Some(&s.start)).await;
    start_turn(&mut s.client, &s.session_id, "k", "approve:confirm").await;
    let events = events_until(&mut s.client, |e| e["type"] == "approval.requested").await;
    let requested = &events.last().unwrap()["data"];
    let approval_id = requested["approvalId"].clone();
    let deadline = requested["deadline"].as_u64().expect("a deadline");
    let answered = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "allow"}),
        )
        .await;
    assert_eq!(
        answered["result"]["approval"]["state"], "allowed",
        "{answered}"
    );
    events_until(&mut s.client, is_turn_finished).await;

    // The deadline's timer fires after the answer: it must leave the answer as it was.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    while now() < deadline + 2000 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let again = s
        .client
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "deny"}),
        )
        .await;
    assert_eq!(again["error"]["code"], "APPROVAL_STALE", "{again}");
    assert_eq!(again["error"]["details"]["state"], "allowed", "{again}");
}

/// Eight connections answer one approval at once with mixed decisions: exactly one answer wins,
/// its reply names the answering device, the seven others are stale, one settle is published,
/// before the tool the answer allowed or blocked ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_eight_simultaneous_answers_exactly_one_wins_and_names_its_device() {
    const ANSWERS: usize = 8;
    let agent = tests::stand_in_agent();
    // The winner's `approval.settled` is held a second before its commit: an agent told the
    // answer before that commit would run the tool meanwhile, and its end would come first.
    let hold = [("PI_HOST_TEST_SETTLE_DELAY_MS", "1000")];
    let args = ["--agent", agent.to_str().unwrap()];
    let host = HostProcess::start_with_env(bin(), &args, &hold).await;
    let (device_id, token) = host.pair_device("laptop", &[]).await;
    let mut watcher = Client::connect(&host.url(), &token).await.unwrap();
    watcher.hello().await;
    let created = watcher
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = &created["result"]["session"];
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    let subscribed = watcher
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": session["cursor"]}),
        )
        .await;
    assert!(subscribed.get("result").is_some(), "{subscribed}");
    let started = watcher
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k", "text": "approve:confirm"}),
        )
        .await;
    assert!(started.get("result").is_some(), "{started}");
    let events = watcher
        .events_until(tests::PATIENCE * 4, |e| e["type"] == "approval.requested")
        .await;
    let approval_id = events.last().unwrap()["data"]["approvalId"].clone();

    let mut answerers = Vec::new();
    for _ in 0..ANSWERS {
        let mut client = Client::connect(&host.url(), &token).await.unwrap();
        client.hello().await;
        answerers.push(client);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(ANSWERS));
    let tasks: Vec<_> = answerers
        .into_iter()
        .enumerate()
        .map(|(i, mut client)| {
            let barrier = barrier.clone();
            let approval_id = approval_id.clone();
            let decision = if i % 2 == 0 { "allow" } else { "deny" };
            tokio::spawn(async move {
                barrier.wait().await;
                client
                    .call(
                        "approval/respond",
                        json!({"approvalId": approval_id, "decision": decision}),
                    )
                    .await
            })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    let winners: Vec<_> = replies
        .iter()
        .filter(|r| r.get("result").is_some())
        .collect();
    assert_eq!(winners.len(), 1, "{replies:?}");
    let stale = replies
        .iter()
        .filter(|r| r["error"]["code"] == "APPROVAL_STALE")
        .count();
    assert_eq!(stale, ANSWERS - 1, "{replies:?}");
    assert_eq!(
        winners[0]["result"]["approval"]["settledBy"],
        json!(device_id),
        "{}",
        winners[0]
    );

    let events = watcher
        .events_until(tests::PATIENCE * 4, |e| e["type"] == "turn.finished")
        .await;
    // The settle is committed before the agent hears the answer, so it comes before whatever
    // the answer let the agent do, and every settle there is arrives before `turn.finished`.
    let settled: Vec<usize> = (0..events.len())
        .filter(|i| events[*i]["type"] == "approval.settled")
        .collect();
    assert_eq!(settled.len(), 1, "{events:?}");
    let tool_end = events
        .iter()
        .position(|e| e["type"] == "agent.tool_execution_end")
        .unwrap();
    assert!(settled[0] < tool_end, "{events:?}");
}
