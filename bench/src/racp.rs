//! A minimal RACP-WS client over tokio-tungstenite: the upgrade with a bearer token, `hello`, and
//! calls that wait for their reply. Pushes that arrive meanwhile are dropped (control
//! connections do not subscribe).

use anyhow::{Context, Result, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens `/racp` with the `racp.v1` subprotocol and a bearer token. `read_buffer` is
/// tungstenite's read buffer per connection (its 128 KiB default adds up over thousands of
/// client connections).
pub async fn upgrade(url: &str, token: &str, read_buffer: usize) -> Result<Ws> {
    let mut request = url.into_client_request().context("bad URL")?;
    let headers = request.headers_mut();
    headers.insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static("racp.v1"),
    );
    headers.insert(
        "Authorization",
        HeaderValue::from_str(&format!("Bearer {token}")).context("token is not a header")?,
    );
    let config = WebSocketConfig::default()
        .read_buffer_size(read_buffer)
        .max_message_size(Some(64 << 20))
        .max_frame_size(Some(64 << 20));
    let connect = tokio_tungstenite::connect_async_with_config(request, Some(config), true);
    match tokio::time::timeout(CALL_TIMEOUT, connect).await {
        Err(_) => bail!("upgrade to {url} timed out"),
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(tungstenite::Error::Http(response))) => {
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            bail!("upgrade refused: {} {body}", response.status())
        }
        Ok(Err(err)) => Err(anyhow!(err).context(format!("upgrade to {url}"))),
    }
}

/// One request frame.
pub fn request(id: u64, method: &str, params: Value) -> String {
    json!({"id": id, "method": method, "params": params}).to_string()
}

pub fn hello_params() -> Value {
    json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "pi-bench", "version": env!("CARGO_PKG_VERSION")}})
}

/// Sends a request and reads until its reply; returns `result`, or the error as an `Err`.
/// Other frames read meanwhile are handed to `other`.
pub async fn call_on(
    ws: &mut Ws,
    id: u64,
    method: &str,
    params: Value,
    mut other: impl FnMut(&str),
) -> Result<Value> {
    ws.send(Message::Text(request(id, method, params).into()))
        .await
        .with_context(|| format!("send {method}"))?;
    let wait = async {
        loop {
            let message = ws
                .next()
                .await
                .with_context(|| format!("connection closed before the reply to {method}"))?
                .with_context(|| format!("read the reply to {method}"))?;
            let Message::Text(text) = message else {
                continue;
            };
            // Replies start with their id; anything else is a push.
            if !text.starts_with(r#"{"id":"#) {
                other(text.as_str());
                continue;
            }
            let frame: Value = serde_json::from_str(text.as_str()).context("reply is not JSON")?;
            if frame["id"] != json!(id) {
                continue;
            }
            if let Some(result) = frame.get("result") {
                return Ok(result.clone());
            }
            bail!("{method} failed: {}", frame["error"]);
        }
    };
    tokio::time::timeout(CALL_TIMEOUT, wait)
        .await
        .with_context(|| format!("no reply to {method} in {CALL_TIMEOUT:?}"))?
}

/// A connection for control calls (session/create, turn/start, session/get).
pub struct Control {
    ws: Ws,
    next_id: u64,
}

impl Control {
    pub async fn connect(url: &str, token: &str) -> Result<Control> {
        let ws = upgrade(url, token, 64 << 10).await?;
        let mut control = Control { ws, next_id: 1 };
        control.call("hello", hello_params()).await?;
        Ok(control)
    }

    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        call_on(&mut self.ws, id, method, params, |_| {}).await
    }
}

/// The seq of a cursor. Clients must treat cursors as opaque; the bench reads today's format
/// (`<epoch hex>-<seq>`) only to count events.
pub fn cursor_seq(cursor: &Value) -> Result<u64> {
    cursor
        .as_str()
        .and_then(|c| c.rsplit_once('-'))
        .and_then(|(_, seq)| seq.parse().ok())
        .with_context(|| format!("unexpected cursor {cursor}"))
}
