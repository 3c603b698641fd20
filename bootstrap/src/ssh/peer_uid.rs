//! Which local user is on the other end of a loopback TCP connection, so the forward's local
//! end can refuse other users (docs/reliability.md §4.11). TLS pinning already keeps a token
//! from reaching a squatter; this keeps other users of the same machine from riding the forward
//! to the host at all.
//!
//! Linux only: the kernel lists every TCP socket in /proc/net/tcp and /proc/net/tcp6 with its
//! owner's uid. The peer's socket is the row whose local address is the peer's address and
//! whose remote address is ours. Elsewhere nothing is checked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Whether the connection from `peer` to our `local` address belongs to our own user. A
/// connection whose owner cannot be found (it closed already, /proc is unreadable) is refused:
/// the check fails closed.
pub fn same_user(peer: SocketAddr, local: SocketAddr) -> Result<(), String> {
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let ours = own_uid().ok_or("cannot read this process's uid from /proc/self")?;
    match peer_uid(peer, local) {
        Some(uid) if uid == ours => Ok(()),
        Some(uid) => Err(format!(
            "the connection from {peer} belongs to uid {uid}, not {ours}"
        )),
        None => Err(format!("no owner found for the connection from {peer}")),
    }
}

/// The uid this process runs as (the owner of /proc/self).
pub fn own_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The uid owning the socket at `peer` that is connected to `local`.
pub fn peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|text| find_uid(&text, peer, local))
}

/// Looks the (peer, local) pair up in a /proc/net/tcp{,6} table.
fn find_uid(table: &str, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl, local_address, rem_address, st, tx:rx, tr:when, retrnsmt, uid, ...
        let (from, to, uid) = (fields.get(1)?, fields.get(2)?, fields.get(7)?);
        let matches =
            same_endpoint(parse_endpoint(from)?, peer) && same_endpoint(parse_endpoint(to)?, local);
        if matches { uid.parse().ok() } else { None }
    })
}

/// `0100007F:1F90` or 32 hex digits `:PORT` (each 32-bit word in the kernel's byte order).
fn parse_endpoint(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    let ip = match address.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(address)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(address.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Equal, counting an IPv4-mapped IPv6 address (a dual-stack socket) as its IPv4 address.
fn same_endpoint(a: SocketAddr, b: SocketAddr) -> bool {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    a.port() == b.port() && canonical(a.ip()) == canonical(b.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex4(ip: Ipv4Addr) -> String {
        format!("{:08X}", u32::from_ne_bytes(ip.octets()))
    }

    #[test]
    fn finds_the_peer_row_and_not_our_own() {
        let lo = Ipv4Addr::LOCALHOST;
        let listener: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let mapped = Ipv6Addr::from(lo.to_ipv6_mapped().octets());
        let hex6: String = mapped
            .octets()
            .chunks_exact(4)
            .map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        let header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
        let table = format!(
            "{header}   0: {l}:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n   1: {l}:1F90 {l}:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2\n   2: {l}:9C40 {l}:1F90 01 00000000:00000000 00:00000000 00000000 65534        0 3\n",
            l = hex4(lo)
        );
        assert_eq!(find_uid(&table, peer, listener), Some(65534));
        assert_eq!(find_uid(&table, listener, peer), Some(0));
        let other: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        assert_eq!(find_uid(&table, other, listener), None);
        // A dual-stack client socket shows up in tcp6 with a mapped address.
        let table6 = format!(
            "{header}   0: {hex6}:9C40 {hex6}:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 4\n"
        );
        assert_eq!(find_uid(&table6, peer, listener), Some(1000));
    }

    /// `setpriv` to uid/gid 65534 (nobody) running `bash -c script`, when this process may.
    pub(crate) fn as_nobody(script: &str) -> Option<std::process::Child> {
        if own_uid() != Some(0) {
            return None;
        }
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["bash", "-c", script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .ok()
    }

    #[test]
    fn a_connection_from_another_user_is_not_ours() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let script = format!("exec 3<>/dev/tcp/127.0.0.1/{}; sleep 5", local.port());
        let Some(mut child) = as_nobody(&script) else {
            eprintln!("skipped: cannot run a process as another uid (not root, or no setpriv)");
            return;
        };
        let (_accepted, peer) = listener.accept().unwrap();
        assert_eq!(peer_uid(peer, local), Some(65534));
        let refused = same_user(peer, local).unwrap_err();
        assert!(refused.contains("65534"), "{refused}");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_connection_of_our_own_is_ours() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(local).unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert!(same_user(peer, local).is_ok());
        assert_eq!(peer_uid(peer, local), own_uid());
    }
}
