//! One redaction before anything is stored, logged or sent (docs/protocol.md §8.7,
//! "Redaction"), end to end through a host with the stand-in agent: for each credential shape,
//! and for the exact value of a key set from a client, the agent says the secret in its text,
//! fails with it in pi's `errorMessage` (`message_end`, `turn_end`, `agent_end`, and so in
//! `details.providerMessage`), and crashes with it on stderr (`stderrTail`). The secret then
//! reaches no event an owner or an observer reads, no reply, no line of the host's log and no
//! file of the data directory (the SQLite store and its WAL included), while `[redacted]`
//! shows where it was.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use tests::{Client, HostProcess};

const WAIT: Duration = Duration::from_secs(60);

/// A key set with `credential/set`: no shape knows it, only its exact value does.
const EXACT_KEY: &str = "opaque.Value-7Kq2Xw";

/// The row's name, what the provider (or the agent) says, and the secret in it.
#[rustfmt::skip]
const ROWS: &[(&str, &str, &str)] = &[
    ("sk", "Incorrect API key provided: sk-abcDEF0123456789xyzXYZ.", "abcDEF0123456789xyzXYZ"),
    ("sk-proj", "key sk-proj-Zx8Qw2Lm5Np7Rt9Vb rejected", "Zx8Qw2Lm5Np7Rt9Vb"),
    ("sk-ant", "invalid x-api-key sk-ant-api03-Hq4Jk8Lp2Ws6Ed0Rf", "api03-Hq4Jk8Lp2Ws6Ed0Rf"),
    ("bearer", "sent Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.cGF5bG9hZA.c2ln", "eyJhbGciOiJIUzI1NiJ9"),
    ("basic", "the proxy refused Basic dXNlcjpzM2NyZXRwYXNz here", "dXNlcjpzM2NyZXRwYXNz"),
    ("basic, no digit", "proxy-authenticate failed for Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ("query key", "GET https://generativelanguage.googleapis.com/v1beta/models/g:streamGenerateContent?alt=sse&key=Gq7Wm3Xp9Lz2Kd5 failed", "Gq7Wm3Xp9Lz2Kd5"),
    ("query api-key", "POST https://x.example/openai/deployments/d/chat?api-key=Qa1Ws2Ed3Rf4&v=1 refused", "Qa1Ws2Ed3Rf4"),
    ("query access_token", "redirect to https://x.example/cb?access_token=ya29.Zk3Lm9Qp2Wx&state=1", "ya29.Zk3Lm9Qp2Wx"),
    ("query token", "wss://x.example/stream?token=Tk7Mn2Bv5Cx8 closed", "Tk7Mn2Bv5Cx8"),
    ("header x-api-key", "missing scope for header x-api-key: Hx5Jc8Kv1Lb4", "Hx5Jc8Kv1Lb4"),
    ("header api-key", "api-key: Az7Sx4Dc1Fv9 is not valid", "Az7Sx4Dc1Fv9"),
    ("json quoted", r#"{"error": {"api-key": "Jq2Wn8Xc5Vb3", "message": "bad"}}"#, "Jq2Wn8Xc5Vb3"),
    ("json compact", r#"{"x-api-key":"Pz4Ok9Im2Uj7"}"#, "Pz4Ok9Im2Uj7"),
    ("json escaped", r#"{"error":"echo {\"api_key\":\"Ey6Rt1Yu4Io8\"}"}"#, "Ey6Rt1Yu4Io8"),
    ("userinfo", "request to https://proxyuser:Pr0xyPa55w0rd@proxy.example:8080 failed", "Pr0xyPa55w0rd"),
    ("google", "API key not valid: AIzaSyD4kL9mN2pQ7rS1tU6vW3xY8zA0bC5dE", "SyD4kL9mN2pQ7rS1tU6vW3xY8zA0bC5dE"),
    ("perplexity", "invalid pplx-9a8b7c6d5e4f3g2h1i0jKLMNOPQRSTUV", "9a8b7c6d5e4f3g2h1i0jKLMNOPQRSTUV"),
    ("github", "token ghp_Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78 revoked", "Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78"),
    ("groq", "gsk_Zy98Xw76Vu54Ts32Rq10Po98 unknown", "Zy98Xw76Vu54Ts32Rq10Po98"),
    ("xai", "xai-Mn12Bv34Cx56Zl78Kj90Hg denied", "Mn12Bv34Cx56Zl78Kj90Hg"),
    ("aws key id", "The security token included in the request is invalid: AKIAZ7Q3W9E5R1T6Y2U4", "Z7Q3W9E5R1T6Y2U4"),
    ("aws secret", "config had aws_secret_access_key=Wj4lrXUtnF3MI/K7MDENG/bPxRf1CYEXAMPL3KEY", "Wj4lrXUtnF3MI/K7MDENG/bPxRf1CYEXAMPL3KEY"),
    // Each remaining key prefix, with a body of plain letters that only its prefix takes.
    ("sk-svcacct", "key sk-svcacct-mvkqzrtplw expired", "mvkqzrtplw"),
    ("sk-admin", "admin key sk-admin-hdjwpqyxle denied", "hdjwpqyxle"),
    ("sk_", "stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc refused", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("github_pat", "github_pat_qzmvbnrtyuiopwlkjhgf revoked", "qzmvbnrtyuiopwlkjhgf"),
    ("gho", "gho_pwoeirutyalskdjfhgzm revoked", "pwoeirutyalskdjfhgzm"),
    ("ghs", "ghs_mznxbcvlaksjdhfgqpwo revoked", "mznxbcvlaksjdhfgqpwo"),
    ("ghu", "ghu_yturieowpqlaksjdhfgm revoked", "yturieowpqlaksjdhfgm"),
    ("ghr", "ghr_bvncmxzlaksjdhfgpqow revoked", "bvncmxzlaksjdhfgpqow"),
    ("huggingface", "hf_qpwoeirutyalskdjfhgzmxncbvqpwoe invalid", "qpwoeirutyalskdjfhgzmxncbvqpwoe"),
    ("aws session key id", "temporary id ASIAQ5W8E2R6T1Y9U3I7 expired", "Q5W8E2R6T1Y9U3I7"),
    ("cookie", "sent Cookie: session=Ck5Vn8Bm2Lq4; theme=dark\nnext", "Ck5Vn8Bm2Lq4"),
    ("password", "db password = 'plainwordsecret' refused", "plainwordsecret"),
    ("exact value", "the provider says your key opaque.Value-7Kq2Xw is wrong", EXACT_KEY),
];

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn result(reply: &Value) -> &Value {
    reply
        .get("result")
        .unwrap_or_else(|| panic!("the call failed: {reply}"))
}

async fn connect(host: &HostProcess, token: &str) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    client
}

/// Runs one turn; the events it brought, as the owner and as the observer read them.
async fn turn(
    owner: &mut Client,
    observer: &mut Client,
    session_id: &str,
    key: &str,
    text: &str,
) -> (Value, Vec<Value>) {
    let started = owner
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
        )
        .await;
    let turn_id = result(&started)["turnId"].clone();
    let finished = |e: &Value| e["type"] == "turn.finished" && e["turnId"] == turn_id;
    let mut events = owner.events_until(WAIT, finished).await;
    let finished_event = events.last().unwrap()["data"].clone();
    events.extend(observer.events_until(WAIT, finished).await);
    events.push(started);
    (finished_event, events)
}

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test]
async fn no_secret_reaches_an_event_a_reply_the_log_or_a_file() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(
        Path::new(env!("CARGO_BIN_EXE_pi-host")),
        &["--agent", agent.to_str().unwrap()],
    )
    .await;
    let (_, owner_token) = host.pair_device("owner", &[]).await;
    let (_, observer_token) = host.pair_device("watcher", &["--roles", "observer"]).await;
    let mut owner = connect(&host, &owner_token).await;
    let set = owner
        .call(
            "credential/set",
            json!({"provider": "openai", "apiKey": EXACT_KEY}),
        )
        .await;
    result(&set);
    let created = owner
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = result(&created)["session"].clone();
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    let subscribe = json!({"sessionId": session_id, "cursor": session["cursor"]});
    result(&owner.call("session/subscribe", subscribe.clone()).await);
    let mut observer = connect(&host, &observer_token).await;
    result(&observer.call("session/subscribe", subscribe).await);

    for (i, (row, text, secret)) in ROWS.iter().enumerate() {
        assert!(text.contains(secret), "{row}: the row holds its secret");
        // Said as the agent's text, then as pi's errorMessage of a provider failure.
        let script = format!(
            "sayhex:{} failhex:{}",
            hex(text),
            hex(&format!("401 {text}"))
        );
        let (finished, events) = turn(
            &mut owner,
            &mut observer,
            &session_id,
            &format!("f{i}"),
            &script,
        )
        .await;
        assert_eq!(finished["outcome"], "failed", "{row}: {finished}");
        let shown = finished["error"]["details"]["providerMessage"]
            .as_str()
            .unwrap_or_else(|| panic!("{row}: no providerMessage in {finished}"));
        assert!(shown.contains("[redacted]"), "{row}: {shown}");
        for kind in [
            "agent.message_update",
            "agent.message_end",
            "agent.turn_end",
            "agent.agent_end",
        ] {
            assert!(
                events
                    .iter()
                    .any(|e| e["type"] == kind && e.to_string().contains("[redacted]")),
                "{row}: {kind} is relayed, redacted"
            );
        }
        for event in &events {
            assert!(
                !event.to_string().contains(secret),
                "{row}: the secret is in {event}"
            );
        }

        // On the stderr of an agent that dies during the turn.
        let script = format!("crashhex:{}", hex(text));
        let (finished, events) = turn(
            &mut owner,
            &mut observer,
            &session_id,
            &format!("c{i}"),
            &script,
        )
        .await;
        let error = &finished["error"];
        assert_eq!(error["code"], "AGENT_SIDECAR_CRASHED", "{row}: {finished}");
        let tail = error["details"]["stderrTail"].as_str().unwrap();
        assert!(tail.contains("stand-in-agent: "), "{row}: {tail}");
        assert!(tail.contains("[redacted]"), "{row}: {tail}");
        for event in &events {
            assert!(
                !event.to_string().contains(secret),
                "{row}: the secret is in {event}"
            );
        }
    }

    let got = owner
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    let log = host.log();
    assert!(
        log.contains("turn did not complete") && log.contains("[redacted]"),
        "the failures were logged"
    );
    for (row, _, secret) in ROWS {
        assert!(
            !got.to_string().contains(secret),
            "{row}: the secret is in {got}"
        );
        assert!(
            !log.contains(secret),
            "{row}: the secret is in the host's log"
        );
        let mut holding = files_holding(host.data_dir.path(), secret);
        holding.retain(|path| !path.ends_with("credentials.json"));
        assert!(holding.is_empty(), "{row}: the secret is in {holding:?}");
    }
}

/// A shell command line is the client's, not the agent's output: a key written in it (`curl -H
/// 'Authorization: …'`) is redacted in the `session.bash` event an owner and an observer read,
/// in the history, in the reply (the stand-in echoes the command as its output), the log and
/// the data directory's files. Only the agent gets the command as written: it has to run it.
#[tokio::test]
async fn a_key_in_a_shell_command_is_kept_and_sent_redacted() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(
        Path::new(env!("CARGO_BIN_EXE_pi-host")),
        &["--agent", agent.to_str().unwrap()],
    )
    .await;
    let (_, owner_token) = host.pair_device("owner", &[]).await;
    let (_, observer_token) = host.pair_device("watcher", &["--roles", "observer"]).await;
    let mut owner = connect(&host, &owner_token).await;
    let set = owner
        .call(
            "credential/set",
            json!({"provider": "openai", "apiKey": EXACT_KEY}),
        )
        .await;
    result(&set);
    let session_id = owner.open_session(&host.workspace("w")).await;
    let mut observer = connect(&host, &observer_token).await;
    let got = observer
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    let subscribe = json!({"sessionId": session_id, "cursor": result(&got)["cursor"]});
    result(&observer.call("session/subscribe", subscribe).await);

    let is_bash = |e: &Value| e["type"] == "session.bash";
    for (row, text, secret) in ROWS {
        let command = format!("echo {text}");
        let ran = owner
            .call(
                "session/bash",
                json!({"sessionId": session_id, "command": command}),
            )
            .await;
        let output = result(&ran)["output"].as_str().unwrap();
        assert!(output.starts_with("stand-in ran: echo "), "{row}: {ran}");
        let seen_by_owner = owner.events_until(WAIT, is_bash).await;
        let seen_by_observer = observer.events_until(WAIT, is_bash).await;
        for event in [
            seen_by_owner.last().unwrap(),
            seen_by_observer.last().unwrap(),
        ] {
            let shown = event["data"]["command"].as_str().unwrap();
            assert!(shown.contains("[redacted]"), "{row}: {event}");
        }
        for text in [
            ran.to_string(),
            json!([seen_by_owner, seen_by_observer]).to_string(),
        ] {
            assert!(!text.contains(secret), "{row}: the secret is in {text}");
        }
    }

    let history = owner
        .call(
            "session/history",
            json!({"sessionId": session_id, "limit": 1000}),
        )
        .await;
    let entries = result(&history)["entries"].as_array().unwrap();
    assert_eq!(entries.len(), ROWS.len(), "{history}");
    let log = host.log();
    for (row, _, secret) in ROWS {
        assert!(
            !history.to_string().contains(secret),
            "{row}: the secret is in the history"
        );
        assert!(!log.contains(secret), "{row}: the secret is in the log");
        let mut holding = files_holding(host.data_dir.path(), secret);
        holding.retain(|path| !path.ends_with("credentials.json"));
        assert!(holding.is_empty(), "{row}: the secret is in {holding:?}");
    }
}
