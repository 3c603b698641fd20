//! One RACP-WS connection, run the same way by a host and a gateway (docs/architecture.md,
//! "racp-server"): the checks at its start, `hello` first, the frame bound, admission, the
//! device's gate, the in-flight bounds, calls on tasks of their own, heartbeats, the send
//! stall, the kill, and the connection error it ends with. What differs between the two (who
//! answers a call, where a subscription's events come from) is the server's [`Service`].

use crate::budget::{ByteBudget, Charge};
use crate::connections::{CallPass, Connections, DeviceGate, Registration, Slot};
use crate::hello::Agreed;
use crate::metrics::{CoreMetrics, Metrics};
use crate::socket::{FINAL_FRAME_GRACE, Socket, close_with, error_reply, send_all};
use crate::trace::stamp;
use crate::wire::encode;
use futures_util::StreamExt;
use racp_proto::codec::{IncomingRequest, Rejected, decode_request};
use racp_proto::elide::fit_reply;
use racp_proto::events::SubscriptionHead;
use racp_proto::frame::{ErrorReply, RequestId};
use racp_proto::limits::PRE_HELLO_MAX_FRAME_BYTES;
use racp_proto::methods::handshake::{HelloParams, HelloResult};
use racp_proto::trace::TraceId;
use racp_proto::{
    AppError, Call, CoreCall, EndpointCall, ErrorCode, HostCall, Method, Placed, SubscriptionCall,
};
use serde_json::json;
use serde_json::value::RawValue;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio_tungstenite::tungstenite::Message;

/// Replies produced by request tasks, waiting for the socket.
const REPLY_QUEUE: usize = 256;

/// A call's result, computed on a task of its own: the result's JSON, written once.
pub type Answer = Pin<Box<dyn Future<Output = Result<Box<RawValue>, AppError>> + Send>>;

/// A call answered on the connection's loop, before it reads on: it changes the connection's
/// own state (its subscriptions).
pub type Here<'a> = Pin<Box<dyn Future<Output = Result<Box<RawValue>, AppError>> + Send + 'a>>;

/// A server's bounds for its connections.
#[derive(Debug, Clone)]
pub struct Settings {
    /// "host" or "gateway", for what `hello` says to a client that speaks another version.
    pub server: &'static str,
    pub max_frame_bytes: u32,
    pub max_events_per_frame: usize,
    pub max_in_flight: u32,
    /// The bound over all of a server's connections and the calls it answers for a gateway
    /// (a host's), with its size for HOST_OVERLOADED's details.
    pub server_in_flight: Option<(Arc<Semaphore>, u32)>,
    pub heartbeat: Duration,
    /// A socket write blocked this long means the client stopped reading: CLIENT_TOO_SLOW.
    pub send_stall: Duration,
    /// The server's bound on bytes held for clients: requests being read, replies waiting for
    /// their socket (budget.rs).
    pub budget: ByteBudget,
    /// The core's counters (metrics.rs), exported by the server on its operator's listener.
    pub metrics: Metrics,
}

/// Why a call was not admitted.
pub enum Refusal {
    /// The call is refused; the connection lives on.
    Call(AppError),
    /// The caller may call nothing more (its device was revoked): the reply, then the
    /// connection ends with the same error.
    Connection(AppError),
}

impl From<AppError> for Refusal {
    fn from(error: AppError) -> Self {
        Refusal::Call(error)
    }
}

/// What wakes a connection to send pushes for its subscriptions.
pub trait Pushes: Send + 'static {
    type Signal: Send;
    /// The next wake-up; `None` when no more can come.
    fn next(&mut self) -> impl Future<Output = Option<Self::Signal>> + Send;
}

/// A host's subscriptions pull from the sessions' logs when their producer wakes them.
impl Pushes for Arc<Notify> {
    type Signal = ();
    async fn next(&mut self) -> Option<()> {
        self.notified().await;
        Some(())
    }
}

/// A gateway's subscription tasks queue what they read from the host's stream.
impl<T: Send + 'static> Pushes for mpsc::Receiver<T> {
    type Signal = T;
    async fn next(&mut self) -> Option<T> {
        self.recv().await
    }
}

/// What a server provides to the connection core: every place of the method table it serves
/// (docs/protocol.md §4) and its subscriptions' events.
pub trait Service: Send + 'static {
    type Pushes: Pushes;

    /// The error the connection ends with before it reads anything (the server is draining,
    /// the device was revoked meanwhile), checked after it is registered.
    fn refused_at_start(&self) -> Option<AppError>;

    /// Work once the connection is open and not refused.
    fn opened(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Every check between a decoded envelope and its handling once `hello` was said: access,
    /// rate, drain, then the params read as the method's type.
    fn admit(&mut self, method: Method, params: Option<&RawValue>) -> Result<Call, Refusal>;

    /// `hello`'s result for the bounds agreed with the client.
    fn hello(&mut self, agreed: Agreed) -> HelloResult;

    fn subscription(&mut self, call: SubscriptionCall) -> Here<'_>;

    fn endpoint(&mut self, call: EndpointCall) -> Answer;

    /// A host call; `params` as the client sent them, for a server that passes them on.
    fn host(&mut self, call: HostCall, params: Option<&RawValue>) -> Answer;

    /// Every subscription's last delivered cursor (heartbeats, CLIENT_TOO_SLOW).
    fn heads(&self) -> Vec<SubscriptionHead>;

    /// The frames one wake-up has to send, and the error to end with after them.
    fn pushes(
        &mut self,
        signal: <Self::Pushes as Pushes>::Signal,
        max_frame_bytes: usize,
    ) -> (Vec<String>, Option<AppError>);
}

/// Serves one upgraded socket until the client leaves or the connection ends with an error;
/// `connections` is the server's table, in which `slot` was taken at the upgrade.
pub async fn run<S: Service>(
    mut socket: Socket,
    connections: &Connections,
    slot: Slot,
    device_id: Option<String>,
    settings: Settings,
    service: S,
    pushes: S::Pushes,
) {
    let Registration {
        id: connection_id,
        kill: mut kill_rx,
        gate,
        slot: _slot,
    } = connections.register(slot, device_id.clone());
    tracing::debug!(connection_id, device_id = ?device_id, "connection opened");
    let metrics = settings.metrics.clone();
    let _open = metrics.opened(device_id.is_some());
    let mut conn = Connection::new(settings, service, gate);
    let mut ending = conn.ending_at_start(&mut kill_rx);
    if ending.is_none() {
        conn.service.opened().await;
        ending = conn.serve(&mut socket, &mut kill_rx, pushes).await;
    }
    // Tells a waiting revoke that this connection sends nothing more but its final error.
    drop(kill_rx);
    if let Some(error) = ending {
        metrics.error_sent(error.code());
        tracing::info!(
            code = %error.code(),
            message = error.message(),
            connection_id,
            "ending a connection"
        );
        // A client that stopped reading takes the final error only once it reads again (the
        // frame waits behind what fills its socket buffers); give it a while, then drop it.
        let _ = tokio::time::timeout(FINAL_FRAME_GRACE, close_with(&mut socket, error)).await;
    }
    drop(conn);
    connections.unregister(connection_id);
}

/// A call a gateway routed to this server (docs/architecture.md, "Entry points"): through the
/// same door as a call on a connection, once: the service's admit (access, rate, drain, the
/// params read once as the method's type), the host's place only (a gateway answers every
/// other place itself), the server's in-flight bound, then the service's answer.
pub async fn answer_routed<S: Service>(
    service: S,
    method: Method,
    params: &RawValue,
    server_in_flight: Option<&(Arc<Semaphore>, u32)>,
    metrics: &CoreMetrics,
) -> Result<Box<RawValue>, AppError> {
    let started = Instant::now();
    let answer = routed(service, method, params, server_in_flight).await;
    finished(metrics, method, &answer, started);
    // Within the routed call's trace scope (the router's id), its error carries that id.
    match crate::trace::current() {
        Some(trace_id) => traced(answer, &trace_id),
        None => answer,
    }
}

async fn routed<S: Service>(
    mut service: S,
    method: Method,
    params: &RawValue,
    server_in_flight: Option<&(Arc<Semaphore>, u32)>,
) -> Result<Box<RawValue>, AppError> {
    let call = match service.admit(method, Some(params)) {
        Ok(call) => call,
        Err(Refusal::Call(error) | Refusal::Connection(error)) => return Err(error),
    };
    let Placed::Host(call) = call.place() else {
        return Err(AppError::new(
            ErrorCode::MethodNotFound,
            format!(
                "{} is answered by the gateway, not routed to a host",
                method.as_str()
            ),
        )
        .with_details(json!({"method": method.as_str()})));
    };
    let _permit = server_permit(server_in_flight)
        .map_err(|max| overloaded(json!({"maxInFlightHost": max})))?;
    service.host(call, Some(params)).await
}

/// A place under the server's in-flight bound (none when it has none), or the bound's size.
fn server_permit(
    bound: Option<&(Arc<Semaphore>, u32)>,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, u32> {
    let Some((semaphore, max)) = bound else {
        return Ok(None);
    };
    semaphore
        .clone()
        .try_acquire_owned()
        .map(Some)
        .map_err(|_| *max)
}

/// HOST_OVERLOADED for a call beyond the in-flight bounds `details` names.
pub fn overloaded(details: serde_json::Value) -> AppError {
    AppError::new(ErrorCode::HostOverloaded, "too many calls in flight")
        .with_details(details)
        .with_retry_after_ms(50)
}

pub fn revoked() -> AppError {
    AppError::new(ErrorCode::RemoteAuthFailed, "this device was revoked")
}

struct Connection<S> {
    settings: Settings,
    service: S,
    /// The device's gate: every call but a revoke holds a pass from it while it runs (None on
    /// a pairing connection).
    gate: Option<Arc<DeviceGate>>,
    /// Frame bound in bytes: 64 KiB before `hello`, then the agreed bound.
    max_frame_bytes: usize,
    said_hello: bool,
    in_flight: Arc<Semaphore>,
    /// Set when a reply must be followed by closing the connection.
    fatal: Option<AppError>,
}

impl<S: Service> Connection<S> {
    fn new(settings: Settings, service: S, gate: Option<Arc<DeviceGate>>) -> Self {
        Connection {
            in_flight: Arc::new(Semaphore::new(settings.max_in_flight as usize)),
            settings,
            service,
            gate,
            max_frame_bytes: PRE_HELLO_MAX_FRAME_BYTES as usize,
            said_hello: false,
            fatal: None,
        }
    }

    /// Checked after registering, never before: a revoke or drain that began in between either
    /// saw this connection in the table or is seen here (connections.rs).
    fn ending_at_start(&self, kill_rx: &mut watch::Receiver<Option<AppError>>) -> Option<AppError> {
        if let Some(killed) = kill_rx.borrow_and_update().clone() {
            return Some(killed);
        }
        if self.gate.as_deref().is_some_and(DeviceGate::is_closed) {
            return Some(revoked());
        }
        self.service.refused_at_start()
    }

    /// The connection's loop: requests, replies, pushes and heartbeats, until the client
    /// leaves (`None`) or the connection must end with an error.
    async fn serve(
        &mut self,
        socket: &mut Socket,
        kill_rx: &mut watch::Receiver<Option<AppError>>,
        mut pushes: S::Pushes,
    ) -> Option<AppError> {
        let (reply_tx, mut reply_rx) = mpsc::channel::<Reply>(REPLY_QUEUE);
        let stall = self.settings.send_stall;
        let mut heartbeat = tokio::time::interval(self.settings.heartbeat);
        heartbeat.tick().await;
        loop {
            let (outgoing, ending) = tokio::select! {
                incoming = socket.next() => match incoming {
                    // The client said goodbye or vanished: no connection error.
                    Some(Ok(Message::Close(_))) => {
                        crate::answer_close(socket).await;
                        return None;
                    }
                    None => return None,
                    Some(Ok(message)) => {
                        let answered = self.on_message(message, &reply_tx).await;
                        // The request is handled: what reading it held goes back to the budget.
                        socket.get_mut().release_read();
                        answered
                    }
                    Some(Err(err)) => {
                        tracing::debug!(error = %err, "connection read failed");
                        return crate::socket::read_failure(
                            err,
                            self.settings.max_frame_bytes,
                            self.max_frame_bytes,
                        );
                    }
                },
                // The reply's charge ends once the socket has taken the frame.
                Some((reply, _charge)) = reply_rx.recv() => (vec![reply], None),
                Some(signal) = pushes.next() => self.service.pushes(signal, self.max_frame_bytes),
                _ = heartbeat.tick(), if self.said_hello => {
                    let heads = self.service.heads();
                    let at = crate::clock::now_ms();
                    (crate::push::heartbeats(at, heads, self.max_frame_bytes), None)
                }
                changed = kill_rx.changed() => match changed {
                    Ok(()) => return kill_rx.borrow_and_update().clone(),
                    Err(_) => return None,
                },
            };
            // Once killed, nothing more leaves: a revoke may already have answered (it waits
            // for this loop to stop, and a write in progress is part of that wait).
            if let Some(killed) = kill_rx.borrow_and_update().clone() {
                return Some(killed);
            }
            if !outgoing.is_empty() {
                match tokio::time::timeout(stall, send_all(socket, outgoing)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return ending,
                    // The client stopped reading: the socket has not taken the frames in time.
                    Err(_) => return Some(self.too_slow()),
                }
            }
            if ending.is_some() {
                return ending;
            }
        }
    }

    fn too_slow(&self) -> AppError {
        let last = self.service.heads().into_iter();
        crate::push::too_slow(
            "stopped reading",
            last.map(|head| (head.subscription_id, head.cursor)),
        )
    }

    /// One message from the client: the frames to send back, and the error to end with after
    /// them, if any.
    async fn on_message(
        &mut self,
        message: Message,
        replies: &mpsc::Sender<Reply>,
    ) -> (Vec<String>, Option<AppError>) {
        match message {
            Message::Text(text) => {
                let reply = self.handle_text(text.as_str(), replies).await;
                let frames = reply
                    .into_iter()
                    .map(|reply| fit_reply(reply, self.max_frame_bytes))
                    .collect();
                (frames, self.fatal.take())
            }
            Message::Binary(_) => {
                let error = AppError::new(
                    ErrorCode::InvalidArgument,
                    "binary frames are not accepted; send UTF-8 JSON text frames",
                )
                .with_details(json!({"reason": "binary_frame"}));
                self.settings.metrics.answered(None, Some(error.code()));
                (vec![encode(&ErrorReply { id: None, error })], None)
            }
            // Close is handled by the loop; tungstenite never reads a raw frame out.
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) | Message::Frame(_) => {
                (Vec::new(), None)
            }
        }
    }

    /// Handles one text frame; returns a reply to send now, if any. Calls answered on a task
    /// of their own reply through `replies`.
    async fn handle_text(&mut self, text: &str, replies: &mpsc::Sender<Reply>) -> Option<String> {
        let request = match decode_request(text, self.max_frame_bytes) {
            Ok(request) => request,
            Err(Rejected { id, error }) => {
                self.settings.metrics.answered(None, Some(error.code()));
                return Some(encode(&ErrorReply { id, error }));
            }
        };
        // The client's trace id, or one made here: the first hop (docs/protocol.md §3.3).
        let trace_id = request.trace_id.clone().unwrap_or_else(crate::trace::mint);
        let method = request.method;
        let handled = self.handle_request(request, trace_id.clone(), replies);
        crate::trace::scope(trace_id, method.as_str(), handled).await
    }

    /// One decoded request, within its call's trace scope.
    async fn handle_request(
        &mut self,
        request: IncomingRequest<'_>,
        trace_id: TraceId,
        replies: &mpsc::Sender<Reply>,
    ) -> Option<String> {
        let (id, method) = (request.id, request.method);
        let started = Instant::now();
        let (call, pass) = match self.admit(method, request.params) {
            Ok(admitted) => admitted,
            Err(error) => {
                self.settings
                    .metrics
                    .answered(Some(method), Some(error.code()));
                return Some(error_reply(id, stamp(error, &trace_id)));
            }
        };
        // The pass is held to the end of this function, or moved into the spawned call.
        let answer = match call.place() {
            Placed::Core(CoreCall::Hello(params)) => {
                return Some(self.hello(id, params, &trace_id));
            }
            Placed::Subscription(call) => {
                let answer = self.service.subscription(call).await;
                finished(&self.settings.metrics, method, &answer, started);
                return Some(reply(id, traced(answer, &trace_id)));
            }
            Placed::Endpoint(call) => self.service.endpoint(call),
            Placed::Host(call) => self.service.host(call, request.params),
        };
        self.spawn_answer((id, method, trace_id, started), answer, pass, replies)
    }

    /// Hello first, then the service's checks, then the device's gate (connections.rs): a
    /// pass for the call (unless the method table says it holds none), or the revocation that
    /// ends this connection.
    fn admit(
        &mut self,
        method: Method,
        params: Option<&RawValue>,
    ) -> Result<(Call, Option<CallPass>), AppError> {
        if !self.said_hello && method != Method::Hello {
            return Err(AppError::new(
                ErrorCode::HelloRequired,
                "say hello first: it must be the first call on a connection",
            ));
        }
        let call = match self.service.admit(method, params) {
            Ok(call) => call,
            Err(Refusal::Call(error)) => return Err(error),
            Err(Refusal::Connection(error)) => {
                self.fatal = Some(error.clone());
                return Err(error);
            }
        };
        let pass = match &self.gate {
            Some(gate) if method.spec().holds_pass => {
                let pass = gate.enter().ok_or_else(revoked);
                Some(pass.inspect_err(|error| self.fatal = Some(error.clone()))?)
            }
            _ => None,
        };
        Ok((call, pass))
    }

    fn hello(&mut self, id: RequestId, params: HelloParams, trace_id: &TraceId) -> String {
        let agreed = crate::hello::agree(
            &params,
            self.settings.server,
            self.settings.max_frame_bytes,
            self.settings.max_events_per_frame,
        );
        let said = agreed.map(|agreed| {
            self.max_frame_bytes = agreed.max_frame_bytes as usize;
            self.said_hello = true;
            self.service.hello(agreed)
        });
        // No common version: nothing more can be said on this connection.
        let said = said.inspect_err(|error| self.fatal = Some(error.clone()));
        let code = said.as_ref().err().map(AppError::code);
        self.settings.metrics.answered(Some(Method::Hello), code);
        let said = said.and_then(|result| crate::wire::to_raw(&result));
        reply(id, traced(said, trace_id))
    }

    /// Runs a call on its own task within the in-flight bounds (HOST_OVERLOADED beyond them);
    /// its reply goes through `replies`.
    fn spawn_answer(
        &self,
        (id, method, trace_id, started): (RequestId, Method, TraceId, Instant),
        answer: Answer,
        pass: Option<CallPass>,
        replies: &mpsc::Sender<Reply>,
    ) -> Option<String> {
        let server = self.settings.server_in_flight.as_ref();
        let on_connection = self.in_flight.clone().try_acquire_owned();
        let on_server = server_permit(server);
        let (Ok(on_connection), Ok(on_server)) = (on_connection, on_server) else {
            let mut details = json!({"maxInFlight": self.settings.max_in_flight});
            if let Some((_, max)) = server {
                details["maxInFlightHost"] = json!(max);
            }
            let error = overloaded(details);
            self.settings
                .metrics
                .answered(Some(method), Some(error.code()));
            return Some(error_reply(id, stamp(error, &trace_id)));
        };
        let replies = replies.clone();
        let (budget, max_frame_bytes) = (self.settings.budget.clone(), self.max_frame_bytes);
        let metrics = self.settings.metrics.clone();
        // The task answers within the call's span, with its trace id.
        tokio::spawn(crate::trace::carried(async move {
            let answer = traced(answer.await, &trace_id);
            finished(&metrics, method, &answer, started);
            let reply = charged(id, answer, max_frame_bytes, &budget);
            drop((on_connection, on_server));
            let _ = replies.send(reply).await;
            // Held until the reply is queued: a revoke waits for it (connections.rs).
            drop(pass);
        }));
        None
    }
}

/// A reply frame waiting for the socket, and what it holds of the server's budget.
type Reply = (String, Option<Charge>);

/// The reply frame to request `id`, fitted to the connection's bound and charged to the budget
/// until it is sent: many replies queued at once are refused with HOST_OVERLOADED rather than
/// held past the server's bound.
fn charged(
    id: RequestId,
    answer: Result<Box<RawValue>, AppError>,
    max_frame_bytes: usize,
    budget: &ByteBudget,
) -> Reply {
    // The result and the frame written from it, until the frame is cut to fit.
    let size = answer.as_ref().map_or(0, |result| result.get().len());
    let writing = match budget.charge(size * 2) {
        Ok(charge) => charge,
        Err(error) => return (error_reply(id, error), None),
    };
    let frame = fit_reply(reply(id.clone(), answer), max_frame_bytes);
    drop(writing);
    match budget.charge(frame.len()) {
        Ok(charge) => (frame, Some(charge)),
        // An error reply is small, like the requests that are not charged either.
        Err(error) => {
            drop(frame);
            (error_reply(id, error), None)
        }
    }
}

/// A call answered: counted by method and code, its time observed, and a line in the log
/// (at debug), within the call's span.
fn finished(
    metrics: &CoreMetrics,
    method: Method,
    answer: &Result<Box<RawValue>, AppError>,
    started: Instant,
) {
    let code = answer.as_ref().err().map(AppError::code);
    metrics.answered(Some(method), code);
    let elapsed = started.elapsed();
    metrics.took(method, elapsed);
    let code = code.map_or("ok", ErrorCode::as_str);
    tracing::debug!(code, elapsed_us = elapsed.as_micros() as u64, "answered");
}

/// The answer to a traced call: its error carries the call's trace id.
fn traced(
    answer: Result<Box<RawValue>, AppError>,
    trace_id: &TraceId,
) -> Result<Box<RawValue>, AppError> {
    answer.map_err(|error| stamp(error, trace_id))
}

/// The reply frame to request `id`: its result spliced in as written, or its error.
fn reply(id: RequestId, answer: Result<Box<RawValue>, AppError>) -> String {
    match answer {
        Ok(result) => format!(r#"{{"id":{},"result":{}}}"#, encode(&id), result.get()),
        Err(error) => error_reply(id, error),
    }
}
