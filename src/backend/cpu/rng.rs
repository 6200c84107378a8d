//! The generator of random factories and dropout masks on data devices: SplitMix64 (Steele,
//! Lea and Flood, 2014), seeded per call by the call's number in the run, so the same workload
//! draws the same numbers on every run and a recomputation draws what the first run drew. A
//! factory's tensor is drawn in blocks of 65,536 elements, block k from the stream seeded
//! `seed ^ (k << 32)`, so the numbers do not depend on the thread count.
//! Normals are Box-Muller pairs of uniforms; uniforms are the top 24 bits over 2^24. This is
//! not PyTorch's Philox stream: runs that must match PyTorch's numbers load their weights and
//! batches from files instead.

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_F42D_4C95_7F2D)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform on [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 40) as f64 / (1u64 << 24) as f64
    }

    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_look_normal_and_repeat() {
        let mut r = Rng::new(7);
        let xs: Vec<f64> = (0..20000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
        assert_eq!(Rng::new(7).next_u64(), Rng::new(7).next_u64());
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }
}
