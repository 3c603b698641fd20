//! Readiness: once the port accepts a connection, the admin socket is there too, so a script
//! that waits for the port and then runs `pi-host pair` or `status` never meets
//! HOST_UNAVAILABLE (docs/reliability.md §2.4).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tests::PATIENCE;
use tokio::process::Command;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn the_admin_socket_is_served_as_soon_as_the_port_accepts() {
    // Several starts: the window this guards was a few milliseconds wide.
    for round in 0..5 {
        let data_dir = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut host = Command::new(bin())
            .args(["serve", "--listen", &addr, "--data-dir"])
            .arg(data_dir.path())
            .arg("--root")
            .arg(root.path())
            .env("PI_HOST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // As a script would: poll the port until it accepts.
        let deadline = Instant::now() + PATIENCE;
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(Instant::now() < deadline, "the host never accepted");
            assert!(host.try_wait().unwrap().is_none(), "the host exited");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        // At once: the admin socket is there (what `pi-host status` connects to first)...
        let socket = data_dir.path().join("admin.sock");
        let admin = tokio::net::UnixStream::connect(&socket).await;
        assert!(
            admin.is_ok(),
            "round {round}: the port accepted before the admin socket existed: {admin:?}"
        );
        drop(admin);
        // ...and `pi-host status` answers.
        let status = Command::new(bin())
            .args(["status", "--json", "--data-dir"])
            .arg(data_dir.path())
            .env("PI_HOST_LOG", "warn")
            .output()
            .await
            .unwrap();
        assert!(
            status.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        host.kill().await.unwrap();
    }
}
