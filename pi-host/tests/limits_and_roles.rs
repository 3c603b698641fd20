//! The role matrix, rate limits and pairing-token expiry against a real host.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::{Access, Method, Role};
use serde_json::json;
use std::path::Path;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn every_method_against_every_role_is_forbidden_exactly_where_the_registry_says() {
    let host = HostProcess::start_with(bin(), &["--agent", "/nonexistent/agent"]).await;
    // The first device is the owner; then one device per role.
    let mut clients = Vec::new();
    for role in [Role::Owner, Role::Operator, Role::Observer] {
        let (_, token) = host
            .pair_device(role.as_str(), &["--roles", role.as_str()])
            .await;
        let mut client = Client::connect(&host.url(), &token).await.unwrap();
        client.hello().await;
        clients.push((role, client));
    }
    for (role, client) in clients.iter_mut() {
        for method in Method::ALL {
            if *method == Method::Hello {
                continue;
            }
            let reply = client.call(method.as_str(), json!({})).await;
            let forbidden = reply["error"]["code"] == "FORBIDDEN";
            let expected = match method.spec().access {
                Access::Any => false,
                Access::Pairing => true,
                Access::Role(required) => *role < required,
            };
            assert_eq!(
                forbidden,
                expected,
                "{} as {}: {reply}",
                method.as_str(),
                role.as_str()
            );
        }
    }
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
