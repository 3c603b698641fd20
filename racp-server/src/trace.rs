//! A call's trace id as a server carries it (docs/protocol.md §3.3): the client's, or one made
//! here at the first hop; held for the call's future (`scope`) so every log line about the
//! call names it (a `call` span with `trace_id`), an INTERNAL logged deep inside the call
//! carries it (`failure.rs`), a gateway passes it to the host in the routed call's header, and
//! every error reply to the call carries it back (`stamp`).

use racp_proto::AppError;
use racp_proto::trace::TraceId;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::Instrument;

tokio::task_local! {
    static CURRENT: TraceId;
}

std::thread_local! {
    /// The trace id of the call a blocking-pool thread works for ([`blocking`]).
    static BLOCKING: std::cell::RefCell<Option<TraceId>> = const { std::cell::RefCell::new(None) };
}

/// A new trace id: 8 random bytes made once per process, then a counter, so ids are unique
/// without a system call per call.
pub fn mint() -> TraceId {
    static PREFIX: OnceLock<[u8; 8]> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = PREFIX.get_or_init(|| {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 8];
        if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
            // Without randomness, the clock still tells processes apart in a log.
            bytes = crate::clock::now_ms().to_be_bytes();
        }
        bytes
    });
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(prefix);
    bytes[8..].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    TraceId::from_bytes(bytes)
}

/// The trace id of the call being answered on this task (or by this blocking work), if any.
pub fn current() -> Option<TraceId> {
    CURRENT
        .try_with(Clone::clone)
        .ok()
        .or_else(|| BLOCKING.with(|held| held.borrow().clone()))
}

/// `work` for `spawn_blocking`, run in the calling call's span with its trace id at hand, so
/// an INTERNAL made on the blocking pool carries the call's id too.
pub fn blocking<R>(work: impl FnOnce() -> R) -> impl FnOnce() -> R {
    let span = tracing::Span::current();
    let trace_id = current();
    move || {
        let _entered = span.enter();
        let _held = Held(BLOCKING.with(|held| held.replace(trace_id)));
        work()
    }
}

/// Gives the thread back its previous trace id when the work ends, even by a panic.
struct Held(Option<TraceId>);

impl Drop for Held {
    fn drop(&mut self) {
        let previous = self.0.take();
        BLOCKING.with(|held| *held.borrow_mut() = previous);
    }
}

/// `call` run as the call traced by `trace_id`: within a `call` span naming it and the
/// method, with the id at hand for [`current`].
pub fn scope<F: Future>(
    trace_id: TraceId,
    method: &'static str,
    call: F,
) -> impl Future<Output = F::Output> {
    let span = tracing::info_span!("call", trace_id = %trace_id, method);
    CURRENT.scope(trace_id, call.instrument(span))
}

/// `task` carried onto a task of its own from within a call's [`scope`]: the same span and
/// trace id (a new span here would nest in the call's). Outside a call, `task` as it is.
pub fn carried<F: Future>(task: F) -> impl Future<Output = F::Output> {
    let span = tracing::Span::current();
    let trace_id = current().unwrap_or_else(mint);
    CURRENT.scope(trace_id, task.instrument(span))
}

/// An error replying to the call traced by `trace_id` carries that id. One made with an id
/// of its own (an INTERNAL logged outside the call's task) is logged with both, so the call's
/// id still finds the cause.
pub fn stamp(error: AppError, trace_id: &TraceId) -> AppError {
    match error.trace_id() {
        Some(own) if own == trace_id.as_str() => error,
        Some(own) => {
            tracing::info!(%trace_id, cause_trace_id = own, code = %error.code(), "error of a call");
            error.with_trace_id(trace_id.as_str())
        }
        None => error.with_trace_id(trace_id.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use racp_proto::Method;

    #[tokio::test]
    async fn a_call_sees_its_trace_id_and_errors_carry_it() {
        let a = mint();
        let b = mint();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(current().is_none());
        let seen = scope(a.clone(), Method::SessionList.as_str(), async { current() }).await;
        assert_eq!(seen, Some(a.clone()));
        let internal = scope(a.clone(), Method::SessionList.as_str(), async {
            crate::failure::internal("host", "broken")
        })
        .await;
        assert_eq!(internal.trace_id(), Some(a.as_str()));
        let on_pool = scope(a.clone(), Method::SessionList.as_str(), async {
            tokio::task::spawn_blocking(blocking(|| crate::failure::internal("host", "x")))
                .await
                .unwrap()
        })
        .await;
        assert_eq!(on_pool.trace_id(), Some(a.as_str()));
        assert!(current().is_none());
        let other = AppError::new(racp_proto::ErrorCode::Internal, "x").with_trace_id("t1");
        assert_eq!(stamp(other, &a).trace_id(), Some(a.as_str()));
    }
}
