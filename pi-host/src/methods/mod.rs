//! The host's methods, one file per group of racp-proto's method table (`racp-proto/src/methods`):
//! [`handshake`], [`host`], [`fs`], [`session`], [`turn`], [`model`], [`workspace`]. [`answer_endpoint`] and [`answer_host`]
//! are one exhaustive match each over the table's places, every arm naming the file and function
//! that answers it; the table's `run` column says how the answer runs (docs/architecture.md,
//! "Entry points").

pub mod fs;
pub mod handshake;
pub mod host;
pub mod model;
pub mod session;
pub mod turn;
pub mod workspace;

use crate::auth::Caller;
use crate::state::HostState;
use racp_proto::{AppError, Call, EndpointCall, ErrorCode, HostCall, Method, Run};
use racp_server::connection::Answer;
use racp_server::wire::to_raw;
use serde::Serialize;
use serde_json::value::RawValue;
use std::future::Future;
use std::sync::Arc;

/// The checks a call passes before it is answered, whichever way it came (a device's
/// WebSocket connection, or a call a gateway routed over NATS): racp-server's admit policy with
/// the host's rate buckets (`rate_key`: `None` for a call that pays none) and drain.
pub fn admit(
    state: &HostState,
    caller: &Caller,
    method: racp_proto::Method,
    params: Option<&serde_json::value::RawValue>,
    rate_key: Option<&str>,
) -> Result<Call, AppError> {
    let draining = state.is_draining().then(|| {
        AppError::new(
            ErrorCode::HostShuttingDown,
            "the host is shutting down; the call was not started",
        )
    });
    let rate = rate_key.map(|key| (&state.rate, key));
    racp_server::admission::admit(&caller.principal(), method, params, rate, draining)
}

/// The calls a host answers as the server the client reached (a gateway answers them for its
/// devices itself).
pub fn answer_endpoint(state: Arc<HostState>, caller: Caller, call: EndpointCall) -> Answer {
    let method = call.method();
    let handler = match call {
        EndpointCall::Pair(p) => blocking(move |s| handshake::pair(s, &caller, p)),
        EndpointCall::HostList(p) => blocking(move |s| host::list(s, p)),
        EndpointCall::DeviceList(p) => blocking(move |s| host::device_list(s, &caller, p)),
        EndpointCall::PairingCreate(p) => blocking(move |s| host::pairing_create(s, p)),
        EndpointCall::DeviceRevoke(p) => task(host::device_revoke(state.clone(), p)),
    };
    run(state, method, handler)
}

/// The host's own calls, from a device's connection or routed by a gateway. Longer than 60
/// lines by design: one line per row of the method table's host place.
pub fn answer_host(state: Arc<HostState>, caller: Caller, call: HostCall) -> Answer {
    let method = call.method();
    let s = state.clone();
    let handler = match call {
        HostCall::HostInfo(p) => task(host::info(s, p)),
        HostCall::FsList(p) => blocking(move |s| fs::list(s, p)),
        HostCall::FsStat(p) => blocking(move |s| fs::stat(s, p)),
        HostCall::FsRead(p) => blocking_raw(move |s| fs::read(s, p)),
        HostCall::WorkspaceStatus(p) => task(workspace::status(s, p)),
        HostCall::WorkspaceDiff(p) => task(workspace::diff(s, p)),
        HostCall::SessionCreate(p) => task(session::create(s, p)),
        HostCall::SessionList(p) => blocking(move |s| session::list(s, p)),
        HostCall::SessionGet(p) => blocking_raw(move |s| session::get(s, p)),
        HostCall::SessionStream(p) => blocking(move |s| session::stream(s, p)),
        HostCall::SessionHistory(p) => blocking_raw(move |s| session::history(s, p)),
        HostCall::SessionRename(p) => task(session::rename(s, caller, p)),
        HostCall::SessionClose(p) => task(session::close(s, caller, p)),
        HostCall::SessionConfigure(p) => task(session::configure(s, caller, p)),
        HostCall::SessionClearQueue(p) => task(session::clear_queue(s, caller, p)),
        HostCall::SessionCompact(p) => task(session::compact(s, p)),
        HostCall::SessionFork(p) => task(session::fork(s, caller, p)),
        HostCall::SessionClone(p) => task(session::clone(s, caller, p)),
        HostCall::SessionBash(p) => task(session::bash(s, caller, p)),
        HostCall::SessionBashAbort(p) => task(session::bash_abort(s, p)),
        HostCall::SessionStats(p) => task(session::stats(s, p)),
        HostCall::SessionCommands(p) => task(session::commands(s, caller, p)),
        HostCall::SessionExport(p) => task(session::export(s, caller, p)),
        HostCall::TurnStart(p) => task(turn::start(s, caller, p)),
        HostCall::TurnSteer(p) => task(turn::steer(s, p)),
        HostCall::TurnFollowUp(p) => task(turn::follow_up(s, caller, p)),
        HostCall::TurnAbort(p) => task(turn::abort(s, caller, p)),
        HostCall::ApprovalRespond(p) => task(turn::approval_respond(s, caller, p)),
        HostCall::ModelList(_) => task_raw(model::list(s, caller)),
        HostCall::CredentialSet(p) => blocking(move |s| model::credential_set(s, p)),
        HostCall::CredentialDelete(p) => blocking(move |s| model::credential_delete(s, p)),
        HostCall::CredentialList(_) => blocking(model::credential_list),
        HostCall::ProviderSet(p) => blocking(move |s| model::provider_set(s, p)),
        HostCall::ProviderDelete(p) => blocking(move |s| model::provider_delete(s, p)),
    };
    run(state, method, handler)
}

/// A method's answer before it runs: a synchronous handler (SQLite, the file system) or an
/// async one (it waits on an agent, another call, a timer).
enum Handler {
    Blocking(SyncHandler),
    Task(Answer),
}

/// A synchronous handler with its result written.
type SyncHandler = Box<dyn FnOnce(&HostState) -> Result<Box<RawValue>, AppError> + Send>;

/// A synchronous handler, its result written on the blocking pool too.
fn blocking<T: Serialize>(
    handler: impl FnOnce(&HostState) -> Result<T, AppError> + Send + 'static,
) -> Handler {
    Handler::Blocking(Box::new(move |state| to_raw(&handler(state)?)))
}

/// The same for a handler that writes its result itself (one that charges what it builds to
/// the host's byte budget until the result is written: `session/history`, `session/get`).
fn blocking_raw(
    handler: impl FnOnce(&HostState) -> Result<Box<RawValue>, AppError> + Send + 'static,
) -> Handler {
    Handler::Blocking(Box::new(handler))
}

/// An async handler whose result is the reply.
fn task<T: Serialize>(
    handler: impl Future<Output = Result<T, AppError>> + Send + 'static,
) -> Handler {
    Handler::Task(Box::pin(async move { to_raw(&handler.await?) }))
}

/// The same for one that writes its result itself.
fn task_raw(
    handler: impl Future<Output = Result<Box<RawValue>, AppError>> + Send + 'static,
) -> Handler {
    Handler::Task(Box::pin(handler))
}

/// Runs a handler as the method table's `run` column says: a synchronous one on the blocking
/// pool, not on a runtime thread that serves other connections meanwhile. A handler of the
/// other kind than its row is a bug of this file, answered INTERNAL rather than run wrongly.
fn run(state: Arc<HostState>, method: Method, handler: Handler) -> Answer {
    match (method.spec().run, handler) {
        (Run::Blocking, Handler::Blocking(handler)) => {
            Box::pin(async move { on_blocking_pool(&state, handler).await })
        }
        (Run::Task, Handler::Task(answer)) => answer,
        (run, _) => {
            let error = state.internal(format!(
                "{} runs as {run:?} by the method table, but its handler is not one",
                method.as_str()
            ));
            Box::pin(std::future::ready(Err(error)))
        }
    }
}

async fn on_blocking_pool<T: Send + 'static>(
    state: &Arc<HostState>,
    handler: impl FnOnce(&HostState) -> Result<T, AppError> + Send + 'static,
) -> Result<T, AppError> {
    let host = state.clone();
    tokio::task::spawn_blocking(racp_server::trace::blocking(move || handler(&host)))
        .await
        .unwrap_or_else(|e| Err(state.internal(e)))
}
