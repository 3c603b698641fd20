//! A host's identity: the SHA-256 of its TLS certificate (DER), written as 64 lowercase hex
//! digits. Pairing pins it and every later connection checks it (docs/protocol.md §2.4).

/// A SHA-256 certificate fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertSha256(pub [u8; 32]);

impl CertSha256 {
    /// Reads 64 hex digits (either case); anything else is `None`.
    pub fn parse(text: &str) -> Option<CertSha256> {
        let bytes = text.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Some(CertSha256(out))
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Display for CertSha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl std::fmt::Debug for CertSha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CertSha256({})", self.to_hex())
    }
}

/// For people typing a fingerprint (`pi-remote pair --cert`): 64 hex digits, optionally after
/// `sha256:` (as in pairing links) and with colons between the bytes (as `openssl x509
/// -fingerprint -sha256` prints it). [`CertSha256::parse`] stays strict for the wire.
impl std::str::FromStr for CertSha256 {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let hex = trimmed
            .strip_prefix("sha256:")
            .or_else(|| trimmed.strip_prefix("SHA256:"))
            .unwrap_or(trimmed);
        let hex = if hex.len() == 95 && hex.bytes().skip(2).step_by(3).all(|b| b == b':') {
            hex.replace(':', "")
        } else {
            hex.to_string()
        };
        CertSha256::parse(&hex).ok_or_else(|| {
            format!(
                "expected a SHA-256 fingerprint (64 hex digits, optionally sha256:HEX or AB:CD:…), got {text:?}"
            )
        })
    }
}

impl serde::Serialize for CertSha256 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for CertSha256 {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        CertSha256::parse(&text).ok_or_else(|| {
            serde::de::Error::custom("expected a SHA-256 fingerprint (64 hex digits)")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_fingerprint_may_carry_the_link_prefix_or_openssl_colons() {
        let hex = "ab".repeat(32);
        let plain: CertSha256 = hex.parse().unwrap();
        assert_eq!(
            format!("sha256:{hex}").parse::<CertSha256>().unwrap(),
            plain
        );
        let openssl = vec!["AB"; 32].join(":");
        assert_eq!(openssl.parse::<CertSha256>().unwrap(), plain);
        assert!(format!("md5:{hex}").parse::<CertSha256>().is_err());
        assert!("ab:cd".parse::<CertSha256>().is_err());
        assert!(
            CertSha256::parse(&format!("sha256:{hex}")).is_none(),
            "the wire form is strict"
        );
    }

    #[test]
    fn round_trips_and_refuses_malformed_text() {
        let hex = "00ff10ab".repeat(8);
        let parsed = CertSha256::parse(&hex).unwrap();
        assert_eq!(parsed.to_hex(), hex);
        assert_eq!(CertSha256::parse(&hex.to_uppercase()), Some(parsed));
        for bad in ["", "00", &"g0".repeat(32), &"0".repeat(65), &"é".repeat(32)] {
            assert!(CertSha256::parse(bad).is_none(), "{bad}");
        }
    }
}
