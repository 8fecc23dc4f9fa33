//! Test helpers: a context on whatever adapter is here, random data, comparisons that print the
//! worst element, canary-guarded buffers, and central finite differences.
#![allow(dead_code)]

pub mod child;
pub mod reference;

use pagetrain::pager::View;
use pagetrain::rng::Rng;
use pagetrain::tensor::DType;
use pagetrain::{Context, ContextOptions};

/// Awkward sizes every kernel must handle.
pub const AWKWARD: &[usize] = &[1, 3, 17, 64, 65, 129, 1000];

/// Whether the adapter has shader-f16, which the f16 tests need. Without it they return early and
/// say so — or fail, under `PAGETRAIN_REQUIRE_F16=1`: CI sets it for its lavapipe run (which has
/// the feature), so a suite that silently stopped running cannot pass there.
pub fn has_f16(ctx: &Context) -> bool {
    let has = ctx.gpu.features.contains(wgpu::Features::SHADER_F16);
    if !has {
        skip_unless_required(
            "PAGETRAIN_REQUIRE_F16",
            &format!("{} has no shader-f16", ctx.gpu.describe()),
            "the f16 tests",
        );
    }
    has
}

/// What cannot run here (`missing` says why) is skipped and says so — unless `var=1`, set where
/// CI has what it needs, makes the skip a failure.
pub fn skip_unless_required(var: &str, missing: &str, skipped: &str) {
    if std::env::var(var).is_ok_and(|v| v == "1") {
        panic!("{var}=1, but {missing}: {skipped} cannot run");
    }
    eprintln!("skipped: {skipped} ({missing})");
}

pub fn ctx() -> Context {
    pollster::block_on(Context::new(&ContextOptions::default())).expect("a GPU adapter (lavapipe in CI)")
}

/// A context on the default adapter whose pager keeps host bytes in memory, under `opts` (a
/// budget, staging slots small enough for tiny models).
pub fn paged_ctx(opts: &pagetrain::pager::PagerOptions) -> Context {
    let gpu =
        pollster::block_on(pagetrain::device::Gpu::new(&Default::default())).expect("a GPU adapter (lavapipe in CI)");
    Context::with_store(gpu, Box::new(pagetrain::pager::MemStore::new()), opts)
}

pub fn randn(rng: &mut Rng, n: usize, std: f32) -> Vec<f32> {
    (0..n).map(|_| rng.normal() * std).collect()
}

pub fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Fails (with the worst index and both values) unless every |got - want| <= atol + rtol·|want|.
/// NaN or infinity in `got` always fails.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}: got non-finite {g} at {i} (want {w})");
        let excess = (g as f64 - w).abs() - (atol + rtol * w.abs());
        if excess > worst.1 || (i == 0 && excess > 0.0) {
            worst = (i, excess);
        }
    }
    let (i, excess) = worst;
    let maxdiff = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max);
    assert!(excess <= 0.0, "{what}: maxdiff {maxdiff:.3e}; worst at {i}: got {} want {}", got[i], want[i]);
}

/// A raw GPU buffer with `n` elements (f32 or f16) to bind plus a tail of canaries that must
/// survive.
pub struct Guarded {
    pub buffer: wgpu::Buffer,
    pub n: usize,
    pub dtype: DType,
}

pub const CANARY: f32 = -7.77e7;
/// The f16 canary: a value no kernel writes (-1234.0).
const CANARY_F16: u16 = 0xE4D2;
const CANARY_LEN: usize = 64;

impl Guarded {
    /// `init`: the values to bind (`None`: NaN poison, so an unwritten output fails).
    pub fn new(ctx: &Context, n: usize, init: Option<&[f32]>) -> Guarded {
        Self::of(ctx, DType::F32, n, init)
    }

    /// Like [`Guarded::new`] in f16: `init` rounded to f16, poison f16 NaN.
    pub fn new_f16(ctx: &Context, n: usize, init: Option<&[f32]>) -> Guarded {
        Self::of(ctx, DType::F16, n, init)
    }

    pub fn of(ctx: &Context, dtype: DType, n: usize, init: Option<&[f32]>) -> Guarded {
        let values: Vec<f32> = match init {
            Some(v) => {
                assert_eq!(v.len(), n);
                v.to_vec()
            }
            None => vec![f32::NAN; n],
        };
        let bytes: Vec<u8> = match dtype {
            DType::F32 => {
                let mut data = values;
                data.extend(std::iter::repeat_n(CANARY, CANARY_LEN));
                bytemuck::cast_slice(&data).to_vec()
            }
            DType::F16 => {
                let mut data: Vec<u16> = values.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
                data.extend(std::iter::repeat_n(CANARY_F16, CANARY_LEN));
                bytemuck::cast_slice(&data).to_vec()
            }
            other => panic!("Guarded holds f32 or f16, not {other:?}"),
        };
        let mut bytes = bytes;
        bytes.resize(bytes.len().div_ceil(4) * 4, 0);
        let buffer = ctx.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("guarded"),
            size: bytes.len() as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        ctx.gpu.queue.write_buffer(&buffer, 0, &bytes);
        Guarded { buffer, n, dtype }
    }

    pub fn from_u32(ctx: &Context, data: &[u32]) -> Guarded {
        let g = Guarded::new(ctx, data.len(), Some(&vec![0.0; data.len()]));
        ctx.gpu.queue.write_buffer(&g.buffer, 0, bytemuck::cast_slice(data));
        g
    }

    /// The binding: exactly `n` elements (rounded up to whole words, as bindings must be).
    pub fn view(&self) -> View {
        let bytes = (self.n.max(1) * self.dtype.size()).div_ceil(4) * 4;
        View { buffer: self.buffer.clone(), offset: 0, size: bytes as u64, dtype: self.dtype }
    }

    /// The bound values as f32; panics if a canary after them was overwritten.
    pub fn read(&self, ctx: &Context) -> Vec<f32> {
        let full = View { buffer: self.buffer.clone(), offset: 0, size: self.buffer.size(), dtype: self.dtype };
        let bytes = pollster::block_on(ctx.kernels.read_view(&full, self.buffer.size())).expect("readback");
        let all: Vec<f32> = match self.dtype {
            DType::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            _ => bytemuck::pod_collect_to_vec(&bytes),
        };
        let canary = if self.dtype == DType::F16 { half::f16::from_bits(CANARY_F16).to_f32() } else { CANARY };
        for (i, &c) in all[self.n..self.n + CANARY_LEN].iter().enumerate() {
            assert_eq!(
                c.to_bits(),
                canary.to_bits(),
                "canary {i} past the end of a {}-element output was overwritten",
                self.n
            );
        }
        all[..self.n].to_vec()
    }
}

/// `v` rounded to f16 and back: what an f16 tensor holds.
pub fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// Central finite differences of a scalar function of `x`, in f64.
pub fn finite_diff(x: &[f64], h: f64, f: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    let every: Vec<usize> = (0..x.len()).collect();
    finite_diff_at(x, &every, h, f)
}

/// [`finite_diff`] at the coordinates `at` only (for inputs too large to perturb every one).
pub fn finite_diff_at(x: &[f64], at: &[usize], h: f64, mut f: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    let mut x = x.to_vec();
    at.iter()
        .map(|&i| {
            let orig = x[i];
            x[i] = orig + h;
            let up = f(&x);
            x[i] = orig - h;
            let down = f(&x);
            x[i] = orig;
            (up - down) / (2.0 * h)
        })
        .collect()
}

/// Σ out·w: the scalar whose gradient with respect to `out` is `w`.
/// AdamW's inputs on random data of length n — weights, gradients, first and (positive) second
/// moments, drawn in that order — and their buffers, beside the clip factor 0.8 the kernel reads.
pub struct AdamWInputs {
    pub p: Vec<f32>,
    pub g: Vec<f32>,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    pub gp: Guarded,
    pub gg: Guarded,
    pub gm: Guarded,
    pub gv: Guarded,
    pub clip: Guarded,
}

impl AdamWInputs {
    pub fn draw(ctx: &Context, rng: &mut Rng, n: usize) -> AdamWInputs {
        let (p, g) = (randn(rng, n, 1.0), randn(rng, n, 1.0));
        let m = randn(rng, n, 0.1);
        let v: Vec<f32> = randn(rng, n, 0.1).iter().map(|x| x * x).collect();
        let on_gpu = |x: &[f32]| Guarded::new(ctx, n, Some(x));
        let (gp, gg, gm, gv) = (on_gpu(&p), on_gpu(&g), on_gpu(&m), on_gpu(&v));
        let clip = Guarded::new(ctx, 2, Some(&[0.8, 0.0]));
        AdamWInputs { p, g, m, v, gp, gg, gm, gv, clip }
    }
}

pub fn dot(out: &[f64], w: &[f64]) -> f64 {
    out.iter().zip(w).map(|(a, b)| a * b).sum()
}

/// LayerNorm forward and backward on random `rows × c` data against the f64 reference, with x,
/// out, dx and dout held as `dt` (f32 or f16, inputs rounded to it); weights, statistics and
/// their gradients are f32. Returns `dout` and its buffer for checks that read it again.
pub fn check_layernorm(ctx: &Context, rng: &mut Rng, dt: DType, rows: usize, c: usize) -> (Vec<f32>, Guarded) {
    let held = |v: Vec<f32>| if dt == DType::F16 { round_f16(&v) } else { v };
    // (rtol, atol) of out and dx: one f16 rounding of each output on top of f32 accumulation
    let ((out_r, out_a), (dx_r, dx_a)) =
        if dt == DType::F16 { ((1.5e-3, 2e-3), (2e-3, 2e-3)) } else { ((1e-4, 1e-4), (1e-3, 1e-3)) };
    let x = held(randn(rng, rows * c, 1.5).iter().map(|v| v + 0.7).collect());
    let (w, b) = (randn(rng, c, 1.0), randn(rng, c, 1.0));
    let (gx, gw, gb) =
        (Guarded::of(ctx, dt, x.len(), Some(&x)), Guarded::new(ctx, c, Some(&w)), Guarded::new(ctx, c, Some(&b)));
    let (out, mean, rstd) =
        (Guarded::of(ctx, dt, rows * c, None), Guarded::new(ctx, rows, None), Guarded::new(ctx, rows, None));
    let k = &ctx.kernels;
    let views = (out.view(), mean.view(), rstd.view(), gx.view(), gw.view(), gb.view());
    pagetrain::kernels::layernorm::forward(
        k, &views.0, &views.1, &views.2, &views.3, &views.4, &views.5, rows, c, 1e-5,
    )
    .unwrap();
    let (wo, wm, wr) = reference::layernorm_forward(&to64(&x), &to64(&w), &to64(&b), rows, c, 1e-5);
    let what = format!("{dt:?} {rows}x{c}");
    assert_close(&format!("layernorm out {what}"), &out.read(ctx), &wo, out_r, out_a);
    assert_close(&format!("layernorm mean {what}"), &mean.read(ctx), &wm, 1e-5, 1e-5);
    assert_close(&format!("layernorm rstd {what}"), &rstd.read(ctx), &wr, 1e-3, 1e-3);

    let dout = held(randn(rng, rows * c, 1.0));
    let gd = Guarded::of(ctx, dt, dout.len(), Some(&dout));
    let (dx, dw, db) = (
        Guarded::of(ctx, dt, rows * c, Some(&vec![0.5; rows * c])),
        Guarded::new(ctx, c, Some(&vec![0.0; c])),
        Guarded::new(ctx, c, Some(&vec![0.0; c])),
    );
    // parameter sums in two stages where the shape calls for it (NaN-poisoned scratch)
    let blocks = pagetrain::kernels::reduce::column_blocks(rows, c);
    let parts = (blocks > 1).then(|| (Guarded::new(ctx, blocks * c, None), Guarded::new(ctx, blocks * c, None)));
    let part_views = parts.as_ref().map(|(a, b)| (a.view(), b.view()));
    let grads = (dx.view(), dw.view(), db.view(), gd.view());
    pagetrain::kernels::layernorm::backward(
        k,
        Some(&grads.0),
        &grads.1,
        &grads.2,
        &grads.3,
        &views.3,
        &views.4,
        &views.1,
        &views.2,
        part_views.as_ref().map(|(a, b)| (a, b)),
        rows,
        c,
    )
    .unwrap();
    let (wdx, wdw, wdb) = reference::layernorm_backward(&to64(&dout), &to64(&x), &to64(&w), rows, c, 1e-5);
    let wdx: Vec<f64> = wdx.iter().map(|v| v + 0.5).collect();
    assert_close(&format!("layernorm dx {what}"), &dx.read(ctx), &wdx, dx_r, dx_a);
    assert_close(&format!("layernorm dw {what}"), &dw.read(ctx), &wdw, 1e-3, 1e-3);
    assert_close(&format!("layernorm db {what}"), &db.read(ctx), &wdb, 1e-4, 1e-4);
    (dout, gd)
}
