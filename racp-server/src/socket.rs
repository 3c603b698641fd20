//! One RACP-WS socket as a host and a gateway both drive it: its WebSocket settings, writing
//! queued frames, the connection error that ends it, and what a failed read means.

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use futures_util::SinkExt;
use racp_proto::frame::{ConnectionError, ErrorReply, RequestId};
use racp_proto::{AppError, ErrorCode, SUBPROTOCOL};
use serde_json::json;

/// Initial read buffer of a connection. Clients send small requests, and this buffer is a third
/// of what an idle connection costs (9.3 KiB with 4 KiB, 6.2 KiB with 1 KiB, at 10k
/// connections); a larger frame grows it as needed.
const READ_BUFFER: usize = 1 << 10;
/// Bytes of queued frames a connection collects before writing to its socket.
const WRITE_BUFFER: usize = 64 << 10;

/// How long the final connection error may wait for the socket to take it.
pub const FINAL_FRAME_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The largest message read whole for a server whose frame bound is `max_frame_bytes`:
/// tungstenite buffers a whole message before we see it. Frames up to four times the bound
/// reach the codec and get a PAYLOAD_TOO_LARGE reply (the connection lives on); larger ones end
/// the connection before the server holds them.
pub fn hard_cap(max_frame_bytes: u32) -> usize {
    max_frame_bytes as usize * 4
}

/// The upgrade with `racp.v1` and the socket's buffers and bounds.
pub fn configure(ws: WebSocketUpgrade, max_frame_bytes: u32) -> WebSocketUpgrade {
    let hard_cap = hard_cap(max_frame_bytes);
    ws.protocols([SUBPROTOCOL])
        .read_buffer_size(READ_BUFFER)
        // Frames queued together leave in one write (`send_all`); a larger frame is written as
        // soon as it is queued.
        .write_buffer_size(WRITE_BUFFER)
        // Frames are cut to the connection's negotiated bound (elide.rs), which is at most the
        // hard cap; the write buffer must take a whole frame, with room to spare.
        .max_write_buffer_size(hard_cap.max(32 << 20))
        .max_message_size(hard_cap)
        .max_frame_size(hard_cap)
}

/// Queues every frame, then flushes once: small frames leave in one write instead of one each.
pub async fn send_all(socket: &mut WebSocket, frames: Vec<String>) -> Result<(), axum::Error> {
    for frame in frames {
        socket.feed(Message::Text(Utf8Bytes::from(frame))).await?;
    }
    socket.flush().await
}

/// Sends a connection error, then closes with its close code (1001 when draining) and the
/// code's name as the reason.
pub async fn close_with(socket: &mut WebSocket, error: AppError) {
    let code = if error.code() == ErrorCode::HostShuttingDown {
        1001
    } else {
        error.close_code()
    };
    let reason = error.code().as_str();
    let frame = crate::wire::encode(&ConnectionError { error });
    let _ = socket.send(Message::Text(Utf8Bytes::from(frame))).await;
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
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
pub fn read_failure(err: axum::Error, max_frame_bytes: u32, negotiated: usize) -> Option<AppError> {
    use tungstenite::error::ProtocolError;
    let inner = err.into_inner();
    match inner.downcast_ref::<tungstenite::Error>()? {
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
