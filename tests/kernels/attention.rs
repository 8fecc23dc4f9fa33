//! Fused attention, every kernel (rows, blocked, lanes) forward and backward, against the
//! reference.

use super::*;

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
                true,
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
