//! Every matmul variant (tiled, direct, large, narrow), layout, epilogue, split-K and int8 B
//! against the reference; which variant a product gets.

use super::*;

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

/// [`check_matmul`] on each (batch, M, N, K) with the layout and epilogue of `flags`: 1 A
/// transposed, 2 B transposed, 4 bias, 8 beta = 0.25 (else 0); alpha 0.5.
fn check_flagged(
    ctx: &pagetrain::Context,
    rng: &mut Rng,
    variant: MatmulVariant,
    flags: u32,
    shapes: &[(usize, usize, usize, usize)],
) {
    for &(batch, m, n, k) in shapes {
        let g = Gemm {
            batch,
            trans_a: flags & 1 != 0,
            trans_b: flags & 2 != 0,
            alpha: 0.5,
            beta: if flags & 8 != 0 { 0.25 } else { 0.0 },
            ..Gemm::new(m, n, k)
        };
        check_matmul(ctx, rng, variant, g, flags & 4 != 0);
    }
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
        check_flagged(
            &ctx,
            &mut rng,
            MatmulVariant::Large,
            flags,
            &[(2, 131, 67, 13), (1, 3, 257, 4), (1, 259, 130, 41), (2, 260, 132, 44)],
        );
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
        check_flagged(
            &ctx,
            &mut rng,
            MatmulVariant::Narrow,
            flags,
            &[(2, 131, 67, 13), (1, 3, 257, 4), (1, 259, 194, 41), (1, 129, 192, 44)],
        );
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
    assert!(split(Gemm { batch_strides: Some([1, 1, 16]), ..g }, 2).is_err(), "strides of its own");
    assert!(split(g, 2).is_ok());
}

#[test]
fn matmul_picks_large_tiles_only_for_products_that_fill_the_gpu() {
    use kernels::matmul::split_k;
    // GPT-2 small's weight gradients (K = 8 × 1024 rows) split until they have ~400 tiles
    let dw = |m, n| Gemm { trans_a: true, beta: 1.0, ..Gemm::new(m, n, 8192) };
    assert_eq!(split_k(MatmulVariant::Large, &dw(768, 768)), 16);
    assert_eq!(split_k(MatmulVariant::Large, &dw(768, 3072)), 4);
    assert_eq!(split_k(MatmulVariant::Large, &Gemm { batch_strides: Some([1, 1, 1]), ..dw(768, 768) }), 1);
    assert_eq!(split_k(MatmulVariant::Large, &dw(3072, 3072)), 1);
    // matmul_direct (CPU adapters) splits for its caches: slices of at least 512
    assert_eq!(split_k(MatmulVariant::Direct, &dw(768, 768)), 16);
    assert_eq!(split_k(MatmulVariant::Direct, &dw(128, 512)), 16);
    assert_eq!(split_k(MatmulVariant::Direct, &Gemm { k: 2048, ..dw(128, 512) }), 4);
    assert_eq!(split_k(MatmulVariant::Direct, &Gemm { k: 1000, ..dw(128, 512) }), 1);
    assert_eq!(split_k(MatmulVariant::Large, &Gemm { trans_a: false, ..dw(768, 768) }), 1);
    assert_eq!(split_k(MatmulVariant::Large, &Gemm { k: 300, ..dw(768, 768) }), 1);
    use kernels::matmul::pick;
    // N = 768: 384 wide tiles are 1.45 waves of 264, 512 narrow ones 1.94
    assert_eq!(pick(MatmulVariant::Large, &Gemm::new(8192, 768, 768)), MatmulVariant::Narrow);
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
                trans_a: ta,
                trans_b: tb,
                alpha: 0.75,
                beta: if accumulate { 1.0 } else { 0.0 },
                ..Gemm::new(m, n, k)
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
        check_flagged(
            &ctx,
            &mut rng,
            MatmulVariant::Direct,
            flags,
            &[(2, 20, 12, 8), (1, 132, 36, 13), (1, 4, 260, 24)],
        );
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
fn transpose_matches_the_reference_on_awkward_shapes_in_f32_and_f16() {
    use pagetrain::DType;
    let ctx = ctx();
    let mut rng = Rng::new(71);
    let f16 = common::has_f16(&ctx);
    for (rows, cols) in [(1, 1), (1, 37), (33, 1), (31, 33), (65, 96), (128, 7), (200, 131)] {
        let x = randn(&mut rng, rows * cols, 1.0);
        // The reference of x (rows, cols): element (c, r) of the result is x[r * cols + c].
        let want =
            |x: &[f32]| -> Vec<f64> { (0..cols * rows).map(|i| x[(i % rows) * cols + i / rows] as f64).collect() };
        let dtypes: &[DType] = if f16 { &[DType::F32, DType::F16] } else { &[DType::F32] };
        for (dout, din) in dtypes.iter().flat_map(|&a| dtypes.iter().map(move |&b| (a, b))) {
            let gx = Guarded::of(&ctx, din, x.len(), Some(&x));
            let out = Guarded::of(&ctx, dout, x.len(), None);
            kernels::transpose::transpose(&ctx.kernels, &out.view(), &gx.view(), rows, cols).unwrap();
            // An f16 side holds x rounded to f16: the transpose itself is exact.
            let rounded = if din == DType::F16 || dout == DType::F16 { common::round_f16(&x) } else { x.clone() };
            assert_close(
                &format!("transpose {rows}x{cols} {din:?} -> {dout:?}"),
                &out.read(&ctx),
                &want(&rounded),
                0.0,
                0.0,
            );
            // into rows padded past `rows` (poisoned first): the padding comes back zero
            let stride = rows.next_multiple_of(8) + 3;
            let padded = Guarded::of(&ctx, dout, cols * stride, Some(&vec![f32::NAN; cols * stride]));
            kernels::transpose::transpose_padded(&ctx.kernels, &padded.view(), &gx.view(), rows, cols, stride).unwrap();
            let mut want_padded = vec![0.0; cols * stride];
            for (dst, src) in want_padded.chunks_mut(stride).zip(want(&rounded).chunks(rows)) {
                dst[..rows].copy_from_slice(src);
            }
            let what = format!("transpose {rows}x{cols} {din:?} -> {dout:?} into rows of {stride}");
            assert_close(&what, &padded.read(&ctx), &want_padded, 0.0, 0.0);
        }
    }
    // rows shorter than the transposed rows are refused
    let x = Guarded::new(&ctx, 12, Some(&[1.0; 12]));
    assert!(kernels::transpose::transpose_padded(&ctx.kernels, &x.view(), &x.view(), 4, 3, 3).is_err());
}
