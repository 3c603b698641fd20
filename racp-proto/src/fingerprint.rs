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

impl std::str::FromStr for CertSha256 {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        CertSha256::parse(text)
            .ok_or_else(|| format!("expected a SHA-256 fingerprint (64 hex digits), got {text:?}"))
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
