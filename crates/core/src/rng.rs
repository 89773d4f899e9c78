//! A counter-based random source: SplitMix64 over `(seed, stream, index)`.
//!
//! Row initial values must be a pure function of `(seed, table, row)` so that a table sharded
//! over any number of servers, rebuilt after a loss or re-initialised in a test starts from the
//! same bits as the single-process model. A counter-based generator gives that for free and
//! can be evaluated in parallel in any order.

/// SplitMix64 finaliser: a bijective 64-bit mix with good avalanche.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hash of a key tuple, used to derive independent streams.
#[inline]
pub fn hash3(a: u64, b: u64, c: u64) -> u64 {
    mix64(mix64(mix64(a) ^ b.rotate_left(21)) ^ c.rotate_left(42))
}

/// A tiny sequential generator seeded from a key; cheap to construct per row.
#[derive(Debug, Clone)]
pub struct SplitMix {
    state: u64,
}

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix { state: seed }
    }

    /// Generator for one `(seed, stream, index)` key.
    pub fn keyed(seed: u64, stream: u64, index: u64) -> Self {
        SplitMix::new(hash3(seed, stream, index))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 24 bits of precision (exact in f32).
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal by Box–Muller (one of the pair is discarded: simplicity over speed).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_streams_differ_and_repeat() {
        let a = SplitMix::keyed(1, 2, 3).next_u64();
        let b = SplitMix::keyed(1, 2, 3).next_u64();
        let c = SplitMix::keyed(1, 2, 4).next_u64();
        let d = SplitMix::keyed(2, 2, 3).next_u64();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn uniform_mean_is_about_half() {
        let mut g = SplitMix::new(7);
        let n = 100_000;
        let mean: f64 = (0..n).map(|_| g.next_f32() as f64).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        let mut g = SplitMix::new(9);
        let m2: f64 = (0..n).map(|_| g.next_normal().powi(2)).sum::<f64>() / n as f64;
        assert!((m2 - 1.0).abs() < 0.03, "normal second moment {m2}");
    }
}
