//! The gateway's HTTP side: `/racp` (the gateway itself: pairing, devices, `host/list`) and
//! `/racp/hosts/{hostId}` (one host through the gateway), with the host's upgrade checks.

use crate::devices::Caller;
use crate::state::Gateway;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use racp_proto::{AppError, ENDPOINT_PATH, ErrorCode};
use racp_server::connections::Slot;
use racp_server::socket::{Upgrade, UpgradeRejection};
use racp_server::upgrade::{check_host_header, presented_token, refusal};
use serde_json::json;
use std::sync::Arc;

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route(ENDPOINT_PATH, get(gateway_endpoint))
        .route(
            &format!("{ENDPOINT_PATH}/hosts/{{host_id}}"),
            get(host_endpoint),
        )
        .with_state(gateway)
}

async fn gateway_endpoint(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    ws: Result<Upgrade, UpgradeRejection>,
) -> Response {
    upgrade(gateway, headers, ws, None).await
}

async fn host_endpoint(
    State(gateway): State<Arc<Gateway>>,
    Path(host_id): Path<String>,
    headers: HeaderMap,
    ws: Result<Upgrade, UpgradeRejection>,
) -> Response {
    upgrade(gateway, headers, ws, Some(host_id)).await
}

async fn upgrade(
    gateway: Arc<Gateway>,
    headers: HeaderMap,
    ws: Result<Upgrade, UpgradeRejection>,
    host: Option<String>,
) -> Response {
    let (caller, slot) = match admit(&gateway, &headers, host.as_deref()).await {
        Ok(admitted) => admitted,
        Err(error) => return refusal(error),
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => {
            return refusal(
                AppError::new(
                    ErrorCode::InvalidArgument,
                    format!("not a WebSocket upgrade: {rejection}"),
                )
                .with_details(json!({"reason": "not_websocket_upgrade"})),
            );
        }
    };
    // Where this desktop reached the gateway (a name the Host check accepted): pairing links
    // minted on the connection point there, not at a wildcard or internal listen address.
    let reached_as = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map_or_else(|| gateway.settings.listen.to_string(), str::to_string);
    let (max_frame_bytes, budget) = (gateway.settings.max_frame_bytes, gateway.budget.clone());
    ws.on_upgrade(max_frame_bytes, budget, move |socket| {
        crate::connection::run(socket, gateway, caller, host, slot, reached_as)
    })
}

async fn admit(
    gateway: &Gateway,
    headers: &HeaderMap,
    host: Option<&str>,
) -> Result<(Caller, Slot), AppError> {
    check_host_header(headers, &gateway.settings.allowed_hosts)?;
    let token = presented_token(headers, &gateway.settings.allowed_origins)?;
    if !gateway.nats_up() {
        return Err(crate::hosts::nats_down(&"not connected"));
    }
    let caller = gateway
        .devices
        .authenticate(token, racp_server::clock::now_ms())
        .await?;
    if let Some(host) = host {
        let Caller::Device(device) = &caller else {
            return Err(AppError::new(
                ErrorCode::Unauthorized,
                format!("pair on {ENDPOINT_PATH}, not on a host's path"),
            ));
        };
        if !device.may_reach(host) {
            return Err(crate::hosts::forbidden_host(host));
        }
        if !racp_proto::gateway::valid_host_id(host)
            || crate::hosts::seen(&gateway.hosts, host).await?.is_none()
        {
            return Err(AppError::new(
                ErrorCode::NotFound,
                "no host with this id is enrolled with the gateway",
            )
            .with_details(json!({"hostId": host})));
        }
    }
    // A place is taken here, not when the connection starts: concurrent upgrades cannot all
    // pass the cap before any of them is counted.
    let slot = gateway
        .connections
        .admit(gateway.settings.max_connections)
        .ok_or_else(|| {
            AppError::new(
                ErrorCode::HostOverloaded,
                "this gateway replica has as many connections as it accepts; try another",
            )
            .with_retry_after_ms(1000)
        })?;
    Ok((caller, slot))
}
