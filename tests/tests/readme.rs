//! Every command block of README.md, clients/ts/README.md and deploy/README.md runs as written,
//! from a clean directory (a new `$HOME`, nothing of the user's), so the walkthroughs cannot
//! drift from the binaries.
//!
//! The rule, per fenced block:
//! - A ```sh block is a list of commands, one a line (a trailing ` # comment` is the reader's).
//!   Each command is either **run** or **covered**:
//!   - covered: the line is, character for character, one of [`COVERED`], which names the test
//!     that shows its effect. Only commands too slow or recursive to run here (`scripts/test`,
//!     `deploy/release.sh`, release builds, npm's install and test), ones that write into the
//!     checkout (`racp-codegen`) and ones that need root (`sudo`) are there;
//!   - run: `pi-host`, `pi-gateway`, `pi-remote` and `cargo run -p CRATE --bin BIN --` (a debug
//!     build: the binary the test's build made, which is what `cargo run` runs) are run with
//!     the placeholders a reader fills in filled from real things: `racps://…#ppt_…` is a link
//!     a running host minted, `/path/to/project` a directory in its roots, `SESSION` the id the
//!     last `new` printed, `user@devbox` the test's sshd (`~/.ssh/config` names it `devbox`),
//!     `dist` a release made by release.sh from the test's build, `nats.example` a local
//!     nats-server (tests/src/nats.rs, TLS with its own CA), `HOST_ID`/`NKEY` what
//!     `pi-host gateway-key` printed, `GATEWAY_KEY[,KEY…]` what `pi-gateway key` printed, an
//!     optional `[--flag file.pem]` the test's file. Servers (`serve`, `connect` without
//!     `--once` or `--background`, `attach`) run in the background until they are ready (a
//!     `connect --background` returns once its forward is up); ports are the OS's
//!     (`--listen` to port 0 on loopback). Every other command must exit 0.
//!   - anything else (another program, a placeholder left unfilled) fails the test.
//! - A ```js block must be one of [`COVERED_BLOCKS`] (the TypeScript quickstart, which
//!   clients/ts/test/readme.test.ts runs from a new npm project).
//! - Blocks with another or no language are text (usage synopses, file layouts, JSON).
//!
//! What a command did to the world a later one reads happens as the reader would do it: the key
//! `pi-gateway key` prints goes into NATS's users and NATS starts; the user `enroll` prints is
//! added and NATS reloads.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tests::nats::NatsCluster;
use tests::sshd::{RemoteAccount, SshServer, SshdOptions};
use tests::{HostProcess, PATIENCE, TestCertificate};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Commands not run here, each with the test that covers what it does.
const COVERED: &[(&str, &str)] = &[
    (
        "cargo run --release -p pi-host -- serve",
        "every end-to-end test starts `pi-host serve` (tests/src/lib.rs HostProcess); this one too",
    ),
    ("scripts/test", "CI runs it (.ci/run)"),
    (
        "npm install -g @mariozechner/pi-coding-agent",
        "scripts/test installs the same pinned pi with npm into tests/pi (tests reach no registry); pi-host/tests/agent_check.rs finds it ready",
    ),
    (
        "cargo run --release -p pi-host -- status",
        "pi-host/tests/agent_check.rs (status and host/info report the agent)",
    ),
    (
        "cargo run --release -p pi-host -- pair",
        "pi-host/tests/upgrade_and_pairing.rs pair_prints_the_token_the_url_and_a_qr_code; the links this test pairs with are minted with `pi-host pair --json`",
    ),
    (
        "cargo run --release -p pi-host -- pair --qr --address NAME:7878",
        "pi-host/tests/upgrade_and_pairing.rs pair_prints_the_token_the_url_and_a_qr_code",
    ),
    (
        "cargo run --release -p pi-host -- pair --json",
        "pi-host/tests/upgrade_and_pairing.rs and every test's pairing (HostProcess::pairing_token)",
    ),
    (
        "deploy/release.sh --out dist",
        "scripts/test runs it (tests/tests/release.rs); here `dist` is release.sh --binary over the test build",
    ),
    (
        "deploy/release.sh --arch x86_64  --out dist",
        "scripts/test runs it (deploy/dist.sh) into target/dist-check; tests/tests/release.rs checks the x86_64 build",
    ),
    (
        "deploy/release.sh --arch aarch64 --out dist",
        "scripts/test runs it (deploy/dist.sh) into target/dist-check; tests/tests/release.rs checks the aarch64 build and runs its host under qemu",
    ),
    (
        "deploy/dist.sh --out ~/.local",
        "scripts/test makes the distribution into target/dist-check and tests/tests/release.rs the_desktop_distribution_installs_its_own_release_with_no_release_dir connects with it; here ~/.local/share/pi-remote/release is release.sh --binary over the test build",
    ),
    (
        "cargo install --locked --path bootstrap",
        "cargo's own; the pi-remote it installs is the one this test runs (a build of bootstrap), which finds ~/.local/share/pi-remote/release",
    ),
    (
        "cargo run -p racp-proto --bin racp-codegen",
        "racp-proto/tests/generated_files.rs (it writes into the checkout)",
    ),
    (
        "npm ci && npm run build",
        "clients/ts tests, run by scripts/test",
    ),
    ("npm test", "scripts/test"),
    (
        "sudo install -d -o nats -g nats -m 0700 /var/lib/nats",
        "tests/tests/gateway.rs the_deployed_nats_configuration_serves_and_a_host_answers_once_it_says_listening",
    ),
    (
        "sudo install -m 0640 -g nats deploy/nats-server.conf /etc/nats-server.conf",
        "tests/tests/gateway.rs the_deployed_nats_configuration_serves_and_a_host_answers_once_it_says_listening",
    ),
    (
        "sudo systemctl restart nats-server",
        "tests/tests/gateway.rs the_deployed_nats_configuration_serves_and_a_host_answers_once_it_says_listening",
    ),
];

/// Non-shell blocks, by their first line, with the test that runs them.
const COVERED_BLOCKS: &[(&str, &str)] = &[(
    "import WebSocket from \"ws\";",
    "clients/ts/test/readme.test.ts (examples/quickstart.mjs, shown verbatim)",
)];

const READMES: &[&str] = &["README.md", "clients/ts/README.md", "deploy/README.md"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A fenced block: its language, the line its body starts on, its lines.
struct Block {
    lang: String,
    line: usize,
    lines: Vec<String>,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (number, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (fence, open.take()) {
            (Some(_), Some(block)) => blocks.push(block),
            (Some(lang), None) => {
                open = Some(Block {
                    lang: lang.trim().to_string(),
                    line: number + 2,
                    lines: Vec::new(),
                })
            }
            (None, Some(mut block)) => {
                block.lines.push(line.to_string());
                open = Some(block);
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a fenced block is not closed");
    blocks
}

/// The command without its trailing comment (a `#` after whitespace, outside quotes).
fn command_of(line: &str) -> String {
    let (mut single, mut double) = (false, false);
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => {
                return line[..at].trim().to_string();
            }
            _ => {}
        }
        previous = c;
    }
    line.trim().to_string()
}

#[test]
fn comments_and_blocks_are_read_as_a_reader_reads_them() {
    assert_eq!(command_of("a 'b # c' # d"), "a 'b # c'");
    assert_eq!(command_of("x#y z"), "x#y z");
    assert_eq!(command_of("   # only a comment"), "");
    let found = blocks("t\n```sh\none\ntwo\n```\n```\nthree\n```\n");
    assert_eq!(found.len(), 2);
    assert_eq!((found[0].lang.as_str(), found[0].line), ("sh", 3));
    assert_eq!(found[0].lines, ["one", "two"]);
    assert_eq!(found[1].lang, "");
}

/// What earlier commands left for later ones, and the things they run against.
struct World {
    /// The clean directory: `$HOME` and the working directory of every command.
    home: tempfile::TempDir,
    /// The host the pi-remote walkthrough pairs with ("the running host").
    host: HostProcess,
    vars: HashMap<&'static str, String>,
    sshd: Option<SshServer>,
    remote_home: Option<tempfile::TempDir>,
    nats: Option<NatsCluster>,
    nats_users: Vec<String>,
    certificate: TestCertificate,
    background: Vec<Background>,
}

struct Background {
    what: String,
    child: Child,
}

impl Drop for World {
    /// A `connect --background` the walkthrough started is a daemon: stopped here if a failed
    /// command left it running.
    fn drop(&mut self) {
        let run = self.home().join(".config/pi-remote/run");
        let Ok(entries) = std::fs::read_dir(run) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(profile) = name.strip_suffix(".lock") {
                let _ = std::process::Command::new(tests::workspace_binary(
                    "bootstrap",
                    "pi-remote",
                    None,
                ))
                .args(["disconnect", profile])
                .env("HOME", self.home())
                .env("XDG_CONFIG_HOME", self.home().join(".config"))
                .env_remove("PI_REMOTE_CONFIG_DIR")
                .output();
            }
        }
    }
}

impl World {
    async fn new() -> World {
        let home = tempfile::tempdir().unwrap();
        let agent = tests::stand_in_agent();
        let host = HostProcess::start_with(
            &tests::pi_host_binary(),
            &["--agent", agent.to_str().unwrap()],
        )
        .await;
        World {
            home,
            host,
            vars: HashMap::new(),
            sshd: None,
            remote_home: None,
            nats: None,
            nats_users: Vec::new(),
            certificate: TestCertificate::localhost(),
            background: Vec::new(),
        }
    }

    fn home(&self) -> &Path {
        self.home.path()
    }

    fn var(&self, name: &str, line: &str) -> String {
        self.vars
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("`{line}` needs {name}, which no command before it gave"))
    }

    /// The line with the reader's placeholders filled in.
    async fn fill(&mut self, line: &str) -> String {
        let mut text = line.to_string();
        if let Some(start) = text.find("'racps://")
            && let Some(len) = text[start + 1..].find('\'')
        {
            let written = &text[start..start + len + 2];
            if written.contains('…') {
                let minted = self.host.pairing_token(&[]).await;
                let link = minted["url"].as_str().expect("url").to_string();
                text = text.replace(written, &format!("'{link}'"));
            }
        }
        if text.contains("/path/to/project") {
            text = text.replace("/path/to/project", &self.host.workspace("project"));
        }
        if text.contains("user@devbox") {
            let user = self.ssh().await;
            text = text.replace("user@devbox", &format!("{user}@devbox"));
        }
        if text.contains("--release-dir dist") {
            self.release(&self.home().join("dist"));
        } else if text.contains(" connect ") {
            // Where deploy/dist.sh --out ~/.local puts the release, which connect finds.
            self.release(&self.home().join(".local/share/pi-remote/release"));
        }
        for name in ["SESSION", "HOST_ID", "NKEY"] {
            if words(&text).any(|w| w == name) {
                let value = self.var(name, line);
                text = words(&text)
                    .map(|w| {
                        if w == name {
                            value.clone()
                        } else {
                            w.to_string()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
            }
        }
        if text.contains("GATEWAY_KEY[,KEY…]") {
            text = text.replace("GATEWAY_KEY[,KEY…]", &self.var("GATEWAY_KEY", line));
        }
        if let Some(nats) = &self.nats {
            let url = nats.url(0);
            let ca = nats.ca_path().display().to_string();
            text = text
                .replace("tls://nats.example:4222", &url)
                .replace("[--gateway-ca ca.pem]", &format!("--gateway-ca {ca}"))
                .replace("[--nats-ca ca.pem]", &format!("--nats-ca {ca}"));
        }
        let (cert, key) = (
            self.certificate.cert.display().to_string(),
            self.certificate.key.display().to_string(),
        );
        text = text.replace(
            "[--tls-cert cert.pem --tls-key key.pem]",
            &format!("--tls-cert {cert} --tls-key {key}"),
        );
        text
    }

    /// The test's sshd, named `devbox` in `~/.ssh/config` and known in `~/.ssh/known_hosts`,
    /// with a remote home whose install root has the stand-in agent and roots configured.
    /// Returns the user to log in as.
    async fn ssh(&mut self) -> String {
        if self.sshd.is_none() {
            assert!(
                tests::sshd::nss_wrapper_installed(),
                "libnss-wrapper is missing (scripts/test installs it)"
            );
            let remote_home = tempfile::tempdir().unwrap();
            let root = remote_home.path().join(".pi-host");
            std::fs::create_dir(&root).unwrap();
            let workspaces = remote_home.path().join("work");
            std::fs::create_dir(&workspaces).unwrap();
            std::fs::write(
                root.join("config.toml"),
                format!(
                    "agent = {:?}\nroots = [{:?}]\n",
                    tests::stand_in_agent().display().to_string(),
                    workspaces.display().to_string()
                ),
            )
            .unwrap();
            let server = SshServer::start(SshdOptions {
                account: Some(RemoteAccount {
                    shell: PathBuf::from("/bin/sh"),
                    home: remote_home.path().to_path_buf(),
                }),
                ..SshdOptions::default()
            })
            .await;
            let ssh = self.home().join(".ssh");
            std::fs::create_dir_all(&ssh).unwrap();
            let known_hosts = ssh.join("known_hosts");
            std::fs::write(&known_hosts, format!("{}\n", server.known_hosts_line())).unwrap();
            let written = server.write_ssh_config("devbox", &known_hosts);
            std::fs::copy(written, ssh.join("config")).unwrap();
            self.sshd = Some(server);
            self.remote_home = Some(remote_home);
        }
        self.sshd.as_ref().unwrap().user()
    }

    /// A release in `dist` (under the clean directory): deploy/release.sh over a stripped copy of
    /// the test build of pi-host (a fifth of the size, so the upload stays quick).
    fn release(&self, dist: &Path) {
        if dist.join("manifest.json").exists() {
            return;
        }
        let scratch = tempfile::tempdir().unwrap();
        let binary = scratch.path().join("pi-host");
        let stripped = std::process::Command::new("strip")
            .arg("-o")
            .arg(&binary)
            .arg(tests::pi_host_binary())
            .status()
            .is_ok_and(|status| status.success());
        if !stripped {
            std::fs::copy(tests::pi_host_binary(), &binary).unwrap();
        }
        let output = std::process::Command::new(repo_root().join("deploy/release.sh"))
            .arg("--binary")
            .arg(&binary)
            .arg("--out")
            .arg(dist)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "release.sh failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The program a line names, as the binary to run and its arguments.
    fn program(&self, words: &[String]) -> Option<(PathBuf, Vec<String>)> {
        let cargo_run = ["cargo", "run", "-p"];
        if words.len() > 6 && words[..3] == cargo_run && words[4] == "--bin" && words[6] == "--" {
            let binary = tests::workspace_binary(&words[3], &words[5], None);
            return Some((binary, words[7..].to_vec()));
        }
        let binary = match words.first()?.as_str() {
            "pi-host" => tests::pi_host_binary(),
            "pi-gateway" => tests::gateway::gateway_binary(),
            "pi-remote" => tests::workspace_binary("bootstrap", "pi-remote", None),
            _ => return None,
        };
        Some((binary, words[1..].to_vec()))
    }

    fn command(&self, binary: &Path, args: &[String]) -> Command {
        let mut command = Command::new(binary);
        command
            .args(args)
            .current_dir(self.home())
            .env("HOME", self.home())
            .env("XDG_DATA_HOME", self.home().join(".local/share"))
            .env("XDG_CONFIG_HOME", self.home().join(".config"))
            .env("PI_HOST_AGENT", tests::stand_in_agent())
            .env("NO_COLOR", "1")
            .env_remove("PI_REMOTE_CONFIG_DIR")
            .env_remove("PI_HOST_DATA_DIR")
            .env_remove("PI_GATEWAY_DATA_DIR")
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(nats) = &self.nats {
            command
                .env("PI_GATEWAY_NATS", nats.url(0))
                .env("PI_GATEWAY_NATS_CA", nats.ca_path());
        }
        command
    }

    /// Runs one command line of `file` (at `at`).
    async fn run(&mut self, file: &str, at: usize, line: &str) {
        let filled = self.fill(line).await;
        assert!(
            !filled.contains('…') && !filled.contains('['),
            "{file}:{at}: `{line}` has a placeholder this test does not fill: `{filled}`"
        );
        let words = shell_words::split(&filled)
            .unwrap_or_else(|e| panic!("{file}:{at}: `{line}` is not a shell command: {e}"));
        let Some((binary, mut args)) = self.program(&words) else {
            panic!(
                "{file}:{at}: `{line}` is neither run by this test nor covered (tests/tests/readme.rs, COVERED)"
            );
        };
        let subcommand = args
            .iter()
            .find(|a| !a.starts_with('-') && !a.contains('/'))
            .cloned()
            .unwrap_or_default();
        let serves = subcommand == "serve";
        if serves {
            listen_on_any_port(&mut args);
        }
        let stays = serves
            || subcommand == "attach"
            || (subcommand == "connect"
                && !args.iter().any(|a| a == "--once" || a == "--background"));
        let mut command = self.command(&binary, &args);
        if stays {
            self.start_background(file, at, line, command, &subcommand, &args)
                .await;
            return;
        }
        let output = tokio::time::timeout(PATIENCE * 4, command.output())
            .await
            .unwrap_or_else(|_| panic!("{file}:{at}: `{line}` did not finish"))
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        );
        assert!(
            output.status.success(),
            "{file}:{at}: `{line}` (run as `{filled}`) failed ({}):\n{stdout}\n{stderr}\n{}",
            output.status,
            self.logs()
        );
        self.after(&binary, &subcommand, &stdout).await;
    }

    /// What a command's output gives later ones.
    async fn after(&mut self, binary: &Path, subcommand: &str, stdout: &str) {
        let program = binary.file_name().unwrap().to_str().unwrap();
        match (program, subcommand) {
            ("pi-remote", "new") => {
                self.vars.insert("SESSION", stdout.trim().to_string());
            }
            ("pi-gateway", "key") => {
                let key = stdout.trim().to_string();
                self.vars.insert("GATEWAY_KEY", key.clone());
                // Into NATS's users, then NATS (re)started, as the comment says.
                self.nats_users = vec![format!("{{ nkey: \"{key}\" }}")];
                self.nats = Some(NatsCluster::start(1, &self.nats_users).await);
            }
            ("pi-host", "gateway-key") => {
                let field = |name: &str| {
                    stdout
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(|v| v.trim().to_string())
                        .unwrap_or_else(|| panic!("gateway-key printed no {name:?}: {stdout}"))
                };
                self.vars.insert("HOST_ID", field("host id"));
                self.vars.insert("NKEY", field("nkey"));
            }
            ("pi-gateway", "enroll") => {
                // The printed user added to NATS's users, and NATS reloaded.
                self.nats_users.push(stdout.trim().to_string());
                let users = self.nats_users.clone();
                self.nats.as_mut().expect("NATS").set_users(&users).await;
            }
            ("pi-gateway", "pair") => {
                // The link names what `serve` serves: its --allow-host name.
                assert!(
                    stdout.contains("racps://gw.example:"),
                    "pair printed no link to the served address: {stdout}"
                );
            }
            _ => {}
        }
    }

    /// Starts a server and waits until it is ready: "listening" on stdout, a `connect`'s
    /// profile written, an `attach`'s first line.
    async fn start_background(
        &mut self,
        file: &str,
        at: usize,
        line: &str,
        mut command: Command,
        subcommand: &str,
        args: &[String],
    ) {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let stderr = child.stderr.take().unwrap();
        let errors = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut text = String::new();
            while let Ok(Some(line)) = lines.next_line().await {
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        let profile = args
            .windows(2)
            .find(|w| w[0] == "--profile")
            .map(|w| w[1].clone())
            .unwrap_or_else(|| "default".into());
        let profile = self
            .home()
            .join(".config/pi-remote/profiles")
            .join(format!("{profile}.json"));
        let ready = async {
            loop {
                if subcommand == "connect" {
                    if profile.exists() {
                        return true;
                    }
                    if let Ok(Some(_)) = child.try_wait() {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                match stdout.next_line().await {
                    Ok(Some(out)) if subcommand != "serve" || out.contains("listening on") => {
                        return true;
                    }
                    Ok(Some(_)) => {}
                    _ => return false,
                }
            }
        };
        let ready = tokio::time::timeout(PATIENCE * 4, ready).await;
        if ready != Ok(true) {
            let _ = child.kill().await;
            let errors = errors.await.unwrap_or_default();
            panic!(
                "{file}:{at}: `{line}` never became ready:\n{errors}\n{}",
                self.logs()
            );
        }
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        self.background.push(Background {
            what: line.to_string(),
            child,
        });
    }

    fn logs(&self) -> String {
        let mut text = format!(
            "--- the running host's log (tail) ---\n{}",
            tail(&self.host.log())
        );
        if let Some(sshd) = &self.sshd {
            text.push_str(&format!("\n--- sshd ---\n{}", tail(&sshd.log())));
        }
        text
    }
}

fn tail(text: &str) -> &str {
    let mut start = text.len().saturating_sub(6 << 10);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(' ')
}

/// `--listen HOST:PORT` becomes loopback port 0 (the OS's); a `serve` without one gets it.
fn listen_on_any_port(args: &mut Vec<String>) {
    match args.iter().position(|a| a == "--listen") {
        Some(at) if at + 1 < args.len() => args[at + 1] = "127.0.0.1:0".into(),
        _ => args.extend(["--listen".to_string(), "127.0.0.1:0".to_string()]),
    }
}

#[tokio::test]
async fn every_readme_command_block_runs_as_written() {
    assert!(
        tests::nats::available(),
        "nats-server is not installed: scripts/test installs it"
    );
    let mut world = World::new().await;
    let mut ran = 0;
    let mut covered = 0;
    for file in READMES {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        for block in blocks(&text) {
            match block.lang.as_str() {
                "sh" => {}
                "js" | "ts" | "javascript" | "typescript" => {
                    let first = block.lines.first().map(String::as_str).unwrap_or_default();
                    assert!(
                        COVERED_BLOCKS.iter().any(|(line, _)| *line == first),
                        "{file}:{}: a {} block no test runs (tests/tests/readme.rs, COVERED_BLOCKS)",
                        block.line,
                        block.lang
                    );
                    covered += 1;
                    continue;
                }
                _ => continue,
            }
            for (offset, line) in block.lines.iter().enumerate() {
                let command = command_of(line);
                if command.is_empty() {
                    continue;
                }
                if COVERED.iter().any(|(covered, _)| *covered == command) {
                    covered += 1;
                    continue;
                }
                world.run(file, block.line + offset, &command).await;
                ran += 1;
            }
        }
    }
    eprintln!("README commands: {ran} run, {covered} covered by other tests");
    assert!(ran >= 12, "only {ran} README commands ran");
    for mut server in world.background.drain(..) {
        // A server that died before the end failed the walkthrough after it said ready.
        let exited = server.child.try_wait().unwrap();
        assert!(
            exited.is_none() || server.what.contains("attach"),
            "`{}` exited early: {exited:?}",
            server.what
        );
        let _ = server.child.kill().await;
    }
}
