//! What the pager reports and keeps: telemetry, the budget it derives from the device, pins held
//! across a busy pager, and host updates of tensors on the GPU, in place or lent to a thread.

use super::*;

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
        // The last chunk (3392 B) takes a slot of its size: a power of two, at least slot / 128.
        assert_eq!(up, 12 * slot + 4096, "host-memory ring: one slot per chunk");
    } else {
        assert_eq!(up, 4 * slot, "VRAM ring: a quarter of {budget} B, or 4 slots");
    }
}

#[test]
fn host_bytes_lent_to_another_thread_are_off_limits_until_returned() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let n = 1000;
    let (a, b) = (ctx.from_f32("a", &[n], &values(1, n), false).unwrap(), ctx.zeros("b", &[n], false).unwrap());
    let gone = ctx.from_f32("gone", &[n], &values(4, n), false).unwrap();
    ctx.read(&a).unwrap();
    ctx.pager.sync_to_host(&[a.id()]).unwrap();
    let mut loan = ctx.pager.lend_host(&[a.id(), b.id(), gone.id()], &[a.id(), b.id()]).unwrap();
    // the borrower's thread reads a (its newest bytes) and b (zeros, written as such), writes both
    let worker = std::thread::spawn(move || {
        let mut s = loan.slices();
        let a_now: Vec<f32> = bytemuck::pod_collect_to_vec(&s[0][..]);
        let b_now: Vec<f32> = bytemuck::pod_collect_to_vec(&s[1][..]);
        s[0].copy_from_slice(bytemuck::cast_slice(&values(2, n)));
        s[1].copy_from_slice(bytemuck::cast_slice(&values(3, n)));
        drop(s);
        (loan, a_now, b_now)
    });
    // meanwhile every way to the lent bytes is an error naming the tensor
    let errors = [
        ctx.read(&a).map(|_| ()).unwrap_err(),
        ctx.pager.write(b.id(), &[0; 4000]).unwrap_err(),
        ctx.pager.read_now(a.id()).unwrap_err(),
        pollster::block_on(ctx.pager.read(b.id())).unwrap_err(),
        ctx.pager.update_host(&[a.id()], &[], |_| ()).unwrap_err(),
        ctx.pager.lend_host(&[b.id()], &[]).map(|_| ()).unwrap_err(),
    ];
    for err in errors {
        assert!(
            err.to_string().contains("lent") && (err.to_string().contains("`a`") || err.to_string().contains("`b`")),
            "{err}"
        );
    }
    // a tensor released while lent keeps its bytes until the loan comes back
    let gone_range = ctx.pager.host_range(gone.id()).unwrap();
    drop(gone);
    let meanwhile = ctx.zeros("meanwhile", &[n], false).unwrap();
    assert_ne!(ctx.pager.host_range(meanwhile.id()).unwrap().offset, gone_range.offset, "lent bytes were reused");
    let (loan, a_then, b_then) = worker.join().unwrap();
    assert_same("a as lent", &a_then, &values(1, n));
    assert!(b_then.iter().all(|&x| x == 0.0), "b lent as zeros");
    ctx.pager.return_host(loan).unwrap();
    assert_same("a after the loan", &read(&ctx, &a), &values(2, n));
    assert_same("b after the loan", &read(&ctx, &b), &values(3, n));
    // then they are free again (first fit: the next tensor of that size gets them)
    let again = ctx.from_f32("again", &[n], &values(5, n), false).unwrap();
    assert_eq!(ctx.pager.host_range(again.id()).unwrap().offset, gone_range.offset);
    assert_same("a tensor in them", &read(&ctx, &again), &values(5, n));
}

#[test]
fn swapping_host_bytes_exchanges_values_and_drops_stale_gpu_copies() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let n = 1000;
    let (a, b) = (ctx.from_f32("a", &[n], &values(1, n), false).unwrap(), ctx.zeros("b", &[n], false).unwrap());
    // a on the GPU (clean); `out` on the GPU, made there (dirty)
    {
        let _op = ctx.op();
        ctx.read(&a).unwrap();
    }
    let (made, want) = halved_on_gpu(&ctx, 2, n);
    let err = ctx.pager.swap_host(a.id(), made.id()).unwrap_err().to_string();
    assert!(err.contains("`out`") && err.contains("newer values on the GPU"), "{err}");
    ctx.pager.sync_to_host(&[made.id()]).unwrap();
    let uploads = ctx.pager.counters().uploads;
    ctx.pager.swap_host(a.id(), made.id()).unwrap();
    // each now holds the other's values, read back through fresh uploads (no stale GPU copy)
    let (read_a, read_made) = (read(&ctx, &a), read(&ctx, &made));
    assert_same("a after the swap", &read_a, &want);
    assert_same("out after the swap", &read_made, &values(1, n));
    {
        let _op = ctx.op();
        ctx.read(&a).unwrap();
    }
    assert!(ctx.pager.counters().uploads > uploads, "a went up again");
    // a zero tensor stays zero where it goes
    ctx.pager.swap_host(a.id(), b.id()).unwrap();
    assert!(read(&ctx, &a).iter().all(|&x| x == 0.0));
    assert_same("b after the swap", &read(&ctx, &b), &want);
    // sizes must match; held and lent tensors refuse, by name
    let small = ctx.from_f32("small", &[n - 1], &values(3, n - 1), false).unwrap();
    let err = ctx.pager.swap_host(a.id(), small.id()).unwrap_err().to_string();
    assert!(err.contains("`small`") && err.contains("one size"), "{err}");
    {
        let _op = ctx.op();
        ctx.read(&a).unwrap();
        let err = ctx.pager.swap_host(a.id(), b.id()).unwrap_err().to_string();
        assert!(err.contains("`a`") && err.contains("held"), "{err}");
    }
    let loan = ctx.pager.lend_host(&[b.id()], &[]).unwrap();
    let err = ctx.pager.swap_host(a.id(), b.id()).unwrap_err().to_string();
    assert!(err.contains("`b`") && err.contains("lent"), "{err}");
    ctx.pager.return_host(loan).unwrap();
    assert_same("b untouched by the refusals", &read(&ctx, &b), &want);
}

#[test]
fn a_tensor_expecting_a_host_update_is_not_prefetched_and_reads_its_new_bytes() {
    // Each step reads `a` then `b`. From the second on, the plan knows `b` comes next, so the
    // miss on `a` prefetches it — unless `b` is about to be rewritten on the host.
    let run = |hint: bool| {
        let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
        let n = 1000;
        let (a, b) = (
            ctx.from_f32("a", &[n], &values(1, n), false).unwrap(),
            ctx.from_f32("b", &[n], &values(2, n), false).unwrap(),
        );
        let ys = [0, 1].map(|i| ctx.empty(&format!("y{i}"), &[n], pagetrain::DType::F32, false).unwrap());
        let step = || {
            ctx.pager.begin_step();
            for (x, y) in [&a, &b].into_iter().zip(&ys) {
                let _op = ctx.op();
                let xv = ctx.read(x).unwrap();
                elementwise::scale_forward(&ctx.kernels, &ctx.write(y).unwrap(), &xv, 1.0, n).unwrap();
            }
        };
        step();
        ctx.pager.sync_to_host(&[ys[0].id(), ys[1].id()]).unwrap();
        for t in [&a, &b] {
            ctx.pager.evict(t.id()).unwrap();
        }
        if hint {
            ctx.pager.expect_host_update(&[b.id()]);
        }
        let before = ctx.pager.counters().prefetches;
        ctx.pager.begin_step();
        {
            let _op = ctx.op();
            let av = ctx.read(&a).unwrap();
            elementwise::scale_forward(&ctx.kernels, &ctx.write(&ys[0]).unwrap(), &av, 1.0, n).unwrap();
        }
        let prefetched = ctx.pager.counters().prefetches - before;
        // The rewrite, then the read: the kernel sees the new bytes either way.
        let new = values(3, n);
        ctx.pager.update_host(&[b.id()], &[b.id()], |s| s[0].copy_from_slice(bytemuck::cast_slice(&new))).unwrap();
        {
            let _op = ctx.op();
            let bv = ctx.read(&b).unwrap();
            elementwise::scale_forward(&ctx.kernels, &ctx.write(&ys[1]).unwrap(), &bv, 1.0, n).unwrap();
        }
        assert_same(&format!("y1 after b's update, hint {hint}"), &read(&ctx, &ys[1]), &new);
        assert_same(&format!("y0, hint {hint}"), &read(&ctx, &ys[0]), &values(1, n));
        prefetched
    };
    let (plain, hinted) = (run(false), run(true));
    assert!(plain >= 1, "without the hint `b` is prefetched: {plain}");
    assert!(hinted < plain, "with it, `b` is left alone: {hinted} prefetches vs {plain}");
}

/// Staging rings of 4 slots of at most 64 KiB.
const RING_SLOT: u64 = 64 << 10;

fn rings_of_four_slots() -> Context {
    let o = PagerOptions { upload_slots: 4, readback_slots: 4, slot_bytes: RING_SLOT, ..opts(1 << 20, Policy::Belady) };
    Context::with_store(gpu(), Box::new(MemStore::new()), &o)
}

/// `n` values of `seed` uploaded and halved on the GPU: the result, and what it must hold.
fn halved_on_gpu(ctx: &Context, seed: u32, n: usize) -> (Tensor, Vec<f32>) {
    let src = ctx.from_f32("src", &[n], &values(seed, n), false).unwrap();
    let out = ctx.zeros("out", &[n], false).unwrap();
    {
        let _op = ctx.op();
        let (o, s) = (ctx.write(&out).unwrap(), ctx.read(&src).unwrap());
        elementwise::scale_forward(&ctx.kernels, &o, &s, 0.5, n).unwrap();
    }
    (out, values(seed, n).iter().map(|v| v * 0.5).collect())
}

#[test]
fn write_back_slots_fit_the_tensors_they_carry() {
    // Small tensors written back take small readback slots, not `slot_bytes` each (a tiny model
    // held 128 slots of 8 MiB); a chunk larger than every free slot of a full ring still goes.
    let ctx = rings_of_four_slots();
    let written_back = |seed: u32, n: usize| {
        let (t, want) = halved_on_gpu(&ctx, seed, n);
        ctx.pager.evict(t.id()).unwrap();
        (t, want)
    };
    let small: Vec<_> = (0..40).map(|i| written_back(i, 1000)).collect();
    ctx.sync().unwrap();
    let (_, back, _) = ctx.pager.staging_bytes();
    assert!(back > 0 && back <= 4 * 4096, "40 write-backs of 4000 B held {back} B of readback slots");
    let big = written_back(99, 16_000);
    ctx.sync().unwrap();
    let (_, back, _) = ctx.pager.staging_bytes();
    assert!(
        (RING_SLOT..=3 * 4096 + RING_SLOT).contains(&back),
        "a small slot made over for the 64000 B chunk: {back} B"
    );
    assert!(ctx.pager.counters().writebacks >= 41, "{:?}", ctx.pager.counters());
    for (i, (t, want)) in small.iter().chain([&big]).enumerate() {
        assert_eq!(location(&ctx, t), pagetrain::pager::Location::HostRam, "tensor {i} was written back");
        assert_same(&format!("tensor {i} after its write-back"), &read(&ctx, t), want);
    }
}

#[test]
fn upload_slots_fit_the_tensors_they_carry() {
    // Small uploads take small slots; a chunk larger than every slot of a ring at its count
    // makes one of them over, and every value arrives.
    let ctx = rings_of_four_slots();
    let uploaded = |seed: u32, n: usize| {
        let (out, want) = halved_on_gpu(&ctx, seed, n);
        assert_same(&format!("{n} values uploaded and halved"), &read(&ctx, &out), &want);
    };
    for seed in 0..40 {
        uploaded(seed, 1000);
    }
    let (up, _, _) = ctx.pager.staging_bytes();
    assert!(up > 0 && up <= 4 * 4096, "40 uploads of 4000 B held {up} B of upload slots");
    uploaded(99, 16_000);
    let (up, _, _) = ctx.pager.staging_bytes();
    assert!(
        (RING_SLOT..=3 * 4096 + RING_SLOT).contains(&up),
        "a small slot was made over for the 64000 B chunk: {up} B"
    );
}

#[test]
fn a_discarded_tensor_leaves_the_gpu_unwritten_and_refuses_reads_until_rewritten() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let (a, want) = halved_on_gpu(&ctx, 5, 3000);
    let before = ctx.pager.counters();
    let location = |ctx: &Context| ctx.pager.snapshot().tensors.iter().find(|t| t.id == a.id()).unwrap().location;
    assert_eq!(location(&ctx), pagetrain::pager::Location::Gpu);
    assert_eq!(ctx.pager.discard(a.id()).unwrap(), 3000 * 4);
    assert_eq!(location(&ctx), pagetrain::pager::Location::Remade, "its buffer went back to the pool");
    ctx.pager.evict(a.id()).unwrap();
    ctx.pager.drain().unwrap();
    assert_eq!(
        ctx.pager.counters().bytes_written_back,
        before.bytes_written_back,
        "a discarded tensor was written back"
    );
    let err = pollster::block_on(ctx.to_f32(&a)).unwrap_err().to_string();
    assert!(err.contains("discarded") && err.contains(&ctx.pager.name(a.id())), "{err}");
    // written whole again (as backward remakes it), it reads back
    {
        let _op = ctx.op();
        let src = ctx.from_f32("src", &[3000], &want, false).unwrap();
        elementwise::scale_forward(&ctx.kernels, &ctx.write(&a).unwrap(), &ctx.read(&src).unwrap(), 1.0, 3000).unwrap();
    }
    assert_eq!(pollster::block_on(ctx.to_f32(&a)).unwrap(), want);
}

#[test]
fn a_tensor_handed_to_the_host_is_written_back_and_leaves_the_gpu_without_counting_as_an_eviction() {
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &opts(1 << 20, Policy::Belady));
    let (a, want) = halved_on_gpu(&ctx, 6, 3001);
    let before = ctx.pager.counters();
    let location = |ctx: &Context| ctx.pager.snapshot().tensors.iter().find(|t| t.id == a.id()).unwrap().location;
    assert_eq!(location(&ctx), pagetrain::pager::Location::Gpu);
    ctx.pager.hand_to_host(a.id()).unwrap();
    assert_ne!(location(&ctx), pagetrain::pager::Location::Gpu, "its buffer went back to the pool");
    ctx.pager.sync_to_host(&[a.id()]).unwrap();
    let after = ctx.pager.counters();
    assert_eq!(after.bytes_written_back - before.bytes_written_back, 3001 * 4, "written back once");
    assert_eq!(after.evictions, before.evictions, "counted as an eviction");
    let host = ctx.pager.update_host(&[a.id()], &[], |s| bytemuck::pod_collect_to_vec::<u8, f32>(&s[0][..])).unwrap();
    assert_eq!(host, want, "the host bytes after the hand-over");
    // handed over again, clean and not on the GPU: nothing moves
    ctx.pager.hand_to_host(a.id()).unwrap();
    assert_eq!(ctx.pager.counters().bytes_written_back, after.bytes_written_back);
    // used up: shown as nowhere (not as made again in backward), and reads say why they fail
    ctx.pager.forget(a.id()).unwrap();
    assert_eq!(location(&ctx), pagetrain::pager::Location::Nowhere);
    let err = pollster::block_on(ctx.to_f32(&a)).unwrap_err().to_string();
    assert!(err.contains("forgotten") && err.contains(&ctx.pager.name(a.id())), "{err}");
}

#[test]
fn slabs_split_by_held_tensors_are_an_error_naming_the_tensor_and_nothing_is_lost() {
    // Slabs of 16 KiB (a quarter of 64 KiB), three 5 KiB tensors in each, every one held by the
    // op: 62 KiB would fit the budget, but no slab has a 2 KiB gap, none can be emptied and
    // nothing held may move.
    let o = PagerOptions { gpu_pool: GpuPool::Slabs, ..opts(64 << 10, Policy::Belady) };
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &o);
    let small: Vec<(Tensor, Vec<f32>)> = (0..12)
        .map(|i| (values(i, 1280), i))
        .map(|(v, i)| (ctx.from_f32(&format!("s{i}"), &[1280], &v, false).unwrap(), v))
        .collect();
    let big = ctx.from_f32("big", &[512], &values(99, 512), false).unwrap();
    {
        let _op = ctx.op();
        for (t, _) in &small {
            ctx.read(t).unwrap();
        }
        assert!(ctx.pager.gpu_pool().contains("(4 held)"), "{}", ctx.pager.gpu_pool());
        match ctx.read(&big) {
            Err(Error::SlabsFragmented { tensor, bytes, budget }) => {
                assert_eq!((tensor.as_str(), bytes, budget), ("big", 2048, 64 << 10));
            }
            other => panic!("expected SlabsFragmented, got {:?}", other.map(|v| v.offset)),
        }
    }
    // Once the op lets go, everything is there.
    assert_same("big after the refusal", &read(&ctx, &big), &values(99, 512));
    for (t, want) in &small {
        assert_same("a held tensor after the refusal", &read(&ctx, t), want);
    }
}

#[test]
fn slabs_open_a_range_by_moving_tensors_inside_gpu_memory_with_nothing_on_the_bus() {
    // Slabs of 16 KiB (a quarter of 64 KiB), each holding an 8 KiB tensor from the host and an
    // 8 KiB tensor written on the GPU (dirty). Freeing two of the host ones leaves 16 KiB free
    // in 8 KiB holes: a 16 KiB tensor fits only once a dirty one moves into the hole of another
    // slab (a copy inside GPU memory), not by writing anything back.
    let o = PagerOptions { gpu_pool: GpuPool::Slabs, ..opts(64 << 10, Policy::Belady) };
    let ctx = Context::with_store(gpu(), Box::new(MemStore::new()), &o);
    let mut from_host = Vec::new();
    let mut made = Vec::new();
    for i in 0..4 {
        let b = ctx.from_f32(&format!("b{i}"), &[2048], &values(i, 2048), false).unwrap();
        let a = ctx.zeros(&format!("a{i}"), &[2048], false).unwrap();
        {
            let _op = ctx.op();
            elementwise::scale_forward(&ctx.kernels, &ctx.write(&a).unwrap(), &ctx.read(&b).unwrap(), 0.5, 2048)
                .unwrap();
        }
        let want: Vec<f32> = values(i, 2048).iter().map(|v| v * 0.5).collect();
        from_host.push(b);
        made.push((a, want));
    }
    assert!(ctx.pager.gpu_pool().contains("(4 held)"), "{}", ctx.pager.gpu_pool());
    from_host.truncate(2);
    drop(from_host);
    let before = ctx.pager.counters();
    let big = ctx.from_f32("big", &[4096], &values(99, 4096), false).unwrap();
    {
        let _op = ctx.op();
        ctx.read(&big).unwrap();
    }
    let after = ctx.pager.counters();
    assert!(after.relocations > before.relocations, "{after:?}");
    assert!(after.bytes_relocated - before.bytes_relocated >= 8192, "{after:?}");
    assert_eq!(after.bytes_written_back, before.bytes_written_back, "nothing went back to the host");
    assert_eq!(after.bytes_uploaded - before.bytes_uploaded, 16384, "only the big tensor came up");
    assert!(ctx.pager.gpu_pool().contains("(4 held)"), "no slab made: {}", ctx.pager.gpu_pool());
    assert_same("big", &read(&ctx, &big), &values(99, 4096));
    for (t, want) in &made {
        assert_same("a tensor written on the GPU, moved or not", &read(&ctx, t), want);
    }
}
