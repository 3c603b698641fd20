//! The pushes a server sends without being asked, built from racp-proto's typed params, one way
//! for a host and a gateway: `heartbeat` (split over as many pushes as the frame bound needs),
//! `subscription/ended`, and the CLIENT_TOO_SLOW that ends a connection. `session/events` is
//! assembled where the events are (a host's log, a gateway's stream), spliced in unparsed after
//! the one prefix [`events_prefix`] gives.

use racp_proto::events::{HeartbeatParams, PushMethod, SubscriptionEndedParams, SubscriptionHead};
use racp_proto::{AppError, Cursor, ErrorCode};
use serde_json::{Map, json};

/// `{"method": METHOD, "params": PARAMS}`.
fn frame<P: serde::Serialize>(method: PushMethod, params: &P) -> String {
    crate::wire::encode(&json!({"method": method.as_str(), "params": params}))
}

/// The `heartbeat` pushes at `at` for these subscriptions: one, unless they do not fit in
/// `max_frame_bytes` together (very many subscriptions on a small bound).
pub fn heartbeats(at: u64, heads: Vec<SubscriptionHead>, max_frame_bytes: usize) -> Vec<String> {
    let push = |subscriptions: Vec<SubscriptionHead>| {
        frame(
            PushMethod::Heartbeat,
            &HeartbeatParams { at, subscriptions },
        )
    };
    let budget = max_frame_bytes.saturating_sub(push(Vec::new()).len());
    let mut frames = Vec::new();
    let mut part: Vec<SubscriptionHead> = Vec::new();
    let mut size = 0;
    for head in heads {
        let len = crate::wire::encode(&head).len() + 1;
        if !part.is_empty() && size + len > budget {
            frames.push(push(std::mem::take(&mut part)));
            size = 0;
        }
        size += len;
        part.push(head);
    }
    frames.push(push(part));
    frames
}

/// The start of every `session/events` push of a subscription, up to its events array.
pub fn events_prefix(subscription_id: &str, session_id: &str) -> String {
    format!(
        r#"{{"method":"{}","params":{{"subscriptionId":{},"sessionId":{},"events":["#,
        PushMethod::SessionEvents.as_str(),
        serde_json::Value::from(subscription_id),
        serde_json::Value::from(session_id),
    )
}

/// `subscription/ended`.
pub fn subscription_ended(params: &SubscriptionEndedParams) -> String {
    frame(PushMethod::SubscriptionEnded, params)
}

/// CLIENT_TOO_SLOW: the client `why` ("stopped reading", "fell too far behind the head"), with
/// the last delivered cursor of every subscription to resume from.
pub fn too_slow(why: &str, last: impl IntoIterator<Item = (String, Cursor)>) -> AppError {
    let last: Map<String, serde_json::Value> =
        last.into_iter().map(|(id, c)| (id, json!(c))).collect();
    AppError::new(
        ErrorCode::ClientTooSlow,
        format!("the client {why}; reconnect and resume from lastCursor"),
    )
    .with_details(json!({"lastCursor": last}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use racp_proto::Epoch;

    fn head(i: usize) -> SubscriptionHead {
        SubscriptionHead {
            subscription_id: format!("sub_{i}"),
            session_id: format!("ses_{i}"),
            cursor: Cursor::new(Epoch(1), i as u64),
        }
    }

    #[test]
    fn heartbeats_split_over_the_frame_bound_and_name_every_subscription_once() {
        let one = heartbeats(5, vec![head(1)], 1 << 20);
        assert_eq!(one.len(), 1);
        let parsed: serde_json::Value = serde_json::from_str(&one[0]).unwrap();
        assert_eq!(parsed["method"], "heartbeat");
        assert_eq!(parsed["params"]["at"], 5);
        assert_eq!(
            parsed["params"]["subscriptions"][0]["cursor"],
            "0000000000000001-1"
        );
        let many = heartbeats(5, (0..200).map(head).collect(), 1024);
        assert!(many.len() > 1);
        let mut named = Vec::new();
        for push in &many {
            assert!(push.len() <= 1024, "{}", push.len());
            let parsed: serde_json::Value = serde_json::from_str(push).unwrap();
            for sub in parsed["params"]["subscriptions"].as_array().unwrap() {
                named.push(sub["subscriptionId"].as_str().unwrap().to_string());
            }
        }
        assert_eq!(
            named,
            (0..200).map(|i| format!("sub_{i}")).collect::<Vec<_>>()
        );
        // No subscription: one heartbeat all the same.
        assert_eq!(heartbeats(5, Vec::new(), 1024).len(), 1);
    }

    #[test]
    fn too_slow_names_each_subscription_s_last_cursor() {
        let error = too_slow(
            "stopped reading",
            [("sub_1".to_string(), Cursor::new(Epoch(2), 9))],
        );
        assert_eq!(error.code(), ErrorCode::ClientTooSlow);
        assert!(error.message().starts_with("the client stopped reading;"));
        assert_eq!(
            error.details().unwrap()["lastCursor"]["sub_1"],
            "0000000000000002-9"
        );
    }
}
