//! The reconnecting RACP client (racp-proto, feature `client`) against a real host, through a
//! fault proxy that cuts and stalls the link.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::client::{ClientOptions, ClientState, RacpClient, Subscription, SubscriptionItem};
use racp_proto::methods::session::{SessionCreateParams, SessionSubscribeParams};
use racp_proto::methods::turn::TurnStartParams;
use racp_proto::{Empty, ErrorCode, calls};
use std::path::Path;
use std::time::Duration;
use tests::{FaultProxy, HostProcess, PATIENCE};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

async fn host(extra: &[&str]) -> HostProcess {
    let agent = tests::stand_in_agent();
    let mut args = vec!["--agent", agent.to_str().unwrap(), "--heartbeat-ms", "200"];
    args.extend_from_slice(extra);
    HostProcess::start_with(bin(), &args).await
}

async fn next(sub: &mut Subscription) -> SubscriptionItem {
    tokio::time::timeout(PATIENCE, sub.items.recv())
        .await
        .expect("an item in time")
        .expect("subscription open")
}

/// Reads events until `turn.finished`; returns their seqs (and whether a resync happened).
async fn read_turn(sub: &mut Subscription, seqs: &mut Vec<u64>) -> bool {
    let mut resynced = false;
    loop {
        match next(sub).await {
            SubscriptionItem::Event(event) => {
                seqs.push(event.seq);
                if event.kind == "turn.finished" {
                    return resynced;
                }
            }
            SubscriptionItem::Resynced(snapshot) => {
                resynced = true;
                seqs.clear();
                seqs.push(snapshot.cursor.seq);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A client subscribed through a fault proxy whose link is stalled, and a second client
/// connected directly, to produce meanwhile.
struct StalledSubscriber {
    proxy: FaultProxy,
    client: RacpClient,
    session_id: String,
    sub: Subscription,
    direct: RacpClient,
}

async fn stalled_subscriber(host: &HostProcess) -> StalledSubscriber {
    let (_, token) = host.pair_device("laptop", &[]).await;
    let proxy = FaultProxy::start(host.addr).await;
    let client = RacpClient::connect(tests::client_options(proxy.url(), &token))
        .await
        .unwrap();
    let (session_id, sub) = session_and_subscription(&client, host).await;
    let direct = RacpClient::connect(tests::client_options(host.url(), &token))
        .await
        .unwrap();
    proxy.stall(true);
    StalledSubscriber {
        proxy,
        client,
        session_id,
        sub,
        direct,
    }
}

async fn session_and_subscription(
    client: &RacpClient,
    host: &HostProcess,
) -> (String, Subscription) {
    let created = client
        .call::<calls::SessionCreate>(SessionCreateParams {
            workspace: host.workspace("w"),
            title: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let session_id = created.session.session_id.clone();
    let sub = client
        .subscribe(SessionSubscribeParams {
            session_id: session_id.clone(),
            cursor: Some(created.session.cursor),
        })
        .await
        .unwrap();
    (session_id, sub)
}

fn turn(session_id: &str, key: &str, text: &str) -> TurnStartParams {
    TurnStartParams {
        session_id: session_id.to_string(),
        idempotency_key: key.to_string(),
        text: text.to_string(),
        images: Vec::new(),
    }
}

fn assert_contiguous(seqs: &[u64]) {
    for pair in seqs.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "gap or duplicate in {seqs:?}");
    }
}

#[tokio::test]
async fn a_cut_link_is_resumed_with_every_event_once() {
    let host = host(&[]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let proxy = FaultProxy::start(host.addr).await;
    let client = RacpClient::connect(tests::client_options(proxy.url(), &token))
        .await
        .unwrap();
    let (session_id, mut sub) = session_and_subscription(&client, &host).await;
    client
        .call::<calls::TurnStart>(turn(&session_id, "k", "deltas:400:2"))
        .await
        .unwrap();
    let mut seqs = Vec::new();
    while seqs.len() < 50 {
        if let SubscriptionItem::Event(event) = next(&mut sub).await {
            seqs.push(event.seq);
        }
    }
    proxy.cut();
    read_turn(&mut sub, &mut seqs).await;
    assert_eq!(seqs[0], 1);
    assert_contiguous(&seqs);
    assert!(seqs.len() > 400);
}

#[tokio::test]
async fn a_stalled_link_fails_calls_in_flight_and_recovers() {
    let host = host(&[]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let proxy = FaultProxy::start(host.addr).await;
    let mut client = RacpClient::connect(tests::client_options(proxy.url(), &token))
        .await
        .unwrap();
    proxy.stall(true);
    let started = std::time::Instant::now();
    let err = client
        .call::<calls::SessionList>(Empty {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::HostDisconnected);
    assert!(err.retriable());
    // Two heartbeat intervals of silence (2 x 200 ms), with slack for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    proxy.stall(false);
    proxy.cut();
    client.wait_connected().await.unwrap();
    client.call::<calls::SessionList>(Empty {}).await.unwrap();
}

#[tokio::test]
async fn a_host_restart_is_resumed_by_cursor() {
    let host = host(&[]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let proxy = FaultProxy::start(host.addr).await;
    let mut client = RacpClient::connect(tests::client_options(proxy.url(), &token))
        .await
        .unwrap();
    let (session_id, mut sub) = session_and_subscription(&client, &host).await;
    client
        .call::<calls::TurnStart>(turn(&session_id, "a", "deltas:5"))
        .await
        .unwrap();
    let mut seqs = Vec::new();
    read_turn(&mut sub, &mut seqs).await;
    let agent = tests::stand_in_agent();
    let host = host
        .restart(&["--agent", agent.to_str().unwrap(), "--heartbeat-ms", "200"])
        .await;
    proxy.retarget(host.addr);
    proxy.cut();
    client.wait_connected().await.unwrap();
    // Calls may still meet the old link once; resend what is safe to resend.
    let mut started = None;
    for _ in 0..20 {
        match client
            .call::<calls::TurnStart>(turn(&session_id, "b", "deltas:5"))
            .await
        {
            Ok(result) => {
                started = Some(result);
                break;
            }
            Err(err) if err.code() == ErrorCode::HostDisconnected => {
                client.wait_connected().await.unwrap();
            }
            Err(err) => panic!("{err}"),
        }
    }
    assert!(started.is_some());
    read_turn(&mut sub, &mut seqs).await;
    assert_eq!(seqs[0], 1);
    assert_contiguous(&seqs);
}

#[tokio::test]
async fn an_expired_cursor_resyncs_from_a_snapshot() {
    let host = host(&["--retain-events", "50"]).await;
    let StalledSubscriber {
        proxy,
        // Kept: dropping the last handle stops the client.
        client: _client,
        session_id,
        mut sub,
        direct,
    } = stalled_subscriber(&host).await;
    direct
        .call::<calls::TurnStart>(turn(&session_id, "k", "burst:500"))
        .await
        .unwrap();
    loop {
        let got = direct
            .call::<calls::SessionGet>(racp_proto::methods::session::SessionRef {
                session_id: session_id.clone(),
            })
            .await
            .unwrap();
        if got.snapshot.state == racp_proto::methods::session::SessionState::Idle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.stall(false);
    proxy.cut();
    // Events buffered before the stall may still arrive; then the resync.
    let snapshot_seq = loop {
        match next(&mut sub).await {
            SubscriptionItem::Resynced(snapshot) => break snapshot.cursor.seq,
            SubscriptionItem::Event(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    // The next turn continues exactly after the snapshot.
    direct
        .call::<calls::TurnStart>(turn(&session_id, "k2", "deltas:3"))
        .await
        .unwrap();
    let mut seqs = vec![snapshot_seq];
    let resynced_again = read_turn(&mut sub, &mut seqs).await;
    assert!(!resynced_again, "one resync is enough");
    assert_contiguous(&seqs);
}

#[tokio::test]
async fn a_refused_credential_stops_the_client() {
    let host = host(&[]).await;
    let err = RacpClient::connect(tests::client_options(host.url(), "pdt_nobody.secret"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), ErrorCode::RemoteAuthFailed);

    let (device_id, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut client = RacpClient::connect(tests::client_options(host.url(), &token))
        .await
        .unwrap();
    let (ok, _, stderr) = host.cli(&["revoke", &device_id]).await;
    assert!(ok, "{stderr}");
    let err = client.wait_connected().await;
    let deadline = std::time::Instant::now() + PATIENCE;
    while !matches!(client.state(), ClientState::Stopped(_)) {
        assert!(std::time::Instant::now() < deadline, "client did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match client.state() {
        ClientState::Stopped(error) => assert_eq!(error.code(), ErrorCode::RemoteAuthFailed),
        other => panic!("{other:?} / {err:?}"),
    }
    let refused = client
        .call::<calls::SessionList>(Empty {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::RemoteAuthFailed);
}

#[tokio::test]
async fn plain_ws_to_a_non_loopback_address_is_refused() {
    let err = RacpClient::connect(ClientOptions::new("ws://192.0.2.1:7878/racp", "t"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), ErrorCode::RemoteConnectionFailed);
    // The row is `maybe`: a URL refused before connecting is not transient, and the error as a
    // desktop would serialize it says so (docs/error-codes.md).
    let json = serde_json::to_value(&err).unwrap();
    assert_eq!(json["retriable"], false, "{json}");
    assert_eq!(json["details"]["reason"], "plain_not_loopback", "{json}");

    // A refused socket is transient.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut options = ClientOptions::new(format!("wss://127.0.0.1:{port}/racp"), "t");
    options.call_timeout = PATIENCE;
    let err = RacpClient::connect(options).await.err().unwrap();
    assert_eq!(err.code(), ErrorCode::RemoteConnectionFailed, "{err}");
    let json = serde_json::to_value(&err).unwrap();
    assert_eq!(json["retriable"], true, "{json}");
}

#[tokio::test]
async fn wss_verifies_the_host_certificate_or_a_pinned_one() {
    let certificate = tests::TestCertificate::localhost();
    let host = host(&certificate.serve_args()).await;
    let minted = host.pairing_token(&[]).await;
    let token = minted["token"].as_str().unwrap();
    let url = format!("wss://localhost:{}/racp", host.addr.port());

    // Without any pin, the certificate must chain to the web PKI roots: it does not.
    let mut unpinned = tests::client_options(url.clone(), token);
    unpinned.pinned_sha256 = None;
    let untrusted = RacpClient::connect(unpinned).await.err().unwrap();
    assert_eq!(
        untrusted.code(),
        ErrorCode::RemoteConnectionFailed,
        "{untrusted}"
    );

    let mut pinned = tests::client_options(url, token);
    pinned.pinned_sha256 = None;
    pinned.pinned_certificate = Some(certificate.der.clone());
    let pairing = RacpClient::connect(pinned.clone()).await.unwrap();
    let paired = pairing
        .call::<calls::Pair>(racp_proto::methods::handshake::PairParams {
            device_name: "laptop".into(),
        })
        .await
        .unwrap();
    pinned.token = paired.device_token;
    let client = RacpClient::connect(pinned).await.unwrap();
    client.call::<calls::SessionList>(Empty {}).await.unwrap();
}

#[tokio::test]
async fn a_client_cut_off_as_too_slow_resumes_without_loss() {
    // Heartbeats far apart: the host notices the stalled socket long before the client
    // notices the silence.
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(
        bin(),
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--heartbeat-ms",
            "10000",
            "--send-stall-ms",
            "200",
        ],
    )
    .await;
    let StalledSubscriber {
        proxy,
        // Kept: dropping the last handle stops the client.
        client: _client,
        session_id,
        mut sub,
        direct,
    } = stalled_subscriber(&host).await;
    direct
        .call::<calls::TurnStart>(turn(&session_id, "k", &"big:500000 ".repeat(25)))
        .await
        .unwrap();
    // ~12 MB: more than the socket buffers between host and client hold, so the host's
    // writes stall and it gives up on the link with CLIENT_TOO_SLOW.
    host.until_logged(
        "code=CLIENT_TOO_SLOW",
        PATIENCE,
        "the host never cut the stalled client",
    )
    .await;
    proxy.stall(false);
    proxy.cut();
    let mut seqs = Vec::new();
    let resynced = read_turn(&mut sub, &mut seqs).await;
    assert!(!resynced, "the window still held the missed events");
    assert_eq!(seqs[0], 1);
    assert_contiguous(&seqs);
}

#[tokio::test]
async fn a_slow_link_delivers_everything_in_order() {
    let host = host(&[]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let proxy = FaultProxy::start(host.addr).await;
    let client = RacpClient::connect(tests::client_options(proxy.url(), &token))
        .await
        .unwrap();
    let (session_id, mut sub) = session_and_subscription(&client, &host).await;
    // 60 ms each way is slower than nothing but well inside two heartbeat intervals (400 ms).
    proxy.delay(60);
    let started = std::time::Instant::now();
    client
        .call::<calls::TurnStart>(turn(&session_id, "k", "deltas:50"))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(120),
        "the delay applies"
    );
    let mut seqs = Vec::new();
    read_turn(&mut sub, &mut seqs).await;
    assert_eq!(seqs[0], 1);
    assert_contiguous(&seqs);
    assert_eq!(client.state(), ClientState::Connected);
}

#[tokio::test]
async fn through_a_hop_that_batches_frames_a_replay_is_delivered_whole_every_time() {
    // Plain, so one write of the proxy is one read of several WebSocket frames (the subscribe's
    // reply and the replay's first push), as behind a TLS-terminating balancer that batches.
    let host = host(&["--plain"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let direct = RacpClient::connect(tests::client_options(host.url(), &token))
        .await
        .unwrap();
    let created = direct
        .call::<calls::SessionCreate>(SessionCreateParams {
            workspace: host.workspace("w"),
            title: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let session_id = created.session.session_id.clone();
    let mut watch = direct
        .subscribe(SessionSubscribeParams {
            session_id: session_id.clone(),
            cursor: Some(created.session.cursor),
        })
        .await
        .unwrap();
    direct
        .call::<calls::TurnStart>(turn(&session_id, "k", "deltas:3"))
        .await
        .unwrap();
    read_turn(&mut watch, &mut Vec::new()).await;

    let proxy = FaultProxy::start(host.addr).await;
    proxy.batch(5);
    let client = RacpClient::connect(tests::client_options(proxy.url(), &token))
        .await
        .unwrap();
    for trial in 0..20 {
        let mut sub = client
            .subscribe(SessionSubscribeParams {
                session_id: session_id.clone(),
                cursor: Some(created.session.cursor),
            })
            .await
            .unwrap();
        let mut seqs = Vec::new();
        assert!(!read_turn(&mut sub, &mut seqs).await, "trial {trial}");
        assert_eq!(
            seqs.first(),
            Some(&(created.session.cursor.seq + 1)),
            "trial {trial}"
        );
        assert_contiguous(&seqs);
    }
}
