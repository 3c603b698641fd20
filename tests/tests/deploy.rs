#![allow(clippy::expect_used, clippy::unwrap_used)]
//! deploy/install.sh and deploy/release.sh, driven through a real OpenSSH server and client the
//! way the bootstrapper drives them: upload into `R/staging`, install, start, stop, status. Each
//! test has its own sshd and its own install root; the "remote" is this machine.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};
use tests::PATIENCE;
use tests::sshd::{SshServer, SshdOptions, alive};

/// A remote command may upload or unpack a 100 MB debug build on a loaded machine.
const COMMAND_PATIENCE: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Single-quotes `s` for a POSIX shell.
fn q(s: impl AsRef<str>) -> String {
    format!("'{}'", s.as_ref().replace('\'', r"'\''"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn last_line(output: &Output) -> String {
    text(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

fn describe(output: &Output) -> String {
    format!(
        "status {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status.code(),
        text(&output.stdout),
        text(&output.stderr)
    )
}

/// A release of the debug pi-host made by deploy/release.sh, shared by the tests (nextest runs
/// each in its own process): built once per binary and script contents under the target dir,
/// behind a lock directory so concurrent tests do not all compress 100 MB at once.
struct Release {
    dir: PathBuf,
    version: String,
}

impl Release {
    fn artifact(&self) -> PathBuf {
        let os = std::env::consts::OS;
        let arch = std::env::consts::ARCH;
        self.dir
            .join(format!("pi-host-{}-{os}-{arch}.tar.gz", self.version))
    }
    fn installer(&self) -> PathBuf {
        self.dir.join("install.sh")
    }
}

fn release() -> Release {
    use std::hash::{Hash, Hasher};
    let binary = tests::pi_host_binary();
    let mut hasher = std::hash::DefaultHasher::new();
    let meta = std::fs::metadata(&binary).expect("pi-host binary");
    (meta.len(), meta.modified().ok()).hash(&mut hasher);
    for script in ["install.sh", "release.sh", "pi-host.service"] {
        std::fs::read(repo().join("deploy").join(script))
            .expect("deploy script")
            .hash(&mut hasher);
    }
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-release");
    std::fs::create_dir_all(&base).expect("create release cache");
    let dir = base.join(format!("{:016x}", hasher.finish()));
    let lock = base.join(format!("{:016x}.lock", hasher.finish()));
    let deadline = Instant::now() + COMMAND_PATIENCE * 2;
    while !dir.join("manifest.json").exists() {
        if std::fs::create_dir(&lock).is_ok() {
            std::fs::write(lock.join("pid"), std::process::id().to_string()).unwrap();
            let out = lock.join("out");
            let output = std::process::Command::new("sh")
                .arg(repo().join("deploy/release.sh"))
                .arg("--binary")
                .arg(&binary)
                .arg("--out")
                .arg(&out)
                .output()
                .expect("run release.sh");
            if output.status.success() {
                std::fs::rename(&out, &dir).expect("publish release");
                // Releases of older binaries or scripts are not needed any more.
                for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                    let path = entry.path();
                    if path != dir && path.extension().is_none() {
                        let _ = std::fs::remove_dir_all(path);
                    }
                }
            }
            let _ = std::fs::remove_dir_all(&lock);
            assert!(output.status.success(), "release.sh: {}", describe(&output));
            break;
        }
        // Another test builds it; take over when that process died.
        let owner = std::fs::read_to_string(lock.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok());
        if owner.is_some_and(|pid| !alive(pid)) {
            let _ = std::fs::remove_dir_all(&lock);
        }
        assert!(Instant::now() < deadline, "waited too long for the release");
        std::thread::sleep(Duration::from_millis(100));
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    Release {
        version: manifest["version"].as_str().unwrap().to_string(),
        dir,
    }
}

/// One sshd, a client config that trusts it, and an install root.
struct Remote {
    server: SshServer,
    config: PathBuf,
    _scratch: tempfile::TempDir,
    root: PathBuf,
}

const ALIAS: &str = "remote";

impl Remote {
    async fn new() -> Remote {
        Remote::with(SshdOptions::default()).await
    }

    async fn with(options: SshdOptions) -> Remote {
        let server = SshServer::start(options).await;
        let known_hosts = server.dir().join("known_hosts");
        std::fs::write(&known_hosts, server.known_hosts_line() + "\n").unwrap();
        let config = server.write_ssh_config(ALIAS, &known_hosts);
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().join("pi-host root");
        Remote {
            server,
            config,
            root,
            _scratch: scratch,
        }
    }

    fn root_str(&self) -> &str {
        self.root.to_str().unwrap()
    }

    /// Runs `command` through `ssh` (the remote user's shell reads it).
    async fn ssh(&self, command: &str) -> Output {
        self.ssh_with_stdin(command, Stdio::null()).await
    }

    async fn ssh_with_stdin(&self, command: &str, stdin: Stdio) -> Output {
        let mut ssh = self.server.openssh(&self.config, ALIAS);
        ssh.arg(command).stdin(stdin);
        tokio::time::timeout(COMMAND_PATIENCE, ssh.output())
            .await
            .unwrap_or_else(|_| panic!("ssh {command:?} did not finish in time"))
            .expect("run ssh")
    }

    /// Copies a local file to `R/staging/<name>` with `cat >` over ssh.
    async fn upload(&self, local: &Path, name: &str) -> String {
        let remote = format!("{}/staging/{name}", self.root_str());
        let command = format!(
            "mkdir -p {} && cat > {}.part && mv -f {}.part {}",
            q(format!("{}/staging", self.root_str())),
            q(&remote),
            q(&remote),
            q(&remote)
        );
        let file = std::fs::File::open(local).expect("open upload");
        let output = self.ssh_with_stdin(&command, Stdio::from(file)).await;
        assert!(output.status.success(), "upload: {}", describe(&output));
        remote
    }

    /// Uploads the release's installer and artifact.
    async fn stage(&self, release: &Release) -> String {
        self.upload(&release.installer(), "install.sh").await;
        self.upload(&release.artifact(), "pi-host.tar.gz").await
    }

    /// `sh R/staging/install.sh <args> --root R` over ssh.
    async fn install_sh(&self, args: &str) -> Output {
        let script = format!("{}/staging/install.sh", self.root_str());
        self.ssh(&format!(
            "sh {} {args} --root {}",
            q(script),
            q(self.root_str())
        ))
        .await
    }

    async fn install(&self, version: &str, artifact: &str) -> Output {
        self.install_sh(&format!(
            "install --version {} --artifact {}",
            q(version),
            q(artifact)
        ))
        .await
    }

    fn current(&self) -> String {
        std::fs::read_link(self.root.join("current"))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    /// Entries of R/versions, sorted (including hidden temporary ones).
    fn versions(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root.join("versions"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn state(&self) -> Option<serde_json::Value> {
        let bytes = std::fs::read(self.root.join("state.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Installs the release and starts it; returns the state line `start` printed.
    async fn install_and_start(&self, release: &Release) -> serde_json::Value {
        let artifact = self.stage(release).await;
        let output = self.install(&release.version, &artifact).await;
        assert!(output.status.success(), "install: {}", describe(&output));
        let output = self.install_sh("start").await;
        assert!(output.status.success(), "start: {}", describe(&output));
        serde_json::from_str(&last_line(&output)).expect("start prints state.json")
    }

    /// Stops any host under this root when dropped, even when the test failed.
    fn guard(&self) -> HostGuard {
        HostGuard(self.root.clone())
    }
}

/// Runs `install.sh stop` locally for a root (sshd may be dead by then) and SIGKILLs whatever
/// state.json still names.
struct HostGuard(PathBuf);

impl Drop for HostGuard {
    fn drop(&mut self) {
        let pid = std::fs::read(self.0.join("state.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|s| s["pid"].as_u64());
        let _ = std::process::Command::new("sh")
            .arg(repo().join("deploy/install.sh"))
            .args(["stop", "--wait-seconds", "5", "--root"])
            .arg(&self.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(pid) = pid {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

async fn wait_until_dead(pid: u32) {
    let deadline = Instant::now() + PATIENCE;
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pid_of(state: &serde_json::Value) -> u32 {
    state["pid"].as_u64().expect("pid in state") as u32
}

/// A tarball whose bin/pi-host is `contents`.
fn bad_artifact(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let stage = dir.join(format!("{name}.d"));
    std::fs::create_dir_all(stage.join("bin")).unwrap();
    let bin = stage.join("bin/pi-host");
    std::fs::write(&bin, contents).unwrap();
    std::process::Command::new("chmod")
        .arg("755")
        .arg(&bin)
        .status()
        .unwrap();
    let artifact = dir.join(format!("{name}.tar.gz"));
    let status = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&artifact)
        .arg("-C")
        .arg(&stage)
        .arg("bin")
        .status()
        .unwrap();
    assert!(status.success());
    artifact
}

#[tokio::test]
async fn cold_install_then_start_status_and_stop() {
    let release = release();
    let remote = Remote::new().await;
    let _guard = remote.guard();
    let artifact = remote.stage(&release).await;

    let output = remote.install(&release.version, &artifact).await;
    assert!(output.status.success(), "install: {}", describe(&output));
    let version_dir = remote.root.join("versions").join(&release.version);
    assert_eq!(
        last_line(&output),
        format!(
            "installed version={} path={}",
            release.version,
            version_dir.display()
        )
    );
    assert_eq!(remote.current(), format!("versions/{}", release.version));
    assert_eq!(remote.versions(), vec![release.version.clone()]);
    assert_eq!(
        std::fs::read(remote.root.join("install.sh")).unwrap(),
        std::fs::read(release.installer()).unwrap(),
        "the installer keeps a copy of itself"
    );

    let output = remote.install_sh("status").await;
    assert_eq!(last_line(&output), "stopped", "{}", describe(&output));

    let output = remote.install_sh("start").await;
    assert!(output.status.success(), "start: {}", describe(&output));
    let printed: serde_json::Value =
        serde_json::from_str(&last_line(&output)).expect("start prints the state as JSON");
    let state = remote.state().expect("state.json after start");
    assert_eq!(printed, state);
    let listen: std::net::SocketAddr = state["listen"].as_str().unwrap().parse().unwrap();
    assert!(listen.ip().is_loopback(), "bound to {listen}");
    assert_ne!(listen.port(), 0);
    assert_eq!(state["version"], release.version.as_str());
    tokio::net::TcpStream::connect(listen)
        .await
        .expect("the host accepts connections");
    let pid = pid_of(&state);
    assert!(alive(pid));

    let output = remote.install_sh("status").await;
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(
        last_line(&output),
        format!(
            "running pid={pid} version={} listen={listen}",
            release.version
        )
    );

    let output = remote.install_sh("stop").await;
    assert!(output.status.success(), "stop: {}", describe(&output));
    wait_until_dead(pid).await;
    assert!(remote.state().is_none(), "state.json removed at exit");
    assert!(
        tokio::net::TcpStream::connect(listen).await.is_err(),
        "nothing listens after stop"
    );
    let output = remote.install_sh("status").await;
    assert_eq!(last_line(&output), "stopped");
    // Stopping what is not running is fine too.
    let output = remote.install_sh("stop").await;
    assert!(
        output.status.success(),
        "second stop: {}",
        describe(&output)
    );
}

#[tokio::test]
async fn install_twice_is_idempotent() {
    let release = release();
    let remote = Remote::new().await;
    let artifact = remote.stage(&release).await;
    let first = remote.install(&release.version, &artifact).await;
    assert!(first.status.success(), "first: {}", describe(&first));
    let second = remote.install(&release.version, &artifact).await;
    assert!(second.status.success(), "second: {}", describe(&second));
    assert_eq!(last_line(&first), last_line(&second));
    assert_eq!(remote.current(), format!("versions/{}", release.version));
    assert_eq!(remote.versions(), vec![release.version.clone()]);
    // An installed version needs no artifact (the bootstrapper skips the upload).
    let third = remote
        .install_sh(&format!("install --version {}", q(&release.version)))
        .await;
    assert!(third.status.success(), "third: {}", describe(&third));
    assert_eq!(last_line(&first), last_line(&third));
    // A version that is not installed does.
    let output = remote.install_sh("install --version 9.9.9").await;
    assert_eq!(output.status.code(), Some(11), "{}", describe(&output));
    assert_eq!(remote.versions(), vec![release.version.clone()]);
}

#[tokio::test]
async fn bad_usage_is_exit_11() {
    let release = release();
    let remote = Remote::new().await;
    remote.upload(&release.installer(), "install.sh").await;
    for args in [
        "frobnicate",
        "install --version",
        "install --version ../evil --artifact x",
        "start --wait-seconds soon",
        "install --version 1 --bogus 2",
    ] {
        let output = remote.install_sh(args).await;
        assert_eq!(
            output.status.code(),
            Some(11),
            "{args}: {}",
            describe(&output)
        );
        assert!(
            text(&output.stderr).starts_with("install.sh: "),
            "{args}: {}",
            describe(&output)
        );
    }
}

#[tokio::test]
async fn corrupt_artifact_is_refused_and_changes_nothing() {
    let release = release();
    let remote = Remote::new().await;
    let artifact = remote.stage(&release).await;
    let output = remote.install(&release.version, &artifact).await;
    assert!(output.status.success(), "install: {}", describe(&output));

    // A truncated upload.
    let full = std::fs::read(release.artifact()).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let truncated = scratch.path().join("truncated.tar.gz");
    std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
    let truncated = remote.upload(&truncated, "truncated.tar.gz").await;
    let output = remote.install("2.0.0", &truncated).await;
    assert_eq!(output.status.code(), Some(12), "{}", describe(&output));
    assert!(
        text(&output.stderr).starts_with("install.sh: "),
        "{}",
        describe(&output)
    );
    assert_eq!(remote.current(), format!("versions/{}", release.version));
    assert_eq!(remote.versions(), vec![release.version.clone()]);

    // Not a tarball at all, a tarball without bin/pi-host, and no file.
    let junk = scratch.path().join("junk.tar.gz");
    std::fs::write(&junk, b"this is not gzip").unwrap();
    let junk = remote.upload(&junk, "junk.tar.gz").await;
    let empty = bad_artifact(scratch.path(), "empty", b"");
    std::fs::remove_file(scratch.path().join("empty.d/bin/pi-host")).unwrap();
    let status = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&empty)
        .arg("-C")
        .arg(scratch.path().join("empty.d"))
        .arg("bin")
        .status()
        .unwrap();
    assert!(status.success());
    let empty = remote.upload(&empty, "empty.tar.gz").await;
    for artifact in [junk.as_str(), empty.as_str(), "/nonexistent/pi-host.tar.gz"] {
        let output = remote.install("2.0.0", artifact).await;
        assert_eq!(
            output.status.code(),
            Some(12),
            "{artifact}: {}",
            describe(&output)
        );
        assert_eq!(remote.current(), format!("versions/{}", release.version));
        assert_eq!(remote.versions(), vec![release.version.clone()]);
    }
}

#[tokio::test]
async fn a_binary_that_does_not_run_is_refused_and_the_old_host_keeps_running() {
    let release = release();
    let remote = Remote::new().await;
    let _guard = remote.guard();
    let state = remote.install_and_start(&release).await;
    let pid = pid_of(&state);

    let scratch = tempfile::tempdir().unwrap();
    let failing = bad_artifact(
        scratch.path(),
        "failing",
        b"#!/bin/sh\necho 'wrong libc' >&2\nexit 1\n",
    );
    let garbage = bad_artifact(
        scratch.path(),
        "garbage",
        &[0x7f, b'E', b'L', b'F', 0, 1, 2, 3],
    );
    for (name, artifact) in [("failing", failing), ("garbage", garbage)] {
        let artifact = remote.upload(&artifact, &format!("{name}.tar.gz")).await;
        let output = remote.install("2.0.0", &artifact).await;
        assert_eq!(
            output.status.code(),
            Some(13),
            "{name}: {}",
            describe(&output)
        );
        assert!(
            text(&output.stderr).starts_with("install.sh: "),
            "{name}: {}",
            describe(&output)
        );
        if name == "failing" {
            assert!(
                text(&output.stderr).contains("wrong libc"),
                "the binary's stderr is shown: {}",
                describe(&output)
            );
        }
        assert_eq!(remote.current(), format!("versions/{}", release.version));
        assert_eq!(remote.versions(), vec![release.version.clone()]);
        assert!(alive(pid), "the running host was left alone");
        assert_eq!(remote.state().as_ref(), Some(&state));
    }
    let output = remote.install_sh("status").await;
    assert!(
        last_line(&output).starts_with(&format!("running pid={pid} ")),
        "{}",
        describe(&output)
    );
}

#[tokio::test]
async fn concurrent_installs_never_break_current() {
    let release = release();
    let remote = Remote::new().await;
    let artifact = remote.stage(&release).await;
    let (a, b, c) = tokio::join!(
        remote.install(&release.version, &artifact),
        remote.install(&release.version, &artifact),
        remote.install("0.0.1-other", &artifact),
    );
    for output in [&a, &b, &c] {
        assert!(output.status.success(), "{}", describe(output));
    }
    assert_eq!(last_line(&a), last_line(&b));
    let current = remote.current();
    assert!(
        current == format!("versions/{}", release.version) || current == "versions/0.0.1-other",
        "current -> {current}"
    );
    let mut expected = vec!["0.0.1-other".to_string(), release.version.clone()];
    expected.sort();
    assert_eq!(remote.versions(), expected, "no temporary directories left");
    let output = std::process::Command::new(remote.root.join("current/bin/pi-host"))
        .args(["version", "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "current runs: {}",
        describe(&output)
    );
    assert!(!remote.root.join("install.lock.d").exists());
}

#[tokio::test]
async fn the_daemon_survives_the_ssh_session_and_sshd() {
    let release = release();
    let mut remote = Remote::new().await;
    let _guard = remote.guard();
    let state = remote.install_and_start(&release).await;
    let pid = pid_of(&state);
    let listen: std::net::SocketAddr = state["listen"].as_str().unwrap().parse().unwrap();

    // Its own session, so the SSH session's end does not reach it.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    assert_eq!(fields[3], pid.to_string(), "session id (stat: {stat})");

    remote.server.kill_all().await;
    assert!(alive(pid), "pi-host died with sshd");
    tokio::net::TcpStream::connect(listen)
        .await
        .expect("the host still accepts connections");

    remote.server.restart().await;
    let output = remote.install_sh("status").await;
    assert!(
        last_line(&output).starts_with(&format!("running pid={pid} ")),
        "{}",
        describe(&output)
    );
    // A second start replaces the running host (one host per data dir).
    let output = remote.install_sh("start").await;
    assert!(output.status.success(), "restart: {}", describe(&output));
    wait_until_dead(pid).await;
    let state = remote.state().expect("state after the second start");
    assert_ne!(pid_of(&state), pid);
    let output = remote.install_sh("stop").await;
    assert!(output.status.success(), "stop: {}", describe(&output));
    wait_until_dead(pid_of(&state)).await;
}

#[tokio::test]
async fn a_host_that_exits_at_start_is_reported_with_its_log() {
    let remote = Remote::new().await;
    let _guard = remote.guard();
    let release = release();
    remote.stage(&release).await;
    let output = remote
        .install(
            &release.version,
            &format!("{}/staging/pi-host.tar.gz", remote.root_str()),
        )
        .await;
    assert!(output.status.success(), "install: {}", describe(&output));
    // A config file the host cannot parse: it exits before it listens.
    std::fs::write(remote.root.join("config.toml"), "this is = = not toml\n").unwrap();
    let output = remote.install_sh("start --wait-seconds 60").await;
    assert_eq!(output.status.code(), Some(20), "{}", describe(&output));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("install.sh: "), "{stderr}");
    assert!(stderr.contains("last lines of"), "{stderr}");
    assert!(remote.state().is_none());
}

#[tokio::test]
async fn sshd_known_hosts_line_is_accepted_and_a_new_host_key_refused() {
    let mut remote = Remote::new().await;
    let output = remote.ssh("echo hello").await;
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(text(&output.stdout), "hello\n");

    remote.server.kill_all().await;
    let output = remote.ssh("true").await;
    assert!(!output.status.success(), "nothing listens after kill_all");

    remote.server.restart().await;
    let output = remote.ssh("true").await;
    assert!(
        output.status.success(),
        "after restart: {}",
        describe(&output)
    );

    let old = remote.server.host_public_key();
    remote.server.restart_with_new_host_key().await;
    assert_ne!(remote.server.host_public_key(), old);
    let output = remote.ssh("true").await;
    assert_eq!(output.status.code(), Some(255), "{}", describe(&output));
    assert!(
        text(&output.stderr).contains("Host key verification failed"),
        "{}",
        describe(&output)
    );
}

#[tokio::test]
async fn sshd_accepts_added_client_keys_encrypted_or_not() {
    let remote = Remote::new().await;
    let scratch = tempfile::tempdir().unwrap();
    // Answers the passphrase prompt (OpenSSH asks the askpass program when forced to).
    let askpass = scratch.path().join("askpass");
    std::fs::write(&askpass, "#!/bin/sh\necho secret\n").unwrap();
    std::process::Command::new("chmod")
        .arg("755")
        .arg(&askpass)
        .status()
        .unwrap();
    let plain = remote.server.add_client_key(None);
    let encrypted = remote.server.add_client_key(Some("secret"));
    let unknown = scratch.path().join("unknown_ed25519");
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&unknown)
        .status()
        .unwrap();
    assert!(status.success());
    // Only the given key, no config file: each login proves that one key is authorized.
    let login = |key: &Path, batch: bool| {
        let mut ssh = tokio::process::Command::new("ssh");
        ssh.args([
            "-F",
            "/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
        ])
        .arg("-o")
        .arg(format!("BatchMode={}", if batch { "yes" } else { "no" }))
        .arg("-o")
        .arg(format!(
            "UserKnownHostsFile={}",
            remote.server.dir().join("known_hosts").display()
        ))
        .args(["-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR"])
        .arg("-i")
        .arg(key)
        .arg("-p")
        .arg(remote.server.port().to_string())
        .arg(format!("{}@127.0.0.1", remote.server.user()))
        .arg("true")
        .env("SSH_ASKPASS", &askpass)
        .env("SSH_ASKPASS_REQUIRE", "force")
        .stdin(Stdio::null())
        .kill_on_drop(true);
        async move {
            tokio::time::timeout(COMMAND_PATIENCE, ssh.output())
                .await
                .unwrap()
                .unwrap()
        }
    };
    let output = login(remote.server.client_key(), true).await;
    assert!(output.status.success(), "client_key: {}", describe(&output));
    let output = login(&plain, true).await;
    assert!(output.status.success(), "added key: {}", describe(&output));
    let output = login(&encrypted, true).await;
    assert!(
        !output.status.success(),
        "an encrypted key cannot be used in batch mode"
    );
    let output = login(&encrypted, false).await;
    assert!(
        output.status.success(),
        "encrypted key with its passphrase: {}",
        describe(&output)
    );
    let output = login(&unknown, true).await;
    assert_eq!(output.status.code(), Some(255), "an unknown key is refused");
}

#[tokio::test]
async fn sshd_tcp_forwarding_can_be_refused() {
    for allow in [true, false] {
        let remote = Remote::with(SshdOptions {
            allow_tcp_forwarding: allow,
            ..SshdOptions::default()
        })
        .await;
        // `ssh -W` opens a direct-tcpip channel, as the bootstrapper's forward does: here to
        // the sshd itself, which answers with its banner.
        let mut ssh = tokio::process::Command::new("ssh");
        ssh.arg("-F")
            .arg(&remote.config)
            .arg("-W")
            .arg(format!("127.0.0.1:{}", remote.server.port()))
            .arg(ALIAS)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = ssh.spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut buf = vec![0u8; 64];
        let read = tokio::time::timeout(COMMAND_PATIENCE, async {
            use tokio::io::AsyncReadExt;
            stdout.read(&mut buf).await
        })
        .await
        .expect("ssh -W answered")
        .unwrap();
        let got = text(&buf[..read]);
        if allow {
            assert!(got.starts_with("SSH-2.0"), "through the forward: {got:?}");
        } else {
            assert_eq!(read, 0, "forward refused: {got:?}");
            let output = tokio::time::timeout(COMMAND_PATIENCE, child.wait_with_output())
                .await
                .unwrap()
                .unwrap();
            assert!(!output.status.success());
            assert!(
                text(&output.stderr).contains("forwarding failed"),
                "{}",
                describe(&output)
            );
            assert!(
                remote.server.log().contains("refused local port forward"),
                "sshd says why"
            );
        }
    }
}

#[tokio::test]
async fn upgrades_keep_the_previous_and_the_running_version() {
    let release = release();
    let remote = Remote::new().await;
    let _guard = remote.guard();
    let artifact = remote.stage(&release).await;
    // The same binary under several labels stands in for successive releases.
    for version in ["1.0.0", "2.0.0"] {
        let output = remote.install(version, &artifact).await;
        assert!(output.status.success(), "{version}: {}", describe(&output));
    }
    let output = remote.install_sh("start").await;
    assert!(output.status.success(), "start: {}", describe(&output));
    let pid = pid_of(&remote.state().unwrap());
    for version in ["3.0.0", "4.0.0"] {
        let output = remote.install(version, &artifact).await;
        assert!(output.status.success(), "{version}: {}", describe(&output));
    }
    // 4.0.0 is current, 3.0.0 the previous one, 2.0.0 runs; 1.0.0 is gone.
    assert_eq!(remote.versions(), ["2.0.0", "3.0.0", "4.0.0"]);
    assert_eq!(remote.current(), "versions/4.0.0");
    assert!(alive(pid));
    // Reinstalling the current version prunes nothing.
    let output = remote.install("4.0.0", &artifact).await;
    assert!(output.status.success(), "again: {}", describe(&output));
    assert_eq!(remote.versions(), ["2.0.0", "3.0.0", "4.0.0"]);
    let output = remote.install_sh("stop").await;
    assert!(output.status.success(), "stop: {}", describe(&output));
    wait_until_dead(pid).await;
}

/// A directory of links to every command on this machine except `flock`, as on macOS.
fn path_without_flock(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for system in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        for entry in std::fs::read_dir(system).into_iter().flatten().flatten() {
            let name = entry.file_name();
            if name == "flock" {
                continue;
            }
            let _ = std::os::unix::fs::symlink(entry.path(), bin.join(&name));
        }
    }
    bin
}

#[tokio::test]
async fn without_flock_a_lock_directory_serializes_installs() {
    let release = release();
    let remote = Remote::new().await;
    let artifact = remote.stage(&release).await;
    let scratch = tempfile::tempdir().unwrap();
    let bin = path_without_flock(scratch.path());
    let script = format!("{}/staging/install.sh", remote.root_str());
    let remote = &remote;
    let install = |version: &'static str| {
        let command = format!(
            "PATH={}; export PATH; ! command -v flock && sh {} install --root {} --version {version} --artifact {}",
            q(bin.to_str().unwrap()),
            q(&script),
            q(remote.root_str()),
            q(&artifact)
        );
        async move { remote.ssh(&command).await }
    };
    // A lock left by an installer that died: taken over, not waited for.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let lock = remote.root.join("install.lock.d");
    std::fs::create_dir_all(&lock).unwrap();
    std::fs::write(lock.join("pid"), dead_pid.to_string()).unwrap();

    let (a, b, c) = tokio::join!(install("1.0.0"), install("1.0.0"), install("2.0.0"));
    for output in [&a, &b, &c] {
        assert!(output.status.success(), "{}", describe(output));
    }
    assert!(!lock.exists(), "the lock directory is removed");
    assert!(
        !remote.root.join("install.lock").exists(),
        "flock was not used"
    );
    assert_eq!(remote.versions(), ["1.0.0", "2.0.0"]);
    let current = remote.current();
    assert!(
        current == "versions/1.0.0" || current == "versions/2.0.0",
        "{current}"
    );
}

/// Stand-ins for `systemctl --user` and `loginctl` (this machine has no user systemd): restart
/// runs the rendered unit's ExecStart detached, with its StandardOutput, and remembers the pid;
/// every call is logged.
fn fake_systemd(dir: &Path) -> PathBuf {
    let bin = dir.join("fake-systemd");
    std::fs::create_dir_all(&bin).unwrap();
    let systemctl = r#"#!/bin/sh
state=$(dirname "$0")
echo "$*" >>"$state/calls"
[ "$1" = --user ] || exit 1
shift
cmd=$1
shift
for a in "$@"; do case $a in --*) ;; *) unit=$a ;; esac; done
units=${XDG_CONFIG_HOME:?}/systemd/user
pidfile=$state/${unit:-none}.pid
running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
case $cmd in
  show-environment) echo "HOME=$HOME" ;;
  daemon-reload | enable | disable) ;;
  show) running && echo running || echo failed ;;
  stop)
    if running; then
      pid=$(cat "$pidfile"); kill "$pid"
      while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    fi ;;
  restart)
    "$0" --user stop "$unit"
    exec_start=$(sed -n 's/^ExecStart=//p' "$units/$unit")
    log=$(sed -n 's/^StandardOutput=append://p' "$units/$unit")
    cd "$(sed -n 's/^WorkingDirectory=//p' "$units/$unit")" || exit 1
    setsid sh -c "exec $exec_start" </dev/null >>"$log" 2>&1 &
    echo $! >"$pidfile" ;;
  *) exit 1 ;;
esac
"#;
    let loginctl = "#!/bin/sh\necho \"$*\" >>\"$(dirname \"$0\")/calls\"\necho Linger=yes\n";
    for (name, text) in [("systemctl", systemctl), ("loginctl", loginctl)] {
        std::fs::write(bin.join(name), text).unwrap();
        std::process::Command::new("chmod")
            .arg("755")
            .arg(bin.join(name))
            .status()
            .unwrap();
    }
    bin
}

#[tokio::test]
async fn start_uses_a_lingering_user_systemd_when_there_is_one() {
    let release = release();
    let mut remote = Remote::new().await;
    let scratch = tempfile::tempdir().unwrap();
    // systemd needs a root without characters it would interpret.
    remote.root = scratch.path().join("pi-host");
    let _guard = remote.guard();
    let fake = fake_systemd(scratch.path());
    let config_home = scratch.path().join("config");
    std::fs::create_dir_all(remote.root.join("data")).unwrap();
    std::fs::write(remote.root.join("config.toml"), "").unwrap();
    let artifact = remote.stage(&release).await;
    let output = remote.install(&release.version, &artifact).await;
    assert!(output.status.success(), "install: {}", describe(&output));

    let with_systemd = |sub: &str| {
        format!(
            "PATH={}:$PATH XDG_CONFIG_HOME={} sh {} {sub} --root {}",
            q(fake.to_str().unwrap()),
            q(config_home.to_str().unwrap()),
            q(format!("{}/install.sh", remote.root_str())),
            q(remote.root_str())
        )
    };
    let output = remote.ssh(&with_systemd("start")).await;
    assert!(output.status.success(), "start: {}", describe(&output));
    let state: serde_json::Value = serde_json::from_str(&last_line(&output)).unwrap();
    let pid = pid_of(&state);
    assert!(alive(pid));
    let units: Vec<PathBuf> = std::fs::read_dir(config_home.join("systemd/user"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(units.len(), 1, "{units:?}");
    let name = units[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("pi-host-") && name.ends_with(".service"),
        "{name}"
    );
    let unit = std::fs::read_to_string(&units[0]).unwrap();
    assert!(!unit.contains('@'), "every placeholder replaced:\n{unit}");
    let root = remote.root_str();
    assert!(
        unit.contains(&format!(
            "ExecStart={root}/current/bin/pi-host --data-dir {root}/data serve --listen \
             127.0.0.1:0 --metrics-listen 127.0.0.1:0 --state-file {root}/state.json --config \
             {root}/config.toml"
        )),
        "{unit}"
    );
    let calls = std::fs::read_to_string(fake.join("calls")).unwrap();
    for call in [
        "show-user".to_string(),
        "--user daemon-reload".to_string(),
        format!("--user restart --no-block {name}"),
        format!("--user enable --quiet {name}"),
    ] {
        assert!(calls.contains(&call), "{call} in:\n{calls}");
    }

    let output = remote.ssh(&with_systemd("stop")).await;
    assert!(output.status.success(), "stop: {}", describe(&output));
    wait_until_dead(pid).await;
    let calls = std::fs::read_to_string(fake.join("calls")).unwrap();
    assert!(calls.contains(&format!("--user stop {name}")), "{calls}");
    assert!(
        calls.contains(&format!("--user disable --quiet {name}")),
        "{calls}"
    );
    // Forced detached mode does not touch systemd.
    let output = remote.ssh(&with_systemd("start --mode detached")).await;
    assert!(output.status.success(), "detached: {}", describe(&output));
    let calls_after = std::fs::read_to_string(fake.join("calls")).unwrap();
    assert!(
        !calls_after[calls.len()..].contains("restart"),
        "{calls_after}"
    );
    let output = remote.ssh(&with_systemd("stop")).await;
    assert!(output.status.success(), "stop: {}", describe(&output));
}
