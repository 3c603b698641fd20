//! The gateway's NATS side: connecting, the buckets it shares with other replicas, and
//! enrolling a host (its events stream, its first record, and the NATS user that confines it to
//! its own subjects: docs/architecture.md, "Gateway").

use crate::devices::{DEVICES_BUCKET, PAIRING_BUCKET};
use crate::revocation::{REPLICA_RECORD_AGE, REPLICAS_BUCKET};
use async_nats::jetstream::{self, kv, stream};
use racp_proto::gateway::{
    HOSTS_BUCKET, HostRecord, call_subject, events_stream, heartbeat_subject, host_events_subjects,
    host_inbox_prefix,
};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("cannot connect to NATS at {urls}: {reason}")]
    Connect { urls: String, reason: String },
    #[error("JetStream refused {what}: {reason}")]
    JetStream { what: String, reason: String },
    #[error("{0}")]
    Input(String),
}

fn js_error(what: &str) -> impl Fn(&dyn std::fmt::Display) -> NatsError + '_ {
    move |e| NatsError::JetStream {
        what: what.to_string(),
        reason: e.to_string(),
    }
}

pub struct Buckets {
    pub hosts: kv::Store,
    pub devices: kv::Store,
    pub pairings: kv::Store,
    pub replicas: kv::Store,
}

/// Connects with the gateway's nkey (or without one, to a server with no auth), and keeps
/// reconnecting on its own for as long as the process lives.
pub async fn connect(urls: &str, seed: Option<String>) -> Result<async_nats::Client, NatsError> {
    let servers = urls
        .split(',')
        .map(|url| url.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| NatsError::Connect {
            urls: urls.to_string(),
            reason: e.to_string(),
        })?;
    let options = match seed {
        Some(seed) => async_nats::ConnectOptions::with_nkey(seed),
        None => async_nats::ConnectOptions::new(),
    };
    options
        .name("pi-gateway")
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)))
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => tracing::info!("NATS connected"),
                async_nats::Event::Disconnected => tracing::warn!("NATS link down; retrying"),
                other => tracing::warn!(event = %other, "NATS"),
            }
        })
        .connect(servers)
        .await
        .map_err(|e| NatsError::Connect {
            urls: urls.to_string(),
            reason: e.to_string(),
        })
}

/// Opens (creating when missing) the buckets every replica shares. Retries until JetStream
/// answers, so replicas may start before NATS does.
pub async fn buckets(js: &jetstream::Context, replicas: usize) -> Buckets {
    let mut delay = Duration::from_millis(100);
    loop {
        match try_buckets(js, replicas).await {
            Ok(buckets) => return buckets,
            Err(err) => {
                tracing::warn!(error = %err, "waiting for JetStream");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn try_buckets(js: &jetstream::Context, replicas: usize) -> Result<Buckets, NatsError> {
    Ok(Buckets {
        hosts: bucket(
            js,
            HOSTS_BUCKET,
            Duration::ZERO,
            replicas,
            Reads::AnyReplica,
        )
        .await?,
        devices: bucket(js, DEVICES_BUCKET, Duration::ZERO, replicas, Reads::Leader).await?,
        // Pairing tokens live at most a day (the longest pairing TTL) past their use.
        pairings: bucket(
            js,
            PAIRING_BUCKET,
            Duration::from_secs(2 * 86_400),
            replicas,
            Reads::Leader,
        )
        .await?,
        replicas: bucket(
            js,
            REPLICAS_BUCKET,
            REPLICA_RECORD_AGE,
            replicas,
            Reads::AnyReplica,
        )
        .await?,
    })
}

/// Where a bucket's reads are served from.
#[derive(Clone, Copy, PartialEq)]
enum Reads {
    /// Any replica of the stream (direct gets): fast, possibly a moment behind.
    AnyReplica,
    /// The stream's leader: a token revoked or used a moment ago reads as such.
    Leader,
}

/// Opens a key-value bucket, creating its stream when missing. The stream is made here, as
/// the crate's `create_key_value` would make it, because that first reads the account's
/// limits in a shape NATS 2.9 (Debian's) does not send.
async fn bucket(
    js: &jetstream::Context,
    name: &str,
    max_age: Duration,
    replicas: usize,
    reads: Reads,
) -> Result<kv::Store, NatsError> {
    let allow_direct = reads == Reads::AnyReplica;
    if let Ok(stream) = js.get_stream(format!("KV_{name}")).await {
        // A bucket made before reads were chosen per bucket.
        let config = stream.cached_info().config.clone();
        if config.allow_direct != allow_direct {
            // Not fatal: reads from a lagging copy are still bounded by the revocation lease.
            if let Err(err) = js
                .update_stream(stream::Config {
                    allow_direct,
                    ..config
                })
                .await
            {
                tracing::warn!(bucket = name, error = %err, "cannot change where the bucket is read from");
            }
        }
        return js.get_key_value(name).await.map_err(|e| js_error(name)(&e));
    }
    let config = stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_age,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        deny_delete: true,
        allow_direct,
        duplicate_window: Duration::from_secs(120).min(if max_age.is_zero() {
            Duration::from_secs(120)
        } else {
            max_age
        }),
        ..Default::default()
    };
    if let Err(err) = js.create_stream(config).await {
        // Another replica may have made it meanwhile.
        if js.get_key_value(name).await.is_err() {
            return Err(js_error(name)(&err));
        }
    }
    js.get_key_value(name).await.map_err(|e| js_error(name)(&e))
}

/// How a host is enrolled: its stream's retention and replication.
pub struct Enrollment<'a> {
    pub host_id: &'a str,
    pub nkey: &'a str,
    pub retention: Duration,
    pub replicas: usize,
}

/// Creates (or updates) the host's events stream and its first record (offline until its first
/// heartbeat); returns the NATS user entry to add to the server's `authorization.users`.
pub async fn enroll(js: &jetstream::Context, e: &Enrollment<'_>) -> Result<String, NatsError> {
    if !racp_proto::gateway::valid_host_id(e.host_id) {
        return Err(NatsError::Input(format!(
            "{:?} is not a host id (pi-host gateway-key prints it)",
            e.host_id
        )));
    }
    if nkeys::KeyPair::from_public_key(e.nkey).is_err() || !e.nkey.starts_with('U') {
        return Err(NatsError::Input(format!(
            "{:?} is not a user nkey (pi-host gateway-key prints it)",
            e.nkey
        )));
    }
    let name = events_stream(e.host_id);
    let config = stream::Config {
        name: name.clone(),
        subjects: vec![host_events_subjects(e.host_id)],
        storage: stream::StorageType::File,
        num_replicas: e.replicas,
        max_age: e.retention,
        // A host that republishes after a lost ack is deduplicated within this window (which
        // JetStream wants no longer than the retention).
        duplicate_window: Duration::from_secs(120).min(e.retention),
        // Replay lookups (the start of a subscription) read from any replica.
        allow_direct: true,
        ..Default::default()
    };
    match js.get_stream(&name).await {
        Ok(_) => js.update_stream(config).await.map(|_| ()),
        Err(_) => js.create_stream(config).await.map(|_| ()),
    }
    .map_err(|err| js_error(&name)(&err))?;
    let hosts = buckets(js, e.replicas).await.hosts;
    let record = HostRecord {
        host_id: e.host_id.to_string(),
        version: String::new(),
        hostname: String::new(),
        started_at: 0,
        sessions: 0,
        at: 0,
        online: false,
    };
    let body = serde_json::to_vec(&record).unwrap_or_default();
    // Only when missing: a host already heard from keeps its record.
    let _ = hosts.create(e.host_id, body.into()).await;
    Ok(host_user(e.host_id, e.nkey))
}

/// The NATS user for one host: it may publish its own events and heartbeat, read back its own
/// stream, take calls on its own subject and answer them, and read its own inbox; nothing else.
pub fn host_user(host_id: &str, nkey: &str) -> String {
    let stream = events_stream(host_id);
    let publish = [
        host_events_subjects(host_id),
        heartbeat_subject(host_id),
        format!("$JS.API.DIRECT.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}.>"),
        format!("$JS.API.STREAM.INFO.{stream}"),
    ];
    let subscribe = [
        call_subject(host_id),
        format!("{}.>", host_inbox_prefix(host_id)),
    ];
    let list = |items: &[String]| {
        items
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{{ nkey: \"{nkey}\", permissions: {{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [{}] }}, allow_responses: true }} }}",
        list(&publish),
        list(&subscribe)
    )
}
