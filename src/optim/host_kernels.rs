//! The host optimizer's two passes over every parameter: the sum of squares of the gradients
//! (for the clip) and the AdamW update. Both cut each tensor into fixed-size chunks that a pool of
//! worker threads shares out, so one set of threads serves a whole model (GPT-2 XL has ~580
//! tensors, 1.56 B parameters) and the loops are simple enough to vectorize.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::AdamWConfig;
use crate::error::{Error, Result};

/// Elements per chunk (256 KiB of f32 per array). Fixed, not derived from the thread count, so
/// the norm's partial sums are the same on every machine.
pub const CHUNK: usize = 1 << 16;

/// Worker threads the passes use: every core the process may run on (`PAGETRAIN_HOST_THREADS`
/// overrides).
pub fn worker_threads() -> usize {
    if cfg!(target_arch = "wasm32") {
        return 1;
    }
    let asked = std::env::var("PAGETRAIN_HOST_THREADS").ok().and_then(|v| v.parse::<usize>().ok());
    asked.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1)
}

/// Runs `f` on every job, on up to `threads` worker threads, and returns the results in job
/// order. The workers are a pool kept per thread count (`rayon`), not threads spawned per call:
/// the host optimizer runs a pass per layer, and spawning 16 threads for each took a quarter of
/// a GPT-2 small layer's ~2 ms pass (H100, BENCHMARKS stop 46). Where no pool can be made, the
/// jobs run here, one after another.
fn run_jobs<J: Send, R: Send>(jobs: Vec<J>, threads: usize, f: impl Fn(J) -> R + Sync) -> Vec<R> {
    let threads = threads.min(jobs.len());
    // (the browser has no threads: one after another there)
    if threads > 1 && !cfg!(target_arch = "wasm32") {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(pool) = worker_pool(threads) {
            use rayon::prelude::*;
            return pool.install(|| jobs.into_par_iter().map(&f).collect());
        }
    }
    jobs.into_iter().map(f).collect()
}

/// The pool of `threads` workers, made on first use and kept for the process (a run asks for
/// one or two sizes); `None` where its threads cannot start.
#[cfg(not(target_arch = "wasm32"))]
fn worker_pool(threads: usize) -> Option<std::sync::Arc<rayon::ThreadPool>> {
    use std::sync::Arc;
    static POOLS: std::sync::Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>> = std::sync::Mutex::new(Vec::new());
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, pool)) = pools.iter().find(|(n, _)| *n == threads) {
        return Some(pool.clone());
    }
    let pool =
        rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("host pass {i}")).build().ok()?;
    let pool = Arc::new(pool);
    pools.push((threads, pool.clone()));
    Some(pool)
}

/// `dst.copy_from_slice(src)` for every pair, in chunks on up to `threads` workers (one thread
/// copies a few GB/s: GPT-2 small's embedding alone, 154 MB, would take ~20 ms).
pub(super) fn copy_on_threads(pairs: Vec<(&mut [u8], &[u8])>, threads: usize) {
    let bytes = CHUNK * 4;
    let pieces: Vec<(&mut [u8], &[u8])> =
        pairs.into_iter().flat_map(|(dst, src)| dst.chunks_mut(bytes).zip(src.chunks(bytes))).collect();
    run_jobs(pieces, threads, |(dst, src)| dst.copy_from_slice(src));
}

/// Sum of `(g · scale)²` over one chunk in f64, eight lanes in a fixed order.
fn chunk_sum_of_squares(g: &[f32], scale: f32) -> f64 {
    let square = |g: f32| {
        let x = (g * scale) as f64;
        x * x
    };
    let mut lanes = [0.0f64; 8];
    let mut eights = g.chunks_exact(8);
    for e in &mut eights {
        for (lane, &g) in lanes.iter_mut().zip(e) {
            *lane += square(g);
        }
    }
    let tail: f64 = eights.remainder().iter().map(|&g| square(g)).sum();
    lanes.iter().sum::<f64>() + tail
}

/// Σ (g · scale)² over all of `grads`, in f64: a partial sum per [`CHUNK`] of each tensor, the
/// partials added in tensor and chunk order. Bit-identical for any `threads`.
pub fn sum_of_squares(grads: &[&[f32]], scale: f32, threads: usize) -> f64 {
    let chunks: Vec<&[f32]> = grads.iter().flat_map(|g| g.chunks(CHUNK)).collect();
    run_jobs(chunks, threads, |g| chunk_sum_of_squares(g, scale)).iter().sum()
}

/// A gradient as the host optimizer reads it: f32, or f16 times a scale (`optim::half_grads`),
/// which the update multiplies by `unscale`.
#[derive(Clone, Copy)]
pub enum GradSlice<'a> {
    F32(&'a [f32]),
    F16 { values: &'a [f16], unscale: f32 },
}

impl<'a> GradSlice<'a> {
    pub fn len(&self) -> usize {
        match self {
            GradSlice::F32(g) => g.len(),
            GradSlice::F16 { values, .. } => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Consecutive pieces of `size` elements (the last may be shorter).
    fn chunks(self, size: usize) -> Box<dyn Iterator<Item = GradSlice<'a>> + 'a> {
        match self {
            GradSlice::F32(g) => Box::new(g.chunks(size).map(GradSlice::F32)),
            GradSlice::F16 { values, unscale } => {
                Box::new(values.chunks(size).map(move |values| GradSlice::F16 { values, unscale }))
            }
        }
    }
}

impl<'a> From<&'a [f32]> for GradSlice<'a> {
    fn from(g: &'a [f32]) -> Self {
        GradSlice::F32(g)
    }
}

thread_local! {
    /// An f16 chunk widened to f32 before its update (one per worker thread, reused).
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One tensor's part in an AdamW update: its values, moments and gradient (the same length),
/// its weight decay (0 for biases and gains) and, under mixed precision, the f16 copy of its
/// values that the products read, rewritten from the updated values in the same pass.
pub struct AdamWSlices<'a> {
    pub p: &'a mut [f32],
    pub m: &'a mut [f32],
    pub v: &'a mut [f32],
    pub g: GradSlice<'a>,
    pub decay: f32,
    pub half: Option<&'a mut [f16]>,
}

/// What every tensor's update shares: the configuration, learning rate, the factor the
/// gradients are multiplied by (the clip factor times 1 / loss scale) and the step, from 1.
/// Owned (`Copy`), so an update can run on another thread (`super::update_ahead`).
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    pub config: AdamWConfig,
    pub lr: f32,
    pub scale: f32,
    pub t: u64,
}

impl AdamWStep {
    /// `1 − β₁ᵗ` and `1 − β₂ᵗ`, which divide the moments (one definition for every update loop:
    /// they give the same bits).
    pub(super) fn bias_corrections(&self) -> (f32, f32) {
        let c = self.config;
        (1.0 - c.beta1.powi(self.t as i32), 1.0 - c.beta2.powi(self.t as i32))
    }
}

/// One AdamW update of a chunk, element for element as `adamw_update` in shaders/optim.wgsl.
fn update_chunk(s: AdamWSlices, h: &AdamWStep) {
    #[cfg(target_arch = "x86_64")]
    if let GradSlice::F16 { values, unscale } = s.g {
        if super::fused_f16_update::available() {
            // SAFETY: the CPU has the features it needs (just checked).
            unsafe { super::fused_f16_update::update(s.p, s.m, s.v, values, s.half, s.decay, h.scale * unscale, h) };
            return;
        }
    }
    match s.g {
        GradSlice::F32(g) => update_values(s.p, s.m, s.v, g, s.decay, h.scale, h),
        // The unscale is a power of two: g · (scale · unscale) is (g · unscale) · scale exactly.
        GradSlice::F16 { values, unscale } => WIDENED.with(|w| {
            let mut w = w.borrow_mut();
            w.resize(values.len(), 0.0);
            values.convert_to_f32_slice(&mut w);
            update_values(s.p, s.m, s.v, &w, s.decay, h.scale * unscale, h)
        }),
    }
    // While the chunk is still in cache (rounded to nearest even, as the GPU's cast).
    if let Some(half) = s.half {
        half.convert_from_f32_slice(s.p);
    }
}

pub(super) fn update_values(
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    decay: f32,
    scale: f32,
    h: &AdamWStep,
) {
    let c = h.config;
    let (bc1, bc2) = h.bias_corrections();
    let lr = h.lr;
    for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
        let gi = g * scale;
        let mi = c.beta1 * *m + (1.0 - c.beta1) * gi;
        let vi = c.beta2 * *v + (1.0 - c.beta2) * gi * gi;
        *m = mi;
        *v = vi;
        let upd = (mi / bc1) / ((vi / bc2).sqrt() + c.eps);
        *p -= lr * (upd + decay * *p);
    }
}

/// The AdamW update of every tensor in `tensors`, in [`CHUNK`]s on up to `threads` threads.
pub fn adamw_update(tensors: Vec<AdamWSlices>, step: &AdamWStep, threads: usize) -> Result<()> {
    check_lengths(&tensors)?;
    let jobs: Vec<AdamWSlices> = tensors.into_iter().flat_map(chunked).collect();
    run_jobs(jobs, threads, |job| update_chunk(job, step));
    Ok(())
}

/// [`adamw_update`] out of place: each tensor's values and moments are read from `from` (value,
/// first and second moment) and its update is written over `into`'s, which are not read: the
/// bits of updating `from` in place (`super::speculative_update`'s twins).
pub fn adamw_update_from(
    from: Vec<[&[f32]; 3]>,
    into: Vec<AdamWSlices>,
    step: &AdamWStep,
    threads: usize,
) -> Result<()> {
    check_lengths(&into)?;
    if from.len() != into.len() || from.iter().zip(&into).any(|(f, t)| f.iter().any(|x| x.len() != t.p.len())) {
        return Err(Error::invalid(
            "host AdamW",
            "the tensors updated from differ in count or length from their twins",
        ));
    }
    let mut jobs = Vec::new();
    for ([p, m, v], t) in from.into_iter().zip(into) {
        let sources = p.chunks(CHUNK).zip(m.chunks(CHUNK)).zip(v.chunks(CHUNK)).map(|((p, m), v)| [p, m, v]);
        jobs.extend(chunked(t).zip(sources));
    }
    run_jobs(jobs, threads, |(job, from)| update_chunk_from(from, job, step));
    Ok(())
}

/// One chunk's update from `from` into `into`, the bits of [`update_chunk`] on a copy of `from`.
fn update_chunk_from(from: [&[f32]; 3], into: AdamWSlices, h: &AdamWStep) {
    #[cfg(target_arch = "x86_64")]
    if let GradSlice::F16 { values, unscale } = into.g {
        if super::fused_f16_update::available() {
            let AdamWSlices { p, m, v, decay, half, .. } = into;
            // SAFETY: the CPU has the features it needs (just checked).
            unsafe { super::fused_f16_update::update_into(from, values, [p, m, v], half, decay, h.scale * unscale, h) };
            return;
        }
    }
    into.p.copy_from_slice(from[0]);
    into.m.copy_from_slice(from[1]);
    into.v.copy_from_slice(from[2]);
    update_chunk(into, h)
}

/// One tensor's slices cut into [`CHUNK`]s.
fn chunked(t: AdamWSlices) -> impl Iterator<Item = AdamWSlices> {
    let decay = t.decay;
    let parts = t.p.chunks_mut(CHUNK).zip(t.m.chunks_mut(CHUNK)).zip(t.v.chunks_mut(CHUNK)).zip(t.g.chunks(CHUNK));
    let mut halves = t.half.map(|h| h.chunks_mut(CHUNK));
    parts.map(move |(((p, m), v), g)| {
        let half = halves.as_mut().and_then(|h| h.next());
        AdamWSlices { p, m, v, g, decay, half }
    })
}

/// An error naming the lengths where a tensor's slices differ.
fn check_lengths(tensors: &[AdamWSlices]) -> Result<()> {
    let differs = |t: &AdamWSlices| {
        let n = t.p.len();
        t.m.len() != n || t.v.len() != n || t.g.len() != n || t.half.as_ref().is_some_and(|h| h.len() != n)
    };
    if let Some(t) = tensors.iter().find(|t| differs(t)) {
        let mut lens = format!("values {}, moments {} and {}, gradient {}", t.p.len(), t.m.len(), t.v.len(), t.g.len());
        if let Some(h) = &t.half {
            lens += &format!(", f16 copy {}", h.len());
        }
        return Err(Error::invalid("host AdamW", format!("a tensor's slices differ in length: {lens}")));
    }
    Ok(())
}
