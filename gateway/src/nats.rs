//! The gateway's NATS side: connecting, the buckets it shares with other replicas, and
//! enrolling a host (its events stream, its first record, and the NATS user that confines it to
//! its own subjects: docs/architecture.md, "Gateway").

use crate::devices::{DEVICES_BUCKET, PAIRING_BUCKET};
use crate::lease::{REPLICA_RECORD_AGE, REPLICAS_BUCKET};
use async_nats::jetstream::{self, kv, stream};
use racp_proto::gateway::{
    HOSTS_BUCKET, HostRecord, call_subject, events_stream, heartbeat_subject, host_events_subjects,
    host_inbox_prefix,
};
use racp_server::metrics::NatsLink;
use racp_server::uplink::link;
use std::sync::LazyLock;
use std::time::Duration;

/// The NATS link's series (metrics.rs reads them): the client's event callback counts into it
/// before the gateway's state, and its registry, exist.
pub static LINK: LazyLock<NatsLink> = LazyLock::new(NatsLink::default);

#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("cannot connect to NATS at {urls}: {reason}")]
    Connect { urls: String, reason: String },
    #[error("JetStream refused {what}: {reason}")]
    JetStream { what: String, reason: String },
    #[error(
        "the NATS server at {urls} runs without JetStream, which the gateway keeps hosts, devices and events in: add a `jetstream {{ store_dir: \"/var/lib/nats\" }}` block to its configuration (deploy/nats-server.conf has one) and restart it{detail}"
    )]
    NoJetStream { urls: String, detail: String },
    #[error("{0}")]
    Input(String),
    /// The host id is enrolled already with another key (exit 64).
    #[error("{0}")]
    Conflict(String),
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
    pub enrollments: kv::Store,
}

/// The gateway's record of an enrolled host's key, in [`ENROLLMENTS_BUCKET`] (only gateways
/// write there).
pub const ENROLLMENTS_BUCKET: &str = "racp_gw_enrollments";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnrolledKey {
    nkey: String,
    enrolled_at: u64,
}

/// Connects with the gateway's nkey (or without one, to a server with no auth), over TLS unless
/// a URL says `nats://`, and keeps reconnecting on its own for as long as the process lives. A
/// server whose certificate does not verify is an error at once.
pub async fn connect(
    urls: &str,
    seed: Option<String>,
    ca: Option<&std::path::Path>,
) -> Result<async_nats::Client, NatsError> {
    let servers = link::Servers::parse(&[urls]).map_err(|e| NatsError::Input(e.to_string()))?;
    let connect_error = |reason: String| NatsError::Connect {
        urls: servers.shown().to_string(),
        reason,
    };
    servers.warn_if_cleartext("gateway's");
    let tls = link::Tls {
        ca: ca.map(std::path::Path::to_path_buf),
        ca_flag: "--nats-ca",
    };
    let base = || match &seed {
        Some(seed) => async_nats::ConnectOptions::with_nkey(seed.clone()),
        None => async_nats::ConnectOptions::new(),
    };
    tls.check(&servers, base())
        .await
        .map_err(|e| connect_error(e.to_string()))?;
    tls.apply(base(), &servers)
        .map_err(|e| connect_error(e.to_string()))?
        .name("pi-gateway")
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)))
        .event_callback(|event| async move {
            LINK.event(&event);
            match event {
                async_nats::Event::Connected => tracing::info!("NATS connected"),
                async_nats::Event::Disconnected => tracing::warn!("NATS link down; retrying"),
                other => tracing::warn!(event = %other, "NATS"),
            }
        })
        .connect(servers.addrs.clone())
        .await
        .map_err(|e| connect_error(e.to_string()))
}

/// Whether the server the client reached runs JetStream for the client's account: its API
/// answers `$JS.API.INFO` (no responder: JetStream is off; a 503 error: off for this account).
/// A server that is down or slow is not a verdict here (`Ok`): the callers retry or time out.
pub async fn require_jetstream(client: &async_nats::Client, urls: &str) -> Result<(), NatsError> {
    let no_jetstream = |detail: String| NatsError::NoJetStream {
        urls: urls.to_string(),
        detail,
    };
    let answer = client.request("$JS.API.INFO", "".into()).await;
    match answer {
        Err(err) if err.kind() == async_nats::RequestErrorKind::NoResponders => {
            Err(no_jetstream(String::new()))
        }
        Ok(reply) => {
            let error = serde_json::from_slice::<serde_json::Value>(&reply.payload)
                .ok()
                .and_then(|body| body.get("error").cloned());
            match error {
                Some(error) if error["code"] == 503 => Err(no_jetstream(format!(
                    " (it says: {}; with `accounts`, give the gateway's account `jetstream: enabled`)",
                    error["description"]
                        .as_str()
                        .unwrap_or("JetStream is not enabled")
                ))),
                _ => Ok(()),
            }
        }
        Err(_) => Ok(()),
    }
}

/// Opens (creating when missing) the buckets every replica shares. Retries until JetStream
/// answers, so replicas may start before NATS does; a server without JetStream is reported
/// (once) with its fix.
pub async fn buckets(js: &jetstream::Context, replicas: usize) -> Buckets {
    let mut delay = Duration::from_millis(100);
    let mut told = false;
    loop {
        match try_buckets(js, replicas).await {
            Ok(buckets) => return buckets,
            Err(err) => {
                let client = js.client();
                let info = client.server_info();
                let server = format!("{}:{}", info.host, info.port);
                match require_jetstream(&client, &server).await {
                    Err(no_jetstream) if !told => {
                        tracing::error!("{no_jetstream}");
                        told = true;
                    }
                    Err(_) => {}
                    Ok(()) => tracing::warn!(error = %err, "waiting for JetStream"),
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}

const MIB: i64 = 1 << 20;

/// Every bucket has a byte limit, so JetStream reserves its storage when it is made and refuses
/// a stream (a host's, say) that would over-commit the server's store: no host can fill the
/// space a revoke or a pairing needs (docs/reliability.md, "The gateway's NATS links"). In
/// all: 96 MiB.
const HOSTS_BYTES: i64 = 16 * MIB;
const DEVICES_BYTES: i64 = 32 * MIB;
const SMALL_BYTES: i64 = 8 * MIB;

async fn try_buckets(js: &jetstream::Context, replicas: usize) -> Result<Buckets, NatsError> {
    let shared = |name, max_age, max_bytes, reads| Spec {
        name,
        max_age,
        max_bytes,
        max_value: 64 << 10,
        reads,
        written_by_hosts: false,
        replicas,
    };
    Ok(Buckets {
        hosts: bucket(
            js,
            &Spec {
                // Hosts write their own keys here: nothing they write may touch another's.
                written_by_hosts: true,
                max_value: 4 << 10,
                ..shared(HOSTS_BUCKET, Duration::ZERO, HOSTS_BYTES, Reads::AnyReplica)
            },
        )
        .await?,
        devices: bucket(
            js,
            &shared(DEVICES_BUCKET, Duration::ZERO, DEVICES_BYTES, Reads::Leader),
        )
        .await?,
        // Pairing tokens live at most a day (the longest pairing TTL) past their use.
        pairings: bucket(
            js,
            &shared(
                PAIRING_BUCKET,
                Duration::from_secs(2 * 86_400),
                DEVICES_BYTES,
                Reads::Leader,
            ),
        )
        .await?,
        replicas: bucket(
            js,
            &shared(
                REPLICAS_BUCKET,
                REPLICA_RECORD_AGE,
                SMALL_BYTES,
                Reads::AnyReplica,
            ),
        )
        .await?,
        enrollments: bucket(
            js,
            &shared(
                ENROLLMENTS_BUCKET,
                Duration::ZERO,
                SMALL_BYTES,
                Reads::Leader,
            ),
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

struct Spec {
    name: &'static str,
    max_age: Duration,
    max_bytes: i64,
    max_value: i32,
    reads: Reads,
    /// Hosts' credentials publish to the bucket (each to its own key): no rollups (a
    /// `Nats-Rollup: all` on one key would purge every other), no purges, no deletes.
    written_by_hosts: bool,
    replicas: usize,
}

impl Spec {
    fn config(&self) -> stream::Config {
        let name = self.name;
        stream::Config {
            name: format!("KV_{name}"),
            subjects: vec![format!("$KV.{name}.>")],
            max_messages_per_subject: 1,
            max_age: self.max_age,
            max_bytes: self.max_bytes,
            max_message_size: self.max_value,
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            discard: stream::DiscardPolicy::New,
            allow_rollup: !self.written_by_hosts,
            deny_delete: true,
            deny_purge: self.written_by_hosts,
            allow_direct: self.reads == Reads::AnyReplica,
            duplicate_window: Duration::from_secs(120).min(if self.max_age.is_zero() {
                Duration::from_secs(120)
            } else {
                self.max_age
            }),
            ..Default::default()
        }
    }
}

/// Opens a key-value bucket, creating its stream when missing. The stream is made here, as
/// the crate's `create_key_value` would make it, because that first reads the account's
/// limits in a shape NATS 2.9 (Debian's) does not send. A bucket made by an older gateway is
/// brought to the settings of this one.
async fn bucket(js: &jetstream::Context, spec: &Spec) -> Result<kv::Store, NatsError> {
    let name = spec.name;
    let wanted = spec.config();
    if let Ok(stream) = js.get_stream(format!("KV_{name}")).await {
        let config = stream.cached_info().config.clone();
        let differs = config.allow_direct != wanted.allow_direct
            || config.allow_rollup != wanted.allow_rollup
            || config.deny_purge != wanted.deny_purge
            || config.max_bytes != wanted.max_bytes
            || config.max_message_size != wanted.max_message_size;
        if differs {
            let updated = stream::Config {
                allow_direct: wanted.allow_direct,
                allow_rollup: wanted.allow_rollup,
                deny_purge: wanted.deny_purge,
                max_bytes: wanted.max_bytes,
                max_message_size: wanted.max_message_size,
                ..config
            };
            if let Err(err) = js.update_stream(updated).await {
                tracing::warn!(bucket = name, error = %err, "cannot bring the bucket to this gateway's settings");
            }
        }
        return js.get_key_value(name).await.map_err(|e| js_error(name)(&e));
    }
    if let Err(err) = js.create_stream(wanted).await {
        // Another replica may have made it meanwhile.
        if js.get_key_value(name).await.is_err() {
            return Err(js_error(name)(&err));
        }
    }
    js.get_key_value(name).await.map_err(|e| js_error(name)(&e))
}

/// How a host is enrolled: its stream's limits and replication.
pub struct Enrollment<'a> {
    pub host_id: &'a str,
    pub nkey: &'a str,
    /// How long the stream keeps an event (`max_age`).
    pub retention: Duration,
    /// Most bytes the stream keeps; the oldest events go first (`discard: old`).
    pub max_bytes: i64,
    /// The largest event the stream takes.
    pub max_msg_size: i32,
    pub replicas: usize,
    /// Replace the key of a host enrolled with another one.
    pub replace: bool,
}

impl Enrollment<'_> {
    /// Refuses a malformed host id or key, and limits that are not above 0.
    fn check(&self) -> Result<(), NatsError> {
        if !racp_proto::gateway::valid_host_id(self.host_id) {
            return Err(NatsError::Input(format!(
                "{:?} is not a host id (pi-host gateway-key prints it)",
                self.host_id
            )));
        }
        if nkeys::KeyPair::from_public_key(self.nkey).is_err() || !self.nkey.starts_with('U') {
            return Err(NatsError::Input(format!(
                "{:?} is not a user nkey (pi-host gateway-key prints it)",
                self.nkey
            )));
        }
        if self.max_bytes <= 0 || self.retention.is_zero() || self.max_msg_size <= 0 {
            return Err(NatsError::Input(
                "--max-bytes, --retention-seconds and --max-msg-size must be above 0".into(),
            ));
        }
        Ok(())
    }

    /// The configuration of the host's events stream, named `name`.
    fn stream_config(&self, name: &str) -> stream::Config {
        stream::Config {
            name: name.to_string(),
            subjects: vec![host_events_subjects(self.host_id)],
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            max_age: self.retention,
            // Reserved by JetStream at creation: a host fills its own stream, never the server.
            max_bytes: self.max_bytes,
            max_message_size: self.max_msg_size,
            discard: stream::DiscardPolicy::Old,
            // A host that republishes after a lost ack is deduplicated within this window (which
            // JetStream wants no longer than the retention).
            duplicate_window: Duration::from_secs(120).min(self.retention),
            // Replay lookups (the start of a subscription) read from any replica.
            allow_direct: true,
            ..Default::default()
        }
    }
}

/// What an enrollment did: the NATS user entry to put in `authorization.users`, and the key it
/// replaced (whose entry must go).
pub struct Enrolled {
    pub user: String,
    pub replaced: Option<String>,
}

/// Records the host's key (refusing a host id enrolled with another key unless `replace`),
/// creates (or updates) its events stream with its limits, and its first record (offline until
/// its first heartbeat).
pub async fn enroll(js: &jetstream::Context, e: &Enrollment<'_>) -> Result<Enrolled, NatsError> {
    e.check()?;
    let buckets = buckets(js, e.replicas).await;
    let name = events_stream(e.host_id);
    let stream_exists = js.get_stream(&name).await.is_ok();
    let replaced = record_key(&buckets.enrollments, e, stream_exists).await?;
    let config = e.stream_config(&name);
    if stream_exists {
        js.update_stream(config).await.map(|_| ())
    } else {
        js.create_stream(config).await.map(|_| ())
    }
    .map_err(|err| js_error(&name)(&err))?;
    let record = HostRecord {
        host_id: e.host_id.to_string(),
        version: String::new(),
        hostname: String::new(),
        started_at: 0,
        sessions: 0,
        at: 0,
        online: false,
        capabilities: Vec::new(),
    };
    let body = serde_json::to_vec(&record).unwrap_or_default();
    // Only when missing: a host already heard from keeps its record.
    let _ = buckets.hosts.create(e.host_id, body.into()).await;
    Ok(Enrolled {
        user: host_user(e.host_id, e.nkey),
        replaced,
    })
}

/// Records the host's key in the enrollments bucket. The same key again changes nothing;
/// another key is a conflict unless `replace` (a host whose stream exists from before keys were
/// recorded counts as enrolled with an unknown key). Returns the key replaced.
async fn record_key(
    enrollments: &kv::Store,
    e: &Enrollment<'_>,
    stream_exists: bool,
) -> Result<Option<String>, NatsError> {
    let entry = enrollments
        .entry(e.host_id)
        .await
        .map_err(|err| js_error(ENROLLMENTS_BUCKET)(&err))?
        .filter(|entry| entry.operation == kv::Operation::Put);
    let current = entry
        .as_ref()
        .and_then(|entry| serde_json::from_slice::<EnrolledKey>(&entry.value).ok());
    let enrolled_with = match (&current, stream_exists) {
        (Some(current), _) if current.nkey == e.nkey => return Ok(None),
        (Some(current), _) => current.nkey.clone(),
        (None, true) => "an unrecorded key".to_string(),
        (None, false) => String::new(),
    };
    if !enrolled_with.is_empty() && !e.replace {
        return Err(NatsError::Conflict(format!(
            "host {} is enrolled already with {enrolled_with}; to give its id to the key {}              (and take it from the old one), run enroll again with --replace",
            e.host_id, e.nkey
        )));
    }
    let body = serde_json::to_vec(&EnrolledKey {
        nkey: e.nkey.to_string(),
        enrolled_at: racp_server::clock::now_ms(),
    })
    .unwrap_or_default();
    // Compare-and-set on what was read: two enrollments of one id cannot both win.
    let written = match &entry {
        Some(entry) => enrollments
            .update(e.host_id, body.into(), entry.revision)
            .await
            .map(|_| ())
            .map_err(|err| err.to_string()),
        None => enrollments
            .create(e.host_id, body.into())
            .await
            .map(|_| ())
            .map_err(|err| err.to_string()),
    };
    written.map_err(|err| {
        NatsError::Conflict(format!(
            "host {} was enrolled by someone else meanwhile ({err}); run enroll again",
            e.host_id
        ))
    })?;
    Ok((!enrolled_with.is_empty()).then_some(enrolled_with))
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
