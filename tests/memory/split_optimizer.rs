//! AdamW split by parameter (`optim::SplitAdamW`): the embeddings update on the GPU with their
//! state kept there, the rest on the host. It trains as the GPU optimizer does, pages exactly as
//! it runs resident, and its GPU share never leaves the GPU under a budget that pages.

use super::{cfg, common, context, losses, tmpdir, to64};
use common::assert_close;
use pagetrain::nn::Module;
use pagetrain::optim::SplitAdamW;
use pagetrain::pager::Location;
use pagetrain::train::trainer::Optimizer;
use pagetrain::train::{OptimizerOn, Precision, TrainConfig, Trainer};
use pagetrain::Context;

/// Parameters the tests put in the GPU share: wte and wpe.
const ON_GPU: usize = 2;

/// Losses of `steps` steps with AdamW split after the first `ON_GPU` parameters, and every
/// weight and moment after them.
fn split_run(ctx: &Context, config: TrainConfig, steps: usize) -> (Vec<f32>, Vec<Vec<f32>>, Trainer) {
    let f16 = config.precision == Precision::F16;
    let mut t = Trainer::new(ctx, TrainConfig { optimizer_on: OptimizerOn::Gpu, ..config }, None).unwrap();
    let Optimizer::Gpu(gpu) = &t.opt else { panic!("GPU AdamW") };
    let split = SplitAdamW::new(ctx, &t.model.params(), ON_GPU, gpu.config, f16).unwrap();
    t.opt = Optimizer::Split(split);
    let losses = (0..steps).map(|_| pollster::block_on(t.train_step(ctx)).unwrap()).collect();
    pollster::block_on(t.apply_pending(ctx)).unwrap();
    let Optimizer::Split(split) = &t.opt else { panic!("split AdamW") };
    let (m, v) = split.moments();
    let tensors = t.model.params().into_iter().map(|p| p.value.clone()).chain(m.to_vec()).chain(v.to_vec());
    let values = tensors.map(|x| pollster::block_on(ctx.to_f32(&x)).unwrap()).collect();
    (losses, values, t)
}

#[test]
fn split_optimizer_trains_as_the_gpu_one_and_pages_as_it_runs_resident() {
    let out = tmpdir("split-opt");
    let probe = context(None);
    let mut precisions = vec![(Precision::F32, 1e-5)];
    if common::has_f16(&probe) {
        precisions.push((Precision::F16, 2e-3));
    }
    for (precision, tol) in precisions {
        let config = TrainConfig { precision, steps: 10, ..cfg(&out) };
        let resident = context(None);
        let (gpu, _) = losses(&resident, config.clone(), 10);
        let resident = context(None);
        let (split, split_values, t) = split_run(&resident, config.clone(), 10);
        assert_close(&format!("{precision:?}: split vs GPU AdamW"), &split, &to64(&gpu), 0.0, tol);
        let Optimizer::Split(s) = &t.opt else { panic!("split AdamW") };
        assert!(s.last_norm.is_finite() && s.last_norm > 0.0, "{precision:?}: norm {}", s.last_norm);
        if precision == Precision::F16 {
            assert!(s.host.half_grads().is_some(), "the host share's gradients come down in f16");
        }

        let budget = resident.pager.live_bytes().1 / 4;
        let paged = context(Some(budget));
        let (split_paged, paged_values, t) = split_run(&paged, config.clone(), 10);
        assert!(paged.pager.counters().evictions > 0, "{precision:?}: the budget pages");
        assert_eq!(split_paged, split, "{precision:?}: paged vs resident losses");
        assert!(paged_values == split_values, "{precision:?}: paged vs resident weights and moments differ");

        // The GPU share went up once and stayed: its values and moments are on the GPU, uploaded
        // at most once in ten steps; host AdamW's embedding goes up every step.
        let names: Vec<String> = t.model.params()[..ON_GPU]
            .iter()
            .flat_map(|p| [p.name.clone(), format!("{}.exp_avg", p.name), format!("{}.exp_avg_sq", p.name)])
            .collect();
        let tensors = paged.pager.snapshot().tensors;
        for name in &names {
            let info = tensors.iter().find(|t| &t.name == name).unwrap_or_else(|| panic!("no tensor {name}"));
            assert_eq!(info.location, Location::Gpu, "{precision:?}: {name} left the GPU");
            assert!(info.uploads <= 1, "{precision:?}: {name} uploaded {} times", info.uploads);
        }
        let host_paged = context(Some(budget));
        let (_, _trainer) = losses(&host_paged, TrainConfig { optimizer_on: OptimizerOn::Host, ..config }, 10);
        let wte = host_paged.pager.snapshot().tensors.into_iter().find(|t| t.name == names[0]).expect("wte");
        assert!(wte.uploads >= 9, "{precision:?}: host AdamW's wte went up {} times in 10 steps", wte.uploads);
    }
}

#[test]
fn split_optimizer_is_chosen_by_the_budget() {
    let out = tmpdir("split-choice");
    let config = TrainConfig { optimizer_on: OptimizerOn::Split, steps: 2, ..cfg(&out) };
    // Resident, everything fits a third of the budget: nothing to split.
    let resident = context(None);
    let (_, t) = losses(&resident, config.clone(), 2);
    assert_eq!(t.opt.name(), "host", "{}", t.optimizer_reason);
    assert!(t.optimizer_reason.contains("not split"), "{}", t.optimizer_reason);
    // A quarter budget keeps the embeddings' state (and what follows, as far as it fits) on the GPU.
    let budget = resident.pager.live_bytes().1 / 4;
    let paged = context(Some(budget));
    let (losses_paged, t) = losses(&paged, config.clone(), 2);
    assert!(losses_paged.iter().all(|l| l.is_finite()));
    let Optimizer::Split(s) = &t.opt else { panic!("split AdamW: {}", t.optimizer_reason) };
    let params = t.model.params();
    let on_gpu = s.on_gpu();
    assert!(on_gpu >= 1 && on_gpu < params.len(), "{on_gpu} of {}", params.len());
    let kept: u64 = params[..on_gpu].iter().map(|p| pagetrain::optim::kept_bytes(p)).sum();
    let next = pagetrain::optim::kept_bytes(params[on_gpu]);
    assert!(kept <= budget / 3 && kept + next > budget / 3, "kept {kept} + next {next} vs a third of {budget}");
    assert_eq!(paged.pager.kept_bytes(), kept, "the pager keeps exactly the GPU share");
    assert!(t.optimizer_reason.contains("update on the GPU"), "{}", t.optimizer_reason);
    // Under f16 the share is 0.6 of the budget: its activations take half the bytes.
    let half = context(Some(budget));
    let (losses_f16, t) = losses(&half, TrainConfig { precision: Precision::F16, ..config.clone() }, 2);
    assert!(losses_f16.iter().all(|l| l.is_finite()));
    let Optimizer::Split(s) = &t.opt else { panic!("split AdamW in f16: {}", t.optimizer_reason) };
    let params = t.model.params();
    let kept: u64 = params[..s.on_gpu()].iter().map(|p| pagetrain::optim::kept_bytes(p)).sum();
    let next = pagetrain::optim::kept_bytes(params[s.on_gpu()]);
    let share = (budget as f64 * 0.6) as u64;
    assert!(kept <= share && kept + next > share, "f16: kept {kept} + next {next} vs 0.6 of {budget}");
    // With --delayed-update the host optimizer runs alone (the delay is a host optimizer's).
    let delayed = context(Some(budget));
    let (_, t) = losses(&delayed, TrainConfig { delayed_update: Some(1), ..config }, 2);
    assert_eq!(t.opt.name(), "host", "{}", t.optimizer_reason);
    assert!(t.optimizer_reason.contains("delayed"), "{}", t.optimizer_reason);
}
