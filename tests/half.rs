//! Mixed precision: every kernel family that takes f16 bindings, with f16 and f32 operands mixed,
//! against its CPU f64 reference on the f16-rounded inputs. f16 outputs are NaN-poisoned and
//! canary-guarded like f32 ones. On an adapter without shader-f16 the tests say so and pass,
//! unless `PAGETRAIN_REQUIRE_F16=1` (CI's lavapipe run) makes that a failure.

mod common;

use common::reference as r;
use common::{assert_close, ctx, has_f16, randn, round_f16, to64, AdamWInputs, Guarded};
use pagetrain::kernels::{self, activation::Activation, matmul::Gemm, reduce::SumSpec, MatmulVariant};
use pagetrain::rng::Rng;
use pagetrain::DType;

/// f16 keeps 11 significant bits: a result rounded to f16 is within 2^-11 of the exact value.
const F16_RTOL: f64 = 1.5e-3;

fn dtype(f16: bool) -> DType {
    if f16 {
        DType::F16
    } else {
        DType::F32
    }
}

/// `v` as the operand of element type `dt` holds it.
fn held(v: &[f32], dt: DType) -> Vec<f32> {
    if dt == DType::F16 {
        round_f16(v)
    } else {
        v.to_vec()
    }
}

#[test]
fn matmul_with_every_mix_of_f16_operands_matches_reference() {
    let ctx = ctx();
    if !has_f16(&ctx) {
        return;
    }
    let mut rng = Rng::new(31);
    for (i, &(m, n, k)) in [(3, 65, 17), (65, 3, 129), (17, 100, 64)].iter().enumerate() {
        for mix in 0..8u32 {
            let (tc, ta, tb) = (dtype(mix & 1 != 0), dtype(mix & 2 != 0), dtype(mix & 4 != 0));
            for variant in [MatmulVariant::Tiled, MatmulVariant::Direct, MatmulVariant::Large] {
                let (trans_a, trans_b, accumulate) = (i == 1, mix % 3 == 1, mix % 2 == 0);
                let a = held(&randn(&mut rng, m * k, 1.0), ta);
                let b = held(&randn(&mut rng, k * n, 1.0), tb);
                let bias = randn(&mut rng, n, 1.0);
                let c0 = held(&randn(&mut rng, m * n, 1.0), tc);
                let (ga, gb, gbias) = (
                    Guarded::of(&ctx, ta, a.len(), Some(&a)),
                    Guarded::of(&ctx, tb, b.len(), Some(&b)),
                    Guarded::new(&ctx, n, Some(&bias)),
                );
                let gc = Guarded::of(&ctx, tc, c0.len(), if accumulate { Some(&c0) } else { None });
                let g = Gemm { trans_a, trans_b, alpha: 0.75, beta: accumulate as u8 as f32, ..Gemm::new(m, n, k) };
                kernels::matmul::matmul_variant(
                    &ctx.kernels,
                    variant,
                    &gc.view(),
                    &ga.view(),
                    &gb.view(),
                    Some(&gbias.view()),
                    &gbias.view(),
                    g,
                )
                .unwrap();
                let mut want = r::matmul_forward(
                    &to64(&a),
                    &to64(&b),
                    Some(&to64(&bias)),
                    1,
                    m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                    true,
                    0.75,
                );
                if accumulate {
                    want.iter_mut().zip(&c0).for_each(|(w, c)| *w += *c as f64);
                }
                let rtol = if tc == DType::F16 { F16_RTOL } else { 1e-4 };
                assert_close(
                    &format!("matmul {variant:?} {m}x{n}x{k} c {tc:?} a {ta:?} b {tb:?}"),
                    &gc.read(&ctx),
                    &want,
                    rtol,
                    1e-4 * (k as f64).sqrt(),
                );
            }
        }
    }
}

#[test]
fn elementwise_kernels_take_f16_on_either_side() {
    let ctx = ctx();
    if !has_f16(&ctx) {
        return;
    }
    let mut rng = Rng::new(32);
    for &n in &[1usize, 3, 17, 1000] {
        for mix in 0..4u32 {
            let (to, ti) = (dtype(mix & 1 != 0), dtype(mix & 2 != 0));
            let a = held(&randn(&mut rng, n, 1.0), ti);
            let b = randn(&mut rng, n, 1.0);
            let y0 = held(&randn(&mut rng, n, 1.0), to);
            let rtol = if to == DType::F16 { F16_RTOL } else { 1e-6 };
            let (ga, gb) = (Guarded::of(&ctx, ti, n, Some(&a)), Guarded::new(&ctx, n, Some(&b)));

            let out = Guarded::of(&ctx, to, n, None);
            kernels::elementwise::add_forward(&ctx.kernels, &out.view(), &ga.view(), &gb.view(), n).unwrap();
            let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| *x as f64 + *y as f64).collect();
            assert_close(&format!("add {n} out {to:?} a {ti:?}"), &out.read(&ctx), &want, rtol, 1e-6);

            let y = Guarded::of(&ctx, to, n, Some(&y0));
            kernels::elementwise::axpy(&ctx.kernels, &y.view(), &ga.view(), -0.5, n).unwrap();
            let want: Vec<f64> = y0.iter().zip(&a).map(|(y, x)| *y as f64 - 0.5 * *x as f64).collect();
            assert_close(&format!("axpy {n} y {to:?} x {ti:?}"), &y.read(&ctx), &want, rtol, 1e-6);

            let out = Guarded::of(&ctx, to, n, None);
            kernels::elementwise::cast(&ctx.kernels, &out.view(), &ga.view(), n).unwrap();
            assert_close(&format!("cast {n} {ti:?} -> {to:?}"), &out.read(&ctx), &to64(&a), rtol, 1e-7);
        }
    }
}

#[test]
fn gelu_layernorm_and_sums_match_reference_in_f16() {
    let ctx = ctx();
    if !has_f16(&ctx) {
        return;
    }
    let mut rng = Rng::new(33);
    for &n in &[1usize, 17, 1000] {
        let x = round_f16(&randn(&mut rng, n, 2.0));
        let dout = round_f16(&randn(&mut rng, n, 1.0));
        let (gx, gd) = (Guarded::new_f16(&ctx, n, Some(&x)), Guarded::new_f16(&ctx, n, Some(&dout)));
        let out = Guarded::new_f16(&ctx, n, None);
        kernels::activation::forward(&ctx.kernels, Activation::Gelu, &out.view(), &gx.view(), n).unwrap();
        assert_close(&format!("gelu f16 {n}"), &out.read(&ctx), &r::gelu_forward(&to64(&x)), F16_RTOL, 1e-4);
        let dx = Guarded::new_f16(&ctx, n, Some(&vec![0.5; n]));
        kernels::activation::backward(&ctx.kernels, Activation::Gelu, &dx.view(), &gx.view(), &gd.view(), n, true)
            .unwrap();
        let want: Vec<f64> = r::gelu_backward(&to64(&x), &to64(&dout)).iter().map(|g| g + 0.5).collect();
        assert_close(&format!("gelu backward f16 {n}"), &dx.read(&ctx), &want, F16_RTOL, 1e-3);
    }
    // short rows (thread per row), rows held in registers and wide rows (workgroup per row)
    // (1100, 3): parameter and bias sums in two stages
    for &(rows, c) in &[(3, 17), (2, 65), (5, 129), (3, 1000), (1100, 3), (5, 768), (2, 2100)] {
        let (dout, gd) = common::check_layernorm(&ctx, &mut rng, DType::F16, rows, c);

        // bias gradients and loss sums read f16 and add in f32
        let sums = Guarded::new(&ctx, c, Some(&vec![1.0; c]));
        let parts = Guarded::new(&ctx, kernels::reduce::column_blocks(rows, c) * c, None);
        kernels::reduce::sum_rows(&ctx.kernels, &sums.view(), &gd.view(), Some(&parts.view()), rows, c).unwrap();
        let want: Vec<f64> = r::sum_rows(&to64(&dout), rows, c).iter().map(|v| v + 1.0).collect();
        assert_close(&format!("sum_rows f16 {rows}x{c}"), &sums.read(&ctx), &want, 1e-5, 1e-5);
        let (total, partials) = (Guarded::new(&ctx, 1, None), Guarded::new(&ctx, kernels::reduce::MAX_PARTIALS, None));
        let spec = SumSpec { squares: true, scale: 1.0, slot: 0, accumulate: false };
        kernels::reduce::sum(&ctx.kernels, &total.view(), &gd.view(), &partials.view(), dout.len(), spec).unwrap();
        assert_close(
            &format!("sum of squares f16 {rows}x{c}"),
            &total.read(&ctx),
            &[r::sum_forward(&to64(&dout), true)],
            1e-5,
            1e-5,
        );
    }
}

#[test]
fn attention_in_f16_matches_reference_and_the_f32_backward() {
    let ctx = ctx();
    if !has_f16(&ctx) {
        return;
    }
    let mut rng = Rng::new(34);
    for &(b, t, h, d) in &[(1, 5, 1, 8), (2, 70, 2, 64), (1, 33, 3, 24)] {
        let c = h * d;
        let qkv = round_f16(&randn(&mut rng, b * t * 3 * c, 1.0));
        let dims = kernels::attention::Dims { b, t, h, d, scale: 1.0 / (d as f32).sqrt() };
        let want = r::attention_forward(&to64(&qkv), b, t, c, h);
        let dout = round_f16(&randn(&mut rng, b * t * c, 1.0));
        // the same inputs through the f32 kernels (checked against finite differences) and the f16
        // ones, on each backward kernel: per row (at 8 and 64: lavapipe compiles it slowly at 24)
        // and blocked where its tile fits, and on 2 lanes a row (not at 24 either) where the adapter
        // has subgroups
        use kernels::attention::{blocked_workgroup_bytes, lanes_supported, Kernel, BLOCKED_BACKWARD_TILE};
        let limit = ctx.gpu.limits.max_compute_workgroup_storage_size as u64;
        let blocked = Kernel::Blocked { tile: BLOCKED_BACKWARD_TILE };
        let fits = blocked_workgroup_bytes(d, BLOCKED_BACKWARD_TILE) <= limit;
        let lanes = (d != 24 && lanes_supported(&ctx.gpu, 2)).then_some(Kernel::Lanes { lanes: 2 });
        let backward_kernels = [(d != 24).then_some(Kernel::Rows), fits.then_some(blocked), lanes];
        for kernel in backward_kernels.into_iter().flatten() {
            let mut dqkv = Vec::new();
            for dt in [DType::F32, DType::F16] {
                let gqkv = Guarded::of(&ctx, dt, qkv.len(), Some(&qkv));
                let (out, lse) = (Guarded::of(&ctx, dt, b * t * c, None), Guarded::new(&ctx, b * h * t, None));
                kernels::attention::forward(&ctx.kernels, &out.view(), &lse.view(), &gqkv.view(), dims).unwrap();
                let got = out.read(&ctx);
                assert_close(&format!("attention {dt:?} b{b} t{t} h{h} d{d}"), &got, &want, F16_RTOL, 1e-3);
                let gd = Guarded::of(&ctx, dt, dout.len(), Some(&dout));
                let gdq = Guarded::of(&ctx, dt, qkv.len(), Some(&vec![0.25; qkv.len()]));
                let delta = Guarded::new(&ctx, b * h * t, None);
                kernels::attention::backward_with(
                    &ctx.kernels,
                    kernel,
                    &gdq.view(),
                    &delta.view(),
                    &gqkv.view(),
                    &out.view(),
                    &gd.view(),
                    &lse.view(),
                    dims,
                    true,
                )
                .unwrap();
                dqkv.push(gdq.read(&ctx));
            }
            assert_close(
                &format!("attention backward {kernel:?} f16 vs f32 b{b} t{t} h{h} d{d}"),
                &dqkv[1],
                &to64(&dqkv[0]),
                1e-2,
                5e-3,
            );
        }
    }
}

#[test]
fn adamw_writes_the_f16_weight_copy_with_the_update() {
    let ctx = ctx();
    if !has_f16(&ctx) {
        return;
    }
    let mut rng = Rng::new(35);
    for &n in &[1usize, 3, 1000] {
        let AdamWInputs { p, g, m, v, gp, gg, gm, gv, clip } = AdamWInputs::draw(&ctx, &mut rng, n);
        let half = Guarded::new_f16(&ctx, n, None);
        let s = kernels::optim::AdamWStep {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            t: 3,
            grad_scale: 0.5,
        };
        let views = (gp.view(), gm.view(), gv.view(), gg.view(), clip.view(), half.view());
        kernels::optim::adamw(&ctx.kernels, &views.0, &views.1, &views.2, &views.3, &views.4, Some(&views.5), n, s)
            .unwrap();
        let g_scaled: Vec<f64> = g.iter().map(|x| *x as f64 * 0.5).collect();
        let (wp, wm, _) =
            r::adamw_update(&to64(&p), &g_scaled, &to64(&m), &to64(&v), 0.01, 0.9, 0.95, 1e-8, 0.1, 3, 0.8);
        let new_p = gp.read(&ctx);
        assert_close(&format!("adamw half p {n}"), &new_p, &wp, 1e-5, 1e-6);
        assert_close(&format!("adamw half m {n}"), &gm.read(&ctx), &wm, 1e-5, 1e-7);
        assert_close(&format!("adamw half copy {n}"), &half.read(&ctx), &to64(&round_f16(&new_p)), 0.0, 0.0);
    }
}

#[test]
fn cross_entropy_reads_f32_or_f16_logits_and_writes_f16_dlogits() {
    // Mixed precision's head makes its logits in f16 (ops::logits_dtype): the loss, the
    // log-sum-exps and dlogits from them, summed in f32, against the f64 reference on the same
    // (f16-rounded) logits; poisoned outputs, rows of one thread and of a workgroup, ignored rows.
    let ctx = ctx();
    if !has_f16(&ctx) {
        return;
    }
    let mut rng = Rng::new(31);
    let ignore = u32::MAX;
    for &(rows, v) in &[(1, 1), (3, 17), (17, 1000), (129, 3)] {
        for f16_logits in [false, true] {
            let logits = randn(&mut rng, rows * v, 2.0);
            let logits = if f16_logits { round_f16(&logits) } else { logits };
            let targets: Vec<u32> = (0..rows).map(|i| if i % 4 == 3 { ignore } else { rng.below(v) as u32 }).collect();
            let gl = match f16_logits {
                true => Guarded::new_f16(&ctx, logits.len(), Some(&logits)),
                false => Guarded::new(&ctx, logits.len(), Some(&logits)),
            };
            let gt = Guarded::from_u32(&ctx, &targets);
            let poison = vec![-7.5; rows];
            let (losses, lse) = (Guarded::new(&ctx, rows, Some(&poison)), Guarded::new(&ctx, rows, Some(&poison)));
            let r = kernels::cross_entropy::Rows { rows, v, ignore, row0: 0 };
            kernels::cross_entropy::forward(&ctx.kernels, &losses.view(), &lse.view(), &gl.view(), &gt.view(), r)
                .unwrap();
            let what = format!("{rows}x{v}, f16 logits {f16_logits}");
            let logits64 = to64(&logits);
            let (want_losses, _) = r::cross_entropy_forward(&logits64, &targets, v, ignore);
            assert_close(&format!("losses {what}"), &losses.read(&ctx), &want_losses, 1e-5, 1e-5);
            let want_lse: Vec<f64> = logits64.chunks(v).map(r::log_sum_exp).collect();
            assert_close(&format!("lse {what}"), &lse.read(&ctx), &want_lse, 1e-5, 1e-5);
            let count = targets.iter().filter(|&&t| t != ignore).count().max(1);
            // a loss scale's worth of dloss, as mixed precision sends it
            let dloss = Guarded::new(&ctx, 1, Some(&[4096.0]));
            let d = Guarded::new_f16(&ctx, rows * v, Some(&vec![0.25; rows * v]));
            let (dv, lv, tv, sv, gv) = (d.view(), gl.view(), gt.view(), lse.view(), dloss.view());
            kernels::cross_entropy::backward(&ctx.kernels, &dv, &lv, &tv, &sv, &gv, r, 1.0 / count as f32).unwrap();
            let want: Vec<f64> =
                r::cross_entropy_backward(&logits64, &targets, v, ignore, 4096.0).iter().map(|g| g + 0.25).collect();
            assert_close(&format!("f16 dlogits {what}"), &d.read(&ctx), &want, 2e-3, 1e-3);
        }
    }
}

/// `got`, an f16 gradient, holds `a` times the scale its sum of squares `ss` picks (each within
/// an f16 step), and with `tail` that scale's exponent and 0 after them.
fn check_scaled(what: &str, got: &[f32], a: &[f32], ss: f32, tail: bool) {
    use pagetrain::optim::{grad_half_scale, split_tail, unscale_of};
    let n = a.len();
    let s = grad_half_scale(ss) as f64;
    for (i, (&got, &x)) in got.iter().zip(a).enumerate() {
        let exact = x as f64 * s;
        assert!(got.is_finite(), "{what} element {i}: {x} · {s} gave {got}");
        let off = (got as f64 - exact).abs();
        assert!(off <= f16_ulp(exact), "{what} element {i}: {x} · {s} = {exact}, got {got}");
    }
    if tail {
        assert_eq!(got[n], s.log2() as f32, "{what}: the exponent after the values");
        assert_eq!(got[n + 1], 0.0, "{what}: the value after the exponent");
        let bytes: Vec<u8> = got.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        let (values, unscale) = split_tail(&bytes, n).unwrap();
        assert_eq!((values.len(), unscale.to_bits()), (2 * n, unscale_of(ss).to_bits()), "{what}");
    }
}

/// The gap between f16 values around `x` (subnormal spacing below 2^-14).
fn f16_ulp(x: f64) -> f64 {
    2f64.powi((x.abs().max(2f64.powi(-14))).log2().floor() as i32 - 10)
}

#[test]
fn gradients_go_to_f16_times_the_power_of_two_their_sum_of_squares_picks() {
    use pagetrain::optim::{grad_half_scale, EXPONENT_TAIL};
    // The root of the sum lands in [2^14, 2^15): no element (at most the root) reaches f16's
    // 65504, and the largest keep all of f16's bits.
    let mut rng = Rng::new(41);
    let mut sums: Vec<f32> = vec![1e-30, 3.7e-12, 0.5, 1.0, 2.0, 3.99, 4.0, 12345.6, 1e20, 3e38];
    sums.extend((0..200).map(|_| 10f32.powf(rng.uniform() * 70.0 - 35.0)));
    for &ss in &sums {
        let s = grad_half_scale(ss);
        assert_eq!(s.to_bits() & 0x7f_ffff, 0, "{ss}: scale {s} is not a power of two");
        let root = (ss as f64).sqrt() * s as f64;
        assert!((16384.0..32768.0).contains(&root), "{ss}: scale {s} puts the root at {root}");
    }
    for special in [0.0, f32::INFINITY, f32::NAN, 1e-40] {
        assert_eq!(grad_half_scale(special), 1.0, "{special}");
    }
    let ctx = ctx();
    if !has_f16(&ctx) {
        return;
    }
    for &n in &[1usize, 3, 1000, 4099] {
        // tiny gradients would lose their bits in f16, large ones overflow it, unscaled
        for std in [1e-6f32, 1.0, 3e4, 2e7] {
            let a = randn(&mut rng, n, std);
            let ss = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>() as f32;
            // the sum in slot 2, the other slots values that would pick other scales
            let slots = [7.0, 1e30, ss, 1e-20];
            let (ga, gs) = (Guarded::new(&ctx, n, Some(&a)), Guarded::new(&ctx, 4, Some(&slots)));
            // Without the tail, n values (the guards catch a write past them); with it, n + 2:
            // the same values, then the scale's exponent and 0.
            for tail in [false, true] {
                let len = n + if tail { EXPONENT_TAIL } else { 0 };
                let out = Guarded::new_f16(&ctx, len, None);
                kernels::elementwise::convert_scaled(&ctx.kernels, &out.view(), &ga.view(), &gs.view(), 2, n, tail)
                    .unwrap();
                check_scaled(&format!("n {n} std {std}"), &out.read(&ctx), &a, ss, tail);
            }
            // Small gradients in one dispatch: the sum of squares taken into slot 1 (the rest
            // kept), and the values scaled by what it picks.
            let gs = Guarded::new(&ctx, 4, Some(&[7.0, -3.0, 1e-20, 5.0]));
            let out = Guarded::new_f16(&ctx, n + EXPONENT_TAIL, None);
            kernels::elementwise::convert_scaled_summed(&ctx.kernels, &out.view(), &ga.view(), &gs.view(), 1, n, true)
                .unwrap();
            let sums = gs.read(&ctx);
            let what = format!("summed, n {n} std {std}");
            assert_close(&format!("{what}: the sum"), &sums[1..2], &[ss as f64], 1e-5, 0.0);
            assert_eq!([sums[0], sums[2], sums[3]], [7.0, 1e-20, 5.0], "{what}: the other slots");
            check_scaled(&what, &out.read(&ctx), &a, sums[1], true);
        }
    }
    let too_long = kernels::reduce::ONE_STAGE + 1;
    let (ga, gs) = (Guarded::new(&ctx, too_long, Some(&vec![1.0; too_long])), Guarded::new(&ctx, 1, Some(&[2.0])));
    let out = Guarded::new_f16(&ctx, too_long + EXPONENT_TAIL, None);
    let e = kernels::elementwise::convert_scaled_summed(
        &ctx.kernels,
        &out.view(),
        &ga.view(),
        &gs.view(),
        0,
        too_long,
        true,
    )
    .unwrap_err();
    assert!(e.to_string().contains("convert_scaled_summed"), "{e}");
    // An overflowed gradient stays one: its sum is infinite, the scale 1, the values as they are.
    let a = vec![1e5f32, -2.0, f32::INFINITY];
    let (ga, gs) = (Guarded::new(&ctx, 3, Some(&a)), Guarded::new(&ctx, 1, Some(&[f32::INFINITY])));
    let out = Guarded::new_f16(&ctx, 3, None);
    kernels::elementwise::convert_scaled(&ctx.kernels, &out.view(), &ga.view(), &gs.view(), 0, 3, false).unwrap();
    let got = out.read(&ctx);
    assert!(got[0].is_infinite() && got[1] == -2.0 && got[2].is_infinite(), "{got:?}");
}
