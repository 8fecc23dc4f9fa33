//! The `pagetrain` command line: `train` (the default), `generate`, `info`, `bench`, `tune`, `prepare`,
//! `merge-shards`, `studio`. One file per command.

mod bench;
mod generate;
mod info;
mod prepare;
#[cfg(feature = "studio")]
mod studio;
mod train;
mod tune;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use bench::{bench, BenchArgs};
use generate::{generate, GenerateArgs};
use info::info;
use prepare::{prepare, PrepareArgs};
#[cfg(feature = "studio")]
use studio::{studio, StudioArgs};
use train::{train, TrainArgs};
use tune::{tune, TuneArgs};

#[derive(Parser)]
#[command(name = "pagetrain", version, about = "Train neural networks on any GPU through wgpu")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a GPT (the default when no subcommand is given).
    Train(TrainArgs),
    /// Generate text from a checkpoint (a key/value cache: each new token costs one position).
    Generate(GenerateArgs),
    /// List the GPU adapters wgpu sees, the one pagetrain picks, its limits and features.
    Info,
    /// Measure transfers: upload through the staging ring vs queue.write_buffer, write-back.
    Bench(BenchArgs),
    /// Time the kernel families this adapter can run (matmul, attention) and keep the fastest
    /// for every later run on it (a small file beside the pipeline cache).
    Tune(TuneArgs),
    /// Encode a text file as a token file (llm.c's format: a 1 KiB header, uint16 ids).
    Prepare(PrepareArgs),
    /// Merge the optimizer shards of a data-parallel checkpoint (`mpirun -n N pagetrain train`)
    /// into the usual optimizer.safetensors beside its model.safetensors.
    MergeShards {
        /// A checkpoint directory (or a run's --out: its latest checkpoint).
        dir: PathBuf,
    },
    /// Open the studio: set up, watch and steer a run in a window (where every tensor is, the
    /// bus, stalls, the loss), and sample from the model.
    #[cfg(feature = "studio")]
    Studio(StudioArgs),
}

fn main() -> ExitCode {
    pagetrain::clock::mark_process_start();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        None => pollster::block_on(train(TrainArgs::default())),
        Some(Command::Train(args)) => pollster::block_on(train(args)),
        Some(Command::Generate(args)) => pollster::block_on(generate(args)),
        Some(Command::Info) => pollster::block_on(info()),
        Some(Command::Bench(args)) => pollster::block_on(bench(args)),
        Some(Command::Tune(args)) => pollster::block_on(tune(args)),
        Some(Command::Prepare(args)) => prepare(args),
        Some(Command::MergeShards { dir }) => pagetrain::dist::shard_files::merge(&dir).map(|path| {
            eprintln!("optimizer shards merged into {}", path.display());
        }),
        #[cfg(feature = "studio")]
        Some(Command::Studio(args)) => studio(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(hint) = e.hint() {
                eprintln!("HINT: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}
