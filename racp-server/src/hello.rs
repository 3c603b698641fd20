//! What `hello` agrees on and answers, one way for a host and a gateway (docs/protocol.md
//! §5.2): the protocol version, the connection's frame bound and events per push, and the
//! result, in which a server supplies only what differs ([`Offer`]).

use crate::limits::HostLimits;
use racp_proto::limits::MIN_MAX_FRAME_BYTES;
use racp_proto::methods::handshake::{
    HelloParams, HelloResult, HostIdentity, Limits, PrincipalInfo, PrincipalKind,
};
use racp_proto::{AppError, ErrorCode, PROTOCOL_VERSION, Principal, Role};
use serde_json::json;
use std::time::Duration;

/// The bounds of one connection, agreed at `hello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    pub max_frame_bytes: u32,
    pub events_per_push: usize,
}

/// The client's wishes within the server's bounds; PROTOCOL_MISMATCH (after which nothing more
/// can be said on the connection) when it speaks no version this `server` ("host",
/// "gateway") speaks.
pub fn agree(
    params: &HelloParams,
    server: &str,
    max_frame_bytes: u32,
    max_events_per_push: usize,
) -> Result<Agreed, AppError> {
    if params.protocol.min > PROTOCOL_VERSION || params.protocol.max < PROTOCOL_VERSION {
        return Err(AppError::new(
            ErrorCode::ProtocolMismatch,
            format!("this {server} speaks protocol {PROTOCOL_VERSION} only"),
        )
        .with_details(json!({"supported": {"min": PROTOCOL_VERSION, "max": PROTOCOL_VERSION}})));
    }
    let bound = params
        .max_frame_bytes
        .map_or(max_frame_bytes, |wanted| wanted.min(max_frame_bytes))
        .max(MIN_MAX_FRAME_BYTES);
    Ok(Agreed {
        max_frame_bytes: bound,
        events_per_push: params.events_per_push(max_events_per_push),
    })
}

/// What a server says at `hello` beyond the bounds agreed with the client: who it is, what it
/// has on, its per-connection bounds and its heartbeat; and who is calling.
pub struct Offer<'a> {
    pub host: HostIdentity,
    pub principal: &'a Principal,
    /// Capabilities the server has on (a pairing connection is offered none).
    pub capabilities: Vec<String>,
    pub bounds: Bounds,
    pub heartbeat: Duration,
}

/// The per-connection bounds a server reports as they are (the frame bound and events per push
/// are agreed at `hello`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_in_flight: u32,
    pub max_subscriptions: u32,
    pub requests_per_second: u32,
    pub request_burst: u32,
}

impl From<&HostLimits> for Bounds {
    fn from(l: &HostLimits) -> Self {
        Bounds {
            max_in_flight: l.max_in_flight,
            max_subscriptions: l.max_subscriptions,
            requests_per_second: l.requests_per_second,
            request_burst: l.request_burst,
        }
    }
}

/// The limits `hello` (and a host's `host/info`) report: `bounds` with a frame bound and the
/// events per push.
pub fn limits(bounds: Bounds, max_frame_bytes: u32, events_per_push: usize) -> Limits {
    Limits {
        max_frame_bytes,
        max_events_per_push: u32::try_from(events_per_push).unwrap_or(u32::MAX),
        max_in_flight: bounds.max_in_flight,
        max_subscriptions: bounds.max_subscriptions,
        requests_per_second: bounds.requests_per_second,
        request_burst: bounds.request_burst,
    }
}

/// `hello`'s result. A pairing connection can only pair: it is offered no capabilities and no
/// subscriptions.
pub fn result(agreed: Agreed, offer: Offer<'_>) -> HelloResult {
    let pairing = matches!(offer.principal, Principal::Pairing);
    let mut limits = limits(offer.bounds, agreed.max_frame_bytes, agreed.events_per_push);
    let mut capabilities = offer.capabilities;
    if pairing {
        limits.max_subscriptions = 0;
        capabilities.clear();
    }
    HelloResult {
        protocol: PROTOCOL_VERSION,
        host: offer.host,
        principal: principal(offer.principal),
        capabilities,
        limits,
        heartbeat_ms: u64::try_from(offer.heartbeat.as_millis()).unwrap_or(u64::MAX),
    }
}

/// The caller as `hello` names it: a paired device with its roles, a pairing connection with
/// none, or the owner (a device without an id that holds the owner role).
fn principal(principal: &Principal) -> PrincipalInfo {
    match principal {
        Principal::Device { device_id, roles } => PrincipalInfo {
            kind: PrincipalKind::Device,
            device_id: Some(device_id.clone()),
            roles: roles.clone(),
        },
        Principal::Pairing => PrincipalInfo {
            kind: PrincipalKind::Pairing,
            device_id: None,
            roles: Vec::new(),
        },
        Principal::Owner => PrincipalInfo {
            kind: PrincipalKind::Device,
            device_id: None,
            roles: vec![Role::Owner],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(min: u32, max: u32, frame: Option<u32>) -> HelloParams {
        serde_json::from_value(json!({
            "protocol": {"min": min, "max": max},
            "client": {"name": "t", "version": "0"},
            "maxFrameBytes": frame,
        }))
        .unwrap()
    }

    #[test]
    fn the_bound_is_the_smaller_wish_never_below_the_floor_and_a_foreign_version_is_refused() {
        let v = PROTOCOL_VERSION;
        let agreed = agree(&params(v, v, None), "host", 1 << 20, 256).unwrap();
        assert_eq!(agreed.max_frame_bytes, 1 << 20);
        assert_eq!(agreed.events_per_push, 256);
        let smaller = agree(&params(v, v, Some(200_000)), "host", 1 << 20, 256).unwrap();
        assert_eq!(smaller.max_frame_bytes, 200_000);
        let larger = agree(&params(v, v, Some(u32::MAX)), "host", 1 << 20, 256).unwrap();
        assert_eq!(larger.max_frame_bytes, 1 << 20);
        let tiny = agree(&params(v, v, Some(1)), "host", 1 << 20, 256).unwrap();
        assert_eq!(tiny.max_frame_bytes, MIN_MAX_FRAME_BYTES);
        let refused = agree(&params(v + 1, v + 2, None), "gateway", 1 << 20, 256).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::ProtocolMismatch);
        assert!(
            refused
                .message()
                .starts_with("this gateway speaks protocol")
        );
    }

    #[test]
    fn a_pairing_connection_is_offered_no_capabilities_and_no_subscriptions() {
        let agreed = Agreed {
            max_frame_bytes: 200_000,
            events_per_push: 64,
        };
        let offer = |principal| Offer {
            host: HostIdentity {
                id: "h".into(),
                version: "1".into(),
            },
            principal,
            capabilities: vec!["sessions".into()],
            bounds: Bounds::from(&HostLimits::default()),
            heartbeat: Duration::from_secs(15),
        };
        let device = Principal::Device {
            device_id: "dev_1".into(),
            roles: vec![Role::Operator],
        };
        let paired = result(agreed, offer(&device));
        assert_eq!(paired.capabilities, vec!["sessions".to_string()]);
        assert_eq!(paired.limits.max_subscriptions, 64);
        assert_eq!(paired.limits.max_frame_bytes, 200_000);
        assert_eq!(paired.limits.max_events_per_push, 64);
        assert_eq!(paired.heartbeat_ms, 15_000);
        assert_eq!(paired.principal.device_id.as_deref(), Some("dev_1"));
        let pairing = result(agreed, offer(&Principal::Pairing));
        assert!(pairing.capabilities.is_empty());
        assert_eq!(pairing.limits.max_subscriptions, 0);
        assert_eq!(pairing.principal.kind, PrincipalKind::Pairing);
    }
}
