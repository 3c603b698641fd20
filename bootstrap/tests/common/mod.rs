//! What every pi-remote test file shares: one desktop, with its own pi-remote config directory,
//! running the `pi-remote` binary the test build made.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use assert_cmd::Command;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Output;
use tests::PATIENCE;

/// One desktop: its own pi-remote config directory.
pub struct Remote {
    pub config: tempfile::TempDir,
}

impl Remote {
    pub fn new() -> Remote {
        Remote {
            config: tempfile::tempdir().unwrap(),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pi-remote"));
        command
            .args(args)
            .env("PI_REMOTE_CONFIG_DIR", self.config.path())
            .env_remove("PI_REMOTE_PROFILE")
            .timeout(PATIENCE * 2);
        command
    }

    /// Runs pi-remote to completion off the async workers.
    pub async fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Output {
        let mut command = self.command(args);
        command.write_stdin(stdin.to_string());
        tokio::task::spawn_blocking(move || command.output().expect("run pi-remote"))
            .await
            .unwrap()
    }

    pub async fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, "").await
    }

    /// Runs a command that must succeed; returns its stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        assert!(
            output.status.success(),
            "pi-remote {args:?} failed ({:?}): {}{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    pub async fn ok_json(&self, args: &[&str]) -> Value {
        let stdout = self.ok(args).await;
        serde_json::from_str(stdout.trim()).expect("one JSON document")
    }

    pub fn profile_path(&self) -> PathBuf {
        self.config.path().join("profiles/default.json")
    }

    pub fn profile(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.profile_path()).unwrap()).unwrap()
    }
}
