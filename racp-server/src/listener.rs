//! The accept path up to the WebSocket upgrade, for plain and TLS alike:
//! accept → pre-upgrade slot → optional TLS handshake (deadline) → HTTP/1 with a header
//! deadline and size cap → the upgrade hands the socket to `connection.rs` and frees the slot.
//!
//! Until the upgrade a peer is unauthenticated, so everything it can hold is bounded: time
//! (deadlines), bytes (the header cap) and file descriptors (the slot bound, derived from
//! RLIMIT_NOFILE with a reserve kept for the admin socket, the database, agent pipes and
//! upgraded connections). docs/reliability.md 4.10 has the attack and the measurements.

use crate::limits::HostLimits;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

/// A client sends its upgrade request as soon as it is connected; a peer that has not finished
/// its headers by then is stalling (or trickling) to hold a descriptor.
pub const HEADER_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client may take to finish the TLS handshake.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// From the start of HTTP (after the TLS handshake) to the upgrade, whatever the peer does:
/// hyper's header timer restarts with each request of a kept-alive connection and does not
/// cover a slow body or a peer that does not read the answer, so this bounds the whole phase.
pub const HTTP_PHASE_DEADLINE: Duration = Duration::from_secs(10);
/// On SIGTERM, how long a request under way may take to get its answer (a refusal: the host is
/// draining) before its socket is closed; idle ones close at once. An unauthenticated peer must
/// not hold the drain up for a whole deadline.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// Request line and headers together; more is answered 431. A real upgrade is under 1 KiB
/// (tokens are short); with hyper's default (about 400 KiB), 300 unfinished 300 KB headers grew
/// the host by 70 to 90 MB (docs/reliability.md 4.10).
pub const MAX_HEADER_BYTES: usize = 16 << 10;

/// Descriptors kept out of the connection budget: stdio, the runtime (epoll, eventfd, signal
/// pipe), both listeners, the log, two SQLite connections with their WAL and SHM files, the
/// admin socket's connections (admin.rs), and files the handlers open (`fs/*`, the host key).
pub const RESERVED_FDS: u64 = 64;
/// One part in this many of the rest is kept for agents (3 pipes each, and a pidfd where tokio
/// uses one).
const AGENT_SHARE: u64 = 8;
/// One part in this many of the rest is for pre-upgrade connections.
const PRE_UPGRADE_SHARE: u64 = 4;
const MIN_PRE_UPGRADE: u64 = 8;
/// More than enough for any real burst of connects; beyond it the oldest are dropped.
const MAX_PRE_UPGRADE: u64 = 4096;

/// How the descriptor limit is split (docs/reliability.md 4.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdBudget {
    /// RLIMIT_NOFILE (soft) once raised.
    pub nofile: u64,
    /// Connections accepted but not upgraded (TLS handshakes included).
    pub pre_upgrade: usize,
    /// Upgraded connections the descriptors allow; `limits.max_connections` is clamped to it.
    pub upgraded: usize,
}

impl FdBudget {
    pub fn for_limit(nofile: u64) -> FdBudget {
        let usable = nofile.saturating_sub(RESERVED_FDS);
        let pre_upgrade = (usable / PRE_UPGRADE_SHARE).clamp(MIN_PRE_UPGRADE, MAX_PRE_UPGRADE);
        let upgraded = usable
            .saturating_sub(usable / AGENT_SHARE)
            .saturating_sub(pre_upgrade)
            .max(1);
        FdBudget {
            nofile,
            pre_upgrade: usize::try_from(pre_upgrade).unwrap_or(usize::MAX),
            upgraded: usize::try_from(upgraded).unwrap_or(usize::MAX),
        }
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit, derives the budget from it, and clamps
/// `limits.max_connections` to what the descriptors allow.
///
/// Clamped rather than only warned about: past the budget, upgraded connections would take the
/// descriptors kept for the admin socket and new clients, accept() would fail with EMFILE and
/// the owner could not even revoke; at the clamp a client gets HOST_OVERLOADED (503 with
/// `retryAfterMs`), which clients handle.
pub fn plan(limits: &mut HostLimits) -> FdBudget {
    let nofile = raise_nofile_limit();
    let budget = FdBudget::for_limit(nofile);
    if limits.max_connections > budget.upgraded {
        // A warning only for a bound someone set: the default adapts to the machine silently.
        if limits.max_connections == HostLimits::default().max_connections {
            tracing::info!(
                max_connections = budget.upgraded,
                nofile,
                "connections bounded by the file-descriptor limit"
            );
        } else {
            tracing::warn!(
                configured = limits.max_connections,
                clamped_to = budget.upgraded,
                nofile,
                "max_connections exceeds what the file-descriptor limit allows; clamped \
                 (raise the hard limit: `ulimit -Hn`, systemd LimitNOFILE=)"
            );
        }
        limits.max_connections = budget.upgraded;
    }
    tracing::info!(
        nofile,
        pre_upgrade = budget.pre_upgrade,
        max_connections = limits.max_connections,
        "file-descriptor budget"
    );
    budget
}

/// The soft limit after raising it to the hard one (the default soft limit is often 1024).
fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read RLIMIT_NOFILE; assuming 1024");
            return 1024;
        }
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => hard,
        Err(err) => {
            tracing::warn!(error = %err, soft, hard, "cannot raise RLIMIT_NOFILE");
            soft
        }
    }
}

/// Connections not yet past their first exchange (here: between accept and upgrade; admin.rs:
/// before the reply), oldest first. When the bound is reached the oldest is dropped, not the
/// newcomer: a flood of stalled sockets then cannot keep a fresh, legitimate client out, it only
/// pushes out the stalled ones that came before it.
pub struct DropOldest {
    bound: usize,
    inner: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    next: u64,
    /// Slot id (in accept order) → what tells its connection to give up.
    open: BTreeMap<u64, oneshot::Sender<()>>,
    evicted: u64,
}

/// One connection's place among the pre-upgrade ones; dropping it frees the place.
pub struct Slot {
    id: u64,
    registry: Arc<DropOldest>,
    /// Resolves when the connection was dropped to make room.
    pub evicted: oneshot::Receiver<()>,
}

impl DropOldest {
    pub fn new(bound: usize) -> Arc<DropOldest> {
        Arc::new(DropOldest {
            bound: bound.max(1),
            inner: Mutex::new(Slots::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        // The map stays consistent whatever panicked while holding it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a connection just accepted, evicting the oldest ones beyond the bound.
    /// Returns the slot and how many were evicted for it.
    pub fn admit(self: &Arc<Self>) -> (Slot, usize) {
        let (tx, evicted) = oneshot::channel();
        let mut slots = self.lock();
        let mut dropped = 0;
        while slots.open.len() >= self.bound {
            if slots.open.pop_first().is_none() {
                break;
            }
            dropped += 1;
        }
        slots.evicted += dropped as u64;
        let id = slots.next;
        slots.next += 1;
        slots.open.insert(id, tx);
        let slot = Slot {
            id,
            registry: self.clone(),
            evicted,
        };
        (slot, dropped)
    }

    /// Drops the oldest pre-upgrade connection (to free a descriptor); false when there is none.
    pub fn evict_oldest(&self) -> bool {
        let mut slots = self.lock();
        let evicted = slots.open.pop_first().is_some();
        if evicted {
            slots.evicted += 1;
        }
        evicted
    }

    pub fn len(&self) -> usize {
        self.lock().open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections dropped to make room since the start.
    pub fn evicted(&self) -> u64 {
        self.lock().evicted
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.registry.lock().open.remove(&self.id);
    }
}

/// Accepts until `shutdown` resolves, then stops accepting, gives connections still before their
/// upgrade [`DRAIN_GRACE`] to finish and returns. Upgraded connections are not waited for here:
/// the drain closes them (state.rs `begin_drain`).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    router: Router,
    budget: &FdBudget,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    // On a worker thread, not the thread that blocks on `main`'s future: there the loop would
    // outrun the workers, accepting (and evicting) faster than connections can read their
    // requests or close, and run out of descriptors with few connections really open.
    let accepting = tokio::spawn(accept_loop(listener, tls, router, budget.clone(), shutdown));
    if let Err(err) = accepting.await {
        tracing::error!(error = %err, "the accept loop failed");
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    router: Router,
    budget: FdBudget,
    shutdown: impl Future<Output = ()>,
) {
    let registry = DropOldest::new(budget.pre_upgrade);
    let acceptor = tls.map(TlsAcceptor::from);
    let http = http_builder();
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a receiver; `closed()` says they have all ended.
    let (alive_tx, alive_rx) = watch::channel(());
    let mut warned = Warned::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                accept_failed(&registry, &err, &mut warned).await;
                continue;
            }
        };
        // Without TCP_NODELAY, Nagle holds a small event frame back until the previous one is
        // acknowledged: p50 delivery latency went from 8.2 ms to 0.37 ms with it
        // (docs/benchmarks.md).
        let _ = tcp.set_nodelay(true);
        let (slot, dropped) = registry.admit();
        if dropped > 0 && Warned::due(&mut warned.full) {
            tracing::warn!(
                bound = budget.pre_upgrade,
                evicted = registry.evicted(),
                "pre-upgrade connections at their bound: dropping the oldest"
            );
        }
        tokio::spawn(connection(
            tcp,
            peer,
            slot,
            acceptor.clone(),
            TowerToHyperService::new(router.clone()),
            http.clone(),
            stop_rx.clone(),
            alive_rx.clone(),
        ));
        // Let the connections just accepted read their requests before accepting more, so a
        // burst of connects cannot evict a client whose request is already waiting.
        tokio::task::yield_now().await;
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_rx);
    alive_tx.closed().await;
}

/// How every connection reads HTTP before its upgrade.
fn http_builder() -> http1::Builder {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_DEADLINE)
        // Keep-alive stays on: hyper answers `Connection: close` without it, which breaks the
        // 101. A peer that keeps sending requests is stopped by HTTP_PHASE_DEADLINE.
        .max_buf_size(MAX_HEADER_BYTES);
    http
}

/// When the last warnings of each kind were logged: a flood must not flood the log too.
#[derive(Default)]
struct Warned {
    accept: Option<Instant>,
    full: Option<Instant>,
}

impl Warned {
    const EVERY: Duration = Duration::from_secs(10);

    fn due(last: &mut Option<Instant>) -> bool {
        let now = Instant::now();
        let due = last.is_none_or(|at| now.duration_since(at) >= Self::EVERY);
        if due {
            *last = Some(now);
        }
        due
    }
}

/// Out of descriptors (EMFILE, ENFILE) or memory: drop the oldest pre-upgrade connection to
/// free one, and wait a moment instead of spinning on an accept that keeps failing.
async fn accept_failed(registry: &DropOldest, err: &std::io::Error, warned: &mut Warned) {
    use nix::libc;
    let exhausted = matches!(
        err.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    );
    let pause = if exhausted {
        let freed = registry.evict_oldest();
        if Warned::due(&mut warned.accept) {
            tracing::warn!(error = %err, freed, pending = registry.len(), "accept failed");
        }
        Duration::from_millis(20)
    } else {
        // ECONNABORTED and the like: that peer is gone, the next one may be fine.
        tracing::debug!(error = %err, "accept failed");
        Duration::from_millis(1)
    };
    tokio::time::sleep(pause).await;
}

type Service = TowerToHyperService<Router>;

/// One connection until its upgrade (or its end): the TLS handshake within
/// [`HANDSHAKE_DEADLINE`], then HTTP within [`HTTP_PHASE_DEADLINE`]; the slot is freed when this
/// returns.
#[allow(clippy::too_many_arguments)]
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    mut slot: Slot,
    tls: Option<TlsAcceptor>,
    service: Service,
    http: http1::Builder,
    stop: watch::Receiver<bool>,
    _alive: watch::Receiver<()>,
) {
    let mut draining = stop.clone();
    let drained = async move {
        let _ = draining.wait_for(|stop| *stop).await;
        tokio::time::sleep(DRAIN_GRACE).await;
    };
    let phase = async {
        let http_phase = match tls {
            None => {
                tokio::time::timeout(HTTP_PHASE_DEADLINE, serve_http(tcp, service, &http, stop))
                    .await
            }
            Some(acceptor) => {
                match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let served = serve_http(stream, service, &http, stop);
                        tokio::time::timeout(HTTP_PHASE_DEADLINE, served).await
                    }
                    Ok(Err(err)) => {
                        tracing::debug!(%peer, error = %err, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                }
            }
        };
        if http_phase.is_err() {
            tracing::debug!(%peer, "no upgrade before the deadline: closed");
        }
    };
    tokio::select! {
        () = phase => {}
        _ = &mut slot.evicted => {
            tracing::debug!(%peer, "dropped to make room for newer connections");
        }
        () = drained => tracing::debug!(%peer, "closed by the drain"),
    }
}

/// HTTP/1 until the upgrade is done (hyper then hands the socket to the WebSocket task) or the
/// request is answered. hyper's header timer starts with the first read, so it covers a peer
/// that never sends a byte as well as one that trickles its headers.
async fn serve_http<I>(
    io: I,
    service: Service,
    http: &http1::Builder,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = http
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "HTTP connection ended");
                }
                return;
            }
            // Draining: finish a request under way (its upgrade is refused), close an idle one.
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_is_dropped_at_the_bound_and_a_finished_one_frees_its_place() {
        let registry = DropOldest::new(3);
        let (mut a, _) = registry.admit();
        let (b, _) = registry.admit();
        let (mut c, _) = registry.admit();
        assert_eq!(registry.len(), 3);
        // A finished connection frees its place without evicting anyone.
        drop(b);
        let (mut d, dropped) = registry.admit();
        assert_eq!((dropped, registry.len()), (0, 3));
        assert!(
            a.evicted
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
        // At the bound the oldest (a) goes, not the newcomer.
        let (mut e, dropped) = registry.admit();
        assert_eq!((dropped, registry.len(), registry.evicted()), (1, 3, 1));
        assert_eq!(
            a.evicted.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        );
        // An evicted slot dropped later removes nothing else.
        drop(a);
        assert_eq!(registry.len(), 3);
        // EMFILE: the oldest left (c) is dropped to free a descriptor.
        assert!(registry.evict_oldest());
        assert_eq!(
            c.evicted.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        );
        for slot in [&mut d, &mut e] {
            assert_eq!(
                slot.evicted.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            );
        }
        drop((c, d, e));
        assert_eq!(registry.len(), 0);
        assert!(!registry.evict_oldest());
    }

    #[test]
    fn the_budget_keeps_a_reserve_and_scales_with_the_limit() {
        // 256: the test hosts in tests/preauth.rs.
        let small = FdBudget::for_limit(256);
        assert_eq!((small.pre_upgrade, small.upgraded), (48, 120));
        let default_soft = FdBudget::for_limit(1024);
        assert_eq!(
            (default_soft.pre_upgrade, default_soft.upgraded),
            (240, 600)
        );
        let large = FdBudget::for_limit(1 << 20);
        assert_eq!(large.pre_upgrade, MAX_PRE_UPGRADE as usize);
        assert!(large.upgraded > 20_000);
        for limit in [0, 1, 64, 100, 256, 1024, 65_536, u64::MAX] {
            let budget = FdBudget::for_limit(limit);
            assert!(budget.pre_upgrade >= MIN_PRE_UPGRADE as usize);
            assert!(budget.upgraded >= 1);
            if limit >= 256 {
                let used = RESERVED_FDS + budget.pre_upgrade as u64 + budget.upgraded as u64;
                assert!(used <= limit, "{limit}: {budget:?}");
            }
        }
    }
}
