//! Trains a GPT whose tensors take about eight times the GPU budget (32 MiB on 4 MiB), with the
//! library API: the pager keeps every tensor in memory-mapped files and the GPU as a cache, and
//! the step computes what a fully resident one does (tests/memory.rs checks the losses match).
//! Run: `cargo run --release --example paged_gpt`
use pagetrain::nn::{Gpt, GptConfig, Module};
use pagetrain::optim::{AdamW, AdamWConfig};
use pagetrain::pager::PagerOptions;
use pagetrain::train::{corpus, Dataset, Split};
use pagetrain::{Context, ContextOptions, StoreKind};

fn main() -> pagetrain::Result<()> {
    let data = Dataset::from_text(corpus::DEMO, "demo corpus", None)?;
    let config = GptConfig { n_layer: 4, n_head: 4, n_embd: 128, block_size: 64, vocab_size: data.vocab.size() };
    let (b, t) = (8, 64);
    // A 4 MiB budget: several times smaller than what parameters, gradients, moments and one
    // step's activations need (the run prints both).
    let budget = 4 << 20;
    let store = StoreKind::Mmap(std::env::temp_dir().join("pagetrain-paged-gpt"));
    let ctx = pollster::block_on(Context::new(&ContextOptions {
        pager: PagerOptions { budget: Some(budget), ..Default::default() },
        store,
        ..Default::default()
    }))?;
    let model = Gpt::new(&ctx, config, 1)?;
    let mut opt = AdamW::new(&ctx, &model, AdamWConfig { lr: 3e-3, ..Default::default() })?;
    let mut rng = pagetrain::rng::Rng::new(7);
    for step in 0..30 {
        ctx.pager.begin_step(); // the last step's accesses predict this one's (Belady eviction)
        let (x, y) = data.batch(Split::Train, &mut rng, b, t)?;
        let tokens = ctx.from_u32("tokens", &[b, t], &x)?;
        let loss = model.loss(&ctx, &tokens, &y)?;
        let mut grads = model.grads();
        ctx.backward(&loss, &mut grads, 1.0)?;
        opt.step(&ctx, &model)?;
        model.zero_grad(&ctx)?;
        if step % 10 == 9 {
            println!("step {:2}: loss {:.3}", step + 1, pollster::block_on(ctx.to_f32(&loss))?[0]);
        }
    }
    let (_, footprint) = ctx.pager.live_bytes();
    let c = ctx.pager.counters();
    println!(
        "footprint {:.1} MiB on a {:.1} MiB GPU budget (peak {:.1} MiB); {:.0} MiB uploaded, {:.0} MiB written back, {} evictions",
        footprint as f64 / 1048576.0,
        budget as f64 / 1048576.0,
        ctx.pager.stats().peak_bytes as f64 / 1048576.0,
        c.bytes_uploaded as f64 / 1048576.0,
        c.bytes_written_back as f64 / 1048576.0,
        c.evictions
    );
    Ok(())
}
