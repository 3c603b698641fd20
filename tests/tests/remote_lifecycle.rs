//! Living with a remote `pi-remote connect` made, against a real OpenSSH sshd on loopback (the
//! "remote" is this machine): `connect --background` and `disconnect`, `remotes`, `logs`,
//! `doctor` on a good and a broken remote, and `uninstall` (of a reachable remote, and of one
//! SSH cannot reach). One provisioned remote per test.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;
use tests::sshd::{SshServer, SshdOptions};
use tests::{PATIENCE, pi_host_binary, stand_in_agent, workspace_binary};
use tokio::io::{AsyncBufReadExt, BufReader};

fn pi_remote() -> PathBuf {
    let this_test = std::env::current_exe().unwrap();
    workspace_binary("bootstrap", "pi-remote", Some(&this_test))
}

/// One sshd, one install root, one local pi-remote config directory, one release.
struct World {
    server: SshServer,
    ssh_config: PathBuf,
    root: tempfile::TempDir,
    _workspaces: tempfile::TempDir,
    local_config: tempfile::TempDir,
    _scratch: tempfile::TempDir,
    release: PathBuf,
}

impl World {
    async fn start() -> World {
        let server = SshServer::start(SshdOptions::default()).await;
        let scratch = tempfile::tempdir().unwrap();
        let known_hosts = scratch.path().join("known_hosts");
        std::fs::write(&known_hosts, format!("{}\n", server.known_hosts_line())).unwrap();
        let ssh_config = server.write_ssh_config("box", &known_hosts);
        let root = tempfile::tempdir().unwrap();
        let workspaces = tempfile::tempdir().unwrap();
        // The operator's own config for the remote host: it must survive an uninstall.
        std::fs::write(
            root.path().join("config.toml"),
            format!(
                "agent = {:?}\nroots = [{:?}]\n",
                stand_in_agent().display().to_string(),
                workspaces.path().display().to_string()
            ),
        )
        .unwrap();
        let release = release(scratch.path());
        World {
            server,
            ssh_config,
            root,
            _workspaces: workspaces,
            local_config: tempfile::tempdir().unwrap(),
            _scratch: scratch,
            release,
        }
    }

    /// `pi-remote ARGS` with this world's config directory, no agent, no askpass, no terminal.
    fn pi_remote(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(pi_remote());
        command
            .args(args)
            .env("PI_REMOTE_CONFIG_DIR", self.local_config.path())
            .env_remove("PI_REMOTE_PROFILE")
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// `pi-remote --json connect box --background` into this world's install root.
    fn connect_background(&self) -> tokio::process::Command {
        let mut command = self.pi_remote(&["--json", "connect", "box", "--background", "-F"]);
        command
            .arg(&self.ssh_config)
            .arg("--release-dir")
            .arg(&self.release)
            .arg("--remote-dir")
            .arg(self.root.path())
            .env(
                "PI_REMOTE_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("pi-remote-cache"),
            )
            .env("npm_config_offline", "true");
        command
    }

    fn profile(&self) -> Value {
        let path = self.local_config.path().join("profiles/default.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    fn stop_host(&self) {
        let stopped = std::process::Command::new("sh")
            .arg(self.root.path().join("install.sh"))
            .args(["stop", "--root"])
            .arg(self.root.path())
            .output()
            .unwrap();
        assert!(stopped.status.success(), "{stopped:?}");
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // The forward and the host are daemons: they would outlive the test.
        let _ = std::process::Command::new(pi_remote())
            .args(["disconnect"])
            .env("PI_REMOTE_CONFIG_DIR", self.local_config.path())
            .output();
        let installer = self.root.path().join("install.sh");
        if installer.exists() {
            let _ = std::process::Command::new("sh")
                .arg(installer)
                .args(["stop", "--root"])
                .arg(self.root.path())
                .output();
        }
    }
}

/// deploy/release.sh over a stripped copy of the test build of pi-host.
fn release(scratch: &Path) -> PathBuf {
    let binary = scratch.join("pi-host");
    let stripped = std::process::Command::new("strip")
        .arg("-o")
        .arg(&binary)
        .arg(pi_host_binary())
        .status()
        .unwrap();
    if !stripped.success() {
        std::fs::copy(pi_host_binary(), &binary).unwrap();
    }
    let out = scratch.join("release");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let made = std::process::Command::new(repo.join("deploy/release.sh"))
        .arg("--binary")
        .arg(&binary)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    out
}

async fn run(mut command: tokio::process::Command) -> Output {
    tokio::time::timeout(PATIENCE * 4, command.output())
        .await
        .expect("pi-remote finished in time")
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn json_lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect()
}

async fn ok_json(world: &World, args: &[&str]) -> Value {
    let output = run(world.pi_remote(args)).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{}", text(&output)))
}

fn port_of(url: &str) -> u16 {
    url.trim_start_matches("wss://127.0.0.1:")
        .trim_end_matches("/racp")
        .parse()
        .unwrap()
}

/// Whether something accepts on the local port, within a bounded wait for `want`.
async fn port_answers_becomes(port: u16, want: bool) -> bool {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let answers = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok();
        if answers == want || tokio::time::Instant::now() >= deadline {
            return answers;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_background_forward_serves_commands_until_disconnect_and_a_second_one_refuses() {
    let world = World::start().await;
    let started = run(world.connect_background()).await;
    assert_eq!(started.status.code(), Some(0), "{}", text(&started));
    let events = json_lines(&started);
    let ready = events.iter().find(|e| e["type"] == "ready").unwrap();
    let pid = ready["background"]["pid"].as_u64().unwrap();
    let port = port_of(ready["url"].as_str().unwrap());
    assert!(tests::sshd::alive(u32::try_from(pid).unwrap()));
    // The terminal is back, and a command goes through the background forward.
    let listed = ok_json(&world, &["--json", "sessions"]).await;
    assert!(listed["sessions"].is_array(), "{listed}");

    // A second one finds the first and leaves it alone.
    let second = run(world.connect_background()).await;
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    let said = json_lines(&second);
    assert_eq!(said.last().unwrap()["type"], "running", "{}", text(&second));
    assert_eq!(said.last().unwrap()["pid"], pid);

    // A foreground connect of the profile would be a second forward: refused, before SSH.
    let foreground = run(world.pi_remote(&["connect", "box"])).await;
    assert_eq!(foreground.status.code(), Some(1), "{}", text(&foreground));
    assert!(
        String::from_utf8_lossy(&foreground.stderr).contains(&format!("already runs (pid {pid})")),
        "{}",
        text(&foreground)
    );

    // remotes: the forward runs, the host answers, seen now; the log has the child's start.
    let remotes = ok_json(&world, &["--json", "remotes"]).await;
    let row = &remotes["remotes"][0];
    assert_eq!(row["forward"]["pid"], pid, "{remotes}");
    assert_eq!(row["reachable"], true, "{remotes}");
    assert_eq!(row["lastSeenAgo"], "now", "{remotes}");
    assert_eq!(row["remote"], "ssh box", "{remotes}");
    let local = run(world.pi_remote(&["logs", "--local"])).await;
    assert!(
        String::from_utf8_lossy(&local.stdout).contains(&format!("(pid {pid})")),
        "{}",
        text(&local)
    );

    let stopped = run(world.pi_remote(&["disconnect"])).await;
    assert_eq!(stopped.status.code(), Some(0), "{}", text(&stopped));
    assert!(
        String::from_utf8_lossy(&stopped.stdout).contains(&format!("pid {pid}")),
        "{}",
        text(&stopped)
    );
    assert!(
        !port_answers_becomes(port, false).await,
        "the port still answers"
    );
    let again = run(world.pi_remote(&["disconnect"])).await;
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("no background connect"),
        "{}",
        text(&again)
    );
    let remotes = ok_json(&world, &["--json", "remotes"]).await;
    assert_eq!(
        remotes["remotes"][0]["forward"]["running"], false,
        "{remotes}"
    );
    assert_eq!(remotes["remotes"][0]["reachable"], false, "{remotes}");
}

#[tokio::test]
async fn logs_doctor_and_uninstall_on_one_remote() {
    let world = World::start().await;
    let started = run(world.connect_background()).await;
    assert_eq!(started.status.code(), Some(0), "{}", text(&started));

    // The host's log, read over SSH: its last line as the remote's file has it.
    let logged = std::fs::read_to_string(world.root.path().join("host.log")).unwrap();
    let last = logged.lines().last().unwrap().to_string();
    let logs = run(world.pi_remote(&["logs", "default", "-n", "5"])).await;
    assert_eq!(logs.status.code(), Some(0), "{}", text(&logs));
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains(&last),
        "{}",
        text(&logs)
    );

    // -f follows: a line the host's log gets later arrives too.
    let mut follow = world
        .pi_remote(&["logs", "-f", "-n", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .unwrap();
    assert_eq!(first.unwrap().as_deref(), Some(last.as_str()));
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(world.root.path().join("host.log"))
        .unwrap();
    writeln!(log, "a line appended by the test").unwrap();
    let next = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .unwrap();
    assert_eq!(
        next.unwrap().as_deref(),
        Some("a line appended by the test")
    );
    follow.kill().await.unwrap();

    // A good remote: every check ok.
    let good = run(world.pi_remote(&["doctor"])).await;
    assert_eq!(good.status.code(), Some(0), "{}", text(&good));
    let lines = String::from_utf8_lossy(&good.stdout).into_owned();
    for name in [
        "ssh", "host key", "pi-host", "tls pin", "clock", "disk", "forward", "agent",
    ] {
        assert!(
            lines
                .lines()
                .any(|l| l.starts_with("ok") && l.contains(name)),
            "{name}: {lines}"
        );
    }

    // A profile that pins another certificate: the pin check names it.
    let path = world.local_config.path().join("profiles/default.json");
    let good_profile = std::fs::read_to_string(&path).unwrap();
    let mut wrong: Value = serde_json::from_str(&good_profile).unwrap();
    wrong["certSha256"] = "00".repeat(32).into();
    std::fs::write(&path, wrong.to_string()).unwrap();
    let pinned = run(world.pi_remote(&["doctor"])).await;
    assert_eq!(pinned.status.code(), Some(7), "{}", text(&pinned));
    let said = String::from_utf8_lossy(&pinned.stdout).into_owned();
    assert!(
        said.lines()
            .any(|l| l.starts_with("problem") && l.contains("tls pin")),
        "{said}"
    );
    std::fs::write(&path, good_profile).unwrap();

    // A broken one: the host stopped (and no forward to restart it).
    run(world.pi_remote(&["disconnect"])).await;
    world.stop_host();
    let broken = run(world.pi_remote(&["--json", "doctor"])).await;
    assert_eq!(broken.status.code(), Some(7), "{}", text(&broken));
    let report: Value = serde_json::from_slice(&broken.stdout).unwrap();
    let host = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "pi-host")
        .unwrap();
    assert_eq!(host["level"], "problem", "{report}");
    assert!(
        host["text"].as_str().unwrap().contains("not running"),
        "{report}"
    );

    // uninstall: asks (refuses without a terminal), then removes what connect installed and
    // keeps the user's files.
    std::fs::write(world.root.path().join("notes.txt"), "mine").unwrap();
    let config = world.root.path().join("config.toml");
    let users = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{users}# a line # written by pi-remote connect\n"),
    )
    .unwrap();
    let refused = run(world.pi_remote(&["uninstall", "default"])).await;
    assert_eq!(refused.status.code(), Some(64), "{}", text(&refused));
    assert!(world.root.path().join("current").exists());
    let pin = world.profile()["certSha256"].clone();
    assert!(pin.is_string());
    let removed = run(world.pi_remote(&["uninstall", "default", "--yes"])).await;
    assert_eq!(removed.status.code(), Some(0), "{}", text(&removed));
    let said = String::from_utf8_lossy(&removed.stdout).into_owned();
    for item in ["versions", "current", "data", "install.sh", "host.log"] {
        let path = world.root.path().join(item);
        assert!(!path.exists(), "{item} left: {said}");
        assert!(said.contains(&path.display().to_string()), "{item}: {said}");
    }
    // The stopped host took its state file with it.
    assert!(!world.root.path().join("state.json").exists());
    assert!(world.root.path().join("notes.txt").exists());
    // The user's lines stay, connect's go.
    assert_eq!(std::fs::read_to_string(&config).unwrap(), users);
    assert!(
        said.contains(&format!("kept {}", world.root.path().display())),
        "{said}"
    );
    assert!(
        !world
            .local_config
            .path()
            .join("profiles/default.json")
            .exists()
    );
}

/// A remote SSH cannot reach: `uninstall` removes nothing and names `--local-only`, which
/// removes the desktop's side alone, touches nothing there and names what stays.
#[tokio::test]
async fn uninstall_of_an_unreachable_remote_removes_only_the_desktops_side_when_told() {
    let mut world = World::start().await;
    let started = run(world.connect_background()).await;
    assert_eq!(started.status.code(), Some(0), "{}", text(&started));
    let events = json_lines(&started);
    let ready = events.iter().find(|e| e["type"] == "ready").unwrap();
    let pid = u32::try_from(ready["background"]["pid"].as_u64().unwrap()).unwrap();
    let device_id = world.profile()["deviceId"].as_str().unwrap().to_string();
    world.server.kill_all().await;
    let profile = world.local_config.path().join("profiles/default.json");

    let refused = run(world.pi_remote(&["uninstall", "default", "--yes"])).await;
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused));
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(said.contains("REMOTE_CONNECTION_FAILED"), "{said}");
    assert!(said.contains("nothing was removed"), "{said}");
    assert!(
        said.contains("pi-remote uninstall default --local-only"),
        "{said}"
    );
    assert!(profile.exists());
    assert!(
        tests::sshd::alive(pid),
        "the refused uninstall stopped the background connect"
    );
    assert!(world.root.path().join("current").exists());

    // At a terminal without --yes: asked whether to uninstall, then, with the remote out of
    // reach, whether to remove only this desktop's side; "no" leaves everything as it was.
    let declined = at_terminal(&world, &["uninstall", "default"], "yes\nno\n").await;
    let screen = text(&declined);
    assert_eq!(declined.status.code(), Some(3), "{screen}");
    assert!(screen.contains("Stop pi-host on box"), "{screen}");
    assert!(
        screen.contains("Remove only this desktop's side of \"default\""),
        "{screen}"
    );
    assert!(screen.contains("--local-only"), "{screen}");
    assert!(profile.exists());
    assert!(
        tests::sshd::alive(pid),
        "a declined uninstall stopped the background connect"
    );
    let saved_profile = std::fs::read(&profile).unwrap();

    let removed = run(world.pi_remote(&["--json", "uninstall", "default", "--local-only"])).await;
    assert_eq!(removed.status.code(), Some(0), "{}", text(&removed));
    let report: Value = serde_json::from_slice(&removed.stdout).unwrap();
    let lines = report["removed"].to_string();
    assert!(lines.contains(&profile.display().to_string()), "{report}");
    assert!(lines.contains(&format!("pid {pid}")), "{report}");
    assert!(!profile.exists());
    assert!(!world.local_config.path().join("run/default.log").exists());
    assert!(
        !tests::sshd::alive(pid),
        "the background connect still runs"
    );
    let left = &report["leftOnRemote"];
    assert_eq!(left["target"], "box", "{report}");
    let items = left["items"].to_string();
    assert!(
        items.contains(&world.root.path().display().to_string()),
        "{report}"
    );
    assert!(items.contains("pi-host-*.service"), "{report}");
    assert!(items.contains(&device_id), "{report}");
    // The remote was not touched: what connect installed is all still there.
    for item in ["current", "install.sh", "data"] {
        assert!(world.root.path().join(item).exists(), "{item}");
    }

    // "yes" to both questions does what --local-only does.
    std::fs::write(&profile, saved_profile).unwrap();
    let accepted = at_terminal(&world, &["uninstall", "default"], "yes\nyes\n").await;
    let screen = text(&accepted);
    assert_eq!(accepted.status.code(), Some(0), "{screen}");
    assert!(screen.contains(&profile.display().to_string()), "{screen}");
    assert!(screen.contains(&device_id), "{screen}");
    assert!(!profile.exists());
    assert!(world.root.path().join("current").exists());
}

/// `pi-remote ARGS` at a terminal (util-linux's `script` gives it one), `typed` its answers.
async fn at_terminal(world: &World, args: &[&str], typed: &str) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut line = sh_word(&pi_remote().display().to_string());
    for arg in args {
        line.push(' ');
        line.push_str(&sh_word(arg));
    }
    let mut command = tokio::process::Command::new("script");
    command
        .args(["-qec", &line, "/dev/null"])
        .env("PI_REMOTE_CONFIG_DIR", world.local_config.path())
        .env_remove("PI_REMOTE_PROFILE")
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("SSH_ASKPASS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("script (util-linux)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(typed.as_bytes()).await.unwrap();
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("pi-remote at a terminal did not end")
        .unwrap();
    drop(stdin);
    output
}

fn sh_word(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}
