//! Host AdamW's delayed parameter update (`--delayed-update`): each step's update lands one step
//! late, the bits of an update not delayed; the weights the GPU reads meanwhile are those of the
//! step before; training with it pages exactly as it runs resident, learns, and resumes from a
//! checkpoint as if it had not stopped.

use super::{cfg, common, context, losses, tmpdir, to64};
use common::assert_close;
use pagetrain::nn::{Linear, Module};
use pagetrain::optim::{AdamWConfig, HostAdamW};
use pagetrain::rng::Rng;
use pagetrain::train::trainer::Optimizer;
use pagetrain::train::{OptimizerOn, Precision, TrainConfig, Trainer};
use pagetrain::{Context, Tensor};

/// A 37 → 29 layer with a bias; its weight computes in f16 where the adapter can (then the GPU
/// reads an f16 copy of it, and the bias's value itself).
fn layer(ctx: &Context, f16: bool) -> Linear {
    let l = Linear::new(ctx, &mut Rng::new(11), "l", 37, 29, 0.3, true).unwrap();
    if f16 {
        l.with_half(ctx).unwrap()
    } else {
        l
    }
}

/// What the GPU reads of each parameter: its f16 copy's bytes, else its value's.
fn visible(ctx: &Context, l: &Linear) -> Vec<Vec<u8>> {
    let read = |t: &Tensor| pollster::block_on(ctx.pager.read(t.id())).unwrap();
    l.params().iter().map(|p| read(p.half.as_ref().unwrap_or(&p.value))).collect()
}

/// Step `k`'s gradients: a function of the weights the step's forward read, never zero.
fn gradients(seen: &[Vec<u8>], params: usize, k: usize, f16: &[bool]) -> Vec<Vec<f32>> {
    (0..params)
        .map(|i| {
            let w: Vec<f32> = if f16[i] {
                bytemuck::pod_collect_to_vec::<u8, half::f16>(&seen[i]).iter().map(|h| h.to_f32()).collect()
            } else {
                bytemuck::pod_collect_to_vec(&seen[i])
            };
            w.iter()
                .enumerate()
                .map(|(j, &x)| (3.0 * x + k as f32).sin() * 0.5 + (j % 7) as f32 * 0.01 + 0.02)
                .collect()
        })
        .collect()
}

fn write_gradients(ctx: &Context, l: &Linear, g: &[Vec<f32>]) {
    for (p, g) in l.params().iter().zip(g) {
        ctx.write_f32(&p.grad, g).unwrap();
    }
}

#[test]
fn a_delayed_update_lands_one_step_late_with_the_bits_of_one_not_delayed() {
    for budget in [None, Some(24 << 10)] {
        let ctx = context(budget);
        let f16 = common::has_f16(&ctx);
        let config = AdamWConfig { lr: 2e-2, ..AdamWConfig::default() };
        // B: updates at once, each step's gradients taken from the weights of two updates
        // before (what a delayed forward reads); A: delayed from the first step.
        let (la, lb) = (layer(&ctx, f16), layer(&ctx, f16));
        let halves: Vec<bool> = la.params().iter().map(|p| p.half.is_some()).collect();
        let n = halves.len();
        let (mut a, mut b) = (HostAdamW::new(&ctx, &la, config).unwrap(), HostAdamW::new(&ctx, &lb, config).unwrap());
        a.delay_after = Some(0);
        let mut seen_b = vec![visible(&ctx, &lb)];
        const STEPS: usize = 6;
        for k in 1..=STEPS {
            write_gradients(&ctx, &lb, &gradients(&seen_b[k.saturating_sub(2)], n, k, &halves));
            pollster::block_on(b.step_lr(&ctx, &lb.params(), 1e-2, 1.0)).unwrap();
            seen_b.push(visible(&ctx, &lb));
        }
        for k in 1..=STEPS {
            let seen = visible(&ctx, &la);
            assert!(
                seen == seen_b[k.saturating_sub(2)],
                "{budget:?}: step {k} reads the weights of step {}",
                k.saturating_sub(2)
            );
            write_gradients(&ctx, &la, &gradients(&seen, n, k, &halves));
            a.defer(&ctx, &la.params(), 1e-2, 1.0, None).unwrap();
            assert!(a.has_deferred(), "the update runs on");
            for p in la.params() {
                assert!(
                    pollster::block_on(ctx.to_f32(&p.grad)).unwrap().iter().all(|&g| g == 0.0),
                    "gradients zeroed at once"
                );
            }
        }
        if pagetrain::optim::worker_threads() > 1 {
            assert_eq!(a.steps_delayed, STEPS as u64);
        }
        a.land(&ctx, &la.params()).unwrap();
        assert!(!a.has_deferred());
        assert!(visible(&ctx, &la) == seen_b[STEPS], "{budget:?}: landed, the last update is there");
        let all = |l: &Linear, o: &HostAdamW| -> Vec<Vec<f32>> {
            let tensors =
                l.params().iter().map(|p| p.value.clone()).chain(o.m.clone()).chain(o.v.clone()).collect::<Vec<_>>();
            tensors.iter().map(|t| pollster::block_on(ctx.to_f32(t)).unwrap()).collect()
        };
        assert!(all(&la, &a) == all(&lb, &b), "{budget:?}: masters and moments are the same bits");
        assert!(seen_b[STEPS] != seen_b[STEPS - 1], "the steps change the weights");
        assert!(halves.contains(&false) && (!f16 || halves.contains(&true)), "the GPU reads values and f16 copies");
    }
}

#[test]
fn delayed_training_pages_as_it_runs_resident_and_learns() {
    let out = tmpdir("delayed");
    let probe = context(None);
    let precisions: &[Precision] =
        if common::has_f16(&probe) { &[Precision::F32, Precision::F16] } else { &[Precision::F32] };
    for &precision in precisions {
        let host = TrainConfig { optimizer_on: OptimizerOn::Host, precision, steps: 20, ..cfg(&out) };
        let delayed = TrainConfig { delayed_update: Some(2), ..host.clone() };
        let (eager, _) = losses(&context(None), host.clone(), 20);
        let resident = context(None);
        let (late, mut t) = losses(&resident, delayed.clone(), 20);
        let Optimizer::Host(o) = &t.opt else { panic!("host AdamW") };
        if pagetrain::optim::worker_threads() > 1 {
            // (f16 skips the updates whose gradients overflowed the loss scale)
            assert_eq!(o.steps_delayed, o.t - 2, "{precision:?}: updates 3.. delayed");
            assert!(o.t >= 18);
            // Steps 1-3 read the same weights; step 4 reads those of step 2, not 3.
            assert_eq!(late[..3], eager[..3], "{precision:?}");
            assert_ne!(late[3], eager[3], "{precision:?}: the delay shows at step 4");
        }
        assert!(t.opt.name() == "host" && t.optimizer_reason.contains("delayed"), "{}", t.optimizer_reason);
        // It learns as the eager run does (the mean of the last five within 5 %).
        let tail = |l: &[f32]| l[15..].iter().sum::<f32>() / 5.0;
        println!("{precision:?}: eager {eager:?}\ndelayed {late:?}");
        assert!(tail(&late) < 0.85 * late[0], "{precision:?}: learns: {late:?}");
        assert!((tail(&late) - tail(&eager)).abs() < 0.05 * tail(&eager), "{precision:?}: {late:?} vs {eager:?}");
        // Paged at a quarter of the footprint: the same losses, bit for bit.
        let paged = context(Some(resident.pager.live_bytes().1 / 4));
        let (late_paged, mut tp) = losses(&paged, delayed.clone(), 20);
        assert!(paged.pager.counters().evictions > 0);
        assert_eq!(late_paged, late, "{precision:?}: paged vs resident");
        // Landed before evaluating: both see the last update, so they evaluate alike.
        let (e, ep) =
            (pollster::block_on(t.evaluate(&resident)).unwrap(), pollster::block_on(tp.evaluate(&paged)).unwrap());
        assert_eq!(e, ep, "{precision:?}: evaluation after landing");
        let Optimizer::Host(o) = &t.opt else { panic!("host AdamW") };
        assert!(!o.has_deferred(), "evaluation landed the update");
    }
}

#[test]
fn a_delayed_run_saved_and_resumed_goes_on_as_the_run_that_did_not_stop() {
    let probe = context(None);
    let precisions: &[Precision] =
        if common::has_f16(&probe) { &[Precision::F32, Precision::F16] } else { &[Precision::F32] };
    for &precision in precisions {
        let out = tmpdir(&format!("delayed-resume-{precision:?}"));
        let config = TrainConfig { optimizer_on: OptimizerOn::Host, precision, delayed_update: Some(1), ..cfg(&out) };
        let ctx = context(None);
        let (_, mut t) = losses(&ctx, config.clone(), 6);
        // Saving lands the update pending at step 6: the checkpoint holds every update.
        pollster::block_on(t.save(&ctx, &out)).unwrap();
        let next: Vec<f32> = (0..4).map(|_| pollster::block_on(t.train_step(&ctx)).unwrap()).collect();
        let ctx2 = context(None);
        let mut resumed = Trainer::new(&ctx2, TrainConfig { resume: Some(out.clone()), ..config }, None).unwrap();
        let again: Vec<f32> = (0..4).map(|_| pollster::block_on(resumed.train_step(&ctx2)).unwrap()).collect();
        assert_close(&format!("{precision:?} delayed, resumed"), &again, &to64(&next), 0.0, 1e-6);
        let Optimizer::Host(o) = &resumed.opt else { panic!("host AdamW") };
        if pagetrain::optim::worker_threads() > 1 {
            assert!(o.steps_delayed >= 3, "{precision:?}: the resumed run delays its updates");
        }
    }
}
