//! AdamW on the host in training: it equals the GPU's, paged or not, its gradients on their way
//! down as backward finishes each; its deferred updates, run ahead on their own thread, give the
//! same bits; under f16 it writes the weight copies and its gradients come down in f16.

use super::{cfg, common, context, losses, tmpdir, to64};
use common::assert_close;
use pagetrain::train::{OptimizerOn, TrainConfig, Trainer};
use pagetrain::Context;

#[test]
fn host_optimizer_matches_the_gpu_optimizer() {
    let out = tmpdir("host-opt");
    let (gpu, _) = losses(&context(None), cfg(&out), 20);
    let resident = context(None);
    let (host, t) = losses(&resident, TrainConfig { optimizer_on: OptimizerOn::Host, ..cfg(&out) }, 20);
    assert_eq!(t.opt.name(), "host");
    assert_close("host vs gpu AdamW", &host, &to64(&gpu), 0.0, 1e-5);
    // From the second step on, each f32 gradient goes down as soon as backward is done with it.
    use pagetrain::nn::Module;
    let pagetrain::train::trainer::Optimizer::Host(o) = &t.opt else { panic!("host AdamW") };
    assert_eq!(o.grads_down().expect("f32 gradients watched").sent_in_backward(), t.model.params().len());
    // and under a quarter budget, where parameters and gradients page in and out around it
    let paged = context(Some(resident.pager.live_bytes().1 / 4));
    let (host_paged, _) = losses(&paged, TrainConfig { optimizer_on: OptimizerOn::Host, ..cfg(&out) }, 20);
    assert!(paged.pager.counters().evictions > 0);
    assert_close("host AdamW paged vs resident", &host_paged, &to64(&host), 0.0, 1e-6);
}

#[test]
fn host_updates_run_ahead_on_their_thread_give_the_same_bits() {
    // Paged, f32 and f16 (gradients down in f16): from the second step on, each deferred step's
    // updates run on a thread of their own while the forward is recorded; weights, moments and
    // losses are the same bits as updates on the main thread.
    let out = tmpdir("ahead");
    let ctx = context(None);
    let precisions: &[pagetrain::train::Precision] = if common::has_f16(&ctx) {
        &[pagetrain::train::Precision::F32, pagetrain::train::Precision::F16]
    } else {
        &[pagetrain::train::Precision::F32]
    };
    use pagetrain::nn::Module;
    use pagetrain::train::trainer::Optimizer;
    for &precision in precisions {
        let run = |ahead: bool| {
            let ctx = context(Some(256 << 10));
            let config = TrainConfig { optimizer_on: OptimizerOn::Host, precision, steps: 6, ..cfg(&out) };
            let mut t = Trainer::new(&ctx, config, None).unwrap();
            let Optimizer::Host(host) = &mut t.opt else { panic!("host AdamW") };
            host.update_ahead = ahead;
            // (bets on unclipped steps leave no deferred step to run ahead: `speculative_update.rs`)
            host.speculate = false;
            let losses: Vec<f32> = (0..6).map(|_| pollster::block_on(t.train_step(&ctx)).unwrap()).collect();
            assert!(ctx.pager.counters().evictions > 0, "the budget pages");
            pollster::block_on(t.apply_pending(&ctx)).unwrap();
            let Optimizer::Host(host) = &t.opt else { panic!("host AdamW") };
            let steps_ahead = host.steps_run_ahead;
            let tensors =
                t.model.params().into_iter().map(|p| p.value.clone()).chain(host.m.clone()).chain(host.v.clone());
            let values: Vec<Vec<f32>> = tensors.map(|x| pollster::block_on(ctx.to_f32(&x)).unwrap()).collect();
            (losses, values, steps_ahead)
        };
        let (on, off) = (run(true), run(false));
        assert_eq!(off.2, 0);
        // step 1 shows the order; steps 2..6 run ahead (not where the host has one core)
        if pagetrain::optim::worker_threads() > 1 {
            assert_eq!(on.2, 5, "{precision:?}: deferred steps run ahead");
        }
        assert_eq!(on.0, off.0, "{precision:?}: losses");
        assert!(on.1 == off.1, "{precision:?}: weights and moments differ");
    }
}

/// Uploads so far of each f32 master weight that has an f16 copy, by name.
fn master_uploads(ctx: &Context) -> std::collections::BTreeMap<String, u32> {
    let tensors = ctx.pager.snapshot().tensors;
    // (gradients have f16 copies too: `<name>.grad (f16)`)
    let masters: Vec<&str> =
        tensors.iter().filter_map(|t| t.name.strip_suffix(" (f16)")).filter(|n| !n.ends_with(".grad")).collect();
    tensors.iter().filter(|t| masters.contains(&t.name.as_str())).map(|t| (t.name.clone(), t.uploads)).collect()
}

#[test]
fn host_optimizer_under_f16_writes_the_weight_copies_and_keeps_the_masters_on_the_host() {
    let out = tmpdir("host-f16");
    let f16 = TrainConfig { precision: pagetrain::train::Precision::F16, ..cfg(&out) };
    let resident = context(None);
    if !common::has_f16(&resident) {
        return;
    }
    let (gpu, _) = losses(&resident, f16.clone(), 8);
    let paged = context(Some(resident.pager.live_bytes().1 / 4));
    let mut t = Trainer::new(&paged, TrainConfig { optimizer_on: OptimizerOn::Host, ..f16 }, None).unwrap();
    assert_eq!((t.opt.name(), t.precision), ("host", pagetrain::train::Precision::F16));
    let mut host = Vec::new();
    let mut after_two = Default::default();
    for step in 0..8 {
        host.push(pollster::block_on(t.train_step(&paged)).unwrap());
        if step == 1 {
            after_two = master_uploads(&paged);
        }
    }
    assert!(paged.pager.counters().evictions > 0);
    assert_close("host AdamW paged vs GPU AdamW resident, f16", &host, &to64(&gpu), 0.0, 2e-3);
    // Six more updates, and not one f32 master went up to the GPU: the products read the f16
    // copies the host wrote (before, each update uploaded every master to cast it there).
    let later = master_uploads(&paged);
    assert!(later.len() >= 8, "masters with f16 copies: {later:?}");
    let uploaded: Vec<_> = later.iter().filter(|(name, &n)| n != after_two[*name]).collect();
    assert!(uploaded.is_empty(), "masters uploaded again after step 2: {uploaded:?}");
    // Every copy is its master rounded to f16, bit for bit.
    pollster::block_on(t.apply_pending(&paged)).unwrap();
    use pagetrain::nn::Module;
    for p in t.model.params() {
        let Some(half) = &p.half else { continue };
        let master = pollster::block_on(paged.to_f32(&p.value)).unwrap();
        let copy = pollster::block_on(paged.pager.read(half.id())).unwrap();
        let copy: Vec<half::f16> = bytemuck::pod_collect_to_vec(&copy[..2 * master.len()]);
        for (i, (&m, &c)) in master.iter().zip(&copy).enumerate() {
            assert_eq!(c.to_bits(), half::f16::from_f32(m).to_bits(), "{} element {i}: copy {c}, master {m}", p.name);
        }
    }
}

#[test]
fn f16_gradients_go_down_in_half_the_bytes_and_train_like_f32_ones() {
    let out = tmpdir("f16-grads");
    // Two micro-batches: the f32 gradients accumulate over both before they are cast.
    let f16 = |on| TrainConfig {
        precision: pagetrain::train::Precision::F16,
        optimizer_on: OptimizerOn::Host,
        f16_gradients: Some(on),
        batch_size: 2,
        accum: 2,
        ..cfg(&out)
    };
    let plain = context(None);
    if !common::has_f16(&plain) {
        return;
    }
    let steps = 6;
    let (f32_grads, _) = losses(&plain, f16(false), steps);
    let resident = context(None);
    let (f16_grads, t) = losses(&resident, f16(true), steps);
    assert_close("f16 gradients vs f32 ones", &f16_grads, &to64(&f32_grads), 0.0, 1e-3);
    assert_ne!(f16_grads, f32_grads, "the f16 gradients changed nothing: were they used?");
    // Resident, what goes down each step is the gradients (and, now, their sums of squares):
    // 4 bytes a parameter before, 2 now, each on its way as soon as it is cast, with its
    // scale's exponent after it (a tail of 2 halves).
    use pagetrain::nn::Module;
    let params = t.model.params();
    let values: u64 = params.iter().map(|p| p.value.len() as u64).sum();
    let saved = plain.pager.counters().bytes_written_back - resident.pager.counters().bytes_written_back;
    let tail = 2 * pagetrain::optim::EXPONENT_TAIL as u64;
    let (steps, sums) = (steps as u64, (4 + tail) * params.len() as u64);
    assert_eq!(saved, steps * (2 * values - sums), "bytes written back: f32 gradients less f16 ones, tails and sums");
    // From the second step on, each gradient is cast as soon as backward is done with it.
    assert!(t.optimizer_reason.contains("gradients come down in f16"), "{}", t.optimizer_reason);
    let pagetrain::train::trainer::Optimizer::Host(host) = &t.opt else { panic!("host AdamW") };
    assert_eq!(host.half_grads().expect("f16 gradients").cast_in_backward(), params.len());
    // Paged, the same losses bit for bit, and fewer bytes down than with f32 gradients.
    let budget = resident.pager.live_bytes().1 / 4;
    let paged = context(Some(budget));
    let (f16_paged, _trainer) = losses(&paged, f16(true), steps as usize);
    assert!(paged.pager.counters().evictions > 0);
    assert_eq!(f16_paged, f16_grads, "paged vs resident, f16 gradients");
    // The GPU only ever writes them whole: never uploaded (prefetched) for nothing.
    let tensors = paged.pager.snapshot().tensors;
    let uploaded: Vec<_> = tensors.iter().filter(|t| t.name.ends_with(".grad (f16)") && t.uploads > 0).collect();
    assert!(uploaded.is_empty(), "f16 gradients uploaded: {uploaded:?}");
    let paged_f32 = context(Some(budget));
    losses(&paged_f32, f16(false), steps as usize);
    let (down16, down32) = (paged.pager.counters().bytes_written_back, paged_f32.pager.counters().bytes_written_back);
    println!("quarter budget, bytes written back in {steps} steps: f16 gradients {down16}, f32 {down32}");
    assert!(down16 + steps * values < down32, "f16 gradients {down16} B vs f32 {down32} B");
}

#[test]
fn deferred_updates_applied_as_the_forward_reaches_each_layer_equal_an_immediate_step() {
    use pagetrain::nn::{Gpt, GptConfig, Module};
    use pagetrain::optim::{AdamW, AdamWConfig};
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 13 };
    let tokens: Vec<u32> = (0..32).map(|i| (i * 5 % 13) as u32).collect();
    let targets: Vec<u32> = (0..32).map(|i| (i * 3 % 13) as u32).collect();
    let weights = |ctx: &Context, m: &Gpt| -> Vec<Vec<f32>> {
        m.params().iter().map(|p| pollster::block_on(ctx.to_f32(&p.value)).unwrap()).collect()
    };
    let step = |ctx: &Context, model: &Gpt| {
        let x = ctx.from_u32("tokens", &[2, 16], &tokens).unwrap();
        let loss = model.loss(ctx, &x, &targets).unwrap();
        let mut grads = model.grads();
        ctx.backward(&loss, &mut grads, 1.0).unwrap();
    };
    // immediate: step_lr, gradients zeroed
    let ctx_a = context(Some(64 << 10));
    let a = Gpt::new(&ctx_a, cfg, 7).unwrap();
    let mut opt_a = AdamW::new(&ctx_a, &a, AdamWConfig::default()).unwrap();
    step(&ctx_a, &a);
    opt_a.step_lr(&ctx_a, &a.params(), 1e-2, 1.0).unwrap();
    let want = weights(&ctx_a, &a);

    // deferred, under a budget that pages: nothing changes until the next forward reaches it
    let ctx_b = context(Some(64 << 10));
    let b = Gpt::new(&ctx_b, cfg, 7).unwrap();
    let before = weights(&ctx_b, &b);
    let mut opt_b = AdamW::new(&ctx_b, &b, AdamWConfig::default()).unwrap();
    step(&ctx_b, &b);
    opt_b.defer(&ctx_b, &b.params(), 1e-2, 1.0, false).unwrap();
    assert!(opt_b.has_deferred());
    assert_eq!(weights(&ctx_b, &b), before, "a deferred step changed weights before their use");
    let x = ctx_b.from_u32("tokens", &[2, 16], &tokens).unwrap();
    let mut groups = 0;
    ctx_b
        .no_grad(|| {
            b.loss_prepared(&ctx_b, &x, &targets, None, &mut |ps| {
                groups += 1;
                opt_b.apply_deferred(&ctx_b, ps)
            })
        })
        .unwrap();
    assert_eq!(groups, 2 + cfg.n_layer, "embeddings, each block, the final LayerNorm");
    assert!(!opt_b.has_deferred(), "the forward reached every parameter");
    assert_eq!(weights(&ctx_b, &b), want, "deferred updates differ from an immediate step");
    for p in b.params() {
        assert!(
            pollster::block_on(ctx_b.to_f32(&p.grad)).unwrap().iter().all(|&g| g == 0.0),
            "{} grad not zeroed",
            p.name
        );
    }
    // An immediate step while one is deferred lands the deferred one first (with its own clip).
    a.zero_grad(&ctx_a).unwrap();
    step(&ctx_a, &a);
    opt_a.step_lr(&ctx_a, &a.params(), 1e-2, 1.0).unwrap();
    a.zero_grad(&ctx_a).unwrap();
    opt_a.step_lr(&ctx_a, &a.params(), 1e-2, 1.0).unwrap();
    step(&ctx_b, &b);
    opt_b.defer(&ctx_b, &b.params(), 1e-2, 1.0, false).unwrap();
    opt_b.step_lr(&ctx_b, &b.params(), 1e-2, 1.0).unwrap();
    assert!(weights(&ctx_b, &b) == weights(&ctx_a, &a), "deferred + immediate differs from two immediate steps");
}
