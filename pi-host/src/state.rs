//! State shared by every connection of one host process.

use crate::config::ServeConfig;
use crate::redact::Redactor;
use crate::secrets::Secrets;
use crate::store::Store;
use racp_proto::{AppError, ErrorCode};
use racp_server::clock::now_ms;
use racp_server::connections::Connections;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct HostState {
    pub config: ServeConfig,
    pub store: Store,
    pub secrets: Secrets,
    pub host_id: String,
    pub started_at: u64,
    pub sessions: crate::sessions::Sessions,
    pub drivers: crate::driver::Drivers,
    pub rate: racp_server::ratelimit::RateLimiter,
    /// Bytes held for clients across every connection: requests being read, replies being
    /// built (history pages, exports) or waiting for their socket (HOST_OVERLOADED beyond it).
    pub budget: racp_server::budget::ByteBudget,
    /// Calls in flight across every connection (HOST_OVERLOADED beyond it).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    draining: AtomicBool,
    /// Open connections and the device gates (revoke, drain, the connection cap).
    pub connections: Connections,
    /// pi-host's pi extensions, which agents are started with (`agent::extensions`); empty
    /// when they could not be written.
    pub agent_extensions: Vec<std::path::PathBuf>,
    /// Provider keys, custom providers and the model catalogue a desktop reads.
    pub models: crate::models::Models,
    /// The one redaction of agent text (and of the log, which shares it): it knows the
    /// provider keys `models` hands the agents.
    pub redactor: Redactor,
    /// The agent program: where it is, its version, whether it can run (`agent::check`).
    pub agent: crate::agent::check::AgentCheck,
    /// The kernel sandbox agents start in, and whether the kernel can apply it.
    pub sandbox: crate::agent::sandbox::HostSandbox,
    /// The open sessions' workspaces, watched (docs/protocol.md §8.9).
    pub workspaces: crate::workspace::Workspaces,
    /// What the operator's listener exports (metrics.rs).
    pub metrics: crate::metrics::HostMetrics,
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
    #[error(transparent)]
    Settings(#[from] crate::models::FileError),
}

/// The data directory's secrets, store and host id (made at first use).
pub fn open_identity(data_dir: &std::path::Path) -> Result<(Secrets, Store, String), StartError> {
    racp_server::private_file::create_private_dir(data_dir).map_err(|source| {
        StartError::DataDir {
            path: data_dir.display().to_string(),
            source,
        }
    })?;
    let secrets = Secrets::load_or_create(&data_dir.join("host.key"))?;
    let store = Store::open(&data_dir.join("pi-host.db"))?;
    let fresh_id = secrets.new_id("host_")?;
    let host_id = store.meta_or_init("host_id", || fresh_id)?;
    Ok((secrets, store, host_id))
}

impl HostState {
    pub fn open(config: ServeConfig) -> Result<Arc<Self>, StartError> {
        HostState::open_with(config, Redactor::default())
    }

    /// [`HostState::open`] with the redactor the host's log writer already uses.
    pub fn open_with(config: ServeConfig, redactor: Redactor) -> Result<Arc<Self>, StartError> {
        let (secrets, store, host_id) = open_identity(&config.data_dir)?;
        let db_path = config.data_dir.join("pi-host.db");
        let metrics = crate::metrics::HostMetrics::default();
        let sessions = crate::sessions::Sessions::open(
            &store,
            &db_path,
            config.retention,
            config.history,
            metrics.commits.clone(),
        )?;
        let limits = config.limits.clone();
        let agent_extensions =
            crate::agent::extensions::install(&config.data_dir, config.agent_preload)
                .inspect_err(|err| {
                    tracing::warn!(error = %err, "cannot write pi-host's agent extensions; agents start without them");
                })
                .unwrap_or_default();
        let models = crate::models::Models::open(&config.data_dir, redactor.clone())?;
        let agent = crate::agent::check::AgentCheck::new(
            &config.agent,
            &config.data_dir,
            config.config_file.as_deref(),
        );
        let sandbox = crate::agent::sandbox::HostSandbox::start(config.sandbox.mode);
        Ok(Arc::new(HostState {
            sandbox,
            config,
            store,
            secrets,
            host_id,
            started_at: now_ms(),
            sessions,
            drivers: crate::driver::Drivers::default(),
            rate: racp_server::ratelimit::RateLimiter::new(
                limits.requests_per_second,
                limits.request_burst,
            ),
            budget: racp_server::budget::ByteBudget::new(limits.max_held_bytes),
            in_flight: Arc::new(tokio::sync::Semaphore::new(
                limits.max_in_flight_host as usize,
            )),
            draining: AtomicBool::new(false),
            connections: Connections::default(),
            agent_extensions,
            models,
            redactor,
            agent,
            workspaces: crate::workspace::Workspaces::default(),
            metrics,
        }))
    }

    /// Logs an unexpected failure under a trace id and returns the INTERNAL error to report.
    pub fn internal(&self, err: impl std::fmt::Display) -> AppError {
        crate::internal(err)
    }

    /// The command line an agent is started with: the configured agent and pi-host's
    /// extensions (`resume`: and the arguments that resume its own session).
    pub fn agent_command(&self, resume: bool) -> String {
        let mut command = self.config.agent.clone();
        if !self.agent_extensions.is_empty() {
            command = format!(
                "{command} {}",
                crate::agent::extensions::agent_args(&self.agent_extensions)
            );
        }
        if resume && !self.config.agent_resume_args.is_empty() {
            command = format!("{command} {}", self.config.agent_resume_args);
        }
        command
    }

    /// The bounds an agent runs with, and the redaction of what it writes.
    pub fn agent_options(&self) -> crate::agent::AgentOptions {
        crate::agent::AgentOptions {
            redactor: self.redactor.clone(),
            ..Default::default()
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts draining: new upgrades and calls are refused, open connections are ended and
    /// waited for until they have closed (5 s at most).
    pub async fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        tracing::info!("drain begun: new connections and calls are refused");
        #[cfg(debug_assertions)]
        crate::test_hooks::before_drain_kill().await;
        // As long as a gateway replica waits for its own.
        let grace = std::time::Duration::from_secs(5);
        self.connections.end_all(&shutting_down(), grace).await;
    }
}

/// What a draining host ends or refuses a connection with.
pub fn shutting_down() -> AppError {
    AppError::new(
        ErrorCode::HostShuttingDown,
        "the host is shutting down; reconnect when it is back",
    )
}

impl crate::models::ModelHost for HostState {
    fn models(&self) -> &crate::models::Models {
        &self.models
    }
    fn config(&self) -> &ServeConfig {
        &self.config
    }
    fn agent(&self) -> &crate::agent::check::AgentCheck {
        &self.agent
    }
    fn agent_command(&self, resume: bool) -> String {
        HostState::agent_command(self, resume)
    }
    fn agent_options(&self) -> crate::agent::AgentOptions {
        HostState::agent_options(self)
    }
    fn agent_launch(
        &self,
        place: &crate::agent::sandbox::AgentPlace,
    ) -> crate::agent::sandbox::Launch {
        self.sandbox.launch(&self.config, place)
    }
}

impl crate::workspace::WatchHost for HostState {
    fn sessions(&self) -> &crate::sessions::Sessions {
        &self.sessions
    }
    fn workspaces(&self) -> &crate::workspace::Workspaces {
        &self.workspaces
    }
}

impl crate::driver::DriverHost for HostState {
    fn store(&self) -> &Store {
        &self.store
    }
    fn secrets(&self) -> &Secrets {
        &self.secrets
    }
    fn drivers(&self) -> &crate::driver::Drivers {
        &self.drivers
    }
    fn is_draining(&self) -> bool {
        HostState::is_draining(self)
    }
}
