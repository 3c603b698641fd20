//! What `pi-gateway serve` leaves in its data directory for `pi-gateway pair`: the address
//! desktops reach it at and the certificate it serves, so a pairing link needs no `--address`
//! and pins the certificate actually served (`--tls-cert` or the data directory's own).

use racp_proto::fingerprint::CertSha256;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

const FILE: &str = "served.json";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Served {
    /// `host:port` for pairing links.
    pub address: String,
    /// The served certificate's SHA-256 (none with `--plain`).
    pub cert_sha256: Option<CertSha256>,
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE)
}

/// The address a pairing link names: the first `--allow-host` (the name devices are told to
/// use), else the listen address when it is one interface, else loopback, each with the port
/// served.
pub fn address(listen: SocketAddr, allowed_hosts: &[String]) -> String {
    let port = listen.port();
    if let Some(name) = allowed_hosts.first() {
        return format!("{name}:{port}");
    }
    let ip = listen.ip();
    if ip.is_unspecified() {
        return if ip.is_ipv4() {
            format!("127.0.0.1:{port}")
        } else {
            format!("[::1]:{port}")
        };
    }
    listen.to_string()
}

/// Records what is served (replacing the previous serve's record).
pub fn record(data_dir: &Path, served: &Served) -> std::io::Result<()> {
    racp_server::private_file::create_private_dir(data_dir)?;
    let body = serde_json::to_vec(served).map_err(std::io::Error::other)?;
    racp_server::private_file::replace_private(&path(data_dir), &body)
}

/// The record of the last `serve` with this data directory, if any (an unreadable one counts as
/// none: `pair` then asks for `--address`).
pub fn read(data_dir: &Path) -> Option<Served> {
    let body = std::fs::read(path(data_dir)).ok()?;
    serde_json::from_slice(&body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_the_allowed_name_else_the_interface_else_loopback() {
        let wildcard: SocketAddr = "0.0.0.0:7879".parse().unwrap();
        assert_eq!(address(wildcard, &["gw.example".into()]), "gw.example:7879");
        assert_eq!(address(wildcard, &[]), "127.0.0.1:7879");
        let one: SocketAddr = "10.0.0.5:7000".parse().unwrap();
        assert_eq!(address(one, &[]), "10.0.0.5:7000");
        let v6: SocketAddr = "[::]:7000".parse().unwrap();
        assert_eq!(address(v6, &[]), "[::1]:7000");
    }

    #[test]
    fn a_record_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).is_none());
        let served = Served {
            address: "gw.example:7879".into(),
            cert_sha256: Some("ab".repeat(32).parse().unwrap()),
        };
        record(dir.path(), &served).unwrap();
        let back = read(dir.path()).unwrap();
        assert_eq!(back.address, served.address);
        assert_eq!(back.cert_sha256, served.cert_sha256);
    }
}
