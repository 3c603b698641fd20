//! The bootstrap's stages and the progress it reports (a progress display or `--json` lines).

use racp_proto::AppError;
use serde_json::{Value, json};

/// Each stage is also the `details.reason` of HOST_BOOTSTRAP_FAILED when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Resolve,
    Connect,
    HostKey,
    Authenticate,
    Probe,
    Bundle,
    Transfer,
    Verify,
    Agent,
    Install,
    Start,
    Forward,
    Pair,
    Handshake,
}

impl Stage {
    pub const ALL: [Stage; 14] = [
        Stage::Resolve,
        Stage::Connect,
        Stage::HostKey,
        Stage::Authenticate,
        Stage::Probe,
        Stage::Bundle,
        Stage::Transfer,
        Stage::Verify,
        Stage::Agent,
        Stage::Install,
        Stage::Start,
        Stage::Forward,
        Stage::Pair,
        Stage::Handshake,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Resolve => "resolve",
            Stage::Connect => "connect",
            Stage::HostKey => "host_key",
            Stage::Authenticate => "authenticate",
            Stage::Probe => "probe",
            Stage::Bundle => "bundle",
            Stage::Transfer => "transfer",
            Stage::Verify => "verify",
            Stage::Agent => "agent",
            Stage::Install => "install",
            Stage::Start => "start",
            Stage::Forward => "forward",
            Stage::Pair => "pair",
            Stage::Handshake => "handshake",
        }
    }

    /// What the stage does, for the progress display.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Resolve => "reading the SSH config",
            Stage::Connect => "connecting",
            Stage::HostKey => "checking the host key",
            Stage::Authenticate => "authenticating",
            Stage::Probe => "looking at the remote",
            Stage::Bundle => "making the agent bundle (pi and its dependencies, Node when needed)",
            Stage::Transfer => "uploading",
            Stage::Verify => "verifying the upload (SHA-256)",
            Stage::Agent => "installing the agent (pi)",
            Stage::Install => "installing",
            Stage::Start => "starting pi-host",
            Stage::Forward => "forwarding a local port",
            Stage::Pair => "pairing this device",
            Stage::Handshake => "saying hello",
        }
    }
}

/// Something worth telling the user while connecting or staying connected.
#[derive(Debug, Clone)]
pub enum Progress {
    Started(Stage),
    Done {
        stage: Stage,
        ms: u64,
        note: Option<String>,
    },
    Skipped {
        stage: Stage,
        why: String,
    },
    /// Bytes of a stage's work done (the upload's bytes sent, the bundle's bytes written).
    Bytes {
        stage: Stage,
        done: u64,
        total: u64,
    },
    /// A line worth reading about the running stage: what it fetches, sends or falls back to.
    Note {
        stage: Stage,
        text: String,
    },
    Ready(Value),
    /// The SSH link dropped; the forward stays open while it reconnects.
    Reconnecting {
        attempt: u32,
        delay_ms: u64,
        error: AppError,
    },
    Reconnected {
        remote_port: u16,
        ms: u64,
    },
    Failed(AppError),
}

impl Progress {
    /// The `--json` line.
    pub fn to_json(&self) -> Value {
        match self {
            Progress::Started(stage) => {
                json!({"type": "stage", "stage": stage.as_str(), "status": "started"})
            }
            Progress::Done { stage, ms, note } => {
                json!({"type": "stage", "stage": stage.as_str(), "status": "done", "ms": ms, "note": note})
            }
            Progress::Skipped { stage, why } => {
                json!({"type": "stage", "stage": stage.as_str(), "status": "skipped", "why": why})
            }
            Progress::Bytes { stage, done, total } => {
                json!({"type": "progress", "stage": stage.as_str(), "bytes": done, "total": total})
            }
            Progress::Note { stage, text } => {
                json!({"type": "note", "stage": stage.as_str(), "text": text})
            }
            Progress::Ready(ready) => {
                let mut line = json!({"type": "ready"});
                if let (Some(line), Some(ready)) = (line.as_object_mut(), ready.as_object()) {
                    line.extend(ready.clone());
                }
                line
            }
            Progress::Reconnecting {
                attempt,
                delay_ms,
                error,
            } => {
                json!({"type": "reconnecting", "attempt": attempt, "delayMs": delay_ms, "error": error})
            }
            Progress::Reconnected { remote_port, ms } => {
                json!({"type": "reconnected", "remotePort": remote_port, "ms": ms})
            }
            Progress::Failed(error) => json!({"type": "error", "error": error}),
        }
    }
}

/// Receives progress; called from the bootstrap's tasks.
pub trait Reporter: Send + Sync {
    fn report(&self, progress: Progress);
}

/// Reports nothing.
pub struct Silent;

impl Reporter for Silent {
    fn report(&self, _: Progress) {}
}
