//! Attacks on the gateway's NATS links (docs/reliability.md, "The gateway's NATS links"): a
//! cleartext or mis-certified link, calls injected or replayed on a host's call subject, a
//! stolen host credential flooding JetStream or purging other hosts' records, and an enrolled
//! host id taken by another key. One NATS server per test.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use base64::Engine;
use futures_util::StreamExt;
use racp_proto::gateway::{
    CALL_AT_HEADER, CALL_ID_HEADER, CALL_KEY_HEADER, CALL_SIGNATURE_HEADER, call_signed_bytes,
};
use serde_json::{Value, json};
use std::time::Duration;
use tests::gateway::{Fleet, GatewayProcess, cli_status, until_online};
use tests::nats::{NatsCluster, NatsOptions, TestCa};
use tests::{Client, PATIENCE};

async fn connect(url: &str, token: &str) -> Client {
    let mut client = Client::connect(url, token).await.expect("connect");
    client.hello().await;
    client
}

/// Waits until `text()` holds `wanted` at least `count` times.
async fn until_logged(text: impl Fn() -> String, wanted: &str, count: usize) {
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    while text().matches(wanted).count() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never logged {count} × {wanted:?}:\n{}",
            text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `pi-gateway` one-shot command against `nats` (a gateway's data dir, no nkey auth).
async fn gateway_cli(
    dir: &std::path::Path,
    nats: &str,
    ca: Option<&std::path::Path>,
    args: &[&str],
) -> (Option<i32>, String, String) {
    let mut all = vec!["--nats-no-auth"];
    all.extend(args);
    tokio::time::timeout(PATIENCE * 2, cli_status(dir, nats, ca, 1, &all))
        .await
        .expect("pi-gateway did not finish")
}

#[tokio::test]
async fn the_nats_link_is_tls_unless_cleartext_is_named() {
    let cleartext = NatsOptions {
        tls: false,
        ..NatsOptions::default()
    };
    let nats = NatsCluster::start_with(1, &[], cleartext).await;
    let addr = nats.addr(0).to_string();
    let (dir, _) = GatewayProcess::prepare().await;
    // A bare address and tls:// want TLS, which this server does not offer: refused, saying so.
    for url in [addr.clone(), format!("tls://{addr}")] {
        let (code, out, err) = gateway_cli(dir.path(), &url, None, &["pair", "--json"]).await;
        assert_ne!(code, Some(0), "{url}: {out}");
        assert!(err.contains("does not offer TLS"), "{url}: {err}");
        assert!(err.contains(&format!("nats://{addr}")), "{url}: {err}");
        assert!(out.is_empty(), "{out}");
    }
    // Named nats://, it works, with a warning that the link is cleartext.
    let named = format!("nats://{addr}");
    let (code, out, err) = gateway_cli(dir.path(), &named, None, &["pair", "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"token\""), "{out}");
    assert!(err.contains("WARN") && err.contains("cleartext"), "{err}");

    // A host given a gateway needs the keys of the gateways it takes calls from.
    let output = tokio::process::Command::new(tests::pi_host_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--gateway", &addr])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{err}");
    assert!(
        err.contains("--gateway-trust") && err.contains("pi-gateway key"),
        "{err}"
    );
}

#[tokio::test]
async fn a_certificate_the_ca_does_not_sign_fails_with_a_clear_message() {
    let nats = NatsCluster::start(1, &[]).await;
    let url = nats.url(0);
    let (dir, gateway_key) = GatewayProcess::prepare().await;
    let other = TestCa::new();
    for ca in [Some(other.cert.as_path()), None] {
        let (code, _, err) = gateway_cli(dir.path(), &url, ca, &["pair", "--json"]).await;
        assert_ne!(code, Some(0), "{ca:?}");
        assert!(
            err.contains("failed the TLS check") && err.contains("--nats-ca"),
            "{ca:?}: {err}"
        );
    }
    let (code, _, err) = gateway_cli(dir.path(), &url, Some(nats.ca_path()), &["pair"]).await;
    assert_eq!(code, Some(0), "the right CA: {err}");

    // A host says so in its log, and serves its own clients meanwhile.
    let agent = tests::stand_in_agent();
    let other_ca = other.cert.to_str().unwrap();
    let host = tests::HostProcess::start_with(
        &tests::pi_host_binary(),
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--gateway",
            &url,
            "--gateway-ca",
            other_ca,
            "--gateway-trust",
            &gateway_key,
        ],
    )
    .await;
    until_logged(|| host.log(), "failed the TLS check", 1).await;
    assert!(host.log().contains("--gateway-ca"), "{}", host.log());
    let (_, token) = host.pair_device("local", &[]).await;
    connect(&host.url(), &token).await;
}

/// The signature headers of a routed call, as a gateway with `seed` makes them.
fn signed(
    seed: &str,
    host_id: &str,
    payload: &[u8],
    call_id: &str,
    at: u64,
) -> async_nats::HeaderMap {
    let pair = nkeys::KeyPair::from_seed(seed).unwrap();
    let subject = format!("racp.call.{host_id}");
    let signature = pair
        .sign(&call_signed_bytes(host_id, &subject, at, call_id, payload))
        .unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(CALL_KEY_HEADER, pair.public_key().as_str());
    headers.insert(
        CALL_SIGNATURE_HEADER,
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(signature)
            .as_str(),
    );
    headers.insert(CALL_AT_HEADER, at.to_string().as_str());
    headers.insert(CALL_ID_HEADER, call_id);
    headers
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A routed call's payload: `device` calling `method` with `roles`.
fn routed(roles: &[&str], hosts: Option<&[&str]>, method: &str, params: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "deviceId": "dev_intruder", "roles": roles, "hosts": hosts,
        "method": method, "params": params,
    }))
    .unwrap()
}

const REFUSED: &str = "refused a message on the call subject";

#[tokio::test]
async fn a_call_no_trusted_gateway_signed_is_not_run_and_a_replay_is_refused() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    // Someone who may publish on (and read) every call subject, as a party on a cleartext path
    // could: it is not a gateway.
    fleet.users.push(
        "{ user: \"intruder\", password: \"intruder-pw\", permissions: { publish: [\"racp.call.>\"], subscribe: [\"racp.call.>\", \"_INBOX.>\"] } }"
            .to_string(),
    );
    let users = fleet.users.clone();
    fleet.nats.set_users(&users).await;
    let gateway = fleet.gateway().await;
    let (host, host_id) = fleet.host(&[]).await;
    let (_, owner) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &owner).await;
    until_online(&mut root, &host_id).await;
    let intruder = fleet
        .nats
        .client_options(async_nats::ConnectOptions::with_user_and_password(
            "intruder".into(),
            "intruder-pw".into(),
        ))
        .connect(fleet.nats.urls())
        .await
        .unwrap();
    let subject = format!("racp.call.{host_id}");
    let mut tap = intruder.subscribe(subject.clone()).await.unwrap();
    intruder.flush().await.unwrap();

    // A real session, created through the gateway: the intruder sees its signed call.
    let mut desk = connect(&gateway.host_url(&host_id), &owner).await;
    let created = desk
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["session"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    let cursor = created["result"]["session"]["cursor"].clone();
    let captured = tokio::time::timeout(PATIENCE, tap.next())
        .await
        .expect("the gateway's call")
        .unwrap();

    // What the intruder sends, each with a reply inbox it reads.
    let inbox = intruder.new_inbox();
    let mut replies = intruder.subscribe(inbox.clone()).await.unwrap();
    let turn = routed(
        &["owner"],
        None,
        "turn/start",
        json!({"sessionId": session_id, "idempotencyKey": "x", "text": "echo injected"}),
    );
    let create = routed(
        &["owner"],
        None,
        "session/create",
        json!({"workspace": host.workspace("w")}),
    );
    // 1. Unsigned, roles `owner`.
    intruder
        .publish_with_reply(subject.clone(), inbox.clone(), turn.clone().into())
        .await
        .unwrap();
    until_logged(|| host.log(), "no Racp-Gateway-Key header", 1).await;
    // 2. The gateway's key named, the signature forged (a signature of other bytes).
    let gateway_seed = std::fs::read_to_string(gateway.data_dir.path().join("gateway.nk")).unwrap();
    let mut forged = signed(gateway_seed.trim(), &host_id, &create, "c-forged", now_ms());
    forged.insert(CALL_SIGNATURE_HEADER, "AAAA");
    intruder
        .publish_with_reply_and_headers(
            subject.clone(),
            inbox.clone(),
            forged,
            create.clone().into(),
        )
        .await
        .unwrap();
    until_logged(|| host.log(), "the signature does not verify", 1).await;
    // 3. Signed, by a key the host does not trust.
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    let by_stranger = signed(&stranger, &host_id, &turn, "c-stranger", now_ms());
    intruder
        .publish_with_reply_and_headers(
            subject.clone(),
            inbox.clone(),
            by_stranger,
            turn.clone().into(),
        )
        .await
        .unwrap();
    until_logged(|| host.log(), "which is not in --gateway-trust", 1).await;
    // 4. The gateway's own call, replayed as it was.
    intruder
        .publish_with_reply_and_headers(
            subject.clone(),
            inbox.clone(),
            captured.headers.clone().unwrap(),
            captured.payload.clone(),
        )
        .await
        .unwrap();
    until_logged(|| host.log(), "was seen already (a replay)", 1).await;
    // 5. A signature made long ago.
    let stale = signed(
        gateway_seed.trim(),
        &host_id,
        &create,
        "c-stale",
        now_ms() - 120_000,
    );
    intruder
        .publish_with_reply_and_headers(
            subject.clone(),
            inbox.clone(),
            stale,
            create.clone().into(),
        )
        .await
        .unwrap();
    until_logged(|| host.log(), "from this host's clock", 1).await;
    until_logged(|| host.log(), REFUSED, 5).await;
    intruder.flush().await.unwrap();
    let answered = tokio::time::timeout(Duration::from_millis(300), replies.next()).await;
    assert!(
        !matches!(answered, Ok(Some(_))),
        "a refused call was answered"
    );

    // None of it ran: one session, and its log has the turn the desk runs now and no other.
    let started = desk
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "real", "text": "echo real"}),
        )
        .await;
    assert!(started["result"]["turnId"].is_string(), "{started}");
    let (_, local) = host.pair_device("local", &[]).await;
    let mut direct = connect(&host.url(), &local).await;
    direct
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": cursor}),
        )
        .await;
    let events = direct
        .events_until(PATIENCE, |e| e["type"] == "turn.finished")
        .await;
    let turns = events
        .iter()
        .filter(|e| e["type"] == "turn.started")
        .count();
    assert_eq!(turns, 1, "{events:?}");
    assert!(
        !json!(events).to_string().contains("injected"),
        "{events:?}"
    );
    let listed = direct.call("session/list", json!({})).await;
    assert_eq!(
        listed["result"]["sessions"].as_array().unwrap().len(),
        1,
        "{listed}"
    );

    // A trusted key's call runs, within its grant only: the host checks the grant too.
    for (hosts, code) in [(Some(vec!["host_elsewhere"]), "FORBIDDEN"), (None, "")] {
        let call = routed(&["observer"], hosts.as_deref(), "session/list", json!({}));
        let headers = signed(
            gateway_seed.trim(),
            &host_id,
            &call,
            &format!("c-{code}"),
            now_ms(),
        );
        let reply = tokio::time::timeout(
            PATIENCE,
            intruder.send_request(
                subject.clone(),
                async_nats::Request::new()
                    .headers(headers)
                    .payload(call.into()),
            ),
        )
        .await
        .expect("a reply")
        .unwrap();
        let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
        if code.is_empty() {
            assert!(reply["result"]["sessions"].is_array(), "{reply}");
        } else {
            assert_eq!(reply["error"]["code"], code, "{reply}");
        }
    }
}

/// docs/reliability.md §4.17: a signed call captured before the host restarts is still a
/// replay after it (the call ids seen are kept in the host's store for the time window).
#[tokio::test]
async fn a_call_captured_before_a_restart_is_refused_after_it() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    fleet.users.push(
        "{ user: \"intruder\", password: \"intruder-pw\", permissions: { publish: [\"racp.call.>\"], subscribe: [\"racp.call.>\", \"_INBOX.>\"] } }"
            .to_string(),
    );
    let users = fleet.users.clone();
    fleet.nats.set_users(&users).await;
    let gateway = fleet.gateway().await;
    let host_args = fleet.host_args();
    let (host, host_id) = fleet.host(&[]).await;
    let (_, owner) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &owner).await;
    until_online(&mut root, &host_id).await;
    let intruder = fleet
        .nats
        .client_options(async_nats::ConnectOptions::with_user_and_password(
            "intruder".into(),
            "intruder-pw".into(),
        ))
        .connect(fleet.nats.urls())
        .await
        .unwrap();
    let subject = format!("racp.call.{host_id}");
    let mut tap = intruder.subscribe(subject.clone()).await.unwrap();
    intruder.flush().await.unwrap();
    let mut desk = connect(&gateway.host_url(&host_id), &owner).await;
    let created = desk
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    assert!(created["result"]["session"].is_object(), "{created}");
    let captured = tokio::time::timeout(PATIENCE, tap.next())
        .await
        .expect("the gateway's call")
        .unwrap();

    // The host restarts (its memory of call ids gone); the capture is replayed at once, well
    // within the 30 s a signature is good for.
    let args: Vec<&str> = host_args.iter().map(String::as_str).collect();
    let host = host.restart(&args).await;
    // Its call subscription is in place once it announced itself again.
    until_logged(|| host.log(), "announced to the gateway", 2).await;
    let inbox = intruder.new_inbox();
    let mut replies = intruder.subscribe(inbox.clone()).await.unwrap();
    intruder
        .publish_with_reply_and_headers(
            subject.clone(),
            inbox,
            captured.headers.clone().unwrap(),
            captured.payload.clone(),
        )
        .await
        .unwrap();
    until_logged(|| host.log(), "was seen already (a replay)", 1).await;
    intruder.flush().await.unwrap();
    let answered = tokio::time::timeout(Duration::from_millis(300), replies.next()).await;
    assert!(!matches!(answered, Ok(Some(_))), "the replay was answered");
    let (_, local) = host.pair_device("local", &[]).await;
    let mut direct = connect(&host.url(), &local).await;
    let listed = direct.call("session/list", json!({})).await;
    assert_eq!(
        listed["result"]["sessions"].as_array().unwrap().len(),
        1,
        "the replay made a session: {listed}"
    );
    // A new call of the gateway still runs.
    let again = desk
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    assert!(again["result"]["session"].is_object(), "{again}");
}

/// A client with the gateway's NATS credential (an unrestricted user), to read streams.
async fn as_gateway(fleet: &Fleet, gateway_dir: &std::path::Path) -> async_nats::Client {
    let seed = std::fs::read_to_string(gateway_dir.join("gateway.nk")).unwrap();
    fleet
        .nats
        .client_options(async_nats::ConnectOptions::with_nkey(
            seed.trim().to_string(),
        ))
        .connect(fleet.nats.urls())
        .await
        .unwrap()
}

/// A client with a host's own credential (stolen from its data directory).
async fn as_host(fleet: &Fleet, host_dir: &std::path::Path, host_id: &str) -> async_nats::Client {
    let seed = std::fs::read_to_string(host_dir.join("gateway.nk")).unwrap();
    fleet
        .nats
        .client_options(async_nats::ConnectOptions::with_nkey(
            seed.trim().to_string(),
        ))
        .custom_inbox_prefix(format!("_INBOX_{host_id}"))
        .connect(fleet.nats.urls())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_host_credential_fills_only_its_own_stream_and_a_revoke_still_holds() {
    const HOST_BYTES: i64 = 8 << 20;
    // The gateway's buckets reserve 96 MiB and host A's stream 8 MiB of a 120 MiB store; host B
    // takes what is left, and both hosts' credentials fill their streams: the store is full but
    // for the buckets' reserved space.
    let small = NatsOptions {
        max_file_store: "120MB".into(),
        ..NatsOptions::default()
    };
    let bytes = HOST_BYTES.to_string();
    let mut fleet = Fleet::new_with(
        1,
        1,
        2,
        3600,
        small,
        &["--max-bytes", &bytes, "--max-msg-size", "262144"],
    )
    .await;
    let gateway = fleet.gateway().await;
    let (a_dir, a_id) = fleet.hosts.remove(0);
    let (b_dir, b_id) = fleet.hosts.remove(0);
    let b_key = fleet.users[2].split('"').nth(1).unwrap().to_string();
    let (_, owner) = gateway.pair_device("owner", &[]).await;
    let (laptop, laptop_token) = gateway.pair_device("operator", &[]).await;
    let mut admin = connect(&gateway.url(), &owner).await;
    let mut on_laptop = connect(&gateway.url(), &laptop_token).await;

    // A host stream that would over-commit the server's store is refused; host B takes what is
    // left, the largest size (in 8 MiB steps) JetStream still reserves.
    let mut taken = 0i64;
    let mut refusal = String::new();
    for mib in (1..=15i64).rev().map(|n| n * 8) {
        let size = (mib << 20).to_string();
        let (ok, _, err) = gateway
            .cli(&["enroll", &b_id, &b_key, "--max-bytes", &size])
            .await;
        if ok {
            taken = mib << 20;
            break;
        }
        refusal = err;
    }
    assert!(taken > 0, "host B got no stream at all: {refusal}");
    // Never the buckets' reserved space.
    assert!(
        taken <= (120 - 96 - 8) << 20,
        "host B reserved {taken} bytes, some of the buckets' space"
    );
    assert!(
        refusal.to_lowercase().contains("insufficient"),
        "an over-committing stream was made: {refusal}"
    );

    // Host B's credential fills its stream; host A's writes three times its limit.
    let flood = |dir: std::path::PathBuf, id: String, total: i64| {
        let fleet = &fleet;
        async move {
            let thief = as_host(fleet, &dir, &id).await;
            let js = async_nats::jetstream::new(thief);
            let chunk = bytes::Bytes::from(vec![b'x'; 200 << 10]);
            let mut acks = Vec::new();
            for i in 0..(total / (200 << 10)) {
                let subject = format!("racp.ev.{id}.ses_flood{}", i % 7);
                acks.push(js.publish(subject, chunk.clone()).await.unwrap());
                if acks.len() == 32 {
                    for ack in acks.drain(..) {
                        let _ = ack.await;
                    }
                }
            }
            for ack in acks {
                let _ = ack.await;
            }
            js
        }
    };
    flood(b_dir.path().to_path_buf(), b_id.clone(), taken + taken / 4).await;
    let js = flood(a_dir.path().to_path_buf(), a_id.clone(), 3 * HOST_BYTES).await;
    // An event above the stream's largest is refused outright.
    let huge = js
        .publish(
            format!("racp.ev.{a_id}.ses_flood"),
            vec![b'x'; 300 << 10].into(),
        )
        .await
        .unwrap()
        .await;
    assert!(huge.is_err(), "an event above --max-msg-size was kept");
    let gateway_nats = as_gateway(&fleet, gateway.data_dir.path()).await;
    let info = async_nats::jetstream::new(gateway_nats)
        .get_stream(format!("RACP_EV_{a_id}"))
        .await
        .unwrap()
        .cached_info()
        .clone();
    assert!(
        info.state.bytes <= HOST_BYTES as u64 && info.state.bytes > (HOST_BYTES as u64) / 2,
        "the flooded stream holds {} bytes",
        info.state.bytes
    );
    assert_eq!(
        info.config.discard,
        async_nats::jetstream::stream::DiscardPolicy::Old
    );

    // The owner still revokes and pairs, and the revoked laptop is cut off.
    let revoked = admin
        .call("device/revoke", json!({"deviceId": laptop}))
        .await;
    assert!(revoked["result"].is_object(), "{revoked}");
    let (frames, _) = tokio::time::timeout(PATIENCE, on_laptop.until_close())
        .await
        .expect("the revoked laptop stayed connected");
    assert_eq!(
        frames.last().unwrap()["error"]["code"],
        "REMOTE_AUTH_FAILED",
        "{frames:?}"
    );
    let refused = Client::connect(&gateway.url(), &laptop_token)
        .await
        .err()
        .unwrap();
    assert_eq!(refused.status, 401);
    let minted = admin
        .call("pairing/create", json!({"roles": ["observer"]}))
        .await;
    assert!(minted["result"]["token"].is_string(), "{minted}");
}

#[tokio::test]
async fn a_host_credential_cannot_roll_up_or_purge_other_hosts_records() {
    let mut fleet = Fleet::new(1, 1, 3, 3600).await;
    let gateway = fleet.gateway().await;
    let (thief_dir, thief_id) = fleet.hosts.remove(0);
    let (_b, b_id) = fleet.host(&[]).await;
    // Host C is enrolled and offline: only its enrollment record stands for it.
    let (_, c_id) = fleet.hosts.remove(0);
    let (_, owner) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &owner).await;
    until_online(&mut root, &b_id).await;

    let thief = as_host(&fleet, thief_dir.path(), &thief_id).await;
    let js = async_nats::jetstream::new(thief.clone());
    let own = format!("$KV.racp_hosts.{thief_id}");
    let record = json!({
        "hostId": thief_id, "version": "1", "hostname": "x", "startedAt": 1,
        "sessions": 0, "at": 1, "online": true
    })
    .to_string();
    // Its own heartbeat is taken (the credential is a real one)...
    let plain = js
        .publish(own.clone(), record.clone().into())
        .await
        .unwrap()
        .await;
    assert!(plain.is_ok(), "{plain:?}");
    // ...but no rollup, of the bucket or of its own key, nor a purge marker.
    for (name, value) in [
        ("Nats-Rollup", "all"),
        ("Nats-Rollup", "sub"),
        ("KV-Operation", "PURGE"),
    ] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(name, value);
        if value == "PURGE" {
            headers.insert("Nats-Rollup", "sub");
        }
        let ack = js
            .publish_with_headers(own.clone(), headers, record.clone().into())
            .await
            .unwrap()
            .await;
        assert!(ack.is_err(), "{name}: {value} was taken");
    }
    // The stream's purge API is not its to call: the server drops the request (no answer).
    let purge = tokio::time::timeout(
        Duration::from_secs(1),
        thief.request("$JS.API.STREAM.PURGE.KV_racp_hosts", "{}".into()),
    )
    .await;
    assert!(!matches!(purge, Ok(Ok(_))), "{purge:?}");

    // Every other host is still listed, the online one online.
    let listed = root.call("host/list", json!({})).await;
    let hosts = listed["result"]["hosts"].as_array().unwrap();
    for id in [&b_id, &c_id, &thief_id] {
        assert!(
            hosts.iter().any(|h| h["host"]["id"] == **id),
            "{id}: {listed}"
        );
    }
    until_online(&mut root, &b_id).await;
    let mut desk = connect(&gateway.host_url(&b_id), &owner).await;
    let sessions = desk.call("session/list", json!({})).await;
    assert!(sessions["result"]["sessions"].is_array(), "{sessions}");
}

#[tokio::test]
async fn an_enrolled_host_id_is_refused_to_another_key_unless_replaced() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet.gateway().await;
    let (host_dir, host_id) = fleet.hosts.remove(0);
    let old_user = fleet.users[1].clone();
    let old_key = old_user
        .split('"')
        .nth(1)
        .expect("the user's nkey")
        .to_string();
    // Another key (made by another host's data directory).
    let (new_dir, _, new_key) = tests::gateway::prepare_host(&tests::pi_host_binary()).await;

    let (code, out, err) = gateway.cli_status(&["enroll", &host_id, &new_key]).await;
    assert_eq!(code, Some(64), "{out}{err}");
    assert!(
        err.contains("enrolled already") && err.contains(&old_key) && err.contains("--replace"),
        "{err}"
    );
    assert!(out.is_empty(), "a user entry was printed: {out}");
    // The same key again: nothing changes.
    let (ok, out, err) = gateway.cli(&["enroll", &host_id, &old_key]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), old_user);

    // With --replace the id moves to the new key; the server's users follow.
    let (ok, out, err) = gateway
        .cli(&["enroll", &host_id, &new_key, "--replace"])
        .await;
    assert!(ok, "{err}");
    let new_user = out.trim().to_string();
    assert!(new_user.contains(&new_key), "{new_user}");
    assert!(
        err.contains(&old_key) && err.contains("replace the entry"),
        "{err}"
    );
    let users: Vec<String> = fleet
        .users
        .iter()
        .map(|u| {
            if *u == old_user {
                new_user.clone()
            } else {
                u.clone()
            }
        })
        .collect();
    fleet.nats.set_users(&users).await;
    let old = tokio::time::timeout(
        PATIENCE,
        fleet
            .nats
            .client_options(async_nats::ConnectOptions::with_nkey(
                std::fs::read_to_string(host_dir.path().join("gateway.nk"))
                    .unwrap()
                    .trim()
                    .to_string(),
            ))
            .connect(fleet.nats.urls()),
    )
    .await
    .expect("connect answered");
    assert!(old.is_err(), "the replaced key still connects");
    let new = as_host(&fleet, new_dir.path(), &host_id).await;
    let calls = new.subscribe(format!("racp.call.{host_id}")).await;
    assert!(calls.is_ok());
    new.flush().await.unwrap();
    // Another replace back is refused without --replace again.
    let (code, _, _) = gateway.cli_status(&["enroll", &host_id, &old_key]).await;
    assert_eq!(code, Some(64));
}
