//! Per-device request budgets: a token bucket refilled at `requests_per_second` up to
//! `request_burst`. Over budget a call gets RATE_LIMITED with the wait until the next token.

use dashmap::DashMap;
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::time::Instant;

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

pub struct RateLimiter {
    buckets: DashMap<String, Bucket>,
    per_second: f64,
    burst: f64,
}

impl RateLimiter {
    pub fn new(per_second: u32, burst: u32) -> Self {
        RateLimiter {
            buckets: DashMap::new(),
            per_second: f64::from(per_second.max(1)),
            burst: f64::from(burst.max(1)),
        }
    }

    /// Takes one token from `key`'s bucket.
    pub fn check(&self, key: &str) -> Result<(), AppError> {
        let now = Instant::now();
        let mut bucket = self.buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: self.burst,
            refilled: now,
        });
        let elapsed = now.duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.per_second).min(self.burst);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait_ms = ((1.0 - bucket.tokens) / self.per_second * 1000.0).ceil() as u64;
        Err(AppError::new(
            ErrorCode::RateLimited,
            "this device is sending calls faster than its budget",
        )
        .with_retry_after_ms(wait_ms.max(1))
        .with_details(json!({
            "requestsPerSecond": self.per_second,
            "requestBurst": self.burst,
        })))
    }

    pub fn forget(&self, key: &str) {
        self.buckets.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refuse_with_a_wait() {
        let limiter = RateLimiter::new(10, 3);
        for _ in 0..3 {
            assert!(limiter.check("d").is_ok());
        }
        let err = limiter.check("d").unwrap_err();
        assert_eq!(err.code(), ErrorCode::RateLimited);
        let wait = err.retry_after_ms().unwrap();
        assert!((1..=100).contains(&wait), "{wait}");
        assert!(limiter.check("other").is_ok(), "budgets are per key");
    }
}
