//! Codes that no other test reached on the wire, each provoked over a real connection the way a
//! client meets it (docs/reliability.md §2.4). HOST_OVERLOADED is in hostile_input.rs (the
//! in-flight bound), IDEMPOTENCY_CONFLICT in turns.rs.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::ErrorCode;
use racp_proto::client::RacpClient;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tests::{Client, FaultProxy, HostProcess, PATIENCE};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

async fn host() -> HostProcess {
    let agent = tests::stand_in_agent();
    HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await
}

async fn owner(host: &HostProcess) -> (Client, String) {
    let (_, token) = host.pair_device("owner", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    (client, token)
}

async fn session(client: &mut Client, host: &HostProcess) -> Value {
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let id = created["result"]["session"]["sessionId"].clone();
    assert!(id.is_string(), "{created}");
    id
}

/// The error of a reply, checked against its registry row: code, recovery, and `retriable`
/// where the row fixes it.
fn error_of(reply: &Value, code: ErrorCode) -> &Value {
    let error = &reply["error"];
    assert_eq!(error["code"], code.as_str(), "{reply}");
    let spec = code.spec();
    assert_eq!(error["recovery"], spec.recovery.as_str(), "{reply}");
    match spec.retriable {
        racp_proto::Retriable::Yes => assert_eq!(error["retriable"], true, "{reply}"),
        racp_proto::Retriable::No => assert_eq!(error["retriable"], false, "{reply}"),
        racp_proto::Retriable::Maybe => assert!(error["retriable"].is_boolean(), "{reply}"),
    }
    assert_eq!(error["source"], "host", "{reply}");
    error
}

/// CONFLICT: a turn for a closed session (docs/protocol.md §7.15).
#[tokio::test]
async fn a_turn_for_a_closed_session_is_conflict() {
    let host = host().await;
    let (mut client, _) = owner(&host).await;
    let session_id = session(&mut client, &host).await;
    let closed = client
        .call("session/close", json!({"sessionId": session_id}))
        .await;
    assert!(closed.get("result").is_some(), "{closed}");
    let reply = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k", "text": "hi"}),
        )
        .await;
    let error = error_of(&reply, ErrorCode::Conflict);
    assert_eq!(
        error["retriable"], false,
        "a closed session stays closed: {reply}"
    );
}

/// LIMIT_EXCEEDED: one subscription past `limits.maxSubscriptions` on a connection; the
/// connection stays open (docs/protocol.md §11).
#[tokio::test]
async fn a_subscription_past_the_bound_is_limit_exceeded() {
    let host = host().await;
    let (_, token) = host.pair_device("owner", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    let hello = client.hello().await;
    let max = hello["limits"]["maxSubscriptions"].as_u64().unwrap();
    let session_id = session(&mut client, &host).await;
    for _ in 0..max {
        let sub = client
            .call("session/subscribe", json!({"sessionId": session_id}))
            .await;
        assert!(sub.get("result").is_some(), "{sub}");
    }
    let reply = client
        .call("session/subscribe", json!({"sessionId": session_id}))
        .await;
    let error = error_of(&reply, ErrorCode::LimitExceeded);
    assert_eq!(error["details"]["maxSubscriptions"], max, "{reply}");
    let info = client.call("host/info", json!({})).await;
    assert!(
        info.get("result").is_some(),
        "the connection stays open: {info}"
    );
}

/// NOT_FOUND: an answer to an approval the host never had (docs/protocol.md §7.18).
#[tokio::test]
async fn an_answer_to_an_unknown_approval_is_not_found() {
    let host = host().await;
    let (mut client, _) = owner(&host).await;
    let reply = client
        .call(
            "approval/respond",
            json!({"approvalId": "apr_never", "decision": "allow"}),
        )
        .await;
    let error = error_of(&reply, ErrorCode::NotFound);
    assert_eq!(error["details"]["approvalId"], "apr_never", "{reply}");
}

/// INTERNAL: the store refuses a write after start (here a trigger another process put into the
/// database; on a real host, a full disk or a damaged file). The reply carries a `traceId` the
/// host's log has next to the cause, and the host keeps serving.
#[tokio::test]
async fn a_store_failure_after_start_is_internal_with_a_trace_id_in_the_log() {
    let host = host().await;
    let (mut client, _) = owner(&host).await;
    let db = rusqlite::Connection::open(host.data_dir.path().join("pi-host.db")).unwrap();
    db.busy_timeout(PATIENCE).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_sessions BEFORE INSERT ON sessions \
         BEGIN SELECT RAISE(ABORT, 'injected store failure'); END;",
    )
    .unwrap();
    let reply = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let error = error_of(&reply, ErrorCode::Internal);
    let trace_id = error["traceId"].as_str().expect("a traceId");
    assert!(
        !error["message"].as_str().unwrap().contains("injected"),
        "the cause stays in the log: {reply}"
    );
    let deadline = Instant::now() + PATIENCE;
    while !host
        .log()
        .lines()
        .any(|l| l.contains(trace_id) && l.contains("injected store failure"))
    {
        assert!(Instant::now() < deadline, "no log line with {trace_id}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.execute_batch("DROP TRIGGER refuse_sessions").unwrap();
    let again = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    assert!(again.get("result").is_some(), "{again}");
}

/// TIMEOUT is the client's: a call whose reply does not come within `call_timeout` (here the
/// link is stalled, well inside the two heartbeat intervals that would declare it lost).
#[tokio::test]
async fn a_call_the_host_does_not_answer_in_time_is_timeout_in_the_client() {
    let host = host().await;
    let (_, token) = host.pair_device("owner", &[]).await;
    let proxy = FaultProxy::start(host.addr).await;
    let mut options = tests::client_options(proxy.url(), &token);
    options.call_timeout = Duration::from_millis(500);
    let client = RacpClient::connect(options).await.unwrap();
    client
        .call::<racp_proto::calls::HostInfo>(racp_proto::Empty {})
        .await
        .unwrap();
    proxy.stall(true);
    let started = Instant::now();
    let err = client
        .call::<racp_proto::calls::HostInfo>(racp_proto::Empty {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
    assert!(started.elapsed() >= Duration::from_millis(500));
    let json = serde_json::to_value(&err).unwrap();
    assert_eq!(json["code"], "TIMEOUT", "{json}");
    assert_eq!(json["retriable"], true, "{json}");
    assert_eq!(json["recovery"], "retry", "{json}");
    assert_eq!(json["source"], "client", "{json}");
    // Once the link moves again, the next call is answered.
    proxy.stall(false);
    client
        .call::<racp_proto::calls::HostInfo>(racp_proto::Empty {})
        .await
        .unwrap();
}
