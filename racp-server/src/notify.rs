//! systemd's readiness protocol (`sd_notify(3)`, docs/reliability.md, "Metrics and health"):
//! a unit of `Type=notify` is started only once the server sends `READY=1` to the datagram
//! socket named in `NOTIFY_SOCKET`, which it does when it listens and `/readyz`'s checks pass
//! ([`ready_when_checks_pass`]); meanwhile `STATUS=` names the failing checks, and `STOPPING=1`
//! says a drain began. Without `NOTIFY_SOCKET` nothing is sent. A few lines over a unix
//! datagram, so no libsystemd; `@name` is an abstract socket, as systemd may pass.
//!
//! Children must not inherit the variable (an agent that sends `READY=1` or `STOPPING=1` would
//! speak for the server; `NotifyAccess=main` makes systemd ignore them, but the socket is not
//! theirs): every child process the server starts removes [`ENV`].

use crate::metrics::{Check, Observed};
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

/// The variable systemd names its socket in.
pub const ENV: &str = "NOTIFY_SOCKET";

/// How often the checks are run again while one fails (systemd waits for `READY=1` up to the
/// unit's `TimeoutStartSec`).
const RECHECK: Duration = Duration::from_millis(500);

/// Where the server's state goes: the socket `NOTIFY_SOCKET` named when the server started.
#[derive(Clone, Debug)]
pub struct Notifier {
    addr: SocketAddr,
}

impl Notifier {
    /// The socket the environment names; `None` without one (not started by systemd), or
    /// with one that is not a path or an abstract name (logged).
    pub fn from_env() -> Option<Notifier> {
        let named = std::env::var_os(ENV)?;
        match address(named.as_encoded_bytes()) {
            Ok(addr) => Some(Notifier { addr }),
            Err(error) => {
                tracing::warn!(%error, "NOTIFY_SOCKET names no usable socket; systemd is not told the server's state");
                None
            }
        }
    }

    /// Sends one state message (`READY=1`, `STATUS=…`, `STOPPING=1`, newline-separated). A
    /// failure is logged, not fatal: the server serves whether or not systemd hears it.
    pub fn send(&self, state: &str) {
        let sent = UnixDatagram::unbound()
            .and_then(|socket| socket.send_to_addr(state.as_bytes(), &self.addr));
        if let Err(error) = sent {
            tracing::warn!(%error, "cannot tell systemd the server's state");
        }
    }

    /// `STOPPING=1`: the server drains.
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=draining");
    }
}

/// A server's readiness as systemd hears it, from its listening to its drain; `None` from
/// [`Readiness::start`] when systemd did not start it.
pub struct Readiness {
    notifier: Notifier,
    checking: tokio::task::JoinHandle<()>,
}

impl Readiness {
    /// Once the server listens: checks `observed` (what `/readyz` runs) on a task of its own
    /// until `READY=1` can be sent ([`ready_when_checks_pass`]).
    pub fn start(observed: Arc<dyn Observed>) -> Option<Readiness> {
        let notifier = Notifier::from_env()?;
        let checking = tokio::spawn(ready_when_checks_pass(notifier.clone(), observed));
        Some(Readiness { notifier, checking })
    }

    /// The drain began: no more checks, and `STOPPING=1`.
    pub fn stopping(self) {
        self.checking.abort();
        self.notifier.stopping();
    }
}

/// A socket address from `NOTIFY_SOCKET`: an absolute path, or `@name` for an abstract one.
fn address(named: &[u8]) -> std::io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    match named.first() {
        Some(b'@') => SocketAddr::from_abstract_name(&named[1..]),
        Some(b'/') => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(named)),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "neither an absolute path nor an abstract name (@…)",
        )),
    }
}

/// Runs `observed`'s checks (those `/readyz` runs) until they all pass, then sends `READY=1`;
/// while one fails, `STATUS=` names the failing checks and why (sent again when that changes).
/// Call it once the server listens.
pub async fn ready_when_checks_pass(notifier: Notifier, observed: Arc<dyn Observed>) {
    let mut told = String::new();
    loop {
        let checks = observed.checks().await;
        let Some(status) = not_ready(&checks) else {
            notifier.send("READY=1\nSTATUS=ready");
            tracing::info!("told systemd the server is ready");
            return;
        };
        if status != told {
            notifier.send(&format!("STATUS={status}"));
            told = status;
        }
        tokio::time::sleep(RECHECK).await;
    }
}

/// What `STATUS=` says while a check fails: each failing check's name and reason; `None` when
/// every check passes.
fn not_ready(checks: &[Check]) -> Option<String> {
    let failing: Vec<String> = checks
        .iter()
        .filter_map(|(name, result)| result.as_ref().err().map(|why| format!("{name}: {why}")))
        .collect();
    if failing.is_empty() {
        return None;
    }
    // One line: a newline would start another state assignment.
    let status = format!("not ready: {}", failing.join("; "));
    Some(status.replace(['\n', '\r'], " "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_names_only_the_failing_checks() {
        let checks: Vec<Check> = vec![
            ("store", Err("the store refuses a write\nread-only".into())),
            ("agent", Ok(())),
            ("nats", Err("down".into())),
        ];
        assert_eq!(
            not_ready(&checks).as_deref(),
            Some("not ready: store: the store refuses a write read-only; nats: down")
        );
        assert_eq!(not_ready(&[("agent", Ok(()))]), None);
    }

    #[test]
    fn a_socket_is_a_path_or_an_abstract_name() {
        assert!(address(b"/run/user/1000/systemd/notify").is_ok());
        let abstract_name = address(b"@/org/freedesktop/systemd1/notify").unwrap();
        use std::os::linux::net::SocketAddrExt;
        assert_eq!(
            abstract_name.as_abstract_name(),
            Some(&b"/org/freedesktop/systemd1/notify"[..])
        );
        assert!(address(b"relative/path").is_err());
        assert!(address(b"").is_err());
    }

    #[test]
    fn a_state_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("racp-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        let notifier = Notifier {
            addr: address(format!("@{name}").as_bytes()).unwrap(),
        };
        notifier.stopping();
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1\nSTATUS=draining");
    }
}
