//! Which messages on the call subject are calls: those a trusted gateway signed
//! (docs/protocol.md §15.5, "Signed calls"). A call needs every header of the envelope, a key
//! of `--gateway-trust`, a signature over the host, the subject, the time, the call id and the
//! payload, a time within `CALL_MAX_SKEW_MS` of this host's clock, and a call id not seen
//! before. Anything else is not run and gets no reply. The ids seen are kept here, in memory;
//! a host also keeps each one durably for the skew window before it runs the call (the
//! [`Verified`] it is handed), so a restart does not open a window for a replay.

use base64::Engine;
use racp_proto::gateway::{
    CALL_AT_HEADER, CALL_ID_HEADER, CALL_KEY_HEADER, CALL_MAX_SKEW_MS, CALL_SIGNATURE_HEADER,
    call_signed_bytes,
};
use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

/// Call ids remembered at most (each for the skew window on either side). Past it (more than
/// about 1 000 calls a second) calls are refused until older ids age out: the cache never
/// forgets an id that could still be replayed.
const MAX_REMEMBERED: usize = 65_536;
/// The longest call id accepted.
const MAX_CALL_ID: usize = 64;

/// The envelope a gateway puts on a routed call (what [`Verifier::verify`] reads): its key, the
/// time, the call id and the signature over them, the host, the subject and the payload.
pub fn envelope(
    signer: &nkeys::KeyPair,
    host_id: &str,
    subject: &str,
    at: u64,
    call_id: &str,
    payload: &[u8],
) -> Result<async_nats::HeaderMap, nkeys::error::Error> {
    let signature = signer.sign(&call_signed_bytes(host_id, subject, at, call_id, payload))?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(CALL_KEY_HEADER, signer.public_key().as_str());
    headers.insert(
        CALL_SIGNATURE_HEADER,
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(signature)
            .as_str(),
    );
    headers.insert(CALL_AT_HEADER, at.to_string().as_str());
    headers.insert(CALL_ID_HEADER, call_id);
    Ok(headers)
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Refusal {
    #[error("no {0} header: not a call from a gateway")]
    Missing(&'static str),
    #[error("signed by {0}, which is not in --gateway-trust")]
    UntrustedKey(String),
    #[error("the signature does not verify")]
    BadSignature,
    #[error("signed at {at} ms, {skew_ms} ms from this host's clock (at most {max} ms)", max = CALL_MAX_SKEW_MS)]
    Stale { at: u64, skew_ms: u64 },
    #[error("call id {0:?} was seen already (a replay)")]
    Replayed(String),
    #[error("too many calls to remember their ids; refused until older ones age out")]
    Busy,
}

/// A call that passed: its id and when it was signed, for the host to keep as seen until
/// `signed_at + CALL_MAX_SKEW_MS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub call_id: String,
    pub signed_at: u64,
}

/// The gateways' keys this host trusts, and the call ids it has seen.
pub struct Verifier {
    trusted: Vec<(String, nkeys::KeyPair)>,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    by_time: BTreeSet<(u64, String)>,
}

/// A public user nkey (`U…`, what `pi-gateway key` prints).
pub fn parse_trusted_key(key: &str) -> Result<nkeys::KeyPair, String> {
    let key = key.trim();
    match nkeys::KeyPair::from_public_key(key) {
        Ok(pair) if key.starts_with('U') => Ok(pair),
        _ => Err(format!(
            "{key:?} is not a gateway's public key (`pi-gateway key` prints it: U followed by 55 characters)"
        )),
    }
}

impl Verifier {
    pub fn new(keys: &[String]) -> Result<Verifier, String> {
        let trusted = keys
            .iter()
            .map(|key| Ok((key.trim().to_string(), parse_trusted_key(key)?)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Verifier {
            trusted,
            seen: Mutex::new(Seen::default()),
        })
    }

    /// Whether the message is a call this host may run; remembers its id when it is.
    pub fn verify(
        &self,
        host_id: &str,
        subject: &str,
        headers: Option<&async_nats::HeaderMap>,
        payload: &[u8],
        now_ms: u64,
    ) -> Result<Verified, Refusal> {
        let header = |name: &'static str| {
            headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_string())
                .ok_or(Refusal::Missing(name))
        };
        let key = header(CALL_KEY_HEADER)?;
        let signature = header(CALL_SIGNATURE_HEADER)?;
        let at = header(CALL_AT_HEADER)?;
        let call_id = header(CALL_ID_HEADER)?;
        let Some((_, pair)) = self.trusted.iter().find(|(trusted, _)| *trusted == key) else {
            return Err(Refusal::UntrustedKey(
                racp_proto::validate::printable(&racp_proto::validate::clip(&key, 64), false)
                    .into_owned(),
            ));
        };
        let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(signature.as_bytes())
            .map_err(|_| Refusal::BadSignature)?;
        let at: u64 = at.parse().map_err(|_| Refusal::BadSignature)?;
        if call_id.is_empty() || call_id.len() > MAX_CALL_ID {
            return Err(Refusal::BadSignature);
        }
        let signed = call_signed_bytes(host_id, subject, at, &call_id, payload);
        pair.verify(&signed, &signature)
            .map_err(|_| Refusal::BadSignature)?;
        let skew_ms = now_ms.abs_diff(at);
        if skew_ms > CALL_MAX_SKEW_MS {
            return Err(Refusal::Stale { at, skew_ms });
        }
        self.remember(call_id.clone(), at, now_ms)?;
        Ok(Verified {
            call_id,
            signed_at: at,
        })
    }

    fn remember(&self, call_id: String, at: u64, now_ms: u64) -> Result<(), Refusal> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // An id signed before this can no longer pass the time check.
        let horizon = now_ms.saturating_sub(CALL_MAX_SKEW_MS);
        while let Some(oldest) = seen.by_time.first().cloned() {
            if oldest.0 >= horizon {
                break;
            }
            seen.by_time.remove(&oldest);
            seen.ids.remove(&oldest.1);
        }
        if seen.ids.contains(&call_id) {
            return Err(Refusal::Replayed(call_id));
        }
        if seen.ids.len() >= MAX_REMEMBERED {
            return Err(Refusal::Busy);
        }
        seen.ids.insert(call_id.clone());
        seen.by_time.insert((at, call_id));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(
        pair: &nkeys::KeyPair,
        subject: &str,
        at: u64,
        id: &str,
        payload: &[u8],
    ) -> async_nats::HeaderMap {
        envelope(pair, "h1", subject, at, id, payload).unwrap()
    }

    #[test]
    fn only_fresh_unaltered_calls_of_a_trusted_key_pass_once() {
        let gateway = nkeys::KeyPair::new_user();
        let other = nkeys::KeyPair::new_user();
        let verifier = Verifier::new(&[gateway.public_key()]).unwrap();
        let now = 1_000_000_000;
        let body = br#"{"roles":["observer"]}"#;
        let subject = "racp.call.h1";
        let ok = signed(&gateway, subject, now, "c1", body);
        let passed = verifier.verify("h1", subject, Some(&ok), body, now);
        assert_eq!(
            passed,
            Ok(Verified {
                call_id: "c1".into(),
                signed_at: now
            })
        );
        // The same call again, or moved to another host, or altered, or by another key.
        assert!(matches!(
            verifier.verify("h1", subject, Some(&ok), body, now + 5),
            Err(Refusal::Replayed(_))
        ));
        let fresh = signed(&gateway, subject, now, "c2", body);
        let forged = br#"{"roles":["owner"]}"#;
        assert_eq!(
            verifier.verify("h1", subject, Some(&fresh), forged, now),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            verifier.verify("h2", "racp.call.h2", Some(&fresh), body, now),
            Err(Refusal::BadSignature)
        );
        let stranger = signed(&other, subject, now, "c3", body);
        assert!(matches!(
            verifier.verify("h1", subject, Some(&stranger), body, now),
            Err(Refusal::UntrustedKey(_))
        ));
        let old = signed(&gateway, subject, now - CALL_MAX_SKEW_MS - 1, "c4", body);
        assert!(matches!(
            verifier.verify("h1", subject, Some(&old), body, now),
            Err(Refusal::Stale { .. })
        ));
        assert_eq!(
            verifier.verify("h1", subject, None, body, now),
            Err(Refusal::Missing(CALL_KEY_HEADER))
        );
        // Ids age out once their calls could no longer pass the time check.
        let later = now + 2 * CALL_MAX_SKEW_MS + 1;
        let again = signed(&gateway, subject, later, "c1", body);
        assert!(
            verifier
                .verify("h1", subject, Some(&again), body, later)
                .is_ok()
        );
        assert!(parse_trusted_key("not a key").is_err());
        assert!(parse_trusted_key(&gateway.seed().unwrap()).is_err());
    }

    /// The skew bound holds both ways: exactly `CALL_MAX_SKEW_MS` before or after the host's
    /// clock passes, a millisecond more (or a clock 35 s ahead) does not.
    #[test]
    fn the_skew_bound_holds_for_calls_signed_in_the_past_and_in_the_future() {
        let gateway = nkeys::KeyPair::new_user();
        let verifier = Verifier::new(&[gateway.public_key()]).unwrap();
        let now = 1_000_000_000;
        let body = b"{}";
        let subject = "racp.call.h1";
        let verify = |at: u64, id: &str| {
            let headers = signed(&gateway, subject, at, id, body);
            verifier.verify("h1", subject, Some(&headers), body, now)
        };
        for at in [now + CALL_MAX_SKEW_MS, now - CALL_MAX_SKEW_MS] {
            let id = format!("at {at}");
            let passed = Verified {
                call_id: id.clone(),
                signed_at: at,
            };
            assert_eq!(verify(at, &id), Ok(passed));
        }
        for (at, id) in [
            (now + 35_000, "35 s ahead"),
            (now + CALL_MAX_SKEW_MS + 1, "1 ms too far ahead"),
            (now - CALL_MAX_SKEW_MS - 1, "1 ms too far behind"),
        ] {
            assert_eq!(
                verify(at, id),
                Err(Refusal::Stale {
                    at,
                    skew_ms: now.abs_diff(at)
                }),
                "{id}"
            );
        }
    }
}
