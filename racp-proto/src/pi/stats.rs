//! A session's totals counted from its history (docs/protocol.md §7.28): each message pi ended
//! (`agent.message_end`, its `message` with `role`, `usage` and `content`) and each shell
//! command (`session.bash`), by the rules pi's `get_session_stats` counts its messages with, but
//! over the whole session: pi counts only what its context holds, which a compaction shrinks.

use crate::events::EventType;
use crate::methods::session::SessionStatsResult;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// The part of an `agent.message_end` payload the totals read.
#[derive(Deserialize)]
struct MessageEnd {
    message: Option<Message>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    role: String,
    usage: Option<Usage>,
    /// Only the `type` of each block is read; text is skipped.
    #[serde(default)]
    content: Content,
}

/// A message's content: blocks (assistant, tool result) or a string (user).
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum Content {
    Blocks(Vec<Block>),
    Other(IgnoredAny),
    #[default]
    None,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type", default)]
    kind: String,
}

/// pi's `usage`: token counts as the provider reported them, and the cost pi computed.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Usage {
    input: f64,
    output: f64,
    cache_read: f64,
    cache_write: f64,
    cost: Cost,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Cost {
    total: f64,
}

/// Adds one history entry (its wire `type` and its `data` text) to `stats`; entries it cannot
/// read count for nothing.
pub fn add_entry(stats: &mut SessionStatsResult, kind: &str, data: &str) {
    if kind == EventType::SessionBash.as_str() {
        stats.shell_commands += 1;
        stats.total_messages += 1;
        return;
    }
    let Some(message) = serde_json::from_str::<MessageEnd>(data)
        .ok()
        .and_then(|end| end.message)
    else {
        return;
    };
    stats.total_messages += 1;
    match message.role.as_str() {
        "user" => stats.user_messages += 1,
        "toolResult" => stats.tool_results += 1,
        "assistant" => add_assistant(stats, &message),
        _ => {}
    }
}

fn add_assistant(stats: &mut SessionStatsResult, message: &Message) {
    stats.assistant_messages += 1;
    if let Content::Blocks(blocks) = &message.content {
        stats.tool_calls += blocks.iter().filter(|b| b.kind == "toolCall").count() as u64;
    }
    let Some(usage) = &message.usage else {
        return;
    };
    let tokens = &mut stats.tokens;
    tokens.input += count(usage.input);
    tokens.output += count(usage.output);
    tokens.cache_read += count(usage.cache_read);
    tokens.cache_write += count(usage.cache_write);
    tokens.total = tokens.input + tokens.output + tokens.cache_read + tokens.cache_write;
    if usage.cost.total.is_finite() {
        stats.cost += usage.cost.total;
    }
}

/// A token count as a whole number (a provider never reports a fraction or a negative).
fn count(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value.round() as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn messages_usage_and_shell_commands_are_counted() {
        let mut stats = SessionStatsResult::default();
        add_entry(
            &mut stats,
            "agent.message_end",
            r#"{"type":"message_end","message":{"role":"user","content":"hi"}}"#,
        );
        add_entry(
            &mut stats,
            "agent.message_end",
            r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"x"},{"type":"toolCall","id":"c"}],
               "usage":{"input":10,"output":5,"cacheRead":3,"cacheWrite":2,"totalTokens":20,"cost":{"total":0.25}}}}"#,
        );
        add_entry(
            &mut stats,
            "agent.message_end",
            r#"{"type":"message_end","message":{"role":"toolResult","content":[{"type":"text","text":"ok"}]}}"#,
        );
        add_entry(&mut stats, "session.bash", r#"{"role":"bashExecution"}"#);
        add_entry(&mut stats, "agent.message_end", "null");
        assert_eq!(
            (
                stats.user_messages,
                stats.assistant_messages,
                stats.tool_calls,
                stats.tool_results,
                stats.shell_commands,
                stats.total_messages
            ),
            (1, 1, 1, 1, 1, 4)
        );
        assert_eq!(stats.tokens.total, 20);
        assert_eq!(stats.tokens.cache_read, 3);
        assert!((stats.cost - 0.25).abs() < 1e-9);
    }
}
