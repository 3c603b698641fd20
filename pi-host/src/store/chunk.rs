//! The encoding of one row of `event_chunks`: consecutive events of one session, each as its
//! time and its JSON text. The seq of an event is the chunk's `first_seq` plus its position, so
//! it is not stored again.
//!
//! Layout, repeated per event: `at` (u64, little-endian), the JSON's length in bytes (u32,
//! little-endian), the JSON (UTF-8). Hand-written rather than a serialization crate: it is the
//! hot path of every commit, and this is a copy of each event's bytes and nothing more.

use super::StoreError;

const AT_BYTES: usize = 8;
const LEN_BYTES: usize = 4;

/// Appends one event to a chunk body.
pub fn push(body: &mut Vec<u8>, at: u64, json: &str) -> Result<(), StoreError> {
    let len = u32::try_from(json.len())
        .map_err(|_| StoreError::Corrupt(format!("an event of {} bytes", json.len())))?;
    body.reserve(AT_BYTES + LEN_BYTES + json.len());
    body.extend_from_slice(&at.to_le_bytes());
    body.extend_from_slice(&len.to_le_bytes());
    body.extend_from_slice(json.as_bytes());
    Ok(())
}

/// The events of a chunk body, oldest first, as `(at, json)`.
pub fn decode(body: &[u8]) -> Result<Vec<(u64, String)>, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("event chunk: {what}"));
    let mut events = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (at, tail) = rest
            .split_first_chunk::<AT_BYTES>()
            .ok_or_else(|| corrupt("truncated time"))?;
        let (len, tail) = tail
            .split_first_chunk::<LEN_BYTES>()
            .ok_or_else(|| corrupt("truncated length"))?;
        let len = usize::try_from(u32::from_le_bytes(*len)).map_err(|_| corrupt("length"))?;
        if tail.len() < len {
            return Err(corrupt("truncated event"));
        }
        let (json, tail) = tail.split_at(len);
        let json = std::str::from_utf8(json).map_err(|_| corrupt("event is not UTF-8"))?;
        events.push((u64::from_le_bytes(*at), json.to_owned()));
        rest = tail;
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_in_order() {
        let mut body = Vec::new();
        push(&mut body, 7, r#"{"seq":1}"#).unwrap();
        push(&mut body, u64::MAX, "").unwrap();
        push(&mut body, 9, r#"{"text":"é\n"}"#).unwrap();
        let events = decode(&body).unwrap();
        assert_eq!(
            events,
            [
                (7, r#"{"seq":1}"#.to_owned()),
                (u64::MAX, String::new()),
                (9, r#"{"text":"é\n"}"#.to_owned())
            ]
        );
    }

    #[test]
    fn a_damaged_chunk_is_an_error_not_a_panic() {
        let mut body = Vec::new();
        push(&mut body, 1, "abcdef").unwrap();
        for cut in 1..body.len() {
            assert!(decode(&body[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = body.clone();
        bad[12] = 0xff;
        assert!(decode(&bad).is_err(), "invalid UTF-8");
        assert!(decode(&[]).unwrap().is_empty());
    }
}
