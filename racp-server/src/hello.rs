//! What `hello` agrees on, one way for a host and a gateway (docs/protocol.md §5.2): the protocol
//! version, the connection's frame bound and events per push, and who the caller is.

use racp_proto::limits::MIN_MAX_FRAME_BYTES;
use racp_proto::methods::handshake::{HelloParams, PrincipalInfo, PrincipalKind};
use racp_proto::{AppError, ErrorCode, PROTOCOL_VERSION, Role};
use serde_json::json;

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

/// `hello`'s principal for a paired device.
pub fn device(device_id: &str, roles: &[Role]) -> PrincipalInfo {
    PrincipalInfo {
        kind: PrincipalKind::Device,
        device_id: Some(device_id.to_string()),
        roles: roles.to_vec(),
    }
}

/// `hello`'s principal for a pairing connection: no device, no roles.
pub fn pairing() -> PrincipalInfo {
    PrincipalInfo {
        kind: PrincipalKind::Pairing,
        device_id: None,
        roles: Vec::new(),
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
}
