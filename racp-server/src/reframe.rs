//! The socket under tungstenite (docs/reliability.md §4.10, "Memory"): it hands a client's
//! large frames on as fragments of [`FRAGMENT`] bytes and charges what a message holds to the
//! server's [`ByteBudget`] as it arrives.
//!
//! Why: tungstenite reads a frame into its read buffer whole, reserving the frame's declared
//! length, and the buffer keeps that capacity for the connection's life. One frame just under
//! the 4 MiB hard cap left every connection holding 4 MiB. Fragments keep that buffer at a few
//! KiB; tungstenite collects a fragmented message into a string of its own that goes with the
//! message. Fragmenting is the peer's right (RFC 6455 §5.4), so tungstenite reads the same
//! message; the fragments keep the client's mask, which stays aligned because [`FRAGMENT`] is
//! a multiple of 4 (§5.3 masks byte i with key i mod 4).
//!
//! Frames it does not cut are handed on as they came: control frames, frames of at most
//! [`FRAGMENT`] bytes, and frames tungstenite refuses by their header (past the hard cap,
//! unmasked, reserved bits set), so those errors are unchanged.

use crate::budget::{ByteBudget, Charge};
use racp_proto::AppError;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest piece of a client frame tungstenite reads at once (a multiple of 4).
pub const FRAGMENT: u64 = 8 << 10;

/// Bytes of the longest frame header: 2, 8 of extended length, 4 of mask.
const MAX_HEADER: usize = 14;

const CONTINUATION: u8 = 0x0;

/// The read error of a message refused because the budget is full; the connection ends with
/// the error it carries (`socket::read_failure`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OverBudget(pub AppError);

pub struct Reframe<S> {
    inner: S,
    budget: ByteBudget,
    hard_cap: u64,
    state: State,
    /// What the data message being read holds so far.
    reading: Option<Charge>,
    /// What the last complete message holds, until the connection has handled it.
    read: Option<Charge>,
    /// The rest of a message the server began sending in fragments (`socket::feed`).
    pub(crate) sending: Option<Sending>,
}

/// A message being sent in fragments: its bytes and how far they went out.
#[derive(Clone)]
pub(crate) struct Sending {
    pub(crate) bytes: tokio_tungstenite::tungstenite::Bytes,
    pub(crate) at: usize,
}

enum State {
    /// Reading a frame's header from the client: `need` is known once two bytes are in.
    Header {
        bytes: [u8; MAX_HEADER],
        have: usize,
        need: usize,
    },
    /// Handing on a header (the client's or one of ours), then its payload.
    Emit {
        bytes: [u8; MAX_HEADER],
        len: usize,
        at: usize,
        payload: Payload,
    },
    Payload(Payload),
}

#[derive(Clone, Copy)]
struct Payload {
    /// Bytes of the frame tungstenite sees still to hand on.
    left: u64,
    /// A data frame whose last byte ends its message.
    ends_message: bool,
    /// The client's frame continues in fragments of ours after this one.
    split: Option<Split>,
}

#[derive(Clone, Copy)]
struct Split {
    left: u64,
    fin: bool,
    mask: [u8; 4],
}

/// A client frame's header as read.
struct Header {
    fin: bool,
    opcode: u8,
    reserved: bool,
    mask: Option<[u8; 4]>,
    len: u64,
}

impl<S> Reframe<S> {
    pub fn new(inner: S, budget: ByteBudget, hard_cap: usize) -> Reframe<S> {
        Reframe {
            inner,
            budget,
            hard_cap: hard_cap as u64,
            state: State::header(),
            reading: None,
            read: None,
            sending: None,
        }
    }

    /// Ends the charge of the last message read: the connection is done with it.
    pub fn release_read(&mut self) {
        self.read = None;
    }

    /// Decides how the frame whose header is `bytes` goes on, charging it if it must be.
    fn on_header(&mut self, bytes: [u8; MAX_HEADER], need: usize) -> io::Result<()> {
        let header = Header::parse(&bytes[..need]);
        let data = header.opcode <= 2;
        let splits = data
            && !header.reserved
            && header.len > FRAGMENT
            && header.len <= self.hard_cap
            && header.mask.is_some();
        // A message of one small frame is read at once and handled at once: not charged, like
        // any small request (the connection's cap bounds those).
        let whole_small = data && header.opcode != CONTINUATION && header.fin && !splits;
        if data && !whole_small && header.len <= self.hard_cap {
            let first = header.len.min(FRAGMENT) as usize;
            self.charge(first)?;
        }
        let ends_message = data && header.fin;
        self.state = match (splits, header.mask) {
            (true, Some(mask)) => {
                let split = Split {
                    left: header.len - FRAGMENT,
                    fin: header.fin,
                    mask,
                };
                let (bytes, len) = fragment_header(header.opcode, false, FRAGMENT, mask);
                State::Emit {
                    bytes,
                    len,
                    at: 0,
                    payload: Payload {
                        left: FRAGMENT,
                        ends_message: false,
                        split: Some(split),
                    },
                }
            }
            _ => State::Emit {
                bytes,
                len: need,
                at: 0,
                payload: Payload {
                    left: header.len,
                    ends_message,
                    split: None,
                },
            },
        };
        Ok(())
    }

    /// Charges `bytes` more of the message being read; refused, the message is given up (the
    /// connection ends) and what it held is released.
    fn charge(&mut self, bytes: usize) -> io::Result<()> {
        let charge = self.reading.get_or_insert_with(|| self.budget.empty());
        charge.grow(bytes).map_err(|error| {
            self.reading = None;
            io::Error::other(OverBudget(error))
        })
    }

    /// The payload handed on is complete: the next fragment of ours, or the next header.
    fn payload_done(&mut self, payload: Payload) -> io::Result<()> {
        if payload.ends_message {
            self.read = self.reading.take();
        }
        self.state = match payload.split {
            None => State::header(),
            Some(split) => {
                let len = split.left.min(FRAGMENT);
                self.charge(len as usize)?;
                let rest = split.left - len;
                let fin = split.fin && rest == 0;
                let (bytes, header_len) = fragment_header(CONTINUATION, fin, len, split.mask);
                State::Emit {
                    bytes,
                    len: header_len,
                    at: 0,
                    payload: Payload {
                        left: len,
                        ends_message: fin,
                        split: (rest > 0).then_some(Split {
                            left: rest,
                            ..split
                        }),
                    },
                }
            }
        };
        Ok(())
    }
}

impl State {
    fn header() -> State {
        State::Header {
            bytes: [0; MAX_HEADER],
            have: 0,
            need: 2,
        }
    }
}

impl Header {
    /// `bytes` is a whole header (its length checked by [`header_len`]).
    fn parse(bytes: &[u8]) -> Header {
        let (b0, b1) = (bytes[0], bytes[1]);
        let (len, at) = match b1 & 0x7F {
            126 => (u64::from(u16::from_be_bytes([bytes[2], bytes[3]])), 4),
            127 => {
                let mut word = [0; 8];
                word.copy_from_slice(&bytes[2..10]);
                (u64::from_be_bytes(word), 10)
            }
            short => (u64::from(short), 2),
        };
        let mask =
            (b1 & 0x80 != 0).then(|| [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        Header {
            fin: b0 & 0x80 != 0,
            opcode: b0 & 0x0F,
            reserved: b0 & 0x70 != 0,
            mask,
            len,
        }
    }
}

/// A header's whole length from its first two bytes.
fn header_len(b1: u8) -> usize {
    let extended = match b1 & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    2 + extended + if b1 & 0x80 != 0 { 4 } else { 0 }
}

/// A masked frame header of ours for `len` (at most [`FRAGMENT`]) payload bytes.
fn fragment_header(opcode: u8, fin: bool, len: u64, mask: [u8; 4]) -> ([u8; MAX_HEADER], usize) {
    let mut bytes = [0; MAX_HEADER];
    bytes[0] = opcode | if fin { 0x80 } else { 0 };
    let mut at = 2;
    if len < 126 {
        bytes[1] = 0x80 | len as u8;
    } else {
        bytes[1] = 0x80 | 126;
        bytes[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        at = 4;
    }
    bytes[at..at + 4].copy_from_slice(&mask);
    (bytes, at + 4)
}

impl<S: AsyncRead + Unpin> AsyncRead for Reframe<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Header { bytes, have, need } => {
                    let mut part = ReadBuf::new(&mut bytes[*have..*need]);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut part))?;
                    let read = part.filled().len();
                    if read == 0 {
                        // The client went away; tungstenite tells a cut frame from a clean end.
                        return Poll::Ready(Ok(()));
                    }
                    *have += read;
                    if *have == 2 {
                        *need = header_len(bytes[1]);
                    }
                    if *have == *need {
                        let (bytes, need) = (*bytes, *need);
                        this.on_header(bytes, need)?;
                    }
                }
                State::Emit {
                    bytes,
                    len,
                    at,
                    payload,
                } => {
                    let n = (*len - *at).min(buf.remaining());
                    buf.put_slice(&bytes[*at..*at + n]);
                    *at += n;
                    if *at == *len {
                        let payload = *payload;
                        if payload.left == 0 {
                            this.payload_done(payload)?;
                        } else {
                            this.state = State::Payload(payload);
                        }
                    }
                    return Poll::Ready(Ok(()));
                }
                State::Payload(payload) => {
                    let room = buf
                        .remaining()
                        .min(usize::try_from(payload.left).unwrap_or(usize::MAX));
                    let mut part = ReadBuf::new(buf.initialize_unfilled_to(room));
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut part))?;
                    let read = part.filled().len();
                    buf.advance(read);
                    if read == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    payload.left -= read as u64;
                    if payload.left == 0 {
                        let payload = *payload;
                        this.payload_done(payload)?;
                    }
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Reframe<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use racp_proto::ErrorCode;
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
    use tokio_tungstenite::tungstenite::{Error, Message};

    type Server = WebSocketStream<Reframe<tokio::io::DuplexStream>>;

    /// A client and a server over a pipe; the server reads through `Reframe` and refuses any
    /// frame larger than a fragment, so a frame passed on whole fails the test.
    async fn pair(budget: &ByteBudget) -> (WebSocketStream<tokio::io::DuplexStream>, Server) {
        let (client, server) = tokio::io::duplex(1 << 20);
        let client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        let config = WebSocketConfig::default()
            .max_frame_size(Some(FRAGMENT as usize + MAX_HEADER))
            .max_message_size(Some(4 << 20));
        let reframed = Reframe::new(server, budget.clone(), 4 << 20);
        let server = WebSocketStream::from_raw_socket(reframed, Role::Server, Some(config)).await;
        (client, server)
    }

    /// Text of `bytes` bytes whose two-byte characters straddle the fragments' edges.
    fn text(bytes: usize) -> String {
        let mut text = "a".repeat(bytes % 2);
        text.push_str(&"é".repeat(bytes / 2));
        text
    }

    #[tokio::test]
    async fn a_large_frame_arrives_whole_in_fragments_and_its_charge_ends_when_released() {
        let budget = ByteBudget::new(1 << 20);
        let (mut client, mut server) = pair(&budget).await;
        for bytes in [100, FRAGMENT as usize, FRAGMENT as usize + 1, 100_001] {
            let sent = text(bytes);
            client.send(Message::text(sent.clone())).await.unwrap();
            let Some(Ok(Message::Text(got))) = server.next().await else {
                panic!("no text message of {bytes} bytes");
            };
            assert_eq!(got.as_str(), sent);
            // One small frame is not charged; a larger one is, until the server is done with it.
            let charged = if bytes <= FRAGMENT as usize { 0 } else { bytes };
            assert_eq!(budget.held(), charged, "{bytes}");
            server.get_mut().release_read();
            assert_eq!(budget.held(), 0);
        }
        // Control frames between messages pass as they are.
        client.send(Message::Ping(vec![1, 2].into())).await.unwrap();
        assert!(matches!(server.next().await, Some(Ok(Message::Ping(_)))));
    }

    #[tokio::test]
    async fn a_message_that_fills_the_budget_is_read_and_one_byte_more_is_refused() {
        let limit = 64 << 10;
        let budget = ByteBudget::new(limit);
        let (mut client, mut server) = pair(&budget).await;
        client.send(Message::text(text(limit))).await.unwrap();
        assert!(matches!(server.next().await, Some(Ok(Message::Text(_)))));
        server.get_mut().release_read();
        client.send(Message::text(text(limit + 1))).await.unwrap();
        let Some(Err(Error::Io(err))) = server.next().await else {
            panic!("the message over the budget was read");
        };
        let over = err.get_ref().and_then(|e| e.downcast_ref::<OverBudget>());
        assert_eq!(over.map(|o| o.0.code()), Some(ErrorCode::HostOverloaded));
        assert_eq!(
            budget.held(),
            0,
            "what the refused message held is released"
        );
    }
}
