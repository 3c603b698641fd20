//! Fault injection for tests, compiled into debug builds only: each hook holds open a moment
//! that is otherwise too short for a test to land in, so the tests act inside it instead of
//! hoping to hit it (docs/reliability.md §8).

use std::time::Duration;

/// `PI_HOST_TEST_ADMISSION_DELAY_MS`: between an upgrade's checks and its `101`, before the
/// connection is registered, where a revoke or drain used to be missed.
pub async fn after_admission() {
    hold("PI_HOST_TEST_ADMISSION_DELAY_MS").await;
}

/// `PI_HOST_TEST_DRAIN_DELAY_MS`: between the drain's flag and its kill of the open
/// connections, where only the flag refuses a call or a connection's start.
pub async fn before_drain_kill() {
    hold("PI_HOST_TEST_DRAIN_DELAY_MS").await;
}

/// `PI_HOST_TEST_EXIT_DELAY_MS`: between an agent's exit and the pump's reading of it, where
/// a stop (`session/close`, the drain) that took the agent out ends its turn itself.
pub async fn before_exit_is_read() {
    hold("PI_HOST_TEST_EXIT_DELAY_MS").await;
}

/// `PI_HOST_TEST_SETTLE_DELAY_MS`: between an approval's settling and its `approval.settled`
/// commit, while an agent told of the answer too early would already act on it.
pub async fn before_settle_is_recorded() {
    hold("PI_HOST_TEST_SETTLE_DELAY_MS").await;
}

/// `PI_HOST_TEST_WATCH_DELAY_MS`: before a workspace watcher's task reads the kernel's queue,
/// as on a runtime too busy to run it: a turn that ends meanwhile reads the queue itself.
pub async fn before_watch_read() {
    hold("PI_HOST_TEST_WATCH_DELAY_MS").await;
}

/// `PI_HOST_TEST_EXPIRY_DELAY_MS`: between an approval's deadline and its timer's expiry, as
/// on a busy runtime: an answer that arrives meanwhile must still find the deadline passed.
pub async fn before_expiry() {
    hold("PI_HOST_TEST_EXPIRY_DELAY_MS").await;
}

async fn hold(variable: &str) {
    let delay = std::env::var(variable)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis);
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
}
