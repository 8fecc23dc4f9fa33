//! A small, seedable, portable random number generator (SplitMix64), so runs repeat exactly on
//! every platform and the state fits in a checkpoint.

#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed ^ 0x9E37_79B9_7F4A_7C15 }
    }

    /// The state, to save and restore with [`Rng::from_state`].
    pub fn state(&self) -> u64 {
        self.state
    }

    pub fn from_state(state: u64) -> Self {
        Rng { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * n as f64) as usize % n.max(1)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

/// The 32-bit hash `fill_normal` in `shaders/elementwise.wgsl` mixes its counter with.
fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Element `i` of a tensor the GPU filled with normal draws under `seed` (the `fill_normal`
/// kernel): counter-based, so it needs no state and any thread computes any element.
pub fn counter_normal(seed: u64, i: u32) -> f32 {
    let (s0, s1) = (seed as u32, (seed >> 32) as u32);
    let h1 = mix32(mix32(i ^ mix32(s0)) ^ s1);
    let h2 = mix32(h1 ^ 0x9e37_79b9);
    let u1 = ((h1 >> 8) as f32 + 1.0) / 16_777_216.0;
    let u2 = (h2 >> 8) as f32 / 16_777_216.0;
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}
