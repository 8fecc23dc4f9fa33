//! `pagetrain prepare`: a text file encoded as an llm.c token file, with a progress bar.

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pagetrain::train::Tokenizer;
use pagetrain::Error;

#[derive(Args)]
pub(crate) struct PrepareArgs {
    /// A UTF-8 text file.
    pub(crate) input: PathBuf,
    /// The token file to write.
    #[arg(short, long)]
    pub(crate) output: PathBuf,
    /// Only gpt2 (GPT-2's byte-level BPE) is written to token files.
    #[arg(long, default_value = "gpt2")]
    pub(crate) tokenizer: Tokenizer,
}

pub(crate) fn prepare(args: PrepareArgs) -> Result<(), Error> {
    if args.tokenizer != Tokenizer::Gpt2 {
        return Err(Error::Invalid {
            what: "--tokenizer",
            msg: "token files are written with gpt2 (GPT-2's BPE)".into(),
        });
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {bytes}/{total_bytes} [{bar:30}] {bytes_per_sec} (~{eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let tokens = pagetrain::train::prepare::gpt2_token_file(&args.input, &args.output, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    eprintln!("{}: {tokens} GPT-2 tokens written to {}", args.input.display(), args.output.display());
    Ok(())
}
