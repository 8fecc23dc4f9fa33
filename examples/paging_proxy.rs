//! GPT-2 small's paged step in miniature, for measuring the pager where no large GPU is: every
//! tensor is 1/16 of the size it has in `pagetrain bench --steps-model gpt2-124m --batch-size 8
//! --seq-len 1024` (width 768 → 192, vocabulary 50257 → 12565, sequence 1024 → 256: weights,
//! activations, logits and attention scores all shrink 16×), so a budget that is the same share
//! of the footprint makes the pager choose as it does there. On lavapipe it reproduces the H100's
//! buffers created a step (f32 at 25 %: 228.5 here, 231 there; f16 85 / 84) and bytes moved (×16:
//! f32 1.35 / 1.34 GB up, f16 0.39 / 0.33–0.39) in about a minute a configuration.
//!
//! Run: `cargo run --release --example paging_proxy -- f16|f32 buffers|slabs [gpu|host|split] [recompute] PERCENT...`
//! (`recompute`: the blocks made again in backward, as an H100 chooses for f16 at a quarter and
//! a tenth, without the trial that would time it here; budgets stay shares of the footprint
//! without recompute, as `pagetrain bench` states them)
//! Prints, per budget (a percentage of the footprint), the step's bytes up, down and moved inside
//! GPU memory, the GPU buffers created and the host time in the pager's accesses, averaged over
//! two steps after two warm-up steps.
use pagetrain::bench::time_steps;
use pagetrain::nn::ModelShape;
use pagetrain::pager::{GpuPool, PagerOptions, UploadPath};
use pagetrain::train::{Dataset, OptimizerOn, Precision, TrainConfig};
use pagetrain::{Context, ContextOptions, Error};

const VOCAB: usize = 12565;

fn main() -> pagetrain::Result<()> {
    let usage = || Error::Invalid {
        what: "arguments",
        msg: "f16|f32 buffers|slabs [gpu|host|split] [recompute] PERCENT...".into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let precision = match args.first().map(String::as_str) {
        Some("f16") => Precision::F16,
        Some("f32") => Precision::F32,
        _ => return Err(usage()),
    };
    let pool = match args.get(1).map(String::as_str) {
        Some("buffers") => GpuPool::Buffers,
        Some("slabs") => GpuPool::Slabs,
        _ => return Err(usage()),
    };
    // (an optimizer placement among them overrides auto: gpu, host, split)
    let optimizer_on = args[2..].iter().find_map(|a| a.parse::<OptimizerOn>().ok()).unwrap_or(OptimizerOn::Auto);
    let recompute = args[2..].iter().any(|a| a == "recompute");
    let numbers = args[2..].iter().filter(|a| a.parse::<OptimizerOn>().is_err() && *a != "recompute");
    let percents: Vec<u64> = numbers.map(|p| p.parse().map_err(|_| usage())).collect::<Result<_, _>>()?;
    let cfg = TrainConfig {
        custom_model: Some(ModelShape { n_layer: 12, n_head: 12, n_embd: 192, block_size: 256 }),
        batch_size: 8,
        seq_len: 256,
        sample_len: 0,
        optimizer_on,
        precision,
        recompute,
        ..TrainConfig::default()
    };
    // Pinned uploads, as on the discrete GPUs (lavapipe would pick zero-copy, which has no slabs).
    let make = |budget: Option<u64>| {
        let pager = PagerOptions { budget, upload: UploadPath::Pinned, gpu_pool: pool, ..PagerOptions::default() };
        pollster::block_on(Context::new(&ContextOptions { pager, ..Default::default() }))
    };
    let data = || {
        let mut rng = pagetrain::rng::Rng::new(1);
        let tokens = (0..400_000).map(|_| rng.below(VOCAB) as u32).collect();
        Dataset::from_tokens(tokens, VOCAB, "random tokens")
    };
    let whole = TrainConfig { recompute: false, ..cfg.clone() };
    let footprint = time_steps(&make, &whole, &data, None, 1, 1)?.footprint;
    println!("{precision:?} in {pool:?}, footprint {:.1} MB", footprint as f64 / 1e6);
    for p in percents {
        let t = time_steps(&make, &cfg, &data, Some(footprint * p / 100), 2, 2)?;
        let mb = |b: u64| b as f64 / 1e6;
        println!(
            "{p:>3} %: {:.1} MB up, {:.1} MB down, {:.1} MB moved in GPU memory, {:.1} buffers created, {:.1} ms in the pager a step",
            mb(t.bytes_up),
            mb(t.bytes_down),
            mb(t.bytes_moved_in_gpu),
            t.recording[4],
            t.access_s * 1e3
        );
    }
    Ok(())
}
