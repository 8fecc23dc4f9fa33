//! The pager's invariants: contents always equal a plain in-memory model, resident bytes never
//! exceed the budget, flushed files hold every value, a paged run computes exactly what a
//! resident one does, and faults are errors that lose nothing.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use pagetrain::autograd::Grads;
use pagetrain::device::Gpu;
use pagetrain::kernels::elementwise;
use pagetrain::nn::{Gpt, GptConfig, Module};
use pagetrain::optim::{AdamW, AdamWConfig};
use pagetrain::pager::plan::{self, Key, Policy};
use pagetrain::pager::{HostRange, HostStore, MemStore, MmapStore, PagerOptions, UploadPath};
use pagetrain::{Context, Error, Tensor};
use proptest::prelude::*;

fn gpu() -> Gpu {
    pollster::block_on(Gpu::new(&Default::default())).expect("a GPU adapter")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagetrain-pager-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Small rings so that even small tests wrap around them.
fn opts(budget: u64, policy: Policy) -> PagerOptions {
    PagerOptions {
        budget: Some(budget),
        policy,
        upload_slots: 2,
        readback_slots: 2,
        slot_bytes: 8192,
        prefetch_window: 8,
        upload: UploadPath::Ring,
        drop_dead_writebacks: true,
        blocking_waits: true,
    }
}

/// Whether this adapter offers `path`: pinned memory on every Vulkan adapter, zero-copy where
/// memory is unified, the ring everywhere.
fn offers(ctx: &Context, path: UploadPath) -> bool {
    match path {
        UploadPath::Pinned => ctx.gpu.info.backend == wgpu::Backend::Vulkan,
        UploadPath::ZeroCopy => ctx.gpu.unified_memory(),
        _ => true,
    }
}

/// A GPU and a host store in its pinned memory, on Vulkan (where it must be offered); `None`
/// elsewhere.
fn pinned_store() -> Option<(Gpu, pagetrain::pager::PinnedStore)> {
    let gpu = gpu();
    if gpu.info.backend != wgpu::Backend::Vulkan {
        return None;
    }
    let store = pagetrain::pager::PinnedStore::new(&gpu.device).expect("pinned memory on a Vulkan adapter");
    Some((gpu, store))
}

/// A path the adapter offers is the one taken (so its test cannot pass on the ring instead);
/// one it does not offer falls back to the ring and says why.
fn assert_offered_path_taken(ctx: &Context, path: UploadPath) {
    let why = ctx.pager.upload_path();
    if offers(ctx, path) {
        assert_eq!(ctx.pager.upload_path_kind(), path, "{} offers {path:?}, but: {why}", ctx.gpu.describe());
    } else {
        assert_eq!(ctx.pager.upload_path_kind(), UploadPath::Ring, "{why}");
        assert!(why.starts_with("staging ring (no "), "the fallback says why: {why}");
    }
}

fn read(ctx: &Context, t: &Tensor) -> Vec<f32> {
    pollster::block_on(ctx.to_f32(t)).unwrap()
}

/// Bitwise equality, reporting the first difference rather than both vectors.
fn assert_same(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: first difference at {i}: got {} want {}", got[i], want[i]);
    }
}

#[derive(Clone, Debug)]
enum Op {
    New(usize),
    Write(usize, u32),
    Scale(usize, usize, u32),
    Add(usize, usize, usize),
    Read(usize),
    Drop(usize),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => prop::sample::select(vec![1usize, 255, 1000, 1500]).prop_map(Op::New),
        1 => (any::<usize>(), any::<u32>()).prop_map(|(a, s)| Op::Write(a, s)),
        4 => (any::<usize>(), any::<usize>(), any::<u32>()).prop_map(|(a, b, s)| Op::Scale(a, b, s)),
        4 => (any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(a, b, c)| Op::Add(a, b, c)),
        2 => any::<usize>().prop_map(Op::Read),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => Just(Op::Flush),
    ]
}

/// Tensor sizes come from a few values so that ops find operands of equal length.
fn values(seed: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((seed as usize).wrapping_mul(31).wrapping_add(i * 7) % 1001) as f32 * 0.25 - 100.0).collect()
}

/// An output for an op on `n`-float inputs `avoid`: an existing tensor of that length picked
/// by `choice`, or a new one (undefined until the op writes it).
fn output(ctx: &Context, tensors: &mut Vec<(Tensor, Vec<f32>)>, n: usize, avoid: &[usize], choice: usize) -> usize {
    let same: Vec<usize> = (0..tensors.len()).filter(|i| tensors[*i].1.len() == n && !avoid.contains(i)).collect();
    if same.is_empty() || choice.is_multiple_of(3) {
        tensors.push((ctx.empty("out", &[n], pagetrain::DType::F32, false).unwrap(), vec![f32::NAN; n]));
        tensors.len() - 1
    } else {
        same[choice % same.len()]
    }
}

/// Runs `ops` against the pager and a `HashMap` model. GPU ops are exact in f32 (a scale by a
/// power of two, an add), so contents must match bit for bit.
fn run_against_model(ctx: &Context, ops: &[Op], budget: u64, store_dir: Option<&std::path::Path>) {
    let mut tensors: Vec<(Tensor, Vec<f32>)> = Vec::new();
    for op in ops {
        let pick = |i: usize, len: usize| if len == 0 { None } else { Some(i % len) };
        match *op {
            Op::New(n) => {
                let data = values(n as u32, n);
                tensors.push((ctx.from_f32("t", &[n], &data, false).unwrap(), data));
            }
            Op::Write(a, seed) => {
                if let Some(a) = pick(a, tensors.len()) {
                    let data = values(seed, tensors[a].1.len());
                    ctx.write_f32(&tensors[a].0, &data).unwrap();
                    tensors[a].1 = data;
                }
            }
            Op::Scale(a, b, s) => {
                if let Some(a) = pick(a, tensors.len()) {
                    let n = tensors[a].1.len();
                    let c = output(ctx, &mut tensors, n, &[a], b);
                    let alpha = [0.5f32, 2.0, -1.0, 0.25][s as usize % 4];
                    let _op = ctx.op();
                    let (out, x) = (ctx.write(&tensors[c].0).unwrap(), ctx.read(&tensors[a].0).unwrap());
                    elementwise::scale_forward(&ctx.kernels, &out, &x, alpha, n).unwrap();
                    tensors[c].1 = tensors[a].1.iter().map(|v| v * alpha).collect();
                }
            }
            Op::Add(a, b, c) => {
                if let Some(a) = pick(a, tensors.len()) {
                    let n = tensors[a].1.len();
                    let same: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].1.len() == n).collect();
                    let b = same[b % same.len()];
                    let c = output(ctx, &mut tensors, n, &[a, b], c);
                    let _op = ctx.op();
                    let (out, x, y) = (
                        ctx.write(&tensors[c].0).unwrap(),
                        ctx.read(&tensors[a].0).unwrap(),
                        ctx.read(&tensors[b].0).unwrap(),
                    );
                    elementwise::add_forward(&ctx.kernels, &out, &x, &y, n).unwrap();
                    tensors[c].1 = tensors[a].1.iter().zip(&tensors[b].1).map(|(x, y)| x + y).collect();
                }
            }
            Op::Read(a) => {
                if let Some(a) = pick(a, tensors.len()) {
                    assert_same(&format!("tensor {a}"), &read(ctx, &tensors[a].0), &tensors[a].1);
                }
            }
            Op::Drop(a) => {
                if let Some(a) = pick(a, tensors.len()) {
                    tensors.swap_remove(a);
                }
            }
            Op::Flush => {
                ctx.pager.flush().unwrap();
                if let Some(dir) = store_dir {
                    // The files alone, read back from disk, hold every value.
                    for (t, want) in &tensors {
                        let r: HostRange = ctx.pager.host_range(t.id()).unwrap();
                        let file = std::fs::read(dir.join(format!("seg-{:05}.bin", r.segment))).unwrap();
                        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&file[r.offset..r.offset + want.len() * 4]);
                        assert_same("file contents after flush", &got, want);
                    }
                }
            }
        }
        let stats = ctx.pager.stats();
        assert!(stats.bytes_held <= budget, "{} bytes on the GPU over the {budget}-byte budget", stats.bytes_held);
    }
    for (t, want) in &tensors {
        assert_same("at the end", &read(ctx, t), want);
    }
    assert!(ctx.pager.stats().peak_bytes <= budget);
}

#[test]
fn pinning_a_store_segment_keeps_its_bytes_and_gives_the_gpu_a_buffer_over_them() {
    let Some((_gpu, mut store)) = pinned_store() else { return };
    let (a, b) = (store.alloc(1000).unwrap(), store.alloc(5000).unwrap());
    let want: Vec<Vec<u8>> =
        [a, b].iter().map(|r| (0..r.len).map(|i| (i * 31 + r.offset + 7) as u8).collect()).collect();
    for (r, w) in [a, b].iter().zip(&want) {
        store.bytes_mut(r).unwrap().copy_from_slice(w);
    }
    assert!(store.dma(&a).is_none(), "nothing is pinned before the pager asks");
    assert!(store.pin(&a));
    let ((buf_a, off_a), (buf_b, off_b)) = (store.dma(&a).unwrap(), store.dma(&b).unwrap());
    assert_eq!((off_a, off_b), (a.offset as u64, b.offset as u64));
    assert_eq!(buf_a, buf_b, "one segment, one buffer");
    assert!(buf_a.size() >= (b.offset + b.len) as u64);
    for (r, w) in [a, b].iter().zip(&want) {
        assert_eq!(store.bytes(r).unwrap(), &w[..], "bytes kept across pinning");
    }
    let bad = HostRange { segment: 7, offset: 0, len: 4 };
    assert!(store.bytes(&bad).is_err() && store.dma(&bad).is_none() && !store.pin(&bad));
    assert!(store.describe().starts_with("pinned memory"), "{}", store.describe());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_matches_a_plain_model(ops in prop::collection::vec(op(), 1..60), budget_kib in 20u64..64) {
        let budget = budget_kib * 1024;
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(budget, Policy::Belady));
        run_against_model(&ctx, &ops, budget, None);
    }

    #[test]
    fn zero_copy_uploads_match_a_plain_model(ops in prop::collection::vec(op(), 1..60), budget_kib in 20u64..64) {
        // Tensors written straight into host-visible GPU buffers (unified-memory adapters, such
        // as the CPU drivers CI runs on; elsewhere the pager keeps the staging ring).
        let budget = budget_kib * 1024;
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &PagerOptions { upload: UploadPath::ZeroCopy, ..opts(budget, Policy::Belady) });
        assert_offered_path_taken(&ctx, UploadPath::ZeroCopy);
        run_against_model(&ctx, &ops, budget, None);
    }

    #[test]
    fn pinned_uploads_match_a_plain_model(ops in prop::collection::vec(op(), 1..60), budget_kib in 20u64..64) {
        // The upload ring in pinned host memory, copied by DMA (every Vulkan adapter, lavapipe
        // included; elsewhere the pager falls back to the mapped ring and says so).
        let budget = budget_kib * 1024;
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &PagerOptions { upload: UploadPath::Pinned, ..opts(budget, Policy::Belady) });
        assert_offered_path_taken(&ctx, UploadPath::Pinned);
        run_against_model(&ctx, &ops, budget, None);
    }

    #[test]
    fn pinned_store_matches_a_plain_model(ops in prop::collection::vec(op(), 1..60), budget_kib in 20u64..64, direct_uploads in any::<bool>()) {
        // The host store in pinned memory (Vulkan): write-backs go by DMA straight into it, and
        // uploads too on the pinned path (the ring memcpys from it otherwise).
        let budget = budget_kib * 1024;
        let Some((gpu, store)) = pinned_store() else { return Ok(()) };
        let path = if direct_uploads { UploadPath::Pinned } else { UploadPath::Ring };
        let ctx = Context::with_store(gpu, Box::new(store), &PagerOptions { upload: path, ..opts(budget, Policy::Belady) });
        assert_eq!(ctx.pager.upload_path_kind(), path, "{}", ctx.pager.upload_path());
        run_against_model(&ctx, &ops, budget, None);
    }

    #[test]
    fn mmap_store_matches_a_plain_model_and_its_files(ops in prop::collection::vec(op(), 1..60), budget_kib in 20u64..64) {
        let budget = budget_kib * 1024;
        let dir = tmpdir("prop");
        let store = MmapStore::with_segment_bytes(&dir, 1 << 16).unwrap();
        let ctx = Context::with_store(gpu(), Box::new(store), &opts(budget, Policy::Lru));
        run_against_model(&ctx, &ops, budget, Some(&dir));
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn belady_never_uploads_more_than_lru(
        step in prop::collection::vec(0u64..12, 1..60),
        sizes in prop::collection::vec(1u64..8, 12),
        budget in 8u64..40,
        repeats in 2usize..4,
    ) {
        // The same step repeated, as in training; every key fits the budget alone.
        let step: Vec<Key> = step.into_iter().map(Key::Persistent).collect();
        let sizes: HashMap<Key, u64> = (0..12).map(|i| (Key::Persistent(i), sizes[i as usize])).collect();
        let steps = vec![step; repeats];
        let opt = plan::simulate(&steps, &sizes, budget, Policy::Belady).unwrap();
        let lru = plan::simulate(&steps, &sizes, budget, Policy::Lru).unwrap();
        prop_assert!(opt <= lru, "belady {opt} > lru {lru}");
    }
}

fn tiny_gpt_step(ctx: &Context, model: &Gpt, opt: &mut AdamW, tokens: &[u32], targets: &[u32]) -> (f32, Vec<Vec<f32>>) {
    ctx.pager.begin_step();
    let x = ctx.from_u32("tokens", &[2, 16], tokens).unwrap();
    let loss = model.loss(ctx, &x, targets).unwrap();
    let mut grads: Grads = model.grads();
    ctx.backward(&loss, &mut grads, 1.0).unwrap();
    let g: Vec<Vec<f32>> = model.params().iter().map(|p| read(ctx, &p.grad)).collect();
    opt.step(ctx, model).unwrap();
    model.zero_grad(ctx).unwrap();
    (read(ctx, &loss)[0], g)
}

#[test]
fn gpt_under_a_quarter_budget_computes_exactly_what_a_resident_one_does() {
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 23 };
    let tokens: Vec<u32> = (0..32).map(|i| (i * 5 % 23) as u32).collect();
    let targets: Vec<u32> = (0..32).map(|i| (i * 5 % 23 + 1) as u32 % 23).collect();
    let run = |budget: Option<u64>, upload: UploadPath| {
        let o = PagerOptions { budget, slot_bytes: 16 << 10, upload, ..Default::default() };
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &o);
        assert_offered_path_taken(&ctx, upload);
        let model = Gpt::new(&ctx, cfg, 9).unwrap();
        let mut opt = AdamW::new(&ctx, &model, AdamWConfig::default()).unwrap();
        let steps: Vec<(f32, Vec<Vec<f32>>)> =
            (0..3).map(|_| tiny_gpt_step(&ctx, &model, &mut opt, &tokens, &targets)).collect();
        let last = ctx.pager.last_step().expect("steps were marked");
        (steps, ctx.pager.stats(), ctx.pager.counters(), last)
    };
    // Resident, a step uploads only its tokens and writes back only the gradients read.
    let (resident, full, _, quiet) = run(None, UploadPath::Ring);
    let footprint = full.peak_bytes;
    let budget = footprint / 4;
    // Every upload path (those the adapter lacks fall back to the ring: checked above).
    for path in [UploadPath::Ring, UploadPath::Pinned, UploadPath::ZeroCopy] {
        let (paged, stats, counters, last) = run(Some(budget), path);
        // The per-step telemetry sees the paging: one step's share of the run's traffic.
        assert!(
            last.bytes_up > quiet.bytes_up && last.bytes_up <= counters.bytes_uploaded,
            "{path:?}: {last:?} {quiet:?}"
        );
        assert!(last.bytes_down <= counters.bytes_written_back && last.seconds > 0.0, "{path:?}: {last:?}");
        println!(
            "{path:?}: footprint {footprint} B, budget {budget} B, paged peak {} B, {counters:?}",
            stats.peak_bytes
        );
        assert!(stats.peak_bytes <= budget, "{path:?}: peak {} over budget {budget}", stats.peak_bytes);
        assert!(counters.evictions > 0 && counters.writebacks > 0, "a quarter budget must page: {counters:?}");
        assert!(counters.uploads > 0, "{path:?}: evicted tensors come back by upload: {counters:?}");
        for (step, ((l1, g1), (l2, g2))) in resident.iter().zip(&paged).enumerate() {
            assert_eq!(l1, l2, "{path:?}: loss at step {step}");
            for (i, (a, b)) in g1.iter().zip(g2).enumerate() {
                assert_same(&format!("{path:?}: gradient of parameter {i} at step {step}"), b, a);
            }
        }
    }
}

/// The gradient norm from sums of squares taken during backward (each gradient while it is on
/// the GPU) equals the one taken after backward, and under a paging budget brings fewer
/// gradients back for it.
#[test]
fn gradient_norms_taken_during_backward_equal_those_after_and_upload_less() {
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 23 };
    let tokens: Vec<u32> = (0..32).map(|i| (i * 7 % 23) as u32).collect();
    let targets: Vec<u32> = (0..32).map(|i| (i * 3 % 23 + 2) as u32 % 23).collect();
    let norm_after_backward = |budget: Option<u64>, early: bool| {
        let o = PagerOptions { budget, slot_bytes: 16 << 10, ..Default::default() };
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &o);
        let model = Gpt::new(&ctx, cfg, 11).unwrap();
        let opt = AdamW::new(&ctx, &model, AdamWConfig::default()).unwrap();
        let x = ctx.from_u32("tokens", &[2, 16], &tokens).unwrap();
        let loss = model.loss(&ctx, &x, &targets).unwrap();
        let mut grads: Grads = model.grads();
        if early {
            let norms = opt.clip.early_norms();
            norms.begin();
            grads.watch(norms);
        }
        ctx.backward(&loss, &mut grads, 1.0).unwrap();
        let before = ctx.pager.counters().bytes_uploaded;
        opt.clip.compute(&ctx, &model.params(), 1.0, 1.0).unwrap();
        ctx.sync().unwrap();
        let uploaded = ctx.pager.counters().bytes_uploaded - before;
        let norm = pollster::block_on(opt.clip.norm(&ctx)).unwrap();
        // Computed again, with no backward in between: from every gradient, as without `watch`.
        opt.clip.compute(&ctx, &model.params(), 1.0, 1.0).unwrap();
        let again = pollster::block_on(opt.clip.norm(&ctx)).unwrap();
        (norm, again, uploaded, ctx.pager.stats().peak_bytes)
    };
    let (want, _, _, footprint) = norm_after_backward(None, false);
    assert!(want.is_finite() && want > 0.0, "norm {want}");
    let (early, again, _, _) = norm_after_backward(None, true);
    assert!((early - want).abs() <= 1e-5 * want, "resident: during backward {early}, after {want}");
    assert!((again - want).abs() <= 1e-5 * want, "resident: again {again}, after {want}");
    let budget = Some(footprint / 4);
    let (paged_after, _, uploaded_after, _) = norm_after_backward(budget, false);
    let (paged_early, _, uploaded_early, _) = norm_after_backward(budget, true);
    assert!((paged_after - want).abs() <= 1e-5 * want, "paged, after backward: {paged_after} vs {want}");
    assert!((paged_early - want).abs() <= 1e-5 * want, "paged, during backward: {paged_early} vs {want}");
    assert!(
        uploaded_early < uploaded_after,
        "norms taken during backward uploaded {uploaded_early} B for the norm, after backward {uploaded_after} B"
    );
}

#[test]
fn a_tensor_read_again_while_its_write_back_is_in_flight_comes_back_by_dma_with_its_values() {
    // The ring's path over a pinned store: write-backs go into the store by DMA, and a tensor
    // needed again before its write-back's submission is done is uploaded by DMA too (after it
    // on the GPU) instead of waiting for the GPU.
    let Some((gpu, store)) = pinned_store() else { return };
    let n = 1500;
    let budget = 2 * pagetrain::pager::size_class(n as u64 * 4);
    let ctx = Context::with_store(
        gpu,
        Box::new(store),
        &PagerOptions { upload: UploadPath::Ring, ..opts(budget, Policy::Lru) },
    );
    let scale = |out: &Tensor, x: &Tensor, alpha: f32| {
        let _op = ctx.op();
        let (o, x) = (ctx.write(out).unwrap(), ctx.read(x).unwrap());
        elementwise::scale_forward(&ctx.kernels, &o, &x, alpha, n).unwrap();
    };
    let want_a = values(7, n);
    let a = ctx.from_f32("a", &[n], &want_a, false).unwrap();
    let [x, y, z] = ["x", "y", "z"].map(|name| ctx.empty(name, &[n], pagetrain::DType::F32, false).unwrap());
    scale(&x, &a, 2.0); // x dirty, a read after it: x is the older
    scale(&y, &a, -1.0); // evicts x: its write-back is recorded
    scale(&z, &x, 0.5); // evicts y, then a, for x, whose write-back is not done yet
    assert!(ctx.pager.counters().uploads_behind_writeback >= 1, "{:?}", ctx.pager.counters());
    let scaled = |alpha: f32| want_a.iter().map(|v| v * alpha).collect::<Vec<f32>>();
    assert_same("x", &read(&ctx, &x), &scaled(2.0));
    assert_same("y", &read(&ctx, &y), &scaled(-1.0));
    assert_same("z", &read(&ctx, &z), &scaled(1.0));
    assert!(ctx.pager.stats().peak_bytes <= budget);
}

#[test]
fn a_tensor_larger_than_the_budget_is_budget_too_small() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(64 << 10, Policy::Belady));
    match ctx.zeros("huge", &[1 << 16], false) {
        Err(Error::BudgetTooSmall { tensor, needed, budget }) => {
            assert_eq!(tensor, "huge");
            assert!(needed > budget);
        }
        other => panic!("expected BudgetTooSmall, got {:?}", other.map(|t| t.shape().to_vec())),
    }
    // Each fits alone, but one op needs both on the GPU at once.
    let a = ctx.zeros("a", &[10_000], false).unwrap();
    let b = ctx.zeros("b", &[10_000], false).unwrap();
    let _op = ctx.op();
    ctx.read(&a).unwrap();
    let err = ctx.write(&b).unwrap_err();
    assert!(matches!(err, Error::BudgetTooSmall { .. }), "{err}");
}

#[test]
fn a_tensor_over_the_storage_binding_limit_is_refused_naming_the_limit() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(u64::MAX / 4, Policy::Belady));
    let limit = ctx.gpu.max_binding_bytes();
    let elems = (limit / 4 + 1) as usize;
    let err = ctx.zeros("too big", &[elems], false).map(|_| ()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("too big") && msg.contains("storage-binding limit") && msg.contains(&limit.to_string()),
        "{msg}"
    );
}

/// A store whose writes can be made to fail, like a disk that filled up.
struct FlakyStore {
    inner: MemStore,
    fail: std::rc::Rc<std::cell::Cell<bool>>,
}

impl HostStore for FlakyStore {
    fn alloc(&mut self, len: usize) -> pagetrain::Result<HostRange> {
        self.inner.alloc(len)
    }
    fn free(&mut self, r: HostRange) {
        self.inner.free(r)
    }
    fn bytes(&self, r: &HostRange) -> pagetrain::Result<&[u8]> {
        self.inner.bytes(r)
    }
    fn bytes_mut(&mut self, r: &HostRange) -> pagetrain::Result<&mut [u8]> {
        if self.fail.get() {
            return Err(Error::Io { path: "flaky".into(), source: std::io::Error::other("No space left on device") });
        }
        self.inner.bytes_mut(r)
    }
    fn flush(&mut self) -> pagetrain::Result<()> {
        Ok(())
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn describe(&self) -> String {
        "flaky".into()
    }
}

#[test]
fn failing_write_back_is_an_error_and_keeps_the_gpu_copy() {
    let fail = std::rc::Rc::new(std::cell::Cell::new(false));
    let store = FlakyStore { inner: MemStore::new(), fail: fail.clone() };
    let ctx = Context::with_store(gpu(), Box::new(store), &opts(48 << 10, Policy::Lru));
    let x = ctx.from_f32("x", &[4000], &values(1, 4000), false).unwrap();
    let y = ctx.empty("y", &[4000], pagetrain::DType::F32, false).unwrap();
    {
        let _op = ctx.op();
        elementwise::scale_forward(&ctx.kernels, &ctx.write(&y).unwrap(), &ctx.read(&x).unwrap(), 2.0, 4000).unwrap();
    }
    // y is dirty on the GPU; making room for z must write it back, and the disk is full.
    fail.set(true);
    let z = ctx.zeros("z", &[8000], false).unwrap();
    let err = {
        let _op = ctx.op();
        ctx.write(&z).unwrap_err()
    };
    assert!(err.to_string().contains("No space left"), "{err}");
    fail.set(false);
    let want: Vec<f32> = values(1, 4000).iter().map(|v| v * 2.0).collect();
    assert_same("y after the failed write-back", &read(&ctx, &y), &want);
}

#[test]
fn store_file_truncated_or_deleted_underneath_is_an_error() {
    let dir = tmpdir("truncate");
    let store = MmapStore::with_segment_bytes(&dir, 1 << 16).unwrap();
    let ctx = Context::with_store(gpu(), Box::new(store), &opts(1 << 20, Policy::Belady));
    let t = ctx.from_f32("t", &[1000], &values(3, 1000), false).unwrap();
    let seg = dir.join("seg-00000.bin");
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(100).unwrap();
    let err = pollster::block_on(ctx.to_f32(&t)).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    assert!(err.to_string().contains("seg-00000.bin"), "{err}");

    let dir = tmpdir("delete");
    let store = MmapStore::with_segment_bytes(&dir, 1 << 16).unwrap();
    let ctx = Context::with_store(gpu(), Box::new(store), &opts(1 << 20, Policy::Belady));
    let _t = ctx.from_f32("t", &[1000], &values(3, 1000), false).unwrap();
    std::fs::remove_file(dir.join("seg-00000.bin")).unwrap();
    let err = ctx.pager.flush().unwrap_err();
    assert!(err.to_string().contains("deleted"), "{err}");
}

#[test]
fn full_disk_is_an_error_at_allocation() {
    // A 1 MiB tmpfs needs root; where mounting is not allowed the failing-store test above
    // covers write-back errors, and this one says so.
    let dir = tmpdir("tmpfs");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipping the tmpfs part: cannot mount here");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let store = MmapStore::with_segment_bytes(&dir, 512 << 10).unwrap();
        let ctx = Context::with_store(gpu(), Box::new(store), &opts(1 << 20, Policy::Belady));
        let a = ctx.from_f32("a", &[100_000], &values(1, 100_000), false).unwrap();
        let err = ctx.zeros("b", &[200_000], false).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("No space left") || err.to_string().contains("space"), "{err}");
        assert_eq!(read(&ctx, &a), values(1, 100_000), "nothing lost");
    });
    let _ = std::process::Command::new("umount").arg(&dir).status();
    result.unwrap();
}

#[test]
fn telemetry_reports_where_tensors_are() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(64 << 10, Policy::Belady));
    let rx = ctx.pager.subscribe();
    let a = ctx.from_f32("a", &[8000], &values(1, 8000), false).unwrap();
    let b = ctx.zeros("b", &[8000], false).unwrap();
    {
        let _op = ctx.op();
        elementwise::scale_forward(&ctx.kernels, &ctx.write(&b).unwrap(), &ctx.read(&a).unwrap(), 0.5, 8000).unwrap();
    }
    let c = ctx.from_f32("c", &[8000], &values(2, 8000), false).unwrap();
    {
        let _op = ctx.op();
        ctx.read(&c).unwrap();
    }
    ctx.pager.publish();
    let snap = rx.try_recv().expect("a published snapshot");
    let find = |t: &Tensor| snap.tensors.iter().find(|i| i.id == t.id()).unwrap().clone();
    assert_eq!(find(&c).location, pagetrain::pager::Location::Gpu);
    assert!(snap.gpu_bytes <= snap.budget);
    assert!(snap.counters.bytes_uploaded >= 2 * 8000 * 4, "{:?}", snap.counters);
    assert!(snap.counters.evictions >= 1 && snap.counters.writebacks >= 1, "{:?}", snap.counters);
    assert_eq!(find(&b).uploads, 0, "b was only ever written on the GPU");
}

fn location(ctx: &Context, t: &Tensor) -> pagetrain::pager::Location {
    ctx.pager.snapshot().tensors.iter().find(|i| i.id == t.id()).expect("a live tensor").location
}

#[test]
fn a_tensor_dropped_while_the_pager_is_busy_is_still_freed() {
    // The closure of `update_host` runs while the pager is borrowed; a handle dropped there
    // (or during a panic's unwind) used to leak its bytes for good.
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let a = ctx.from_f32("a", &[1000], &values(1, 1000), false).unwrap();
    let b = ctx.from_f32("b", &[1000], &values(2, 1000), false).unwrap();
    let before = ctx.pager.live_bytes().0;
    ctx.pager.update_host(&[a.id()], &[], move |_| drop(b)).unwrap();
    assert_eq!(ctx.pager.live_bytes().0, before - 4000, "b's bytes are given back");
    assert_eq!(ctx.pager.stats().tensors, 1);
    // The same for a handle dropped by a panic's unwind.
    let c = ctx.from_f32("c", &[1000], &values(3, 1000), false).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ctx.pager.update_host(&[a.id()], &[], move |_| {
            let _c = c;
            panic!("a host update fails");
        })
    }));
    assert!(panicked.is_err());
    assert_eq!(ctx.pager.live_bytes().0, before - 4000, "c's bytes are given back too");
}

#[test]
fn an_op_scope_ended_while_the_pager_is_busy_still_unpins() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let a = ctx.from_f32("a", &[1000], &values(1, 1000), false).unwrap();
    let other = ctx.from_f32("other", &[10], &values(2, 10), false).unwrap();
    let scope = ctx.op();
    ctx.read(&a).unwrap();
    ctx.pager.update_host(&[other.id()], &[], move |_| drop(scope)).unwrap();
    // Pinned forever, `a` could never leave the GPU.
    ctx.pager.evict(a.id()).unwrap();
    assert_eq!(location(&ctx, &a), pagetrain::pager::Location::HostRam, "a is unpinned and evictable");
    assert_eq!(ctx.pager.pin_depth(), 0);
}

#[test]
fn update_host_of_a_pinned_tensor_refreshes_its_gpu_copy() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let t = ctx.from_f32("t", &[1000], &values(1, 1000), false).unwrap();
    let y = ctx.empty("y", &[1000], pagetrain::DType::F32, false).unwrap();
    {
        let _op = ctx.op();
        let tv = ctx.read(&t).unwrap();
        let new = values(2, 1000);
        ctx.pager.update_host(&[t.id()], &[t.id()], |s| s[0].copy_from_slice(bytemuck::cast_slice(&new))).unwrap();
        elementwise::scale_forward(&ctx.kernels, &ctx.write(&y).unwrap(), &tv, 1.0, 1000).unwrap();
    }
    assert_same("a kernel reading t after update_host", &read(&ctx, &y), &values(2, 1000));
    assert_same("t", &read(&ctx, &t), &values(2, 1000));
}

#[test]
fn update_host_refuses_written_tensors_it_was_not_given() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let (a, b) = (ctx.zeros("a", &[10], false).unwrap(), ctx.zeros("b", &[10], false).unwrap());
    let err = ctx.pager.update_host(&[a.id()], &[b.id()], |_| ()).unwrap_err();
    assert!(err.to_string().contains("`b`"), "{err}");
}

/// A store whose `bytes_mut` succeeds `allow` more times, then fails (a disk that fills up while
/// a write-back is in flight).
struct CountdownStore {
    inner: MemStore,
    allow: std::rc::Rc<std::cell::Cell<usize>>,
}

impl HostStore for CountdownStore {
    fn alloc(&mut self, len: usize) -> pagetrain::Result<HostRange> {
        self.inner.alloc(len)
    }
    fn free(&mut self, r: HostRange) {
        self.inner.free(r)
    }
    fn bytes(&self, r: &HostRange) -> pagetrain::Result<&[u8]> {
        self.inner.bytes(r)
    }
    fn bytes_mut(&mut self, r: &HostRange) -> pagetrain::Result<&mut [u8]> {
        match self.allow.get() {
            0 => Err(Error::Io { path: "countdown".into(), source: std::io::Error::other("No space left on device") }),
            n => {
                self.allow.set(n - 1);
                self.inner.bytes_mut(r)
            }
        }
    }
    fn flush(&mut self) -> pagetrain::Result<()> {
        Ok(())
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn describe(&self) -> String {
        "countdown".into()
    }
}

#[test]
fn a_write_back_that_fails_after_eviction_is_an_error_at_every_later_read() {
    let allow = std::rc::Rc::new(std::cell::Cell::new(usize::MAX));
    let store = CountdownStore { inner: MemStore::new(), allow: allow.clone() };
    let ctx = Context::with_store(gpu(), Box::new(store), &opts(48 << 10, Policy::Lru));
    let x = ctx.from_f32("x", &[4000], &values(1, 4000), false).unwrap();
    let y = ctx.zeros("y", &[4000], false).unwrap();
    {
        let _op = ctx.op();
        elementwise::scale_forward(&ctx.kernels, &ctx.write(&y).unwrap(), &ctx.read(&x).unwrap(), 2.0, 4000).unwrap();
    }
    // Making room for z evicts dirty y: its write-back is checked and recorded (one `bytes_mut`),
    // its GPU buffer given back, and the delivery to the host fails later.
    let z = ctx.zeros("z", &[8000], false).unwrap();
    allow.set(1);
    {
        let _op = ctx.op();
        ctx.write(&z).unwrap();
    }
    assert_eq!(location(&ctx, &y), pagetrain::pager::Location::HostRam, "y was evicted");
    let err = pollster::block_on(ctx.to_f32(&y)).map(|_| ()).expect_err("the delivery fails");
    assert!(err.to_string().contains("`y`") && err.to_string().contains("No space left"), "{err}");
    allow.set(usize::MAX); // the disk has room again, but y's values are gone
    for attempt in 0..2 {
        let err = pollster::block_on(ctx.to_f32(&y)).map(|_| ()).expect_err("y's values were lost");
        let msg = err.to_string();
        assert!(msg.contains("`y`") && msg.contains("No space left"), "read {attempt}: {msg}");
    }
    {
        let _op = ctx.op();
        let err = ctx.read(&y).unwrap_err();
        assert!(err.to_string().contains("`y`"), "a kernel read: {err}");
    }
    assert!(ctx.pager.flush().is_err(), "the host cannot hold every value");
    // Overwriting y whole makes it whole again.
    ctx.write_f32(&y, &values(3, 4000)).unwrap();
    assert_same("y rewritten", &read(&ctx, &y), &values(3, 4000));
    ctx.pager.flush().unwrap();
}

#[test]
fn a_failed_delivery_of_a_tensor_still_on_the_gpu_keeps_its_values() {
    let allow = std::rc::Rc::new(std::cell::Cell::new(usize::MAX));
    let store = CountdownStore { inner: MemStore::new(), allow: allow.clone() };
    let ctx = Context::with_store(gpu(), Box::new(store), &opts(1 << 20, Policy::Lru));
    let x = ctx.from_f32("x", &[4000], &values(1, 4000), false).unwrap();
    let y = ctx.zeros("y", &[4000], false).unwrap();
    {
        let _op = ctx.op();
        elementwise::scale_forward(&ctx.kernels, &ctx.write(&y).unwrap(), &ctx.read(&x).unwrap(), 2.0, 4000).unwrap();
    }
    allow.set(1);
    assert!(ctx.pager.sync_to_host(&[y.id()]).is_err(), "the delivery failed");
    allow.set(usize::MAX);
    let want: Vec<f32> = values(1, 4000).iter().map(|v| v * 2.0).collect();
    assert_same("y, still on the GPU", &read(&ctx, &y), &want);
}

#[test]
fn a_second_store_in_the_same_directory_is_refused_naming_the_holder() {
    let dir = tmpdir("lock");
    let first = MmapStore::new(&dir).unwrap();
    let err = MmapStore::new(&dir).err().expect("the directory is in use");
    let msg = err.to_string();
    assert!(msg.contains(&format!("process {}", std::process::id())), "{msg}");
    assert!(msg.contains(&dir.display().to_string()), "{msg}");
    drop(first);
    MmapStore::new(&dir).expect("free again once the first store is gone");
}

#[test]
fn planning_works_without_begin_step() {
    // The README's loop: forward, backward, optimizer step, and no pager protocol. The
    // optimizer's step marks the step boundary, so the next step's uploads are planned ahead.
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 23 };
    let tokens: Vec<u32> = (0..32).map(|i| (i * 5 % 23) as u32).collect();
    let targets: Vec<u32> = (0..32).map(|i| (i * 5 % 23 + 1) as u32 % 23).collect();
    let run = |explicit: bool, budget: Option<u64>| {
        let o = PagerOptions { budget, slot_bytes: 16 << 10, ..Default::default() };
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &o);
        let model = Gpt::new(&ctx, cfg, 9).unwrap();
        let mut opt = AdamW::new(&ctx, &model, AdamWConfig::default()).unwrap();
        let mut per_step = Vec::new();
        for _ in 0..4 {
            if explicit {
                ctx.pager.begin_step();
            }
            let before = ctx.pager.counters();
            let x = ctx.from_u32("tokens", &[2, 16], &tokens).unwrap();
            let loss = model.loss(&ctx, &x, &targets).unwrap();
            let mut grads: Grads = model.grads();
            ctx.backward(&loss, &mut grads, 1.0).unwrap();
            opt.step(&ctx, &model).unwrap();
            model.zero_grad(&ctx).unwrap();
            read(&ctx, &loss);
            let after = ctx.pager.counters();
            per_step.push((after.prefetches - before.prefetches, after.bytes_uploaded - before.bytes_uploaded));
        }
        (per_step, ctx.pager.stats().peak_bytes)
    };
    let budget = Some(run(true, None).1 / 4);
    let (auto, explicit) = (run(false, budget).0, run(true, budget).0);
    println!("per step (prefetches, bytes uploaded): without begin_step {auto:?}, with {explicit:?}");
    assert!(explicit[3].0 > 0, "the budget must be short enough to plan uploads: {explicit:?}");
    assert!(auto[3].0 > 0, "no uploads planned without begin_step: {auto:?}");
    // Both plan from the last step's trace; they start from different residency (the explicit
    // run planned one step earlier), so allow a little either way.
    let (a, e) = (auto[3].1 as f64, explicit[3].1 as f64);
    assert!(a <= 1.02 * e, "a steady step uploads {a} B without begin_step, {e} B with it");
}

#[test]
fn auto_budget_comes_from_the_device_and_a_budget_over_it_is_refused_by_name() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &PagerOptions::default());
    let budget = ctx.pager.budget();
    let source = ctx.pager.budget_source().to_string();
    match ctx.gpu.heap_sizes() {
        // Vulkan (lavapipe in CI): the heap is known, auto stays inside it, and more is refused.
        Some(heap) => {
            assert!(budget > 0 && budget <= heap.device_local, "auto {budget} B vs heap {heap:?}");
            assert!(source.contains("device-local heap"), "{source}");
            let over = heap.device_local + (1 << 30);
            let opts = pagetrain::ContextOptions {
                pager: PagerOptions { budget: Some(over), ..Default::default() },
                ..Default::default()
            };
            let err = Context::from_gpu(gpu(), &opts).err().expect("a budget over the device is refused").to_string();
            assert!(err.contains("gpu_budget") && err.contains("device-local memory"), "{err}");
            assert!(err.contains(&ctx.gpu.info.name), "names the adapter: {err}");
        }
        // Elsewhere wgpu reports no memory sizes: the portable fallback, and it says so.
        None => {
            assert_eq!(budget, ctx.gpu.limits.max_buffer_size * 4);
            assert!(source.contains("does not report its memory"), "{source}");
        }
    }
    // A mapped upload ring in VRAM (discrete GPUs) grows within a quarter of the budget (4 slots
    // at least); in host memory (unified memory, as on the CPU drivers in CI) it is no part of
    // the GPU budget and grows as the copies need.
    let (budget, slot) = (256u64 << 10, 16u64 << 10);
    let small = Context::with_store(
        gpu(),
        Box::new(MemStore::new()),
        &PagerOptions { budget: Some(budget), slot_bytes: slot, upload: UploadPath::Ring, ..Default::default() },
    );
    let n = 50_000; // 200 kB: 13 slots
    let data = values(7, n);
    let t = small.from_f32("big", &[n], &data, false).unwrap();
    {
        let _op = small.op();
        small.read(&t).unwrap();
    }
    small.sync().unwrap();
    assert_same("uploaded through a bounded ring", &read(&small, &t), &data);
    let (up, _, pinned) = small.pager.staging_bytes();
    assert!(!pinned);
    if small.gpu.unified_memory() {
        assert_eq!(up, 13 * slot, "host-memory ring: one slot per chunk");
    } else {
        assert_eq!(up, 4 * slot, "VRAM ring: a quarter of {budget} B, or 4 slots");
    }
}

#[test]
fn a_step_tensor_freed_unread_is_not_written_back_once_a_step_has_shown_it() {
    // Each step: `used = 2x` is evicted dirty and read back by a kernel (its write-back is
    // needed); `dead = x/2` is evicted dirty and freed unread. The first step writes both back;
    // from the second on, the plan knows `dead` dies unread and drops it unwritten. Values stay
    // exact; a step that does read `dead` after all gets a clear error, never stale bytes.
    let n = 3001;
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let x0 = values(3, n);
    let x = ctx.from_f32("x", &[n], &x0, false).unwrap();
    let acc = ctx.from_f32("acc", &[n], &vec![0.0; n], false).unwrap();
    let mut want = vec![0.0f32; n];
    let step = |read_dead: bool| -> pagetrain::Result<()> {
        ctx.pager.begin_step();
        let (used, dead) = (
            ctx.empty("used", &[n], pagetrain::DType::F32, false)?,
            ctx.empty("dead", &[n], pagetrain::DType::F32, false)?,
        );
        {
            let _op = ctx.op();
            elementwise::scale_forward(&ctx.kernels, &ctx.write(&used)?, &ctx.read(&x)?, 2.0, n)?;
        }
        {
            let _op = ctx.op();
            elementwise::scale_forward(&ctx.kernels, &ctx.write(&dead)?, &ctx.read(&x)?, 0.5, n)?;
        }
        ctx.pager.evict(used.id())?;
        ctx.pager.evict(dead.id())?;
        {
            let _op = ctx.op();
            elementwise::axpy(&ctx.kernels, &ctx.modify(&acc)?, &ctx.read(&used)?, 1.0, n)?;
        }
        if read_dead {
            pollster::block_on(ctx.to_f32(&dead))?;
        }
        Ok(())
    };
    let mut skipped = Vec::new();
    for s in 0..4 {
        step(false).unwrap();
        for (w, v) in want.iter_mut().zip(&x0) {
            *w += 2.0 * v;
        }
        let c = ctx.pager.counters();
        skipped.push((c.writeback_skipped_bytes, c.writeback_unread_bytes));
        assert_same(&format!("acc after step {s}"), &read(&ctx, &acc), &want);
    }
    let bytes = (n * 4) as u64;
    assert_eq!(skipped[0], (0, bytes), "step 1 has no plan yet: `dead` is written back, wasted");
    assert_eq!(skipped[3], (3 * bytes, bytes), "later steps drop it unwritten: {skipped:?}");
    // A step that reads `dead` after all: an error naming it and why, not stale values.
    let err = step(true).unwrap_err().to_string();
    assert!(err.contains("`dead`") && err.contains("not written back"), "{err}");
    ctx.pager.flush().expect("a tensor dropped by plan is no failure of the store");
}
