//! Writes the logits pagetrain computes for a checkpoint, for comparison with Hugging Face
//! transformers (`tests/hf_compat.py` loads the same directory into `GPT2LMHeadModel`).
//! Run: `cargo run --release --example hf_logits -- runs/default/latest`, then
//! `python3 tests/hf_compat.py runs/default/latest`.
use pagetrain::nn::{Gpt, Module};
use pagetrain::train::checkpoint;
use pagetrain::{Context, ContextOptions};

fn main() -> pagetrain::Result<()> {
    let arg = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "runs/default".into()));
    let dir = checkpoint::resolve(&arg);
    let ctx = pollster::block_on(Context::new(&ContextOptions::default()))?;
    let ck = checkpoint::load(&dir)?;
    let model = Gpt::new(&ctx, ck.config, 0)?;
    checkpoint::load_weights(&ctx, &model, &ck.weights)?;
    let (b, t) = (2, ck.config.block_size.min(32));
    let tokens: Vec<u32> = (0..b * t).map(|i| ((i * 7 + 3) % ck.config.vocab_size) as u32).collect();
    let x = ctx.from_u32("tokens", &[b, t], &tokens)?;
    let logits = ctx.no_grad(|| model.forward(&ctx, &x))?;
    let values = pollster::block_on(ctx.to_f32(&logits))?;
    let out = serde_json::json!({ "shape": [b, t, ck.config.vocab_size], "tokens": tokens, "logits": values });
    std::fs::write(dir.join("pagetrain_logits.json"), out.to_string())
        .map_err(|e| pagetrain::Error::Io { path: dir.clone(), source: e })?;
    println!(
        "wrote {} logits for {} parameters to {}",
        values.len(),
        model.num_params(),
        dir.join("pagetrain_logits.json").display()
    );
    Ok(())
}
