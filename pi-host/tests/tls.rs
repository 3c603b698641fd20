//! TLS: a host serves wss:// with its own certificate (made at first start, pinned by devices
//! at pairing) or with one it is given; plain ws:// only with --plain, and only on loopback.

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
        .args(["serve", "--plain", "--listen", "0.0.0.0:0", "--data-dir"])
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

fn sha256_hex(der: &[u8]) -> String {
    racp_proto::client::certificate_sha256(der).to_hex()
}

/// The SHA-256 of the certificate the host presents in a TLS handshake.
async fn presented_sha256(host: &HostProcess) -> String {
    #[derive(Debug)]
    struct Capture(std::sync::Mutex<Option<Vec<u8>>>);
    impl rustls::client::danger::ServerCertVerifier for Capture {
        fn verify_server_cert(
            &self,
            end_entity: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            *self.0.lock().unwrap() = Some(end_entity.to_vec());
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let capture = Arc::new(Capture(std::sync::Mutex::new(None)));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(capture.clone())
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(host.addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    let der = capture.0.lock().unwrap().clone().unwrap();
    sha256_hex(&der)
}

#[tokio::test]
async fn a_host_serves_tls_with_its_own_identity_by_default_and_keeps_it() {
    let state_dir = tempfile::tempdir().unwrap();
    let state_file = state_dir.path().join("state.json");
    let host =
        HostProcess::start_with(bin(), &["--state-file", state_file.to_str().unwrap()]).await;
    let served = presented_sha256(&host).await;
    assert_eq!(host.cert_sha256.unwrap().to_hex(), served);
    assert!(host.url().starts_with("wss://"));

    // The identity lives in the data directory; the key was created private.
    use std::os::unix::fs::PermissionsExt;
    let key = host.data_dir.path().join("tls-key.pem");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // pair --json, the text output, status --json and the state file all name it.
    let minted = host.pairing_token(&[]).await;
    assert_eq!(minted["certSha256"], served.as_str());
    let url = minted["url"].as_str().unwrap();
    let token = minted["token"].as_str().unwrap();
    assert_eq!(
        url,
        format!("racps://{}/pair?cert=sha256:{served}#{token}", host.addr)
    );
    let (ok, text, _) = host.cli(&["pair"]).await;
    assert!(
        ok && text.contains(&served) && text.contains("racps://"),
        "{text}"
    );
    let (ok, text, _) = host.cli(&["status"]).await;
    assert!(
        ok && text.contains(&served) && text.contains("wss://"),
        "{text}"
    );
    let (ok, status, _) = host.cli(&["status", "--json"]).await;
    assert!(ok);
    let status: Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!(status["certSha256"], served.as_str());
    assert_eq!(status["url"], format!("wss://{}/racp", host.addr));
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(&state_file).unwrap()).unwrap();
    assert_eq!(state["certSha256"], served.as_str());
    assert_eq!(state["url"], format!("wss://{}/racp", host.addr));

    // A restart on the same data directory serves the same certificate.
    let host = host.restart(&[]).await;
    assert_eq!(presented_sha256(&host).await, served);
}

#[tokio::test]
async fn a_given_certificate_is_the_one_pinned() {
    let certificate = tests::TestCertificate::localhost();
    let host = HostProcess::start_with(bin(), &certificate.serve_args()).await;
    let minted = host.pairing_token(&[]).await;
    assert_eq!(minted["certSha256"], sha256_hex(&certificate.der).as_str());
    assert!(!host.data_dir.path().join("tls-key.pem").exists());
}

#[tokio::test]
async fn plain_is_an_explicit_opt_out_with_racp_links() {
    let host = HostProcess::start_with(bin(), &["--plain"]).await;
    assert!(host.cert_sha256.is_none());
    assert!(host.url().starts_with("ws://"));
    let minted = host.pairing_token(&[]).await;
    assert!(minted["url"].as_str().unwrap().starts_with("racp://"));
    assert!(minted.get("certSha256").is_none());
    assert!(
        host.log().contains("--plain"),
        "the opt-out is logged as a warning"
    );
    let (_, token) = host.pair_device("laptop", &[]).await;
    assert!(token.starts_with("pdt_"));
}

#[tokio::test]
async fn a_damaged_identity_stops_the_host_instead_of_replacing_it() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |dir: &Path| {
        let mut command = tokio::process::Command::new(bin());
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .kill_on_drop(true);
        command
    };
    // First start makes the identity; stop it at once.
    let mut first = serve(dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let cert = dir.path().join("tls-cert.pem");
    let deadline = std::time::Instant::now() + tests::PATIENCE;
    while !dir.path().join("tls-key.pem").exists() {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    first.kill().await.unwrap();
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let output = serve(dir.path()).output().await.unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tls-cert.pem"), "{stderr}");
    assert!(
        std::fs::read_to_string(&cert).unwrap().contains("broken"),
        "not regenerated"
    );
}
