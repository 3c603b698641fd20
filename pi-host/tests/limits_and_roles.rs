//! The role matrix, rate limits and pairing-token expiry against a real host.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::Role;
use serde_json::json;
use std::path::Path;
use tests::{Client, HostProcess, roles};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn every_method_against_every_role_is_forbidden_exactly_where_the_protocol_says() {
    roles::assert_every_method_listed();
    let host = HostProcess::start_with(bin(), &["--agent", "/nonexistent/agent"]).await;
    // The first device is the owner; then one device per role.
    for role in [Role::Owner, Role::Operator, Role::Observer] {
        let (_, token) = host
            .pair_device(role.as_str(), &["--roles", role.as_str()])
            .await;
        let mut client = Client::connect(&host.url(), &token).await.unwrap();
        client.hello().await;
        roles::assert_forbidden_below_the_lowest_role(&mut client, role).await;
    }

    // A pairing connection may only pair, and pairing is not refused for want of a role.
    let token = host.pairing_token(&["--roles", "observer"]).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut pairing = Client::connect(&host.url(), &token).await.unwrap();
    pairing.hello().await;
    roles::assert_a_pairing_connection_only_pairs(&mut pairing).await;
    let paired = pairing.call("pair", json!({"deviceName": "late"})).await;
    assert_eq!(paired["result"]["roles"], json!(["observer"]), "{paired}");
}

#[tokio::test]
async fn a_flood_is_rate_limited_and_the_host_stays_up() {
    let host = HostProcess::start_with(
        bin(),
        &["--requests-per-second", "5", "--request-burst", "10"],
    )
    .await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    for id in 1000..1060 {
        client
            .send_text(json!({"id": id, "method": "session/list"}).to_string())
            .await;
    }
    let mut limited = 0;
    let mut ok = 0;
    let mut retry_after = 0;
    while limited + ok < 60 {
        let frame = client.next_frame().await.unwrap();
        if frame.get("id").is_none() {
            continue;
        }
        if frame["error"]["code"] == "RATE_LIMITED" {
            limited += 1;
            retry_after = frame["error"]["retryAfterMs"].as_u64().unwrap();
            assert_eq!(frame["error"]["retriable"], true);
        } else {
            assert!(frame.get("result").is_some(), "{frame}");
            ok += 1;
        }
    }
    assert!(ok >= 10 && limited > 0, "ok {ok}, limited {limited}");
    tokio::time::sleep(std::time::Duration::from_millis(retry_after + 250)).await;
    let reply = client.call("session/list", json!({})).await;
    assert!(reply.get("result").is_some(), "the budget refills: {reply}");
}

#[tokio::test]
async fn an_expired_pairing_token_is_refused_as_expired() {
    let host = HostProcess::start(bin()).await;
    let minted = host.pairing_token(&["--ttl", "10s"]).await;
    let expires_at = minted["expiresAt"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(expires_at > now && expires_at <= now + 11_000);
    // Waiting for the clock is the point of this test.
    tokio::time::sleep(std::time::Duration::from_millis(expires_at - now + 100)).await;
    let refused = Client::connect(&host.url(), minted["token"].as_str().unwrap())
        .await
        .err()
        .expect("expired token refused");
    assert_eq!(refused.status, 401);
    assert_eq!(refused.body["error"]["code"], "PAIRING_TOKEN_EXPIRED");
}

#[tokio::test]
async fn a_client_bounds_the_events_in_one_push_at_hello() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    let hello = client
        .call(
            "hello",
            json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "t", "version": "0"},
                   "maxEventsPerPush": 7}),
        )
        .await;
    assert_eq!(hello["result"]["limits"]["maxEventsPerPush"], 7, "{hello}");
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = &created["result"]["session"];
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session["sessionId"], "cursor": session["cursor"]}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session["sessionId"], "idempotencyKey": "k", "text": "burst:300"}),
        )
        .await;
    assert!(started.get("result").is_some(), "{started}");
    let (mut events, mut pushes, mut largest) = (0, 0, 0);
    loop {
        let frame = client.next_frame().await.expect("connection open");
        if frame["method"] != "session/events" {
            continue;
        }
        let batch = frame["params"]["events"].as_array().unwrap();
        pushes += 1;
        events += batch.len();
        largest = largest.max(batch.len());
        if batch.iter().any(|e| e["type"] == "turn.finished") {
            break;
        }
    }
    assert!(events > 300, "{events} events");
    assert!(largest <= 7, "a push of {largest} events");
    assert!(pushes >= events / 7, "{pushes} pushes");
    // Zero is not a bound.
    let mut other = Client::connect(&host.url(), &token).await.unwrap();
    let refused = other
        .call(
            "hello",
            json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "t", "version": "0"},
                   "maxEventsPerPush": 0}),
        )
        .await;
    assert_eq!(refused["error"]["code"], "INVALID_PARAMS", "{refused}");
}
