//! Training bigger than the GPU budget: paged runs equal resident ones, accumulation equals a big
//! batch, the host optimizer equals the GPU one, recompute equals storing, out-of-memory shrinks
//! the micro-batch, and a killed run resumes. AdamW on the host: `host_optimizer.rs`.

#[path = "../common/mod.rs"]
mod common;
mod delayed_update;
mod host_optimizer;
mod recompute_keeps;
mod recompute_trial;
mod speculative_update;
mod split_optimizer;
mod upload_trial;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::assert_close;
use common::child::Run;
use pagetrain::device::Gpu;
use pagetrain::pager::PagerOptions;
use pagetrain::train::{Dataset, TrainConfig, Trainer};
use pagetrain::Context;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagetrain-mem-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn context(budget: Option<u64>) -> Context {
    common::paged_ctx(&PagerOptions { budget, slot_bytes: 64 << 10, ..Default::default() })
}

fn cfg(out: &Path) -> TrainConfig {
    TrainConfig {
        steps: 20,
        batch_size: 4,
        seq_len: 32,
        lr: 3e-3,
        warmup_steps: 3,
        sample_len: 0,
        eval_batches: 1,
        out: out.to_path_buf(),
        seed: 5,
        // (these tests page AdamW's state; `auto` would measure where to run it)
        optimizer_on: pagetrain::train::OptimizerOn::Gpu,
        ..Default::default()
    }
}

/// Losses of the first `steps` steps of a run configured by `cfg`.
fn losses(ctx: &Context, cfg: TrainConfig, steps: usize) -> (Vec<f32>, Trainer) {
    let mut t = Trainer::new(ctx, cfg, None).unwrap();
    let l = (0..steps).map(|_| pollster::block_on(t.train_step(ctx)).unwrap()).collect();
    (l, t)
}

/// Bytes a step of `cfg(out)` makes again instead of keeping, remaking `values` f32 values per
/// channel, token and block (LayerNorm and MLP outputs: 10; with c_fc frozen in int8, 6).
fn remade_bytes_per_step(t: &Trainer, out: &Path, values: usize) -> u64 {
    let (c, run) = (t.model.config, cfg(out));
    (c.n_layer * values * c.n_embd * run.batch_size * run.seq_len * 4) as u64
}

fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn budgets_of_100_25_and_10_percent_give_the_same_losses() {
    let out = tmpdir("budgets");
    let ctx = context(None);
    let (full, _) = losses(&ctx, cfg(&out), 20);
    let footprint = ctx.pager.live_bytes().1;
    for pct in [25u64, 10] {
        let budget = footprint * pct / 100;
        let paged = context(Some(budget));
        let (l, t) = losses(&paged, cfg(&out), 20);
        let stats = paged.pager.stats();
        let c = paged.pager.counters();
        println!(
            "{pct}%: budget {budget} B of footprint {footprint} B, peak {} B, micro-batch {}, {c:?}",
            stats.peak_bytes, t.micro_batch
        );
        assert!(stats.peak_bytes <= budget);
        assert!(c.evictions > 0);
        // A budget that made the run halve its micro-batch sums each step's gradients in two
        // halves: the resident run to match is the one split the same way.
        let want = if t.micro_batch == cfg(&out).batch_size {
            full.clone()
        } else {
            let split =
                TrainConfig { batch_size: t.micro_batch, accum: cfg(&out).batch_size / t.micro_batch, ..cfg(&out) };
            losses(&context(None), split, 20).0
        };
        assert_close(&format!("losses at {pct}% budget"), &l, &to64(&want), 0.0, 1e-6);
    }
}

/// `Pager::pool_buffers_created` (the bench's `buffers_created_per_step`) counts driver
/// allocations: none once a resident run is warm, some every step where the budget makes the
/// pool destroy buffers of one size to create another. Through the ring: zero-copy (unified
/// memory, lavapipe) creates a mapped buffer for every tensor the host writes, by design.
#[test]
fn the_pool_counts_the_buffers_it_creates_none_once_a_resident_run_is_warm() {
    use pagetrain::pager::UploadPath;
    let out = tmpdir("pool-created");
    let ring = |budget| {
        common::paged_ctx(&PagerOptions {
            budget,
            slot_bytes: 64 << 10,
            upload: UploadPath::Ring,
            gpu_pool: pagetrain::pager::GpuPool::Buffers,
            ..Default::default()
        })
    };
    let created_in_steps = |ctx: &Context| {
        let mut t = Trainer::new(ctx, cfg(&out), None).unwrap();
        let mut step = |n| {
            for _ in 0..n {
                pollster::block_on(t.train_step(ctx)).unwrap();
            }
        };
        step(3);
        let warm = ctx.pager.pool_buffers_created();
        step(3);
        (warm, ctx.pager.pool_buffers_created() - warm)
    };
    let resident = ring(None);
    let (warm, later) = created_in_steps(&resident);
    assert!(warm > 0, "the first steps create the pool's buffers");
    assert_eq!(later, 0, "a warm resident step created {later} buffers");
    let footprint = resident.pager.live_bytes().1;
    let (_, later) = created_in_steps(&ring(Some(footprint / 10)));
    assert!(later > 0, "three steps at 10 % of the footprint created no buffer");
    // Slabs: at half the footprint, warm steps make no allocation at all; at 10 %, where this
    // model's largest tensors may be over a slab (a quarter of the budget) and get buffers of
    // their own, fewer than buffers of their own for every tensor.
    let in_slabs = |percent: u64| {
        let ctx = common::paged_ctx(&PagerOptions {
            budget: Some(footprint * percent / 100),
            slot_bytes: 64 << 10,
            upload: UploadPath::Ring,
            gpu_pool: pagetrain::pager::GpuPool::Slabs,
            ..Default::default()
        });
        let (warm, later) = created_in_steps(&ctx);
        assert!(warm > 0 && ctx.pager.gpu_pool().starts_with("slabs"), "{}", ctx.pager.gpu_pool());
        let c = ctx.pager.counters();
        assert!(c.evictions > 0 && c.uploads > 0, "{percent} % of the footprint must page in slabs too: {c:?}");
        later
    };
    assert_eq!(in_slabs(50), 0, "warm steps at 50 % in slabs created buffers");
    let tight = in_slabs(10);
    assert!(tight < later, "at 10 %, slabs created {tight} buffers in three warm steps, buffers alone {later}");
}

#[test]
fn a_quarter_budget_gives_the_resident_losses_on_every_upload_path() {
    // The mapped ring, pinned host memory (Vulkan) and zero-copy (unified memory): paths the
    // adapter lacks fall back to the ring, and the one asked for must be taken where offered.
    use pagetrain::pager::UploadPath;
    let out = tmpdir("paths");
    let steps = 8;
    let ctx = context(None);
    let (full, _) = losses(&ctx, cfg(&out), steps);
    let budget = ctx.pager.live_bytes().1 / 4;
    for path in [UploadPath::Ring, UploadPath::Pinned, UploadPath::ZeroCopy] {
        let paged = common::paged_ctx(&PagerOptions {
            budget: Some(budget),
            slot_bytes: 64 << 10,
            upload: path,
            ..Default::default()
        });
        let offered = match path {
            UploadPath::Pinned => paged.gpu.info.backend == wgpu::Backend::Vulkan,
            UploadPath::ZeroCopy => paged.gpu.unified_memory(),
            _ => true,
        };
        let taken = paged.pager.upload_path_kind();
        assert_eq!(taken, if offered { path } else { UploadPath::Ring }, "{}", paged.pager.upload_path());
        let (l, t) = losses(&paged, cfg(&out), steps);
        let c = paged.pager.counters();
        assert!(c.evictions > 0 && c.uploads > 0, "{path:?}: a quarter budget pages: {c:?}");
        assert_eq!(t.micro_batch, cfg(&out).batch_size, "{path:?}: the micro-batch fits");
        assert_close(&format!("losses at 25% budget, {path:?}"), &l, &to64(&full), 0.0, 1e-6);
    }
    // The host store in pinned memory (Vulkan): write-backs by DMA straight into it, uploads
    // by DMA straight from it (pinned path) or through the mapped ring.
    for path in [UploadPath::Pinned, UploadPath::Ring] {
        let gpu = pollster::block_on(Gpu::new(&Default::default())).expect("a GPU adapter");
        if gpu.info.backend != wgpu::Backend::Vulkan {
            break;
        }
        let store = pagetrain::pager::PinnedStore::new(&gpu.device).expect("pinned memory on Vulkan");
        let opts = PagerOptions { budget: Some(budget), slot_bytes: 64 << 10, upload: path, ..Default::default() };
        let paged = Context::with_store(gpu, Box::new(store), &opts);
        assert!(paged.pager.describe_store().starts_with("pinned"), "{}", paged.pager.describe_store());
        assert_eq!(paged.pager.upload_path_kind(), path, "{}", paged.pager.upload_path());
        let (l, t) = losses(&paged, cfg(&out), steps);
        let c = paged.pager.counters();
        assert!(c.evictions > 0 && c.uploads > 0 && c.bytes_written_back > 0, "pinned store, {path:?}: {c:?}");
        assert_eq!(paged.pager.staging_bytes().1, 0, "pinned store: no readback ring was needed");
        assert_eq!(t.micro_batch, cfg(&out).batch_size, "pinned store, {path:?}: the micro-batch fits");
        assert_close(&format!("losses at 25% budget, pinned store, {path:?}"), &l, &to64(&full), 0.0, 1e-6);
    }
}

#[test]
fn accumulating_four_micro_batches_of_two_equals_one_batch_of_eight() {
    let out = tmpdir("accum");
    let ctx = context(None);
    let (eight, _) = losses(&ctx, TrainConfig { batch_size: 8, ..cfg(&out) }, 10);
    let ctx = context(None);
    let (two_by_four, t) = losses(&ctx, TrainConfig { batch_size: 2, accum: 4, ..cfg(&out) }, 10);
    assert_eq!(t.effective_batch(), 8);
    assert_close("accum 4 x batch 2 vs batch 8", &two_by_four, &to64(&eight), 0.0, 1e-5);
}

#[test]
fn remade_layernorm_and_mlp_outputs_give_the_same_losses_and_are_neither_kept_nor_paged() {
    let out = tmpdir("remake");
    let steps = 6;
    let kept_ctx = context(None);
    let (kept, _) = losses(&kept_ctx, TrainConfig { remake: Some(false), ..cfg(&out) }, steps);
    let ctx = context(None);
    let (remade, t) = losses(&ctx, TrainConfig { remake: Some(true), ..cfg(&out) }, steps);
    assert!(t.model.remakes());
    // The same kernels on the same inputs: the same bits, so the same gradients and updates.
    assert_eq!(remade, kept, "losses with the outputs made again in backward");
    // Per block and token: ln_1 and ln_2 (C values each), c_fc's and GELU's outputs (4C each), f32.
    let per_step = remade_bytes_per_step(&t, &out, 10);
    assert_eq!(ctx.pager.counters().recompute_dropped_bytes, per_step * steps as u64);
    // With c_fc frozen in int8 its output is kept and the rest made again: the same losses too.
    let frozen = |remake| TrainConfig { remake: Some(remake), freeze_int8: Some("mlp".into()), ..cfg(&out) };
    let (frozen_kept, _) = losses(&context(None), frozen(false), 3);
    let frozen_ctx = context(None);
    let (frozen_remade, _) = losses(&frozen_ctx, frozen(true), 3);
    assert_eq!(frozen_remade, frozen_kept, "losses with int8 MLP layers");
    let per_step_frozen = remade_bytes_per_step(&t, &out, 6);
    assert_eq!(frozen_ctx.pager.counters().recompute_dropped_bytes, per_step_frozen * 3);
    let (kept_peak, remade_peak) = (kept_ctx.pager.snapshot().peak_gpu_bytes, ctx.pager.snapshot().peak_gpu_bytes);
    println!("peak GPU bytes: kept {kept_peak}, remade {remade_peak}");
    assert!(remade_peak < kept_peak, "remade {remade_peak} B vs kept {kept_peak} B");
    // At a quarter of the footprint a run turns it on by itself after its first step, and
    // moves fewer bytes each way than one told to keep them.
    let budget = kept_ctx.pager.live_bytes().1 / 4;
    let paged = context(Some(budget));
    let (auto, t) = losses(&paged, cfg(&out), steps);
    assert!(t.model.remakes(), "a paged run did not turn remaking on");
    assert_close("paged, remade from step 2", &auto, &to64(&kept), 0.0, 1e-6);
    let paged_kept = context(Some(budget));
    let (_, t) = losses(&paged_kept, TrainConfig { remake: Some(false), ..cfg(&out) }, steps);
    assert!(!t.model.remakes());
    let (a, k) = (paged.pager.counters(), paged_kept.pager.counters());
    println!("quarter budget: remade {a:?}\nkept {k:?}");
    assert!(
        a.bytes_written_back < k.bytes_written_back,
        "written back: {} vs {}",
        a.bytes_written_back,
        k.bytes_written_back
    );
    assert!(a.bytes_uploaded < k.bytes_uploaded, "uploaded: {} vs {}", a.bytes_uploaded, k.bytes_uploaded);
}

#[test]
fn recompute_gives_the_same_losses_with_a_smaller_footprint() {
    let out = tmpdir("recompute");
    let stored_ctx = context(None);
    let (stored, _) = losses(&stored_ctx, cfg(&out), 5);
    let recompute_ctx = context(None);
    let (again, _) = losses(&recompute_ctx, TrainConfig { recompute: true, ..cfg(&out) }, 5);
    let (a, b) = (stored_ctx.pager.live_bytes().1, recompute_ctx.pager.live_bytes().1);
    println!("footprint stored {a} B, recomputed {b} B");
    assert!(b < a, "recompute must need less memory: {b} vs {a}");
    // what recompute reports it did not keep covers the saving
    let dropped = recompute_ctx.pager.counters().recompute_dropped_bytes / 5;
    assert!(dropped >= a - b, "reported {dropped} B not kept per step, footprint fell by {} B", a - b);
    assert_eq!(stored_ctx.pager.counters().recompute_dropped_bytes, 0);
    assert_close("recompute vs stored", &again, &to64(&stored), 0.0, 1e-6);

    // The first blocks recomputed, the last kept: the same losses again, fewer bytes dropped.
    // (Not a footprint between: here the peak is in backward, where the whole recompute makes
    // the last block again beside the head's gradients.)
    let partial_ctx = context(None);
    let mut t = Trainer::new(&partial_ctx, TrainConfig { recompute: true, ..cfg(&out) }, None).unwrap();
    let half = t.model.blocks.len() / 2;
    assert!(half > 0, "the test model has {} blocks", t.model.blocks.len());
    t.model.set_recompute_blocks(half);
    assert_eq!(t.model.recompute_blocks(), half);
    let partly: Vec<f32> = (0..5).map(|_| pollster::block_on(t.train_step(&partial_ctx)).unwrap()).collect();
    let dropped_partly = partial_ctx.pager.counters().recompute_dropped_bytes / 5;
    println!("{half} of {} blocks recomputed: {dropped_partly} B a step not kept", t.model.blocks.len());
    assert!(0 < dropped_partly && dropped_partly < dropped, "not kept per step: {dropped_partly} of {dropped} B");
    assert_close("first blocks recomputed vs stored", &partly, &to64(&stored), 0.0, 1e-6);
}

#[test]
fn a_budget_too_small_for_the_micro_batch_shrinks_it_and_finishes() {
    let out = tmpdir("oom");
    let ctx = context(None);
    let (full, _) = losses(&ctx, TrainConfig { batch_size: 8, ..cfg(&out) }, 3);
    // Enough for the weights and a micro-batch of 2, not for 8.
    let small = context(Some(640 << 10));
    let (l, t) = losses(&small, TrainConfig { batch_size: 8, ..cfg(&out) }, 3);
    println!("micro-batch {} after shrinking, counters {:?}", t.micro_batch, small.pager.counters());
    assert!(t.micro_batch < 8, "no shrink happened");
    assert_eq!(t.effective_batch(), 8, "the effective batch is kept");
    assert!(small.pager.counters().micro_batch_shrinks >= 1);
    assert_close("shrunk run vs full batch", &l, &to64(&full), 0.0, 1e-5);
}

#[test]
fn a_budget_below_the_largest_tensor_is_a_clear_error() {
    let out = tmpdir("tiny-budget");
    let ctx = context(Some(4 << 10));
    let err = Trainer::new(&ctx, cfg(&out), None).err().expect("an error");
    assert!(err.to_string().contains("budget"), "{err}");
}

#[test]
fn tokens_outside_the_vocabulary_are_rejected_by_the_batch_that_reads_them() {
    let dir = tmpdir("vocab");
    let bytes: Vec<u8> =
        (0..4000u16).map(|i| if i == 3000 { 60000 } else { i % 50 }).flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(dir.join("tok.bin"), bytes).unwrap();
    // Opening maps the file and reads no token; the first batch whose windows cover position
    // 3000 is the error (a model never sees the bad id).
    let data = Dataset::open(&dir.join("tok.bin"), Some(pagetrain::train::Vocab::Ids { size: 50257 })).unwrap();
    let mut rng = pagetrain::rng::Rng::new(3);
    let err = (0..500)
        .find_map(|_| data.batch(pagetrain::train::Split::Train, &mut rng, 8, 64).err())
        .expect("some window covers position 3000");
    assert!(err.to_string().contains("60000") && err.to_string().contains("3000"), "{err}");
    assert!(err.to_string().contains("tok.bin"), "{err}");
}

#[test]
fn a_run_killed_mid_training_resumes_from_its_last_checkpoint() {
    let out = tmpdir("kill");
    let outs = out.to_string_lossy().into_owned();
    fn args(steps: &'static str) -> Vec<&'static str> {
        vec![
            "train",
            "--steps",
            steps,
            "--batch-size",
            "4",
            "--seq-len",
            "32",
            "--sample-len",
            "0",
            "--checkpoint-every",
            "2",
            "--json",
            "--out",
        ]
    }
    // The uninterrupted run.
    let straight = tmpdir("kill-straight");
    let mut a: Vec<&str> = args("12");
    a.push(straight.to_str().unwrap());
    let o = Command::new(env!("CARGO_BIN_EXE_pagetrain")).args(&a).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().last().unwrap()).unwrap();

    // The same run, SIGKILLed as soon as it reports its first checkpoint: 10 steps and 5
    // checkpoints from the end, so the kill lands mid-step or mid-checkpoint, never after the end.
    let mut a: Vec<&str> = args("12");
    a.push(&outs);
    let mut run = Run::start(&a);
    run.wait_for("checkpoint written to", std::time::Duration::from_secs(120));
    run.child.kill().unwrap(); // SIGKILL
    let (finished, _, log) = run.finish();
    assert!(!finished, "the run ended before the kill:\n{log}");
    let resumed_from = std::fs::read_link(out.join("latest")).unwrap();
    println!("killed with latest -> {}", resumed_from.display());
    assert_ne!(resumed_from.to_string_lossy(), "step-00000012", "killed before its last checkpoint");

    let mut a: Vec<&str> = args("12");
    a.push(&outs);
    a.extend(["--resume", outs.as_str()]);
    let o = Command::new(env!("CARGO_BIN_EXE_pagetrain")).args(&a).output().unwrap();
    assert!(o.status.success(), "resume failed: {}", String::from_utf8_lossy(&o.stderr));
    let got: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(got["steps"], 12);
    let (g, w) = (got["final_train_loss"].as_f64().unwrap(), want["final_train_loss"].as_f64().unwrap());
    assert!((g - w).abs() <= 1e-6, "resumed run ends at {g}, the uninterrupted one at {w}");
    assert_eq!(got["final_val_loss"], want["final_val_loss"]);
}

#[test]
fn int8_frozen_layers_stay_fixed_train_the_rest_and_resume() {
    let out = tmpdir("int8");
    let ctx = context(None);
    let cfg8 = TrainConfig { freeze_int8: Some("mlp".into()), ..cfg(&out) };
    let mut t = Trainer::new(&ctx, cfg8.clone(), None).unwrap();
    let all = pagetrain::nn::GptConfig::preset("tiny", t.data.vocab.size()).unwrap().num_params();
    use pagetrain::nn::Module;
    assert!(t.model.num_params() < all, "frozen weights are not trainable");
    let frozen: usize = t.model.blocks.iter().map(|b| b.frozen()).sum();
    assert_eq!(frozen, 2 * 2, "c_fc and c_proj of both blocks");
    let q_before = match &t.model.blocks[0].mlp.c_fc.weight {
        pagetrain::nn::Weight::Int8 { q, .. } => pollster::block_on(ctx.to_u32(&q.q)).unwrap(),
        _ => panic!("mlp.c_fc is not frozen"),
    };
    let l: Vec<f32> = (0..20).map(|_| pollster::block_on(t.train_step(&ctx)).unwrap()).collect();
    assert!(l[19] < l[0] - 0.3, "the rest still learns: {l:?}");
    let q_after = match &t.model.blocks[0].mlp.c_fc.weight {
        pagetrain::nn::Weight::Int8 { q, .. } => pollster::block_on(ctx.to_u32(&q.q)).unwrap(),
        _ => unreachable!(),
    };
    assert_eq!(q_before, q_after, "frozen int8 weights never change");
    // The checkpoint holds every GPT-2 tensor (frozen ones dequantized) and resuming freezes again.
    pollster::block_on(t.save(&ctx, &out)).unwrap();
    let ck = pagetrain::train::checkpoint::load(&out).unwrap();
    assert!(ck.weights.contains("transformer.h.1.mlp.c_proj.weight"));
    let resumed = Trainer::new(&ctx, TrainConfig { resume: Some(out.clone()), ..cfg(&out) }, None).unwrap();
    assert_eq!(resumed.cfg.freeze_int8.as_deref(), Some("mlp"));
    assert_eq!(resumed.model.num_params(), t.model.num_params());
}

#[test]
fn f16_training_tracks_the_f32_loss_curve_in_less_memory_and_loss_scaling_skips_overflow() {
    let out = tmpdir("f16");
    let ctx32 = context(None);
    let (f32_losses, _) = losses(&ctx32, cfg(&out), 30);
    let ctx = context(None);
    let (f16_losses, t) = losses(&ctx, TrainConfig { precision: pagetrain::train::Precision::F16, ..cfg(&out) }, 30);
    if common::has_f16(&ctx) {
        assert_eq!(t.precision, pagetrain::train::Precision::F16);
        // f16 activations and activation gradients outweigh the f16 weight copies: the step's
        // footprint shrinks although master weights, gradients and moments stay f32
        let (peak32, peak16) = (ctx32.pager.live_bytes().1, ctx.pager.live_bytes().1);
        assert!(peak16 < peak32, "f16 footprint {peak16} B is not below f32's {peak32} B");
    }
    // Each step within 3 % and the last ten within 2 % on average: f16 logits (the head's, as
    // autocast makes them) leave the f32 curve by up to 2 % at single steps of this tiny model.
    for (i, (a, b)) in f16_losses.iter().zip(&f32_losses).enumerate() {
        assert!((a - b).abs() <= 0.03 * b.abs(), "step {i}: f16 loss {a} vs f32 {b}");
    }
    let last_ten = |l: &[f32]| l[l.len() - 10..].iter().sum::<f32>() / 10.0;
    let (a, b) = (last_ten(&f16_losses), last_ten(&f32_losses));
    assert!((a - b).abs() <= 0.02 * b, "the last ten steps: f16 loss {a} vs f32 {b} on average");
    // A loss scale far too large overflows the gradients: those updates are skipped and the scale
    // halves until training proceeds.
    let ctx = context(None);
    if !common::has_f16(&ctx) {
        return; // f32 training has no loss scale to test
    }
    let mut t =
        Trainer::new(&ctx, TrainConfig { precision: pagetrain::train::Precision::F16, ..cfg(&out) }, None).unwrap();
    assert_eq!(t.precision, pagetrain::train::Precision::F16);
    use pagetrain::nn::Module;
    let weights = |t: &Trainer| -> Vec<Vec<f32>> {
        t.model.params().iter().map(|p| pollster::block_on(ctx.to_f32(&p.value)).unwrap()).collect()
    };
    let before = weights(&t);
    t.loss_scale = 2f32.powi(127);
    let l: Vec<f32> = (0..5).map(|_| pollster::block_on(t.train_step(&ctx)).unwrap()).collect();
    assert_eq!(t.skipped_steps, 5, "every step at 2^127 overflows");
    assert_eq!(t.loss_scale, 2f32.powi(122), "each overflow halves the scale");
    assert!(l.iter().all(|v| v.is_finite()));
    assert!(weights(&t) == before, "a skipped step updated the weights");
    // From the usual initial scale, training goes on: it settles after a skip or two, and the
    // weights move.
    t.loss_scale = pagetrain::train::trainer::INITIAL_LOSS_SCALE;
    let l: Vec<f32> = (0..20).map(|_| pollster::block_on(t.train_step(&ctx)).unwrap()).collect();
    assert!(t.skipped_steps <= 5 + 3, "the scale did not settle: {} skipped, losses {l:?}", t.skipped_steps);
    assert!(weights(&t) != before, "training did not go on after the skips");
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    assert!(mean(&l[15..]) < mean(&l[..5]) - 0.1, "the loss did not fall after the skips: {l:?}");
    // The scaler is part of the checkpoint: a resumed f16 run goes on exactly.
    pollster::block_on(t.save(&ctx, &out)).unwrap();
    let saved = (t.loss_scale, t.skipped_steps);
    let next: Vec<f32> = (0..3).map(|_| pollster::block_on(t.train_step(&ctx)).unwrap()).collect();
    let ctx2 = context(None);
    let mut resumed = Trainer::new(
        &ctx2,
        TrainConfig { precision: pagetrain::train::Precision::F16, resume: Some(out.clone()), ..cfg(&out) },
        None,
    )
    .unwrap();
    assert_eq!((resumed.loss_scale, resumed.skipped_steps), saved);
    let again: Vec<f32> = (0..3).map(|_| pollster::block_on(resumed.train_step(&ctx2)).unwrap()).collect();
    assert_close("f16 resume", &again, &to64(&next), 0.0, 1e-6);
}
