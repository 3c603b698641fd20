//! A log-linear latency histogram in microseconds: exact below 64 µs, then 32 buckets per power
//! of two (about 3% resolution). The Node workers bucket the same way (bench/node/common.mjs), so
//! histograms from both merge and compare directly.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub fn bucket(v: u64) -> u32 {
    let v = v.min(0x7fff_ffff);
    if v < 64 {
        return v as u32;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - 5;
    64 + (msb - 6) * 32 + ((v >> shift) as u32 - 32)
}

/// The lowest value that falls in bucket `b`.
pub fn bucket_floor(b: u32) -> u64 {
    if b < 64 {
        return u64::from(b);
    }
    let octave = (b - 64) / 32;
    let sub = (b - 64) % 32;
    u64::from(sub + 32) << (octave + 1)
}

/// Counts per bucket.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Histogram {
    counts: BTreeMap<u32, u64>,
}

impl Histogram {
    pub fn record(&mut self, latency_us: u64) {
        *self.counts.entry(bucket(latency_us)).or_default() += 1;
    }

    pub fn merge_pairs(&mut self, pairs: &[(u32, u64)]) {
        for &(b, c) in pairs {
            *self.counts.entry(b).or_default() += c;
        }
    }

    pub fn pairs(&self) -> Vec<(u32, u64)> {
        self.counts.iter().map(|(&b, &c)| (b, c)).collect()
    }

    pub fn count(&self) -> u64 {
        self.counts.values().sum()
    }

    /// The value at quantile `q` (0..=1), as the floor of its bucket; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (&b, &c) in &self.counts {
            seen += c;
            if seen >= rank {
                return bucket_floor(b);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_floors_round_trip() {
        let mut last = 0;
        for v in 0..200_000u64 {
            let b = bucket(v);
            assert!(b >= last);
            last = b;
            assert!(bucket_floor(b) <= v);
            assert_eq!(bucket(bucket_floor(b)), b);
            assert!(v - bucket_floor(b) <= v / 32 + 1, "resolution at {v}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        for v in 1..=100 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5);
        assert!((48_000..=50_000).contains(&p50), "{p50}");
        assert!(h.quantile(0.99) >= 96_000);
    }
}
