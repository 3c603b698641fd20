//! State shared by every connection of one host process.

use crate::clock::now_ms;
use crate::config::ServeConfig;
use crate::secrets::Secrets;
use crate::store::Store;
use dashmap::DashMap;
use racp_proto::{AppError, ErrorCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::watch;

/// Tells a connection to end with a final connection error (revoke, drain).
pub type Kill = watch::Sender<Option<AppError>>;

pub struct HostState {
    pub config: ServeConfig,
    pub store: Store,
    pub secrets: Secrets,
    pub host_id: String,
    pub started_at: u64,
    pub sessions: crate::sessions::Sessions,
    pub turns: crate::turns::Turns,
    pub rate: crate::ratelimit::RateLimiter,
    /// Calls in flight across every connection (HOST_OVERLOADED beyond it).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    draining: AtomicBool,
    next_connection: AtomicU64,
    /// Open connections: connection id → (device id, kill switch).
    connections: DashMap<u64, (Option<String>, Kill)>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Secrets(#[from] crate::secrets::SecretError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Sessions(#[from] crate::sessions::SessionsError),
}

impl HostState {
    pub fn open(config: ServeConfig) -> Result<Arc<Self>, StartError> {
        crate::fsutil::create_private_dir(&config.data_dir).map_err(|source| {
            StartError::DataDir {
                path: config.data_dir.display().to_string(),
                source,
            }
        })?;
        let secrets = Secrets::load_or_create(&config.data_dir.join("host.key"))?;
        let db_path = config.data_dir.join("pi-host.db");
        let store = Store::open(&db_path)?;
        let sessions = crate::sessions::Sessions::open(&store, &db_path, config.retention)?;
        let fresh_id = secrets.new_id("host_")?;
        let host_id = store.meta_or_init("host_id", || fresh_id)?;
        let limits = config.limits.clone();
        Ok(Arc::new(HostState {
            config,
            store,
            secrets,
            host_id,
            started_at: now_ms(),
            sessions,
            turns: crate::turns::Turns::default(),
            rate: crate::ratelimit::RateLimiter::new(
                limits.requests_per_second,
                limits.request_burst,
            ),
            in_flight: Arc::new(tokio::sync::Semaphore::new(
                limits.max_in_flight_host as usize,
            )),
            draining: AtomicBool::new(false),
            next_connection: AtomicU64::new(1),
            connections: DashMap::new(),
        }))
    }

    /// Logs an unexpected failure under a trace id and returns the INTERNAL error to report.
    pub fn internal(&self, err: impl std::fmt::Display) -> AppError {
        let trace_id = format!(
            "t{:x}",
            now_ms() ^ self.next_connection.load(Ordering::Relaxed)
        );
        tracing::error!(%trace_id, error = %err, "internal error");
        AppError::new(
            ErrorCode::Internal,
            "the host failed unexpectedly; see its log",
        )
        .with_trace_id(trace_id)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    /// Registers an open connection; the returned id unregisters it.
    pub fn register(&self, device_id: Option<String>, kill: Kill) -> u64 {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        self.connections.insert(id, (device_id, kill));
        id
    }

    pub fn unregister(&self, id: u64) {
        self.connections.remove(&id);
    }

    /// Ends every open connection of a device at once.
    pub fn kill_device(&self, device_id: &str, error: &AppError) -> usize {
        let mut killed = 0;
        for entry in self.connections.iter() {
            if entry.value().0.as_deref() == Some(device_id) {
                let _ = entry.value().1.send(Some(error.clone()));
                killed += 1;
            }
        }
        killed
    }

    /// Starts draining: new upgrades and calls are refused, open connections are told to close.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        let error = AppError::new(
            ErrorCode::HostShuttingDown,
            "the host is shutting down; reconnect when it is back",
        );
        for entry in self.connections.iter() {
            let _ = entry.value().1.send(Some(error.clone()));
        }
    }
}
