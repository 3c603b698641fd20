//! One RACP-WS socket as a host and a gateway both drive it: the upgrade, its WebSocket
//! settings, writing queued frames, the connection error that ends it, and what a failed read
//! means.
//!
//! The upgrade is this crate's, not axum's, so that the socket tungstenite reads from is
//! `reframe.rs`'s, which keeps a connection's read buffer small whatever the client sends and
//! charges large requests to the server's byte budget (docs/reliability.md §4.18).

use crate::budget::ByteBudget;
use crate::reframe::{OverBudget, Reframe, Sending};
use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::SinkExt;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use racp_proto::frame::{ConnectionError, ErrorReply, RequestId};
use racp_proto::{AppError, ErrorCode, SUBPROTOCOL};
use serde_json::json;
use std::future::Future;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{CloseFrame, Frame, Utf8Bytes};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Bytes, Message};

pub use tokio_tungstenite::tungstenite::Error as WsError;

/// An upgraded RACP-WS connection.
pub type Socket = WebSocketStream<Reframe<TokioIo<hyper::upgrade::Upgraded>>>;

/// Initial read buffer of a connection. Clients send small requests, and this buffer is a third
/// of what an idle connection costs (9.3 KiB with 4 KiB, 6.2 KiB with 1 KiB, at 10k
/// connections); a larger frame grows it up to `reframe::FRAGMENT`, never more.
const READ_BUFFER: usize = 1 << 10;
/// Bytes of queued frames a connection collects before writing to its socket.
const WRITE_BUFFER: usize = 64 << 10;
/// A frame longer than this is sent as fragments of it: tungstenite copies a frame whole into
/// its write buffer, which keeps the capacity for the connection's life.
const SEND_FRAGMENT: usize = 16 << 10;

/// How long the final connection error may wait for the socket to take it.
pub const FINAL_FRAME_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The largest message read whole for a server whose frame bound is `max_frame_bytes`:
/// tungstenite buffers a whole message before we see it. Frames up to four times the bound
/// reach the codec and get a PAYLOAD_TOO_LARGE reply (the connection lives on); larger ones end
/// the connection before the server holds them.
pub fn hard_cap(max_frame_bytes: u32) -> usize {
    max_frame_bytes as usize * 4
}

/// The socket's buffers and bounds.
fn config(max_frame_bytes: u32) -> WebSocketConfig {
    let hard_cap = hard_cap(max_frame_bytes);
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        // Frames queued together leave in one write (`send_all`); a larger frame is written as
        // soon as it is queued.
        .write_buffer_size(WRITE_BUFFER)
        // Frames are sent in fragments of SEND_FRAGMENT; the write buffer takes a few.
        .max_write_buffer_size(WRITE_BUFFER * 4)
        .max_message_size(Some(hard_cap))
        .max_frame_size(Some(hard_cap))
}

/// A WebSocket upgrade request (RFC 6455 §4.2.1), answered with `racp.v1`.
pub struct Upgrade {
    key: HeaderValue,
    protocol: Option<HeaderValue>,
    on_upgrade: OnUpgrade,
}

/// Why a request is not a WebSocket upgrade.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeRejection {
    #[error("the request method must be GET")]
    MethodNotGet,
    #[error("the `Connection` header must name `upgrade`")]
    Connection,
    #[error("the `Upgrade` header must be `websocket`")]
    UpgradeHeader,
    #[error("the `Sec-WebSocket-Version` header must be 13")]
    Version,
    #[error("the `Sec-WebSocket-Key` header is missing")]
    Key,
    #[error("this connection cannot be upgraded")]
    NotUpgradable,
}

impl IntoResponse for UpgradeRejection {
    fn into_response(self) -> Response {
        (StatusCode::BAD_REQUEST, self.to_string()).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = UpgradeRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let headers = &parts.headers;
        if parts.method != Method::GET {
            return Err(UpgradeRejection::MethodNotGet);
        }
        if !has_token(headers, header::CONNECTION, "upgrade") {
            return Err(UpgradeRejection::Connection);
        }
        if !has_token(headers, header::UPGRADE, "websocket") {
            return Err(UpgradeRejection::UpgradeHeader);
        }
        if headers
            .get(header::SEC_WEBSOCKET_VERSION)
            .map(HeaderValue::as_bytes)
            != Some(b"13")
        {
            return Err(UpgradeRejection::Version);
        }
        let key = headers
            .get(header::SEC_WEBSOCKET_KEY)
            .ok_or(UpgradeRejection::Key)?
            .clone();
        let protocol = has_token(headers, header::SEC_WEBSOCKET_PROTOCOL, SUBPROTOCOL)
            .then_some(HeaderValue::from_static(SUBPROTOCOL));
        let on_upgrade = parts
            .extensions
            .remove::<OnUpgrade>()
            .ok_or(UpgradeRejection::NotUpgradable)?;
        Ok(Upgrade {
            key,
            protocol,
            on_upgrade,
        })
    }
}

/// One of the comma-separated tokens of a header is `token` (without regard to case).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

impl Upgrade {
    /// The 101 answer; `serve` runs on the socket once the upgrade is done. `max_frame_bytes`
    /// is the server's frame bound, `budget` what its connections' requests are charged to.
    pub fn on_upgrade<F, Fut>(self, max_frame_bytes: u32, budget: ByteBudget, serve: F) -> Response
    where
        F: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let on_upgrade = self.on_upgrade;
        tokio::spawn(async move {
            let upgraded = match on_upgrade.await {
                Ok(upgraded) => upgraded,
                Err(err) => {
                    tracing::debug!(error = %err, "the WebSocket upgrade failed");
                    return;
                }
            };
            let io = Reframe::new(TokioIo::new(upgraded), budget, hard_cap(max_frame_bytes));
            let config = Some(config(max_frame_bytes));
            let socket = WebSocketStream::from_raw_socket(io, Role::Server, config).await;
            serve(socket).await;
        });
        let accept =
            tokio_tungstenite::tungstenite::handshake::derive_accept_key(self.key.as_bytes());
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(accept) = HeaderValue::from_str(&accept) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        if let Some(protocol) = self.protocol {
            headers.insert(header::SEC_WEBSOCKET_PROTOCOL, protocol);
        }
        response
    }
}

/// Queues every frame, then flushes once: small frames leave in one write instead of one each.
pub async fn send_all(socket: &mut Socket, frames: Vec<String>) -> Result<(), WsError> {
    for frame in frames {
        feed(socket, frame).await?;
    }
    socket.flush().await
}

/// Queues one text frame, as fragments of [`SEND_FRAGMENT`] when longer (RFC 6455 §5.4: every
/// client reads a fragmented message as the one message).
async fn feed(socket: &mut Socket, frame: String) -> Result<(), WsError> {
    finish_message(socket).await?;
    if frame.len() <= SEND_FRAGMENT {
        return socket.feed(Message::Text(Utf8Bytes::from(frame))).await;
    }
    socket.get_mut().sending = Some(Sending {
        bytes: Bytes::from(frame),
        at: 0,
    });
    finish_message(socket).await
}

/// Sends the rest of a message begun in fragments. A send abandoned part-way (a client that
/// stopped reading, cut at the send stall) leaves one, and nothing else may go out before it
/// ends (RFC 6455 §5.4): the connection's final error follows it rather than breaking it.
async fn finish_message(socket: &mut Socket) -> Result<(), WsError> {
    while let Some(Sending { bytes, at }) = socket.get_ref().sending.clone() {
        let end = (at + SEND_FRAGMENT).min(bytes.len());
        let opcode = OpCode::Data(if at == 0 { Data::Text } else { Data::Continue });
        let fragment = Frame::message(bytes.slice(at..end), opcode, end == bytes.len());
        // `feed` takes the whole fragment or none of it, so `at` is exact when a stall drops
        // this future.
        socket.feed(Message::Frame(fragment)).await?;
        socket.get_mut().sending = (end < bytes.len()).then_some(Sending { bytes, at: end });
    }
    Ok(())
}

/// Sends a connection error, then closes with its close code (1001 when draining) and the
/// code's name as the reason.
pub async fn close_with(socket: &mut Socket, error: AppError) {
    let code = if error.code() == ErrorCode::HostShuttingDown {
        1001
    } else {
        error.close_code()
    };
    let reason = error.code().as_str();
    let frame = crate::wire::encode(&ConnectionError { error });
    let _ = send_all(socket, vec![frame]).await;
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: code.into(),
            reason: Utf8Bytes::from(reason),
        })))
        .await;
}

/// The reply to request `id` that failed with `error`.
pub fn error_reply(id: RequestId, error: AppError) -> String {
    crate::wire::encode(&ErrorReply {
        id: Some(id),
        error,
    })
}

/// The error a failed read ends the connection with: a message past the hard cap, text that
/// is not UTF-8, a protocol violation; `None` when the client simply went away.
/// `max_frame_bytes` is the server's bound (the cap is four times it), `negotiated` the
/// connection's.
pub fn read_failure(err: WsError, max_frame_bytes: u32, negotiated: usize) -> Option<AppError> {
    use tungstenite::error::ProtocolError;
    match err {
        tungstenite::Error::Io(err) => {
            let over = err.get_ref()?.downcast_ref::<OverBudget>()?;
            Some(over.0.clone())
        }
        tungstenite::Error::Capacity(_) => Some(racp_proto::codec::payload_too_large(
            hard_cap(max_frame_bytes) + 1,
            negotiated,
        )),
        tungstenite::Error::Utf8(_) => Some(
            AppError::new(
                ErrorCode::InvalidArgument,
                "a text frame is not valid UTF-8; the connection cannot continue",
            )
            .with_details(json!({"reason": "invalid_utf8"})),
        ),
        tungstenite::Error::Protocol(
            ProtocolError::ResetWithoutClosingHandshake
            | ProtocolError::SendAfterClosing
            | ProtocolError::ReceivedAfterClosing,
        ) => None,
        tungstenite::Error::Protocol(violation) => Some(
            AppError::new(
                ErrorCode::InvalidArgument,
                format!("WebSocket protocol violation: {violation}"),
            )
            .with_details(json!({"reason": "websocket_protocol"})),
        ),
        _ => None,
    }
}
