//! `pi-remote shell`, `stats`, `commands` and `export`: a shell command whose output joins a
//! session's conversation, what the session cost, its slash commands, and its HTML export
//! (docs/protocol.md §7.27-§7.30).

use super::call_resending;
use crate::remote::Failure;
use crate::remote::out::Out;
use racp_proto::calls;
use racp_proto::client::RacpClient;
use racp_proto::methods::session::{SessionBashParams, SessionExportParams, SessionRef};
use racp_proto::validate::printable;
use std::io::Write;

/// Runs a shell command in the session's workspace and prints its output; the host answers
/// when it ends (or aborts it at its deadline), so the call waits as long. Not resent: a
/// resend would run it twice.
pub async fn shell(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    command: String,
) -> Result<(), Failure> {
    let params = SessionBashParams {
        session_id,
        command,
    };
    let result = client.call::<calls::SessionBash>(params).await?;
    if out.json {
        out.json_value(&result);
        return Ok(());
    }
    out.text(&result.output);
    if !result.output.is_empty() && !result.output.ends_with('\n') {
        out.line("");
    }
    let ending = match (result.cancelled, result.exit_code) {
        (true, _) => "(cancelled)".to_string(),
        (false, Some(0)) => String::new(),
        (false, Some(code)) => format!("(exit code {code})"),
        (false, None) => "(ended without an exit code)".to_string(),
    };
    if result.truncated {
        out.line("(only the end of the output was kept)");
    }
    if !ending.is_empty() {
        out.line(&ending);
    }
    Ok(())
}

/// Prints a session's totals: messages, tool calls, tokens, cost, and the context in use when
/// its agent runs.
pub async fn stats(out: &Out, client: &RacpClient, session_id: String) -> Result<(), Failure> {
    let stats = call_resending::<calls::SessionStats>(client, SessionRef { session_id }).await?;
    if out.json {
        out.json_value(&stats);
        return Ok(());
    }
    let t = &stats.tokens;
    out.line(&format!(
        "messages: {} (you {}, assistant {}, tool results {}, shell {})",
        stats.total_messages,
        stats.user_messages,
        stats.assistant_messages,
        stats.tool_results,
        stats.shell_commands
    ));
    out.line(&format!("tool calls: {}", stats.tool_calls));
    out.line(&format!(
        "tokens: {} (input {}, output {}, cache read {}, cache write {})",
        t.total, t.input, t.output, t.cache_read, t.cache_write
    ));
    out.line(&format!("cost: ${:.4}", stats.cost));
    if let Some(context) = &stats.context {
        out.line(&format!(
            "in the context now: {} messages (you {}, assistant {}, tool results {}), {} tokens, \
             ${:.4}",
            context.total_messages,
            context.user_messages,
            context.assistant_messages,
            context.tool_results,
            context.tokens.total,
            context.cost
        ));
    }
    if let Some(usage) = &stats.context_usage {
        let used = usage.tokens.map_or("?".to_string(), |t| t.to_string());
        let percent = usage
            .percent
            .map_or(String::new(), |p| format!(" ({p:.1}%)"));
        out.line(&format!(
            "context: {used} of {}{percent}",
            usage.context_window
        ));
    }
    if stats.truncated {
        out.line("(the host's history bound dropped older messages: they are not counted)");
    }
    Ok(())
}

/// Lists the session's slash commands: `/name  source  description`.
pub async fn commands(out: &Out, client: &RacpClient, session_id: String) -> Result<(), Failure> {
    let listed =
        call_resending::<calls::SessionCommands>(client, SessionRef { session_id }).await?;
    if out.json {
        out.json_value(&listed);
    } else if listed.commands.is_empty() {
        out.line("no commands");
    } else {
        for command in &listed.commands {
            out.line(&format!(
                "/{}\t{}\t{}",
                printable(&command.name, false),
                printable(&command.source, false),
                printable(command.description.as_deref().unwrap_or("-"), false)
            ));
        }
    }
    Ok(())
}

/// Writes the session's HTML export to stdout as it came (`pi-remote export S > file.html`).
pub async fn export(out: &Out, client: &RacpClient, session_id: String) -> Result<(), Failure> {
    let params = SessionExportParams {
        session_id,
        max_bytes: None,
    };
    let export = call_resending::<calls::SessionExport>(client, params).await?;
    if out.json {
        out.json_value(&export);
        return Ok(());
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(export.html.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::Local(format!("cannot write the export: {e}")))
}
