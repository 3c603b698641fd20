//! A real pi-host process, real WebSocket clients over loopback: pairing, refused upgrades,
//! revocation and bad input.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::json;
use std::path::Path;
use tests::{Client, HostProcess, Upgrade};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn pairing_token_becomes_a_device_credential_once() {
    let host = HostProcess::start(bin()).await;
    let minted = host.pairing_token(&[]).await;
    let token = minted["token"].as_str().unwrap();
    assert_eq!(minted["roles"], json!(["owner"]), "first device is owner");
    assert!(minted["url"].as_str().unwrap().ends_with(token));

    let mut pairing = Client::connect(&host.url(), token)
        .await
        .expect("pairing upgrade");
    assert_eq!(pairing.selected_protocol.as_deref(), Some("racp.v1"));
    let hello = pairing.hello().await;
    assert_eq!(hello["principal"]["kind"], "pairing");
    assert_eq!(hello["capabilities"], json!([]));
    assert_eq!(hello["limits"]["maxSubscriptions"], 0);
    let denied = pairing.call("session/list", json!({})).await;
    assert_eq!(denied["error"]["code"], "UNAUTHORIZED");
    let paired = pairing.call("pair", json!({"deviceName": "laptop"})).await;
    let device_token = paired["result"]["deviceToken"].as_str().unwrap();
    assert_eq!(paired["result"]["roles"], json!(["owner"]));

    // The pairing token is single use.
    let reused = Client::connect(&host.url(), token)
        .await
        .err()
        .expect("reuse refused");
    assert_eq!(reused.status, 401);
    assert_eq!(reused.body["error"]["code"], "PAIRING_FAILED");

    let mut device = Client::connect(&host.url(), device_token)
        .await
        .expect("device upgrade");
    let hello = device.hello().await;
    assert_eq!(hello["principal"]["kind"], "device");
    assert!(
        hello["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("sessions"))
    );
    assert_eq!(hello["principal"]["roles"], json!(["owner"]));
    let info = device.call("host/info", json!({})).await;
    assert_eq!(info["result"]["host"], hello["host"]);
    let devices = device.call("device/list", json!({})).await;
    let list = devices["result"]["devices"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], "laptop");
    assert_eq!(list[0]["current"], true);

    // The second device defaults to operator.
    let second = host.pairing_token(&[]).await;
    assert_eq!(second["roles"], json!(["operator"]));
}

#[tokio::test]
async fn fifty_concurrent_pairs_with_one_token_make_one_device() {
    let host = HostProcess::start(bin()).await;
    let token = host.pairing_token(&[]).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut clients = Vec::new();
    for _ in 0..50 {
        // Some upgrades may already see the token consumed; that is a refusal, not a device.
        if let Ok(mut client) = Client::connect(&host.url(), &token).await {
            client.hello().await;
            clients.push(client);
        }
    }
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut client)| {
            tokio::spawn(async move {
                client
                    .call("pair", json!({"deviceName": format!("racer-{i}")}))
                    .await
            })
        })
        .collect();
    let mut successes = 0;
    for task in tasks {
        let reply = task.await.unwrap();
        if reply.get("result").is_some() {
            successes += 1;
        } else {
            assert_eq!(reply["error"]["code"], "PAIRING_FAILED", "{reply}");
        }
    }
    assert_eq!(successes, 1);
    let (ok, stdout, _) = host.cli(&["devices", "--json"]).await;
    assert!(ok);
    let devices: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(devices["devices"].as_array().unwrap().len(), 1, "{devices}");
}

#[tokio::test]
async fn wrong_pairing_secrets_burn_the_token() {
    let host = HostProcess::start(bin()).await;
    let token = host.pairing_token(&[]).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (id, _) = token.split_once('.').unwrap();
    for attempt in 0..5 {
        let guess = format!("{id}.guess{attempt}");
        let refused = Client::connect(&host.url(), &guess)
            .await
            .err()
            .expect("refused");
        assert_eq!(refused.body["error"]["code"], "REMOTE_AUTH_FAILED");
    }
    let refused = Client::connect(&host.url(), &token)
        .await
        .err()
        .expect("burned");
    assert_eq!(refused.body["error"]["code"], "PAIRING_FAILED");
}

#[tokio::test]
async fn upgrades_without_a_valid_token_or_from_foreign_hosts_are_refused() {
    let host = HostProcess::start(bin()).await;
    let (_, device_token) = host.pair_device("laptop", &[]).await;
    let url = host.url();
    let expect = |r: Result<Client, tests::Refused>, status: u16, code: &str| {
        let refused = r.err().unwrap_or_else(|| panic!("expected {code}"));
        assert_eq!(refused.status, status, "{:?}", refused.body);
        assert_eq!(refused.body["error"]["code"], code, "{:?}", refused.body);
    };

    expect(
        Client::upgrade(&url, Upgrade::default()).await,
        401,
        "REMOTE_AUTH_FAILED",
    );
    let bad = Upgrade {
        bearer: Some("pdt_nobody.secret"),
        ..Upgrade::default()
    };
    expect(Client::upgrade(&url, bad).await, 401, "REMOTE_AUTH_FAILED");
    let garbage = Upgrade {
        bearer: Some("not a token"),
        ..Upgrade::default()
    };
    expect(
        Client::upgrade(&url, garbage).await,
        401,
        "REMOTE_AUTH_FAILED",
    );
    let query_suffix = format!("?token={device_token}");
    let in_query = Upgrade {
        url_suffix: &query_suffix,
        ..Upgrade::default()
    };
    expect(
        Client::upgrade(&url, in_query).await,
        401,
        "REMOTE_AUTH_FAILED",
    );

    for evil in [
        "evil.example",
        "localhost6",
        "127.1",
        "0177.0.0.1",
        "evil.example:80",
    ] {
        let options = Upgrade {
            bearer: Some(&device_token),
            host: Some(evil),
            ..Upgrade::default()
        };
        expect(Client::upgrade(&url, options).await, 403, "FORBIDDEN");
    }
    let foreign = Upgrade {
        bearer: Some(&device_token),
        origin: Some("https://evil.example"),
        ..Upgrade::default()
    };
    expect(Client::upgrade(&url, foreign).await, 403, "FORBIDDEN");
    let no_subprotocol = Upgrade {
        bearer: Some(&device_token),
        subprotocols: Some("chat"),
        ..Upgrade::default()
    };
    expect(
        Client::upgrade(&url, no_subprotocol).await,
        400,
        "PROTOCOL_MISMATCH",
    );

    // Accepted: no Origin, `localhost` with any port, and the browser's bearer subprotocol.
    let mut ok = Client::connect(&url, &device_token)
        .await
        .expect("no Origin is fine");
    ok.hello().await;
    let localhost = Upgrade {
        bearer: Some(&device_token),
        host: Some("localhost:1"),
        ..Upgrade::default()
    };
    Client::upgrade(&url, localhost)
        .await
        .expect("localhost accepted");
    let offered = format!("racp.v1, racp.bearer.{device_token}");
    let browser = Upgrade {
        subprotocols: Some(&offered),
        ..Upgrade::default()
    };
    let client = Client::upgrade(&url, browser)
        .await
        .expect("bearer subprotocol accepted");
    assert_eq!(
        client.selected_protocol.as_deref(),
        Some("racp.v1"),
        "token never echoed"
    );
    // Each refusal is in the host's log with its code, and no token is.
    let log = host.log();
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refused a connection"))
        .collect();
    assert!(
        refusals.iter().any(|l| l.contains("REMOTE_AUTH_FAILED")),
        "{log}"
    );
    assert!(refusals.iter().any(|l| l.contains("FORBIDDEN")), "{log}");
    assert!(!log.contains("pdt_nobody.secret"), "{log}");
    assert!(!log.contains(&device_token), "{log}");
}

#[tokio::test]
async fn revoking_a_device_closes_its_sockets_at_once() {
    let host = HostProcess::start(bin()).await;
    let (_, owner_token) = host.pair_device("owner", &[]).await;
    let (observer_id, observer_token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut owner = Client::connect(&host.url(), &owner_token).await.unwrap();
    owner.hello().await;
    let mut observer = Client::connect(&host.url(), &observer_token).await.unwrap();
    observer.hello().await;

    let forbidden = observer.call("device/list", json!({})).await;
    assert_eq!(forbidden["error"]["code"], "FORBIDDEN");

    let revoked = owner
        .call("device/revoke", json!({"deviceId": observer_id}))
        .await;
    assert!(revoked.get("result").is_some(), "{revoked}");
    let (frames, close) = observer.until_close().await;
    let last = frames.last().expect("a connection error before the close");
    assert_eq!(last["error"]["code"], "REMOTE_AUTH_FAILED");
    assert_eq!(u16::from(close.expect("close frame").code), 4031);
    let refused = Client::connect(&host.url(), &observer_token)
        .await
        .err()
        .expect("refused");
    assert_eq!(refused.body["error"]["code"], "REMOTE_AUTH_FAILED");
    let missing = owner
        .call("device/revoke", json!({"deviceId": "dev_nobody"}))
        .await;
    assert_eq!(missing["error"]["code"], "NOT_FOUND");
}

#[tokio::test]
async fn bad_input_gets_registered_codes_and_the_connection_survives() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();

    let early = client.call("session/list", json!({})).await;
    assert_eq!(
        early["error"]["code"], "HELLO_REQUIRED",
        "hello comes first"
    );
    client.hello().await;

    client.send_text("{not json".into()).await;
    let reply = client.next_frame().await.unwrap();
    assert_eq!(reply["id"], serde_json::Value::Null);
    assert_eq!(reply["error"]["code"], "INVALID_ARGUMENT");

    let unknown = client.call("session/explode", json!({})).await;
    assert_eq!(unknown["error"]["code"], "METHOD_NOT_FOUND");
    let bad = client.call("device/revoke", json!({"deviceId": 7})).await;
    assert_eq!(bad["error"]["code"], "INVALID_PARAMS");
    assert_eq!(bad["error"]["details"]["path"], "params.deviceId");
    let gateway = client.call("host/list", json!({})).await;
    assert_eq!(gateway["error"]["code"], "METHOD_NOT_FOUND");

    // Over the negotiated bound: refused before parsing, so the reply cannot carry the id.
    let huge = "x".repeat(1_100_000);
    client
        .send_text(json!({"id": 99, "method": "pair", "params": {"deviceName": huge}}).to_string())
        .await;
    let oversized = client.next_frame().await.unwrap();
    assert_eq!(oversized["id"], serde_json::Value::Null);
    assert_eq!(oversized["error"]["code"], "PAYLOAD_TOO_LARGE");
    assert_eq!(oversized["error"]["details"]["limit"], 1_048_576);

    let still_here = client.call("host/info", json!({})).await;
    assert!(still_here.get("result").is_some(), "{still_here}");

    // Past the hard cap (4x the bound) the host does not buffer the frame: it ends the
    // connection (a PAYLOAD_TOO_LARGE close when the socket still takes one) and stays up.
    let sent = client
        .try_send_text(format!(
            r#"{{"id":1,"method":"pair","params":"{}"}}"#,
            "y".repeat(5 << 20)
        ))
        .await;
    let (frames, close) = if sent.is_ok() {
        client.until_close().await
    } else {
        (Vec::new(), None)
    };
    if let Some(close) = close {
        assert_eq!(u16::from(close.code), 4018);
        assert_eq!(frames.last().unwrap()["error"]["code"], "PAYLOAD_TOO_LARGE");
    }
    let mut again = Client::connect(&host.url(), &token).await.unwrap();
    again.hello().await;
}

#[tokio::test]
async fn hello_without_a_common_version_closes_the_connection() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    let mismatch = client
        .call(
            "hello",
            json!({"protocol": {"min": 2, "max": 3}, "client": {"name": "x", "version": "1"}}),
        )
        .await;
    assert_eq!(mismatch["error"]["code"], "PROTOCOL_MISMATCH");
    assert_eq!(mismatch["error"]["details"]["supported"]["max"], 1);
    let (frames, close) = client.until_close().await;
    assert_eq!(frames.last().unwrap()["error"]["code"], "PROTOCOL_MISMATCH");
    assert_eq!(u16::from(close.unwrap().code), 4000);
}

#[tokio::test]
async fn pair_prints_the_token_the_url_and_a_qr_code() {
    let host = HostProcess::start(bin()).await;
    // For a person: fits an 80x24 terminal, roles as words, the expiry as a time.
    let (ok, short, stderr) = host.cli(&["pair", "--roles", "observer,operator"]).await;
    assert!(ok, "{stderr}");
    assert!(short.lines().count() <= 12, "{short}");
    assert!(
        short.contains("roles observer, operator, expires in 10 min ("),
        "{short}"
    );
    assert!(short.contains(" UTC)"), "{short}");
    assert!(!short.contains('█') && !short.contains('▀'), "{short}");
    // The host listens on loopback: a QR code of that would reach no phone, so none is drawn
    // and no token minted, and the refusal says what to do.
    let (ok, stdout, stderr) = host.cli(&["pair", "--roles", "observer", "--qr"]).await;
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains(&format!("this host listens on {}", host.addr))
            && stderr.contains("`pi-remote connect`")
            && stderr.contains(&format!("--address NAME:{}", host.addr.port())),
        "{stderr}"
    );
    // With the address a device reaches it at: the link names it, the code fits 80x24.
    let address = format!("localhost:{}", host.addr.port());
    let (ok, stdout, stderr) = host
        .cli(&["pair", "--roles", "observer", "--qr", "--address", &address])
        .await;
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!("racps://{address}/pair?cert=sha256:")),
        "{stdout}"
    );
    let drawn: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(['█', '▀', '▄']))
        .collect();
    assert!(drawn.len() <= 24, "{} lines: {stdout}", drawn.len());
    assert!(drawn.iter().all(|l| l.chars().count() <= 80), "{stdout}");
    let token = stdout
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ppt_"))
        .expect("token line");
    assert!(
        stdout.contains(&format!("#{token}")),
        "URL carries the token: {stdout}"
    );
    assert!(
        stdout.contains('█') || stdout.contains('▀'),
        "QR code drawn: {stdout}"
    );
    let mut client = Client::connect(&host.url(), token)
        .await
        .expect("printed token works");
    client.hello().await;
    let paired = client.call("pair", json!({"deviceName": "phone"})).await;
    assert_eq!(paired["result"]["roles"], json!(["observer"]));

    let (ok, stdout, _) = host.cli(&["status", "--json"]).await;
    assert!(ok);
    let status: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(status["listen"], host.addr.to_string());
    let (ok, stdout, _) = host.cli(&["version", "--json"]).await;
    assert!(ok);
    assert!(stdout.contains("\"protocol\":1"), "{stdout}");
}

#[tokio::test]
async fn a_client_that_closes_with_1000_gets_1000_back() {
    let host = HostProcess::start(bin()).await;
    // A pairing connection (a browser's `pair()` closes this way) and a device's.
    let token = host.pairing_token(&[]).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, device_token) = host.pair_device("laptop", &[]).await;
    for token in [token, device_token] {
        let mut client = Client::connect(&host.url(), &token).await.unwrap();
        client.hello().await;
        let answer = client.close_normally().await;
        let answer = answer.expect("the host answers a close frame (RFC 6455 §5.5.1)");
        assert_eq!(u16::from(answer.code), 1000, "{answer:?}");
    }
}

#[tokio::test]
async fn devices_is_a_table_with_times_and_names_that_stay_apart() {
    let host = HostProcess::start(bin()).await;
    let (first, _) = host.pair_device("laptop", &[]).await;
    let (second, _) = host.pair_device("laptop", &[]).await;
    let (ok, stdout, stderr) = host.cli(&["devices"]).await;
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("DEVICE"), "{stdout}");
    assert!(
        lines[0].contains("LAST SEEN") && lines[0].contains("NAME"),
        "{stdout}"
    );
    let row = |id: &str| *lines.iter().find(|l| l.starts_with(id)).unwrap();
    assert!(row(&first).ends_with("  laptop"), "{stdout}");
    assert!(row(&second).ends_with("  laptop (2)"), "{stdout}");
    assert!(row(&first).contains("owner"), "{stdout}");
    assert!(row(&second).contains("operator"), "{stdout}");
    assert!(
        row(&first).contains(" ago (") && row(&first).contains(" UTC)"),
        "{stdout}"
    );
    assert!(!stdout.contains('['), "roles as words: {stdout}");
}
