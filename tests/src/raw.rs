//! A WebSocket client that writes whatever bytes it is told to, for hostile input a proper
//! client cannot send (invalid UTF-8, protocol violations, frames past every bound), against a
//! host or a gateway alike.

use crate::{Io, PATIENCE};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct Raw {
    stream: Box<dyn Io>,
    buffer: Vec<u8>,
}

/// How a server ended a connection: the code of its last connection error (a frame with an
/// `error` and no `id`), the close code and the close reason, and how many replies (frames with
/// an `id`) came before the close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub error: Option<String>,
    pub close: Option<u16>,
    pub reason: Option<String>,
    pub answered: usize,
}

impl Raw {
    /// Upgrades to RACP-WS at `url` (`wss://` with the harness's pin, or `ws://`) with `token`.
    pub async fn connect(url: &str, token: &str) -> Raw {
        let stream = crate::dial(url).await.expect("connect to the server");
        let path = url
            .split("://")
            .nth(1)
            .and_then(|rest| rest.find('/').map(|at| &rest[at..]))
            .unwrap_or("/racp");
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Protocol: racp.v1\r\nAuthorization: Bearer {token}\r\n\r\n"
        );
        let mut raw = Raw {
            stream,
            buffer: Vec::new(),
        };
        raw.stream.write_all(request.as_bytes()).await.unwrap();
        let head = loop {
            if let Some(end) = raw.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw.buffer[..end]).into_owned();
                raw.buffer.drain(..end + 4);
                break head;
            }
            assert!(raw.fill().await, "the server closed during the upgrade");
        };
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        raw
    }

    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 << 10];
        match tokio::time::timeout(PATIENCE, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => panic!("the server sent nothing in time"),
        }
    }

    /// A frame with the given first byte (FIN, RSV, opcode), masked unless `unmasked`.
    pub fn encode(first: u8, payload: &[u8], unmasked: bool) -> Vec<u8> {
        let mut out = vec![first];
        let mask_bit = if unmasked { 0 } else { 0x80 };
        match payload.len() {
            n if n < 126 => out.push(mask_bit | n as u8),
            n if n <= 0xffff => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if unmasked {
            out.extend_from_slice(payload);
        } else {
            let key = [0x12u8, 0x34, 0x56, 0x78];
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        out
    }

    pub async fn send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok()
    }

    pub async fn text(&mut self, payload: &[u8]) -> bool {
        self.send(&Raw::encode(0x81, payload, false)).await
    }

    /// The next frame from the server: (opcode, payload); `None` once the socket closed.
    pub async fn frame(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if self.buffer.len() >= 2 {
                let opcode = self.buffer[0] & 0x0f;
                let (len, header) = match self.buffer[1] & 0x7f {
                    126 if self.buffer.len() >= 4 => (
                        u16::from_be_bytes([self.buffer[2], self.buffer[3]]) as usize,
                        4,
                    ),
                    127 if self.buffer.len() >= 10 => (
                        u64::from_be_bytes(self.buffer[2..10].try_into().unwrap()) as usize,
                        10,
                    ),
                    126 | 127 => (usize::MAX, 0),
                    n => (n as usize, 2),
                };
                if len != usize::MAX && self.buffer.len() >= header + len {
                    let payload = self.buffer[header..header + len].to_vec();
                    self.buffer.drain(..header + len);
                    return Some((opcode, payload));
                }
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// Reads until the server closes.
    pub async fn until_close(&mut self) -> Ending {
        let mut error = None;
        let mut answered = 0;
        while let Some((opcode, payload)) = self.frame().await {
            match opcode {
                1 => {
                    let frame: Value = serde_json::from_slice(&payload).unwrap();
                    match frame.get("id") {
                        None => {
                            if let Some(code) = frame["error"]["code"].as_str() {
                                error = Some(code.to_string());
                            }
                        }
                        Some(id) if !id.is_null() => answered += 1,
                        Some(_) => {}
                    }
                }
                8 => {
                    let close =
                        (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
                    let reason = (payload.len() > 2)
                        .then(|| String::from_utf8_lossy(&payload[2..]).into_owned());
                    return Ending {
                        error,
                        close,
                        reason,
                        answered,
                    };
                }
                _ => {}
            }
        }
        Ending {
            error,
            close: None,
            reason: None,
            answered,
        }
    }

    /// Sends a text frame and returns the reply to it (the next frame with an `id`).
    pub async fn reply(&mut self, payload: &[u8]) -> Value {
        assert!(self.text(payload).await);
        self.next_reply().await
    }

    /// Sends frames as they are (`bytes`, encoded with [`Raw::encode`]) and returns the reply.
    pub async fn reply_to(&mut self, bytes: &[u8]) -> Value {
        assert!(self.send(bytes).await);
        self.next_reply().await
    }

    /// The next frame with an `id`: a reply, or an error reply to what had none.
    async fn next_reply(&mut self) -> Value {
        loop {
            let (opcode, payload) = self.frame().await.expect("a reply");
            if opcode == 1 {
                let frame: Value = serde_json::from_slice(&payload).unwrap();
                if frame.get("id").is_some() {
                    return frame;
                }
            }
        }
    }
}
