//! RACP calls routed from the gateway: the host's calls of the method table (the gateway
//! serves every other place itself), entering through the same door as a call on a WebSocket
//! (`server::answer_routed`: access, drain, params, the host's in-flight bound; the gateway
//! charged the device's rate bucket), with the gateway's device as the caller. A message is a
//! call only when a trusted gateway signed it (`signed.rs`), so the device, roles and grant in
//! the envelope are a gateway's word, whoever else may publish on the subject; the grant must
//! name this host. Its id is kept in the store
//! for the signature's time window before it runs, so a replay is refused after a restart too.

use crate::auth::Caller;
use crate::state::HostState;
use async_nats::Subscriber;
use futures_util::StreamExt;
use racp_proto::gateway::{CALL_MAX_SKEW_MS, RoutedCall, RoutedReply, TRACE_HEADER, call_subject};
use racp_proto::trace::TraceId;
use racp_proto::{AppError, ErrorCode, Method};
use racp_server::uplink::signed::{Refusal, Verified, Verifier};
use serde_json::json;
use serde_json::value::RawValue;
use std::sync::Arc;

/// Subscribes to the host's call subject and waits until the server has the subscription
/// (a flush), so a call published after this returns finds a responder.
pub async fn subscribe(state: &HostState, client: &async_nats::Client) -> Subscriber {
    let subject = call_subject(&state.host_id);
    let mut retry = super::Retry::new();
    // The client resubscribes by itself after a reconnect; this loop is for a refused subscribe.
    let calls = loop {
        match client.subscribe(subject.clone()).await {
            Ok(calls) => break calls,
            Err(err) => {
                tracing::warn!(error = %err, "cannot subscribe to gateway calls; retrying");
                retry.wait().await;
            }
        }
    };
    retry.reset();
    while let Err(err) = client.flush().await {
        tracing::debug!(error = %err, "flushing the call subscription; retrying");
        retry.wait().await;
    }
    calls
}

/// Answers the calls of `calls` (from [`subscribe`]) for as long as the link lives.
pub async fn run(
    state: Arc<HostState>,
    client: async_nats::Client,
    verifier: Arc<Verifier>,
    mut calls: Subscriber,
) {
    while let Some(message) = calls.next().await {
        let Some(reply_to) = message.reply.clone() else {
            continue;
        };
        let checked = verifier.verify(
            &state.host_id,
            &message.subject,
            message.headers.as_ref(),
            &message.payload,
            racp_server::clock::now_ms(),
        );
        let verified = match checked {
            Ok(verified) => verified,
            Err(refusal) => {
                refused(&refusal);
                continue;
            }
        };
        let state = state.clone();
        let client = client.clone();
        let trace_id = trace_of(message.headers.as_ref());
        // Read once: its method names the call's span, and the call is answered from it.
        let routed = read_call(&message.payload);
        let method = routed
            .as_ref()
            .ok()
            .and_then(|call| Method::from_name(&call.method))
            .map_or("unknown", Method::as_str);
        let scope = trace_id.clone();
        let call = async move {
            let outcome = match (first_time(&state, verified).await, routed) {
                (Ok(()), Ok(routed)) => answer(&state, routed).await,
                (Err(None), _) => return,
                (Err(Some(error)), _) | (Ok(()), Err(error)) => Err(error),
            };
            let outcome = outcome.map_err(|e| racp_server::trace::stamp(e, &trace_id));
            let reply = match outcome {
                Ok(result) => RoutedReply {
                    result: Some(result),
                    error: None,
                },
                Err(error) => RoutedReply {
                    result: None,
                    error: Some(error),
                },
            };
            let body = racp_server::wire::encode(&reply);
            if let Err(err) = client.publish(reply_to, body.into()).await {
                tracing::warn!(error = %err, "cannot answer a gateway call");
            }
        };
        tokio::spawn(racp_server::trace::scope(scope, method, call));
    }
}

/// The routed call's trace id (docs/protocol.md §3.3): the gateway's header, checked as a
/// client's would be, or a new one when it is missing or malformed.
fn trace_of(headers: Option<&async_nats::HeaderMap>) -> TraceId {
    let presented = headers.and_then(|h| h.get(TRACE_HEADER));
    match presented.map(|value| TraceId::parse(value.as_str())) {
        Some(Ok(trace_id)) => trace_id,
        Some(Err(bad)) => {
            let trace_id = racp_server::trace::mint();
            tracing::info!(%trace_id, reason = bad.reason(), "a routed call's trace id was malformed; made a new one");
            trace_id
        }
        None => racp_server::trace::mint(),
    }
}

/// Not a call: nothing runs and nothing answers (the sender may not be a gateway).
fn refused(refusal: &Refusal) {
    tracing::warn!(%refusal, "refused a message on the call subject");
}

/// Keeps the call's id in the store for its time window before the call runs, so a replay is
/// refused after a restart too. `Err(None)`: a replay (nothing answers); `Err(Some)`: the id
/// could not be kept, so the call does not run.
async fn first_time(state: &Arc<HostState>, verified: Verified) -> Result<(), Option<AppError>> {
    let horizon = racp_server::clock::now_ms().saturating_sub(CALL_MAX_SKEW_MS);
    let keeper = state.clone();
    let id = verified.call_id.clone();
    let recorded = tokio::task::spawn_blocking(move || {
        keeper
            .store
            .record_call_id(&id, verified.signed_at, horizon)
    })
    .await;
    match recorded {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => {
            refused(&Refusal::Replayed(verified.call_id));
            Err(None)
        }
        Ok(Err(err)) => Err(Some(crate::internal(err))),
        Err(err) => Err(Some(crate::internal(err))),
    }
}

/// Whether a routed device's name may go into events: bounded and printable as a name paired
/// with this host is (`racp_proto::validate::name`). One that is not is left out, with a
/// warning: the call itself is the gateway's to allow.
fn shown_name(name: &str) -> bool {
    let checked =
        racp_proto::validate::name("deviceName", name, 1, racp_proto::limits::MAX_NAME_CHARS);
    if let Err(err) = &checked {
        tracing::warn!(error = %err.message(), "a routed call's device name is not shown");
    }
    checked.is_ok()
}

fn read_call(payload: &[u8]) -> Result<RoutedCall, AppError> {
    serde_json::from_slice(payload).map_err(|e| {
        AppError::new(
            ErrorCode::InvalidArgument,
            format!("not a routed call: {e}"),
        )
    })
}

async fn answer(state: &Arc<HostState>, call: RoutedCall) -> Result<Box<RawValue>, AppError> {
    let method = Method::from_name(&call.method).ok_or_else(|| {
        AppError::new(ErrorCode::MethodNotFound, "no such method")
            .with_details(json!({"method": call.method}))
    })?;
    if let Some(hosts) = &call.hosts
        && !hosts.iter().any(|h| *h == state.host_id)
    {
        return Err(AppError::new(
            ErrorCode::Forbidden,
            "the device's grant does not include this host",
        )
        .with_details(json!({"hostId": state.host_id})));
    }
    let caller = Caller::Device {
        device_id: call.device_id,
        name: call.device_name.filter(|name| shown_name(name)),
        roles: call.roles,
    };
    crate::server::answer_routed(state, caller, method, &call.params).await
}

#[cfg(test)]
mod tests {
    use super::shown_name;
    use racp_proto::limits::MAX_NAME_CHARS;

    #[test]
    fn a_routed_name_is_shown_only_within_the_bounds_of_a_paired_one() {
        let longest = "é".repeat(MAX_NAME_CHARS as usize);
        assert!(shown_name("phone"));
        assert!(shown_name(&longest));
        assert!(!shown_name(&format!("{longest}x")));
        assert!(!shown_name(""));
        assert!(!shown_name("pho\u{1b}[2Jne"));
        assert!(!shown_name("pho\u{202e}ne"));
    }
}
