//! `pi-remote history`: a session's conversation, oldest first, read back page by page with
//! `session/history` from the head to the start (docs/protocol.md §7.24). `attach` shows the
//! snapshot's history with the same view ([`print_entries`]).

use super::call_resending;
use crate::remote::Failure;
use crate::remote::out::Out;
use crate::remote::view::View;
use racp_proto::calls;
use racp_proto::client::RacpClient;
use racp_proto::events::Event;
use racp_proto::limits::MAX_HISTORY_LIMIT;
use racp_proto::methods::session::{HistoryPage, SessionHistoryParams};
use racp_proto::validate::printable;

/// What the host's history bound did, said where the conversation starts.
pub const DROPPED_NOTE: &str = "(earlier messages were dropped by the host's history bound)";

/// What was read back: the entries, oldest first, and what precedes them.
struct ReadBack {
    entries: Vec<Event>,
    /// Older entries exist that were not read (`--limit`).
    more: bool,
    /// The host dropped the oldest entries (its history bound).
    truncated: bool,
}

/// Prints the session's conversation (with `limit`, its last `limit` entries): the human view,
/// or with `--json` each entry, the event as delivered live, on its own line.
pub async fn history(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    limit: Option<u32>,
) -> Result<(), Failure> {
    let read = read_back(client, &session_id, limit).await?;
    if out.json {
        if read.truncated {
            out.note(&format!("pi-remote: {DROPPED_NOTE}"));
        }
        for entry in &read.entries {
            out.json_value(entry);
        }
        return Ok(());
    }
    if read.more {
        out.line(&format!(
            "(earlier messages not shown: `pi-remote history {}` without --limit shows them)",
            printable(&session_id, false)
        ));
    } else if read.truncated {
        out.line(DROPPED_NOTE);
    }
    if read.entries.is_empty() {
        out.line("no messages");
    }
    let mut view = View::default();
    print_entries(out, &mut view, &read.entries);
    Ok(())
}

/// Reads pages back from the head, each page's `earlier` the next one's `upTo`, until a page
/// has no `earlier` (the start) or `limit` entries are read.
async fn read_back(
    client: &RacpClient,
    session_id: &str,
    limit: Option<u32>,
) -> Result<ReadBack, Failure> {
    // Pages newest first; printed in reverse.
    let mut pages: Vec<Vec<Event>> = Vec::new();
    let mut read: usize = 0;
    let mut up_to = None;
    let wanted = limit.map(|n| n as usize);
    loop {
        let left = wanted.map(|n| n.saturating_sub(read));
        let params = SessionHistoryParams {
            session_id: session_id.to_string(),
            up_to,
            limit: Some(page_limit(left)),
            max_bytes: None,
        };
        let page = read_page(client, params).await?;
        read += page.entries.len();
        let empty = page.entries.is_empty();
        pages.push(page.entries);
        let enough = wanted.is_some_and(|n| read >= n);
        match page.earlier {
            // An empty page cannot move the next one back: it is the start.
            Some(earlier) if !enough && !empty => up_to = Some(earlier),
            earlier => {
                let mut entries: Vec<Event> = pages.into_iter().rev().flatten().collect();
                let extra = wanted.map_or(0, |n| entries.len().saturating_sub(n));
                entries.drain(..extra);
                return Ok(ReadBack {
                    entries,
                    more: earlier.is_some() || extra > 0,
                    truncated: page.truncated,
                });
            }
        }
    }
}

/// One page of `session/history` (the `cursor` it was read up to is not needed here).
async fn read_page(
    client: &RacpClient,
    params: SessionHistoryParams,
) -> Result<HistoryPage, Failure> {
    let page = call_resending::<calls::SessionHistory>(client, params).await?;
    Ok(page.into_page())
}

/// The `limit` of the next page: what is left to read, at most the host's page bound.
fn page_limit(left: Option<usize>) -> u32 {
    let most = MAX_HISTORY_LIMIT as usize;
    u32::try_from(left.unwrap_or(most).clamp(1, most)).unwrap_or(MAX_HISTORY_LIMIT)
}

/// Prints history entries with the human view (nothing with `--json`: the caller prints the
/// events as they are).
pub(crate) fn print_entries(out: &Out, view: &mut View, entries: &[Event]) {
    if out.json {
        return;
    }
    for entry in entries {
        out.text(&view.entry(entry));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_asks_for_what_is_left_within_the_hosts_bound() {
        assert_eq!(page_limit(None), MAX_HISTORY_LIMIT);
        assert_eq!(page_limit(Some(3)), 3);
        assert_eq!(page_limit(Some(0)), 1);
        assert_eq!(page_limit(Some(5000)), MAX_HISTORY_LIMIT);
    }

    #[test]
    fn a_reply_reads_as_its_page() {
        let reply = serde_json::json!({
            "cursor": "0f3a9c2e11d04b7a-37",
            "entries": [{"seq": 36, "cursor": "0f3a9c2e11d04b7a-36", "type": "agent.message_end",
                "at": 1, "turnId": "turn_0", "data": {"type": "message_end",
                "message": {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}}}],
            "earlier": "0f3a9c2e11d04b7a-29"
        });
        let page: HistoryPage = serde_json::from_value(reply).unwrap();
        assert_eq!(page.entries.len(), 1);
        assert!(page.earlier.is_some() && !page.truncated);
    }
}
