//! The HTTP server: the `/racp` endpoint, and serving until a shutdown signal.

mod connection;
mod subscriptions;
pub mod upgrade;

pub use racp_server::{answer_close, elide, identity, listener, tls};

use crate::state::HostState;
use axum::Router;
use axum::extract::State;
use axum::extract::ws::{WebSocketUpgrade, rejection::WebSocketUpgradeRejection};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use racp_proto::{AppError, ENDPOINT_PATH, ErrorCode, SUBPROTOCOL};
use std::sync::Arc;

/// Initial read buffer of a connection. Clients send small requests, and this buffer is a third
/// of what an idle connection costs (9.3 KiB with 4 KiB, 6.2 KiB with 1 KiB, at 10k
/// connections); a larger frame grows it as needed.
const READ_BUFFER: usize = 1 << 10;
/// Bytes of queued frames a connection collects before writing to its socket.
const WRITE_BUFFER: usize = 64 << 10;

pub fn router(state: Arc<HostState>) -> Router {
    Router::new()
        .route(ENDPOINT_PATH, get(upgrade_handler))
        .with_state(state)
}

async fn upgrade_handler(
    State(state): State<Arc<HostState>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let (credential, slot) = match upgrade::admit(&state, &headers) {
        Ok(admitted) => admitted,
        Err(error) => return upgrade::refusal(error),
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => {
            return upgrade::refusal(
                AppError::new(
                    ErrorCode::InvalidArgument,
                    format!("not a WebSocket upgrade: {rejection}"),
                )
                .with_details(serde_json::json!({"reason": "not_websocket_upgrade"})),
            );
        }
    };
    #[cfg(debug_assertions)]
    crate::test_hooks::after_admission().await;
    let host_bound = state.config.limits.max_frame_bytes as usize;
    // tungstenite buffers a whole message before we see it. Frames up to four times the host's
    // bound reach the codec and get a PAYLOAD_TOO_LARGE reply (the connection lives on); larger
    // ones end the connection before the host holds them. Only authenticated devices get here.
    let hard_cap = host_bound * 4;
    ws.protocols([SUBPROTOCOL])
        .read_buffer_size(READ_BUFFER)
        // Frames queued together leave in one write (see connection::send_all); a larger frame
        // is written as soon as it is queued.
        .write_buffer_size(WRITE_BUFFER)
        // Frames are cut to the connection's negotiated bound (racp-server/src/elide.rs), which is at
        // most the hard cap; the write buffer must take a whole frame, with room to spare.
        .max_write_buffer_size(hard_cap.max(32 << 20))
        .max_message_size(hard_cap)
        .max_frame_size(hard_cap)
        .on_upgrade(move |socket| connection::run(socket, state, credential, slot))
}

/// The pairing link for `token` (docs/protocol.md §5.3): with TLS it names the certificate
/// fingerprint the new device pins.
pub fn pairing_url(config: &crate::config::ServeConfig, token: &str) -> String {
    identity::pairing_link(
        &config.listen.to_string(),
        config.cert_sha256.as_ref(),
        config.tls.is_some(),
        token,
    )
}
