//! What an operator sees of a server (docs/reliability.md, "Metrics and health"): the
//! connection core's counters, which it owns and a host and a gateway export, and the
//! operator's listener (`--metrics-listen`) serving `/metrics` in the Prometheus text format,
//! `/livez` and `/readyz` with the server's named checks. It is never the device port.
//!
//! Labels are closed sets only: a principal kind, a method name from the method table, a code
//! from the error registry. Never a path, a token, a device id or a prompt.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use racp_proto::{ErrorCode, Method};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The label a call without a decoded method is counted under (a frame that is not a request).
const NO_METHOD: &str = "none";
/// The `code` of a call answered with a result.
const OK: &str = "ok";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: &'static str,
}

/// A histogram family whose every histogram has the same buckets.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets for a latency in seconds: 0.5 ms to 32 s, each four times the one before.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 4.0, 9))
}

/// The connection core's series, counted by the core itself whatever the server.
#[derive(Debug)]
pub struct CoreMetrics {
    connections: Family<KindLabel, Gauge>,
    calls: Family<CallLabels, Counter>,
    request_seconds: Histograms<MethodLabel>,
    client_too_slow: Counter,
    cursor_expired: Counter,
    events_delivered: Counter,
    subscriptions: Family<RoleLabel, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: &'static str,
}

impl Default for CoreMetrics {
    fn default() -> Self {
        CoreMetrics {
            connections: Family::default(),
            calls: Family::default(),
            request_seconds: Family::new_with_constructor(latency_histogram),
            client_too_slow: Counter::default(),
            cursor_expired: Counter::default(),
            events_delivered: Counter::default(),
            subscriptions: Family::default(),
        }
    }
}

/// The core's metrics, shared by every connection of a server.
pub type Metrics = Arc<CoreMetrics>;

impl CoreMetrics {
    /// Adds the core's series to a server's registry (prefixed by it: `pi_host_`, `pi_gateway_`).
    /// The series of a closed label set start at 0, so a dashboard finds each before it moves.
    pub fn register(&self, registry: &mut Registry) {
        for kind in ["device", "pairing"] {
            let _ = self.connections.get_or_create(&KindLabel { kind });
        }
        let roles = racp_proto::Role::ALL.iter().map(|role| role.as_str());
        for role in roles.chain(["none"]) {
            let _ = self.subscriptions.get_or_create(&RoleLabel { role });
        }
        registry.register(
            "connections",
            "Open RACP-WS connections by principal kind (device, pairing)",
            self.connections.clone(),
        );
        registry.register(
            "calls",
            "Calls answered, by method and result code (ok or a registered error code)",
            self.calls.clone(),
        );
        registry.register(
            "request_seconds",
            "Time from a call's frame read to its answer, by method",
            self.request_seconds.clone(),
        );
        registry.register(
            "events_delivered",
            "Events sent to subscribers (one per event per subscription)",
            self.events_delivered.clone(),
        );
        registry.register(
            "subscriptions",
            "Open subscriptions by the subscriber's strongest role",
            self.subscriptions.clone(),
        );
        registry.register(
            "client_too_slow",
            "Connections cut with CLIENT_TOO_SLOW",
            self.client_too_slow.clone(),
        );
        registry.register(
            "cursor_expired",
            "Subscriptions refused or ended with CURSOR_EXPIRED",
            self.cursor_expired.clone(),
        );
    }

    /// A connection opened; the guard counts it closed when dropped.
    pub fn opened(self: &Arc<Self>, device: bool) -> OpenConnection {
        let kind = if device { "device" } else { "pairing" };
        self.connections.get_or_create(&KindLabel { kind }).inc();
        OpenConnection {
            metrics: self.clone(),
            kind,
        }
    }

    /// One call answered: `method` when the frame was a request, its result's code.
    pub fn answered(&self, method: Option<Method>, code: Option<ErrorCode>) {
        let labels = CallLabels {
            method: method.map_or(NO_METHOD, Method::as_str),
            code: code.map_or(OK, ErrorCode::as_str),
        };
        self.calls.get_or_create(&labels).inc();
        if let Some(code) = code {
            self.error_sent(code);
        }
    }

    /// How long a call with a method took to answer.
    pub fn took(&self, method: Method, elapsed: std::time::Duration) {
        let label = MethodLabel {
            method: method.as_str(),
        };
        let histogram = self.request_seconds.get_or_create(&label);
        histogram.observe(elapsed.as_secs_f64());
    }

    /// `count` events went out to one subscription (fanout.rs, a gateway's catch-up).
    pub fn delivered(&self, count: usize) {
        self.events_delivered
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }

    /// Subscriptions opened (`change` > 0) or ended under `role`.
    pub fn subscriptions_changed(&self, role: &'static str, change: i64) {
        self.subscriptions
            .get_or_create(&RoleLabel { role })
            .inc_by(change);
    }

    /// An error left the core (a reply, a push, or the error a connection ended with).
    pub fn error_sent(&self, code: ErrorCode) {
        let counter = match code {
            ErrorCode::ClientTooSlow => &self.client_too_slow,
            ErrorCode::CursorExpired => &self.cursor_expired,
            _ => return,
        };
        counter.inc();
    }
}

/// An open connection, counted until dropped.
pub struct OpenConnection {
    metrics: Metrics,
    kind: &'static str,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let kind = self.kind;
        self.metrics
            .connections
            .get_or_create(&KindLabel { kind })
            .dec();
    }
}

/// A NATS link's series, for a gateway and for a host attached to one: whether it is up (read
/// from the client at a scrape, the truth, not the last event seen) and how often it was made
/// again after a loss (counted by the client's event callback: `Connected` after the first).
#[derive(Clone, Debug, Default)]
pub struct NatsLink {
    connected: Gauge,
    reconnects: Counter,
    connected_once: Arc<AtomicBool>,
}

impl NatsLink {
    /// Adds `nats_connected` and `nats_reconnects_total` to a server's registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "nats_connected",
            "1 while the NATS connection is up, 0 when not",
            self.connected.clone(),
        );
        registry.register(
            "nats_reconnects",
            "NATS connections made again after a loss",
            self.reconnects.clone(),
        );
    }

    /// What the NATS client's `event_callback` tells: a `Connected` other than the first is a
    /// reconnect.
    pub fn event(&self, event: &async_nats::Event) {
        if matches!(event, async_nats::Event::Connected)
            && self.connected_once.swap(true, Ordering::Relaxed)
        {
            self.reconnects.inc();
        }
    }

    /// Sets the gauge from the client's state, before a scrape (`None`: no link made yet).
    pub fn observe(&self, client: Option<&async_nats::Client>) {
        let up = client
            .is_some_and(|c| c.connection_state() == async_nats::connection::State::Connected);
        self.connected.set(i64::from(up));
    }
}

/// One named readiness check's outcome: `Err` says why it fails.
pub type Check = (&'static str, Result<(), String>);

/// What a server adds to its listener: gauges read at each scrape and its readiness checks.
pub trait Observed: Send + Sync + 'static {
    /// Sets the gauges that are read rather than counted (agents running, ...), before a scrape;
    /// within the server's own bound (a scrape waits for it).
    fn refresh(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }

    /// The named checks `/readyz` runs, each within the server's own bound.
    fn checks(&self) -> Pin<Box<dyn Future<Output = Vec<Check>> + Send + '_>>;
}

/// The operator's listener: `/metrics`, `/livez`, `/readyz`.
pub struct Operator {
    pub registry: Registry,
    pub observed: Arc<dyn Observed>,
}

/// A listen address the operator flag may name: loopback unless `remote` is allowed.
pub fn check_listen(addr: SocketAddr, remote: bool) -> Result<SocketAddr, String> {
    if addr.ip().is_loopback() || remote {
        Ok(addr)
    } else {
        Err(format!(
            "--metrics-listen {addr} is not a loopback address; metrics and health are for the \
             operator: use 127.0.0.1:PORT, or add --metrics-allow-remote to serve them on {addr}"
        ))
    }
}

/// Binds the operator's listener at `addr` (loopback unless `remote`), serves `operator` on it
/// on a task of its own, and returns the bound address (port 0 is the OS's choice).
pub async fn listen(
    addr: SocketAddr,
    remote: bool,
    operator: Operator,
) -> Result<SocketAddr, String> {
    let addr = check_listen(addr, remote)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen for metrics on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(serve(listener, operator));
    tracing::info!(%local, "metrics and health listening");
    Ok(local)
}

/// Serves the operator's endpoints on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, operator: Operator) {
    let operator = Arc::new(operator);
    let metrics = operator.clone();
    let ready = operator.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || async move { scrape(&metrics).await }),
        )
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(move || async move { readyz(&ready).await }));
    if let Err(error) = axum::serve(listener, app).await {
        tracing::warn!(%error, "the metrics listener stopped");
    }
}

async fn scrape(operator: &Operator) -> Response {
    operator.observed.refresh().await;
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &operator.registry) {
        tracing::warn!(%error, "metrics could not be encoded");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let kind = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, kind)], text).into_response()
}

/// 200 when every check passes, 503 when one fails; the body names each check and its result.
async fn readyz(operator: &Operator) -> Response {
    let checks = operator.observed.checks().await;
    let ready = checks.iter().all(|(_, result)| result.is_ok());
    let body = serde_json::json!({
        "ready": ready,
        "checks": checks.iter().map(|(name, result)| match result {
            Ok(()) => serde_json::json!({"name": name, "ok": true}),
            Err(why) => serde_json::json!({"name": name, "ok": false, "reason": why}),
        }).collect::<Vec<_>>(),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let json = [(header::CONTENT_TYPE, "application/json")];
    (status, json, format!("{body}\n")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_unless_allowed() {
        let loopback: SocketAddr = "127.0.0.1:9100".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:9100".parse().unwrap();
        assert!(check_listen(loopback, false).is_ok());
        assert!(check_listen(any, false).is_err());
        assert!(check_listen(any, true).is_ok());
    }

    #[test]
    fn calls_and_cuts_are_counted_by_code() {
        let metrics = Arc::new(CoreMetrics::default());
        let mut registry = Registry::with_prefix("pi_host");
        metrics.register(&mut registry);
        let open = metrics.opened(true);
        metrics.answered(Some(Method::Hello), None);
        metrics.answered(
            Some(Method::SessionSubscribe),
            Some(ErrorCode::CursorExpired),
        );
        metrics.error_sent(ErrorCode::ClientTooSlow);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"pi_host_connections{kind="device"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pi_host_calls_total{method="hello",code="ok"} 1"#),
            "{text}"
        );
        assert!(text.contains("pi_host_cursor_expired_total 1"), "{text}");
        assert!(text.contains("pi_host_client_too_slow_total 1"), "{text}");
        drop(open);
        text.clear();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"pi_host_connections{kind="device"} 0"#),
            "{text}"
        );
    }
}
