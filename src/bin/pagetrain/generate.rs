//! `pagetrain generate`: a checkpoint continues a prompt, streamed as it is drawn.

use std::path::PathBuf;

use clap::Args;
use pagetrain::pager::PagerOptions;
use pagetrain::train::{Sampling, Tokenizer};
use pagetrain::{Context, ContextOptions, Error, StoreKind};

use crate::train::{parse_budget, Budget, SamplingArgs};

#[derive(Args)]
pub(crate) struct GenerateArgs {
    /// A checkpoint directory (a run's --out, a `step-N` directory, or a Hugging Face GPT-2 one).
    pub(crate) checkpoint: PathBuf,
    /// Text the generation continues (empty: the vocabulary's start token).
    #[arg(long, default_value = "")]
    pub(crate) prompt: String,
    #[arg(long, default_value_t = 200)]
    pub(crate) max_tokens: usize,
    #[command(flatten)]
    pub(crate) sampling: SamplingArgs,
    #[arg(long, default_value_t = 1337)]
    pub(crate) seed: u64,
    /// How text becomes tokens: auto (the checkpoint's characters, or GPT-2's BPE for GPT-2's
    /// vocabulary), chars or gpt2.
    #[arg(long, default_value = "auto")]
    pub(crate) tokenizer: Tokenizer,
    /// Print one JSON line (prompt, text, tokens, tokens/s) instead of streaming the text.
    #[arg(long)]
    pub(crate) json: bool,
    /// GPU byte budget, e.g. 512MiB, or auto.
    #[arg(long, value_parser = parse_budget)]
    pub(crate) gpu_budget: Option<Budget>,
}

pub(crate) async fn generate(args: GenerateArgs) -> Result<(), Error> {
    use pagetrain::train::generate::{generate, load_model, start_token, TextStream};
    use std::io::Write;
    let sampling = args.sampling.apply(Sampling::default());
    sampling.validate()?;
    let pager = PagerOptions { budget: args.gpu_budget.and_then(|b| b.bytes), ..Default::default() };
    let ctx = Context::new(&ContextOptions { pager, store: StoreKind::Memory, ..Default::default() }).await?;
    let (model, vocab) = load_model(&ctx, &args.checkpoint, args.tokenizer)?;
    let mut prompt = vocab.encode(&args.prompt)?;
    if prompt.is_empty() {
        prompt.push(start_token(&vocab));
    }
    if !args.json {
        eprintln!("adapter: {}", ctx.gpu.describe());
        print!("{}", args.prompt);
    }
    let mut stream = TextStream::new(&vocab);
    let start = std::time::Instant::now();
    let json = args.json;
    let tokens = generate(&ctx, &model, &prompt, args.max_tokens, vocab.size(), sampling, args.seed, &mut |t| {
        let piece = stream.push(t);
        if !json {
            // A closed stdout (`| head`) ends the printing, not the generation.
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(piece.as_bytes()).and_then(|()| out.flush());
        }
        Ok(())
    })
    .await?;
    let secs = start.elapsed().as_secs_f64();
    if json {
        let text = vocab.decode(&tokens);
        let v = serde_json::json!({
            "prompt": args.prompt, "text": text, "tokens": tokens, "tokens_per_s": tokens.len() as f64 / secs,
        });
        println!("{v}");
    } else {
        println!("{}", stream.finish());
        eprintln!("{} tokens in {secs:.2} s ({:.1} tokens/s)", tokens.len(), tokens.len() as f64 / secs);
    }
    Ok(())
}
