//! The cooperative-matrix (tensor-core) kernels against the CPU f64 reference on f16-rounded
//! operands. The matmul: every layout and epilogue, f32 and f16 C, awkward shapes (odd M, N, K; K
//! below one slice; shapes that take the 4-halves loads and shapes that cannot), batches and
//! row-chunk offsets. The attention forward: ragged and whole blocks, its lse, and the backward
//! on its results (`attention.rs`). Outputs are NaN-poisoned and canary-guarded.
//!
//! Lavapipe, llvmpipe and browsers have no cooperative matrices: there the kernel tests print
//! `skipped` and pass, unless `PAGETRAIN_REQUIRE_COOP=1` (set it on a GPU that has them, e.g.
//! NVIDIA on Vulkan) makes that a failure; the fallback test runs everywhere, and the f16 head's
//! wherever shader-f16 is (`PAGETRAIN_REQUIRE_F16=1` in CI).

mod attention;
#[path = "../common/mod.rs"]
mod common;

use common::reference as r;
use common::{assert_close, ctx, randn, round_f16, to64, Guarded};
use pagetrain::kernels::{self, matmul::Gemm, MatmulVariant};
use pagetrain::rng::Rng;
use pagetrain::{Context, DType};

/// Whether this adapter runs `matmul_coop`; says so when it does not (see the module docs).
fn has_coop(ctx: &Context) -> bool {
    let has = ctx.kernels.tuning.coop_f16;
    if !has {
        let missing = format!("{} has no cooperative matrices the kernel can use", ctx.gpu.describe());
        common::skip_unless_required("PAGETRAIN_REQUIRE_COOP", &missing, "the cooperative-matrix tests");
    }
    has
}

/// One product `C[b] = alpha·op(A[b])·op(B[b]) (+ bias) (+ beta·C[b])` on A and B of element
/// types `ab` (f16, or one of them f32, which the kernel rounds to f16), with `pre` elements of
/// prefix before each operand (reached through `offsets`).
fn check(ctx: &Context, rng: &mut Rng, g: Gemm, ab: [DType; 2], c_dtype: DType, with_bias: bool, pre: [usize; 3]) {
    let Gemm { batch, m, n, k, trans_a, trans_b, beta, alpha, .. } = g;
    let held = |v: Vec<f32>, dt: DType| if dt == DType::F16 { round_f16(&v) } else { v };
    let a = held(randn(rng, pre[0] + batch * m * k, 1.0), ab[0]);
    let b = held(randn(rng, pre[1] + batch * k * n, 1.0), ab[1]);
    let bias = randn(rng, n, 1.0);
    let mut c0 = randn(rng, pre[2] + batch * m * n, 1.0);
    if c_dtype == DType::F16 {
        c0 = round_f16(&c0);
    }
    let (ga, gb, gbias) = (
        Guarded::of(ctx, ab[0], a.len(), Some(&a)),
        Guarded::of(ctx, ab[1], b.len(), Some(&b)),
        Guarded::new(ctx, n, Some(&bias)),
    );
    let dummy = Guarded::new(ctx, 4, Some(&[0.0; 4]));
    // the prefix of C must survive; the product part is poisoned unless it accumulates
    let mut init = c0.clone();
    if beta == 0.0 {
        init[pre[2]..].iter_mut().for_each(|v| *v = f32::NAN);
    }
    let gc = Guarded::of(ctx, c_dtype, init.len(), Some(&init));
    let g = Gemm { offsets: pre, ..g };
    let bias_view = with_bias.then(|| gbias.view());
    kernels::matmul::matmul_variant(
        &ctx.kernels,
        MatmulVariant::Coop,
        &gc.view(),
        &ga.view(),
        &gb.view(),
        bias_view.as_ref(),
        &dummy.view(),
        g,
    )
    .unwrap();
    let bias64 = to64(&bias);
    // the kernel multiplies f16 values: an f32 operand rounded
    let product = r::matmul_forward(
        &to64(&round_f16(&a[pre[0]..])),
        &to64(&round_f16(&b[pre[1]..])),
        with_bias.then_some(&bias64[..]),
        batch,
        m,
        n,
        k,
        trans_a,
        trans_b,
        false,
        alpha as f64,
    );
    let mut want = to64(&c0[..pre[2]]);
    want.extend(product.iter().zip(&c0[pre[2]..]).map(|(p, &c)| p + beta as f64 * c as f64));
    let rtol = if c_dtype == DType::F16 { 1.5e-3 } else { 1e-4 };
    let what = format!(
        "matmul_coop {batch}x{m}x{n}x{k} ta={trans_a} tb={trans_b} alpha={alpha} bias={with_bias} beta={beta} ab {ab:?} c {c_dtype:?} pre {pre:?}"
    );
    assert_close(&what, &gc.read(ctx), &want, rtol, 1e-4 * (k as f64).sqrt());
}

#[test]
fn coop_matmul_matches_reference_in_every_layout_epilogue_and_awkward_shape() {
    let ctx = ctx();
    if !has_coop(&ctx) {
        return;
    }
    let mut rng = Rng::new(41);
    // (m, n, k): single elements, K below one 32-deep slice and between slices, odd sizes across
    // tile edges (three tiles down M), and multiples of 8 (4-halves loads) with partial tiles and
    // several slices
    let shapes = [
        (1, 1, 1),
        (3, 65, 17),
        (17, 129, 8),
        (130, 3, 40),
        (65, 200, 1000),
        (136, 264, 72),
        (256, 128, 64),
        // tiles wholly inside both operands beside tiles that are not, in one dispatch
        (264, 136, 128),
        // 17 rows of tiles: a whole group of the kernel's tile order (16 rows) and one row
        (2100, 136, 24),
        (300, 72, 24),
        (511, 129, 33),
    ];
    let mut runs = 0;
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for layout in 0..4 {
            let (trans_a, trans_b) = (layout & 1 != 0, layout & 2 != 0);
            let with_bias = (i + layout) % 2 == 0;
            let beta = ((i + layout) % 3 == 0) as u8 as f32;
            let c_dtype = if (i + layout) % 4 == 1 { DType::F16 } else { DType::F32 };
            // mostly f16 × f16; every shape also once with an f32 A and once with an f32 B
            let ab = match layout {
                1 => [DType::F32, DType::F16],
                2 => [DType::F16, DType::F32],
                _ => [DType::F16; 2],
            };
            let g = Gemm { trans_a, trans_b, beta, alpha: 0.75, ..Gemm::new(m, n, k) };
            check(&ctx, &mut rng, g, ab, c_dtype, with_bias, [0; 3]);
            runs += 1;
        }
    }
    assert_eq!(runs, shapes.len() * 4);
}

#[test]
fn coop_matmul_handles_batches_and_row_chunk_offsets() {
    let ctx = ctx();
    if !has_coop(&ctx) {
        return;
    }
    let mut rng = Rng::new(43);
    // batch entries 8-aligned (4-halves loads) and not; prefixes aligned and not
    for &(batch, m, n, k, pre) in &[
        (3, 40, 24, 16, [8, 16, 5]),
        (2, 33, 17, 9, [3, 5, 2]),
        (2, 64, 136, 48, [5, 8, 0]),
        (1, 129, 128, 256, [16, 3, 7]),
    ] {
        for layout in 0..4 {
            let (trans_a, trans_b) = (layout & 1 != 0, layout & 2 != 0);
            let g = Gemm { batch, trans_a, trans_b, beta: 1.0, alpha: 0.75, ..Gemm::new(m, n, k) };
            let ab = if layout == 2 { [DType::F32, DType::F16] } else { [DType::F16; 2] };
            check(&ctx, &mut rng, g, ab, DType::F32, layout == 3, pre);
        }
    }
}

#[test]
fn coop_matmul_stores_whole_tiles_of_a_plain_f32_c_directly() {
    // alpha = 1, no bias, f32 C with rows a multiple of 4 long: whole 128x128 tiles load C (beta =
    // 1) and store their accumulators straight to it, edge tiles take the epilogue; N = 130 and
    // alpha = 0.5 keep every tile on the epilogue for comparison
    let ctx = ctx();
    if !has_coop(&ctx) {
        return;
    }
    let mut rng = Rng::new(53);
    for &(batch, m, n, k, pre) in &[(1, 256, 264, 72, [0; 3]), (2, 300, 136, 40, [8, 0, 4]), (1, 128, 130, 64, [0; 3])]
    {
        for layout in 0..4 {
            for (beta, alpha) in [(0.0, 1.0), (1.0, 1.0), (1.0, 0.5)] {
                let (trans_a, trans_b) = (layout & 1 != 0, layout & 2 != 0);
                let g = Gemm { batch, trans_a, trans_b, beta, alpha, ..Gemm::new(m, n, k) };
                check(&ctx, &mut rng, g, [DType::F16; 2], DType::F32, false, pre);
            }
        }
    }
}

/// `x`'s rows of `len` stored in `rows` rows of `stride`: each padded with `fill`, the rows past
/// `x`'s NaN (what a buffer may hold after a matrix).
fn padded_rows(x: &[f32], len: usize, stride: usize, fill: f32, rows: usize) -> Vec<f32> {
    let mut stored = vec![f32::NAN; rows * stride];
    for (dst, src) in stored.chunks_mut(stride).zip(x.chunks(len)) {
        dst[..len].copy_from_slice(src);
        dst[len..].iter_mut().for_each(|v| *v = fill);
    }
    stored
}

#[test]
fn coop_matmul_reads_operands_with_padded_rows() {
    // A's or B's stored rows padded to a multiple of 8 (Gemm::a_stride / b_stride, as GPT-2's
    // dlogits and the head's transposed weight are): each layout of each operand, rows off a
    // multiple of 8 and then read 8 halves at a time, C overwritten (poisoned first) or
    // accumulated. B (K,N)'s padding holds NaN: it only meets columns of C that are never written.
    let ctx = ctx();
    let dummy = Guarded::new(&ctx, 4, Some(&[0.0; 4]));
    // every adapter: the other kernels refuse padded rows, and rows shorter than the operand's are refused
    let x = Guarded::new(&ctx, 64, Some(&[0.5; 64]));
    let padded_on = |variant, a_stride, b_stride| {
        let g = Gemm { a_stride, b_stride, ..Gemm::new(2, 2, 5) };
        kernels::matmul::matmul_variant(&ctx.kernels, variant, &x.view(), &x.view(), &x.view(), None, &dummy.view(), g)
    };
    assert!(padded_on(MatmulVariant::Large, 8, 0).is_err());
    assert!(padded_on(MatmulVariant::Tiled, 8, 0).is_err());
    assert!(padded_on(MatmulVariant::Large, 0, 8).is_err());
    assert!(padded_on(MatmulVariant::Coop, 4, 0).is_err());
    assert!(padded_on(MatmulVariant::Coop, 0, 1).is_err());
    if !has_coop(&ctx) {
        return;
    }
    let mut rng = Rng::new(61);
    for &(m, n, k, trans_a, trans_b, pad_a, beta) in &[
        (33, 70, 57, false, false, true, 0.0),
        (130, 200, 1001, false, false, true, 1.0),
        (57, 96, 129, true, false, true, 0.0),
        (1001, 72, 64, true, false, true, 1.0),
        (33, 201, 70, false, false, false, 0.0),
        (130, 1001, 96, true, false, false, 1.0),
        (70, 57, 129, false, true, false, 0.0),
        (65, 33, 1001, false, true, false, 1.0),
    ] {
        let a = round_f16(&randn(&mut rng, m * k, 1.0));
        let b = round_f16(&randn(&mut rng, k * n, 1.0));
        let a_len = if trans_a { m } else { k };
        let b_len = if trans_b { k } else { n };
        let (a_stride, b_stride) = if pad_a { (a_len.next_multiple_of(8), 0) } else { (0, b_len.next_multiple_of(8)) };
        let stored_a = if pad_a { padded_rows(&a, a_len, a_stride, 0.0, a.len() / a_len) } else { a.clone() };
        // (stored (N,K), B's padding takes part in the sums: zeros, as the launcher's contract says)
        let fill = if trans_b { 0.0 } else { f32::NAN };
        let stored_b = if pad_a { b.clone() } else { padded_rows(&b, b_len, b_stride, fill, b.len() / b_len) };
        let c0 = if beta == 0.0 { vec![f32::NAN; m * n] } else { randn(&mut rng, m * n, 1.0) };
        let (ga, gb, gc) = (
            Guarded::of(&ctx, DType::F16, stored_a.len(), Some(&stored_a)),
            Guarded::of(&ctx, DType::F16, stored_b.len(), Some(&stored_b)),
            Guarded::new(&ctx, m * n, Some(&c0)),
        );
        let g = Gemm { trans_a, trans_b, beta, a_stride, b_stride, ..Gemm::new(m, n, k) };
        let (c, av, bv) = (gc.view(), ga.view(), gb.view());
        kernels::matmul::matmul_variant(&ctx.kernels, MatmulVariant::Coop, &c, &av, &bv, None, &dummy.view(), g)
            .unwrap();
        let mut want = r::matmul_forward(&to64(&a), &to64(&b), None, 1, m, n, k, trans_a, trans_b, false, 1.0);
        if beta != 0.0 {
            want.iter_mut().zip(&c0).for_each(|(w, &c)| *w += c as f64);
        }
        let what = format!(
            "matmul_coop {m}x{n}x{k} ta={trans_a} tb={trans_b} beta={beta}, A rows of {a_stride}, B rows of {b_stride}"
        );
        assert_close(&what, &gc.read(&ctx), &want, 1e-4, 1e-4 * (k as f64).sqrt());
    }
}

#[test]
fn coop_matmul_reads_rows_padded_to_whole_tiles_without_bounds_tests() {
    // Rows padded to whole tiles (matmul::coop_padded_len, as GPT-2's head pads its 50257-long
    // rows) and buffers holding rows past M or N: every chunk the tiles fetch lies inside, so the
    // launcher compiles the fetches without bounds tests. Only padding past K takes part in the
    // sums and must be zeros; everything past M or N is NaN here, and must not reach C.
    use kernels::matmul::{coop_loads_inside, coop_padded_len};
    let ctx = ctx();
    let dummy = Guarded::new(&ctx, 4, Some(&[0.0; 4]));
    let mut rng = Rng::new(71);
    // `x`'s rows of `len` in rows of coop_padded_len(len), padded with `fill`, NaN rows added up
    // to `rows`; and the stride to give the product (0: packed)
    let store = |x: &[f32], len: usize, fill: f32, rows: usize| -> (Vec<f32>, usize) {
        let stride = coop_padded_len(len);
        (padded_rows(x, len, stride, fill, rows), if stride == len { 0 } else { stride })
    };
    for &(m, n, k, trans_a, trans_b, what) in &[
        (256, 1001, 128, false, false, "B (K,N) padded with NaN: the head's logits"),
        (200, 128, 1001, false, true, "A and B padded past K, NaN rows past M: the head's dx"),
        (1001, 128, 256, true, false, "A (K,M) padded with NaN: the head's dwte"),
    ] {
        let a = round_f16(&randn(&mut rng, m * k, 1.0));
        let b = round_f16(&randn(&mut rng, k * n, 1.0));
        // (stored rows of length, fill, rows the buffer holds)
        let a_is = if trans_a { (m, f32::NAN, k) } else { (k, 0.0, m.next_multiple_of(128)) };
        let b_is = if trans_b { (k, 0.0, n.next_multiple_of(128)) } else { (n, f32::NAN, k) };
        let (stored_a, a_stride) = store(&a, a_is.0, a_is.1, a_is.2);
        let (stored_b, b_stride) = store(&b, b_is.0, b_is.1, b_is.2);
        let (ga, gb, gc) = (
            Guarded::of(&ctx, DType::F16, stored_a.len(), Some(&stored_a)),
            Guarded::of(&ctx, DType::F16, stored_b.len(), Some(&stored_b)),
            Guarded::new(&ctx, m * n, Some(&vec![f32::NAN; m * n])),
        );
        let g = Gemm { trans_a, trans_b, a_stride, b_stride, ..Gemm::new(m, n, k) };
        let (c, av, bv) = (gc.view(), ga.view(), gb.view());
        assert!(coop_loads_inside(&g, &av, &bv), "{what}: {g:?} should fetch without bounds tests");
        // a K past what the padding covers, or A's buffer an element short of the last tile
        let deeper = Gemm { k: coop_padded_len(k) + 1, ..g };
        let short = ga.view().elements(0, stored_a.len() - 1);
        assert!(!coop_loads_inside(&deeper, &av, &bv), "{what}: K past the padding");
        assert!(!coop_loads_inside(&g, &short, &bv), "{what}: A's buffer an element short");
        if !has_coop(&ctx) {
            continue;
        }
        kernels::matmul::matmul_variant(&ctx.kernels, MatmulVariant::Coop, &c, &av, &bv, None, &dummy.view(), g)
            .unwrap();
        let want = r::matmul_forward(&to64(&a), &to64(&b), None, 1, m, n, k, trans_a, trans_b, false, 1.0);
        assert_close(what, &gc.read(&ctx), &want, 1e-4, 1e-4 * (k as f64).sqrt());
    }
}

#[test]
fn f16_products_use_cooperative_matrices_exactly_where_the_adapter_has_them() {
    // Runs everywhere: the automatic choice follows the adapter, and the kernel forced on an
    // adapter without cooperative matrices (or on f32 operands) is an error, not a wrong result.
    let ctx = ctx();
    let mut rng = Rng::new(47);
    let (m, n, k) = (33, 17, 24);
    let a = round_f16(&randn(&mut rng, m * k, 1.0));
    let b = round_f16(&randn(&mut rng, k * n, 1.0));
    let f32_a = Guarded::new(&ctx, a.len(), Some(&a));
    let gc = Guarded::new(&ctx, m * n, None);
    let dummy = Guarded::new(&ctx, 4, Some(&[0.0; 4]));
    let g = Gemm::new(m, n, k);
    let forced_f32 = kernels::matmul::matmul_variant(
        &ctx.kernels,
        MatmulVariant::Coop,
        &gc.view(),
        &f32_a.view(),
        &f32_a.view(),
        None,
        &dummy.view(),
        g,
    );
    assert!(forced_f32.is_err(), "the cooperative kernel took f32 operands");
    if !ctx.gpu.features.contains(wgpu::Features::SHADER_F16) {
        eprintln!("skipped the f16 half: {} has no shader-f16", ctx.gpu.describe());
        return;
    }
    let (ga, gb) = (Guarded::of(&ctx, DType::F16, a.len(), Some(&a)), Guarded::of(&ctx, DType::F16, b.len(), Some(&b)));
    let picked = kernels::matmul::for_operands(&ctx.kernels, MatmulVariant::Large, &ga.view(), &gb.view());
    let want_variant = if ctx.kernels.tuning.coop_f16 { MatmulVariant::Coop } else { MatmulVariant::Large };
    assert_eq!(picked, want_variant);
    assert_eq!(
        kernels::matmul::for_operands(&ctx.kernels, MatmulVariant::Direct, &ga.view(), &gb.view()),
        MatmulVariant::Direct
    );
    // f16 with f32: the product is f16 where the adapter has cooperative matrices; f32 × f32 never
    assert_eq!(
        kernels::matmul::for_operands(&ctx.kernels, MatmulVariant::Large, &f32_a.view(), &gb.view()),
        want_variant
    );
    assert_eq!(
        kernels::matmul::for_operands(&ctx.kernels, MatmulVariant::Large, &f32_a.view(), &f32_a.view()),
        MatmulVariant::Large
    );
    if !ctx.kernels.tuning.coop_f16 {
        let forced = kernels::matmul::matmul_variant(
            &ctx.kernels,
            MatmulVariant::Coop,
            &gc.view(),
            &ga.view(),
            &gb.view(),
            None,
            &dummy.view(),
            g,
        );
        assert!(forced.is_err(), "the cooperative kernel ran on {} without cooperative matrices", ctx.gpu.describe());
    }
    // the automatic path gives the product either way
    kernels::matmul::matmul(&ctx.kernels, &gc.view(), &ga.view(), &gb.view(), None, &dummy.view(), g).unwrap();
    let want = r::matmul_forward(&to64(&a), &to64(&b), None, 1, m, n, k, false, false, false, 1.0);
    assert_close("automatic f16 product", &gc.read(&ctx), &want, 1e-4, 1e-3);
}

#[test]
fn a_linear_backward_reading_its_weight_transposed_matches_reference() {
    // dX = dY · Wᵀ of an f16 linear with enough rows that the product reads a transposed copy
    // of W (NN) instead of W transposed (NT); odd sizes, so both tails are partial tiles.
    let ctx = ctx();
    if !has_coop(&ctx) {
        return;
    }
    let mut rng = Rng::new(53);
    let (m, k, n) = (1030, 40, 77);
    let x = randn(&mut rng, m * k, 1.0);
    let w = round_f16(&randn(&mut rng, k * n, 1.0));
    let dy = round_f16(&randn(&mut rng, m * n, 1.0));
    let xt = ctx.from_f32("x", &[m, k], &x, true).unwrap();
    let xh = pagetrain::ops::cast(&ctx, &xt, DType::F16).unwrap();
    let wh = pagetrain::ops::cast(&ctx, &ctx.from_f32("w", &[k, n], &w, false).unwrap(), DType::F16).unwrap();
    let y = pagetrain::ops::linear(&ctx, &xh, &wh, None).unwrap();
    let dyh = pagetrain::ops::cast(&ctx, &ctx.from_f32("dy", &[m, n], &dy, false).unwrap(), DType::F16).unwrap();
    let mut grads = pagetrain::autograd::Grads::new();
    ctx.backward_from(&y, &dyh, &mut grads).unwrap();
    let dx = pollster::block_on(ctx.to_f32(&grads.get(&xt).unwrap())).unwrap();
    // dX (m, k) = dY (m, n) · Wᵀ: W stored (k, n) is B stored (N, K) read transposed.
    let want = r::matmul_forward(&to64(&dy), &to64(&w), None, 1, m, k, n, false, true, false, 1.0);
    assert_close("linear backward dX, f16 on cooperative matrices", &dx, &want, 2e-3, 1e-3 * (n as f64).sqrt());
}

#[test]
fn mixed_precision_head_matches_the_reference_with_logits_kept_made_again_or_gradients_made_in_forward() {
    // f16 x: on cooperative matrices the head multiplies x by an f16 copy of wte stored (C,V),
    // rows padded with zeros past V = 1001 to whole tiles (ops::lm_head's HeadWeight), in
    // the forward and, where the logits are not kept (budgets of 1 to 3 MiB: chunks of 24 to 64
    // rows), again in backward, whose dx reads that copy transposed (or in forward, where the
    // gradients are made there: `lm_head_loss_for_backward`); elsewhere it reads wte itself (the
    // f16 suites' adapters, lavapipe in CI). 256 rows of 128 make every fetch of all three
    // products lie inside the padded operands (matmul_coop without bounds tests). Against the f64
    // reference on f16-rounded x and wte, its logits rounded to f16 as the head makes them
    // (ops::logits_dtype): the loss, dx, and dwte.
    let mut rng = Rng::new(67);
    let f16_round = |l: f64| half::f16::from_f64(l).to_f64();
    // (V = 5000, padded to 5120: dx's chunks split into two K slices on cooperative matrices)
    for (n, c, v) in [(70, 64, 1001), (256, 128, 1001), (70, 64, 5000)] {
        let x = round_f16(&randn(&mut rng, n * c, 1.0));
        let w = randn(&mut rng, v * c, 0.5);
        let w16 = round_f16(&w);
        let targets: Vec<u32> = (0..n).map(|_| rng.below(v) as u32).collect();
        let (mut want_loss, mut want_dx, mut want_dw) = (0.0, vec![0.0; n * c], vec![0.0; v * c]);
        for r in 0..n {
            let logits: Vec<f64> =
                (0..v).map(|j| f16_round((0..c).map(|k| x[r * c + k] as f64 * w16[j * c + k] as f64).sum())).collect();
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = logits.iter().map(|l| (l - m).exp()).sum();
            want_loss += (m + sum.ln() - logits[targets[r] as usize]) / n as f64;
            for (j, l) in logits.iter().enumerate() {
                let g = ((l - m).exp() / sum - (j == targets[r] as usize) as u8 as f64) / n as f64;
                (0..c).for_each(|k| want_dx[r * c + k] += g * w[j * c + k] as f64);
                (0..c).for_each(|k| want_dw[j * c + k] += g * x[r * c + k] as f64);
            }
        }
        // paged: a budget of two f32 wte copies (at least 1 MiB) keeps no logits
        let budgets = [None, Some((1u64 << 20).max(8 * (v * c) as u64))];
        for (budget, in_forward) in budgets.into_iter().flat_map(|b| [(b, false), (b, true)]) {
            let ctx = common::paged_ctx(&pagetrain::pager::PagerOptions {
                budget,
                slot_bytes: 64 << 10,
                ..Default::default()
            });
            if !common::has_f16(&ctx) {
                return;
            }
            assert_eq!(pagetrain::ops::head_keeps_logits(&ctx, n, v, DType::F16), budget.is_none());
            let x32 = ctx.from_f32("x", &[n, c], &x, true).unwrap();
            let xt = pagetrain::ops::cast(&ctx, &x32, DType::F16).unwrap();
            let wt = ctx.from_f32("wte", &[v, c], &w, true).unwrap();
            let backward = pagetrain::ops::LossBackward { seed: 1.0, wte_grad: None };
            let loss = if in_forward {
                pagetrain::ops::lm_head_loss_for_backward(&ctx, &xt, &wt, &targets, None, backward).unwrap()
            } else {
                pagetrain::ops::lm_head_loss(&ctx, &xt, &wt, &targets, None).unwrap()
            };
            let mut grads = pagetrain::autograd::Grads::new();
            ctx.backward(&loss, &mut grads, 1.0).unwrap();
            let what = |of: &str| format!("f16 head {of}, {n}x{c}, V {v}, budget {budget:?}, in forward {in_forward}");
            let got = pollster::block_on(ctx.to_f32(&loss)).unwrap();
            assert_close(&what("loss"), &got, &[want_loss], 1e-4, 1e-4);
            let dx = pollster::block_on(ctx.to_f32(&grads.get(&x32).unwrap())).unwrap();
            assert_close(&what("dx"), &dx, &want_dx, 2e-3, 2e-3);
            let dw = pollster::block_on(ctx.to_f32(&grads.get(&wt).unwrap())).unwrap();
            assert_close(&what("dwte"), &dw, &want_dw, 2e-3, 2e-3);
        }
    }
}

#[test]
fn deep_products_split_into_k_slices_match_the_reference() {
    // C = alpha·A·op(B) + beta·C over a deep K as `splits` K slices (a batch whose entries are
    // a slice apart: Gemm::batch_strides) summed by a product with ones, as the head's dx does.
    // A's rows padded (zeros), awkward M and N, B stored (K,N) and (N,K), f32 and f16 C, C
    // poisoned where it is overwritten.
    use kernels::matmul::{matmul_split_deep, split_k_deep};
    let tiles_of = |m, n, k| Gemm { trans_b: true, ..Gemm::new(m, n, k) };
    assert_eq!(split_k_deep(MatmulVariant::Coop, &tiles_of(1024, 768, 51200)), 16, "the head's dx chunk");
    assert_eq!(split_k_deep(MatmulVariant::Coop, &tiles_of(1024, 768, 50304)), 6, "50304 = 64·2·3·131");
    assert_eq!(split_k_deep(MatmulVariant::Coop, &tiles_of(1024, 768, 50257)), 1, "K past a slice of 64");
    assert_eq!(split_k_deep(MatmulVariant::Coop, &tiles_of(128, 128, 4096)), 2, "slices of at least 2048");
    assert_eq!(split_k_deep(MatmulVariant::Large, &tiles_of(1024, 768, 50304)), 1, "cooperative matrices only");
    assert_eq!(split_k_deep(MatmulVariant::Coop, &tiles_of(8192, 3072, 50304)), 1, "fills the GPU already");
    let ctx = ctx();
    let dummy = Guarded::new(&ctx, 4, Some(&[0.0; 4]));
    let mut rng = Rng::new(83);
    // a split the arguments cannot serve is an error before anything runs
    let x = Guarded::new(&ctx, 64, Some(&[0.5; 64]));
    let refuse = |g: Gemm, splits| {
        matmul_split_deep(&ctx.kernels, &x.view(), &x.view(), &x.view(), &x.view(), &x.view(), &dummy.view(), splits, g)
    };
    assert!(refuse(Gemm::new(2, 2, 9), 2).is_err(), "K not a multiple of the splits");
    assert!(refuse(Gemm { trans_a: true, ..Gemm::new(2, 2, 8) }, 2).is_err(), "A transposed");
    assert!(refuse(Gemm::new(8, 8, 8), 2).is_err(), "64 floats of partials, not 2·8·8");
    if !has_coop(&ctx) {
        return;
    }
    for &(m, n, k, splits, trans_b, c_dtype, beta) in &[
        (200, 72, 384, 3, true, DType::F32, 0.0),
        (129, 136, 512, 4, false, DType::F16, 0.0),
        (70, 33, 768, 6, true, DType::F16, 0.5),
        (256, 128, 1024, 2, false, DType::F32, 1.0),
    ] {
        let a = round_f16(&randn(&mut rng, m * k, 1.0));
        let b = round_f16(&randn(&mut rng, k * n, 1.0));
        let a_stride = k + 128;
        let stored_a = padded_rows(&a, k, a_stride, 0.0, m);
        let mut c0 = randn(&mut rng, m * n, 1.0);
        if c_dtype == DType::F16 {
            c0 = round_f16(&c0);
        }
        let init = if beta == 0.0 { vec![f32::NAN; m * n] } else { c0.clone() };
        let (ga, gb, gc) = (
            Guarded::of(&ctx, DType::F16, stored_a.len(), Some(&stored_a)),
            Guarded::of(&ctx, DType::F16, b.len(), Some(&b)),
            Guarded::of(&ctx, c_dtype, m * n, Some(&init)),
        );
        let (parts, ones) =
            (Guarded::new(&ctx, splits * m * n, None), Guarded::new(&ctx, splits, Some(&vec![1.0; splits])));
        let g = Gemm { trans_b, alpha: 0.75, beta, a_stride, ..Gemm::new(m, n, k) };
        let (c, av, bv) = (gc.view(), ga.view(), gb.view());
        matmul_split_deep(&ctx.kernels, &c, &av, &bv, &parts.view(), &ones.view(), &dummy.view(), splits, g).unwrap();
        let mut want = r::matmul_forward(&to64(&a), &to64(&b), None, 1, m, n, k, false, trans_b, false, 0.75);
        want.iter_mut().zip(&c0).for_each(|(w, &c)| *w += beta as f64 * c as f64);
        let rtol = if c_dtype == DType::F16 { 1.5e-3 } else { 1e-4 };
        let what = format!("deep split {m}x{n}x{k} / {splits} tb={trans_b} c {c_dtype:?} beta={beta}");
        assert_close(&what, &gc.read(&ctx), &want, rtol, 1e-4 * (k as f64).sqrt());
        parts.read(&ctx);
    }
}
