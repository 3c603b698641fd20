//! The gateway's side of a desktop connection (racp-server's connection core runs it): the
//! gateway's admit policy, `hello` with the host's capabilities, subscriptions from the host's
//! stream (where each starts: `start.rs`), the endpoint's calls answered by the gateway
//! (`endpoint.rs`), and the host's calls routed to the connection's host over NATS.

use crate::devices::Caller;
use crate::endpoint;
use crate::feed::{self, Feed};
use crate::follow::{self, Follow, Outgoing};
use crate::hosts;
use crate::start;
use crate::state::{Gateway, shutting_down};
use racp_proto::events::SubscriptionHead;
use racp_proto::gateway::{events_stream, events_subject, valid_session_id};
use racp_proto::methods::handshake::{HelloResult, HostIdentity};
use racp_proto::methods::session::{SessionSubscribeParams, SessionSubscribeResult};
use racp_proto::{
    AppError, Call, Capability, Cursor, EndpointCall, ErrorCode, HostCall, Method, SubscriptionCall,
};
use racp_server::connection::{self, Answer, Here, Pushes, Refusal, Service, Settings, revoked};
use racp_server::connections::Slot;
use racp_server::fanout::{Subscriptions, no_such_subscription};
use racp_server::hello::{self, Agreed};
use racp_server::socket::Socket;
use racp_server::wire::to_raw;
use serde_json::json;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{Notify, mpsc};

/// Frames subscription tasks may queue for the socket before they wait (and stop pulling from
/// JetStream): a slow desktop slows only its own consumers.
const OUTGOING_QUEUE: usize = 32;

struct GatewayConnection {
    gateway: Arc<Gateway>,
    caller: Caller,
    /// The host this connection reaches (`/racp/hosts/<id>`); `None` on `/racp`.
    host: Option<String>,
    /// What that host's last record says it has on (empty: not known).
    host_capabilities: Vec<String>,
    /// The address the desktop reached the gateway at (its Host header).
    reached_as: String,
    /// The frame bound and events per push, as agreed at `hello`.
    agreed: Agreed,
    /// Subscriptions catching up on a consumer of their own, until their feed's window holds
    /// what comes next.
    follows: BTreeMap<String, Follow>,
    /// Subscriptions reading from their session's feed, as a host's read its log.
    live: Subscriptions<Feed>,
    /// Where the catch-up tasks queue their frames for the connection.
    out: mpsc::Sender<Outgoing>,
}

/// What wakes a gateway connection: a feed's append, or a catch-up task's frame.
pub struct GatewayPushes {
    wake: Arc<Notify>,
    queue: mpsc::Receiver<Outgoing>,
}

pub enum Signal {
    Wake,
    Out(Outgoing),
}

impl Pushes for GatewayPushes {
    type Signal = Signal;
    async fn next(&mut self) -> Option<Signal> {
        tokio::select! {
            () = self.wake.notified() => Some(Signal::Wake),
            out = self.queue.recv() => out.map(Signal::Out),
        }
    }
}

pub async fn run(
    socket: Socket,
    gateway: Arc<Gateway>,
    caller: Caller,
    host: Option<String>,
    slot: Slot,
    reached_as: String,
) {
    let s = &gateway.settings;
    let settings = Settings {
        server: "gateway",
        max_frame_bytes: s.max_frame_bytes,
        max_events_per_frame: s.max_events_per_frame,
        max_in_flight: s.max_in_flight,
        server_in_flight: None,
        heartbeat: s.heartbeat,
        send_stall: s.send_stall,
        budget: gateway.budget.clone(),
        metrics: gateway.metrics.clone(),
    };
    let device_id = caller.device_id().map(str::to_string);
    let host_capabilities = host_capabilities(&gateway, host.as_deref()).await;
    let (out, queue) = mpsc::channel::<Outgoing>(OUTGOING_QUEUE);
    let live = Subscriptions::new(s.max_lag_events, s.max_events_per_frame)
        .counted_in(gateway.metrics.clone(), caller.principal().role_label());
    let pushes = GatewayPushes {
        wake: live.notify.clone(),
        queue,
    };
    let served = GatewayConnection {
        agreed: Agreed {
            max_frame_bytes: racp_proto::limits::PRE_HELLO_MAX_FRAME_BYTES,
            events_per_push: s.max_events_per_frame,
        },
        gateway: gateway.clone(),
        caller,
        host,
        host_capabilities,
        reached_as,
        follows: BTreeMap::new(),
        live,
        out,
    };
    connection::run(
        socket,
        &gateway.connections,
        slot,
        device_id,
        settings,
        served,
        pushes,
    )
    .await;
}

/// What the last record of the connection's host says it has on (empty: no host, or not known).
async fn host_capabilities(gateway: &Gateway, host: Option<&str>) -> Vec<String> {
    let Some(host_id) = host else {
        return Vec::new();
    };
    hosts::seen(&gateway.hosts, host_id)
        .await
        .ok()
        .flatten()
        .map(|seen| seen.record.capabilities)
        .unwrap_or_default()
}

impl Service for GatewayConnection {
    type Pushes = GatewayPushes;

    fn refused_at_start(&self) -> Option<AppError> {
        if let Some(device_id) = self.caller.device_id()
            && self.gateway.devices.is_revoked(device_id)
        {
            return Some(revoked());
        }
        self.gateway.is_draining().then(shutting_down)
    }

    /// The watch on the devices bucket says whether the device was revoked meanwhile, and the
    /// revocation lease whether this replica still knows every revoke; then the admit policy.
    fn admit(&mut self, method: Method, params: Option<&RawValue>) -> Result<Call, Refusal> {
        let mut rate = None;
        if let Caller::Device(device) = &self.caller {
            if self.gateway.devices.is_revoked(&device.device_id) {
                return Err(Refusal::Connection(revoked()));
            }
            if !self.gateway.lease.current() {
                return Err(Refusal::Call(crate::lease::stale()));
            }
            rate = Some((&self.gateway.rate, device.device_id.as_str()));
        }
        let draining = self.gateway.is_draining().then(shutting_down);
        let principal = self.caller.principal();
        Ok(racp_server::admission::admit(
            &principal, method, params, rate, draining,
        )?)
    }

    fn hello(&mut self, agreed: Agreed) -> HelloResult {
        let s = &self.gateway.settings;
        self.agreed = agreed;
        self.live.set_max_events_per_frame(agreed.events_per_push);
        let principal = self.caller.principal();
        let offer = hello::Offer {
            host: HostIdentity {
                version: env!("CARGO_PKG_VERSION").to_string(),
                id: self.host.clone().unwrap_or_else(|| "gateway".to_string()),
            },
            principal: &principal,
            capabilities: self.capabilities(),
            bounds: hello::Bounds {
                max_in_flight: s.max_in_flight,
                max_subscriptions: s.max_subscriptions,
                requests_per_second: s.requests_per_second,
                request_burst: s.request_burst,
            },
            heartbeat: s.heartbeat,
        };
        hello::result(agreed, offer)
    }

    fn subscription(&mut self, call: SubscriptionCall) -> Here<'_> {
        Box::pin(async move {
            match call {
                SubscriptionCall::SessionSubscribe(params) => {
                    to_raw(&self.subscribe(params).await?)
                }
                SubscriptionCall::SessionUnsubscribe(params) => {
                    let id = &params.subscription_id;
                    if self.follows.remove(id).is_none() && !self.live.remove(id) {
                        return Err(no_such_subscription(id));
                    }
                    to_raw(&racp_proto::Ack {})
                }
            }
        })
    }

    fn endpoint(&mut self, call: EndpointCall) -> Answer {
        let (gateway, caller) = (self.gateway.clone(), self.caller.clone());
        endpoint::answer(gateway, caller, self.reached_as.clone(), call)
    }

    /// Routed to the connection's host, which a device granted some hosts reaches only if it
    /// is one of them.
    fn host(&mut self, call: HostCall, params: Option<&RawValue>) -> Answer {
        let gateway = self.gateway.clone();
        let target = self.host_for(call.method()).and_then(|host| {
            let device = self.caller.device()?;
            if !device.may_reach(&host) {
                return Err(hosts::forbidden_host(&host));
            }
            Ok((host, device))
        });
        let params = params.map(ToOwned::to_owned);
        Box::pin(async move {
            let (host, device) = target?;
            let routed = hosts::Routed::new(&call, params.as_deref());
            hosts::route(&gateway.client, &gateway.signer, &host, &device, routed).await
        })
    }

    fn heads(&self) -> Vec<SubscriptionHead> {
        let mut heads = self.live.heads();
        heads.extend(self.follows.iter().map(|(id, f)| SubscriptionHead {
            subscription_id: id.clone(),
            session_id: f.session_id.clone(),
            cursor: f.cursor(),
        }));
        heads
    }

    fn pushes(
        &mut self,
        signal: Signal,
        max_frame_bytes: usize,
    ) -> (Vec<String>, Option<AppError>) {
        match signal {
            Signal::Wake => self.live.burst(max_frame_bytes),
            Signal::Out(Outgoing::Frame(frame)) => (vec![frame], None),
            Signal::Out(Outgoing::Ended(id)) => {
                self.follows.remove(&id);
                (Vec::new(), None)
            }
            Signal::Out(Outgoing::Live {
                subscription_id,
                last,
            }) => {
                if let Some(caught_up) = self.follows.remove(&subscription_id) {
                    self.live
                        .insert(subscription_id, caught_up.feed.clone(), last);
                }
                (Vec::new(), None)
            }
        }
    }
}

impl GatewayConnection {
    /// What `hello` names: on a host's endpoint the host's own (from its last record, so a host
    /// with `fs` off is not said to have it), else every capability a host can have; and `hosts`.
    fn capabilities(&self) -> Vec<String> {
        let hosts = Capability::Hosts.to_string();
        if !self.host_capabilities.is_empty() {
            return self
                .host_capabilities
                .iter()
                .cloned()
                .chain(std::iter::once(hosts))
                .collect();
        }
        Capability::HOST
            .iter()
            .map(|c| c.to_string())
            .chain(std::iter::once(hosts))
            .collect()
    }

    /// The connection's host, for a call that needs one.
    fn host_for(&self, method: Method) -> Result<String, AppError> {
        self.host.clone().ok_or_else(|| {
            AppError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{} needs a host: connect to {}/hosts/<hostId> (host/list names them)",
                    method.as_str(),
                    racp_proto::ENDPOINT_PATH
                ),
            )
            .with_details(json!({"reason": "no_host_selected", "method": method.as_str()}))
        })
    }

    async fn subscribe(
        &mut self,
        params: SessionSubscribeParams,
    ) -> Result<SessionSubscribeResult, AppError> {
        let host = self.host_for(Method::SessionSubscribe)?;
        self.room_for_subscription()?;
        let stream = self.events_stream(&host, &params.session_id).await?;
        let subject = events_subject(&host, &params.session_id);
        let device = self.caller.device()?;
        let origin = start::Origin {
            gateway: &self.gateway,
            device: &device,
            host: &host,
            session_id: &params.session_id,
        };
        let point = start::start_point(&origin, &stream, &subject, params.cursor).await?;
        let (epoch, after) = (point.epoch, point.after);
        let subscription_id = self.live.new_id();
        let feed = self.gateway.feeds.join(feed::Start {
            stream: &stream,
            host: &host,
            subject: &subject,
            session_id: &params.session_id,
            epoch,
            after: point.head,
            from: point.after_head,
            closed: point.closed,
            window_events: window_events(&self.gateway.settings),
        });
        if feed.takes_over_at(after) {
            self.live.insert(subscription_id.clone(), feed, after);
            return Ok(SessionSubscribeResult {
                subscription_id,
                cursor: Cursor::new(epoch, after),
            });
        }
        let start = follow::Start {
            subscription_id: subscription_id.clone(),
            session_id: params.session_id,
            subject,
            epoch,
            after,
            stream_sequence: point.stream_sequence,
            max_frame_bytes: self.agreed.max_frame_bytes as usize,
            max_events_per_frame: self.agreed.events_per_push,
            feed,
            metrics: self.gateway.metrics.clone(),
        };
        let followed = follow::follow(&stream, start, self.out.clone()).await?;
        self.follows.insert(subscription_id.clone(), followed);
        Ok(SessionSubscribeResult {
            subscription_id,
            cursor: Cursor::new(epoch, after),
        })
    }

    /// The host's events stream, for a session id that can be in it (SESSION_NOT_FOUND else).
    async fn events_stream(
        &self,
        host: &str,
        session_id: &str,
    ) -> Result<crate::stream::Stream, AppError> {
        let stream = self
            .gateway
            .js
            .get_stream_no_info(events_stream(host))
            .await
            .map_err(|e| hosts::nats_down(&e))?;
        if !valid_session_id(session_id) {
            return Err(AppError::new(ErrorCode::SessionNotFound, "no such session")
                .with_details(json!({"sessionId": session_id})));
        }
        Ok(stream)
    }

    /// LIMIT_EXCEEDED when the connection holds as many subscriptions as it may.
    fn room_for_subscription(&self) -> Result<(), AppError> {
        let max = self.gateway.settings.max_subscriptions;
        if self.follows.len() + self.live.len() >= max as usize {
            return Err(AppError::new(
                ErrorCode::LimitExceeded,
                format!("a connection may hold at most {max} subscriptions"),
            )
            .with_details(json!({"maxSubscriptions": max})));
        }
        Ok(())
    }
}

/// Events a feed's window holds: a subscriber within the lag bound stays in it, as on a host.
fn window_events(settings: &crate::state::Settings) -> usize {
    let lag = usize::try_from(settings.max_lag_events).unwrap_or(usize::MAX);
    lag.saturating_add(settings.max_events_per_frame)
}
