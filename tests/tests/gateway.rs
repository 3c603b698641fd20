//! The gateway (docs/architecture.md, "Gateway"; docs/protocol.md §11) against a real NATS with
//! JetStream (Debian's `nats-server`: one node, or three on loopback for the fault tests), real
//! `pi-host` processes dialing out with the stand-in agent, and real `pi-gateway` replicas.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::time::Duration;
use tests::gateway::Fleet;
use tests::{Client, PATIENCE};

fn finished(e: &Value) -> bool {
    e["type"] == "turn.finished"
}

/// Waits until `host/list` on the gateway shows `host_id` with `status`.
async fn until_status(client: &mut Client, host_id: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    loop {
        let listed = client.call("host/list", json!({})).await;
        let hosts = listed["result"]["hosts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(host) = hosts
            .iter()
            .find(|h| h["host"]["id"] == host_id && h["status"] == status)
        {
            return host.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{host_id} never became {status}: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn connect(url: &str, token: &str) -> Client {
    let mut client = Client::connect(url, token).await.expect("connect");
    let hello = client.hello().await;
    assert_eq!(hello["protocol"], 1, "{hello}");
    client
}

#[tokio::test]
async fn a_session_is_driven_end_to_end_through_the_gateway() {
    if !tests::nats::available() {
        panic!("nats-server is not installed: scripts/test installs it");
    }
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet.gateway().await;
    let (host, host_id) = fleet.host(&[]).await;
    let (_device, token) = gateway.pair_device("owner", &[]).await;

    let mut root = connect(&gateway.url(), &token).await;
    let listed = until_status(&mut root, &host_id, "online").await;
    assert_eq!(listed["host"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(listed["path"], format!("/racp/hosts/{host_id}"));
    // A host-scoped call on the gateway's own endpoint says where to go.
    let nowhere = root.call("session/list", json!({})).await;
    assert_eq!(nowhere["error"]["code"], "INVALID_ARGUMENT", "{nowhere}");
    assert_eq!(nowhere["error"]["details"]["reason"], "no_host_selected");

    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    let created = desk
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["session"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    let subscribed = desk
        .call("session/subscribe", json!({"sessionId": session_id}))
        .await;
    assert!(
        subscribed["result"]["subscriptionId"].is_string(),
        "{subscribed}"
    );
    let started = desk
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "echo hello there"}),
        )
        .await;
    assert!(started["result"]["turnId"].is_string(), "{started}");
    let through_gateway = desk.events_until(PATIENCE, finished).await;
    assert_eq!(
        through_gateway.last().unwrap()["data"]["outcome"],
        "completed"
    );

    // The same events, byte for byte, as a device of the host itself sees them from seq 0.
    let (_, host_token) = host.pair_device("direct", &[]).await;
    let mut direct = connect(&host.url(), &host_token).await;
    let cursor = created["result"]["session"]["cursor"].clone();
    direct
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": cursor}),
        )
        .await;
    let direct_events = direct.events_until(PATIENCE, finished).await;
    let seqs = |events: &[Value]| {
        events
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    let tail = &direct_events[direct_events.len() - through_gateway.len()..];
    assert_eq!(seqs(tail), seqs(&through_gateway));
    assert_eq!(tail, &through_gateway[..]);

    // Replay by cursor through the gateway, served from JetStream.
    let mut again = connect(&gateway.host_url(&host_id), &token).await;
    again
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": cursor}),
        )
        .await;
    let replayed = again.events_until(PATIENCE, finished).await;
    assert_eq!(replayed, direct_events);

    // host/list is the gateway's: a plain host still has none.
    let plain = direct.call("host/list", json!({})).await;
    assert_eq!(plain["error"]["code"], "METHOD_NOT_FOUND");
}

/// Stand-in for a stolen host credential: host A's own nkey, used to reach host B.
async fn as_host(
    seed_dir: &std::path::Path,
    host_id: &str,
    urls: &str,
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let seed = std::fs::read_to_string(seed_dir.join("gateway.nk")).unwrap();
    let (errors_tx, errors) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_nkey(seed.trim().to_string())
        .custom_inbox_prefix(format!("_INBOX_{host_id}"))
        .event_callback(move |event| {
            let errors_tx = errors_tx.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    let _ = errors_tx.send(error.to_string());
                }
            }
        })
        .connect(urls)
        .await
        .unwrap();
    (client, errors)
}

/// Waits for the server's permission violation naming `subject`.
async fn violation(errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>, subject: &str) {
    let wanted = format!("\"{subject}\"");
    let seen = tokio::time::timeout(PATIENCE, async {
        while let Some(error) = errors.recv().await {
            if error.to_lowercase().contains("permissions violation") && error.contains(&wanted) {
                return;
            }
        }
    })
    .await;
    assert!(seen.is_ok(), "no permissions violation for {subject}");
}

#[tokio::test]
async fn a_host_credential_is_confined_to_its_own_subjects() {
    let mut fleet = Fleet::new(1, 1, 2, 3600).await;
    let gateway = fleet.gateway().await;
    // Host A's credential is the stolen one; host B is the target.
    let (a_dir, a_id) = fleet.hosts.remove(0);
    let (b_host, b_id) = fleet.host(&[]).await;
    let urls = fleet.nats.urls();
    let (thief, mut errors) = as_host(a_dir.path(), &a_id, &urls).await;

    // Its own subjects work: the credential is a real one.
    let own = thief.subscribe(format!("racp.call.{a_id}")).await.unwrap();
    let js = async_nats::jetstream::new(thief.clone());
    let ack = js
        .publish(format!("racp.ev.{a_id}.ses_own"), "{}".into())
        .await
        .unwrap()
        .await;
    assert!(ack.is_ok(), "a host cannot publish its own events: {ack:?}");

    // Reading another host's events, calls or inbox is refused by the server...
    let mut taps = Vec::new();
    for subject in [
        format!("racp.ev.{b_id}.>"),
        format!("racp.call.{b_id}"),
        format!("_INBOX_{b_id}.>"),
        "racp.>".to_string(),
        ">".to_string(),
    ] {
        taps.push(thief.subscribe(subject.clone()).await.unwrap());
        violation(&mut errors, &subject).await;
    }
    // ...and so is acting as it: answering its calls, writing its heartbeat or events,
    // reading its stream through the JetStream API.
    for subject in [
        format!("racp.call.{b_id}"),
        format!("$KV.racp_hosts.{b_id}"),
        format!("racp.ev.{b_id}.ses_forged"),
        format!("$JS.API.DIRECT.GET.RACP_EV_{b_id}"),
        format!("$JS.API.STREAM.INFO.RACP_EV_{b_id}"),
        format!("$JS.API.CONSUMER.CREATE.RACP_EV_{b_id}"),
    ] {
        thief.publish(subject.clone(), "{}".into()).await.unwrap();
        violation(&mut errors, &subject).await;
    }

    // Host B works meanwhile, and none of its traffic reaches the thief.
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    until_status(&mut root, &b_id, "online").await;
    let mut desk = connect(&gateway.host_url(&b_id), &token).await;
    let created = desk
        .call(
            "session/create",
            json!({"workspace": b_host.workspace("w")}),
        )
        .await;
    let session_id = created["result"]["session"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    desk.call("session/subscribe", json!({"sessionId": session_id}))
        .await;
    desk.call(
        "turn/start",
        json!({"sessionId": session_id, "idempotencyKey": "k", "text": "echo secret"}),
    )
    .await;
    desk.events_until(PATIENCE, finished).await;
    thief.flush().await.unwrap();
    use futures_util::StreamExt;
    for mut tap in taps {
        let got = tokio::time::timeout(Duration::from_millis(200), tap.next()).await;
        assert!(
            !matches!(got, Ok(Some(_))),
            "a stolen host credential received another host's traffic"
        );
    }
    drop(own);
}
