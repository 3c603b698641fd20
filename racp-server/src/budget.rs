//! The server-wide budget of bytes held for clients (docs/reliability.md §4.18):
//! request frames being read (`reframe.rs` charges them as they arrive) and replies being built
//! or waiting for their socket (a history page, an export, any reply frame). A charge that
//! does not fit is refused with HOST_OVERLOADED, so what many connections hold at once stays
//! within one bound instead of adding up per connection.

use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a client is told to wait before retrying a call refused for memory.
const RETRY_AFTER_MS: u64 = 250;

/// The budget shared by every connection of a server (cheap to clone).
#[derive(Debug, Clone)]
pub struct ByteBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    held: AtomicUsize,
}

impl ByteBudget {
    pub fn new(limit: usize) -> ByteBudget {
        ByteBudget {
            inner: Arc::new(Inner {
                limit,
                held: AtomicUsize::new(0),
            }),
        }
    }

    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Bytes charged now, over all connections.
    pub fn held(&self) -> usize {
        self.inner.held.load(Ordering::Relaxed)
    }

    /// A charge of nothing, grown as what it covers grows.
    pub fn empty(&self) -> Charge {
        Charge {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// `bytes` more held, or HOST_OVERLOADED when they do not fit.
    pub fn charge(&self, bytes: usize) -> Result<Charge, AppError> {
        let mut charge = self.empty();
        charge.grow(bytes)?;
        Ok(charge)
    }

    fn take(&self, bytes: usize) -> bool {
        let limit = self.inner.limit;
        self.inner
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|total| *total <= limit)
            })
            .is_ok()
    }

    /// HOST_OVERLOADED for a charge that did not fit.
    pub fn overloaded(&self) -> AppError {
        AppError::new(
            ErrorCode::HostOverloaded,
            "the server holds as much request and reply data as it allows; retry after \
             retryAfterMs, or ask for less at once (smaller pages, fewer calls in parallel)",
        )
        .with_details(json!({"reason": "memory", "maxHeldBytes": self.inner.limit}))
        .with_retry_after_ms(RETRY_AFTER_MS)
    }
}

/// Bytes held against a budget until this is dropped.
#[derive(Debug)]
pub struct Charge {
    budget: ByteBudget,
    bytes: usize,
}

impl Charge {
    /// Holds `bytes` more, or HOST_OVERLOADED (holding what it held).
    pub fn grow(&mut self, bytes: usize) -> Result<(), AppError> {
        if !self.budget.take(bytes) {
            return Err(self.budget.overloaded());
        }
        self.bytes += bytes;
        Ok(())
    }

    /// Takes over what `other` holds.
    pub fn merge(&mut self, mut other: Charge) {
        self.bytes += std::mem::take(&mut other.bytes);
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget
            .inner
            .held
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_limit_fits_and_one_byte_more_is_refused() {
        let budget = ByteBudget::new(100);
        let all = budget.charge(100).expect("the limit fits");
        let refused = budget.charge(1).expect_err("one byte over");
        assert_eq!(refused.code(), ErrorCode::HostOverloaded);
        assert!(refused.retriable());
        assert_eq!(refused.retry_after_ms(), Some(RETRY_AFTER_MS));
        drop(all);
        assert_eq!(budget.held(), 0);
        let mut grown = budget.charge(60).expect("fits");
        assert!(grown.grow(41).is_err(), "60 + 41 > 100");
        assert_eq!(grown.bytes(), 60, "a refused growth keeps what was held");
        grown.grow(40).expect("60 + 40 = 100");
        let mut other = budget.empty();
        assert!(other.grow(1).is_err());
        other.merge(grown);
        assert_eq!((other.bytes(), budget.held()), (100, 100));
        drop(other);
        assert_eq!(budget.held(), 0);
    }
}
