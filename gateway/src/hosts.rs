//! Hosts as the gateway sees them: their heartbeat records (`host/list`), and RACP calls routed
//! to one of them over NATS request/reply.

use crate::devices::DeviceRecord;
use async_nats::jetstream::kv;
use futures_util::StreamExt;
use racp_proto::gateway::{
    HOSTS_BUCKET, HostRecord, OFFLINE_AFTER_MS, RoutedCall, RoutedReply, TRACE_HEADER, call_subject,
};
use racp_proto::methods::handshake::HostIdentity;
use racp_proto::methods::host::{HostEntry, HostListResult, HostStatus};
use racp_proto::{AppError, ErrorCode, HostCall, Method};
use serde_json::json;
use serde_json::value::RawValue;
use std::time::Duration;

/// How long a routed call may take before the host counts as unreachable. Calls that wait on
/// an agent (`turn/start` waiting for a starting agent) stay well within it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A call the method table gives a deadline of the host's own (a shell command, answered when
/// it ends) waits that long more (NATS's own request timeout too); every other call keeps the
/// NATS client's request timeout and [`CALL_TIMEOUT`].
fn call_timeout(method: Method) -> Option<Duration> {
    let deadline = method.spec().deadline_ms?;
    Some(Duration::from_millis(deadline) + CALL_TIMEOUT)
}

/// One host's record with the server's time of writing it.
pub struct Seen {
    pub record: HostRecord,
    pub written_at: u64,
}

impl Seen {
    pub fn online(&self, now: u64) -> bool {
        self.record.online && now.saturating_sub(self.written_at) <= OFFLINE_AFTER_MS
    }
}

pub async fn seen(hosts: &kv::Store, host_id: &str) -> Result<Option<Seen>, AppError> {
    let entry = hosts.entry(host_id).await.map_err(|e| nats_down(&e))?;
    Ok(entry.and_then(|entry| read(&entry)))
}

fn read(entry: &kv::Entry) -> Option<Seen> {
    if entry.operation != kv::Operation::Put {
        return None;
    }
    let record: HostRecord = serde_json::from_slice(&entry.value).ok()?;
    let written_at = u64::try_from(entry.created.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    Some(Seen { record, written_at })
}

/// `host/list`: every enrolled host the device may reach.
pub async fn list(
    js: &async_nats::jetstream::Context,
    hosts: &kv::Store,
    device: &DeviceRecord,
    now: u64,
) -> Result<HostListResult, AppError> {
    // The bucket's subjects, read from the stream's info: one request, where the bucket's
    // `keys()` would create a consumer for every listing.
    let prefix = format!("$KV.{HOSTS_BUCKET}.");
    let stream = js
        .get_stream_no_info(format!("KV_{HOSTS_BUCKET}"))
        .await
        .map_err(|e| nats_down(&e))?;
    let mut subjects = stream
        .info_with_subjects(format!("{prefix}>"))
        .await
        .map_err(|e| nats_down(&e))?;
    let mut entries = Vec::new();
    while let Some(subject) = subjects.next().await {
        let (subject, _) = subject.map_err(|e| nats_down(&e))?;
        let Some(key) = subject.strip_prefix(&prefix).map(str::to_string) else {
            continue;
        };
        if !device.may_reach(&key) {
            continue;
        }
        if let Some(seen) = seen(hosts, &key).await? {
            let online = seen.online(now);
            let record = seen.record;
            if record.host_id != key {
                tracing::warn!(key, claimed = %record.host_id, "a host's record names another host");
            }
            // The key is the host: its credential can write no other. What the record says of
            // itself is shown as text only, clipped and with unprintable characters escaped.
            let shown = |text: &str, max: usize| {
                racp_proto::validate::printable(&racp_proto::validate::clip(text, max), false)
                    .into_owned()
            };
            entries.push(HostEntry {
                path: format!("{}/hosts/{key}", racp_proto::ENDPOINT_PATH),
                host: HostIdentity {
                    version: shown(&record.version, 64),
                    id: key,
                },
                hostname: shown(&record.hostname, 255),
                status: if online {
                    HostStatus::Online
                } else {
                    HostStatus::Offline
                },
                last_seen_at: (record.at > 0).then_some(seen.written_at),
                sessions: record.sessions,
            });
        }
    }
    entries.sort_by(|a, b| a.host.id.cmp(&b.host.id));
    Ok(HostListResult { hosts: entries })
}

/// A call the gateway routes to a host: its method, one the method table places on the host,
/// and its params as the client wrote them (decoded and checked at the gateway, passed on as
/// they are).
pub struct Routed<'a> {
    method: Method,
    params: Option<&'a RawValue>,
}

impl<'a> Routed<'a> {
    pub fn new(call: &HostCall, params: Option<&'a RawValue>) -> Self {
        Routed {
            method: call.method(),
            params,
        }
    }
}

/// Sends one call to a host, signed with the gateway's key (docs/protocol.md §15.5), and
/// returns its result (raw, as the host wrote it) or its error.
pub async fn route(
    client: &async_nats::Client,
    signer: &nkeys::KeyPair,
    host_id: &str,
    device: &DeviceRecord,
    routed: Routed<'_>,
) -> Result<Box<RawValue>, AppError> {
    let params = match routed.params {
        Some(params) => params.to_owned(),
        None => RawValue::from_string("{}".into()).map_err(|e| internal(&e))?,
    };
    let call = RoutedCall {
        device_id: device.device_id.clone(),
        device_name: Some(device.name.clone()),
        roles: device.roles.clone(),
        hosts: device.hosts.clone(),
        method: routed.method.as_str().to_string(),
        params,
    };
    let body = serde_json::to_vec(&call).map_err(|e| internal(&e))?;
    let subject = call_subject(host_id);
    let mut headers = sign(signer, host_id, &subject, &body)?;
    // The call's trace id goes to the host's log with it (docs/protocol.md §3.3).
    if let Some(trace_id) = racp_server::trace::current() {
        headers.insert(TRACE_HEADER, trace_id.as_str());
    }
    let long = call_timeout(routed.method);
    let mut request = async_nats::Request::new()
        .headers(headers)
        .payload(body.into());
    if long.is_some() {
        request = request.timeout(long);
    }
    let request = client.send_request(subject, request);
    let reply = match tokio::time::timeout(long.unwrap_or(CALL_TIMEOUT), request).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(err)) => {
            use async_nats::RequestErrorKind;
            return Err(match err.kind() {
                RequestErrorKind::NoResponders => host_offline(host_id),
                RequestErrorKind::TimedOut => host_offline(host_id),
                RequestErrorKind::Other => nats_down(&err),
            });
        }
        Err(_) => return Err(host_offline(host_id)),
    };
    let reply: RoutedReply = serde_json::from_slice(&reply.payload).map_err(|e| internal(&e))?;
    match (reply.result, reply.error) {
        (_, Some(error)) => Err(error),
        (Some(result), None) => Ok(result),
        (None, None) => Err(internal(&"a host's reply had neither result nor error")),
    }
}

/// The envelope's headers: the key, the time, a fresh call id and the signature over them, the
/// host, the subject and the payload.
fn sign(
    signer: &nkeys::KeyPair,
    host_id: &str,
    subject: &str,
    payload: &[u8],
) -> Result<async_nats::HeaderMap, AppError> {
    use ring::rand::SecureRandom;
    let mut nonce = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| internal(&"no randomness for a call id"))?;
    let call_id: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let at = racp_server::clock::now_ms();
    racp_server::uplink::signed::envelope(signer, host_id, subject, at, &call_id, payload)
        .map_err(|e| internal(&e))
}

/// FORBIDDEN: the device's grant does not name `host`.
pub fn forbidden_host(host: &str) -> AppError {
    AppError::new(
        ErrorCode::Forbidden,
        "this device may not reach that host; an owner can pair it with access to it",
    )
    .with_details(json!({"hostId": host, "reason": "host_not_granted"}))
}

pub fn host_offline(host_id: &str) -> AppError {
    AppError::new(
        ErrorCode::HostUnavailable,
        "the host is not connected to the gateway; retry when it is back",
    )
    .with_details(json!({"hostId": host_id, "reason": "host_offline"}))
    .with_retry_after_ms(2_000)
}

pub fn nats_down(err: &dyn std::fmt::Display) -> AppError {
    AppError::new(
        ErrorCode::HostUnavailable,
        "the gateway cannot reach its NATS servers; retry shortly",
    )
    .with_details(json!({"reason": "nats_unavailable", "cause": err.to_string()}))
    .with_retry_after_ms(1_000)
}

pub fn internal(err: &dyn std::fmt::Display) -> AppError {
    racp_server::failure::internal("gateway", err)
}
