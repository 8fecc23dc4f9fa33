//! Every kernel against its CPU f64 reference on random data of awkward shapes. Outputs are
//! NaN-poisoned first and followed by canaries, so a skipped or out-of-bounds write fails.

mod common;

use common::reference as r;
use common::{assert_close, ctx, randn, to64, Guarded, AWKWARD};
use pagetrain::kernels::{self, activation::Activation, matmul::Gemm, reduce::SumSpec, MatmulVariant};
use pagetrain::rng::Rng;

const VARIANTS: [MatmulVariant; 4] =
    [MatmulVariant::Tiled, MatmulVariant::Direct, MatmulVariant::Large, MatmulVariant::Narrow];

/// Runs one product on guarded buffers and checks it against the f64 reference.
fn check_matmul(ctx: &pagetrain::Context, rng: &mut Rng, variant: MatmulVariant, g: Gemm, with_bias: bool) {
    let Gemm { batch, m, n, k, trans_a: ta, trans_b: tb, .. } = g;
    let accumulate = g.beta != 0.0;
    let a = randn(rng, batch * m * k, 1.0);
    let b = randn(rng, batch * k * n, 1.0);
    let bias = randn(rng, n, 1.0);
    let c0 = randn(rng, batch * m * n, 1.0);
    let (ga, gb, gbias) =
        (Guarded::new(ctx, a.len(), Some(&a)), Guarded::new(ctx, b.len(), Some(&b)), Guarded::new(ctx, n, Some(&bias)));
    let gc = Guarded::new(ctx, c0.len(), if accumulate { Some(&c0) } else { None });
    let bias_view = with_bias.then(|| gbias.view());
    kernels::matmul::matmul_variant(
        &ctx.kernels,
        variant,
        &gc.view(),
        &ga.view(),
        &gb.view(),
        bias_view.as_ref(),
        &gbias.view(),
        g,
    )
    .unwrap();
    let bias64 = to64(&bias);
    let mut want = r::matmul_forward(
        &to64(&a),
        &to64(&b),
        with_bias.then_some(&bias64[..]),
        batch,
        m,
        n,
        k,
        ta,
        tb,
        false,
        g.alpha as f64,
    );
    if accumulate {
        want.iter_mut().zip(&c0).for_each(|(w, &c)| *w += g.beta as f64 * c as f64);
    }
    let rtol = if k >= 1000 { 1e-3 } else { 1e-4 };
    let what = format!("matmul {variant:?} {batch}x{m}x{n}x{k} ta={ta} tb={tb} bias={with_bias} beta={}", g.beta);
    assert_close(&what, &gc.read(ctx), &want, rtol, 1e-5 * (k as f64).sqrt());
}

#[test]
fn large_matmul_matches_reference_in_every_layout_and_epilogue() {
    // Each of the 16 pipelines matmul_large compiles for f32 B (A/B transposed, bias, beta), on
    // shapes with ragged 128-tiles in M and N and K off the 8-deep slice; read by element, and
    // by vec4 where the operands' rows are a multiple of 4 long ((1, 3, 257, 4): A only when
    // not transposed; (2, 260, 132, 44): both, in every layout).
    let ctx = ctx();
    let mut rng = Rng::new(2);
    for flags in 0..16u32 {
        // (1, 259, 130, 41), (2, 260, 132, 44): tiles wholly inside M and N, whose full slices
        // load unchecked
        for &(batch, m, n, k) in &[(2, 131, 67, 13), (1, 3, 257, 4), (1, 259, 130, 41), (2, 260, 132, 44)] {
            let g = Gemm {
                batch,
                m,
                n,
                k,
                trans_a: flags & 1 != 0,
                trans_b: flags & 2 != 0,
                alpha: 0.5,
                beta: if flags & 8 != 0 { 0.25 } else { 0.0 },
                offsets: [0; 3],
            };
            check_matmul(&ctx, &mut rng, MatmulVariant::Large, g, flags & 4 != 0);
        }
    }
}

#[test]
fn narrow_matmul_matches_reference_in_every_layout() {
    // matmul_large's 128×96 tiles: every layout, B read by element and by vec4 (N a multiple of
    // 4), bias and beta with B in both layouts; N below one tile, ragged 96-tiles, whole ones
    // ((1, 129, 192, 44): tiles wholly inside M and N load unchecked), K off the 8-deep slice.
    let ctx = ctx();
    let mut rng = Rng::new(4);
    for flags in [0u32, 1, 2, 3, 12, 14] {
        for &(batch, m, n, k) in &[(2, 131, 67, 13), (1, 3, 257, 4), (1, 259, 194, 41), (1, 129, 192, 44)] {
            let g = Gemm {
                batch,
                m,
                n,
                k,
                trans_a: flags & 1 != 0,
                trans_b: flags & 2 != 0,
                alpha: 0.5,
                beta: if flags & 8 != 0 { 0.25 } else { 0.0 },
                offsets: [0; 3],
            };
            check_matmul(&ctx, &mut rng, MatmulVariant::Narrow, g, flags & 4 != 0);
        }
    }
}

#[test]
fn split_k_weight_gradient_matches_reference() {
    // C += 0.5·Aᵀ·B with K split into slices summed in order, in every variant.
    let ctx = ctx();
    let mut rng = Rng::new(3);
    for &(m, n, k, splits) in &[(17, 65, 64, 2), (3, 130, 96, 4), (65, 1, 40, 8)] {
        for variant in VARIANTS {
            let a = randn(&mut rng, k * m, 1.0);
            let b = randn(&mut rng, k * n, 1.0);
            let c0 = randn(&mut rng, m * n, 1.0);
            let (ga, gb, gc) = (
                Guarded::new(&ctx, a.len(), Some(&a)),
                Guarded::new(&ctx, b.len(), Some(&b)),
                Guarded::new(&ctx, c0.len(), Some(&c0)),
            );
            let parts = Guarded::new(&ctx, splits * m * n, None);
            let g = Gemm { trans_a: true, alpha: 0.5, beta: 1.0, ..Gemm::new(m, n, k) };
            kernels::matmul::matmul_split(
                &ctx.kernels,
                variant,
                &gc.view(),
                &ga.view(),
                &gb.view(),
                &parts.view(),
                &ga.view(),
                splits,
                g,
            )
            .unwrap();
            let mut want = r::matmul_forward(&to64(&a), &to64(&b), None, 1, m, n, k, true, false, false, 0.5);
            want.iter_mut().zip(&c0).for_each(|(w, &c)| *w += c as f64);
            assert_close(
                &format!("split-k {variant:?} {m}x{n}x{k} / {splits}"),
                &gc.read(&ctx),
                &want,
                1e-4,
                1e-5 * (k as f64).sqrt(),
            );
            parts.read(&ctx);
        }
    }
    // a layout or K the split cannot serve is an error, not a wrong answer
    let g = Gemm { trans_a: true, beta: 1.0, ..Gemm::new(4, 4, 10) };
    let x = Guarded::new(&ctx, 64, Some(&[0.0; 64]));
    let split = |g: Gemm, s| {
        kernels::matmul::matmul_split(
            &ctx.kernels,
            MatmulVariant::Large,
            &x.view(),
            &x.view(),
            &x.view(),
            &x.view(),
            &x.view(),
            s,
            g,
        )
    };
    assert!(split(g, 4).is_err());
    assert!(split(Gemm { trans_a: false, ..g }, 2).is_err());
    assert!(split(Gemm { beta: 0.0, ..g }, 2).is_err());
    assert!(split(g, 2).is_ok());
}

#[test]
fn matmul_picks_large_tiles_only_for_products_that_fill_the_gpu() {
    use kernels::matmul::split_k;
    // GPT-2 small's weight gradients (K = 8 × 1024 rows) split until they have ~400 tiles
    let dw = |m, n| Gemm { trans_a: true, beta: 1.0, ..Gemm::new(m, n, 8192) };
    assert_eq!(split_k(MatmulVariant::Large, &dw(768, 768)), 16);
    assert_eq!(split_k(MatmulVariant::Large, &dw(768, 3072)), 4);
    assert_eq!(split_k(MatmulVariant::Large, &dw(3072, 3072)), 1);
    // matmul_direct (CPU adapters) splits for its caches: slices of at least 512
    assert_eq!(split_k(MatmulVariant::Direct, &dw(768, 768)), 16);
    assert_eq!(split_k(MatmulVariant::Direct, &dw(128, 512)), 16);
    assert_eq!(split_k(MatmulVariant::Direct, &Gemm { k: 2048, ..dw(128, 512) }), 4);
    assert_eq!(split_k(MatmulVariant::Direct, &Gemm { k: 1000, ..dw(128, 512) }), 1);
    assert_eq!(split_k(MatmulVariant::Large, &Gemm { trans_a: false, ..dw(768, 768) }), 1);
    assert_eq!(split_k(MatmulVariant::Large, &Gemm { k: 300, ..dw(768, 768) }), 1);
    use kernels::matmul::pick;
    // N = 768: 384 wide tiles are 1.45 waves of 264, 512 narrow ones 1.94; narrow where B is
    // transposed or the wide tiles are under a wave (measured to gain), not NN over a wave
    assert_eq!(pick(MatmulVariant::Large, &Gemm::new(8192, 768, 768)), MatmulVariant::Large);
    assert_eq!(pick(MatmulVariant::Large, &Gemm::new(4096, 768, 50257)), MatmulVariant::Narrow);
    let nt = Gemm { trans_b: true, ..Gemm::new(8192, 768, 3072) };
    assert_eq!(pick(MatmulVariant::Large, &nt), MatmulVariant::Narrow);
    assert_eq!(pick(MatmulVariant::Large, &Gemm { batch: 2, ..nt }), MatmulVariant::Large);
    assert_eq!(pick(MatmulVariant::Large, &Gemm::new(8192, 2304, 768)), MatmulVariant::Large);
    assert_eq!(pick(MatmulVariant::Large, &Gemm::new(4096, 4096, 4096)), MatmulVariant::Large);
    assert_eq!(pick(MatmulVariant::Narrow, &Gemm::new(64, 64, 4096)), MatmulVariant::Tiled);
    assert_eq!(pick(MatmulVariant::Large, &Gemm::new(64, 64, 4096)), MatmulVariant::Tiled);
    assert_eq!(pick(MatmulVariant::Direct, &Gemm::new(8192, 768, 768)), MatmulVariant::Direct);
}

#[test]
fn matmul_matches_reference_on_awkward_shapes_and_transposes() {
    let ctx = ctx();
    let mut rng = Rng::new(1);
    let mut cases = vec![];
    for &m in &[1, 17, 65, 129] {
        for &n in &[3, 64, 65] {
            for &k in &[1, 17, 129] {
                cases.push((1, m, n, k));
            }
        }
    }
    cases.extend([(1, 1000, 3, 17), (1, 3, 1000, 65), (1, 17, 65, 1000), (5, 17, 17, 3), (3, 65, 1, 129)]);
    // several 128-row tiles with ragged edges, K below and just above the large kernel's slice
    cases.extend([(1, 257, 131, 7), (2, 130, 260, 9), (1, 385, 129, 3)]);
    for (i, &(batch, m, n, k)) in cases.iter().enumerate() {
        for variant in VARIANTS {
            let (ta, tb, with_bias, accumulate) = (i % 2 == 1, i % 3 == 1, i % 4 == 0, i % 5 == 2);
            let g = Gemm {
                batch,
                m,
                n,
                k,
                trans_a: ta,
                trans_b: tb,
                alpha: 0.75,
                beta: if accumulate { 1.0 } else { 0.0 },
                offsets: [0; 3],
            };
            check_matmul(&ctx, &mut rng, variant, g, with_bias);
        }
    }
}

#[test]
fn direct_matmul_reads_vec4_operands_in_every_layout_and_epilogue() {
    // matmul_direct reads an f32 operand whose stored rows are a multiple of 4 long 4 floats at a
    // time: every layout (flags 1, 2), bias (4), beta (8); M, N = 4 mod 8 (the last vec4 of rows
    // or columns clamped), M below a thread's 8 rows, and K = 13, where only row- or
    // column-contiguous operands are read as vec4 and the last depth is read alone.
    let ctx = ctx();
    let mut rng = Rng::new(23);
    for flags in 0..16u32 {
        for &(batch, m, n, k) in &[(2, 20, 12, 8), (1, 132, 36, 13), (1, 4, 260, 24)] {
            let g = Gemm {
                batch,
                m,
                n,
                k,
                trans_a: flags & 1 != 0,
                trans_b: flags & 2 != 0,
                alpha: 0.5,
                beta: if flags & 8 != 0 { 0.25 } else { 0.0 },
                offsets: [0; 3],
            };
            check_matmul(&ctx, &mut rng, MatmulVariant::Direct, g, flags & 4 != 0);
        }
    }
}

#[test]
fn matmul_offsets_select_row_chunks() {
    // C[2..] = A[3..] · B[5..]ᵀ with every buffer carrying a prefix the kernel must not touch
    // (K = 12: offsets and rows 4-aligned, which matmul_large reads by vec4).
    let ctx = ctx();
    let mut rng = Rng::new(21);
    // (K = 12: offsets and rows 4-aligned, which matmul_direct reads as vec4)
    for (variant, (m, n, k)) in VARIANTS.into_iter().flat_map(|v| [(v, (17, 33, 9)), (v, (17, 36, 12))]) {
        let (oa, ob, oc) = (3 * k, 5 * k, 2 * n);
        let a = randn(&mut rng, oa + m * k, 1.0);
        let b = randn(&mut rng, ob + n * k, 1.0);
        let mut c0 = randn(&mut rng, oc + m * n, 1.0);
        let (ga, gb, gc) = (
            Guarded::new(&ctx, a.len(), Some(&a)),
            Guarded::new(&ctx, b.len(), Some(&b)),
            Guarded::new(&ctx, c0.len(), Some(&c0)),
        );
        let g = Gemm { offsets: [oa, ob, oc], trans_b: true, ..Gemm::new(m, n, k) };
        kernels::matmul::matmul_variant(&ctx.kernels, variant, &gc.view(), &ga.view(), &gb.view(), None, &ga.view(), g)
            .unwrap();
        let chunk = r::matmul_forward(&to64(&a[oa..]), &to64(&b[ob..]), None, 1, m, n, k, false, true, true, 1.0);
        let mut want: Vec<f64> = to64(&c0[..oc]);
        want.extend(chunk);
        c0.clear();
        assert_close(&format!("matmul offsets {variant:?} {m}x{n}x{k}"), &gc.read(&ctx), &want, 1e-4, 1e-5);
    }
}

#[test]
fn int8_weight_matmul_matches_reference_on_dequantized_weights() {
    use kernels::matmul::{dequantize_rows, quantize_rows, QuantB};
    let ctx = ctx();
    let mut rng = Rng::new(22);
    for &(m, k, n) in &[(1, 1, 1), (3, 17, 65), (65, 129, 3), (17, 64, 1000)] {
        for variant in VARIANTS {
            for trans_b in [false, true] {
                // W is stored (rows, cols) = (k, n) for x·W, (n, k) for x·Wᵀ; one scale per stored row.
                let (rows, cols) = if trans_b { (n, k) } else { (k, n) };
                let w = randn(&mut rng, rows * cols, 0.5);
                let (words, scales) = quantize_rows(&w, rows, cols);
                let deq = dequantize_rows(&words, &scales, rows, cols);
                let x = randn(&mut rng, m * k, 1.0);
                let gx = Guarded::new(&ctx, x.len(), Some(&x));
                let gq = Guarded::from_u32(&ctx, &words);
                let gs = Guarded::new(&ctx, scales.len(), Some(&scales));
                let out = Guarded::new(&ctx, m * n, None);
                let qb = QuantB { q: &gq.view(), scales: &gs.view(), row_len: cols };
                let g = Gemm { trans_b, ..Gemm::new(m, n, k) };
                kernels::matmul::matmul_q8(&ctx.kernels, variant, &out.view(), &gx.view(), qb, None, &gs.view(), g)
                    .unwrap();
                let want = r::matmul_forward(&to64(&x), &to64(&deq), None, 1, m, n, k, false, trans_b, true, 1.0);
                assert_close(
                    &format!("int8 matmul {variant:?} {m}x{k}x{n} tb={trans_b}"),
                    &out.read(&ctx),
                    &want,
                    1e-4,
                    1e-5 * (k as f64).sqrt(),
                );
                // quantization error is bounded by half a step per element
                for (i, (a, b)) in w.iter().zip(&deq).enumerate() {
                    assert!((a - b).abs() <= scales[i / cols] * 0.5 + 1e-7, "dequantized {b} vs {a}");
                }
            }
        }
    }
}

#[test]
fn elementwise_kernels_match_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(2);
    for &n in AWKWARD {
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
        assert_close(&format!("axpy {n}"), &y.read(&ctx), &want, 1e-6, 1e-7);

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
    for &n in AWKWARD {
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
            kernels::activation::backward(&ctx.kernels, f, &dx.view(), &gx.view(), &gd.view(), n).unwrap();
            let want: Vec<f64> = bwd(&to64(&x), &to64(&dout)).iter().zip(&dx0).map(|(g, d)| g + *d as f64).collect();
            assert_close(&format!("{f:?} backward {n}"), &dx.read(&ctx), &want, 1e-5, 1e-6);
        }
    }
}

#[test]
fn layernorm_matches_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(4);
    // (1100, 3) and (2049, 300) take the two-stage parameter sums
    for &(rows, c) in &[(1, 1), (3, 17), (17, 64), (2, 65), (5, 129), (3, 1000), (1100, 3), (2049, 300)] {
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
    for &(rows, v) in &[(1, 1), (3, 17), (17, 1000), (65, 64), (129, 3)] {
        let logits = randn(&mut rng, rows * v, 2.0);
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
        let fresh = Guarded::new(&ctx, rows * v, None);
        kernels::cross_entropy::backward_write(
            &ctx.kernels,
            &fresh.view(),
            &gl.view(),
            &gt.view(),
            &lse.view(),
            &dloss.view(),
            kernels::cross_entropy::Rows { rows, v, ignore, row0: 0 },
            1.0 / count as f32,
        )
        .unwrap();
        assert_close(&format!("ce backward_write {rows}x{v}"), &fresh.read(&ctx), &grad, 1e-4, 1e-6);
    }
}

#[test]
fn reductions_match_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(8);
    let partials = Guarded::new(&ctx, kernels::reduce::MAX_PARTIALS, None);
    // up to ONE_STAGE (16384) in one workgroup, longer through the partials
    for &n in &[1usize, 3, 17, 1000, 16384, 16385, 300_001, 5_000_000] {
        let x = randn(&mut rng, n, 1.0);
        let gx = Guarded::new(&ctx, n, Some(&x));
        let out = Guarded::new(&ctx, 3, Some(&[1.0, 2.0, 3.0]));
        let spec = SumSpec { squares: false, scale: 0.5, slot: 1, accumulate: true };
        kernels::reduce::sum(&ctx.kernels, &out.view(), &gx.view(), &partials.view(), n, spec).unwrap();
        let spec = SumSpec { squares: true, scale: 1.0, slot: 2, accumulate: false };
        kernels::reduce::sum(&ctx.kernels, &out.view(), &gx.view(), &partials.view(), n, spec).unwrap();
        let x64 = to64(&x);
        let want = [1.0, 2.0 + 0.5 * r::sum_forward(&x64, false), r::sum_forward(&x64, true)];
        assert_close(&format!("sum {n}"), &out.read(&ctx), &want, 1e-4, 1e-4 * (n as f64).sqrt());
    }
    for &(rows, cols) in &[(1, 1), (17, 3), (1000, 65), (3, 1000), (1024, 1), (4097, 3), (2049, 300)] {
        let x = randn(&mut rng, rows * cols, 1.0);
        let gx = Guarded::new(&ctx, x.len(), Some(&x));
        let want: Vec<f64> = r::sum_rows(&to64(&x), rows, cols).iter().map(|v| v + 1.0).collect();
        // one thread per column, and blocks of rows first where the shape calls for it
        let blocks = kernels::reduce::column_blocks(rows, cols);
        assert_eq!(blocks > 1, rows >= 1024, "{rows}x{cols}: {blocks} blocks");
        let parts = Guarded::new(&ctx, blocks * cols, None);
        for partials in [None, Some(parts.view())] {
            let out = Guarded::new(&ctx, cols, Some(&vec![1.0; cols]));
            kernels::reduce::sum_rows(&ctx.kernels, &out.view(), &gx.view(), partials.as_ref(), rows, cols).unwrap();
            let what = format!("sum_rows {rows}x{cols} in {} stages", 1 + (partials.is_some() && blocks > 1) as u8);
            assert_close(&what, &out.read(&ctx), &want, 1e-4, 1e-4);
        }
        parts.read(&ctx);
    }
    assert!(kernels::reduce::column_blocks(8192, 768) > 64, "GPT-2's bias gradients fill the GPU");
}

#[test]
fn fused_attention_matches_reference_across_row_blocks_tiles_and_head_sizes() {
    let ctx = ctx();
    let mut rng = Rng::new(9);
    // head sizes give tiles of 32 (d <= 64), 20 (d = 100) and 8 (d = 256) rows (8 for all on
    // OpenGL); T = 130 spans three row blocks of 64 and a ragged last tile
    let cases = [(1, 1, 1, 1), (2, 17, 3, 5), (1, 130, 2, 64), (2, 70, 1, 100), (1, 33, 1, 256)];
    for &(b, t, h, d) in &cases {
        let c = h * d;
        let qkv = randn(&mut rng, b * t * 3 * c, 1.0);
        let gqkv = Guarded::new(&ctx, qkv.len(), Some(&qkv));
        let (out, lse) = (Guarded::new(&ctx, b * t * c, None), Guarded::new(&ctx, b * h * t, None));
        let scale = 1.0 / (d as f32).sqrt();
        let dims = kernels::attention::Dims { b, t, h, d, scale };
        kernels::attention::forward(&ctx.kernels, &out.view(), &lse.view(), &gqkv.view(), dims).unwrap();
        let q64 = to64(&qkv);
        let want = r::attention_forward(&q64, b, t, c, h);
        assert_close(&format!("attention b{b} t{t} h{h} d{d}"), &out.read(&ctx), &want, 1e-4, 1e-5);
        let want_lse: Vec<f64> = (0..b * h * t)
            .map(|row| {
                let (bi, hi, i) = (row / (h * t), (row / t) % h, row % t);
                let at = |j: usize, part: usize, dd: usize| q64[(bi * t + j) * 3 * c + part * c + hi * d + dd];
                let s: Vec<f64> =
                    (0..=i).map(|j| (0..d).map(|dd| at(i, 0, dd) * at(j, 1, dd)).sum::<f64>() * scale as f64).collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
            })
            .collect();
        assert_close(&format!("attention lse b{b} t{t} h{h} d{d}"), &lse.read(&ctx), &want_lse, 1e-4, 1e-5);
    }
    let too_wide = kernels::attention::Dims { b: 1, t: 1, h: 1, d: 257, scale: 1.0 };
    let g = Guarded::new(&ctx, 3 * 257, Some(&vec![1.0; 3 * 257]));
    let err = kernels::attention::forward(&ctx.kernels, &g.view(), &g.view(), &g.view(), too_wide).unwrap_err();
    assert!(err.to_string().contains("head size"), "{err}");
}

/// The attention kernels this adapter runs: blocked at every tile that fits, rows at head
/// sizes 5 and 64 only (lavapipe compiles the per-row kernels slowly at some sizes: 190 s at 24;
/// gradcheck covers them at others), and where the adapter has subgroups that wide the backward on
/// 2 lanes a row at 5, 16, 35 and 64, on 4 at 35 (padded: a lane's last vec4 group past the head
/// size) and on 8 at 64 (lanes' compiles are kept few for CI's time).
fn attention_kernels(ctx: &pagetrain::Context, d: usize) -> Vec<kernels::attention::Kernel> {
    use kernels::attention::{blocked_workgroup_bytes, lanes_supported, Kernel, BLOCKED_MAX_HEAD_DIM, BLOCKED_TILES};
    let limit = ctx.gpu.limits.max_compute_workgroup_storage_size as u64;
    let blocked =
        BLOCKED_TILES.iter().filter(|&&t| d <= BLOCKED_MAX_HEAD_DIM && blocked_workgroup_bytes(d, t) <= limit);
    let rows = matches!(d, 5 | 64).then_some(Kernel::Rows);
    let sizes = |l: u32| match l {
        4 => d == 35,
        8 => d == 64,
        _ => d != 32,
    };
    let lanes = [2, 4, 8].into_iter().filter(|&l| lanes_supported(&ctx.gpu, l) && sizes(l));
    let lanes = lanes.map(|lanes| Kernel::Lanes { lanes });
    rows.into_iter().chain(blocked.map(|&tile| Kernel::Blocked { tile })).chain(lanes).collect()
}

#[test]
fn every_attention_kernel_matches_the_reference_forward_and_backward() {
    // T of 1, below, at and past a block, ragged last tiles, odd B·H, head sizes 5 (padded), 16, 32,
    // 35 (past 32: the blocked backward's second column group, within lavapipe's 32 KiB), 64
    let ctx = ctx();
    let mut rng = Rng::new(41);
    let cases =
        [(1, 1, 2, 5), (3, 17, 1, 16), (1, 5, 3, 32), (1, 70, 2, 64), (2, 33, 1, 5), (1, 100, 1, 16), (1, 45, 2, 35)];
    let (mut blocked_runs, mut lanes_runs) = (0, 0);
    for &(b, t, h, d) in &cases {
        let c = h * d;
        let qkv = randn(&mut rng, b * t * 3 * c, 1.0);
        let dout = randn(&mut rng, b * t * c, 1.0);
        let dqkv0 = randn(&mut rng, qkv.len(), 1.0);
        let (q64, g64) = (to64(&qkv), to64(&dout));
        let want = r::attention_forward(&q64, b, t, c, h);
        let want_d: Vec<f64> =
            r::attention_backward(&q64, &g64, b, t, c, h).iter().zip(&dqkv0).map(|(g, &g0)| g + g0 as f64).collect();
        let want_delta: Vec<f64> = (0..b * h * t)
            .map(|row| {
                let (bi, hi, i) = (row / (h * t), (row / t) % h, row % t);
                (0..d).map(|dd| want[(bi * t + i) * c + hi * d + dd] * g64[(bi * t + i) * c + hi * d + dd]).sum()
            })
            .collect();
        let dims = kernels::attention::Dims { b, t, h, d, scale: 1.0 / (d as f32).sqrt() };
        for kernel in attention_kernels(&ctx, d) {
            let what = format!("attention {kernel:?} b{b} t{t} h{h} d{d}");
            blocked_runs += matches!(kernel, kernels::attention::Kernel::Blocked { .. }) as usize;
            lanes_runs += matches!(kernel, kernels::attention::Kernel::Lanes { .. }) as usize;
            let gqkv = Guarded::new(&ctx, qkv.len(), Some(&qkv));
            let (out, lse) = (Guarded::new(&ctx, b * t * c, None), Guarded::new(&ctx, b * h * t, None));
            // the lanes kernels are backward only: they take the adapter's forward
            let forward_kernel = match kernel {
                kernels::attention::Kernel::Lanes { .. } => {
                    let err = kernels::attention::forward_with(
                        &ctx.kernels,
                        kernel,
                        &out.view(),
                        &lse.view(),
                        &gqkv.view(),
                        dims,
                    );
                    assert!(err.unwrap_err().to_string().contains("backward kernel"), "{what}");
                    kernels::attention::pick(&ctx.kernels, d, false)
                }
                _ => kernel,
            };
            kernels::attention::forward_with(
                &ctx.kernels,
                forward_kernel,
                &out.view(),
                &lse.view(),
                &gqkv.view(),
                dims,
            )
            .unwrap();
            assert_close(&what, &out.read(&ctx), &want, 1e-4, 1e-5);
            let (gd, delta) = (Guarded::new(&ctx, dout.len(), Some(&dout)), Guarded::new(&ctx, b * h * t, None));
            let gdq = Guarded::new(&ctx, qkv.len(), Some(&dqkv0));
            let v = |g: &Guarded| g.view();
            let backward = kernels::attention::backward_with(
                &ctx.kernels,
                kernel,
                &v(&gdq),
                &v(&delta),
                &v(&gqkv),
                &v(&out),
                &v(&gd),
                &v(&lse),
                dims,
            );
            // the blocked backward has one tile; others are refused
            if let kernels::attention::Kernel::Blocked { tile } = kernel {
                if tile != kernels::attention::BLOCKED_BACKWARD_TILE {
                    assert!(backward.unwrap_err().to_string().contains("tiles of"), "{what}");
                    continue;
                }
            }
            backward.unwrap();
            assert_close(&format!("{what} delta"), &delta.read(&ctx), &want_delta, 1e-4, 1e-5);
            assert_close(&format!("{what} dqkv"), &gdq.read(&ctx), &want_d, 1e-4, 1e-4);
        }
    }
    assert!(blocked_runs > 0, "the blocked kernels fit no tile on {}", ctx.gpu.describe());
    // GPUs with subgroups (lavapipe's are 8 lanes) run the lanes backward; OpenGL has none
    let subgroups = ctx.gpu.features.contains(wgpu::Features::SUBGROUP) && ctx.gpu.info.backend != wgpu::Backend::Gl;
    assert_eq!(lanes_runs > 0, subgroups && ctx.gpu.info.subgroup_min_size >= 2, "{}", ctx.gpu.describe());
    // A tile that is not offered, and head sizes past the blocked kernels, are errors.
    let g = Guarded::new(&ctx, 3 * 65, Some(&vec![1.0; 3 * 65]));
    for (d, tile) in [(65, 16), (4, 8)] {
        let dims = kernels::attention::Dims { b: 1, t: 1, h: 1, d, scale: 1.0 };
        let blocked = kernels::attention::Kernel::Blocked { tile };
        let err = kernels::attention::forward_with(&ctx.kernels, blocked, &g.view(), &g.view(), &g.view(), dims);
        assert!(err.unwrap_err().to_string().contains("head size"));
    }
}

#[test]
fn optimizers_match_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(10);
    for &n in AWKWARD {
        let p = randn(&mut rng, n, 1.0);
        let g = randn(&mut rng, n, 1.0);
        let m: Vec<f32> = randn(&mut rng, n, 0.1);
        let v: Vec<f32> = randn(&mut rng, n, 0.1).iter().map(|x| x * x).collect();
        let clip = Guarded::new(&ctx, 2, Some(&[0.8, 0.0]));
        let (gp, gm, gv, gg) = (
            Guarded::new(&ctx, n, Some(&p)),
            Guarded::new(&ctx, n, Some(&m)),
            Guarded::new(&ctx, n, Some(&v)),
            Guarded::new(&ctx, n, Some(&g)),
        );
        let s = kernels::optim::AdamWStep {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            t: 3,
            grad_scale: 1.0,
        };
        kernels::optim::adamw(&ctx.kernels, &gp.view(), &gm.view(), &gv.view(), &gg.view(), &clip.view(), None, n, s)
            .unwrap();
        let (wp, wm, wv) =
            r::adamw_update(&to64(&p), &to64(&g), &to64(&m), &to64(&v), 0.01, 0.9, 0.95, 1e-8, 0.1, 3, 0.8);
        assert_close(&format!("adamw p {n}"), &gp.read(&ctx), &wp, 1e-5, 1e-6);
        assert_close(&format!("adamw m {n}"), &gm.read(&ctx), &wm, 1e-5, 1e-7);
        assert_close(&format!("adamw v {n}"), &gv.read(&ctx), &wv, 1e-5, 1e-7);

        let (gp, gb) = (Guarded::new(&ctx, n, Some(&p)), Guarded::new(&ctx, n, Some(&m)));
        kernels::optim::sgd(&ctx.kernels, &gp.view(), &gb.view(), &gg.view(), &clip.view(), n, 0.05, 0.9, 0.01, 1.0)
            .unwrap();
        let (wp, wb) = r::sgd_update(&to64(&p), &to64(&g), &to64(&m), 0.05, 0.9, 0.01, 0.8);
        assert_close(&format!("sgd p {n}"), &gp.read(&ctx), &wp, 1e-5, 1e-6);
        assert_close(&format!("sgd buf {n}"), &gb.read(&ctx), &wb, 1e-5, 1e-6);
    }
    // clip factor from partial sums of squares
    let sumsq = Guarded::new(&ctx, 3, Some(&[4.0, 9.0, 3.0]));
    let clip = Guarded::new(&ctx, 2, None);
    kernels::optim::clip_scale(&ctx.kernels, &clip.view(), &sumsq.view(), 3, 1.0, 1.0).unwrap();
    assert_close("clip", &clip.read(&ctx), &[0.25, 4.0], 1e-5, 1e-6);
    kernels::optim::clip_scale(&ctx.kernels, &clip.view(), &sumsq.view(), 3, 10.0, 1.0).unwrap();
    assert_close("no clip", &clip.read(&ctx), &[1.0, 4.0], 1e-5, 1e-6);
    // gradients seen through a loss scale of 8: the norm is taken of the unscaled ones
    kernels::optim::clip_scale(&ctx.kernels, &clip.view(), &sumsq.view(), 3, 0.25, 0.125).unwrap();
    assert_close("clip of unscaled gradients", &clip.read(&ctx), &[0.5, 0.5], 1e-5, 1e-6);
}

#[test]
fn sumsq_multi_matches_reference() {
    use kernels::sumsq::{blocks_for, sumsq_multi, TENSORS};
    let ctx = ctx();
    let mut rng = Rng::new(31);
    // Groups of 1, 3 and 7 tensors of awkward lengths; one long enough for several blocks.
    let lens: Vec<usize> = AWKWARD.iter().copied().chain([9000, 70_001, 5]).collect();
    for group in [&lens[..1], &lens[2..5], &lens[3..10]] {
        let xs: Vec<Vec<f32>> = group.iter().map(|&n| randn(&mut rng, n, 1.0)).collect();
        let guarded: Vec<Guarded> = xs.iter().map(|x| Guarded::new(&ctx, x.len(), Some(x))).collect();
        let views: Vec<_> = guarded.iter().map(|g| g.view()).collect();
        let args: Vec<_> = views.iter().zip(group).map(|(v, &n)| (v, n)).collect();
        let blocks = blocks_for(*group.iter().max().unwrap());
        let base = 5;
        // Before `base` the output keeps its values; the partials follow.
        let mut init = vec![f32::NAN; base + group.len() * blocks];
        init[..base].copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        let out = Guarded::new(&ctx, init.len(), Some(&init));
        let written = sumsq_multi(&ctx.kernels, &out.view(), &args, base).unwrap();
        assert_eq!(written, group.len() * blocks);
        let mut want = vec![1.0, 2.0, 3.0, 4.0, 5.0];
        for x in &xs {
            for g in 0..blocks {
                want.push(
                    x.iter()
                        .enumerate()
                        .filter(|(i, _)| (i / 256) % blocks == g)
                        .map(|(_, v)| (*v as f64).powi(2))
                        .sum(),
                );
            }
        }
        assert_close(&format!("sumsq_multi {group:?}"), &out.read(&ctx), &want, 1e-5, 1e-5);
    }
    let g = Guarded::new(&ctx, 4, Some(&[1.0; 4]));
    let v = g.view();
    let too_many: Vec<_> = (0..TENSORS + 1).map(|_| (&v, 4)).collect();
    let err = sumsq_multi(&ctx.kernels, &g.view(), &too_many, 0).unwrap_err();
    assert!(err.to_string().contains("1 to 7"), "{err}");
}

#[test]
fn sumsq_groups_respect_count_and_bytes() {
    use kernels::sumsq::{groups, partials_for, TENSORS};
    let lens = vec![10usize; 16];
    let g = groups(&lens, u64::MAX);
    assert_eq!(g, vec![0..TENSORS, TENSORS..2 * TENSORS, 2 * TENSORS..16]);
    assert_eq!(partials_for(&lens, &g), 16);
    // 100 bytes a group: two tensors of 40 bytes, and a tensor over the limit alone.
    let g = groups(&[10, 10, 10, 100, 10], 100);
    assert_eq!(g, vec![0..2, 2..3, 3..4, 4..5]);
    assert_eq!(partials_for(&[10, 10, 10, 100, 10], &g), 5);
}

#[test]
fn in_pass_clears_zero_exactly_their_range() {
    let ctx = ctx();
    let mut rng = Rng::new(41);
    let sumsq = Guarded::new(&ctx, 3, Some(&[4.0, 9.0, 3.0]));
    for &n in AWKWARD.iter().chain(&[70_001]) {
        let x = randn(&mut rng, n + 8, 1.0);
        let g = Guarded::new(&ctx, n + 8, Some(&x));
        let clip = Guarded::new(&ctx, 2, None);
        // A dispatch, the clear, a dispatch: one compute pass, in order.
        let passes = ctx.recorder.passes();
        kernels::optim::clip_scale(&ctx.kernels, &clip.view(), &sumsq.view(), 3, 1.0, 1.0).unwrap();
        ctx.recorder.clear(&g.buffer, 0, n as u64 * 4);
        ctx.recorder.clear(&clip.buffer, 0, 8);
        kernels::optim::clip_scale(&ctx.kernels, &clip.view(), &sumsq.view(), 2, 1.0, 1.0).unwrap();
        assert_eq!(ctx.recorder.passes() - passes, 1, "a clear ended the compute pass");
        let mut want = vec![0.0f64; n];
        want.extend(to64(&x[n..]));
        assert_close(&format!("clear {n}"), &g.read(&ctx), &want, 0.0, 0.0);
        assert_close(&format!("after clear {n}"), &clip.read(&ctx), &[1.0 / 13f64.sqrt(), 13f64.sqrt()], 1e-5, 1e-6);
    }
    // A range the kernel cannot bind (offset not storage-aligned) is cleared by the encoder.
    let x = randn(&mut rng, 16, 1.0);
    let g = Guarded::new(&ctx, 16, Some(&x));
    ctx.recorder.clear(&g.buffer, 4, 8);
    let mut want = to64(&x);
    want[1..3].fill(0.0);
    assert_close("unaligned clear", &g.read(&ctx), &want, 0.0, 0.0);
}
