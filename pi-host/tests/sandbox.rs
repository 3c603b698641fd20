//! The agent's kernel sandbox (docs/reliability.md §4.19) with the REAL pi, offline: what an
//! operator's shell command (`session/bash`, which pi's own shell runs) and a model's `bash`
//! tool call can reach, for the agent, a child and a grandchild: the host's data directory
//! (the desktop's provider keys, the device store), the user's keys and credential files, and
//! writes outside the workspace are refused; work in the workspace goes on. A host restarted
//! after kill -9 sandboxes its new agent too, and a host whose kernel has no Landlock says so.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::json;
use std::path::Path;
use std::time::Duration;
use tests::pi::{Stub, pi_host_env};
use tests::{Client, HostProcess};

const WAIT: Duration = Duration::from_secs(90);

/// What the user's planted credential files hold.
const KEY: &str = "SANDBOXED-SECRET-0xBEEF";
/// The provider key a desktop set (`credential/set`), kept in the data directory.
const PROVIDER_KEY: &str = "sk-sandbox-0123456789abcdefghijklmnop";

struct World {
    host: HostProcess,
    _pi_dir: tempfile::TempDir,
    _temp: tempfile::TempDir,
    home: tempfile::TempDir,
    stub: Stub,
    token: String,
}

/// A host with the real pi in permission mode `auto` (the policy asks nothing, so what runs is
/// the sandbox's to refuse), `HOME` in a temp dir holding the user's credential files, and a
/// provider key set by the owner.
async fn world(extra: &[&str], extra_env: &[(&str, &str)]) -> World {
    world_in(outside_temp(), extra, extra_env).await
}

/// [`world`] with `home` as the user's home.
async fn world_in(home: tempfile::TempDir, extra: &[&str], extra_env: &[(&str, &str)]) -> World {
    for (file, text) in [
        (".ssh/id_ed25519", KEY),
        (".aws/credentials", KEY),
        (".netrc", KEY),
    ] {
        let path = home.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let stub = Stub::default();
    let home_env = home.path().to_str().unwrap().to_string();
    // The agents' system temp is a directory of the test's own (a debug build's
    // PI_HOST_TEST_TEMP), not /tmp, which may hold this home and its projects.
    let temp = tempfile::tempdir().unwrap();
    let temp_env = temp.path().to_str().unwrap().to_string();
    let mut env = vec![
        ("HOME", home_env.as_str()),
        ("PI_HOST_TEST_TEMP", temp_env.as_str()),
    ];
    env.extend_from_slice(extra_env);
    // Workspaces in the user's home.
    let projects = home.path().join("projects");
    std::fs::create_dir_all(&projects).unwrap();
    let projects = projects.to_str().unwrap().to_string();
    let mut args = vec!["--permission-mode", "auto", "--root", projects.as_str()];
    args.extend_from_slice(extra);
    let (host, pi_dir) = pi_host_env(&stub, None, &args, &env).await;
    let (_, token) = host.pair_device("owner", &[]).await;
    let mut client = connect(&host, &token).await;
    let set = client
        .call(
            "credential/set",
            json!({"provider": "openai", "apiKey": PROVIDER_KEY}),
        )
        .await;
    assert!(set.get("result").is_some(), "{set}");
    World {
        host,
        _pi_dir: pi_dir,
        _temp: temp,
        home,
        stub,
        token,
    }
}

/// A workspace `name` under the user's projects (created).
fn workspace(w: &World, name: &str) -> String {
    let path = w.home.path().join("projects").join(name);
    std::fs::create_dir_all(&path).unwrap();
    path.to_str().unwrap().to_string()
}

async fn connect(host: &HostProcess, token: &str) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    client
}

/// Runs `command` with `session/bash`; its output and exit code.
async fn bash(client: &mut Client, session: &str, command: &str) -> (String, i64) {
    let reply = client
        .call(
            "session/bash",
            json!({"sessionId": session, "command": command}),
        )
        .await;
    let result = &reply["result"];
    let output = result["output"]
        .as_str()
        .unwrap_or_else(|| panic!("{command}: {reply}"))
        .to_string();
    (output, result["exitCode"].as_i64().unwrap_or(-1))
}

/// Asserts `command` failed as the kernel refused it, and showed nothing of a secret.
async fn refused(client: &mut Client, session: &str, command: &str) {
    let (output, code) = bash(client, session, command).await;
    assert_ne!(code, 0, "{command} ran: {output}");
    assert!(
        output.contains("Permission denied") || output.contains("PermissionError"),
        "{command} failed otherwise: {output}"
    );
    for secret in [KEY, PROVIDER_KEY] {
        assert!(
            !output.contains(secret),
            "{command} showed a secret: {output}"
        );
    }
}

#[tokio::test]
async fn a_shell_reaches_neither_the_hosts_files_nor_the_users_keys_and_works_in_its_workspace() {
    let w = world(&[], &[]).await;
    let mut client = connect(&w.host, &w.token).await;
    let info = client.call("host/info", json!({})).await["result"].clone();
    assert_eq!(info["sandbox"]["kind"], "landlock", "{info}");
    assert_eq!(info["sandbox"]["mode"], "workspace-write");
    assert!(info["sandbox"]["abi"].as_u64().unwrap() >= 1, "{info}");
    assert!(
        info["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("sandbox"))
    );
    let session = client.open_session(&workspace(&w, "w")).await;
    let data = w.host.data_dir.path().canonicalize().unwrap();
    let data = data.display();
    // Another project of the user's, beside the workspace (not under /tmp, which every agent
    // may write, as its temp).
    let other = w.home.path().join("projects/other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("README"), "another project").unwrap();
    let other = other.display();

    // The seven holes: the data directory's keys and device store, the user's credential
    // files, a grandchild's read, and writes into home and another project.
    for command in [
        format!("cat {data}/credentials.json"),
        format!("base64 {data}/credentials.json"),
        format!("head -c 64 {data}/pi-host.db"),
        "cat ~/.ssh/id_ed25519".to_string(),
        "cat ~/.aws/credentials".to_string(),
        "cat ~/.netrc".to_string(),
        format!("sh -c 'sh -c \"cat {data}/credentials.json\"'"),
        "echo planted > ~/planted".to_string(),
        format!("echo planted > {other}/planted"),
    ] {
        refused(&mut client, &session, &command).await;
    }
    if which("python3") {
        let read = format!("python3 -c 'print(open(\"{data}/credentials.json\").read())'");
        refused(&mut client, &session, &read).await;
    }
    assert!(!w.home.path().join("planted").exists());
    assert!(!w.home.path().join("projects/other/planted").exists());

    // The host's admin socket mints owner tokens: a sandboxed process gets none, whether the
    // kernel refuses the connection (Landlock ABI 9) or the host refuses the peer.
    let pair = format!(
        "{} --data-dir {data} pair --json --roles owner",
        tests::pi_host_binary().display()
    );
    let (output, code) = bash(&mut client, &session, &pair).await;
    assert_ne!(code, 0, "{output}");
    assert!(
        !output.contains("expiresAt"),
        "a token was minted: {output}"
    );
    assert!(
        output.contains("sandbox") || output.contains("Permission denied"),
        "{output}"
    );

    // The control: work in the workspace, temp files, reading other projects.
    let (output, code) = bash(
        &mut client,
        &session,
        "echo made > inside.txt && mkdir -p sub && echo deep > sub/f && cat inside.txt sub/f \
         && t=$(mktemp) && echo temp > $t && cat $t && cat ~/projects/other/README",
    )
    .await;
    assert_eq!(
        (output.as_str(), code),
        ("made\ndeep\ntemp\nanother project", 0)
    );
    let workspace = w.home.path().join("projects/w");
    assert_eq!(
        std::fs::read_to_string(workspace.join("sub/f")).unwrap(),
        "deep\n"
    );
}

#[tokio::test]
async fn a_models_tool_call_and_its_children_meet_the_same_refusals() {
    let w = world(&[], &[]).await;
    let mut client = connect(&w.host, &w.token).await;
    let session = client.open_session(&workspace(&w, "w")).await;
    let data = w.host.data_dir.path().canonicalize().unwrap();
    // Spelled so the policy's scan of a command does not see the paths: the kernel refuses.
    let key = "d=.ssh; cat ~/$d/id_ed25519";
    let store = format!(
        "sh -c 'cat \"$(printf %s {})\"/credentials.json'",
        data.display()
    );
    w.stub.script(&[
        ("bash", json!({"command": key})),
        ("bash", json!({"command": store})),
        ("bash", json!({"command": "echo from-the-model > made.txt"})),
    ]);
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session, "idempotencyKey": "k1", "text": "go"}),
        )
        .await;
    assert!(started.get("result").is_some(), "{started}");
    client
        .events_until(WAIT, |e| e["type"] == "turn.finished")
        .await;
    let requests = w.stub.requests.lock().unwrap().clone();
    let results: Vec<String> = requests
        .iter()
        .filter_map(|r| r["messages"].as_array()?.last().cloned())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect();
    assert_eq!(results.len(), 3, "{results:#?}");
    for result in &results[..2] {
        assert!(result.contains("Permission denied"), "{result}");
        assert!(
            !result.contains(KEY) && !result.contains(PROVIDER_KEY),
            "{result}"
        );
    }
    let made = w.home.path().join("projects/w/made.txt");
    assert_eq!(std::fs::read_to_string(made).unwrap(), "from-the-model\n");
}

#[tokio::test]
async fn a_restart_after_kill_9_sandboxes_the_new_agent_too() {
    let w = world(&[], &[]).await;
    let mut client = connect(&w.host, &w.token).await;
    let session = client.open_session(&workspace(&w, "w")).await;
    refused(&mut client, &session, "cat ~/.ssh/id_ed25519").await;
    drop(client);
    let World {
        mut host,
        _pi_dir,
        _temp,
        home,
        token,
        ..
    } = w;
    host.kill().await;
    let agent = shell_words::join(tests::pi::pi_words(&tests::pi::pi_cli(), None));
    let host = host
        .restart(&["--agent", &agent, "--permission-mode", "auto"])
        .await;
    let mut client = connect(&host, &token).await;
    refused(&mut client, &session, "cat ~/.ssh/id_ed25519").await;
    refused(&mut client, &session, "echo x > ~/planted").await;
    assert!(!home.path().join("planted").exists());
}

/// On a kernel without Landlock (switched off for the test) the host starts, says so once, and
/// reports `none` with the reason instead of pretending; the owner's `--sandbox off` says so too.
#[tokio::test]
async fn without_landlock_the_host_says_unavailable_rather_than_pretend() {
    let w = world(&[], &[("PI_HOST_TEST_NO_LANDLOCK", "1")]).await;
    let mut client = connect(&w.host, &w.token).await;
    let info = client.call("host/info", json!({})).await["result"].clone();
    assert_eq!(info["sandbox"]["kind"], "none", "{info}");
    assert!(
        info["sandbox"]["unavailable"]
            .as_str()
            .unwrap()
            .contains("Landlock"),
        "{info}"
    );
    assert!(
        !info["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("sandbox"))
    );
    let log = w.host.log();
    assert_eq!(log.matches("WITHOUT a sandbox").count(), 1, "{log}");
    // Nothing pretends: the agent reads what the user can.
    let session = client.open_session(&workspace(&w, "w")).await;
    let (output, code) = bash(&mut client, &session, "cat ~/.ssh/id_ed25519").await;
    assert_eq!((output.trim(), code), (KEY, 0));

    let off = world(&["--sandbox", "off"], &[]).await;
    let mut client = connect(&off.host, &off.token).await;
    let info = client.call("host/info", json!({})).await["result"].clone();
    assert_eq!(info["sandbox"]["mode"], "off", "{info}");
    assert_eq!(info["sandbox"]["kind"], "none", "{info}");
}

/// The user's home for a test: anywhere, since the agents' system temp is the test's own.
fn outside_temp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn which(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A person's grant to write outside the workspace reaches the kernel's ruleset from the next
/// turn: the call allowed in the turn that granted it still meets the old ruleset (EACCES, the
/// tool's ordinary error), then the agent restarts between turns (`session.agent_stopped`,
/// reason `sandbox`) and the same write succeeds. Plan mode makes the sandbox read-only.
#[tokio::test]
async fn a_grant_widens_the_sandbox_from_the_next_turn_and_plan_mode_reads_only() {
    let w = world(&[], &[]).await;
    let mut client = connect(&w.host, &w.token).await;
    let session = client.open_session(&workspace(&w, "w")).await;
    let other = w.home.path().join("projects/other");
    std::fs::create_dir_all(&other).unwrap();
    let target = other.join("notes.md");
    let write = |text: &str| ("write", json!({"path": target, "content": text}));

    w.stub.script(&[write("first")]);
    turn(&mut client, &session, "k1").await;
    let asked = client
        .events_until(WAIT, |e| e["type"] == "approval.requested")
        .await;
    let asked = asked.last().unwrap();
    let answer =
        json!({"approvalId": asked["data"]["approvalId"], "decision": {"value": "always"}});
    let reply = client.call("approval/respond", answer).await;
    assert_eq!(reply["result"]["approval"]["state"], "allowed", "{reply}");
    client
        .events_until(WAIT, |e| e["type"] == "turn.finished")
        .await;
    assert!(
        !target.exists(),
        "the running agent's ruleset predates the grant"
    );
    let last = w.stub.requests.lock().unwrap().last().cloned().unwrap();
    let result = last["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .to_string();
    assert!(
        result.contains("EACCES") || result.contains("permission denied"),
        "{result}"
    );

    w.stub.script(&[write("second")]);
    turn(&mut client, &session, "k2").await;
    let events = client
        .events_until(WAIT, |e| e["type"] == "turn.finished")
        .await;
    let stopped = events
        .iter()
        .find(|e| e["type"] == "session.agent_stopped")
        .unwrap_or_else(|| panic!("no restart: {events:#?}"));
    assert_eq!(stopped["data"]["reason"], "sandbox");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "second");

    // Plan mode: the agent (and the user's own shell through it) writes nothing but temp.
    let configured = client
        .call(
            "session/configure",
            json!({"sessionId": session, "permissionMode": "plan"}),
        )
        .await;
    assert!(configured.get("result").is_some(), "{configured}");
    refused(&mut client, &session, "echo x > inside.txt").await;
    let (output, code) = bash(
        &mut client,
        &session,
        "t=$(mktemp) && echo temp > $t && cat $t && cat ~/projects/other/notes.md",
    )
    .await;
    assert_eq!((output.as_str(), code), ("temp\nsecond", 0));
}

async fn turn(client: &mut Client, session: &str, key: &str) {
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session, "idempotencyKey": key, "text": "go"}),
        )
        .await;
    assert!(started.get("result").is_some(), "{started}");
}

/// Builds in the workspace work in the sandbox: npm installs a package through its cache in
/// `~/.npm`, and cargo builds a crate with its registry cache and locks in `~/.cargo`; neither
/// may write anywhere else in home.
#[tokio::test]
async fn builds_in_the_workspace_fill_the_listed_caches() {
    let home = outside_temp();
    let cargo_home = home.path().join(".cargo");
    std::fs::create_dir_all(cargo_home.join("registry")).unwrap();
    for lock in [".package-cache", ".package-cache-mutate"] {
        std::fs::write(cargo_home.join(lock), "").unwrap();
    }
    std::fs::create_dir_all(home.path().join(".npm")).unwrap();
    // A package to install, packed outside the sandbox.
    let package = home.path().join("tiny");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(
        package.join("package.json"),
        r#"{"name":"tiny","version":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::write(package.join("index.js"), "module.exports = 'tiny-ok';").unwrap();
    let packed = std::process::Command::new("npm")
        .args(["pack", "--silent"])
        .current_dir(home.path())
        .arg(&package)
        .env("npm_config_cache", home.path().join(".npm"))
        .output()
        .unwrap();
    assert!(packed.status.success(), "{packed:?}");
    let rustup = std::env::var("RUSTUP_HOME")
        .unwrap_or_else(|_| format!("{}/.rustup", std::env::var("HOME").unwrap()));
    let cargo = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v cargo"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let cargo_bin = Path::new(cargo.trim())
        .parent()
        .unwrap()
        .display()
        .to_string();
    let path = format!("{cargo_bin}:{}", std::env::var("PATH").unwrap());
    let env = [
        ("RUSTUP_HOME", rustup.as_str()),
        ("CARGO_HOME", cargo_home.to_str().unwrap()),
        ("PATH", path.as_str()),
    ];
    let w = world_in(home, &[], &env).await;
    let mut client = connect(&w.host, &w.token).await;
    let session = client.open_session(&workspace(&w, "build")).await;
    let npm = "npm install --offline --no-audit --no-fund --no-update-notifier ~/tiny-1.0.0.tgz >/dev/null \
               && node -e \"console.log(require('tiny'))\"";
    let (output, code) = bash(&mut client, &session, npm).await;
    assert_eq!((output.trim(), code), ("tiny-ok", 0));
    // A crate of its own (`[workspace]`: whatever encloses the test's home, cargo looks no higher).
    let crate_dir = "mkdir -p src && cat > src/main.rs <<'E'\nfn main() { println!(\"built-ok\"); }\nE\n\
                     cat > Cargo.toml <<'E'\n[package]\nname = \"built\"\nversion = \"0.1.0\"\n\
                     edition = \"2021\"\n[workspace]\nE\n\
                     cargo build --quiet --offline && ./target/debug/built";
    let (output, code) = bash(&mut client, &session, crate_dir).await;
    assert_eq!((output.trim(), code), ("built-ok", 0), "{output}");
    // The rest of home stays out of reach.
    refused(&mut client, &session, "touch ~/.cargo/config.toml").await;
}

/// The owner may run one project without the sandbox (`--sandbox-off-in`): its sessions' agents
/// have the user's whole account, while every other session stays sandboxed. No device can ask
/// for it.
#[tokio::test]
async fn the_owner_runs_a_chosen_project_without_the_sandbox_and_only_that_one() {
    let home = outside_temp();
    let trusted = home.path().join("projects/trusted");
    std::fs::create_dir_all(&trusted).unwrap();
    let off = format!("--sandbox-off-in={}", trusted.display());
    let w = world_in(home, &[&off], &[]).await;
    let mut client = connect(&w.host, &w.token).await;
    let open = client.open_session(&workspace(&w, "trusted")).await;
    let (output, code) = bash(&mut client, &open, "cat ~/.ssh/id_ed25519").await;
    assert_eq!((output.trim(), code), (KEY, 0));
    let confined = client.open_session(&workspace(&w, "other")).await;
    refused(&mut client, &confined, "cat ~/.ssh/id_ed25519").await;
    let info = client.call("host/info", json!({})).await["result"].clone();
    assert_eq!(info["sandbox"]["kind"], "landlock", "{info}");
}

/// In a git workspace the agent commits, but its `.git/hooks` and `.git/config` are read-only:
/// a planted hook (or `core.hooksPath`) would run later as the user, outside any sandbox.
#[tokio::test]
async fn git_works_in_the_workspace_but_its_hooks_and_config_stay_read_only() {
    let w = world(&[], &[]).await;
    let repo = workspace(&w, "repo");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(&repo)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q"]);
    let config = std::fs::read_to_string(format!("{repo}/.git/config")).unwrap();
    let mut client = connect(&w.host, &w.token).await;
    let session = client.open_session(&repo).await;
    let (output, code) = bash(
        &mut client,
        &session,
        "echo one > f && git add f && git -c user.email=a@b -c user.name=n commit -qm one \
         && git log --oneline | wc -l",
    )
    .await;
    assert_eq!((output.trim(), code), ("1", 0), "{output}");
    for plant in [
        "echo 'touch ~/owned' > .git/hooks/pre-commit",
        "git config core.hooksPath /tmp/hooks",
        "rm -rf .git/hooks",
    ] {
        let (output, code) = bash(&mut client, &session, plant).await;
        assert_ne!(code, 0, "{plant} ran: {output}");
    }
    assert!(!Path::new(&repo).join(".git/hooks/pre-commit").exists());
    let after = std::fs::read_to_string(format!("{repo}/.git/config")).unwrap();
    assert_eq!(after, config);
}
