//! Faults are errors that name what and where and lose nothing: budgets too small, limits, a
//! full or vanished store, a write-back that fails before or after eviction, a store in use.

use super::*;

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
fn failing_write_back_is_an_error_and_keeps_the_gpu_copy() {
    let allow = std::rc::Rc::new(std::cell::Cell::new(usize::MAX));
    let store = CountdownStore { inner: MemStore::new(), allow: allow.clone() };
    let ctx = Context::with_store(gpu(), Box::new(store), &opts(48 << 10, Policy::Lru));
    let x = ctx.from_f32("x", &[4000], &values(1, 4000), false).unwrap();
    let y = ctx.empty("y", &[4000], pagetrain::DType::F32, false).unwrap();
    {
        let _op = ctx.op();
        elementwise::scale_forward(&ctx.kernels, &ctx.write(&y).unwrap(), &ctx.read(&x).unwrap(), 2.0, 4000).unwrap();
    }
    // y is dirty on the GPU; making room for z must write it back, and the disk is full.
    allow.set(0);
    let z = ctx.zeros("z", &[8000], false).unwrap();
    let err = {
        let _op = ctx.op();
        ctx.write(&z).unwrap_err()
    };
    assert!(err.to_string().contains("No space left"), "{err}");
    allow.set(usize::MAX);
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
    // covers write-back errors, and this one says so (or fails, under
    // `PAGETRAIN_REQUIRE_MOUNT=1`: CI, which runs as root, sets it).
    let dir = tmpdir("tmpfs");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        if std::env::var("PAGETRAIN_REQUIRE_MOUNT").is_ok_and(|v| v == "1") {
            panic!("PAGETRAIN_REQUIRE_MOUNT=1, but a tmpfs cannot be mounted at {}", dir.display());
        }
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
