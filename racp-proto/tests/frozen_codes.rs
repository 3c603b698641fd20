//! Published codes are never removed, renamed or given new close codes. Adding a code means
//! adding a line here; changing or deleting a line is a breaking change and is not allowed.

use racp_proto::ErrorCode;

/// (wire name, WebSocket close code), as published.
const PUBLISHED: &[(&str, u16)] = &[
    ("PROTOCOL_MISMATCH", 4000),
    ("HOST_UNAVAILABLE", 4001),
    ("HOST_OVERLOADED", 4002),
    ("INTERNAL", 4003),
    ("INVALID_ARGUMENT", 4004),
    ("INVALID_PARAMS", 4005),
    ("UNAUTHORIZED", 4006),
    ("NOT_FOUND", 4007),
    ("SESSION_NOT_FOUND", 4008),
    ("CONFLICT", 4009),
    ("UNSUPPORTED", 4010),
    ("FORBIDDEN", 4011),
    ("METHOD_NOT_FOUND", 4012),
    ("IDEMPOTENCY_CONFLICT", 4013),
    ("CURSOR_EXPIRED", 4014),
    ("CLIENT_TOO_SLOW", 4015),
    ("APPROVAL_EXPIRED", 4016),
    ("APPROVAL_STALE", 4017),
    ("PAYLOAD_TOO_LARGE", 4018),
    ("TIMEOUT", 4019),
    ("HOST_SHUTTING_DOWN", 4020),
    ("RATE_LIMITED", 4021),
    ("LIMIT_EXCEEDED", 4022),
    ("AGENT_UNAVAILABLE", 4023),
    ("AGENT_BUSY", 4024),
    ("AGENT_SIDECAR_CRASHED", 4025),
    ("TURN_NOT_FOUND", 4026),
    ("TURN_ABORTED", 4027),
    ("HOST_DISCONNECTED", 4028),
    ("HOST_BOOTSTRAP_FAILED", 4029),
    ("HOST_VERSION_MISMATCH", 4030),
    ("REMOTE_AUTH_FAILED", 4031),
    ("REMOTE_CONNECTION_FAILED", 4032),
    ("REMOTE_FORWARD_FAILED", 4033),
    ("REMOTE_PATH_NOT_FOUND", 4034),
    ("REMOTE_PATH_FORBIDDEN", 4035),
    ("PAIRING_FAILED", 4036),
    ("PAIRING_TOKEN_EXPIRED", 4037),
    ("CAPABILITY_UNAVAILABLE", 4038),
    ("HOST_IDENTITY_MISMATCH", 4039),
    ("MODEL_NOT_CONFIGURED", 4040),
    ("PROVIDER_ERROR", 4041),
    ("PROVIDER_UNAUTHORIZED", 4042),
    ("PROVIDER_RATE_LIMITED", 4043),
    ("CONTEXT_TOO_LARGE", 4044),
    ("STREAM_FAILED", 4045),
    ("NETWORK_ERROR", 4046),
    ("EMPTY_MODEL_RESPONSE", 4047),
    ("AGENT_SIDECAR_OOM", 4048),
    ("PROVIDER_TIMEOUT", 4049),
    ("PROVIDER_MODEL_NOT_FOUND", 4050),
    ("PROVIDER_SECRET_MISSING", 4051),
    ("HELLO_REQUIRED", 4052),
    ("TOOL_DENIED", 4053),
    ("WORKSPACE_PATH_DENIED", 4054),
    ("PATH_OUTSIDE_WORKSPACE", 4055),
    ("WRITE_DISABLED_IN_PLAN", 4056),
    ("EDIT_DISABLED_IN_PLAN", 4057),
    ("TOOL_DISABLED_IN_PLAN", 4058),
    ("READ_PATH_IS_DIRECTORY", 4059),
    ("WORKSPACE_NOT_A_REPOSITORY", 4060),
    ("GIT_UNAVAILABLE", 4061),
];

#[test]
fn every_published_code_is_still_registered_unchanged() {
    for (name, close) in PUBLISHED {
        let code = ErrorCode::from_name(name)
            .unwrap_or_else(|| panic!("published code {name} was removed or renamed"));
        assert_eq!(
            code.spec().close_code,
            *close,
            "{name} changed its close code"
        );
    }
}

#[test]
fn every_registered_code_is_published() {
    for code in ErrorCode::ALL {
        assert!(
            PUBLISHED.iter().any(|(name, _)| *name == code.as_str()),
            "{} is registered but not in the frozen list: add it to PUBLISHED",
            code.as_str()
        );
    }
}
