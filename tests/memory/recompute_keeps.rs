//! What a recomputed block runs again in backward: not its attention, whose output it keeps
//! from forward (`Gpt::set_keep_attention`), and not its last product and residual add, whose
//! outputs no backward reads (`autograd::Replay::unread`). The same losses, bit for bit, for
//! fewer dispatches — each counted against the ops' own dispatches.

use super::{cfg, context, tmpdir, to64};
use crate::common::{assert_close, randn};
use pagetrain::ops;
use pagetrain::rng::Rng;
use pagetrain::train::{TrainConfig, Trainer};
use pagetrain::Context;

/// Losses of `steps` steps, and the dispatches a step records after the first.
fn run(ctx: &Context, recompute: bool, keep_attention: bool, steps: usize) -> (Vec<f32>, u64, Trainer) {
    let out = tmpdir("recompute-keeps");
    let mut t = Trainer::new(ctx, TrainConfig { recompute, auto_recompute: false, ..cfg(&out) }, None).unwrap();
    t.model.set_keep_attention(keep_attention);
    assert_eq!(t.model.recomputes(), recompute);
    let mut losses = vec![pollster::block_on(t.train_step(ctx)).unwrap()];
    let before = ctx.kernels.dispatch_count();
    losses.extend((1..steps).map(|_| pollster::block_on(t.train_step(ctx)).unwrap()));
    (losses, (ctx.kernels.dispatch_count() - before) / (steps as u64 - 1), t)
}

/// Dispatches `f` records.
fn dispatches(ctx: &Context, f: impl FnOnce()) -> u64 {
    let before = ctx.kernels.dispatch_count();
    f();
    ctx.kernels.dispatch_count() - before
}

#[test]
fn recomputed_blocks_keep_their_attention_and_leave_out_unread_ops_for_the_same_bits() {
    let steps = 4;
    let stored_ctx = context(None);
    let (stored, stored_dispatches, t) = run(&stored_ctx, false, true, steps);
    let again_ctx = context(None);
    let (again, again_dispatches, _) = run(&again_ctx, true, false, steps);
    let kept_ctx = context(None);
    let (kept, kept_dispatches, _) = run(&kept_ctx, true, true, steps);
    assert_eq!(kept, again, "keeping the attention changed the losses");
    assert_close("recomputed vs stored", &kept, &to64(&stored), 0.0, 1e-6);

    // One block's forward, its attention and its tail (the MLP's output product and the
    // residual add), counted on their own.
    let ctx = &stored_ctx;
    let (block, c) = (&t.model.blocks[0], t.model.config.n_embd);
    let (b, n) = (t.cfg.batch_size, t.cfg.seq_len);
    let mut rng = Rng::new(3);
    let x = ctx.from_f32("x", &[b, n, c], &randn(&mut rng, b * n * c, 1.0), false).unwrap();
    let hidden = ctx.from_f32("a", &[b, n, 4 * c], &randn(&mut rng, b * n * 4 * c, 1.0), false).unwrap();
    let qkv = ctx.from_f32("qkv", &[b, n, 3 * c], &randn(&mut rng, b * n * 3 * c, 1.0), false).unwrap();
    let (forward, attention, tail) = ctx.no_grad(|| {
        let forward = dispatches(ctx, || drop(block.forward(ctx, &x, false).unwrap()));
        let attention = dispatches(ctx, || drop(ops::causal_self_attention(ctx, &qkv, block.attn.n_head).unwrap()));
        let tail =
            dispatches(ctx, || drop(ops::add(ctx, &x, &block.mlp.c_proj.forward(ctx, &hidden).unwrap()).unwrap()));
        (forward, attention, tail)
    });
    let blocks = t.model.blocks.len() as u64;
    println!(
        "dispatches a step: stored {stored_dispatches}, recomputed {again_dispatches}, keeping attention {kept_dispatches}; a block's forward {forward}, attention {attention}, tail {tail}"
    );
    assert!(attention >= 1 && tail >= 2 && forward > attention + tail, "{forward} / {attention} / {tail}");
    assert_eq!(again_dispatches - stored_dispatches, blocks * (forward - tail), "the run again left out its tail");
    assert_eq!(again_dispatches - kept_dispatches, blocks * attention, "kept attention ran again");
}

#[test]
fn a_run_that_pages_runs_attention_again_rather_than_page_its_output() {
    let resident = context(None);
    let (full, _, t) = run(&resident, true, true, 4);
    assert!(t.model.keeps_attention(), "a resident run stopped keeping attention");
    let paged = context(Some(resident.pager.live_bytes().1 / 4));
    let (l, _, t) = run(&paged, true, true, 4);
    assert!(paged.pager.counters().evictions > 0, "the run did not page");
    assert!(!t.model.keeps_attention(), "a paging run still keeps its attention outputs");
    assert_close("paged, attention run again", &l, &to64(&full), 0.0, 1e-6);
}
