//! The pager against a plain model: random sequences of ops on every store and upload path give
//! bit-identical contents within the budget, random steps repeated as training repeats them
//! (planned, their uploads' staging filled ahead) too, and Belady's plan never uploads more than
//! LRU.

use super::*;

#[derive(Clone, Debug)]
enum Op {
    New(usize),
    Write(usize, u32),
    Scale(usize, usize, u32),
    Add(usize, usize, usize),
    Read(usize),
    Drop(usize),
    Flush,
    /// Exchange two tensors' host bytes (`Pager::swap_host`, after bringing both to the host).
    Swap(usize, usize),
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
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::Swap(a, b)),
    ]
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

/// `c = alpha · a` on the GPU and in the model (tensors of equal length).
fn scale(ctx: &Context, tensors: &mut [(Tensor, Vec<f32>)], a: usize, c: usize, alpha: f32) {
    let n = tensors[a].1.len();
    let _op = ctx.op();
    let (out, x) = (ctx.write(&tensors[c].0).unwrap(), ctx.read(&tensors[a].0).unwrap());
    elementwise::scale_forward(&ctx.kernels, &out, &x, alpha, n).unwrap();
    tensors[c].1 = tensors[a].1.iter().map(|v| v * alpha).collect();
}

/// `c = a + b` on the GPU and in the model (tensors of equal length).
fn add(ctx: &Context, tensors: &mut [(Tensor, Vec<f32>)], a: usize, b: usize, c: usize) {
    let n = tensors[a].1.len();
    let _op = ctx.op();
    let (out, x, y) =
        (ctx.write(&tensors[c].0).unwrap(), ctx.read(&tensors[a].0).unwrap(), ctx.read(&tensors[b].0).unwrap());
    elementwise::add_forward(&ctx.kernels, &out, &x, &y, n).unwrap();
    tensors[c].1 = tensors[a].1.iter().zip(&tensors[b].1).map(|(x, y)| x + y).collect();
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
                    scale(ctx, &mut tensors, a, c, alpha);
                }
            }
            Op::Add(a, b, c) => {
                if let Some(a) = pick(a, tensors.len()) {
                    let n = tensors[a].1.len();
                    let same: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].1.len() == n).collect();
                    let b = same[b % same.len()];
                    let c = output(ctx, &mut tensors, n, &[a, b], c);
                    add(ctx, &mut tensors, a, b, c);
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
            Op::Swap(a, b) => {
                if let Some(a) = pick(a, tensors.len()) {
                    let n = tensors[a].1.len();
                    let same: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].1.len() == n).collect();
                    let b = same[b % same.len()];
                    let ids = [tensors[a].0.id(), tensors[b].0.id()];
                    ctx.pager.sync_to_host(&ids).unwrap();
                    ctx.pager.swap_host(ids[0], ids[1]).unwrap();
                    let (va, vb) = (tensors[a].1.clone(), tensors[b].1.clone());
                    (tensors[a].1, tensors[b].1) = (vb, va);
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

/// One op of a step over a fixed set of tensors (indices taken modulo their number).
#[derive(Clone, Debug)]
enum StepOp {
    Scale(usize, usize, u32),
    Add(usize, usize, usize),
    Write(usize, u32),
    Read(usize),
}

fn step_op() -> impl Strategy<Value = StepOp> {
    prop_oneof![
        4 => (any::<usize>(), any::<usize>(), any::<u32>()).prop_map(|(a, c, s)| StepOp::Scale(a, c, s)),
        4 => (any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(a, b, c)| StepOp::Add(a, b, c)),
        1 => (any::<usize>(), any::<u32>()).prop_map(|(a, s)| StepOp::Write(a, s)),
        1 => any::<usize>().prop_map(StepOp::Read),
    ]
}

/// Runs `step` `repeats` times, each a training step (`begin_step`), over tensors of `sizes`
/// floats, against a plain model: the same accesses every step, so from the second on the plan
/// predicts them and the ring fills slots ahead. Host writes between accesses change bytes
/// that may already sit in slots filled ahead. Returns the pager's counters.
fn run_steps_against_model(
    ctx: &Context,
    sizes: &[usize],
    step: &[StepOp],
    repeats: usize,
) -> pagetrain::pager::Counters {
    let mut tensors: Vec<(Tensor, Vec<f32>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let data = values(i as u32 + 1, n);
            (ctx.from_f32("t", &[n], &data, false).unwrap(), data)
        })
        .collect();
    let k = tensors.len();
    // Another tensor of the same length as `a`, none of `avoid` (`None`: there is none).
    let other = |tensors: &[(Tensor, Vec<f32>)], a: usize, avoid: &[usize], pick: usize| {
        let same: Vec<usize> =
            (0..k).filter(|&i| i != a && !avoid.contains(&i) && tensors[i].1.len() == tensors[a].1.len()).collect();
        (!same.is_empty()).then(|| same[pick % same.len()])
    };
    for repeat in 0..repeats {
        ctx.pager.begin_step();
        for (at, op) in step.iter().enumerate() {
            match *op {
                StepOp::Scale(a, c, s) => {
                    let a = a % k;
                    let Some(c) = other(&tensors, a, &[], c) else { continue };
                    let alpha = [0.5f32, 2.0, -1.0, 0.25][s as usize % 4];
                    scale(ctx, &mut tensors, a, c, alpha);
                }
                StepOp::Add(a, b, c) => {
                    let a = a % k;
                    let Some(b) = other(&tensors, a, &[], b) else { continue };
                    let Some(c) = other(&tensors, a, &[b], c) else { continue };
                    add(ctx, &mut tensors, a, b, c);
                }
                StepOp::Write(a, seed) => {
                    let a = a % k;
                    let data = values(seed ^ repeat as u32, tensors[a].1.len());
                    ctx.write_f32(&tensors[a].0, &data).unwrap();
                    tensors[a].1 = data;
                }
                StepOp::Read(a) => {
                    let a = a % k;
                    assert_same(
                        &format!("tensor {a} at op {at} of step {repeat}"),
                        &read(ctx, &tensors[a].0),
                        &tensors[a].1,
                    );
                }
            }
        }
    }
    for (i, (t, want)) in tensors.iter().enumerate() {
        assert_same(&format!("tensor {i} at the end"), &read(ctx, t), want);
    }
    ctx.pager.counters()
}

#[test]
fn a_planned_step_uploads_from_slots_filled_ahead_and_keeps_every_value() {
    // Ten tensors in a budget of three, each step scaling eight round a ring and adding pairs:
    // nearly every access uploads, and the plan knows which.
    let sizes = [1500, 1500, 1500, 1500, 1000, 1000, 1000, 1000, 700, 700];
    let mut step: Vec<StepOp> = (0..8).map(|i| StepOp::Scale(i, i, i as u32)).collect();
    step.extend((0..8).map(|i| StepOp::Add(i, i + 1, i + 2)));
    step.extend((0..8).map(|i| StepOp::Scale(7 - i, i, i as u32)));
    // A host write of tensor 8 (read only on the GPU, so clean), long evicted, just before an
    // access reads it: the bytes already filled ahead for that read go stale.
    step.extend([(0, 0), (2, 2), (4, 0), (6, 2)].map(|(a, c)| StepOp::Scale(a, c, 1)));
    step.extend([StepOp::Write(8, 5), StepOp::Scale(8, 0, 1)]);
    let budget = 3 * pagetrain::pager::size_class(1500 * 4);
    for path in [UploadPath::Ring, UploadPath::Pinned] {
        let o = PagerOptions { upload: path, upload_slots: 8, ..opts(budget, Policy::Belady) };
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &o);
        assert_offered_path_taken(&ctx, path);
        let c = run_steps_against_model(&ctx, &sizes, &step, 4);
        assert!(c.uploads > 20 && c.evictions > 20, "{path:?}: the budget must page: {c:?}");
        assert!(c.prefilled_uploads > 0, "{path:?}: no upload came from slots filled ahead: {c:?}");
        assert!(c.prefill_wasted_bytes > 0, "{path:?}: no host write met bytes filled ahead: {c:?}");
    }
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
    fn planned_steps_match_a_plain_model(
        step in prop::collection::vec(step_op(), 1..30),
        sizes in prop::collection::vec(prop::sample::select(vec![1usize, 255, 1000, 1500, 2500]), 2..8),
        budget_kib in 32u64..64,
        path in prop::sample::select(vec![UploadPath::Ring, UploadPath::Pinned]),
    ) {
        // The same random step three times: uploads come from slots filled ahead by the plan.
        let budget = budget_kib * 1024;
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &PagerOptions { upload: path, ..opts(budget, Policy::Belady) });
        run_steps_against_model(&ctx, &sizes, &step, 3);
    }

    #[test]
    fn slabs_match_a_plain_model(
        ops in prop::collection::vec(op(), 1..60),
        budget_kib in 30u64..64,
        path in prop::sample::select(vec![UploadPath::Ring, UploadPath::Pinned]),
    ) {
        // Tensors as ranges of slabs (a quarter of the budget each), placed first fit, those
        // larger than a slab in buffers of their own. An op holds at most three tensors of at
        // most 6 KiB: the rest may move or leave, so at least one slab can make way for the
        // third, and nothing may fail for fragmentation.
        let budget = budget_kib * 1024;
        let o = PagerOptions { upload: path, gpu_pool: GpuPool::Slabs, ..opts(budget, Policy::Belady) };
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &o);
        prop_assert!(ctx.pager.gpu_pool().starts_with("slabs"), "{}", ctx.pager.gpu_pool());
        run_against_model(&ctx, &ops, budget, None);
    }

    #[test]
    fn planned_steps_in_slabs_match_a_plain_model(
        step in prop::collection::vec(step_op(), 1..30),
        sizes in prop::collection::vec(prop::sample::select(vec![1usize, 255, 1000, 1500, 2500]), 2..8),
        budget_kib in 50u64..80,
    ) {
        let budget = budget_kib * 1024;
        let o = PagerOptions { gpu_pool: GpuPool::Slabs, ..opts(budget, Policy::Belady) };
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &o);
        prop_assert!(ctx.pager.gpu_pool().starts_with("slabs"), "{}", ctx.pager.gpu_pool());
        run_steps_against_model(&ctx, &sizes, &step, 3);
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
