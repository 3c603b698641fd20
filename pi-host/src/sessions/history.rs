//! Reading a session's history (docs/protocol.md §7.24): pages of the stored entries
//! (`store/history.rs`) back from a cursor, each entry the event as it was delivered live, or
//! cut to a bound as in §8.6. A page read up to a cursor and a subscription from that cursor
//! together see every entry exactly once, because an entry's position is its event's.

use super::Session;
use crate::store::{EventRow, Store};
use racp_proto::elide::elide;
use racp_proto::events::Event;
use racp_proto::limits::{DEFAULT_HISTORY_LIMIT, DEFAULT_HISTORY_PAGE_BYTES};
use racp_proto::methods::session::{HistoryPage, SessionHistoryParams};
use racp_proto::{AppError, Cursor, Expired};
use racp_server::budget::Charge;

/// What a page costs the host's byte budget per byte of its bound: its entries, the result
/// written from them, and that result's copy as it is shrunk to size (measured:
/// docs/benchmarks.md, "Memory under large requests").
const HELD_PER_BYTE: usize = 3;

/// How much one page holds.
#[derive(Debug, Clone, Copy)]
pub struct PageBounds {
    pub limit: usize,
    pub max_bytes: usize,
    /// An entry larger than this is cut to it.
    pub entry_bytes: usize,
}

impl PageBounds {
    /// What a snapshot carries: the most recent 100 entries within 256 KiB, each at most 16 KiB
    /// (a large tool result cut, so it does not crowd out the messages around it).
    pub const SNAPSHOT: PageBounds = PageBounds {
        limit: 100,
        max_bytes: 256 << 10,
        entry_bytes: 16 << 10,
    };

    /// What a `session/history` call asks for.
    pub fn of(params: &SessionHistoryParams) -> PageBounds {
        let max_bytes = params.max_bytes.unwrap_or(DEFAULT_HISTORY_PAGE_BYTES) as usize;
        PageBounds {
            limit: params.limit.unwrap_or(DEFAULT_HISTORY_LIMIT) as usize,
            max_bytes,
            entry_bytes: max_bytes,
        }
    }
}

impl Session {
    /// `up_to` checked against this session's log (its epoch, not past the head; any older
    /// position is fine: the history outlives the window), or the head when absent.
    pub fn history_position(&self, up_to: Option<Cursor>) -> Result<Cursor, AppError> {
        let inner = self.lock();
        let head = inner.log.head_cursor();
        let Some(cursor) = up_to else {
            return Ok(head);
        };
        match Expired::check(cursor, head.epoch, 0, head.seq) {
            None => Ok(cursor),
            Some(reason) => Err(reason.error(head.epoch, inner.log.oldest_seq(), head.seq)),
        }
    }
}

/// The page of `session`'s history that ends at `up_to` (a position of its log). Its bound is
/// charged to `held` before the first row is read (docs/reliability.md §4.18): pages
/// that many calls build at once are refused with HOST_OVERLOADED past the host's bound
/// instead of adding up, and those admitted finish (charged as they grew, concurrent pages
/// could all run out halfway).
pub fn page(
    store: &Store,
    session_id: &str,
    up_to: Cursor,
    bounds: PageBounds,
    held: &mut Charge,
) -> Result<HistoryPage, AppError> {
    held.grow(bounds.max_bytes.saturating_mul(HELD_PER_BYTE))?;
    let mut entries: Vec<Event> = Vec::new();
    let mut bytes = 0;
    // An entry larger than the whole page comes alone (cut to the page).
    let mut alone = false;
    let back = store
        .history_back(session_id, up_to.seq, |row| {
            if entries.len() >= bounds.limit || alone {
                return false;
            }
            alone = row.json.len() > bounds.max_bytes;
            let json = fitted(&row, up_to, bounds.entry_bytes.min(bounds.max_bytes));
            if !entries.is_empty() && bytes + json.len() > bounds.max_bytes {
                return false;
            }
            match serde_json::from_str::<Event>(&json) {
                Ok(event) => {
                    bytes += json.len();
                    entries.push(event);
                }
                // Written by this host, so never the case; skipped rather than failing the page.
                Err(err) => tracing::warn!(%session_id, seq = row.seq, error = %err, "unreadable history entry"),
            }
            true
        })
        .map_err(crate::internal)?;
    entries.reverse();
    let earlier = match entries.first() {
        Some(oldest) if back.more => Some(Cursor::new(up_to.epoch, oldest.seq - 1)),
        _ => None,
    };
    Ok(HistoryPage {
        entries,
        earlier,
        truncated: back.truncated,
    })
}

/// The stored entry, or the entry cut to `bound` bytes when larger, with the `elided` marker
/// of docs/protocol.md §8.6.
fn fitted(row: &EventRow, up_to: Cursor, bound: usize) -> std::borrow::Cow<'_, str> {
    if row.json.len() <= bound {
        return row.json.as_str().into();
    }
    let from = Cursor::new(up_to.epoch, row.seq.saturating_sub(1));
    elide(&row.json, bound, bound, from).into()
}

/// The session's totals counted from its whole history up to `up_to` (docs/protocol.md
/// §7.28): read from the store, so they need no agent.
pub fn stats(
    store: &Store,
    session_id: &str,
    up_to: Cursor,
) -> Result<racp_proto::methods::session::SessionStatsResult, AppError> {
    let mut stats = racp_proto::methods::session::SessionStatsResult::default();
    let back = store
        .history_back(session_id, up_to.seq, |row| {
            match serde_json::from_str::<Event>(&row.json) {
                Ok(event) => racp_proto::pi::stats::add_entry(&mut stats, &event.kind, event.data.get()),
                Err(err) => tracing::warn!(%session_id, seq = row.seq, error = %err, "unreadable history entry"),
            }
            true
        })
        .map_err(crate::internal)?;
    stats.truncated = back.truncated;
    Ok(stats)
}
