//! The follow-up queue the host holds (docs/protocol.md §7.25), driven over RACP-WS against a
//! real host running the stand-in agent: a turn waiting on an approval keeps running until the
//! test answers it, so follow-ups are queued behind it deterministically.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

fn agent_args() -> Vec<String> {
    let agent = tests::stand_in_agent();
    vec!["--agent".into(), agent.to_str().unwrap().to_string()]
}

struct Setup {
    host: HostProcess,
    token: String,
    client: Client,
    session_id: String,
}

async fn setup() -> Setup {
    setup_with_env(&[]).await
}

/// [`setup`] with `env` for the host (the debug build's test hooks).
async fn setup_with_env(env: &[(&str, &str)]) -> Setup {
    let args = agent_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let host = HostProcess::start_with_env(bin(), &args, env).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    // Subscribed from the session's start.
    let session_id = client.open_session(&host.workspace("w")).await;
    Setup {
        host,
        token,
        client,
        session_id,
    }
}

impl Setup {
    async fn call(&mut self, method: &str, mut params: Value) -> Value {
        params["sessionId"] = json!(self.session_id);
        self.client.call(method, params).await
    }

    async fn until(&mut self, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.client.events_until(tests::PATIENCE * 4, done).await
    }

    /// The events up to the session's head (after `read`, the events last read): all
    /// committed, so an expected one missing fails at once instead of at a deadline.
    async fn up_to_head(&mut self, read: &[Value]) -> Vec<Value> {
        let last = read.last().map(|e| e["cursor"].clone());
        let id = self.session_id.clone();
        self.client.events_to_head(&id, last.as_ref()).await
    }

    /// Starts a turn; returns its id.
    async fn start(&mut self, key: &str, text: &str) -> String {
        let started = self
            .call("turn/start", json!({"idempotencyKey": key, "text": text}))
            .await;
        turn_id(&started)
    }

    /// Queues a follow-up; returns its turn id.
    async fn follow_up(&mut self, key: &str, text: &str) -> String {
        self.follow_up_with(json!({"idempotencyKey": key, "text": text}))
            .await
    }

    async fn follow_up_with(&mut self, params: Value) -> String {
        let queued = self.call("turn/follow_up", params).await;
        assert_eq!(queued["result"]["queued"], true, "{queued}");
        turn_id(&queued)
    }

    /// Answers the running turn's approval (`approve:confirm`) once it is asked; returns the
    /// events up to its request.
    async fn allow_the_approval(&mut self) -> Vec<Value> {
        let events = self.until(|e| e["type"] == "approval.requested").await;
        let approval_id = events.last().unwrap()["data"]["approvalId"].clone();
        let answered = self
            .client
            .call(
                "approval/respond",
                json!({"approvalId": approval_id, "decision": "allow"}),
            )
            .await;
        assert!(answered.get("result").is_some(), "{answered}");
        events
    }

    async fn queue(&mut self) -> Value {
        let got = self.call("session/get", json!({})).await;
        got["result"]["snapshot"]["queue"].clone()
    }
}

fn turn_id(reply: &Value) -> String {
    reply["result"]["turnId"]
        .as_str()
        .unwrap_or_else(|| panic!("no turn: {reply}"))
        .to_string()
}

fn finished(turn_id: &str) -> impl Fn(&Value) -> bool + '_ {
    move |e| e["type"] == "turn.finished" && e["turnId"] == turn_id
}

fn of_type<'a>(events: &'a [Value], kind: &str, turn_id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["type"] == kind && e["turnId"] == turn_id)
        .collect()
}

/// The user messages the agent was prompted with, in order.
fn prompts(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["type"] == "agent.message_end" && e["data"]["message"]["role"] == "user")
        .map(|e| {
            let text = e["data"]["message"]["content"][0]["text"].as_str().unwrap();
            (e["turnId"].as_str().unwrap().to_string(), text.to_string())
        })
        .collect()
}

#[tokio::test]
async fn follow_ups_wait_for_the_turn_to_complete_then_run_in_order_as_turns_of_their_own() {
    let mut s = setup().await;
    let first = s.start("k1", "approve:confirm").await;
    let image = json!({"mimeType": "image/png", "data": tests::pi::PNG});
    let image_info = json!([{"mimeType": "image/png", "bytes": 70}]);
    let one = s
        .follow_up_with(json!({"idempotencyKey": "f1", "text": "echo one", "images": [image]}))
        .await;
    let two = s.follow_up("f2", "echo two").await;
    let resent = s
        .call(
            "turn/follow_up",
            json!({"idempotencyKey": "f1", "text": "echo one", "images": [image]}),
        )
        .await;
    assert_eq!(resent["result"], json!({"turnId": one, "queued": true}));
    let conflict = s
        .call(
            "turn/follow_up",
            json!({"idempotencyKey": "f1", "text": "other"}),
        )
        .await;
    assert_eq!(
        conflict["error"]["code"], "IDEMPOTENCY_CONFLICT",
        "{conflict}"
    );
    let queue = s.queue().await;
    let device_id = queue["followUps"][0]["deviceId"].clone();
    assert!(device_id.is_string(), "{queue}");
    assert_eq!(
        queue["followUps"],
        json!([
            {"turnId": one, "text": "echo one", "images": image_info, "deviceId": device_id, "deviceName": "laptop"},
            {"turnId": two, "text": "echo two", "deviceId": device_id, "deviceName": "laptop"},
        ])
    );
    // Until its turn starts, a queued follow-up cannot be steered.
    let steer = s
        .call("turn/steer", json!({"turnId": one, "text": "faster"}))
        .await;
    assert_eq!(steer["error"]["code"], "CONFLICT", "{steer}");
    assert_eq!(steer["error"]["details"]["queued"], true, "{steer}");

    let mut events = s.allow_the_approval().await;
    events.extend(s.until(finished(&two)).await);
    let order: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["type"].as_str().unwrap().starts_with("turn."))
        .map(|e| {
            (
                e["type"].as_str().unwrap().into(),
                e["turnId"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("turn.started", &first),
        ("turn.queued", &one),
        ("turn.queued", &two),
        ("turn.finished", &first),
        ("turn.started", &one),
        ("turn.finished", &one),
        ("turn.started", &two),
        ("turn.finished", &two),
    ]
    .iter()
    .map(|(k, t)| (k.to_string(), t.to_string()))
    .collect();
    assert_eq!(order, expected, "{order:#?}");
    for turn in [&first, &one, &two] {
        let end = of_type(&events, "turn.finished", turn);
        assert_eq!(end[0]["data"]["outcome"], "completed", "{:?}", end);
    }
    let started = of_type(&events, "turn.started", &one);
    assert_eq!(started[0]["data"]["text"], "echo one");
    assert_eq!(started[0]["data"]["images"], image_info);
    assert_eq!(started[0]["data"]["deviceId"], device_id);
    // Each follow-up reached the agent as its own prompt, inside its own turn.
    let prompted = prompts(&events);
    assert_eq!(
        prompted[prompted.len() - 2..],
        [
            (one.clone(), "echo one".into()),
            (two.clone(), "echo two".into())
        ]
    );
    assert_eq!(s.queue().await, Value::Null, "the queue is empty");
    let snapshot = s.call("session/get", json!({})).await;
    let states: Vec<&str> = snapshot["result"]["snapshot"]["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["completed", "completed", "completed"]);
}

#[tokio::test]
async fn a_clear_an_abort_or_a_failure_withdraws_follow_ups_and_the_agent_never_sees_them() {
    let mut s = setup().await;
    let running = s.start("k1", "hang").await;
    let a = s.follow_up("fa", "echo a").await;
    let b = s.follow_up("fb", "echo b").await;
    let c = s.follow_up("fc", "echo c").await;
    let d = s.follow_up("fd", "echo d").await;

    let cleared = s.call("session/clear_queue", json!({"turnId": b})).await;
    let withdrawn = &cleared["result"]["withdrawn"];
    assert_eq!(withdrawn.as_array().unwrap().len(), 1, "{cleared}");
    assert_eq!(withdrawn[0]["turnId"], b.as_str());
    assert_eq!(withdrawn[0]["text"], "echo b");
    let again = s.call("session/clear_queue", json!({"turnId": b})).await;
    assert_eq!(
        again["result"]["withdrawn"],
        json!([]),
        "a resend withdraws nothing"
    );
    let unknown = s
        .call("session/clear_queue", json!({"turnId": "turn_nope"}))
        .await;
    assert_eq!(unknown["error"]["code"], "TURN_NOT_FOUND", "{unknown}");
    let aborted = s.call("turn/abort", json!({"turnId": c})).await;
    assert!(aborted.get("result").is_some(), "{aborted}");
    // Both withdrawals were committed before their calls answered.
    let withdrawn = s.up_to_head(&[]).await;
    let by_clear = of_type(&withdrawn, "turn.withdrawn", &b);
    assert_eq!(by_clear[0]["data"]["reason"], "cleared");
    assert_eq!(by_clear[0]["data"]["text"], "echo b");
    assert!(by_clear[0]["data"]["deviceId"].is_string());
    let by_abort = of_type(&withdrawn, "turn.withdrawn", &c);
    assert_eq!(by_abort[0]["data"]["reason"], "cleared", "{withdrawn:#?}");
    let queue = s.queue().await;
    let ids: Vec<&str> = queue["followUps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["turnId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [a.as_str(), d.as_str()]);

    // Aborting the running turn withdraws what waited behind it: nothing runs unattended.
    let abort = s.call("turn/abort", json!({"turnId": running})).await;
    assert!(abort.get("result").is_some(), "{abort}");
    // The withdrawals are committed with the turn's end.
    let mut events = s.until(finished(&running)).await;
    events.extend(s.up_to_head(&events).await);
    assert_eq!(
        of_type(&events, "turn.finished", &running)[0]["data"]["outcome"],
        "aborted"
    );
    for turn in [&a, &d] {
        let gone = of_type(&events, "turn.withdrawn", turn);
        assert_eq!(gone[0]["data"]["reason"], "turn_ended", "{:?}", gone);
        assert!(gone[0]["data"].get("deviceId").is_none());
    }
    assert_eq!(s.queue().await, Value::Null);

    // A failed turn withdraws its queue too.
    let failing = s.start("k2", "approve:confirm fail").await;
    let e = s.follow_up("fe", "echo e").await;
    s.allow_the_approval().await;
    let mut events = s.until(finished(&failing)).await;
    events.extend(s.up_to_head(&events).await);
    assert_eq!(
        of_type(&events, "turn.finished", &failing)[0]["data"]["outcome"],
        "failed"
    );
    assert_eq!(
        of_type(&events, "turn.withdrawn", &e)[0]["data"]["reason"],
        "turn_ended"
    );

    // The session goes on, and none of the withdrawn texts ever reached the agent.
    let next = s.start("k3", "echo last").await;
    let events = s.until(finished(&next)).await;
    let history = s.call("session/history", json!({"limit": 1000})).await;
    let texts = history["result"]["entries"].to_string();
    for withdrawn in ["echo a", "echo b", "echo c", "echo d", "echo e"] {
        assert!(!texts.contains(withdrawn), "{withdrawn} reached the agent");
    }
    assert!(texts.contains("echo last"));
    assert!(prompts(&events).iter().all(|(_, t)| t == "echo last"));
}

#[tokio::test]
async fn the_queue_is_bounded_and_a_host_restart_withdraws_it() {
    let mut s = setup().await;
    let running = s.start("k1", "hang").await;
    // The queue holds at most 8 images in all.
    let image = json!({"mimeType": "image/png", "data": tests::pi::PNG});
    let eight =
        json!({"idempotencyKey": "i8", "text": "echo eight", "images": vec![image.clone(); 8]});
    let with_eight = s.follow_up_with(eight).await;
    let ninth = s
        .call(
            "turn/follow_up",
            json!({"idempotencyKey": "i9", "text": "echo nine", "images": [image]}),
        )
        .await;
    assert_eq!(ninth["error"]["code"], "LIMIT_EXCEEDED", "{ninth}");
    assert!(
        ninth["error"]["message"].as_str().unwrap().contains("8"),
        "{ninth}"
    );
    let cleared = s
        .call("session/clear_queue", json!({"turnId": with_eight}))
        .await;
    assert_eq!(
        cleared["result"]["withdrawn"][0]["images"]
            .as_array()
            .unwrap()
            .len(),
        8,
        "{cleared}"
    );
    let mut queued = Vec::new();
    for i in 0..racp_proto::limits::MAX_QUEUED_FOLLOW_UPS {
        queued.push(s.follow_up(&format!("f{i}"), &format!("echo {i}")).await);
    }
    let over = s
        .call(
            "turn/follow_up",
            json!({"idempotencyKey": "over", "text": "one more"}),
        )
        .await;
    assert_eq!(over["error"]["code"], "LIMIT_EXCEEDED", "{over}");
    let message = over["error"]["message"].as_str().unwrap();
    assert!(message.contains("session/clear_queue"), "{message}");

    let queued_events = s
        .until(|e| e["type"] == "turn.queued" && e["turnId"] == queued[31].as_str())
        .await;
    let after = queued_events.last().unwrap()["cursor"].clone();

    let Setup {
        host,
        token,
        client,
        session_id,
    } = s;
    drop(client);
    let args = agent_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let host = host.restart(&args).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    let snapshot = &got["result"]["snapshot"];
    assert!(snapshot.get("queue").is_none(), "{snapshot}");
    assert_eq!(snapshot["turns"][0]["state"], "aborted", "{snapshot}");
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": after}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let events = client
        .events_until(tests::PATIENCE * 4, finished(&running))
        .await;
    let withdrawn: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "turn.withdrawn")
        .map(|e| {
            assert_eq!(e["data"]["reason"], "host_restarted", "{e}");
            e["turnId"].as_str().unwrap()
        })
        .collect();
    assert_eq!(withdrawn, queued, "each follow-up withdrawn once, in order");
    let end = events.last().unwrap();
    assert_eq!(end["data"]["outcome"], "aborted", "{end}");
    drop(host);
}

/// pi writes `agent_end` before its run has wound down (its listeners, an automatic
/// compaction) and refuses a prompt until then (`settle:MS` in the stand-in). A turn started
/// right after the last one finished, and a follow-up's turn, wait for it instead of failing
/// AGENT_BUSY; an abort during that wait ends the turn.
#[tokio::test]
async fn a_prompt_waits_while_the_agent_winds_its_last_run_down() {
    let mut s = setup().await;
    let first = s.start("k1", "echo one settle:1500").await;
    s.until(finished(&first)).await;
    let second = s.start("k2", "echo two").await;
    let events = s.until(finished(&second)).await;
    assert_eq!(
        events.last().unwrap()["data"]["outcome"],
        "completed",
        "{events:#?}"
    );
    assert!(prompts(&events).contains(&(second.clone(), "echo two".into())));

    // A follow-up queued behind a turn that winds down slowly.
    let third = s.start("k3", "approve:confirm settle:1500").await;
    let queued = s.follow_up("f1", "echo after").await;
    s.allow_the_approval().await;
    let events = s.until(finished(&queued)).await;
    assert_eq!(
        of_type(&events, "turn.finished", &third)[0]["data"]["outcome"],
        "completed"
    );
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");

    // Aborted while it waits: the turn ends (its prompt, `hang`, would never end by itself), and
    // the session goes on.
    let slow = s.start("k4", "echo slow settle:60000").await;
    s.until(finished(&slow)).await;
    let mut other = Client::connect(&s.host.url(), &s.token).await.unwrap();
    other.hello().await;
    let sub = other
        .call("session/subscribe", json!({"sessionId": s.session_id}))
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let session_id = s.session_id.clone();
    let waiting = tokio::spawn(async move {
        let started = s
            .call(
                "turn/start",
                json!({"idempotencyKey": "k5", "text": "hang"}),
            )
            .await;
        (s, started)
    });
    let seen = other
        .events_until(tests::PATIENCE * 4, |e| {
            e["type"] == "turn.started" && e["data"]["text"] == "hang"
        })
        .await;
    let late = seen.last().unwrap()["turnId"].as_str().unwrap().to_string();
    let aborted = other
        .call(
            "turn/abort",
            json!({"sessionId": session_id, "turnId": late}),
        )
        .await;
    assert!(aborted.get("result").is_some(), "{aborted}");
    let ended = other
        .events_until(tests::PATIENCE * 4, finished(&late))
        .await;
    let end = ended.last().unwrap();
    assert_eq!(end["data"]["outcome"], "aborted", "{end}");
    assert_eq!(end["data"]["error"]["code"], "TURN_ABORTED", "{end}");
    let (mut s, started) = waiting.await.unwrap();
    assert_eq!(started["result"]["turnId"], late.as_str(), "{started}");
    let next = s.start("k6", "echo again").await;
    let events = s.until(finished(&next)).await;
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
}

/// The end of the agent under a turn withdraws the queue behind it (`reason: "agent_stopped"`),
/// committed with the turn's end, so the snapshot read once `turn.finished` arrived already
/// shows it: here an agent that dies mid-turn.
#[tokio::test]
async fn an_agent_dying_under_a_turn_withdraws_the_queue_behind_it() {
    let mut s = setup().await;
    let dying = s.start("k1", "approve:confirm crash").await;
    let orphan = s.follow_up("f1", "echo never").await;
    s.allow_the_approval().await;
    let events = s.until(finished(&dying)).await;
    let end = events.last().unwrap();
    assert_eq!(
        end["data"]["error"]["code"], "AGENT_SIDECAR_CRASHED",
        "{end}"
    );
    assert_eq!(s.queue().await, Value::Null, "nothing is left queued");
    let rest = s.up_to_head(&events).await;
    let withdrawn = of_type(&rest, "turn.withdrawn", &orphan);
    assert_eq!(withdrawn.len(), 1, "{rest:#?}");
    assert_eq!(withdrawn[0]["data"]["reason"], "agent_stopped", "{rest:#?}");
}

/// `session/close` with a turn running and a follow-up queued: the close ends the turn and
/// withdraws the follow-up (`reason: "agent_stopped"`) before `session.closed`. The pump is held
/// before it reads the agent's exit (`PI_HOST_TEST_EXIT_DELAY_MS`), so the close, not the
/// exit, ends the turn, whichever would have come first.
#[tokio::test]
async fn a_close_withdraws_the_queue_behind_the_running_turn() {
    let mut s = setup_with_env(&[("PI_HOST_TEST_EXIT_DELAY_MS", "60000")]).await;
    let running = s.start("k1", "hang").await;
    let behind = s.follow_up("f1", "echo never").await;
    let closed = s.call("session/close", json!({})).await;
    assert!(closed.get("result").is_some(), "{closed}");
    let events = s.until(|e| e["type"] == "session.closed").await;
    let end = of_type(&events, "turn.finished", &running);
    assert_eq!(end.len(), 1, "{events:#?}");
    assert_eq!(end[0]["data"]["outcome"], "aborted", "{events:#?}");
    let closed_it = "the session was closed";
    assert_eq!(end[0]["data"]["error"]["message"], closed_it, "{events:#?}");
    let withdrawn = of_type(&events, "turn.withdrawn", &behind);
    assert_eq!(withdrawn.len(), 1, "{events:#?}");
    assert_eq!(withdrawn[0]["data"]["reason"], "agent_stopped");
    let history = s.call("session/history", json!({"limit": 1000})).await;
    assert!(!history.to_string().contains("never"), "{history}");
}
