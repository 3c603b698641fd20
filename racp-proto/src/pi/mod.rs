//! pi's RPC mode as data: the one place that names pi's event types and fields.
//!
//! - [`kind`]: the `type` of every line pi writes (`Kind`, one table).
//! - [`line`]: a stdout line read in one pass, the parts compaction cuts one level deeper.
//! - [`run`]: how a run ended (`agent_end`) and the retry and compaction signals.
//! - [`reply`]: responses, extension dialogs and notices, refusal wording, model references.
//! - [`command`]: the commands pi takes.
//! - [`compact`]: pi's stream updates rewritten to carry only what is new, and
//!   [`stream`]: the rule that rebuilds pi's state from them (docs/protocol.md §8.1).
//! - [`stats`]: a session's totals counted from the messages of its history.
//! - [`event`]: what a client reads of a relayed agent event (a text delta, a tool's run).
//! - [`message`]: pi's messages and a history entry as typed values (a transcript reads these).
//!
//! Its callers (the host's agent bridge, the snapshot, the clients' views) hold typed values
//! and never a pi string of their own.

pub mod command;
pub mod compact;
pub mod event;
mod kind;
pub mod line;
pub mod message;
pub mod reply;
pub mod run;
pub mod stats;
pub mod stream;

pub use command::{Command, UiAnswer};
pub use kind::Kind;
pub use line::{Line, LineError};
pub use reply::{Dialog, Response, UiMethod, UiRequest};
pub use run::{RunEnd, RunSignal, StopReason};
