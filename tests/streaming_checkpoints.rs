//! Checkpoints stream through the pager a tensor at a time: saving and loading one never holds
//! all weights and moments in RAM (measured with a counting allocator), and what is loaded is
//! what was saved.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pagetrain::nn::ModelShape;
use pagetrain::nn::Module;
use pagetrain::train::{TrainConfig, Trainer};
use pagetrain::{Context, ContextOptions, StoreKind};

/// The system allocator, keeping each thread's live bytes and their peak since the last reset.
struct Counting;
thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    let _ = LIVE.try_with(|l| {
        l.set(l.get() + delta);
        let _ = PEAK.try_with(|p| p.set(p.get().max(l.get())));
    });
}

/// Runs `f` and returns the most bytes this thread held at once during it, above what it held
/// before.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(base));
    let r = f();
    (r, (PEAK.with(|p| p.get()) - base).max(0) as usize)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn checkpoints_stream_a_tensor_at_a_time() {
    let dir = std::env::temp_dir().join(format!("pagetrain-streamck-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Tensors live in mmap'ed files, so the heap holds only what checkpointing itself takes.
    let opts = ContextOptions { store: StoreKind::Mmap(dir.join("store")), ..Default::default() };
    let ctx = pollster::block_on(Context::new(&opts)).expect("a GPU adapter");
    let cfg = TrainConfig {
        custom_model: Some(ModelShape { n_layer: 6, n_head: 4, n_embd: 128, block_size: 32 }),
        steps: 2,
        batch_size: 2,
        seq_len: 32,
        sample_len: 0,
        out: dir.join("run"),
        optimizer_on: pagetrain::train::OptimizerOn::Gpu,
        ..Default::default()
    };
    let mut t = Trainer::new(&ctx, cfg.clone(), None).unwrap();
    pollster::block_on(t.train_step(&ctx)).unwrap();
    let params = t.model.params();
    let total: usize = params.iter().map(|p| p.value.len() * 4 * 3).sum(); // weights + both moments
    let largest = params.iter().map(|p| p.value.len() * 4).max().unwrap();
    assert!(total > 20 * largest, "the model must be far larger than its largest tensor");

    let (saved, peak_save) = peak_during(|| pollster::block_on(t.save(&ctx, &cfg.out)));
    saved.unwrap();
    let (resumed, peak_load) =
        peak_during(|| Trainer::new(&ctx, TrainConfig { resume: Some(cfg.out.clone()), ..cfg.clone() }, None));
    let resumed = resumed.unwrap();
    eprintln!("state {total} bytes, largest tensor {largest}: peak {peak_save} saving, {peak_load} loading");
    // One tensor (and its bytes) at a time plus the file buffer, not the whole state.
    for (what, peak) in [("save", peak_save), ("load", peak_load)] {
        assert!(peak < total / 4, "{what} held {peak} bytes at once of a {total}-byte state");
        assert!(peak >= largest, "{what}: {peak} bytes is less than one tensor: is the allocator counting?");
    }
    for (a, b) in t.model.params().iter().zip(resumed.model.params()) {
        let (x, y) =
            (pollster::block_on(ctx.to_f32(&a.value)).unwrap(), pollster::block_on(ctx.to_f32(&b.value)).unwrap());
        assert_eq!(x, y, "{} round-trips", a.name);
    }
}
