//! The host optimizer's bets on unclipped steps (`optim::speculative_update`): a step after an
//! unclipped one updates its parameters into twins during backward and swaps them in when the
//! step turns out unclipped too. Kept, lost (an overflowed step) or never made, the weights,
//! moments and losses are the same bits as without bets.

use super::{cfg, common, context, tmpdir};
use pagetrain::nn::Module;
use pagetrain::train::trainer::Optimizer;
use pagetrain::train::{OptimizerOn, Precision, TrainConfig, Trainer};

/// Steps each run takes; step `OVERFLOW` (from 1) overflows its f16 gradients on purpose.
const STEPS: usize = 8;
const OVERFLOW: usize = 6;

/// Losses, every weight and moment after the run, and (bets kept, lost), for the host optimizer
/// (`split`: its share of the split one) under a paging budget, f16, with bets on or off.
fn run(out: &std::path::Path, split: bool, bets: bool) -> (Vec<f32>, Vec<Vec<f32>>, (u64, u64)) {
    let ctx = context(Some(256 << 10));
    let optimizer_on = if split { OptimizerOn::Split } else { OptimizerOn::Host };
    // A clip no step reaches: every step after the first may bet and keep its bet.
    let config =
        TrainConfig { optimizer_on, precision: Precision::F16, grad_clip: 1e6, steps: STEPS as u64, ..cfg(out) };
    let mut t = Trainer::new(&ctx, config, None).unwrap();
    let host = match &mut t.opt {
        Optimizer::Host(h) => h,
        Optimizer::Split(s) => &mut s.host,
        _ => panic!("host or split AdamW: {}", t.optimizer_reason),
    };
    host.speculate = bets;
    let mut losses = Vec::new();
    for step in 1..=STEPS {
        let scale = t.loss_scale;
        if step == OVERFLOW {
            // Gradients this large overflow: the step is skipped, its bet lost.
            t.loss_scale = f32::MAX;
        }
        let loss = pollster::block_on(t.train_step(&ctx)).unwrap();
        if step == OVERFLOW {
            assert!(t.loss_scale < f32::MAX, "step {step} overflowed and halved the scale");
            t.loss_scale = scale;
        } else {
            losses.push(loss);
        }
    }
    assert!(ctx.pager.counters().evictions > 0, "the budget pages");
    pollster::block_on(t.apply_pending(&ctx)).unwrap();
    let (host, (m, v)) = match &t.opt {
        Optimizer::Host(h) => (h, (h.m.clone(), h.v.clone())),
        Optimizer::Split(s) => (&s.host, (s.moments().0.to_vec(), s.moments().1.to_vec())),
        _ => unreachable!(),
    };
    let bets_made = host.bets();
    let tensors = t.model.params().into_iter().map(|p| p.value.clone()).chain(m).chain(v);
    let values = tensors.map(|x| pollster::block_on(ctx.to_f32(&x)).unwrap()).collect();
    (losses, values, bets_made)
}

#[test]
fn bets_on_unclipped_steps_give_the_same_bits_kept_or_lost() {
    let out = tmpdir("bets");
    if !common::has_f16(&context(None)) {
        return;
    }
    for split in [false, true] {
        let (on, off) = (run(&out, split, true), run(&out, split, false));
        assert_eq!(off.2, (0, 0), "split {split}: no bets when they are off");
        if pagetrain::optim::worker_threads() > 1 {
            // Steps 2..=5 bet and keep; step 6 overflows (lost); step 7 follows an overflow and
            // does not bet; step 8 bets and keeps. (A step the budget makes run again in smaller
            // micro-batches loses its first bet too: the split run's second, here.)
            let (kept, lost) = on.2;
            assert!(kept == 5 && (1..=2).contains(&lost), "split {split}: bets kept {kept}, lost {lost}");
        }
        assert!(on.0.iter().all(|l| l.is_finite()), "split {split}: losses {:?}", on.0);
        assert_eq!(on.0, off.0, "split {split}: losses with and without bets");
        for (i, (a, b)) in on.1.iter().zip(&off.1).enumerate() {
            assert!(a == b, "split {split}: tensor {i} differs with bets");
        }
    }
}

#[test]
fn a_paged_run_times_steps_with_and_without_bets_and_keeps_the_faster_with_the_same_bits() {
    let out = tmpdir("bet-trial");
    if !common::has_f16(&context(None)) {
        return;
    }
    let run = |bets: bool| {
        let ctx = context(Some(256 << 10));
        let config = TrainConfig {
            optimizer_on: OptimizerOn::Host,
            precision: Precision::F16,
            grad_clip: 1e6,
            auto_recompute: false,
            steps: 30,
            ..cfg(&out)
        };
        let mut t = Trainer::new(&ctx, config, None).unwrap();
        let Optimizer::Host(host) = &mut t.opt else { panic!("host AdamW") };
        host.speculate = bets;
        let losses: Vec<f32> = (0..30).map(|_| pollster::block_on(t.train_step(&ctx)).unwrap()).collect();
        (losses, t.bet_decision(), t.trials_running())
    };
    let (with, decided, running) = run(true);
    let (without, none, _) = run(false);
    if pagetrain::optim::worker_threads() > 1 {
        let decided = decided.expect("the bet trial decided within 30 steps");
        assert!(!running, "no trial runs after it");
        assert!(decided.with_ms > 0.0 && decided.without_ms > 0.0, "{decided}");
        assert!(decided.to_string().contains("ms a step with bets"), "{decided}");
    }
    assert_eq!(none, None, "no trial where the optimizer does not bet");
    assert_eq!(with, without, "losses with bets (and the trial's switches) and without");
}
