//! `pi-remote shell`, `stats`, `commands` and `export` against a real pi-host with the
//! stand-in agent (docs/protocol.md §7.27-§7.30): the shell command's output is printed and
//! lands in the history, the totals count it, the slash commands are listed, and the export is
//! written to stdout as it came.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::Remote;
use tests::HostProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_stats_commands_and_export_from_the_command_line() {
    let agent = tests::stand_in_agent();
    let args = ["--agent", agent.to_str().unwrap()];
    let host = HostProcess::start_with(&tests::pi_host_binary(), &args).await;
    let remote = Remote::new();
    let minted = host.pairing_token(&[]).await;
    remote
        .ok_json(&["pair", minted["url"].as_str().unwrap(), "--json"])
        .await;
    let workspace = host.workspace("w");
    let created = remote
        .ok_json(&["new", "--workspace", &workspace, "--json"])
        .await;
    let session = created["sessionId"].as_str().unwrap().to_string();

    let printed = remote.ok(&["shell", &session, "git status"]).await;
    assert_eq!(printed, "stand-in ran: git status\n");
    let history = remote.ok(&["history", &session]).await;
    assert!(
        history.contains("← $ git status: stand-in ran: git status"),
        "{history}"
    );
    remote.ok(&["prompt", &session, "echo hi", "--wait"]).await;

    let stats = remote.ok_json(&["stats", &session, "--json"]).await;
    assert_eq!(stats["shellCommands"], 1, "{stats}");
    assert_eq!(stats["userMessages"], 1, "{stats}");
    let text = remote.ok(&["stats", &session]).await;
    assert!(text.contains("shell 1"), "{text}");

    let commands = remote.ok(&["commands", &session]).await;
    assert_eq!(commands, "/stand-in-template\tprompt\tA template\n");

    let page = remote.ok(&["export", &session]).await;
    assert!(
        page.starts_with("<!DOCTYPE html><p>stand-in export:"),
        "{page}"
    );
}
