//! The host AdamW update of a chunk whose gradient is f16, in one pass on x86-64 with AVX and
//! F16C: each 8 halves are widened in registers, updated, and the new values narrowed to the f16
//! copy while still in registers. `half`'s slice conversions instead call a function per 8
//! elements, through a widened buffer: on a 2-core host the f16 pass took 31.7 ms per 16 Mi
//! parameters against 20.0 for f32 gradients (`benches/host_optimizer.rs`). In place
//! ([`update`]) or out of place into the bets' twins ([`update_into`]).
//!
//! The arithmetic is `host_kernels::update_values` operation for operation (no fused
//! multiply-adds; division and square root are correctly rounded in both), and the narrowing
//! rounds to nearest even as `half` does: the results are the same bits.

use std::arch::x86_64::*;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::host_kernels::{update_values, AdamWStep};

/// Whether this CPU runs [`update`].
pub fn available() -> bool {
    is_x86_feature_detected!("avx") && is_x86_feature_detected!("f16c")
}

/// `p`, `m`, `v` updated from `g · scale` (all of one length, as `half` when given), `half`
/// rewritten from the new values.
///
/// # Safety
/// The CPU must have AVX and F16C ([`available`]).
#[target_feature(enable = "avx,f16c")]
pub unsafe fn update(
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f16],
    mut half: Option<&mut [f16]>,
    decay: f32,
    scale: f32,
    h: &AdamWStep,
) {
    let n = p.len();
    assert!(m.len() == n && v.len() == n && g.len() == n && half.as_ref().is_none_or(|x| x.len() == n));
    let k = Constants::new(decay, scale, h);
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= n for every slice (lengths checked above); unaligned loads and stores.
        let load = |x: &[f32]| _mm256_loadu_ps(x.as_ptr().add(i));
        let (pi, mi, vi) = (load(p), load(m), load(v));
        let (new, mi, vi) = k.step(pi, mi, vi, g.as_ptr().add(i));
        _mm256_storeu_ps(m.as_mut_ptr().add(i), mi);
        _mm256_storeu_ps(v.as_mut_ptr().add(i), vi);
        _mm256_storeu_ps(p.as_mut_ptr().add(i), new);
        if let Some(half) = half.as_deref_mut() {
            _mm_storeu_si128(half.as_mut_ptr().add(i).cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(new));
        }
    }
    // The last few: the portable loop on them.
    let mut tail = [0f32; 8];
    let tail = &mut tail[..n - whole];
    g[whole..].convert_to_f32_slice(tail);
    update_values(&mut p[whole..], &mut m[whole..], &mut v[whole..], tail, decay, scale, h);
    if let Some(half) = half {
        half[whole..].convert_from_f32_slice(&p[whole..]);
    }
}

/// [`update`] out of place: `from`'s values and moments (value, first, second moment) are read
/// and the update is written to `into`'s (`p2`, `m2`, `v2`, and the f16 copy `half2`), the same
/// bits. The bets' twins (`super::speculative_update`) are written and not read in this pass:
/// where they are aligned, streaming stores write them without first reading each line into the
/// cache, which copying `from` into them and updating in place did: 42 bytes of memory traffic
/// a parameter instead of 28.
///
/// # Safety
/// The CPU must have AVX and F16C ([`available`]).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx,f16c")]
pub unsafe fn update_into(
    [p, m, v]: [&[f32]; 3],
    g: &[f16],
    [p2, m2, v2]: [&mut [f32]; 3],
    half2: Option<&mut [f16]>,
    decay: f32,
    scale: f32,
    h: &AdamWStep,
) {
    let n = p.len();
    let lengths = [m.len(), v.len(), g.len(), p2.len(), m2.len(), v2.len(), half2.as_ref().map_or(n, |x| x.len())];
    assert!(lengths.iter().all(|&l| l == n));
    let aligned = [p2.as_ptr(), m2.as_ptr(), v2.as_ptr()].iter().all(|x| x.cast::<u8>().align_offset(32) == 0)
        && half2.as_ref().is_none_or(|x| x.as_ptr().cast::<u8>().align_offset(16) == 0);
    if aligned {
        update_into_with::<true>([p, m, v], g, [p2, m2, v2], half2, decay, scale, h);
    } else {
        update_into_with::<false>([p, m, v], g, [p2, m2, v2], half2, decay, scale, h);
    }
}

/// [`update_into`] with streaming stores (`STREAM`: every output aligned) or plain ones.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx,f16c")]
unsafe fn update_into_with<const STREAM: bool>(
    [p, m, v]: [&[f32]; 3],
    g: &[f16],
    [p2, m2, v2]: [&mut [f32]; 3],
    mut half2: Option<&mut [f16]>,
    decay: f32,
    scale: f32,
    h: &AdamWStep,
) {
    let n = p.len();
    let k = Constants::new(decay, scale, h);
    let store = |at: *mut f32, x: __m256| {
        if STREAM {
            _mm256_stream_ps(at, x)
        } else {
            _mm256_storeu_ps(at, x)
        }
    };
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= n for every slice (lengths checked by the caller); the streaming
        // stores' addresses are 32- (16-) byte aligned: their slices start so and i steps by 8.
        let load = |x: &[f32]| _mm256_loadu_ps(x.as_ptr().add(i));
        let (pi, mi, vi) = (load(p), load(m), load(v));
        let (new, mi, vi) = k.step(pi, mi, vi, g.as_ptr().add(i));
        store(m2.as_mut_ptr().add(i), mi);
        store(v2.as_mut_ptr().add(i), vi);
        store(p2.as_mut_ptr().add(i), new);
        if let Some(half) = half2.as_deref_mut() {
            let narrowed = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(new);
            let at = half.as_mut_ptr().add(i).cast::<__m128i>();
            if STREAM {
                _mm_stream_si128(at, narrowed)
            } else {
                _mm_storeu_si128(at, narrowed)
            }
        }
    }
    if STREAM {
        // Streaming stores are weakly ordered: fenced before the thread that reads the twins
        // next is told they are done.
        _mm_sfence();
    }
    // The last few: copied, then the portable loop on them.
    let rest = whole..n;
    p2[rest.clone()].copy_from_slice(&p[rest.clone()]);
    m2[rest.clone()].copy_from_slice(&m[rest.clone()]);
    v2[rest.clone()].copy_from_slice(&v[rest.clone()]);
    let mut tail = [0f32; 8];
    let tail = &mut tail[..n - whole];
    g[rest.clone()].convert_to_f32_slice(tail);
    update_values(&mut p2[rest.clone()], &mut m2[rest.clone()], &mut v2[rest.clone()], tail, decay, scale, h);
    if let Some(half) = half2 {
        half[rest.clone()].convert_from_f32_slice(&p2[rest]);
    }
}

/// The update's constants in registers.
struct Constants {
    beta1: __m256,
    rest1: __m256,
    beta2: __m256,
    rest2: __m256,
    bc1: __m256,
    bc2: __m256,
    eps: __m256,
    lr: __m256,
    decay: __m256,
    scale: __m256,
}

impl Constants {
    #[target_feature(enable = "avx,f16c")]
    fn new(decay: f32, scale: f32, h: &AdamWStep) -> Self {
        let c = h.config;
        let (bc1, bc2) = h.bias_corrections();
        let splat = |x: f32| _mm256_set1_ps(x);
        Constants {
            beta1: splat(c.beta1),
            rest1: splat(1.0 - c.beta1),
            beta2: splat(c.beta2),
            rest2: splat(1.0 - c.beta2),
            bc1: splat(bc1),
            bc2: splat(bc2),
            eps: splat(c.eps),
            lr: splat(h.lr),
            decay: splat(decay),
            scale: splat(scale),
        }
    }

    /// 8 elements' update from their value, moments and the 8 f16 gradients at `g`: the new
    /// value and moments.
    ///
    /// # Safety
    /// `g` must point to 8 readable halves.
    #[inline]
    #[target_feature(enable = "avx,f16c")]
    unsafe fn step(&self, p: __m256, m: __m256, v: __m256, g: *const f16) -> (__m256, __m256, __m256) {
        let gi = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(g.cast())), self.scale);
        let mi = _mm256_add_ps(_mm256_mul_ps(self.beta1, m), _mm256_mul_ps(self.rest1, gi));
        let vi = _mm256_add_ps(_mm256_mul_ps(self.beta2, v), _mm256_mul_ps(_mm256_mul_ps(self.rest2, gi), gi));
        let upd = _mm256_div_ps(
            _mm256_div_ps(mi, self.bc1),
            _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(vi, self.bc2)), self.eps),
        );
        let new = _mm256_sub_ps(p, _mm256_mul_ps(self.lr, _mm256_add_ps(upd, _mm256_mul_ps(self.decay, p))));
        (new, mi, vi)
    }
}
