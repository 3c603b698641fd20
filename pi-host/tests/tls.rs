//! TLS: a host with a certificate serves wss://, and a non-loopback bind without TLS is refused.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use tests::HostProcess;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, pki_types::ServerName};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest, http::HeaderValue};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn a_host_with_a_certificate_serves_wss() {
    let certificate = tests::TestCertificate::localhost();
    let host = HostProcess::start_with(bin(), &certificate.serve_args()).await;
    let minted = host.pairing_token(&[]).await;
    assert!(minted["url"].as_str().unwrap().starts_with("racps://"));

    let mut roots = RootCertStore::empty();
    roots.add(certificate.der.clone().into()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(host.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake with the host's certificate");
    let mut request = format!("wss://localhost:{}/racp", host.addr.port())
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static("racp.v1"),
    );
    let bearer = format!("Bearer {}", minted["token"].as_str().unwrap());
    headers.insert("Authorization", HeaderValue::from_str(&bearer).unwrap());
    let (mut ws, _) = tokio_tungstenite::client_async(request, tls)
        .await
        .expect("upgrade over TLS");
    let hello = json!({"id": 1, "method": "hello", "params": {"protocol": {"min": 1, "max": 1}, "client": {"name": "t", "version": "1"}}});
    ws.send(Message::Text(hello.to_string().into()))
        .await
        .unwrap();
    let reply = loop {
        if let Some(Ok(Message::Text(text))) = ws.next().await {
            break serde_json::from_str::<Value>(text.as_str()).unwrap();
        }
    };
    assert_eq!(reply["result"]["principal"]["kind"], "pairing");
}

#[tokio::test]
async fn a_non_loopback_bind_without_tls_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // The check runs before anything is bound, so no socket is opened beyond loopback.
    let output = tokio::process::Command::new(bin())
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("without TLS") && stderr.contains("--insecure-bind"),
        "{stderr}"
    );
}
