//! The one admit policy of every entry point: a device's WebSocket call to a host or to a
//! gateway, and a call a gateway routed to a host (docs/protocol.md §6).

use crate::ratelimit::RateLimiter;
use racp_proto::{AppError, Call, Method, Principal};
use serde_json::value::RawValue;

/// The checks between a decoded envelope and its handling, in order: the caller's access, its
/// rate bucket (`rate`: `None` for a call that pays none, such as one a gateway already
/// charged; a method the table says pays none, `hello`, never does), the drain (`draining`: the
/// error to refuse with), then the params read as the method's type.
pub fn admit(
    principal: &Principal,
    method: Method,
    params: Option<&RawValue>,
    rate: Option<(&RateLimiter, &str)>,
    draining: Option<AppError>,
) -> Result<Call, AppError> {
    method.spec().access.check(method.as_str(), principal)?;
    if let Some((limiter, key)) = rate
        && method.spec().pays_rate
    {
        limiter.check(key)?;
    }
    if let Some(refusal) = draining {
        return Err(refusal);
    }
    Call::decode(method, params)
}
