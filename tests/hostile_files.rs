//! Loaders against files from strangers: safetensors checkpoints, Hugging Face `config.json`,
//! the training state in checkpoint metadata, `.bin` token files (llm.c header and raw), run
//! files (TOML). Each gets random bytes and mutations of a valid file; none may panic, and none
//! may allocate much more than its input justifies (a counting allocator watches the largest
//! single allocation). `PAGETRAIN_FUZZ_CASES` sets the inputs per loader (CI: 100000; the closing
//! note's figures: 1000000). Cases that once broke a loader are kept below as regressions.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use pagetrain::rng::Rng;
use pagetrain::train::checkpoint::{config_from_hf_json, TrainState};
use pagetrain::train::tensor_file::TensorFile;
use pagetrain::train::{Dataset, RunFile};

/// The system allocator, noting each thread's largest single allocation since its last reset
/// (per thread: the tests run side by side).
struct Counting;
thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

fn largest_since_reset() -> usize {
    LARGEST.with(|l| l.replace(0))
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn cases() -> usize {
    std::env::var("PAGETRAIN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000)
}

/// Random bytes, or `seed` mutated: bytes flipped, overwritten with edge values, cut, spliced.
fn input(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    if rng.below(8) == 0 || seed.is_empty() {
        let n = rng.below(512);
        return (0..n).map(|_| rng.below(256) as u8).collect();
    }
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len().max(1));
        match rng.below(6) {
            0 if !v.is_empty() => v[at] ^= 1 << rng.below(8),
            1 if !v.is_empty() => v[at] = [0x00, 0xff, 0x7f, 0x80, b'9', b'"'][rng.below(6)],
            2 => v.truncate(at),
            3 if at + 8 <= v.len() => v[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes()),
            4 => {
                let piece: Vec<u8> = v[at..].iter().take(16).copied().collect();
                v.splice(at..at, piece);
            }
            _ if !v.is_empty() => v[at] = rng.below(256) as u8,
            _ => {}
        }
    }
    v
}

/// Runs `load` on `cases()` inputs derived from `seed`; fails on a panic or an allocation over
/// `16 × input + 1 MiB`.
fn fuzz(name: &str, seed: &[u8], load: impl Fn(&[u8])) {
    let mut rng = Rng::new(0xF022 ^ name.len() as u64);
    let n = cases();
    let t0 = std::time::Instant::now();
    for i in 0..n {
        let bytes = input(&mut rng, seed);
        largest_since_reset();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load(&bytes)));
        let largest = largest_since_reset();
        assert!(outcome.is_ok(), "{name}: input {i} panicked: {:?}", String::from_utf8_lossy(&bytes));
        let allowed = 16 * bytes.len() + (1 << 20);
        assert!(
            largest <= allowed,
            "{name}: input {i} ({} bytes) allocated {largest} bytes at once: {:?}",
            bytes.len(),
            String::from_utf8_lossy(&bytes)
        );
    }
    eprintln!(
        "{name}: {n} inputs in {:.1} s, no panic, no allocation past 16x the input + 1 MiB",
        t0.elapsed().as_secs_f64()
    );
}

fn valid_safetensors() -> Vec<u8> {
    let header = r#"{"__metadata__":{"step":"3"},"transformer.wte.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"h":{"dtype":"F16","shape":[2],"data_offsets":[24,28]}}"#;
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend((0..28u8).map(|b| b % 7));
    v
}

const HF_CONFIG: &str = r#"{"activation_function":"gelu_new","n_layer":2,"n_head":4,"n_embd":64,"n_positions":64,"vocab_size":65,"model_type":"gpt2"}"#;

#[test]
fn safetensors_headers() {
    fuzz("safetensors", &valid_safetensors(), |b| {
        // The header is checked at open; each tensor when it is read.
        if let Ok(f) = TensorFile::from_bytes(Path::new("model.safetensors"), b.to_vec()) {
            let names: Vec<String> = f.names().map(String::from).collect();
            for name in names {
                let _ = f.read_f32(&name);
            }
        }
    });
}

#[test]
fn hugging_face_config_json() {
    fuzz("config.json", HF_CONFIG.as_bytes(), |b| {
        let _ = config_from_hf_json(Path::new("config.json"), &String::from_utf8_lossy(b));
    });
}

#[test]
fn checkpoint_training_state() {
    let state = r#"{"step":3,"data_seed":9,"vocab":["a","b"],"config":{"n_layer":2,"n_head":4,"n_embd":64,"block_size":64,"vocab_size":65},"frozen_int8":null,"loss_scale":{"scale":65536.0,"good_steps":2,"skipped_steps":0}}"#;
    assert!(serde_json::from_str::<TrainState>(state).is_ok(), "the seed is a valid state");
    fuzz("train_state", state.as_bytes(), |b| {
        let _ = serde_json::from_slice::<TrainState>(b);
    });
}

#[test]
fn token_files() {
    let mut llmc = vec![0u8; 1024];
    llmc[..12].copy_from_slice(bytemuck::cast_slice(&[20240520i32, 1, 40]));
    llmc.extend((0..80u32).map(|i| (i * 37 % 251) as u8));
    for seed in [llmc, (0..200u8).collect::<Vec<_>>()] {
        fuzz("token file", &seed, |b| {
            let _ = Dataset::from_bin_bytes(b, 50257, "data.bin");
        });
    }
}

#[test]
fn run_files() {
    let seed = "model = \"small\"\nsteps = 7\nbatch_size = 3\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 16\n\
                lr = 0.001\ngpu_budget = \"64MiB\"\nprecision = \"f16\"\ntokenizer = \"gpt2\"\n";
    fuzz("run.toml", seed.as_bytes(), |b| {
        if let Ok(f) = RunFile::parse(&String::from_utf8_lossy(b)) {
            let _ = f.apply(Default::default());
        }
    });
}

/// Inputs that once broke a loader.
#[test]
fn regressions() {
    // A config.json promising GPT-3's size beside a 28-byte model file: refused before the model
    // (and its 700 GB of parameters) is allocated.
    let dir = std::env::temp_dir().join(format!("pagetrain-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), valid_safetensors()).unwrap();
    let big = r#"{"n_layer":96,"n_head":96,"n_embd":12288,"n_positions":2048,"vocab_size":50257}"#;
    std::fs::write(dir.join("config.json"), big).unwrap();
    largest_since_reset();
    let err = pagetrain::train::checkpoint::load(&dir).err().expect("refused").to_string();
    assert!(largest_since_reset() < 1 << 20, "no large allocation on the way");
    assert!(err.contains("parameters") && err.contains("model.safetensors"), "{err}");
    // A config promising 2^40 layers must not be multiplied out in usize.
    let huge = r#"{"n_layer":1099511627776,"n_head":1,"n_embd":4294967296,"n_positions":1,"vocab_size":1}"#;
    if let Ok(c) = config_from_hf_json(Path::new("config.json"), huge) {
        assert!(c.num_params_f64() > 1e20, "the size is counted, not wrapped: {}", c.num_params_f64());
    }
}
