//! The gateway (docs/architecture.md, "Gateway"; docs/protocol.md §11) against a real NATS with
//! JetStream (Debian's `nats-server`: one node, or three on loopback for the fault tests), real
//! `pi-host` processes dialing out with the stand-in agent, and real `pi-gateway` replicas.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::time::Duration;
use tests::gateway::Fleet;
use tests::nats::NatsOptions;
use tests::{Client, PATIENCE};

fn finished(e: &Value) -> bool {
    e["type"] == "turn.finished"
}

/// Waits until `host/list` on the gateway shows `host_id` with `status`.
async fn until_status(client: &mut Client, host_id: &str, status: &str) -> Value {
    until_host(client, host_id, |h| h["status"] == status).await
}

/// Waits until `host/list` on the gateway shows `host_id` as `wanted` says.
async fn until_host(client: &mut Client, host_id: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    loop {
        let listed = client.call("host/list", json!({})).await;
        let hosts = listed["result"]["hosts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(host) = hosts
            .iter()
            .find(|h| h["host"]["id"] == host_id && wanted(h))
        {
            return host.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{host_id} never became as wanted: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One NATS setup (`nodes` nodes), one gateway, one host online behind it, and an owner
/// device connected to the gateway's own endpoint. Keep `fleet`: dropping it stops NATS.
struct OneHost {
    fleet: Fleet,
    gateway: tests::gateway::GatewayProcess,
    host: tests::HostProcess,
    host_id: String,
    token: String,
    root: Client,
    online: Value,
}

async fn one_host(nodes: usize) -> OneHost {
    let mut fleet = Fleet::new(nodes, 1, 1, 3600).await;
    let gateway = fleet.gateway().await;
    let (host, host_id) = fleet.host(&[]).await;
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    let online = until_status(&mut root, &host_id, "online").await;
    OneHost {
        fleet,
        gateway,
        host,
        host_id,
        token,
        root,
        online,
    }
}

/// Creates a session on `host` over `desk` and subscribes to it from its start; returns its id
/// and its first cursor.
async fn open_session(desk: &mut Client, host: &tests::HostProcess) -> (String, Value) {
    let (session_id, cursor, _) = open_subscribed(desk, host).await;
    (session_id, cursor)
}

/// `open_session`, also returning the subscription's id.
async fn open_subscribed(desk: &mut Client, host: &tests::HostProcess) -> (String, Value, Value) {
    let created = desk
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = &created["result"]["session"];
    let session_id = session["sessionId"]
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
    let subscription = subscribed["result"]["subscriptionId"].clone();
    (session_id, session["cursor"].clone(), subscription)
}

/// Runs a turn with `text` and returns its events up to `turn.finished`.
async fn run_turn(desk: &mut Client, session_id: &str, key: &str, text: &str) -> Vec<Value> {
    let started = desk
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
        )
        .await;
    assert!(started["result"]["turnId"].is_string(), "{started}");
    desk.events_until(PATIENCE, finished).await
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
    let OneHost {
        fleet: _nats,
        gateway,
        host,
        host_id,
        token,
        mut root,
        online: listed,
    } = one_host(1).await;
    assert_eq!(listed["host"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(listed["path"], format!("/racp/hosts/{host_id}"));
    // A host-scoped call on the gateway's own endpoint says where to go.
    let nowhere = root.call("session/list", json!({})).await;
    assert_eq!(nowhere["error"]["code"], "INVALID_ARGUMENT", "{nowhere}");
    assert_eq!(nowhere["error"]["details"]["reason"], "no_host_selected");

    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    let (session_id, cursor) = open_session(&mut desk, &host).await;
    let through_gateway = run_turn(&mut desk, &session_id, "k1", "echo hello there").await;
    assert_eq!(
        through_gateway.last().unwrap()["data"]["outcome"],
        "completed"
    );

    // The same events, byte for byte, as a device of the host itself sees them from seq 0.
    let (_, host_token) = host.pair_device("direct", &[]).await;
    let mut direct = connect(&host.url(), &host_token).await;
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

    // The conversation's history, routed to the host: the host's own, entry for entry, and
    // each entry the message_end event as delivered (docs/protocol.md §7.24).
    let history = json!({"sessionId": session_id});
    let routed = again.call("session/history", history.clone()).await;
    let on_host = direct.call("session/history", history).await;
    assert_eq!(routed["result"], on_host["result"], "{routed}");
    let messages: Vec<&Value> = direct_events
        .iter()
        .filter(|e| e["type"] == "agent.message_end")
        .collect();
    let entries: Vec<&Value> = routed["result"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert!(!messages.is_empty());
    assert_eq!(entries, messages);
    let got = again
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert_eq!(
        got["result"]["snapshot"]["history"]["entries"],
        routed["result"]["entries"]
    );

    // A follow-up routed to the host: no turn runs there, so it is a turn at once.
    let follow_up = desk
        .call(
            "turn/follow_up",
            json!({"sessionId": session_id, "idempotencyKey": "f1", "text": "echo after"}),
        )
        .await;
    assert_eq!(follow_up["result"]["queued"], false, "{follow_up}");
    let followed = desk.events_until(PATIENCE, finished).await;
    let end = followed.last().unwrap();
    assert_eq!(end["turnId"], follow_up["result"]["turnId"], "{end}");
    assert_eq!(end["data"]["outcome"], "completed", "{end}");
    // Behind a running turn it is queued on the host, and withdrawn through the gateway.
    let hanging = desk
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k-hang", "text": "hang"}),
        )
        .await;
    let hanging = hanging["result"]["turnId"].clone();
    let queued = desk
        .call(
            "turn/follow_up",
            json!({"sessionId": session_id, "idempotencyKey": "f2", "text": "echo later"}),
        )
        .await;
    assert_eq!(queued["result"]["queued"], true, "{queued}");
    let cleared = desk
        .call("session/clear_queue", json!({"sessionId": session_id}))
        .await;
    assert_eq!(
        cleared["result"]["withdrawn"][0]["turnId"], queued["result"]["turnId"],
        "{cleared}"
    );
    assert_eq!(cleared["result"]["withdrawn"][0]["text"], "echo later");
    let withdrawn = desk
        .events_until(PATIENCE, |e| e["type"] == "turn.withdrawn")
        .await;
    assert_eq!(withdrawn.last().unwrap()["data"]["reason"], "cleared");
    let aborted = desk
        .call(
            "turn/abort",
            json!({"sessionId": session_id, "turnId": hanging}),
        )
        .await;
    assert!(aborted.get("result").is_some(), "{aborted}");
    desk.events_until(PATIENCE, finished).await;
    // A shell command and a session's totals, routed to the host (docs/protocol.md §7.27-§7.28):
    // the command's event reaches the gateway's subscriber, and the totals are the host's own.
    let ran = again
        .call(
            "session/bash",
            json!({"sessionId": session_id, "command": "git status"}),
        )
        .await;
    assert_eq!(
        ran["result"]["output"], "stand-in ran: git status\n",
        "{ran}"
    );
    let shown = again
        .events_until(PATIENCE, |e| e["type"] == "session.bash")
        .await;
    assert_eq!(shown.last().unwrap()["data"]["command"], "git status");
    let stats = json!({"sessionId": session_id});
    let routed = again.call("session/stats", stats.clone()).await;
    let on_host = direct.call("session/stats", stats).await;
    assert_eq!(routed["result"]["shellCommands"], 1, "{routed}");
    assert_eq!(
        routed["result"]["assistantMessages"],
        on_host["result"]["assistantMessages"]
    );
    assert!(
        routed["result"]["assistantMessages"].as_u64() > Some(0),
        "{routed}"
    );

    // A clone routed to the host: a session of its own whose history is the source's
    // conversation (docs/protocol.md §7.32), read back through the gateway.
    let cloned = desk
        .call("session/clone", json!({"sessionId": session_id}))
        .await;
    let clone_id = cloned["result"]["session"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{cloned}"));
    assert_ne!(clone_id, session_id);
    let said = |page: &Value| -> Vec<Value> {
        let entries = page["result"]["entries"].as_array().unwrap();
        entries.iter().map(|e| e["data"].clone()).collect()
    };
    let source = desk
        .call("session/history", json!({"sessionId": session_id}))
        .await;
    let copy = desk
        .call("session/history", json!({"sessionId": clone_id}))
        .await;
    assert!(!said(&source).is_empty());
    assert_eq!(said(&copy), said(&source), "{copy}");

    // A closed session read to its end ends a subscription at once, as on a host, from its last
    // cursor or from its head, instead of leaving it open for events that will never come.
    let closed = desk
        .call("session/close", json!({"sessionId": session_id}))
        .await;
    assert!(closed["result"].is_object(), "{closed}");
    let to_the_end = again
        .events_until(PATIENCE, |e| e["type"] == "session.closed")
        .await;
    let last = to_the_end.last().unwrap()["cursor"].clone();
    for params in [
        json!({"sessionId": session_id, "cursor": last}),
        json!({"sessionId": session_id}),
    ] {
        let mut late = connect(&gateway.host_url(&host_id), &token).await;
        let ended = subscribed_then_ended(&mut late, params).await;
        assert!(ended["params"]["error"].is_null(), "{ended}");
        assert_eq!(ended["params"]["cursor"], last, "{ended}");
    }

    // host/list is the gateway's: a plain host still has none.
    let plain = direct.call("host/list", json!({})).await;
    assert_eq!(plain["error"]["code"], "METHOD_NOT_FOUND");
}

/// Subscribes with `params`, then returns the next `subscription/ended` push within `PATIENCE`,
/// frames before it (heartbeats) skipped.
/// The permission policy through a gateway as on a host (docs/protocol.md §10.1): the mode set
/// at `session/create`, a `permission` approval with its typed question, answered "always"
/// through the gateway, the refusal the model receives, and the grant in the snapshot.
#[tokio::test]
async fn a_permission_question_is_asked_and_answered_through_the_gateway() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet.gateway().await;
    let stub = tests::pi::Stub::default();
    let (host, host_id, _pi_dir) = fleet.pi_host(&stub, &["--permission-mode", "ask"]).await;
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    until_status(&mut root, &host_id, "online").await;
    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    let workspace = host.workspace("w");
    let created = desk
        .call(
            "session/create",
            json!({"workspace": workspace, "permissionMode": "plan"}),
        )
        .await;
    let session = &created["result"]["session"];
    assert_eq!(session["permissionMode"], "plan", "{created}");
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    desk.call(
        "session/subscribe",
        json!({"sessionId": session_id, "cursor": session["cursor"]}),
    )
    .await;
    stub.script(&[
        ("write", json!({"path": "a.txt", "content": "x"})),
        ("bash", json!({"command": "touch ok.txt"})),
    ]);
    let started = desk
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "Go."}),
        )
        .await;
    assert!(started["result"]["turnId"].is_string(), "{started}");
    let seen = desk
        .events_until(PATIENCE, |e| e["type"] == "approval.requested")
        .await;
    let asked = seen.last().unwrap();
    assert_eq!(asked["data"]["kind"], "permission", "{asked}");
    assert_eq!(
        asked["data"]["permission"]["summary"]["command"],
        "touch ok.txt"
    );
    let refused: Vec<_> = seen
        .iter()
        .filter(|e| e["type"] == "permission.decided")
        .collect();
    assert_eq!(
        refused[0]["data"]["code"], "WRITE_DISABLED_IN_PLAN",
        "{seen:#?}"
    );
    let answer = desk
        .call(
            "approval/respond",
            json!({"approvalId": asked["data"]["approvalId"], "decision": {"value": "always"}}),
        )
        .await;
    assert_eq!(answer["result"]["approval"]["state"], "allowed", "{answer}");
    let rest = desk.events_until(PATIENCE, finished).await;
    assert_eq!(rest.last().unwrap()["data"]["outcome"], "completed");
    // The gateway's device is named in what its answer recorded, as it was paired there.
    for kind in ["approval.settled", "permission.decided"] {
        let event = rest.iter().find(|e| e["type"] == kind).unwrap();
        assert_eq!(event["data"]["deviceName"], "test desktop", "{event}");
    }
    assert!(std::path::Path::new(&workspace).join("ok.txt").exists());
    assert!(!std::path::Path::new(&workspace).join("a.txt").exists());
    let last = stub.requests.lock().unwrap().last().cloned().unwrap();
    let bodies = last.to_string();
    assert!(bodies.contains("WRITE_DISABLED_IN_PLAN"), "{bodies}");
    let got = desk
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert_eq!(
        got["result"]["snapshot"]["grants"],
        json!([{"tool": "bash", "scope": "command-prefix", "value": "touch"}]),
        "{got}"
    );
}

async fn subscribed_then_ended(client: &mut Client, params: Value) -> Value {
    subscribed_until_ended(client, params).await.1
}

/// [`subscribed_then_ended`], with the events delivered before the end.
async fn subscribed_until_ended(client: &mut Client, params: Value) -> (Vec<Value>, Value) {
    let subscribed = client.call("session/subscribe", params).await;
    assert!(
        subscribed["result"]["subscriptionId"].is_string(),
        "{subscribed}"
    );
    let mut events = Vec::new();
    let ended = async {
        loop {
            let frame = client.next_frame().await.expect("connection open");
            match frame["method"].as_str() {
                Some("session/events") => {
                    events.extend(frame["params"]["events"].as_array().unwrap().clone())
                }
                Some("subscription/ended") => return frame,
                _ => {}
            }
        }
    };
    let ended = tokio::time::timeout(PATIENCE, ended)
        .await
        .expect("no subscription/ended in time");
    (events, ended)
}

/// Stand-in for a stolen host credential: host A's own nkey, used to reach host B.
async fn as_host(
    seed_dir: &std::path::Path,
    host_id: &str,
    nats: &tests::nats::NatsCluster,
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let seed = std::fs::read_to_string(seed_dir.join("gateway.nk")).unwrap();
    let (errors_tx, errors) = tokio::sync::mpsc::unbounded_channel();
    let options = nats.client_options(async_nats::ConnectOptions::with_nkey(
        seed.trim().to_string(),
    ));
    let client = options
        .custom_inbox_prefix(format!("_INBOX_{host_id}"))
        .event_callback(move |event| {
            let errors_tx = errors_tx.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    let _ = errors_tx.send(error.to_string());
                }
            }
        })
        .connect(nats.urls())
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
    let (thief, mut errors) = as_host(a_dir.path(), &a_id, &fleet.nats).await;

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
    let (session_id, _) = open_session(&mut desk, &b_host).await;
    run_turn(&mut desk, &session_id, "k", "echo secret").await;

    // What it writes of itself in its own heartbeat shows under its own id, as plain text: it
    // cannot pass for host B, nor write escapes into a desktop's host list.
    let forged = json!({
        "hostId": b_id, "version": "9\u{1b}[2J", "hostname": "evil\u{202e}moc",
        "startedAt": 1, "sessions": 0, "at": 1, "online": true
    });
    let kv_ack = js
        .publish(format!("$KV.racp_hosts.{a_id}"), forged.to_string().into())
        .await
        .unwrap()
        .await;
    assert!(kv_ack.is_ok(), "{kv_ack:?}");
    let listed = until_host(&mut root, &a_id, |h| h["hostname"] != "").await;
    assert_eq!(listed["path"], format!("/racp/hosts/{a_id}"), "{listed}");
    assert_eq!(listed["hostname"], "evil\\u{202e}moc", "{listed}");
    assert_eq!(listed["host"]["version"], "9\\u{1b}[2J", "{listed}");
    let all = root.call("host/list", json!({})).await;
    let claiming_b = all["result"]["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["host"]["id"] == json!(b_id))
        .count();
    assert_eq!(claiming_b, 1, "{all}");
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

#[tokio::test]
async fn a_host_credential_cannot_forge_frames_through_its_own_stream() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet.gateway().await;
    let (a_dir, a_id) = fleet.hosts.remove(0);
    let (thief, _errors) = as_host(a_dir.path(), &a_id, &fleet.nats).await;
    let js = async_nats::jetstream::new(thief.clone());
    let epoch = "00000000000000a1";
    let publish = |seq: u64, payload: String| {
        let js = js.clone();
        let subject = format!("racp.ev.{a_id}.ses_forged");
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Racp-Seq", seq.to_string().as_str());
            headers.insert("Racp-Epoch", epoch);
            js.publish_with_headers(subject, headers, payload.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    // One real-looking event, then text that would close the frame's event list and add a reply
    // of its own if it were spliced in unread.
    publish(
        1,
        format!(
            r#"{{"seq":1,"cursor":"{epoch}-1","type":"agent.message_update","at":1,"data":{{}}}}"#
        ),
    )
    .await;
    publish(
        2,
        r#"{}]},"id":7,"result":{"forged":true},"w":{"q":["#.to_string(),
    )
    .await;

    let (_, token) = gateway.pair_device("observer", &[]).await;
    let mut desk = connect(&gateway.host_url(&a_id), &token).await;
    let subscribed = desk
        .call(
            "session/subscribe",
            json!({"sessionId": "ses_forged", "cursor": format!("{epoch}-0")}),
        )
        .await;
    assert!(
        subscribed["result"]["subscriptionId"].is_string(),
        "{subscribed}"
    );
    let mut seen = Vec::new();
    let ended = loop {
        let text = desk.next_text().await.expect("connection open");
        let frame: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("a frame that is not JSON ({e}): {text}"));
        assert!(
            frame.get("id").is_none() && frame.get("result").is_none(),
            "{text}"
        );
        match frame["method"].as_str() {
            Some("session/events") => {
                seen.extend(frame["params"]["events"].as_array().unwrap().clone())
            }
            Some("subscription/ended") => break frame,
            _ => {}
        }
    };
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["seq"], 1);
    assert_eq!(ended["params"]["error"]["code"], "INTERNAL", "{ended}");
    assert_eq!(
        ended["params"]["error"]["details"]["reason"], "malformed_event",
        "{ended}"
    );
}

#[tokio::test]
async fn a_subscriber_too_slow_for_the_gateway_is_cut_at_the_lag_bound_as_on_a_host() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    // Well above one append of the replica's feed (256 events), far below the stream.
    let metrics = ["--metrics-listen", "127.0.0.1:0"];
    let gateway = fleet
        .gateway_with(&["--max-lag-events", "2000", metrics[0], metrics[1]])
        .await;
    let (host, host_id) = fleet.host(&metrics).await;
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    until_status(&mut root, &host_id, "online").await;
    let url = gateway.host_url(&host_id);
    let mut desk = connect(&url, &token).await;
    let (session_id, _) = open_session(&mut desk, &host).await;
    // It reads steadily, slower than the agent writes, through small buffers.
    let proxy = tests::FaultProxy::start_with_small_buffers(gateway.addr).await;
    proxy.delay(10);
    let mut slow = connect(
        &format!("wss://{}/racp/hosts/{host_id}", proxy.addr),
        &token,
    )
    .await;
    let subscribed = slow
        .call("session/subscribe", json!({"sessionId": session_id}))
        .await;
    assert!(subscribed["result"].is_object(), "{subscribed}");
    let live = run_turn(&mut desk, &session_id, "k", "stream:40000").await;
    let read = tokio::time::timeout(PATIENCE * 4, async {
        let mut done = false;
        while let Some(frame) = slow.next_frame().await {
            if frame["method"] == "session/events"
                && frame["params"]["events"]
                    .as_array()
                    .is_some_and(|events| events.iter().any(finished))
            {
                done = true;
                break;
            }
        }
        done
    })
    .await;
    assert_eq!(
        read,
        Ok(false),
        "the slow subscriber was served the whole turn"
    );
    assert!(
        gateway
            .log()
            .lines()
            // Past the lag bound, or (blocked in a send meanwhile) past the feed's window, which
            // holds the lag bound and a push: either way CLIENT_TOO_SLOW with its cursors.
            .any(|l| l.contains("code=CLIENT_TOO_SLOW")
                && (l.contains("fell too far behind the head")
                    || l.contains("fell out of the retained window"))),
        "the gateway did not cut the subscriber for its lag"
    );
    // The desk, on the same session and replica, saw every event.
    assert!(live.iter().any(finished));
    // The cut is counted on the gateway; the routed turn is counted on both.
    let (_, text) = tests::http_get(gateway.metrics.unwrap(), "/metrics").await;
    let cut = tests::series_value(&text, "pi_gateway_client_too_slow_total");
    assert!(cut >= 1.0, "{text}");
    let turns = r#"calls_total{method="turn/start",code="ok"}"#;
    assert_eq!(
        tests::series_value(&text, &format!("pi_gateway_{turns}")),
        1.0,
        "{text}"
    );
    let (_, text) = tests::http_get(host_metrics_address(&host), "/metrics").await;
    assert_eq!(
        tests::series_value(&text, &format!("pi_host_{turns}")),
        1.0,
        "{text}"
    );
}

/// The host's events stream, reached with the gateway's own (unrestricted) NATS credential.
async fn events_stream(one: &OneHost) -> async_nats::jetstream::stream::Stream {
    let seed = std::fs::read_to_string(one.gateway.data_dir.path().join("gateway.nk")).unwrap();
    let admin = one
        .fleet
        .nats
        .client_options(async_nats::ConnectOptions::with_nkey(
            seed.trim().to_string(),
        ))
        .connect(one.fleet.nats.urls())
        .await
        .unwrap();
    let js = async_nats::jetstream::new(admin);
    js.get_stream(racp_proto::gateway::events_stream(&one.host_id))
        .await
        .unwrap()
}

/// The lag bound the sharing test gives its gateway: a feed's window is that plus a frame's
/// worth of events (1024, racp-server's default), 2024 events.
const SMALL_LAG: &str = "1000";
const SMALL_WINDOW: usize = 2024;

/// Reads `client`'s events up to the next `turn.finished` on a task of its own, so no reader
/// falls behind while another is read.
fn read_turn(mut client: Client) -> tokio::task::JoinHandle<(Client, Vec<Value>)> {
    tokio::spawn(async move {
        let seen = client.events_until(PATIENCE * 2, finished).await;
        (client, seen)
    })
}

/// Asserts `seen` is `hosted`, event for event, naming the first that differs (a whole turn's
/// events are too many to print).
fn assert_same(seen: &[Value], hosted: &[Value], who: &str) {
    let differs = seen.iter().zip(hosted).position(|(a, b)| a != b);
    let at = differs.unwrap_or(seen.len().min(hosted.len()));
    assert!(
        differs.is_none() && seen.len() == hosted.len(),
        "{who}: {} events where the host sent {}; first difference at {at}: {:?} where the host sent {:?}",
        seen.len(),
        hosted.len(),
        seen.get(at),
        hosted.get(at)
    );
}

/// Whether the gateway logged `message` for subscription `id`.
fn logged_for(gateway: &tests::gateway::GatewayProcess, message: &str, id: &str) -> bool {
    let field = format!("subscription_id={id}");
    gateway
        .log()
        .lines()
        .any(|line| line.contains(message) && line.contains(&field))
}

#[tokio::test]
async fn the_subscribers_of_a_session_on_a_replica_share_one_consumer() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet.gateway_with(&["--max-lag-events", SMALL_LAG]).await;
    let (host, host_id) = fleet.host(&[]).await;
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    let online = until_status(&mut root, &host_id, "online").await;
    let url = gateway.host_url(&host_id);
    let mut desk = connect(&url, &token).await;
    let (session_id, start) = open_session(&mut desk, &host).await;
    // What every reader is held to: the session's events as the host itself sends them.
    let (_, local_token) = host.pair_device("local", &[]).await;
    let mut at_host = connect(&host.url(), &local_token).await;
    let subscribed = at_host
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": start}),
        )
        .await;
    assert!(subscribed["result"].is_object(), "{subscribed}");
    let mut watchers = Vec::new();
    for _ in 0..5 {
        let mut watcher = connect(&url, &token).await;
        let subscribed = watcher
            .call("session/subscribe", json!({"sessionId": session_id}))
            .await;
        assert!(
            subscribed["result"]["subscriptionId"].is_string(),
            "{subscribed}"
        );
        watchers.push(read_turn(watcher));
    }
    // More events than a feed's window holds, so a reader from the start must catch up.
    let live = run_turn(&mut desk, &session_id, "k", "burst:2100").await;
    let hosted = at_host.events_until(PATIENCE * 2, finished).await;
    assert!(hosted.len() > SMALL_WINDOW, "{} events", hosted.len());
    assert_same(&live, &hosted, "the desk");
    let mut readers = Vec::new();
    for watcher in watchers {
        let (watcher, seen) = watcher.await.unwrap();
        assert_same(&seen, &hosted, "a watcher");
        readers.push(watcher);
    }
    // Six subscribers at the head, one consumer: the in-process fan-out, as on a host.
    let one = OneHost {
        fleet,
        gateway,
        host,
        host_id,
        token,
        root,
        online,
    };
    let mut stream = events_stream(&one).await;
    let consumers = stream.info().await.unwrap().state.consumer_count;
    assert_eq!(consumers, 1, "one consumer for six subscribers");

    // A reader from the session's start, older than the window: it catches up on a consumer of
    // its own, then hands over to the feed and reads on with the others.
    let mut late = connect(&url, &one.token).await;
    let subscribed = late
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": start}),
        )
        .await;
    let late_id = subscribed["result"]["subscriptionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{subscribed}"))
        .to_string();
    let replayed = late.events_until(PATIENCE * 2, finished).await;
    assert_same(&replayed, &hosted, "the late reader");
    let catch_up = "older than its feed's window catches up";
    let hand_over = "a caught-up subscription reads on from its feed";
    assert!(logged_for(&one.gateway, catch_up, &late_id), "no catch-up");
    assert!(
        logged_for(&one.gateway, hand_over, &late_id),
        "no hand-over"
    );
    readers.push(late);
    let readers: Vec<_> = readers.into_iter().map(read_turn).collect();
    let second = run_turn(&mut desk, &session_id, "k2", "deltas:10").await;
    let hosted = at_host.events_until(PATIENCE, finished).await;
    assert_same(&second, &hosted, "the desk");
    for reader in readers {
        assert_same(
            &reader.await.unwrap().1,
            &hosted,
            "a reader after the hand-over",
        );
    }
}

#[tokio::test]
async fn a_hole_in_a_hosts_stream_ends_a_replay_at_the_hole() {
    let one = one_host(1).await;
    let mut desk = connect(&one.gateway.host_url(&one.host_id), &one.token).await;
    let (session_id, start, subscription) = open_subscribed(&mut desk, &one.host).await;
    let live = run_turn(&mut desk, &session_id, "k", "deltas:20").await;
    let hole = live[live.len() / 2]["seq"].as_u64().unwrap();
    // Nobody on the gateway follows the session any more, so no feed's window holds the event
    // taken out below: the replay reads the stream itself.
    let unsubscribed = desk
        .call(
            "session/unsubscribe",
            json!({"subscriptionId": subscription}),
        )
        .await;
    assert!(unsubscribed["result"].is_object(), "{unsubscribed}");
    // The gateway's own (unrestricted) NATS credential takes one event out of the middle of
    // the host's stream, as a lost write or an operator's purge would.
    let stream = events_stream(&one).await;
    let subject = format!("racp.ev.{}.{session_id}", one.host_id);
    let message = stream
        .direct_get_next_for_subject(&subject, None)
        .await
        .unwrap();
    let mut sequence = message.sequence;
    loop {
        let message = stream.get_raw_message(sequence).await.unwrap();
        let seq = message
            .headers
            .get("Racp-Seq")
            .map(|v| v.as_str().to_string());
        if message.subject.as_str() == subject && seq == Some(hole.to_string()) {
            assert!(stream.delete_message(sequence).await.unwrap());
            break;
        }
        sequence += 1;
    }
    // A replay from the start delivers every event before the hole, once and in order, then
    // ends: never the events after it as if nothing were missing.
    let mut reader = connect(&one.gateway.host_url(&one.host_id), &one.token).await;
    let (seen, ended) = subscribed_until_ended(
        &mut reader,
        json!({"sessionId": session_id, "cursor": start}),
    )
    .await;
    let start_seq: u64 = start
        .as_str()
        .unwrap()
        .rsplit('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let seqs: Vec<u64> = seen.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (start_seq + 1..hole).collect::<Vec<_>>(),
        "the events before the hole"
    );
    for event in &seen {
        if let Some(watched) = live.iter().find(|l| l["seq"] == event["seq"]) {
            assert_eq!(watched, event, "replayed as it was delivered live");
        }
    }
    assert_eq!(
        ended["params"]["error"]["code"], "CURSOR_EXPIRED",
        "{ended}"
    );
    assert_eq!(
        ended["params"]["error"]["details"]["reason"], "older_than_window",
        "{ended}"
    );
    assert_eq!(
        ended["params"]["cursor"],
        seen.last().unwrap()["cursor"],
        "ended at the last event delivered: {ended}"
    );
}

/// A connection that breaks the rules, and one open when its server drains, end the same way on
/// a host and through a gateway (one socket layer, racp-server): the same connection error,
/// close code and reason, and nothing answered after.
#[tokio::test]
async fn a_host_and_a_gateway_end_a_connection_the_same_way() {
    use tests::raw::Raw;
    let mut one = one_host(1).await;
    let (_, direct_token) = one.host.pair_device("direct", &[]).await;
    let hello = br#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":1},"client":{"name":"raw","version":"0"}}}"#;
    let past_the_cap = {
        let piece = vec![b' '; 64 << 10];
        let mut frames = Raw::encode(0x01, &piece, false);
        for _ in 0..70 {
            frames.extend(Raw::encode(0x00, &piece, false));
        }
        frames
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("invalid UTF-8", Raw::encode(0x81, b"\xff\xfe{}", false)),
        ("RSV1 set", Raw::encode(0xC1, hello, false)),
        ("a message past the cap", past_the_cap),
    ];
    let servers = [
        (one.host.url(), direct_token.clone()),
        (one.gateway.host_url(&one.host_id), one.token.clone()),
    ];
    let open = async |url: &str, token: &str| {
        let mut raw = Raw::connect(url, token).await;
        assert!(raw.reply(hello).await.get("result").is_some());
        raw
    };
    for (name, bytes) in cases {
        let mut endings = Vec::new();
        for (url, token) in &servers {
            let mut raw = open(url, token).await;
            raw.send(&bytes).await;
            endings.push(raw.until_close().await);
        }
        assert!(endings[0].error.is_some(), "{name}: {:?}", endings[0]);
        assert_eq!(endings[0], endings[1], "{name}: host, then gateway");
    }
    // The drain: SIGTERM with a connection open (to a host of its own, so the one behind the
    // gateway keeps serving the gateway's connection).
    let mut host = tests::HostProcess::start(&tests::pi_host_binary()).await;
    let (_, token) = host.pair_device("drained", &[]).await;
    let mut direct = open(&host.url(), &token).await;
    let direct_ending = tokio::spawn(async move { direct.until_close().await });
    host.terminate().await;
    let mut through = open(&servers[1].0, &servers[1].1).await;
    let through_ending = tokio::spawn(async move { through.until_close().await });
    one.gateway.terminate().await;
    let endings = [direct_ending.await.unwrap(), through_ending.await.unwrap()];
    assert_eq!(
        endings[0].error.as_deref(),
        Some("HOST_SHUTTING_DOWN"),
        "{:?}",
        endings[0]
    );
    assert_eq!(endings[0].close, Some(1001), "{:?}", endings[0]);
    assert_eq!(endings[0], endings[1], "the drain: host, then gateway");
}

/// Frames a connection lives through: those sent before `hello`, and those sent after it.
type Cases = Vec<(&'static str, Vec<u8>)>;

fn hostile_input() -> (Cases, Cases) {
    use tests::raw::Raw;
    let over_the_bound = {
        let padding = "x".repeat(70 << 10);
        format!(r#"{{"id":9,"method":"session/list","params":{{}},"pad":"{padding}"}}"#)
    };
    let before_hello: Cases = vec![(
        "a call before hello",
        Raw::encode(
            0x81,
            br#"{"id":1,"method":"session/list","params":{}}"#,
            false,
        ),
    )];
    let after_hello: Cases = vec![
        ("a binary frame", Raw::encode(0x82, b"{}", false)),
        ("not JSON", Raw::encode(0x81, b"{\"id\":2,", false)),
        ("an array", Raw::encode(0x81, b"[1,2]", false)),
        ("no method", Raw::encode(0x81, br#"{"id":3}"#, false)),
        (
            "an unknown method",
            Raw::encode(0x81, br#"{"id":4,"method":"session/explode"}"#, false),
        ),
        (
            "params of the wrong type",
            Raw::encode(
                0x81,
                br#"{"id":5,"method":"session/get","params":{"sessionId":5}}"#,
                false,
            ),
        ),
        (
            "an unknown param",
            Raw::encode(
                0x81,
                br#"{"id":6,"method":"session/list","params":{"colour":"red"}}"#,
                false,
            ),
        ),
        (
            "a method for pairing connections",
            Raw::encode(
                0x81,
                br#"{"id":7,"method":"pair","params":{"deviceName":"x"}}"#,
                false,
            ),
        ),
        (
            "hello again with no common version",
            Raw::encode(
                0x81,
                br#"{"id":8,"method":"hello","params":{"protocol":{"min":7,"max":9},"client":{"name":"raw","version":"0"}}}"#,
                false,
            ),
        ),
        (
            "a frame over the agreed bound",
            Raw::encode(0x81, over_the_bound.as_bytes(), false),
        ),
    ];
    (before_hello, after_hello)
}

/// Hostile input a connection lives through gets the same reply from a host and from a gateway
/// in front of it: both run one connection core (racp-server/src/connection.rs).
#[tokio::test]
async fn a_host_and_a_gateway_answer_hostile_input_the_same_way() {
    use tests::raw::Raw;
    let one = one_host(1).await;
    let (_, direct_token) = one.host.pair_device("direct", &[]).await;
    let hello = br#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":1},"client":{"name":"raw","version":"0"},"maxFrameBytes":65536}}"#;
    let (before_hello, after_hello) = hostile_input();
    let servers = [
        (one.host.url(), direct_token.clone()),
        (one.gateway.host_url(&one.host_id), one.token.clone()),
    ];
    let mut answers: [Vec<(String, serde_json::Value)>; 2] = [Vec::new(), Vec::new()];
    for ((url, token), answers) in servers.iter().zip(answers.iter_mut()) {
        let mut raw = Raw::connect(url, token).await;
        for (name, bytes) in &before_hello {
            answers.push((name.to_string(), raw.reply_to(bytes).await));
        }
        assert!(raw.reply(hello).await.get("result").is_some());
        for (name, bytes) in &after_hello {
            // A failed hello ends the connection: the rest is asked on a new one.
            if name.starts_with("hello again") {
                let mut fresh = Raw::connect(url, token).await;
                let reply = fresh.reply_to(bytes).await;
                answers.push((name.to_string(), reply));
                continue;
            }
            answers.push((name.to_string(), raw.reply_to(bytes).await));
        }
        // The connection lived through all of it.
        assert!(raw.reply(br#"{"id":10,"method":"session/list"}"#).await["result"].is_object());
    }
    for ((name, host), (_, gateway)) in answers[0].iter().zip(&answers[1]) {
        let error = &host["error"];
        assert!(error["code"].is_string(), "{name}: {host}");
        // Each server makes its own trace id for a call (protocol.md §3.3): present on both
        // or on neither, the rest the same.
        let (mut host, mut gateway) = (host.clone(), gateway.clone());
        let traced = |reply: &mut serde_json::Value| {
            reply["error"]
                .as_object_mut()
                .and_then(|e| e.remove("traceId"))
                .is_some()
        };
        assert_eq!(
            traced(&mut host),
            traced(&mut gateway),
            "{name}: a traceId on one side"
        );
        if name.starts_with("hello again") {
            // The one word that differs: who speaks.
            let message = gateway["error"]["message"].as_str().unwrap_or_default();
            gateway["error"]["message"] = message.replace("gateway", "host").into();
        }
        assert_eq!(host, gateway, "{name}: host, then gateway");
    }
}

/// What [`read_to_the_end`] saw.
struct ReadToTheEnd {
    /// Agent deltas that came.
    deltas: usize,
    /// The longest wait for an event after `midway` returned.
    longest_pause: Duration,
}

/// Reads a subscription until `turn.finished`, checking every seq follows the one before (no
/// gap, no repeat); calls `midway` once after `at` events.
async fn read_to_the_end(
    sub: &mut racp_proto::client::Subscription,
    at: usize,
    mut midway: impl AsyncFnMut(),
) -> ReadToTheEnd {
    use racp_proto::client::SubscriptionItem;
    let (mut count, mut deltas, mut last_seq) = (0usize, 0usize, 0u64);
    let (mut fired, mut longest_pause) = (false, Duration::ZERO);
    loop {
        let waited = tokio::time::Instant::now();
        let item = tokio::time::timeout(PATIENCE * 2, sub.next())
            .await
            .expect("the stream stalled")
            .expect("the subscription ended");
        if fired {
            longest_pause = longest_pause.max(waited.elapsed());
        }
        let SubscriptionItem::Event(event) = item else {
            panic!("unexpected item {item:?}");
        };
        if last_seq > 0 {
            assert_eq!(
                event.seq,
                last_seq + 1,
                "a gap or a repeat after {last_seq}"
            );
        }
        last_seq = event.seq;
        count += 1;
        if event.kind == "agent.message_update" {
            deltas += 1;
        }
        if count == at && !fired {
            fired = true;
            midway().await;
        }
        if event.kind == "turn.finished" {
            assert!(fired, "the fault came after the stream ended");
            return ReadToTheEnd {
                deltas,
                longest_pause,
            };
        }
    }
}

async fn start_stream(
    client: &racp_proto::client::RacpClient,
    host: &tests::HostProcess,
    script: &str,
) -> racp_proto::client::Subscription {
    use racp_proto::calls;
    use racp_proto::methods::session::{SessionCreateParams, SessionSubscribeParams};
    use racp_proto::methods::turn::TurnStartParams;
    let created = client
        .call::<calls::SessionCreate>(SessionCreateParams {
            workspace: host.workspace("w"),
            title: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let session_id = created.session.session_id;
    let sub = client
        .subscribe(SessionSubscribeParams {
            session_id: session_id.clone(),
            cursor: Some(created.session.cursor),
        })
        .await
        .unwrap();
    client
        .call::<calls::TurnStart>(TurnStartParams {
            session_id,
            idempotency_key: "stream".into(),
            text: script.into(),
            images: Vec::new(),
        })
        .await
        .unwrap();
    sub
}

#[tokio::test]
async fn a_desktop_cut_from_one_replica_resumes_on_another_with_nothing_lost_or_repeated() {
    let mut fleet = Fleet::new(3, 2, 1, 3600).await;
    let mut first = fleet.gateway().await;
    let second = fleet.gateway().await;
    let (host, host_id) = fleet.host(&[]).await;
    let (_, token) = first.pair_device("owner", &[]).await;
    until_status(&mut connect(&first.url(), &token).await, &host_id, "online").await;

    // One address for the desktop, as a load balancer gives it; the replica behind it dies.
    let proxy = tests::FaultProxy::start(first.addr).await;
    let url = format!("wss://{}/racp/hosts/{host_id}", proxy.addr);
    let client = racp_proto::client::RacpClient::connect(tests::client_options(url, &token))
        .await
        .unwrap();
    let mut sub = start_stream(&client, &host, "stream:2000:2000:gw").await;
    let read = read_to_the_end(&mut sub, 300, async || {
        first.kill().await;
        proxy.retarget(second.addr);
        proxy.cut();
    })
    .await;
    assert_eq!(read.deltas, 2000);
}

#[tokio::test]
async fn a_nats_node_killed_mid_stream_loses_nothing() {
    let OneHost {
        mut fleet,
        gateway,
        host,
        host_id,
        token,
        ..
    } = one_host(3).await;
    let client = racp_proto::client::RacpClient::connect(tests::client_options(
        gateway.host_url(&host_id),
        &token,
    ))
    .await
    .unwrap();
    let mut sub = start_stream(&client, &host, "stream:2000:2000:nats").await;
    let nats = &mut fleet.nats;
    let read = read_to_the_end(&mut sub, 300, async || nats.kill(0).await).await;
    assert_eq!(read.deltas, 2000);
    eprintln!(
        "longest pause after the node was killed: {:?}",
        read.longest_pause
    );
    // Within seconds: it once stalled for tens of seconds, making consumers on the dead node
    // and watching a dead consumer with an ever longer wait (gateway/src/stream.rs).
    assert!(
        read.longest_pause < Duration::from_secs(20),
        "the replay stalled {:?} after the node was killed",
        read.longest_pause
    );
}

#[tokio::test]
async fn a_host_offline_is_unavailable_then_comes_back_with_its_sessions() {
    let OneHost {
        fleet,
        gateway,
        host,
        host_id,
        token,
        mut root,
        ..
    } = one_host(1).await;
    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    let (session_id, cursor) = open_session(&mut desk, &host).await;
    run_turn(&mut desk, &session_id, "a", "echo before").await;

    // Killed: calls fail retriably, host/list says offline, and the session's events are still
    // replayed from JetStream.
    let mut host = host;
    host.kill().await;
    let offline = until_status(&mut root, &host_id, "offline").await;
    assert!(offline["lastSeenAt"].as_u64().unwrap() > 0, "{offline}");
    let refused = desk.call("session/list", json!({})).await;
    assert_eq!(refused["error"]["code"], "HOST_UNAVAILABLE", "{refused}");
    assert_eq!(refused["error"]["retriable"], true);
    let mut reader = connect(&gateway.host_url(&host_id), &token).await;
    reader
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": cursor}),
        )
        .await;
    let before = reader.events_until(PATIENCE, finished).await;
    assert!(before.iter().any(|e| e["type"] == "agent.message_update"));

    // Back: the same session, and events continue after the replayed ones.
    let args = fleet.host_args();
    let host = host
        .restart(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    until_status(&mut root, &host_id, "online").await;
    let listed = desk.call("session/list", json!({})).await;
    assert!(listed.to_string().contains(&session_id), "{listed}");
    desk.call(
        "turn/start",
        json!({"sessionId": session_id, "idempotencyKey": "b", "text": "echo after"}),
    )
    .await;
    let after = reader.events_until(PATIENCE, finished).await;
    let last_before = before.last().unwrap()["seq"].as_u64().unwrap();
    assert!(after[0]["seq"].as_u64().unwrap() > last_before);
    drop(host);
}

#[tokio::test]
async fn refusals_carry_their_codes() {
    let mut fleet = Fleet::new(1, 1, 2, 2).await;
    let gateway = fleet.gateway().await;
    let (host_a, a_id) = fleet.host(&[]).await;
    let (_host_b, b_id) = fleet.host(&[]).await;
    let (_, owner) = gateway.pair_device("owner", &[]).await;
    let (_, only_a) = gateway.pair_device("operator", &[&a_id]).await;
    let mut root = connect(&gateway.url(), &owner).await;
    until_status(&mut root, &a_id, "online").await;
    until_status(&mut root, &b_id, "online").await;

    // A device granted host A only: host/list shows A alone, and B is FORBIDDEN.
    let mut limited = connect(&gateway.url(), &only_a).await;
    let listed = limited.call("host/list", json!({})).await;
    let ids: Vec<_> = listed["result"]["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["host"]["id"].clone())
        .collect();
    assert_eq!(ids, vec![json!(a_id)]);
    let refused = Client::connect(&gateway.host_url(&b_id), &only_a)
        .await
        .err()
        .unwrap();
    assert_eq!(
        (refused.status, refused.body["error"]["code"].as_str()),
        (403, Some("FORBIDDEN"))
    );
    let unknown = Client::connect(&gateway.host_url("host_nope"), &owner)
        .await
        .err()
        .unwrap();
    assert_eq!(unknown.body["error"]["code"], "NOT_FOUND");
    // Host is checked as on a host (against DNS rebinding): loopback names, not others.
    let by_name = format!("localhost:{}", gateway.addr.port());
    for (name, accepted) in [
        ("evil.example", false),
        ("127.0.0.1.nip.io", false),
        (by_name.as_str(), true),
    ] {
        let upgrade = tests::Upgrade {
            bearer: Some(&owner),
            host: Some(name),
            ..tests::Upgrade::default()
        };
        match Client::upgrade(&gateway.url(), upgrade).await {
            Ok(mut client) => {
                assert!(accepted, "Host {name} accepted");
                // A pairing link points where the desktop reached the gateway.
                client.hello().await;
                let minted = client
                    .call("pairing/create", json!({"roles": ["observer"]}))
                    .await;
                let url = minted["result"]["url"].as_str().unwrap_or_default();
                assert!(
                    url.starts_with(&format!("racps://{name}/pair?cert=sha256:")),
                    "{minted}"
                );
            }
            Err(refused) => {
                assert!(!accepted, "Host {name} refused: {refused:?}");
                assert_eq!(refused.status, 403, "{name}");
                assert_eq!(
                    refused.body["error"]["details"]["reason"],
                    "host_not_allowed"
                );
            }
        }
    }

    // JetStream keeps host A's events 2 s here: an older cursor is CURSOR_EXPIRED, with the
    // details a host gives.
    let mut desk = connect(&gateway.host_url(&a_id), &owner).await;
    let (session_id, _) = open_session(&mut desk, &host_a).await;
    let first = run_turn(&mut desk, &session_id, "a", "echo one").await;
    // A session id is one subject token: wildcards and dots would widen a subscription to other
    // sessions' events (host A has some now).
    for wild in [">", "*", "ses_a.>", "ses_a.ses_b", "ses a"] {
        let refused = desk
            .call("session/subscribe", json!({"sessionId": wild}))
            .await;
        assert_eq!(
            refused["error"]["code"], "SESSION_NOT_FOUND",
            "{wild}: {refused}"
        );
    }
    let old_cursor = first[0]["cursor"].clone();
    tokio::time::sleep(Duration::from_secs(3)).await;
    desk.call(
        "turn/start",
        json!({"sessionId": session_id, "idempotencyKey": "b", "text": "echo two"}),
    )
    .await;
    let second = desk.events_until(PATIENCE, finished).await;
    let expired = desk
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": old_cursor}),
        )
        .await;
    assert_eq!(expired["error"]["code"], "CURSOR_EXPIRED", "{expired}");
    assert_eq!(expired["error"]["details"]["reason"], "older_than_window");
    assert!(expired["error"]["details"]["head"].is_string());
    // Once retention has removed every event of the session, a cursor behind the host's head is
    // CURSOR_EXPIRED too: a subscription from it would wait for events the stream no longer has.
    let behind = second[second.len() - 2]["cursor"].clone();
    let answer = subscribe_until_expired(&mut desk, &session_id, &behind).await;
    assert_eq!(
        answer["error"]["details"]["reason"], "older_than_window",
        "{answer}"
    );

    // NATS gone: the gateway refuses new connections with HOST_UNAVAILABLE.
    fleet.nats.kill(0).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match Client::connect(&gateway.url(), &owner).await {
            Err(refused) if refused.body["error"]["code"] == "HOST_UNAVAILABLE" => {
                assert_eq!(refused.status, 503);
                break;
            }
            _ => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "still accepted without NATS"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test]
async fn a_device_granted_some_hosts_cannot_widen_its_reach() {
    let mut fleet = Fleet::new(1, 1, 2, 3600).await;
    let gateway = fleet.gateway().await;
    let (a_id, b_id) = (fleet.hosts[0].1.clone(), fleet.hosts[1].1.clone());
    let (everywhere, _) = gateway.pair_device("owner", &[]).await;
    let (owner_of_a, owner_of_a_token) = gateway.pair_device("owner", &[&a_id]).await;
    let mut limited = connect(&gateway.url(), &owner_of_a_token).await;

    // It cannot mint a pairing token for a host it may not reach.
    let wider = limited
        .call(
            "pairing/create",
            json!({"roles": ["owner"], "hosts": [b_id]}),
        )
        .await;
    assert_eq!(wider["error"]["code"], "FORBIDDEN", "{wider}");
    assert_eq!(
        wider["error"]["details"]["reason"], "host_not_granted",
        "{wider}"
    );
    assert_eq!(wider["error"]["details"]["hostId"], json!(b_id), "{wider}");

    // A token minted without `hosts` grants the minter's own reach, not every host.
    let minted = limited
        .call("pairing/create", json!({"roles": ["owner"]}))
        .await;
    let token = minted["result"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{minted}"));
    let mut pairing = connect(&gateway.url(), token).await;
    let paired = pairing
        .call("pair", json!({"deviceName": "paired by a limited owner"}))
        .await;
    let new_token = paired["result"]["deviceToken"]
        .as_str()
        .unwrap()
        .to_string();
    let new_device = paired["result"]["deviceId"].as_str().unwrap().to_string();
    let refused = Client::connect(&gateway.host_url(&b_id), &new_token)
        .await
        .err()
        .expect("the paired device reached a host its pairer may not reach");
    assert_eq!(refused.status, 403);
    connect(&gateway.host_url(&a_id), &new_token).await;

    // Devices of a wider reach are beyond it: not listed, not revocable.
    let listed = limited.call("device/list", json!({})).await;
    let ids: Vec<_> = listed["result"]["devices"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|d| d["deviceId"].as_str().unwrap().to_string())
        .collect();
    assert!(
        ids.contains(&owner_of_a) && ids.contains(&new_device),
        "{listed}"
    );
    assert!(!ids.contains(&everywhere), "{listed}");
    let revoke = limited
        .call("device/revoke", json!({"deviceId": everywhere}))
        .await;
    assert_eq!(revoke["error"]["code"], "NOT_FOUND", "{revoke}");
    // An id no device can have is not found either (not a NATS failure).
    for odd in ["dev_*", "dev_>", "dev_a.b", "dev a"] {
        let revoke = limited
            .call("device/revoke", json!({"deviceId": odd}))
            .await;
        assert_eq!(revoke["error"]["code"], "NOT_FOUND", "{odd}: {revoke}");
    }
    let revoke = limited
        .call("device/revoke", json!({"deviceId": new_device}))
        .await;
    assert!(revoke["result"].is_object(), "{revoke}");
}

#[tokio::test]
async fn a_device_revoked_on_one_replica_is_cut_off_on_every_replica() {
    let mut fleet = Fleet::new(1, 2, 1, 3600).await;
    let first = fleet.gateway().await;
    let second = fleet.gateway().await;
    let (_host, host_id) = fleet.host(&[]).await;
    let (_, owner) = first.pair_device("owner", &[]).await;
    let (laptop, laptop_token) = first.pair_device("operator", &[]).await;
    let mut admin = connect(&first.url(), &owner).await;
    until_status(&mut admin, &host_id, "online").await;

    // The laptop is connected to the other replica when the owner revokes it on this one.
    let mut on_second = connect(&second.host_url(&host_id), &laptop_token).await;
    let listed = on_second.call("host/list", json!({})).await;
    assert!(listed["result"]["hosts"].is_array(), "{listed}");
    let revoked = admin
        .call("device/revoke", json!({"deviceId": laptop}))
        .await;
    assert!(revoked["result"].is_object(), "{revoked}");
    // Once the revoke has answered, the other replica serves the laptop nothing more.
    let (frames, close) = unserved_to_the_close(&mut on_second, 900, "host/list").await;
    let last = frames.last().expect("a connection error");
    assert_eq!(last["error"]["code"], "REMOTE_AUTH_FAILED", "{frames:?}");
    assert_eq!(u16::from(close.expect("close frame").code), 4031);
    for gateway in [&first, &second] {
        let refused = Client::connect(&gateway.url(), &laptop_token)
            .await
            .err()
            .unwrap();
        assert_eq!(refused.status, 401);
    }
    let devices = admin.call("device/list", json!({})).await;
    assert!(!devices.to_string().contains(&laptop), "{devices}");

    // A replica that stops tells its desktops so before it goes.
    let mut second = second;
    let mut on_second = connect(&second.url(), &owner).await;
    second.terminate().await;
    let (frames, _) = tokio::time::timeout(PATIENCE, on_second.until_close())
        .await
        .expect("the stopping replica kept the connection");
    let last = frames.last().expect("a connection error");
    assert_eq!(last["error"]["code"], "HOST_SHUTTING_DOWN", "{frames:?}");
}

/// The session ids the host has, as `session/list` through the gateway shows them.
async fn session_ids(client: &mut Client) -> std::collections::BTreeSet<String> {
    let listed = client.call("session/list", json!({})).await;
    listed["result"]["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|s| s["sessionId"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn no_call_of_a_revoked_device_reaches_its_host_after_the_revoke_answers() {
    let mut fleet = Fleet::new(1, 2, 1, 3600).await;
    let first = fleet.gateway().await;
    let second = fleet.gateway().await;
    let (host, host_id) = fleet.host(&[]).await;
    let (_, owner) = first.pair_device("owner", &[]).await;
    let (laptop, laptop_token) = first.pair_device("operator", &[]).await;
    let mut admin = connect(&first.host_url(&host_id), &owner).await;
    until_status(&mut connect(&first.url(), &owner).await, &host_id, "online").await;

    // The laptop, on the other replica, keeps session/create calls in flight without pause.
    let mut laptop_conn = connect(&second.host_url(&host_id), &laptop_token).await;
    let workspace = host.workspace("w");
    let flood = tokio::spawn(async move {
        let mut created = 0u64;
        for id in 1000u64.. {
            let call =
                json!({"id": id, "method": "session/create", "params": {"workspace": workspace}});
            if laptop_conn.try_send_text(call.to_string()).await.is_err() {
                break;
            }
            if id % 4 == 0 {
                match laptop_conn.next_frame().await {
                    Some(frame) if frame["result"]["session"].is_object() => created += 1,
                    Some(_) => {}
                    None => break,
                }
            }
        }
        created
    });
    // Some of its calls have gone through before the revoke.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while session_ids(&mut admin).await.len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the laptop created no sessions"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let revoked = admin
        .call("device/revoke", json!({"deviceId": laptop}))
        .await;
    assert!(revoked["result"].is_object(), "{revoked}");
    let at_revoke = session_ids(&mut admin).await;
    let created = tokio::time::timeout(PATIENCE, flood)
        .await
        .expect("the revoked laptop's connection stayed open")
        .expect("flood task");
    assert!(created > 0, "the flood never got a session created");
    // Its calls in flight when the revoke came finished before the revoke answered: the host
    // has no session that was not there when it did.
    let later = session_ids(&mut admin).await;
    let after: Vec<_> = later.difference(&at_revoke).collect();
    assert!(
        after.is_empty(),
        "sessions created by the revoked device after the revoke answered: {after:?}"
    );
}

/// Subscribes from `cursor` (unsubscribing again) until the answer is CURSOR_EXPIRED, which must
/// come within `PATIENCE`; returns that answer.
async fn subscribe_until_expired(desk: &mut Client, session_id: &str, cursor: &Value) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let answer = desk
            .call(
                "session/subscribe",
                json!({"sessionId": session_id, "cursor": cursor}),
            )
            .await;
        if answer["error"]["code"] == "CURSOR_EXPIRED" {
            return answer;
        }
        let subscription = answer["result"]["subscriptionId"].clone();
        assert!(subscription.is_string(), "{answer}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "a cursor behind the host's head is still taken with the stream emptied: {answer}"
        );
        desk.call(
            "session/unsubscribe",
            json!({"subscriptionId": subscription}),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends call `id` of `method` on a revoked device's connection, reads until the server closes
/// it, and asserts the call was not served; returns the frames and the close frame.
async fn unserved_to_the_close(
    client: &mut Client,
    id: u64,
    method: &str,
) -> (
    Vec<Value>,
    Option<tokio_tungstenite::tungstenite::protocol::CloseFrame>,
) {
    let call = json!({"id": id, "method": method, "params": {}});
    let _ = client.try_send_text(call.to_string()).await;
    let (frames, close) = tokio::time::timeout(PATIENCE, client.until_close())
        .await
        .expect("a replica kept the revoked device's connection");
    assert!(
        !frames
            .iter()
            .any(|f| f["id"] == id && f.get("result").is_some()),
        "a replica served the revoked device: {frames:?}"
    );
    (frames, close)
}

/// The frames of `client` up to the reply to request `id` (pushes skipped), within `patience`.
async fn reply_to(client: &mut Client, id: u64, patience: Duration) -> Option<Value> {
    let wait = async {
        loop {
            let frame = client.next_frame().await.expect("connection open");
            if frame["id"] == id {
                return frame;
            }
        }
    };
    tokio::time::timeout(patience, wait).await.ok()
}

#[tokio::test]
async fn a_revoke_waits_out_a_replica_cut_from_nats_which_then_serves_the_device_nothing() {
    let mut fleet = Fleet::new(1, 2, 0, 3600).await;
    let lease = ["--revocation-lease-ms", "3000"];
    let first = fleet.gateway_with(&lease).await;
    // The second replica reaches NATS through a proxy that can hold its traffic.
    let link = tests::FaultProxy::start(fleet.nats.addr(0)).await;
    let second = fleet
        .gateway_at(&format!("tls://{}", link.addr), &lease)
        .await;
    let (_, owner) = first.pair_device("owner", &[]).await;
    let (tablet, tablet_token) = first.pair_device("owner", &[]).await;
    let mut admin = connect(&first.url(), &owner).await;
    // `device/list` is answered by the replica itself, from what it knows of the devices.
    let mut on_second = connect(&second.url(), &tablet_token).await;
    let listed = on_second.call("device/list", json!({})).await;
    assert!(listed["result"].is_object(), "{listed}");

    // Cut from NATS (its connection held open, nothing passing), the second replica cannot
    // learn of the revoke nor confirm it, so the revoke does not answer before its lease ends.
    link.stall(true);
    let revoke = json!({"id": 77, "method": "device/revoke", "params": {"deviceId": tablet}});
    admin.send_text(revoke.to_string()).await;
    let early = reply_to(&mut admin, 77, Duration::from_millis(1_500)).await;
    assert!(
        early.is_none(),
        "the revoke answered while a replica could still serve the device: {early:?}"
    );
    let answered = reply_to(&mut admin, 77, PATIENCE)
        .await
        .expect("the revoke never answered");
    assert!(answered["result"].is_object(), "{answered}");

    // Its lease over, the cut-off replica serves the revoked tablet nothing, though it still
    // has not heard of the revoke.
    let (frames, _) = unserved_to_the_close(&mut on_second, 5, "device/list").await;
    let ending = frames.last().expect("a connection error");
    assert_eq!(ending["error"]["code"], "HOST_UNAVAILABLE", "{frames:?}");
    assert_eq!(
        ending["error"]["details"]["reason"], "device_registry_stale",
        "{frames:?}"
    );

    // Back in touch, it catches up: the tablet is refused, the owner served again.
    link.stall(false);
    let refused = Client::connect(&second.url(), &tablet_token).await.err();
    assert_eq!(refused.map(|r| r.status), Some(401));
    // Until it has caught up it may still refuse every device (HOST_UNAVAILABLE, retriable).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut owner_on_second = Client::connect(&second.url(), &owner)
            .await
            .expect("connect");
        let hello = owner_on_second
            .call("hello", json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "tests", "version": "0"}}))
            .await;
        let devices = match hello.get("result") {
            Some(_) => owner_on_second.call("device/list", json!({})).await,
            None => hello,
        };
        if devices["result"].is_object() {
            assert!(!devices.to_string().contains(&tablet), "{devices}");
            break;
        }
        assert_eq!(devices["error"]["code"], "HOST_UNAVAILABLE", "{devices}");
        assert!(tokio::time::Instant::now() < deadline, "{devices}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The default revocation lease (`pi-gateway serve --revocation-lease-ms`).
const LEASE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_killed_replica_holds_up_a_revoke_only_until_its_lease_has_run_out() {
    let mut fleet = Fleet::new(1, 2, 0, 3600).await;
    let first = fleet.gateway().await;
    let mut second = fleet.gateway().await;
    let (_, owner) = first.pair_device("owner", &[]).await;
    let (tablet, _) = first.pair_device("owner", &[]).await;
    let (phone, phone_token) = first.pair_device("owner", &[]).await;
    let mut admin = connect(&first.url(), &owner).await;
    let mut on_first = connect(&first.url(), &phone_token).await;

    // Killed, the second replica neither confirms a revoke nor says it has gone: to a revoke it
    // looks like a replica cut from NATS, which serves devices until its lease runs out. So a
    // revoke at once waits until then (its last announcement is at most a check, 2 s, old).
    second.kill().await;
    let killed = tokio::time::Instant::now();
    let revoked = admin
        .call("device/revoke", json!({"deviceId": tablet}))
        .await;
    assert!(revoked["result"].is_object(), "{revoked}");
    let waited = killed.elapsed();
    assert!(
        waited >= LEASE / 2,
        "the revoke answered {waited:?} after a replica was killed, within its lease"
    );

    // Its lease over, it no longer holds up a revoke: this one answers within a check period
    // (2 s), where it waited a whole lease (10 s) for a minute after the kill.
    let asked = tokio::time::Instant::now();
    let revoked = admin
        .call("device/revoke", json!({"deviceId": phone}))
        .await;
    let took = asked.elapsed();
    eprintln!("revoke answered {waited:?} after the kill, then in {took:?}");
    assert!(revoked["result"].is_object(), "{revoked}");
    assert!(
        took < LEASE / 2,
        "a replica killed {:?} ago held up a revoke for {took:?}",
        asked - killed
    );
    // And it holds: the phone's connection on the live replica served nothing more.
    let (frames, _) = unserved_to_the_close(&mut on_first, 9, "device/list").await;
    let last = frames.last().expect("a connection error");
    assert_eq!(last["error"]["code"], "REMOTE_AUTH_FAILED", "{frames:?}");
    let refused = Client::connect(&first.url(), &phone_token).await.err();
    assert_eq!(refused.map(|r| r.status), Some(401));
}

#[tokio::test]
async fn a_host_serves_its_own_clients_without_nats_and_registers_again_when_it_returns() {
    let OneHost {
        mut fleet,
        gateway,
        host,
        host_id,
        token,
        ..
    } = one_host(1).await;
    let (_, local_token) = host.pair_device("local", &[]).await;
    let mut local = connect(&host.url(), &local_token).await;

    fleet.nats.kill(0).await;
    let (session_id, cursor) = open_session(&mut local, &host).await;
    run_turn(&mut local, &session_id, "k", "echo offline").await;

    // NATS back: the host registers again and what it did meanwhile reaches the stream.
    fleet.nats.restart(0).await;
    let mut root = connect_when_up(&gateway.url(), &token).await;
    // A fresh heartbeat: the record from before the cut still counted no session.
    until_host(&mut root, &host_id, |h| {
        h["status"] == "online" && h["sessions"] == 1
    })
    .await;
    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    desk.call(
        "session/subscribe",
        json!({"sessionId": session_id, "cursor": cursor}),
    )
    .await;
    let relayed = desk.events_until(PATIENCE * 2, finished).await;
    assert_eq!(relayed.last().unwrap()["data"]["outcome"], "completed");
}

/// Connects once the gateway accepts again (it refuses while it has no NATS).
async fn connect_when_up(url: &str, token: &str) -> Client {
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    loop {
        match Client::connect(url, token).await {
            Ok(mut client) => {
                client.hello().await;
                return client;
            }
            Err(refused) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "still refused: {refused:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The NATS configuration deploy/ gives (JetStream and TLS on, the users block) serves the
/// gateway as it stands, with only its places pointed at the test's; a host is reachable through
/// the gateway as soon as it says "listening" (it announced itself first); `pair` links to the
/// address `serve` serves, and `--address` overrides it.
#[tokio::test]
async fn the_deployed_nats_configuration_serves_and_a_host_answers_once_it_says_listening() {
    let deployed = NatsOptions {
        config_file: Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nats-server.conf"),
        ),
        ..NatsOptions::default()
    };
    let mut fleet = Fleet::new_with(1, 2, 1, 3600, deployed, &[]).await;
    let gateway = fleet.gateway().await;
    let (_, token) = gateway.pair_device("owner", &[]).await;
    // No waiting for host/list to say online: "listening" is the promise.
    let (host, host_id) = fleet.host(&[]).await;
    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    let listed = desk.call("session/list", json!({})).await;
    assert!(
        listed["result"]["sessions"].is_array(),
        "a call right after the host said listening: {listed}\nhost log:\n{}",
        host.log()
    );
    let (_, session) = open_session(&mut desk, &host).await;
    assert!(session.is_string(), "{session}");

    let (ok, out, err) = gateway
        .cli(&["pair", "--json", "--address", "gw.example:443"])
        .await;
    assert!(ok, "{err}");
    let minted: Value = serde_json::from_str(out.trim()).unwrap();
    let expected = format!(
        "racps://gw.example:443/pair?cert=sha256:{}#",
        gateway.cert_sha256
    );
    assert!(
        minted["url"].as_str().unwrap().starts_with(&expected),
        "{minted}"
    );
    // A data directory no serve has used has no address to give: the token, and the way out.
    let unused = fleet.gateway_dirs.remove(0);
    let (ok, out, err) = tests::gateway::cli(
        unused.path(),
        &fleet.nats.urls(),
        Some(fleet.nats.ca_path()),
        fleet.replicas,
        &["pair"],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("gpt_") && !out.contains("racps://"), "{out}");
    assert!(err.contains("--address HOST:PORT"), "{err}");
}

/// A NATS server without JetStream (an `authorization` block only, say) is named as such with
/// the block to add, at once, by `enroll` and `pair`.
#[tokio::test]
async fn a_nats_server_without_jetstream_is_named_with_its_fix() {
    let no_jetstream = NatsOptions {
        jetstream: false,
        ..NatsOptions::default()
    };
    let nats = tests::nats::NatsCluster::start_with(1, &[], no_jetstream).await;
    let dir = tempfile::tempdir().unwrap();
    let (_, host_id, nkey) = tests::gateway::prepare_host(&tests::pi_host_binary()).await;
    let commands: [&[&str]; 2] = [
        &["enroll", &host_id, &nkey, "--nats-no-auth"],
        &["pair", "--nats-no-auth"],
    ];
    for args in commands {
        let started = std::time::Instant::now();
        let (code, _, err) =
            tests::gateway::cli_status(dir.path(), &nats.urls(), Some(nats.ca_path()), 1, args)
                .await;
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(
            err.contains("runs without JetStream") && err.contains("jetstream { store_dir"),
            "{args:?}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
    // `serve` waits for JetStream (NATS may be restarted with it) and says why in its log.
    let log = dir.path().join("serve.log");
    let mut serve = tokio::process::Command::new(tests::gateway::gateway_binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--nats-no-auth",
            "--data-dir",
        ])
        .arg(dir.path())
        .args(["--nats", &nats.urls(), "--nats-ca"])
        .arg(nats.ca_path())
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("runs without JetStream") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "serve never named the missing JetStream:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = serve.kill().await;
}

/// A gateway's `hello` for a host names that host's capabilities, from its heartbeat record:
/// a host with file browsing off is not said to have `fs` (docs/protocol.md §15.1).
#[tokio::test]
async fn a_hosts_endpoint_names_the_hosts_own_capabilities() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet.gateway().await;
    let (host, host_id) = fleet.host(&["--disable-fs"]).await;
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    until_status(&mut root, &host_id, "online").await;

    let mut through = Client::connect(&gateway.host_url(&host_id), &token)
        .await
        .expect("connect");
    let routed = through.hello().await["capabilities"].clone();
    let (_, host_token) = host.pair_device("direct", &[]).await;
    let mut direct = Client::connect(&host.url(), &host_token)
        .await
        .expect("connect");
    let own = direct.hello().await["capabilities"].clone();
    let own = own.as_array().unwrap();
    assert!(!own.contains(&json!("fs")), "{own:?}");
    assert!(own.contains(&json!("attachments")), "{own:?}");
    let expected: Vec<Value> = own.iter().cloned().chain([json!("hosts")]).collect();
    assert_eq!(routed, json!(expected));
    let fs = through.call("fs/list", json!({"path": "/"})).await;
    assert_eq!(fs["error"]["code"], "CAPABILITY_UNAVAILABLE", "{fs}");
}

/// Every method a local pi session's features need reaches the host through the gateway
/// (docs/protocol.md §6.4): an image with a prompt, a new title, the slash commands, the
/// export, a fork, a file read, the workspace's changes, status and diff; and an agent that lacks a command (the stand-in has no `compact`) answers
/// CAPABILITY_UNAVAILABLE naming the feature, routed as it came.
#[tokio::test]
async fn a_local_sessions_features_are_routed_to_the_host() {
    let OneHost {
        fleet: _nats,
        gateway,
        host,
        host_id,
        token,
        ..
    } = one_host(1).await;
    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    let (session_id, _) = open_session(&mut desk, &host).await;
    let png = tests::pi::PNG;
    let started = desk
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "deltas:1",
                   "images": [{"mimeType": "image/png", "data": png}]}),
        )
        .await;
    assert!(started["result"]["turnId"].is_string(), "{started}");
    let events = desk.events_until(PATIENCE, finished).await;
    assert_eq!(
        events[0]["data"]["images"],
        json!([{"mimeType": "image/png", "bytes": 70}])
    );

    let renamed = desk
        .call(
            "session/rename",
            json!({"sessionId": session_id, "title": "routed"}),
        )
        .await;
    assert_eq!(renamed["result"]["session"]["title"], "routed", "{renamed}");
    let session = json!({"sessionId": session_id});
    let commands = desk.call("session/commands", session.clone()).await;
    assert_eq!(
        commands["result"]["commands"][0]["name"], "stand-in-template",
        "{commands}"
    );
    let exported = desk.call("session/export", session.clone()).await;
    assert!(
        exported["result"]["html"]
            .as_str()
            .is_some_and(|html| html.starts_with("<!DOCTYPE html>")),
        "{exported}"
    );
    let compact = desk.call("session/compact", session.clone()).await;
    assert_eq!(
        compact["error"]["code"], "CAPABILITY_UNAVAILABLE",
        "{compact}"
    );
    assert_eq!(compact["error"]["details"]["capability"], "compaction");
    let prompt = events
        .iter()
        .find(|e| e["type"] == "agent.message_end" && e["data"]["message"]["role"] == "user")
        .expect("the prompt's message");
    let fork = desk
        .call(
            "session/fork",
            json!({"sessionId": session_id, "from": prompt["cursor"]}),
        )
        .await;
    assert_eq!(fork["error"]["code"], "CAPABILITY_UNAVAILABLE", "{fork}");
    assert_eq!(fork["error"]["details"]["capability"], "branches");

    // A file of the workspace, read through the gateway as on the host.
    let workspace = host.workspace("read");
    std::fs::write(format!("{workspace}/notes.md"), "routed text").unwrap();
    let read = desk
        .call("fs/read", json!({"path": format!("{workspace}/notes.md")}))
        .await;
    assert_eq!(read["result"]["data"], "routed text", "{read}");
    let dir = desk.call("fs/read", json!({"path": workspace})).await;
    assert_eq!(dir["error"]["code"], "READ_PATH_IS_DIRECTORY", "{dir}");

    // The workspace's changes, its git status and diff, through the gateway as on the host.
    std::fs::write(format!("{workspace}/a.txt"), "one\n").unwrap();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "."],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-q",
            "-m",
            "1",
        ],
    ] {
        let git = std::process::Command::new("git")
            .args(args)
            .current_dir(&workspace)
            .status()
            .unwrap();
        assert!(git.success());
    }
    let created = desk
        .call("session/create", json!({"workspace": workspace}))
        .await;
    let repo = created["result"]["session"].clone();
    let subscribed = desk
        .call(
            "session/subscribe",
            json!({"sessionId": repo["sessionId"], "cursor": repo["cursor"]}),
        )
        .await;
    assert!(subscribed.get("result").is_some(), "{subscribed}");
    std::fs::write(format!("{workspace}/a.txt"), "two\n").unwrap();
    desk.events_until(PATIENCE, |e| {
        e["type"] == "workspace.changed" && e["data"]["changes"][0]["path"] == "a.txt"
    })
    .await;
    let repo_ref = json!({"sessionId": repo["sessionId"]});
    let status = desk.call("workspace/status", repo_ref.clone()).await;
    assert_eq!(status["result"]["branch"], "main", "{status}");
    assert_eq!(status["result"]["files"][0]["path"], "a.txt", "{status}");
    let diff = desk.call("workspace/diff", repo_ref).await;
    let text = diff["result"]["diff"].as_str().unwrap_or_default();
    assert!(text.contains("-one\n+two\n"), "{diff}");
}

/// The gateway's memory under large requests, as a host's (pi-host/tests/memory.rs;
/// docs/reliability.md §4.18): 200 connections of one observer each send one frame
/// just under the hard cap; the gateway stays within +128 MiB of its RSS before them while they
/// are held, and within +32 MiB of it within 10 s of their closing.
#[tokio::test]
async fn two_hundred_connections_sending_frames_near_the_cap_leave_the_gateway_near_its_baseline() {
    let mut fleet = Fleet::new(1, 1, 0, 3600).await;
    let gateway = fleet.gateway().await;
    let (_, token) = gateway.pair_device("observer", &[]).await;
    let pid = gateway.pid();
    let (baseline, _) = tests::memory_kib(pid);
    let frame_bytes = (4 << 20) - 64;
    let mut payload = r#"{"id":1,"method":"host/list","params":{"pad":""#.to_string();
    payload.push_str(&"x".repeat(frame_bytes - payload.len() - 3));
    payload.push_str(r#""}}"#);
    let mut clients = Vec::new();
    for _ in 0..200 {
        let mut client = connect(&gateway.url(), &token).await;
        client.send_raw_text(payload.as_bytes()).await;
        let reply = client.next_frame().await.expect("an answer to the frame");
        assert_eq!(reply["error"]["code"], "PAYLOAD_TOO_LARGE", "{reply}");
        clients.push(client);
    }
    let (held, peak) = tests::memory_kib(pid);
    drop(clients);
    let bound = baseline + (32 << 10);
    let after = tests::rss_falls_to(pid, bound, Duration::from_secs(10)).await;
    let figures = json!({
        "baselineKib": baseline,
        "heldAboveKib": held.saturating_sub(baseline),
        "peakAboveKib": peak.saturating_sub(baseline),
        "afterCloseAboveKib": after.saturating_sub(baseline),
    });
    tests::record_figures("memory_gateway_frames_near_the_cap", &figures);
    assert!(peak <= baseline + (128 << 10), "{figures}");
    assert!(after <= bound, "{figures}");
}

/// The gateway's byte budget, as a host's: a request frame of exactly `--max-held-bytes` is
/// read and answered; one byte more ends the connection with HOST_OVERLOADED.
#[tokio::test]
async fn the_gateways_byte_budget_takes_exactly_its_bound_and_refuses_one_byte_more() {
    let held = 1usize << 20;
    let mut fleet = Fleet::new(1, 1, 0, 3600).await;
    let gateway = fleet
        .gateway_with(&["--max-held-bytes", &held.to_string()])
        .await;
    let (_, token) = gateway.pair_device("observer", &[]).await;
    let mut client = connect(&gateway.url(), &token).await;
    let request = |bytes: usize| {
        let mut text = r#"{"id":7,"method":"host/list","params":{"pad":""#.to_string();
        text.push_str(&"x".repeat(bytes - text.len() - 3));
        text.push_str(r#""}}"#);
        text
    };
    let ended = |log: String| {
        log.lines()
            .any(|l| l.contains("ending a connection") && l.contains("code=HOST_OVERLOADED"))
    };
    client.send_raw_text(request(held).as_bytes()).await;
    let answered = client.next_frame().await.expect("an answer to the frame");
    assert!(answered.get("error").is_some(), "{answered}");
    assert!(!ended(gateway.log()));
    client.send_raw_text(request(held + 1).as_bytes()).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !ended(gateway.log()) {
        assert!(tokio::time::Instant::now() < deadline, "{}", gateway.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The operator's listeners (docs/reliability.md, "Metrics and health"): a gateway's counts
/// its connections and calls, reports NATS, and is not ready without it; a host linked to the
/// gateway adds a `nats` check to its own `/readyz`. Both count the link made again when NATS
/// is back, and say it is up again.
#[tokio::test]
async fn gateway_and_host_report_nats_on_their_metrics_listeners() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet
        .gateway_with(&["--metrics-listen", "127.0.0.1:0"])
        .await;
    let (host, host_id) = fleet.host(&["--metrics-listen", "127.0.0.1:0"]).await;
    let metrics = gateway
        .metrics
        .expect("the gateway printed its metrics address");
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    until_status(&mut root, &host_id, "online").await;
    let (status, text) = tests::http_get(metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        series(&text, "pi_gateway_nats_connected"),
        Some(1.0),
        "{text}"
    );
    let reconnects = "pi_gateway_nats_reconnects_total";
    assert_eq!(series(&text, reconnects), Some(0.0), "{text}");
    let devices = r#"pi_gateway_connections{kind="device"}"#;
    assert_eq!(tests::series_value(&text, devices), 1.0, "{text}");
    let lists = r#"pi_gateway_calls_total{method="host/list",code="ok"}"#;
    assert!(tests::series_value(&text, lists) >= 1.0, "{text}");
    let (status, body) = tests::http_get(metrics, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#"{"name":"nats","ok":true}"#), "{body}");
    let host_metrics = host_metrics_address(&host);
    let host_ready = until_ready(host_metrics, 200).await;
    assert!(
        host_ready.contains(r#"{"name":"nats","ok":true}"#),
        "{host_ready}"
    );
    let (_, text) = tests::http_get(host_metrics, "/metrics").await;
    assert_eq!(series(&text, "pi_host_nats_connected"), Some(1.0), "{text}");
    assert_eq!(
        series(&text, "pi_host_nats_reconnects_total"),
        Some(0.0),
        "{text}"
    );

    fleet.nats.kill(0).await;
    let body = until_ready(metrics, 503).await;
    assert!(body.contains(r#""name":"nats","ok":false"#), "{body}");
    let (_, text) = tests::http_get(metrics, "/metrics").await;
    assert_eq!(
        series(&text, "pi_gateway_nats_connected"),
        Some(0.0),
        "{text}"
    );
    let host_ready = until_ready(host_metrics, 503).await;
    assert!(
        host_ready.contains(r#""name":"nats","ok":false"#),
        "{host_ready}"
    );
    assert!(
        host_ready.contains(r#"{"name":"store","ok":true}"#),
        "{host_ready}"
    );
    let (_, text) = tests::http_get(host_metrics, "/metrics").await;
    assert_eq!(series(&text, "pi_host_nats_connected"), Some(0.0), "{text}");
    assert_eq!(tests::http_get(metrics, "/livez").await.0, 200);

    // NATS back: each side made its link again once, and says it is up.
    fleet.nats.restart(0).await;
    // The client's state says connected at once; the reconnect is counted by its event
    // callback, on a task of its own, a moment later: each is waited for.
    for (addr, prefix) in [(metrics, "pi_gateway"), (host_metrics, "pi_host")] {
        let reconnects = format!("{prefix}_nats_reconnects_total");
        until_series(addr, &reconnects, |v| v >= 1.0).await;
        let connected = format!("{prefix}_nats_connected");
        let text = until_series(addr, &connected, |v| v == 1.0).await;
        assert_eq!(
            series(&text, &reconnects),
            Some(1.0),
            "made again once: {text}"
        );
    }
    until_ready(metrics, 200).await;
    until_ready(host_metrics, 200).await;
}

/// A series' value in a scrape's text, `None` when the scrape does not have it.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
}

/// The scrape of `addr` once `name` is there with a value `wanted` takes, within the tests'
/// patience.
async fn until_series(
    addr: std::net::SocketAddr,
    name: &str,
    wanted: impl Fn(f64) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (_, text) = tests::http_get(addr, "/metrics").await;
        if series(&text, name).is_some_and(&wanted) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never took the value wanted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A gateway counts the events a subscription replays from its cursor (a catch-up on a consumer
/// of its own) in `events_delivered` as it counts the live ones, and names each host's stream
/// with the events its feeds have not been sent yet, 0 once they are.
#[tokio::test]
async fn a_replay_is_counted_as_delivered_and_the_feeds_lag_returns_to_zero() {
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet
        .gateway_with(&["--metrics-listen", "127.0.0.1:0"])
        .await;
    let metrics = gateway.metrics.expect("the gateway's metrics address");
    let (host, host_id) = fleet.host(&[]).await;
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    until_status(&mut root, &host_id, "online").await;
    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    let (session_id, start, subscription) = open_subscribed(&mut desk, &host).await;
    let live = run_turn(&mut desk, &session_id, "k", "deltas:300").await;
    assert!(live.iter().any(finished));
    // The feed that served the turn has been sent every event of the host's stream.
    let pending = format!(r#"pi_gateway_host_events_pending{{host="{host_id}"}}"#);
    until_series(metrics, &pending, |v| v == 0.0).await;
    let unknown = r#"pi_gateway_host_events_pending{host="no-such-host"}"#;
    let (_, text) = tests::http_get(metrics, "/metrics").await;
    assert_eq!(series(&text, unknown), None, "{text}");

    // Nobody on the gateway follows the session any more, and it is closed: a replay from its
    // start is a catch-up that reads the stream to `session.closed`.
    let unsubscribed = desk
        .call(
            "session/unsubscribe",
            json!({"subscriptionId": subscription}),
        )
        .await;
    assert!(unsubscribed["result"].is_object(), "{unsubscribed}");
    let closed = desk
        .call("session/close", json!({"sessionId": session_id}))
        .await;
    assert!(closed["result"].is_object(), "{closed}");
    let delivered = "pi_gateway_events_delivered_total";
    let (_, text) = tests::http_get(metrics, "/metrics").await;
    let before = tests::series_value(&text, delivered);
    let mut reader = connect(&gateway.host_url(&host_id), &token).await;
    let params = json!({"sessionId": session_id, "cursor": start});
    let (seen, ended) = subscribed_until_ended(&mut reader, params).await;
    assert!(ended["params"]["error"].is_null(), "{ended}");
    assert!(seen.len() > live.len(), "{} events replayed", seen.len());
    assert!(
        seen.iter().any(|e| e["type"] == "session.closed"),
        "the replay reached the session's end"
    );
    let (_, text) = tests::http_get(metrics, "/metrics").await;
    let replayed = tests::series_value(&text, delivered) - before;
    assert_eq!(replayed, seen.len() as f64, "{text}");
}

/// Where a host serves its metrics, from its log line.
fn host_metrics_address(host: &tests::HostProcess) -> std::net::SocketAddr {
    let log = host.log();
    let line = log
        .lines()
        .find(|l| l.contains("metrics and health listening"))
        .expect("the host logged its metrics address");
    let addr = line.rsplit("local=").next().unwrap();
    addr.trim().parse().unwrap()
}

/// `/readyz` once it answers `status`, its body; within the tests' patience.
async fn until_ready(addr: std::net::SocketAddr, status: u16) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (got, body) = tests::http_get(addr, "/readyz").await;
        if got == status {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz stayed {got}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `log()` holds `text`, within the test's patience.
async fn until_in_log(log: impl Fn() -> String, text: &str, who: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !log().contains(text) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{text} never in the {who}'s log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A call's trace id (protocol.md §3.3): a client's `traceId`, or the one the gateway makes,
/// names the call's lines in the gateway's log and in the host's (carried in the routed call's
/// header), and comes back in the error's `traceId`; a malformed one is refused at the gateway.
#[tokio::test]
async fn a_routed_call_is_followed_by_its_trace_id_through_gateway_and_host_logs() {
    if !tests::nats::available() {
        panic!("nats-server is not installed: scripts/test installs it");
    }
    let one = one_host(1).await;
    let mut desk = connect(&one.gateway.host_url(&one.host_id), &one.token).await;
    let unknown = json!({"sessionId": "ses_none"});
    // The client's own id, W3C traceparent-shaped.
    let chosen = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let frame = json!({"id": 901, "method": "session/get", "params": unknown, "traceId": chosen});
    desk.send_text(frame.to_string()).await;
    let reply = reply_to(&mut desk, 901, PATIENCE).await.expect("a reply");
    assert_eq!(reply["error"]["traceId"], chosen, "{reply}");
    until_in_log(|| one.gateway.log(), chosen, "gateway").await;
    until_in_log(|| one.host.log(), chosen, "host").await;
    // None chosen: the gateway makes one, and the host logs the same.
    let reply = desk.call("session/get", unknown.clone()).await;
    let made = reply["error"]["traceId"]
        .as_str()
        .expect("a traceId")
        .to_string();
    assert_eq!(made.len(), 32, "{reply}");
    until_in_log(|| one.gateway.log(), &made, "gateway").await;
    until_in_log(|| one.host.log(), &made, "host").await;
    // A malformed one is refused with its place named, and nothing is routed.
    let bad = json!({"id": 902, "method": "session/get", "params": unknown, "traceId": "a b"});
    desk.send_text(bad.to_string()).await;
    let reply = reply_to(&mut desk, 902, PATIENCE).await.expect("a reply");
    assert_eq!(reply["error"]["code"], "INVALID_ARGUMENT", "{reply}");
    assert_eq!(reply["error"]["details"]["path"], "traceId", "{reply}");
}

/// The JSON line of `log` whose call span names `trace_id`, once one is written.
async fn json_line_of(log: impl Fn() -> String, trace_id: &str, who: &str) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let found = log().lines().find_map(|line| {
            let line: Value = serde_json::from_str(line).ok()?;
            (line["span"]["trace_id"] == trace_id).then_some(line)
        });
        if let Some(line) = found {
            return line;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no JSON line of {trace_id} in the {who}'s log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `--log-format json` (reliability.md §9): every line of both logs is one JSON object, and a
/// routed call's lines carry its span with the trace id as a field, on the gateway and the host.
#[tokio::test]
async fn json_logs_carry_a_calls_trace_id_on_gateway_and_host() {
    if !tests::nats::available() {
        panic!("nats-server is not installed: scripts/test installs it");
    }
    let json = ["--log-format", "json"];
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet.gateway_with(&json).await;
    let (host, host_id) = fleet.host(&json).await;
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = connect(&gateway.url(), &token).await;
    until_status(&mut root, &host_id, "online").await;
    let mut desk = connect(&gateway.host_url(&host_id), &token).await;
    let frame = json!({"id": 7, "method": "session/list", "params": {}, "traceId": "json-trace-1"});
    desk.send_text(frame.to_string()).await;
    let reply = reply_to(&mut desk, 7, PATIENCE).await.expect("a reply");
    assert!(reply["result"]["sessions"].is_array(), "{reply}");
    for (log, who) in [(gateway.log(), "gateway"), (host.log(), "host")] {
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            let parsed: Result<Value, _> = serde_json::from_str(line);
            assert!(parsed.is_ok(), "a {who} log line is not JSON: {line}");
        }
    }
    let line = json_line_of(|| gateway.log(), "json-trace-1", "gateway").await;
    assert_eq!(line["span"]["method"], "session/list", "{line}");
    let line = json_line_of(|| host.log(), "json-trace-1", "host").await;
    assert_eq!(line["span"]["name"], "call", "{line}");
}

/// systemd's readiness for a gateway (deploy/pi-gateway.service is `Type=notify`): started with
/// `NOTIFY_SOCKET`, it sends `READY=1` once it listens and `/readyz`'s `nats` check passes, and
/// `STOPPING=1` when SIGTERM begins its drain.
#[tokio::test]
async fn a_gateway_tells_systemd_it_is_ready_and_when_it_drains() {
    let mut fleet = Fleet::new(1, 1, 0, 3600).await;
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify");
    let socket = tokio::net::UnixDatagram::bind(&notify).unwrap();
    let env = [("NOTIFY_SOCKET", notify.to_str().unwrap())];
    let mut gateway = fleet
        .gateway_with_env(&["--metrics-listen", "127.0.0.1:0"], &env)
        .await;
    let metrics = gateway.metrics.expect("the gateway's metrics address");
    let mut buf = vec![0u8; 4096];
    let mut next_state = async || {
        let n = tokio::time::timeout(PATIENCE, socket.recv(&mut buf))
            .await
            .expect("no state sent to the notify socket in time")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let ready = next_state().await;
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready}");
    let (status, body) = tests::http_get(metrics, "/readyz").await;
    assert_eq!(status, 200, "ready, yet /readyz says {body}");
    gateway.terminate().await;
    let stopping = next_state().await;
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping}");
}
