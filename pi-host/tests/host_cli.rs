//! The host's own CLI where `pi-remote connect` (deploy/install.sh's layout) put it: the data
//! directory found by default, and advice that never starts a second host (deploy/README.md,
//! "The host's own CLI").

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

/// `home/.pi-host` laid out as install.sh leaves it: `versions/1.0.0/bin/pi-host` (the same
/// binary, hard-linked: the kernel names it by this path), `current` → `versions/1.0.0`.
fn install_root(home: &Path) -> PathBuf {
    let root = home.join(".pi-host");
    let bin_dir = root.join("versions/1.0.0/bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    if std::fs::hard_link(bin(), bin_dir.join("pi-host")).is_err() {
        std::fs::copy(bin(), bin_dir.join("pi-host")).unwrap();
    }
    std::os::unix::fs::symlink("versions/1.0.0", root.join("current")).unwrap();
    std::fs::create_dir_all(root.join("data")).unwrap();
    root
}

/// `program args` with a home of its own and no data directory named anywhere.
fn command(program: &Path, home: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("xdg"))
        .env_remove("PI_HOST_DATA_DIR")
        .env("PI_HOST_LOG", "warn")
        .env("NO_COLOR", "1");
    command
}

async fn run(program: &Path, home: &Path, args: &[&str]) -> (bool, String, String) {
    let output = command(program, home, args).output().await.unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `serve` with no data directory named, until it says it listens.
async fn serve(program: &Path, home: &Path, workspace: &Path) -> Child {
    let mut child = command(program, home, &["serve", "--listen", "127.0.0.1:0"])
        .arg("--root")
        .arg(workspace)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(tests::PATIENCE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("pi-host listening on ") {
                return;
            }
        }
        panic!("pi-host exited before listening");
    })
    .await
    .expect("pi-host did not start in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

#[tokio::test]
async fn the_installed_cli_finds_its_data_directory_and_never_advises_a_second_host() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path().canonicalize().unwrap();
    let root = install_root(&home);
    let installed = root.join("current/bin/pi-host");
    let root_text = root.display().to_string();

    // Stopped: the advice is the install root's own start, not `pi-host serve`.
    let (ok, _, stderr) = run(&installed, &home, &["status"]).await;
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "the pi-host installed at {root_text} is not running"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "sh {root_text}/install.sh start --root {root_text}"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("pi-host serve"), "{stderr}");

    let workspace = tempfile::tempdir().unwrap();
    let _host = serve(&installed, &home, workspace.path()).await;
    assert!(root.join("data/admin.sock").exists(), "served from R/data");

    // Through `current` and through a link on PATH: the same host, by default.
    let link_dir = home.join(".local/bin");
    std::fs::create_dir_all(&link_dir).unwrap();
    std::os::unix::fs::symlink(&installed, link_dir.join("pi-host")).unwrap();
    for program in [installed.clone(), link_dir.join("pi-host")] {
        let (ok, stdout, stderr) = run(&program, &home, &["status", "--json"]).await;
        assert!(ok, "{}: {stderr}", program.display());
        let status: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(status["dataDir"], format!("{root_text}/data"));
    }
    let (ok, stdout, _) = run(&installed, &home, &["status"]).await;
    assert!(ok);
    assert!(
        stdout.contains(&format!("data directory {root_text}/data\n")),
        "{stdout}"
    );

    // A second `serve` of the installed binary is refused: one host per data directory.
    let ws = workspace.path().to_str().unwrap();
    let (ok, _, stderr) = run(
        &installed,
        &home,
        &["serve", "--listen", "127.0.0.1:0", "--root", ws],
    )
    .await;
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "a host is already running with data directory {root_text}/data"
        )),
        "{stderr}"
    );

    // A pi-host from elsewhere looks in its own default, and names the host that runs.
    let (ok, _, stderr) = run(bin(), &home, &["devices"]).await;
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "no pi-host runs with data directory {}/xdg/pi-host",
            home.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("add `--data-dir {root_text}/data`")),
        "{stderr}"
    );
    assert!(!stderr.contains("pi-host serve"), "{stderr}");
}

#[tokio::test]
async fn a_host_of_nobody_is_still_started_by_hand() {
    let home = tempfile::tempdir().unwrap();
    let (ok, _, stderr) = run(bin(), home.path(), &["status"]).await;
    assert!(!ok);
    assert!(
        stderr.contains("no running pi-host at ")
            && stderr.contains("start it with `pi-host serve`"),
        "{stderr}"
    );
}
