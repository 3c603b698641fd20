//! The HTTP server: the `/racp` endpoint, and serving until a shutdown signal.

mod connection;
pub mod operator;

pub use connection::answer_routed;
pub mod upgrade;

use crate::state::HostState;
use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use racp_proto::{AppError, ENDPOINT_PATH, ErrorCode};
use racp_server::socket::{Upgrade, UpgradeRejection};
use std::sync::Arc;

pub fn router(state: Arc<HostState>) -> Router {
    Router::new()
        .route(ENDPOINT_PATH, get(upgrade_handler))
        .with_state(state)
}

async fn upgrade_handler(
    State(state): State<Arc<HostState>>,
    headers: HeaderMap,
    ws: Result<Upgrade, UpgradeRejection>,
) -> Response {
    let (caller, slot) = match upgrade::admit(&state, &headers) {
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
    // Only authenticated devices get here: the socket reads messages up to four times the
    // host's frame bound (racp_server::socket::hard_cap).
    let (max_frame_bytes, budget) = (state.config.limits.max_frame_bytes, state.budget.clone());
    ws.on_upgrade(max_frame_bytes, budget, move |socket| {
        connection::run(socket, state, caller, slot)
    })
}
