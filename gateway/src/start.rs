//! Where a subscription starts (docs/protocol.md §15.3): from a cursor within what the session's
//! stream holds, from the host's head when the stream holds none of the session's events yet,
//! or CURSOR_EXPIRED; and where the session's feed would start.

use crate::devices::DeviceRecord;
use crate::hosts;
use crate::state::Gateway;
use crate::stream::{self, Span};
use racp_proto::methods::session::{SessionRef, SessionState};
use racp_proto::{AppError, Cursor, Epoch, Expired, HostCall};
use racp_server::wire::to_raw;
use std::time::Duration;

/// How long a subscribe behind the host's head waits for the host's relay to put the session's
/// events in a stream that holds none of them, before it answers CURSOR_EXPIRED.
const RELAY_WAIT: Duration = Duration::from_secs(3);

/// The session a subscription follows: its host, and the device that asks the host for its
/// head when the stream cannot say where the session is.
pub struct Origin<'a> {
    pub gateway: &'a Gateway,
    pub device: &'a DeviceRecord,
    pub host: &'a str,
    pub session_id: &'a str,
}

/// Where a subscription starts: the session's epoch, the RACP seq after which it delivers and
/// the stream sequence it reads from; and where the session's feed would start: the head's
/// RACP seq, the stream sequence after it, and whether the session is closed there.
pub struct StartPoint {
    pub epoch: Epoch,
    pub after: u64,
    pub stream_sequence: u64,
    pub head: u64,
    pub after_head: u64,
    pub closed: bool,
}

/// The events of one epoch a session's stream holds: the seqs after `oldest` up to `head`.
#[derive(Clone, Copy)]
struct Window {
    epoch: Epoch,
    oldest: u64,
    head: u64,
}

/// A session's head as its host has it.
struct HostHead {
    epoch: Epoch,
    seq: u64,
    closed: bool,
}

/// Where a subscription from `cursor` (`None`: the head) to `subject` in `stream` starts.
pub async fn start_point(
    origin: &Origin<'_>,
    stream: &stream::Stream,
    subject: &str,
    cursor: Option<Cursor>,
) -> Result<StartPoint, AppError> {
    let waiting_since = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(25);
    loop {
        let span = stream::span(stream, subject).await?;
        let Span::Events {
            epoch,
            first,
            last,
            closed,
        } = span
        else {
            let head = host_head(origin).await?;
            if let Some(point) = start_before_relay(&head, cursor)? {
                return Ok(point);
            }
            // Behind the host's head: the events after the cursor are on their way from
            // the host, or retention removed them all. Only the first is worth waiting for.
            if waiting_since.elapsed() < RELAY_WAIT {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(400));
                continue;
            }
            let (epoch, head) = (head.epoch, head.seq);
            return Err(Expired::OlderThanWindow.error(epoch, head, head));
        };
        let (oldest, head) = (first.0.saturating_sub(1), last.0);
        let window = Window {
            epoch,
            oldest,
            head,
        };
        let after = start_after(origin, cursor, window).await?;
        let stream_sequence = stream::stream_start(stream, subject, after, first, last).await?;
        return Ok(StartPoint {
            epoch,
            after,
            stream_sequence,
            head,
            after_head: last.1 + 1,
            closed,
        });
    }
}

/// The seq a subscription from `cursor` starts after, in a stream that holds `window`.
async fn start_after(
    origin: &Origin<'_>,
    cursor: Option<Cursor>,
    window: Window,
) -> Result<u64, AppError> {
    let Window {
        epoch,
        oldest,
        head,
    } = window;
    match cursor {
        None => Ok(head),
        Some(cursor) if cursor.epoch != epoch => {
            Err(Expired::OtherEpoch.error(epoch, oldest, head))
        }
        Some(cursor) if cursor.seq < oldest => {
            Err(Expired::OlderThanWindow.error(epoch, oldest, head))
        }
        Some(cursor) if cursor.seq > head => {
            // Ahead of the stream: valid only if the host has it (not yet relayed).
            let at_host = host_head(origin).await?;
            if at_host.epoch != epoch || cursor.seq > at_host.seq {
                return Err(Expired::AheadOfHead.error(epoch, oldest, head));
            }
            Ok(cursor.seq)
        }
        Some(cursor) => Ok(cursor.seq),
    }
}

/// The session's head cursor as its host has it (`session/get` routed to the host).
async fn host_head(origin: &Origin<'_>) -> Result<HostHead, AppError> {
    let session = SessionRef {
        session_id: origin.session_id.to_string(),
    };
    let params = to_raw(&session)?;
    let call = HostCall::SessionGet(session);
    let routed = hosts::Routed::new(&call, Some(&params));
    let gateway = origin.gateway;
    let (host, device) = (origin.host, origin.device);
    let got = hosts::route(&gateway.client, &gateway.signer, host, device, routed).await?;
    #[derive(serde::Deserialize)]
    struct Got {
        session: Session,
        cursor: Cursor,
    }
    #[derive(serde::Deserialize)]
    struct Session {
        state: SessionState,
    }
    serde_json::from_str::<Got>(got.get())
        .map(|got| HostHead {
            epoch: got.cursor.epoch,
            seq: got.cursor.seq,
            closed: got.session.state == SessionState::Closed,
        })
        .map_err(|e| hosts::internal(&e))
}

/// Where a subscription starts when the stream holds none of the session's events: from the
/// host's head, or from a cursor at it; `None` for a cursor behind it.
fn start_before_relay(
    head: &HostHead,
    cursor: Option<Cursor>,
) -> Result<Option<StartPoint>, AppError> {
    let after = match cursor {
        None => head.seq,
        Some(cursor) if cursor.epoch != head.epoch => {
            return Err(Expired::OtherEpoch.error(head.epoch, 0, head.seq));
        }
        Some(cursor) if cursor.seq > head.seq => {
            return Err(Expired::AheadOfHead.error(head.epoch, 0, head.seq));
        }
        Some(cursor) if cursor.seq < head.seq => return Ok(None),
        Some(cursor) => cursor.seq,
    };
    Ok(Some(StartPoint {
        epoch: head.epoch,
        after,
        stream_sequence: 1,
        head: head.seq,
        after_head: 1,
        closed: head.closed,
    }))
}
