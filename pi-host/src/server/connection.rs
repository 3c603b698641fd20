//! The host's side of a connection (racp-server's connection core runs it): the host's admit
//! policy and handlers, `hello` with the host's capabilities, and subscriptions that pull from
//! the sessions' logs.

use crate::auth::Caller;
use crate::methods;
use crate::sessions::Session;
use crate::state::HostState;
use racp_proto::events::SubscriptionHead;
use racp_proto::methods::handshake::HelloResult;
use racp_proto::methods::session::{SessionSubscribeParams, SessionSubscribeResult};
use racp_proto::{AppError, Call, EndpointCall, ErrorCode, HostCall, Method, SubscriptionCall};
use racp_server::connection::{self, Answer, Here, Refusal, Service, Settings};
use racp_server::connections::Slot;
use racp_server::fanout::{Subscriptions, no_such_subscription};
use racp_server::hello::{self, Agreed};
use racp_server::socket::Socket;
use racp_server::wire::to_raw;
use serde_json::json;
use serde_json::value::RawValue;
use std::sync::Arc;
use tokio::sync::Notify;

pub async fn run(socket: Socket, state: Arc<HostState>, caller: Caller, slot: Slot) {
    let limits = &state.config.limits;
    let settings = Settings {
        server: "host",
        max_frame_bytes: limits.max_frame_bytes,
        max_events_per_frame: limits.max_events_per_frame,
        max_in_flight: limits.max_in_flight,
        server_in_flight: Some((state.in_flight.clone(), limits.max_in_flight_host)),
        heartbeat: state.config.heartbeat,
        send_stall: limits.send_stall,
        budget: state.budget.clone(),
        metrics: state.metrics.core.clone(),
    };
    let device_id = caller.device_id().map(str::to_string);
    let rate_key = Some(caller.rate_key());
    let host = HostConnection::new(state.clone(), caller, rate_key);
    let wake = host.subs.notify.clone();
    connection::run(
        socket,
        &state.connections,
        slot,
        device_id,
        settings,
        host,
        wake,
    )
    .await;
}

/// A call a gateway routed to this host, with the gateway's device as the caller: through
/// the same door as a call on a connection (racp-server's `answer_routed`), paying no rate
/// (the gateway charged the device's bucket) and within the host's in-flight bound.
pub async fn answer_routed(
    state: &Arc<HostState>,
    caller: Caller,
    method: Method,
    params: &RawValue,
) -> Result<Box<RawValue>, AppError> {
    let bound = (
        state.in_flight.clone(),
        state.config.limits.max_in_flight_host,
    );
    let service = HostConnection::new(state.clone(), caller, None);
    let metrics = &state.metrics.core;
    connection::answer_routed(service, method, params, Some(&bound), metrics).await
}

struct HostConnection {
    state: Arc<HostState>,
    caller: Caller,
    subs: Subscriptions<Session>,
    /// The rate budget this connection draws on: its device's, or its pairing token's; none
    /// for a routed call.
    rate_key: Option<String>,
}

impl HostConnection {
    fn new(state: Arc<HostState>, caller: Caller, rate_key: Option<String>) -> Self {
        let limits = &state.config.limits;
        let subs = Subscriptions::new(limits.max_lag_events, limits.max_events_per_frame)
            .counted_in(state.metrics.core.clone(), caller.principal().role_label());
        HostConnection {
            subs,
            rate_key,
            state,
            caller,
        }
    }
}

impl Service for HostConnection {
    type Pushes = Arc<Notify>;

    fn refused_at_start(&self) -> Option<AppError> {
        self.state.is_draining().then(crate::state::shutting_down)
    }

    /// Records the device's last-seen time: a synchronous SQLite write with fsync, on the
    /// blocking pool, not on a runtime thread that serves other connections meanwhile.
    async fn opened(&mut self) {
        let Some(device_id) = self.caller.device_id().map(str::to_string) else {
            return;
        };
        let state = self.state.clone();
        let touched = tokio::task::spawn_blocking(move || {
            state
                .store
                .touch_device(&device_id, racp_server::clock::now_ms())
        })
        .await;
        if let Ok(Err(err)) = touched {
            tracing::warn!(error = %err, "cannot record last-seen time");
        }
    }

    fn admit(&mut self, method: Method, params: Option<&RawValue>) -> Result<Call, Refusal> {
        let rate_key = self.rate_key.as_deref();
        Ok(methods::admit(
            &self.state,
            &self.caller,
            method,
            params,
            rate_key,
        )?)
    }

    fn hello(&mut self, agreed: Agreed) -> HelloResult {
        self.subs.set_max_events_per_frame(agreed.events_per_push);
        let principal = self.caller.principal();
        let offer = hello::Offer {
            host: methods::host::host_identity(&self.state),
            principal: &principal,
            capabilities: methods::host::capabilities(&self.state),
            bounds: hello::Bounds::from(&self.state.config.limits),
            heartbeat: self.state.config.heartbeat,
        };
        hello::result(agreed, offer)
    }

    fn subscription(&mut self, call: SubscriptionCall) -> Here<'_> {
        let answer = match call {
            SubscriptionCall::SessionSubscribe(params) => {
                self.subscribe(params).and_then(|r| to_raw(&r))
            }
            SubscriptionCall::SessionUnsubscribe(params) => {
                if self.subs.remove(&params.subscription_id) {
                    to_raw(&racp_proto::Ack {})
                } else {
                    Err(no_such_subscription(&params.subscription_id))
                }
            }
        };
        Box::pin(std::future::ready(answer))
    }

    fn endpoint(&mut self, call: EndpointCall) -> Answer {
        methods::answer_endpoint(self.state.clone(), self.caller.clone(), call)
    }

    fn host(&mut self, call: HostCall, _params: Option<&RawValue>) -> Answer {
        methods::answer_host(self.state.clone(), self.caller.clone(), call)
    }

    fn heads(&self) -> Vec<SubscriptionHead> {
        self.subs.heads()
    }

    fn pushes(&mut self, (): (), max_frame_bytes: usize) -> (Vec<String>, Option<AppError>) {
        self.subs.burst(max_frame_bytes)
    }
}

impl HostConnection {
    fn subscribe(
        &mut self,
        params: SessionSubscribeParams,
    ) -> Result<SessionSubscribeResult, AppError> {
        let max = self.state.config.limits.max_subscriptions;
        if self.subs.len() >= max as usize {
            return Err(AppError::new(
                ErrorCode::LimitExceeded,
                format!("a connection may hold at most {max} subscriptions"),
            )
            .with_details(json!({"maxSubscriptions": max})));
        }
        let session = self.state.sessions.find(&params.session_id)?;
        let cursor = match params.cursor {
            Some(cursor) => {
                session.check_cursor(cursor)?;
                cursor
            }
            None => session.head_cursor(),
        };
        let subscription_id = self.subs.new_id();
        self.subs
            .insert(subscription_id.clone(), session.clone(), cursor.seq);
        // Someone who may prompt is watching: have the agent ready for their prompt. An
        // observer only reads the log and the snapshot, so it never starts one.
        if self.caller.may_start_agents() && !session.is_closing() {
            self.state.drivers.warm(&self.state, &session);
        }
        Ok(SessionSubscribeResult {
            subscription_id,
            cursor,
        })
    }
}
