//! The registry of open connections, and the per-device gates that make a revocation final.
//!
//! A device is checked once at the upgrade, but a connection lives on; two things keep it honest
//! (docs/protocol.md §7.6, "Revocation is final"):
//! - Registration comes before the last check. A connection enters the table first and reads
//!   its device's gate (and the drain flag) after; a revocation sets the gate first and walks
//!   the table after. Both go through the same locks, so either the revocation sees the
//!   connection and kills it, or the connection sees the revocation and ends itself.
//! - Every call holds a [`CallPass`] from its device's gate while it runs. A revocation closes
//!   the gate (no new pass), waits for the passes already out, then kills the device's
//!   connections and waits until their loops have stopped. When `device/revoke` answers, no call
//!   of that device is running, none can start, and no connection of it sends anything more.

use dashmap::DashMap;
use racp_proto::AppError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Tells a connection to end with a final connection error (revoke, drain).
pub type Kill = watch::Sender<Option<AppError>>;

/// How long a revocation waits for a device's running calls, then for its connections' loops.
/// Calls are short (turns run in the background), and a loop stops within one socket write
/// (bounded by `send_stall`); past this the revocation answers anyway, and the gate still
/// refuses every later call.
const REVOKE_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct Connections {
    open: DashMap<u64, OpenConnection>,
    next_id: AtomicU64,
    /// Admitted connections, counted from the upgrade check (before they are registered), so
    /// concurrent upgrades cannot pass the cap together.
    admitted: Arc<AtomicUsize>,
    gates: DashMap<String, Arc<DeviceGate>>,
    /// Woken when a connection leaves the table (it has sent its last frame and closed).
    unregistered: Notify,
}

struct OpenConnection {
    device_id: Option<String>,
    kill: Arc<Kill>,
}

/// One admitted connection's place under the connection cap; released when dropped.
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A registered connection: its id, its kill switch, and its device's gate.
pub struct Registration {
    pub id: u64,
    pub kill: watch::Receiver<Option<AppError>>,
    pub gate: Option<Arc<DeviceGate>>,
    /// Held for the connection's lifetime: its place under the cap.
    pub slot: Slot,
}

impl Connections {
    /// Takes a place under `max`, or `None` when every place is taken.
    pub fn admit(&self, max: usize) -> Option<Slot> {
        let taken = self.admitted.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(self.admitted.clone());
        (taken < max).then_some(slot)
    }

    /// Connections admitted and not yet closed.
    pub fn count(&self) -> usize {
        self.admitted.load(Ordering::Acquire)
    }

    /// Enters a connection into the table. The caller must check [`DeviceGate::is_closed`] and
    /// the drain flag *after* this (see the module comment).
    pub fn register(&self, slot: Slot, device_id: Option<String>) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (kill, kill_rx) = watch::channel(None);
        let gate = device_id.as_deref().map(|device| self.gate(device));
        self.open.insert(
            id,
            OpenConnection {
                device_id,
                kill: Arc::new(kill),
            },
        );
        Registration {
            id,
            kill: kill_rx,
            gate,
            slot,
        }
    }

    pub fn unregister(&self, id: u64) {
        self.open.remove(&id);
        self.unregistered.notify_waiters();
    }

    /// The gate of a device (made on first use; a revoked device's gate stays closed).
    pub fn gate(&self, device_id: &str) -> Arc<DeviceGate> {
        self.gates
            .entry(device_id.to_string())
            .or_insert_with(|| Arc::new(DeviceGate::default()))
            .clone()
    }

    /// Closes a device's gate, waits for its running calls (a revoke holds no pass, so a
    /// device revoking itself waits for none of its own), then ends its connections and waits
    /// until they have stopped. Returns how many connections were ended.
    pub async fn revoke(&self, device_id: &str, error: &AppError) -> usize {
        let gate = self.gate(device_id);
        let deadline = tokio::time::Instant::now() + REVOKE_WAIT;
        if !gate.close_and_wait(deadline).await {
            tracing::warn!(device_id, "revoked with calls still running past the wait");
        }
        let kills: Vec<Arc<Kill>> = self
            .open
            .iter()
            .filter(|entry| entry.device_id.as_deref() == Some(device_id))
            .map(|entry| entry.kill.clone())
            .collect();
        if !end(&kills, error, deadline).await {
            tracing::warn!(device_id, "a revoked connection is still stopping");
        }
        kills.len()
    }

    /// Ends every open connection with `error` (the drain) and waits, at most `within`, until
    /// each has sent it and closed: a server that exits before that would cut them unclosed.
    pub async fn end_all(&self, error: &AppError, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        let ids: Vec<u64> = self.open.iter().map(|entry| *entry.key()).collect();
        self.kill_where(|_| true, error);
        loop {
            let left = self.unregistered.notified();
            tokio::pin!(left);
            // Listening before the check, so a connection that leaves between them is seen.
            left.as_mut().enable();
            if ids.iter().all(|id| !self.open.contains_key(id)) {
                return;
            }
            if tokio::time::timeout_at(deadline, left).await.is_err() {
                tracing::warn!("a connection was still closing when the drain stopped waiting");
                return;
            }
        }
    }

    /// Tells every device's connection to end with `error` (those still pairing stay); returns
    /// how many were told.
    pub fn kill_devices(&self, error: &AppError) -> usize {
        self.kill_where(|device_id| device_id.is_some(), error)
    }

    fn kill_where(&self, chosen: impl Fn(Option<&str>) -> bool, error: &AppError) -> usize {
        let mut told = 0;
        for entry in self.open.iter() {
            if chosen(entry.device_id.as_deref()) {
                let _ = entry.kill.send(Some(error.clone()));
                told += 1;
            }
        }
        told
    }
}

/// Tells each connection to end with `error`; true once every one has stopped before `deadline`.
async fn end(kills: &[Arc<Kill>], error: &AppError, deadline: tokio::time::Instant) -> bool {
    for kill in kills {
        let _ = kill.send(Some(error.clone()));
    }
    // A connection drops its receiver when its loop stops: nothing leaves it after that.
    let stopped = futures_util::future::join_all(kills.iter().map(|kill| kill.closed()));
    tokio::time::timeout_at(deadline, stopped).await.is_ok()
}

/// Whether a device may still make calls, and how many of its calls are running.
#[derive(Default)]
pub struct DeviceGate {
    state: Mutex<GateState>,
    idle: Notify,
}

#[derive(Default)]
struct GateState {
    closed: bool,
    running: usize,
}

/// Held by a call while it runs; the gate counts it until it is dropped.
pub struct CallPass(Arc<DeviceGate>);

impl Drop for CallPass {
    fn drop(&mut self) {
        self.0.lock().running -= 1;
        self.0.idle.notify_waiters();
    }
}

impl DeviceGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // The state is two plain fields, consistent after any panic: keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// A pass for one call, or `None` once the device is revoked.
    pub fn enter(self: &Arc<Self>) -> Option<CallPass> {
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        state.running += 1;
        Some(CallPass(self.clone()))
    }

    /// Closes the gate, then waits until no call is running or the deadline passes; true when
    /// the calls finished in time.
    async fn close_and_wait(&self, deadline: tokio::time::Instant) -> bool {
        self.lock().closed = true;
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Registered before the count is read, so a pass dropped in between still wakes us.
            idle.as_mut().enable();
            if self.lock().running == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_counts_admitted_connections_until_their_slots_drop() {
        let connections = Connections::default();
        let a = connections.admit(2).expect("first");
        let b = connections.admit(2).expect("second");
        assert!(connections.admit(2).is_none(), "a third passed a cap of 2");
        assert_eq!(connections.count(), 2, "a refused admission kept its place");
        drop(a);
        let c = connections.admit(2).expect("a freed place");
        drop((b, c));
        assert_eq!(connections.count(), 0);
    }

    #[tokio::test]
    async fn a_closed_gate_refuses_new_calls_and_waits_for_running_ones() {
        let connections = Arc::new(Connections::default());
        let gate = connections.gate("dev_a");
        let pass = gate.enter().expect("open gate");
        let revoking = {
            let connections = connections.clone();
            tokio::spawn(async move {
                let error = AppError::new(racp_proto::ErrorCode::RemoteAuthFailed, "revoked");
                connections.revoke("dev_a", &error).await
            })
        };
        // The revocation cannot finish while the pass is out; the gate is already closed.
        while !gate.is_closed() {
            tokio::task::yield_now().await;
        }
        assert!(gate.enter().is_none(), "a call entered a closed gate");
        assert!(!revoking.is_finished());
        drop(pass);
        assert_eq!(revoking.await.expect("revoke task"), 0);
        assert!(connections.gate("dev_a").enter().is_none());
    }

    #[tokio::test]
    async fn revoke_waits_until_the_connections_loop_has_stopped() {
        let connections = Arc::new(Connections::default());
        let slot = connections.admit(8).expect("slot");
        let mut registration = connections.register(slot, Some("dev_b".into()));
        let revoking = {
            let connections = connections.clone();
            tokio::spawn(async move {
                let error = AppError::new(racp_proto::ErrorCode::RemoteAuthFailed, "revoked");
                connections.revoke("dev_b", &error).await
            })
        };
        registration.kill.changed().await.expect("kill sent");
        assert!(registration.kill.borrow().is_some());
        let mut revoking = revoking;
        let early = tokio::time::timeout(Duration::from_millis(200), &mut revoking).await;
        assert!(early.is_err(), "revoke answered before the loop stopped");
        drop(registration.kill);
        assert_eq!(revoking.await.expect("revoke task"), 1);
    }
}
