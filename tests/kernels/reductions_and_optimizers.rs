//! Reductions, sums of squares, in-pass clears and the optimizers against the reference.

use super::*;
use common::AdamWInputs;

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
    // (a workgroup per 64 columns, 4 a thread: ragged quads and groups; from 16384 columns a
    // thread per column: split-K's few rows of m·n)
    for &(rows, cols) in &[
        (1, 1),
        (17, 3),
        (1000, 65),
        (3, 1000),
        (1024, 1),
        (4097, 3),
        (2049, 300),
        (1100, 771),
        (3, 20001),
        (9, 16500),
    ] {
        let x = randn(&mut rng, rows * cols, 1.0);
        let gx = Guarded::new(&ctx, x.len(), Some(&x));
        let want: Vec<f64> = r::sum_rows(&to64(&x), rows, cols).iter().map(|v| v + 1.0).collect();
        // one stage, and blocks of rows first where the shape calls for it
        let blocks = kernels::reduce::column_blocks(rows, cols);
        assert_eq!(blocks > 1, rows >= 1024 && cols < 16384, "{rows}x{cols}: {blocks} blocks");
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
fn optimizers_match_reference() {
    let ctx = ctx();
    let mut rng = Rng::new(10);
    // (past 2048: more than one workgroup of AdamW's 8 parameters a thread)
    for &n in AWKWARD.iter().chain(&[2049, 70_001]) {
        let AdamWInputs { p, g, m, v, gp, gg, gm, gv, clip } = AdamWInputs::draw(&ctx, &mut rng, n);
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
fn sumsq_slots_matches_reference() {
    use kernels::sumsq::{sumsq_slots, TENSORS};
    let ctx = ctx();
    let mut rng = Rng::new(32);
    // Lengths around the four loads a thread takes (1024 a workgroup) and up to one stage's end;
    // slots out of order, some left alone.
    let lens = [1usize, 767, 1023, 1025, 3000, 16384, 300];
    let slots = [9usize, 2, 7, 0, 4, 11, 5];
    for count in [1, 3, TENSORS] {
        let xs: Vec<Vec<f32>> = lens[..count].iter().map(|&n| randn(&mut rng, n, 1.0)).collect();
        let guarded: Vec<Guarded> = xs.iter().map(|x| Guarded::new(&ctx, x.len(), Some(x))).collect();
        let views: Vec<_> = guarded.iter().map(|g| g.view()).collect();
        let args: Vec<_> = (0..count).map(|j| (&views[j], lens[j], slots[j])).collect();
        let init: Vec<f32> = (0..12).map(|i| i as f32 + 0.5).collect();
        let mut want: Vec<f64> = init.iter().map(|&v| v as f64).collect();
        let mut poisoned = init.clone();
        for j in 0..count {
            poisoned[slots[j]] = f32::NAN;
            want[slots[j]] = xs[j].iter().map(|v| (*v as f64).powi(2)).sum();
        }
        let out = Guarded::new(&ctx, poisoned.len(), Some(&poisoned));
        sumsq_slots(&ctx.kernels, &out.view(), &args).unwrap();
        assert_close(&format!("sumsq_slots of {count}"), &out.read(&ctx), &want, 1e-5, 1e-5);
    }
    let long = Guarded::new(&ctx, 16385, Some(&randn(&mut rng, 16385, 1.0)));
    let v = long.view();
    let err = sumsq_slots(&ctx.kernels, &v, &[(&v, 16385, 0)]).unwrap_err();
    assert!(err.to_string().contains("at most 16384"), "{err}");
    let too_many: Vec<_> = (0..TENSORS + 1).map(|j| (&v, 4, j)).collect();
    let err = sumsq_slots(&ctx.kernels, &v, &too_many).unwrap_err();
    assert!(err.to_string().contains("1 to 7"), "{err}");
}

#[test]
fn partial_sums_into_regions_then_region_sums_match_reference() {
    use kernels::reduce::{partial_sums, region_sums, MAX_PARTIALS};
    let ctx = ctx();
    let mut rng = Rng::new(34);
    // Three regions of MAX_PARTIALS floats, zero where no partial sum lands; the middle one is
    // written through a view that starts inside the buffer (4 KiB in: binding-aligned).
    let lens = [5000usize, 1_500_000, 3];
    let regions = Guarded::new(&ctx, 3 * MAX_PARTIALS, Some(&vec![0.0; 3 * MAX_PARTIALS]));
    let mut want = Vec::new();
    for (j, &n) in lens.iter().enumerate() {
        let x = randn(&mut rng, n, 1.0);
        let gx = Guarded::new(&ctx, n, Some(&x));
        let region = regions.view().elements(j * MAX_PARTIALS, MAX_PARTIALS);
        let groups = partial_sums(&ctx.kernels, &region, &gx.view(), n, true).unwrap();
        assert_eq!(groups, n.div_ceil(1024).min(MAX_PARTIALS));
        want.push(r::sum_forward(&to64(&x), true));
    }
    let out = Guarded::new(&ctx, 3, None);
    region_sums(&ctx.kernels, &out.view(), &regions.view(), 3, MAX_PARTIALS).unwrap();
    assert_close("region sums of squares", &out.read(&ctx), &want, 1e-5, 1e-5);
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
