//! The model catalogue `model/list` answers with, and that `session/create` and
//! `session/configure` check a model against: every model the host's agent knows, with whether
//! its provider has a credential, from pi's own model registry.
//!
//! pi's `get_available_models` lists only the models that already have a credential, so the
//! catalogue comes from a one-off agent started with `PI_HOST_CATALOGUE=1`, in which pi-host's
//! settings extension reports the whole registry (`agent/extensions/settings.ts`). It needs no
//! session and is kept until the host's settings change or [`FRESH_FOR`] passes (the remote
//! user may edit their own pi configuration meanwhile); one agent answers every caller waiting
//! at the same time.

use super::ModelHost;
use crate::agent::{Agent, AgentOutput, AgentSpec};
use racp_proto::methods::model::ModelListResult;
use racp_proto::{AppError, ErrorCode, ErrorSource};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long a catalogue is reused while the host's own settings stay the same.
pub const FRESH_FOR: Duration = Duration::from_secs(60);
/// How long the catalogue agent may take to load and report (pi loads in about 2 s; a loaded
/// machine takes longer).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);
/// After the agent answered its first command, how long its report may still take: pi's
/// extensions run before it answers, so a report that has not come by then never will.
const REPORT_GRACE: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct Catalogue {
    cached: tokio::sync::Mutex<Option<Cached>>,
}

struct Cached {
    generation: u64,
    at: Instant,
    list: Arc<ModelListResult>,
}

impl Catalogue {
    /// The catalogue last made, whatever its age; never asks an agent (one being asked is
    /// waited for).
    pub async fn last(&self) -> Option<Arc<ModelListResult>> {
        self.cached.lock().await.as_ref().map(|c| c.list.clone())
    }

    /// The catalogue, asking the agent when none is fresh (or `refresh`).
    pub async fn get(
        &self,
        host: &impl ModelHost,
        refresh: bool,
    ) -> Result<Arc<ModelListResult>, AppError> {
        let mut cached = self.cached.lock().await;
        let generation = host.models().generation();
        if let Some(entry) = cached.as_ref()
            && !refresh
            && entry.generation == generation
            && entry.at.elapsed() < FRESH_FOR
        {
            return Ok(entry.list.clone());
        }
        let list = Arc::new(ask_agent(host).await?);
        *cached = Some(Cached {
            generation,
            at: Instant::now(),
            list: list.clone(),
        });
        Ok(list)
    }
}

async fn ask_agent(host: &impl ModelHost) -> Result<ModelListResult, AppError> {
    let data_dir = &host.config().data_dir;
    // pi keeps a session file even for this; it goes with the agent.
    let scratch = data_dir
        .join("agent-sessions")
        .join(format!(".catalogue-{}", std::process::id()));
    racp_server::private_file::create_private_dir(&scratch).map_err(crate::internal)?;
    let spec = AgentSpec {
        command: host.agent_command(false),
        workspace: scratch.clone(),
        launch: Some(host.agent_launch(&crate::agent::sandbox::AgentPlace {
            workspace: scratch.clone(),
            own: vec![scratch.clone()],
            read_only: true,
            granted: Vec::new(),
            unconfined: false,
        })),
        env: vec![
            ("PI_HOST_CATALOGUE".into(), "1".into()),
            (
                "PI_CODING_AGENT_SESSION_DIR".into(),
                scratch.display().to_string(),
            ),
            ("TMPDIR".into(), scratch.display().to_string()),
        ],
    };
    let (agent, output) = host.agent().spawn(&spec, host.agent_options()).await?;
    let report = tokio::time::timeout(ANSWER_WITHIN, read_report(&agent, output)).await;
    agent.shutdown().await;
    let _ = std::fs::remove_dir_all(&scratch);
    match report {
        Ok(report) => report,
        Err(_) => Err(AppError::new(
            ErrorCode::Timeout,
            format!(
                "the host's agent did not list its models within {} s; try again",
                ANSWER_WITHIN.as_secs()
            ),
        )),
    }
}

/// Waits for the settings extension's report, sending `get_state` so pi starts (it says
/// nothing until it has a command).
async fn read_report(
    agent: &Agent,
    mut output: tokio::sync::mpsc::Receiver<AgentOutput>,
) -> Result<ModelListResult, AppError> {
    let asked = agent.clone();
    let mut answered = tokio::spawn(async move { asked.get_state().await });
    // Set once the agent answered: its report can then only be late by a little.
    let mut give_up_at: Option<Instant> = None;
    loop {
        let given_up = async {
            match give_up_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            next = output.recv() => match next {
                Some(AgentOutput::Exited { status, signal, .. }) => {
                    return Err(exited(status, signal));
                }
                None => return Err(exited(None, None)),
                Some(notice) => {
                    if let Some(list) = notice.notice_message().and_then(|m| parse(&m)) {
                        return Ok(list);
                    }
                }
            },
            result = &mut answered, if give_up_at.is_none() => {
                if let Ok(Err(err)) = result {
                    return Err(err.to_app_error());
                }
                give_up_at = Some(Instant::now() + REPORT_GRACE);
            }
            () = given_up => {
                return Err(AppError::new(
                    ErrorCode::CapabilityUnavailable,
                    "the host's agent does not list its models: model/list needs the pi agent \
                     with pi-host's extensions (pi-host serve --agent)",
                )
                .with_details(json!({"capability": "models"})));
            }
        }
    }
}

fn exited(status: Option<i32>, signal: Option<i32>) -> AppError {
    AppError::new(
        ErrorCode::AgentUnavailable,
        "the host's agent exited while it listed its models; check the agent command \
         (pi-host serve --agent) and the host's log",
    )
    .with_details(json!({"status": status, "signal": signal}))
    .with_source(ErrorSource::Agent)
}

/// The extension's report: `{"piHostCatalogue": ModelListResult}`.
fn parse(message: &str) -> Option<ModelListResult> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Report {
        pi_host_catalogue: ModelListResult,
    }
    let mut list = serde_json::from_str::<Report>(message)
        .ok()?
        .pi_host_catalogue;
    list.models
        .sort_by(|a, b| (&a.provider, &a.id).cmp(&(&b.provider, &b.id)));
    list.providers.sort_by(|a, b| a.provider.cmp(&b.provider));
    Some(list)
}
