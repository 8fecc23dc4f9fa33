//! Elementwise, activations, LayerNorm, softmax, embedding and cross-entropy against the
//! reference; normal draws against the host.

use super::*;

#[test]
fn elementwise_kernels_match_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(2);
    // (past 2048: more than one workgroup of the kernels that take 8 elements a thread)
    for &n in AWKWARD.iter().chain(&[2049, 70_001]) {
        let a = randn(&mut rng, n, 1.0);
        let b = randn(&mut rng, n, 1.0);
        let (ga, gb) = (Guarded::new(&ctx, n, Some(&a)), Guarded::new(&ctx, n, Some(&b)));
        let out = Guarded::new(&ctx, n, None);
        kernels::elementwise::add_forward(&ctx.kernels, &out.view(), &ga.view(), &gb.view(), n).unwrap();
        let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (*x + *y) as f64).collect();
        assert_close(&format!("add {n}"), &out.read(&ctx), &want, 1e-6, 0.0);

        let y = Guarded::new(&ctx, n, Some(&b));
        kernels::elementwise::axpy(&ctx.kernels, &y.view(), &ga.view(), -1.5, n).unwrap();
        let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| *y as f64 - 1.5 * *x as f64).collect();
        // (absolute error: a couple of ulps of operands up to about 5 in size)
        assert_close(&format!("axpy {n}"), &y.read(&ctx), &want, 1e-6, 1e-6);

        let out = Guarded::new(&ctx, n, None);
        kernels::elementwise::scale_forward(&ctx.kernels, &out.view(), &ga.view(), 0.3, n).unwrap();
        let want: Vec<f64> = a.iter().map(|x| 0.3 * *x as f64).collect();
        assert_close(&format!("scale {n}"), &out.read(&ctx), &want, 1e-6, 0.0);

        let s = Guarded::new(&ctx, 1, Some(&[2.5]));
        let y = Guarded::new(&ctx, n, Some(&b));
        kernels::elementwise::axpy_scalar(&ctx.kernels, &y.view(), &s.view(), 0.5, n).unwrap();
        let want: Vec<f64> = b.iter().map(|y| *y as f64 + 1.25).collect();
        assert_close(&format!("axpy_scalar {n}"), &y.read(&ctx), &want, 1e-6, 1e-7);
    }
}

#[test]
fn normal_draws_match_the_host_recomputation_and_are_standard_normal() {
    let ctx = ctx();
    for (&n, &seed) in AWKWARD.iter().zip([7u64, u64::MAX, 1 << 40, 0x1234_5678_9abc].iter().cycle()) {
        let out = Guarded::new(&ctx, n, None);
        kernels::elementwise::fill_normal(&ctx.kernels, &out.view(), 0.02, seed, n).unwrap();
        let want: Vec<f64> = (0..n as u32).map(|i| 0.02 * pagetrain::rng::counter_normal(seed, i) as f64).collect();
        // the adapter's log and cos differ from the host's in the last bits
        assert_close(&format!("fill_normal {n}"), &out.read(&ctx), &want, 1e-4, 1e-7);
    }
    // 200 000 draws: mean 0 and variance 1 within a few standard errors, and another seed
    // draws other numbers
    let n = 200_000;
    let (a, b) = (Guarded::new(&ctx, n, None), Guarded::new(&ctx, n, None));
    kernels::elementwise::fill_normal(&ctx.kernels, &a.view(), 1.0, 1, n).unwrap();
    kernels::elementwise::fill_normal(&ctx.kernels, &b.view(), 1.0, 2, n).unwrap();
    let (a, b) = (to64(&a.read(&ctx)), to64(&b.read(&ctx)));
    let mean = a.iter().sum::<f64>() / n as f64;
    let var = a.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
    let beyond_3 = a.iter().filter(|x| x.abs() > 3.0).count() as f64 / n as f64;
    assert!(mean.abs() < 0.01, "mean {mean}");
    assert!((var - 1.0).abs() < 0.02, "variance {var}");
    assert!((beyond_3 - 0.0027).abs() < 0.001, "share beyond 3 sigma {beyond_3}");
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same < 10, "{same} equal draws under two seeds");
}

#[test]
fn large_elementwise_uses_a_folded_grid() {
    // More than 65535 workgroups of 256: the 2-D grid must still cover every element exactly once.
    let ctx = ctx();
    let n = 65536 * 256 + 777;
    let x: Vec<f32> = (0..n).map(|i| (i % 1013) as f32 * 0.01 - 3.0).collect();
    let gx = Guarded::new(&ctx, n, Some(&x));
    let out = Guarded::new(&ctx, n, None);
    kernels::elementwise::scale_forward(&ctx.kernels, &out.view(), &gx.view(), 2.0, n).unwrap();
    let want: Vec<f64> = x.iter().map(|v| 2.0 * *v as f64).collect();
    assert_close("scale folded", &out.read(&ctx), &want, 1e-6, 0.0);
}

#[test]
fn activations_match_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(3);
    for &n in AWKWARD.iter().chain(&[2049, 70_001]) {
        let mut x = randn(&mut rng, n, 2.0);
        if n > 3 {
            x[0] = 40.0; // saturated tanh must stay finite
            x[1] = -40.0;
        }
        let dout = randn(&mut rng, n, 1.0);
        let dx0 = randn(&mut rng, n, 1.0);
        for (f, fwd, bwd) in [
            (
                Activation::Gelu,
                r::gelu_forward as fn(&[f64]) -> Vec<f64>,
                r::gelu_backward as fn(&[f64], &[f64]) -> Vec<f64>,
            ),
            (Activation::Relu, r::relu_forward, r::relu_backward),
        ] {
            let gx = Guarded::new(&ctx, n, Some(&x));
            let out = Guarded::new(&ctx, n, None);
            kernels::activation::forward(&ctx.kernels, f, &out.view(), &gx.view(), n).unwrap();
            assert_close(&format!("{f:?} forward {n}"), &out.read(&ctx), &fwd(&to64(&x)), 1e-5, 1e-6);

            let gd = Guarded::new(&ctx, n, Some(&dout));
            let dx = Guarded::new(&ctx, n, Some(&dx0));
            kernels::activation::backward(&ctx.kernels, f, &dx.view(), &gx.view(), &gd.view(), n, true).unwrap();
            let grad = bwd(&to64(&x), &to64(&dout));
            let want: Vec<f64> = grad.iter().zip(&dx0).map(|(g, d)| g + *d as f64).collect();
            // (absolute error of f32 sums of terms up to about 5 in size: a few of their ulps)
            assert_close(&format!("{f:?} backward {n}"), &dx.read(&ctx), &want, 1e-5, 1e-5);
            // overwriting a new gradient: dx is not read (poisoned)
            let dx = Guarded::new(&ctx, n, Some(&vec![f32::NAN; n]));
            kernels::activation::backward(&ctx.kernels, f, &dx.view(), &gx.view(), &gd.view(), n, false).unwrap();
            // (absolute error as in the accumulating check, whose sums are about 1 in size)
            assert_close(&format!("{f:?} backward {n}, overwriting"), &dx.read(&ctx), &grad, 1e-5, 1e-5);
        }
    }
}

#[test]
fn layernorm_matches_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(4);
    // (1100, 3) and (2049, 300) take the two-stage parameter sums; up to 128 columns a thread
    // per row, up to 2048 four rows a workgroup held in registers (rows not a multiple of four),
    // past that a workgroup per row
    for &(rows, c) in
        &[(1, 1), (3, 17), (17, 64), (2, 65), (5, 129), (3, 1000), (1100, 3), (2049, 300), (6, 2048), (3, 2100)]
    {
        common::check_layernorm(&ctx, &mut rng, pagetrain::DType::F32, rows, c);
    }
}

#[test]
fn softmax_matches_reference_plain_and_causal() {
    let ctx = ctx();
    let mut rng = Rng::new(5);
    for &(rows, len, causal) in
        &[(1, 1, 0), (3, 17, 0), (17, 1000, 0), (64, 65, 0), (2 * 17, 17, 17), (3 * 129, 129, 129), (4, 64, 64)]
    {
        let x = randn(&mut rng, rows * len, 3.0);
        let scale = if causal > 0 { 0.37 } else { 1.0 };
        let gx = Guarded::new(&ctx, x.len(), Some(&x));
        let y = Guarded::new(&ctx, x.len(), None);
        kernels::softmax::forward(&ctx.kernels, &y.view(), &gx.view(), rows, len, causal, scale).unwrap();
        let wy = r::softmax_forward(&to64(&x), rows, len, causal, scale as f64);
        let gy = y.read(&ctx);
        assert_close(&format!("softmax {rows}x{len} causal={causal}"), &gy, &wy, 1e-4, 1e-6);

        let dy = randn(&mut rng, x.len(), 1.0);
        let gdy = Guarded::new(&ctx, x.len(), Some(&dy));
        let dx = Guarded::new(&ctx, x.len(), Some(&vec![0.0; x.len()]));
        kernels::softmax::backward(&ctx.kernels, &dx.view(), &y.view(), &gdy.view(), rows, len, causal, scale).unwrap();
        let wdx = r::softmax_backward(&wy, &to64(&dy), rows, len, scale as f64);
        assert_close(&format!("softmax backward {rows}x{len}"), &dx.read(&ctx), &wdx, 1e-4, 1e-5);
    }
}

#[test]
fn embedding_matches_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(6);
    // 300 rows of 7 tokens: each token's rows span several of the 256-row chunks its links are found in
    for &(b, t, c, v) in &[(1, 1, 1, 1), (3, 17, 65, 129), (2, 64, 3, 1000), (5, 3, 17, 3), (3, 100, 5, 7)] {
        let max_t = t + 2;
        let tokens: Vec<u32> = (0..b * t).map(|_| rng.below(v) as u32).collect();
        let wte = randn(&mut rng, v * c, 1.0);
        let wpe = randn(&mut rng, max_t * c, 1.0);
        let (gt, gwte, gwpe) = (
            Guarded::from_u32(&ctx, &tokens),
            Guarded::new(&ctx, wte.len(), Some(&wte)),
            Guarded::new(&ctx, wpe.len(), Some(&wpe)),
        );
        let out = Guarded::new(&ctx, b * t * c, None);
        kernels::embedding::forward(&ctx.kernels, &out.view(), &gt.view(), &gwte.view(), &gwpe.view(), b * t, t, c)
            .unwrap();
        assert_close(
            "embedding forward",
            &out.read(&ctx),
            &r::embedding_forward(&tokens, &to64(&wte), &to64(&wpe), t, c),
            1e-6,
            0.0,
        );

        let dout = randn(&mut rng, b * t * c, 1.0);
        let gd = Guarded::new(&ctx, dout.len(), Some(&dout));
        let (dwte, dwpe) = (
            Guarded::new(&ctx, v * c, Some(&vec![0.0; v * c])),
            Guarded::new(&ctx, max_t * c, Some(&vec![0.0; max_t * c])),
        );
        let links = Guarded::new(&ctx, b * t, None);
        kernels::embedding::backward(
            &ctx.kernels,
            Some(&dwte.view()),
            Some(&dwpe.view()),
            &links.view(),
            &gt.view(),
            &gd.view(),
            b * t,
            t,
            c,
        )
        .unwrap();
        let (wdwte, wdwpe) = r::embedding_backward(&tokens, &to64(&dout), v, max_t, t, c);
        assert_close("embedding dwte", &dwte.read(&ctx), &wdwte, 1e-5, 1e-6);
        assert_close("embedding dwpe", &dwpe.read(&ctx), &wdwpe, 1e-5, 1e-6);
    }
}

#[test]
fn cross_entropy_matches_reference_with_ignored_rows() {
    let ctx = ctx();
    let mut rng = Rng::new(7);
    let ignore = u32::MAX;
    // (5 x 5000: rows of three backward chunks, the last ragged; its logits climb along the row,
    // so the forward's running maximum grows often and its sums are rescaled)
    for &(rows, v) in &[(1, 1), (3, 17), (17, 1000), (65, 64), (129, 3), (5, 5000)] {
        let mut logits = randn(&mut rng, rows * v, 2.0);
        if v > 2048 {
            logits.iter_mut().enumerate().for_each(|(i, x)| *x += (i % v) as f32 * 0.004);
        }
        let targets: Vec<u32> = (0..rows).map(|i| if i % 4 == 3 { ignore } else { rng.below(v) as u32 }).collect();
        let (gl, gt) = (Guarded::new(&ctx, logits.len(), Some(&logits)), Guarded::from_u32(&ctx, &targets));
        let (losses, lse) = (Guarded::new(&ctx, rows, None), Guarded::new(&ctx, rows, None));
        kernels::cross_entropy::forward(
            &ctx.kernels,
            &losses.view(),
            &lse.view(),
            &gl.view(),
            &gt.view(),
            kernels::cross_entropy::Rows { rows, v, ignore, row0: 0 },
        )
        .unwrap();
        let (wl, _) = r::cross_entropy_forward(&to64(&logits), &targets, v, ignore);
        assert_close(&format!("ce losses {rows}x{v}"), &losses.read(&ctx), &wl, 1e-4, 1e-5);

        let count = targets.iter().filter(|&&t| t != ignore).count().max(1);
        let dloss = Guarded::new(&ctx, 1, Some(&[1.7]));
        let d = Guarded::new(&ctx, rows * v, Some(&vec![0.25; rows * v]));
        kernels::cross_entropy::backward(
            &ctx.kernels,
            &d.view(),
            &gl.view(),
            &gt.view(),
            &lse.view(),
            &dloss.view(),
            kernels::cross_entropy::Rows { rows, v, ignore, row0: 0 },
            1.0 / count as f32,
        )
        .unwrap();
        let grad = r::cross_entropy_backward(&to64(&logits), &targets, v, ignore, 1.7);
        let want: Vec<f64> = grad.iter().map(|g| g + 0.25).collect();
        assert_close(&format!("ce backward {rows}x{v}"), &d.read(&ctx), &want, 1e-4, 1e-6);
        // the writing form, into a poisoned buffer: every element written, ignored rows 0
        let write = |out: &Guarded, stride| {
            kernels::cross_entropy::backward_write(
                &ctx.kernels,
                &out.view(),
                &gl.view(),
                &gt.view(),
                &lse.view(),
                &dloss.view(),
                kernels::cross_entropy::Rows { rows, v, ignore, row0: 0 },
                1.0 / count as f32,
                stride,
            )
        };
        let fresh = Guarded::new(&ctx, rows * v, None);
        write(&fresh, v).unwrap();
        assert_close(&format!("ce backward_write {rows}x{v}"), &fresh.read(&ctx), &grad, 1e-4, 1e-6);
        // rows padded past V (for tensor-core products): the padding is written 0
        let stride = v.next_multiple_of(8) + 8;
        let padded = Guarded::new(&ctx, rows * stride, None);
        write(&padded, stride).unwrap();
        let want: Vec<f64> =
            grad.chunks(v).flat_map(|row| row.iter().copied().chain(std::iter::repeat_n(0.0, stride - v))).collect();
        assert_close(
            &format!("ce backward_write {rows}x{v} in rows of {stride}"),
            &padded.read(&ctx),
            &want,
            1e-4,
            1e-6,
        );
        assert!(write(&padded, v - 1).is_err(), "rows shorter than V were taken");
    }
}
