//! Attention on cooperative matrices: forward (ragged and whole blocks, f32 and f16 output, its
//! lse) and backward against the reference, and what it refuses.

use super::{common, has_coop, kernels};
use common::reference as r;
use common::{assert_close, ctx, randn, round_f16, to64, Guarded};
use pagetrain::rng::Rng;
use pagetrain::DType;

/// log Σ_j exp(scale·q_i·k_j) over the keys j <= i, per (batch, head, row): the `lse` a forward
/// hands its backward.
fn attention_lse(qkv: &[f64], b: usize, t: usize, c: usize, h: usize) -> Vec<f64> {
    let d = c / h;
    let scale = 1.0 / (d as f64).sqrt();
    let mut lse = Vec::with_capacity(b * h * t);
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let row = |j: usize, part: usize| (bi * t + j) * 3 * c + part * c + hi * d;
                let scores: Vec<f64> = (0..=i)
                    .map(|j| (0..d).map(|dd| qkv[row(i, 0) + dd] * qkv[row(j, 1) + dd]).sum::<f64>() * scale)
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                lse.push(m + scores.iter().map(|s| (s - m).exp()).sum::<f64>().ln());
            }
        }
    }
    lse
}

#[test]
fn coop_attention_matches_reference_forward_and_backward() {
    // T of 1, below one block of 64 rows, ragged last blocks, whole blocks, odd B·H; the output
    // in f32 and in f16; lse against its own reference; the backward accumulating onto dqkv.
    use kernels::attention::{backward_with, forward_with, pick, Dims, Kernel, COOP_HEAD_DIM};
    let ctx = ctx();
    if !has_coop(&ctx) {
        return;
    }
    let mut rng = Rng::new(53);
    let d = COOP_HEAD_DIM;
    for (b, t, h) in [(1, 1, 1), (2, 17, 3), (1, 70, 2), (1, 128, 1), (3, 130, 1), (1, 300, 2)] {
        let c = h * d;
        // (scaled up: softmax rows far from uniform)
        let qkv = round_f16(&randn(&mut rng, b * t * 3 * c, 2.0));
        let q64 = to64(&qkv);
        let (want, want_lse) = (r::attention_forward(&q64, b, t, c, h), attention_lse(&q64, b, t, c, h));
        let gqkv = Guarded::new_f16(&ctx, qkv.len(), Some(&qkv));
        let dims = Dims { b, t, h, d, scale: 1.0 / (d as f32).sqrt() };
        for out_dtype in [DType::F32, DType::F16] {
            let held = |v: Vec<f32>, dt: DType| if dt == DType::F16 { round_f16(&v) } else { v };
            let what = format!("coop attention b{b} t{t} h{h}, out {out_dtype:?}");
            let out = Guarded::of(&ctx, out_dtype, b * t * c, None);
            let lse = Guarded::new(&ctx, b * h * t, None);
            forward_with(&ctx.kernels, Kernel::Coop, &out.view(), &lse.view(), &gqkv.view(), dims).unwrap();
            // probabilities go through f16 on their way to P·V
            assert_close(&what, &out.read(&ctx), &want, 4e-3, 4e-3);
            assert_close(&format!("{what} lse"), &lse.read(&ctx), &want_lse, 1e-5, 1e-4);
            // the backward on tensor cores (dout and dqkv in the output's type, dqkv accumulating
            // onto random values) and, on f32 operands, the adapter's other backward: both take
            // this forward's out and lse
            let dout = held(randn(&mut rng, b * t * c, 1.0), out_dtype);
            let dqkv0 = held(randn(&mut rng, qkv.len(), 1.0), out_dtype);
            let want_d: Vec<f64> = r::attention_backward(&q64, &to64(&dout), b, t, c, h)
                .iter()
                .zip(&dqkv0)
                .map(|(g, &g0)| g + g0 as f64)
                .collect();
            let f32_qkv = Guarded::new(&ctx, qkv.len(), Some(&qkv));
            let mut runs = vec![(Kernel::Coop, &gqkv)];
            if out_dtype == DType::F32 {
                runs.push((pick(&ctx.kernels, d, true), &f32_qkv));
            }
            for (kernel, q) in runs {
                let gd = Guarded::of(&ctx, out_dtype, dout.len(), Some(&dout));
                let gdq = Guarded::of(&ctx, out_dtype, qkv.len(), Some(&dqkv0));
                let delta = Guarded::new(&ctx, b * h * t, None);
                let v = |g: &Guarded| g.view();
                backward_with(
                    &ctx.kernels,
                    kernel,
                    &v(&gdq),
                    &v(&delta),
                    &v(q),
                    &v(&out),
                    &v(&gd),
                    &v(&lse),
                    dims,
                    true,
                )
                .unwrap();
                // (an f16 out carries its rounding into delta = Σ dout·out, and from there into
                // every score gradient of its row: measured worst 1.1e-2 on the H200)
                let atol = if out_dtype == DType::F16 { 2e-2 } else { 1e-2 };
                assert_close(&format!("{what} dqkv ({kernel:?})"), &gdq.read(&ctx), &want_d, 1e-2, atol);
            }
            // into a new gradient: dqkv overwritten, not read (poisoned)
            assert!(kernels::attention::overwrites(&ctx.kernels, DType::F16, d));
            let gd = Guarded::of(&ctx, out_dtype, dout.len(), Some(&dout));
            let gdq = Guarded::of(&ctx, out_dtype, qkv.len(), Some(&vec![f32::NAN; qkv.len()]));
            let delta = Guarded::new(&ctx, b * h * t, None);
            let (v_dq, v_delta, v_q, v_out, v_d, v_lse) =
                (gdq.view(), delta.view(), gqkv.view(), out.view(), gd.view(), lse.view());
            kernels::attention::backward(&ctx.kernels, &v_dq, &v_delta, &v_q, &v_out, &v_d, &v_lse, dims, false)
                .unwrap();
            let want_new = r::attention_backward(&q64, &to64(&dout), b, t, c, h);
            let atol = if out_dtype == DType::F16 { 2e-2 } else { 1e-2 };
            assert_close(&format!("{what} new dqkv"), &gdq.read(&ctx), &want_new, 1e-2, atol);
        }
    }
}

#[test]
fn coop_attention_refuses_what_it_cannot_run() {
    // Runs everywhere: f32 qkv, other head sizes and adapters without cooperative matrices are
    // errors naming the kernel; the automatic forward takes it exactly for f16 qkv of head size 64
    // where the adapter runs it.
    use kernels::attention::{backward_with, coop_supported, forward, forward_with, Dims, Kernel};
    let ctx = ctx();
    let g = Guarded::new(&ctx, 3 * 64 * 2, Some(&vec![0.5; 3 * 64 * 2]));
    let dims = |d| Dims { b: 1, t: 2, h: 1, d, scale: 0.125 };
    let run = |dims: Dims| forward_with(&ctx.kernels, Kernel::Coop, &g.view(), &g.view(), &g.view(), dims);
    let err = run(dims(32)).unwrap_err().to_string();
    assert!(err.contains("Coop") && err.contains("head size"), "{err}");
    if coop_supported(&ctx.kernels) {
        let err = run(dims(64)).unwrap_err().to_string();
        assert!(err.contains("f16 qkv"), "{err}");
    } else {
        assert!(run(dims(64)).unwrap_err().to_string().contains("cooperative matrices"));
    }
    let v = g.view();
    let err = backward_with(&ctx.kernels, Kernel::Coop, &v, &v, &v, &v, &v, &v, dims(64), true);
    assert!(err.unwrap_err().to_string().contains("Coop"));
    // only the coop kernels overwrite a new dqkv; the others add to it, and refuse to overwrite
    let overwrites = kernels::attention::overwrites(&ctx.kernels, DType::F32, 64);
    assert!(!overwrites, "f32 qkv never takes the coop kernels");
    let err = kernels::attention::backward(&ctx.kernels, &v, &v, &v, &v, &v, &v, dims(64), false);
    assert!(err.unwrap_err().to_string().contains("cannot overwrite"));
    // the automatic forward on f16 qkv gives the reference result whichever kernel it takes
    if !ctx.gpu.features.contains(wgpu::Features::SHADER_F16) {
        eprintln!("skipped the f16 half: {} has no shader-f16", ctx.gpu.describe());
        return;
    }
    let mut rng = Rng::new(59);
    let (b, t, h, d) = (1, 9, 1, 64);
    let qkv = round_f16(&randn(&mut rng, b * t * 3 * h * d, 1.0));
    let gqkv = Guarded::new_f16(&ctx, qkv.len(), Some(&qkv));
    let (out, lse) = (Guarded::new(&ctx, b * t * h * d, None), Guarded::new(&ctx, b * h * t, None));
    forward(&ctx.kernels, &out.view(), &lse.view(), &gqkv.view(), Dims { b, t, h, d, scale: 0.125 }).unwrap();
    let want = r::attention_forward(&to64(&qkv), b, t, h * d, h);
    assert_close("automatic f16 attention", &out.read(&ctx), &want, 4e-3, 4e-3);
}
