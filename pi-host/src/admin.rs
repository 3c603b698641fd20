//! The local admin socket: a Unix socket (mode 0600, in the data dir) through which the
//! `pi-host pair|devices|revoke|status` commands talk to the running host. One JSON request
//! line, one JSON reply line: `{"ok": result}` or `{"error": AppError}`.

use crate::auth::Caller;
use crate::methods;
use crate::state::HostState;
use racp_proto::methods::host::{DeviceRevokeParams, PairingCreateParams};
use racp_proto::{AppError, Empty, EndpointCall, ErrorCode, HostCall, Role};
use racp_server::listener::DropOldest;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// Whether process `pid` runs with no new privileges, as everything in an agent's sandbox does
/// (the launcher sets it before the ruleset, and nothing can unset it). A kernel whose Landlock
/// cannot fence pathname UNIX sockets (before ABI 9) lets a sandboxed process connect to this
/// socket, which mints owner tokens: it is refused here instead.
fn sandboxed(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status
            .lines()
            .any(|line| line.starts_with("NoNewPrivs:") && line.trim_end().ends_with('1'))
    })
}

pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("admin.sock")
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", deny_unknown_fields)]
pub enum AdminRequest {
    #[serde(rename_all = "camelCase")]
    Pair {
        roles: Option<Vec<Role>>,
        ttl_seconds: u64,
    },
    Devices,
    #[serde(rename_all = "camelCase")]
    Revoke {
        device_id: String,
    },
    Status,
}

/// Binds the admin socket, replacing a stale one, readable and writable by the owner only.
pub fn bind(data_dir: &Path) -> std::io::Result<UnixListener> {
    let path = socket_path(data_dir);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Admin connections served at once; beyond it the oldest is dropped (racp-server/src/listener.rs
/// `DropOldest`), so the owner's command always gets in. The socket is the owner's alone (0600):
/// this is against a stray or stuck client rather than an attacker.
pub const MAX_ADMIN_CONNECTIONS: usize = 8;
/// For reading the request line, and again for writing the reply: a client that connects and
/// never sends (or never reads) is dropped.
const ADMIN_IO_DEADLINE: Duration = Duration::from_secs(5);

/// Accepts admin connections until the process ends. An accept error (out of descriptors)
/// waits and retries: the owner must be able to `revoke` once the pressure is gone.
pub async fn serve(listener: UnixListener, state: Arc<HostState>) {
    let open = DropOldest::new(MAX_ADMIN_CONNECTIONS);
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (mut slot, _) = open.admit();
                let state = state.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = handle(stream, state) => {}
                        _ = &mut slot.evicted => {
                            tracing::debug!("admin connection dropped to make room");
                        }
                    }
                });
            }
            Err(err) => {
                tracing::warn!(error = %err, "admin socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn handle(stream: UnixStream, state: Arc<HostState>) {
    let from_an_agent = stream
        .peer_cred()
        .ok()
        .and_then(|cred| cred.pid())
        .is_some_and(sandboxed);
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    // One request per connection, bounded so a stray client cannot make the host buffer much.
    let mut reader = BufReader::new(read).take(64 << 10);
    match tokio::time::timeout(ADMIN_IO_DEADLINE, reader.read_line(&mut line)).await {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => return,
        Err(_) => {
            tracing::debug!("admin client sent no request in time");
            return;
        }
    }
    let reply = match serde_json::from_str::<AdminRequest>(&line) {
        Ok(_) if from_an_agent => {
            tracing::warn!("refused an admin request from a process in an agent's sandbox");
            Err(AppError::new(
                ErrorCode::Forbidden,
                "the admin socket does not serve processes in an agent's sandbox: run pi-host's \
                 commands from your own shell",
            ))
        }
        Ok(request) => answer(state, request).await,
        Err(err) => Err(AppError::new(
            ErrorCode::InvalidArgument,
            format!("bad admin request: {err}"),
        )),
    };
    let body = match reply {
        Ok(value) => json!({"ok": value}),
        Err(error) => json!({"error": error}),
    };
    let mut text = body.to_string();
    text.push('\n');
    let _ = tokio::time::timeout(ADMIN_IO_DEADLINE, write.write_all(text.as_bytes())).await;
}

/// Each command is a RACP call answered by the handler a device's call reaches
/// (`methods::answer_endpoint`, `methods::answer_host`), as the host's owner; `status` adds what only the
/// running process knows. Typed calls, so a command without its method does not compile.
async fn answer(state: Arc<HostState>, request: AdminRequest) -> Result<Value, AppError> {
    let endpoint = |call| methods::answer_endpoint(state.clone(), Caller::Owner, call);
    let answered = match request {
        AdminRequest::Pair { roles, ttl_seconds } => {
            let roles = match roles {
                Some(roles) => roles,
                None => {
                    let host = state.clone();
                    tokio::task::spawn_blocking(move || methods::host::default_pairing_roles(&host))
                        .await
                        .unwrap_or_else(|e| Err(state.internal(e)))?
                }
            };
            let params = PairingCreateParams {
                roles,
                ttl_seconds: Some(ttl_seconds),
                hosts: None,
            };
            endpoint(EndpointCall::PairingCreate(params)).await?
        }
        AdminRequest::Devices => endpoint(EndpointCall::DeviceList(Empty {})).await?,
        AdminRequest::Revoke { device_id } => {
            endpoint(EndpointCall::DeviceRevoke(DeviceRevokeParams { device_id })).await?
        }
        AdminRequest::Status => {
            let info = HostCall::HostInfo(Empty {});
            let info = methods::answer_host(state.clone(), Caller::Owner, info).await?;
            let mut status = value_of(&state, &info)?;
            if let Some(fields) = status.as_object_mut() {
                fields.extend(process_facts(&state));
            }
            return Ok(status);
        }
    };
    value_of(&state, &answered)
}

fn value_of(state: &HostState, answered: &RawValue) -> Result<Value, AppError> {
    serde_json::from_str(answered.get()).map_err(|e| state.internal(e))
}

/// What `status` tells beside `host/info`: the running process and where it listens.
fn process_facts(state: &HostState) -> serde_json::Map<String, Value> {
    let config = &state.config;
    let scheme = if config.tls.is_some() { "wss" } else { "ws" };
    let facts = json!({
        "pid": std::process::id(),
        "listen": config.listen.to_string(),
        "url": format!("{scheme}://{}{}", config.listen, racp_proto::ENDPOINT_PATH),
        "certSha256": config.cert_sha256.map(|sha256| sha256.to_hex()),
        "dataDir": config.data_dir.display().to_string(),
        "connections": state.connections.count(),
        "draining": state.is_draining(),
    });
    match facts {
        Value::Object(fields) => fields,
        _ => serde_json::Map::new(),
    }
}

/// Client side: sends one request to a running host's admin socket.
pub async fn call(data_dir: &Path, request: &AdminRequest) -> Result<Value, AppError> {
    let path = socket_path(data_dir);
    let stream = UnixStream::connect(&path)
        .await
        .map_err(|err| AppError::new(ErrorCode::HostUnavailable, not_running(data_dir, &err)))?;
    let (read, mut write) = stream.into_split();
    let mut text = serde_json::to_string(request)
        .map_err(|e| AppError::new(ErrorCode::Internal, e.to_string()))?;
    text.push('\n');
    write
        .write_all(text.as_bytes())
        .await
        .map_err(|e| AppError::new(ErrorCode::HostUnavailable, e.to_string()))?;
    let mut line = String::new();
    BufReader::new(read)
        .read_line(&mut line)
        .await
        .map_err(|e| AppError::new(ErrorCode::HostUnavailable, e.to_string()))?;
    let reply: Value = serde_json::from_str(&line)
        .map_err(|e| AppError::new(ErrorCode::HostUnavailable, format!("bad admin reply: {e}")))?;
    if let Some(error) = reply.get("error") {
        return Err(serde_json::from_value(error.clone()).unwrap_or_else(|e| {
            AppError::new(ErrorCode::Internal, format!("unreadable admin error: {e}"))
        }));
    }
    Ok(reply.get("ok").cloned().unwrap_or(Value::Null))
}

/// Why no host answered at `data_dir`'s socket, and what to do that never starts a second host:
/// a connect-installed host is started by its install.sh (or the next `pi-remote connect`); a
/// host running with another data directory is named; only a host of nobody's is started by
/// hand (deploy/README.md, "The host's own CLI").
pub fn not_running(data_dir: &Path, err: &std::io::Error) -> String {
    let path = socket_path(data_dir);
    if let Some(root) = crate::config::install_root_with_data(data_dir) {
        let root = root.display();
        return format!(
            "the pi-host installed at {root} is not running ({}: {err}): `pi-remote connect` \
             from the desktop starts it, or here `sh {root}/install.sh start --root {root}`",
            path.display()
        );
    }
    let elsewhere = crate::config::other_data_dirs()
        .into_iter()
        .find(|dir| dir != data_dir && is_socket(&socket_path(dir)));
    match elsewhere {
        Some(dir) => format!(
            "no pi-host runs with data directory {} ({err}); one runs with {}: add \
             `--data-dir {}` or set PI_HOST_DATA_DIR",
            data_dir.display(),
            dir.display(),
            dir.display()
        ),
        None => format!(
            "no running pi-host at {}: {err}; start it with `pi-host serve`",
            path.display()
        ),
    }
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}
