//! `pagetrain train`: the run's flags over its run file, the progress bar, one process or one
//! rank of an MPI job.

use std::path::PathBuf;
use std::rc::Rc;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pagetrain::dist::Dist;
use pagetrain::nn::Module;
use pagetrain::pager::{GpuPool, PagerOptions};
use pagetrain::train::{
    parse_bytes, OptimizerOn, Precision, Reporter, RunFile, Sampling, StepReport, Tokenizer, TrainConfig, Trainer,
};
use pagetrain::{Context, ContextOptions, Error, StoreKind};

#[derive(Args, Default)]
pub(crate) struct TrainArgs {
    /// A TOML run file: keys named as these flags with underscores (`batch_size = 8`), plus
    /// n_layer/n_head/n_embd/block_size, min_lr, warmup_steps, weight_decay, grad_clip,
    /// eval_batches. Flags override it; each checkpoint holds the effective one as run.toml.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Model preset: tiny, small, gpt2-124m, gpt2-medium, gpt2-large, gpt2-xl.
    #[arg(long)]
    pub(crate) model: Option<String>,
    #[arg(long)]
    pub(crate) steps: Option<u64>,
    #[arg(long)]
    pub(crate) batch_size: Option<usize>,
    #[arg(long)]
    pub(crate) seq_len: Option<usize>,
    /// Peak learning rate.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) lr: Option<f32>,
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Training data: a text file (characters become tokens) or a `.bin` uint16 token file.
    #[arg(long)]
    pub(crate) data: Option<PathBuf>,
    /// A separate validation file (then all of --data trains); by default the last tenth of --data.
    #[arg(long)]
    pub(crate) val_data: Option<PathBuf>,
    /// Directory for the checkpoint.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Continue training from a checkpoint directory.
    #[arg(long)]
    pub(crate) resume: Option<PathBuf>,
    /// Start from the weights of a GPT-2-layout checkpoint directory (e.g. Hugging Face's).
    #[arg(long)]
    pub(crate) init_from: Option<PathBuf>,
    /// Micro-batches per optimizer step (gradient accumulation); the effective batch is
    /// --batch-size × --accum.
    #[arg(long)]
    pub(crate) accum: Option<usize>,
    /// Where AdamW runs: gpu (fused kernels over paged states), host (worker threads over
    /// host-resident states; ~8 instead of ~28 bytes per parameter on the bus), split (the
    /// embedding and the first layers on the GPU with their state kept there, the rest on the
    /// host), or auto.
    #[arg(long)]
    pub(crate) optimizer_on: Option<OptimizerOn>,
    /// With AdamW on the host: after STEPS steps, run each update during the whole next step,
    /// which reads the weights of the step before (ZeRO-Offload's delayed parameter update:
    /// the host pass and the wait for the norm leave the step's critical path; 40 is the
    /// paper's warm-up).
    #[arg(long, value_name = "STEPS")]
    pub(crate) delayed_update: Option<u64>,
    /// Keep only each block's input in forward and recompute the block in backward.
    #[arg(long)]
    pub(crate) recompute: bool,
    /// Never recompute unasked. By default a run that has to page times a few steps with and
    /// without recompute and keeps the faster.
    #[arg(long, conflicts_with = "recompute")]
    pub(crate) no_auto_recompute: bool,
    /// Freeze the Linear layers whose parameter names contain PATTERN (e.g. `mlp`, `h.0.`) as
    /// int8 weights with per-row scales, dequantized inside the matmul kernel.
    #[arg(long, value_name = "PATTERN")]
    pub(crate) freeze_int8: Option<String>,
    /// f32, or f16 (on adapters with shader-f16): f16 activations, activation gradients and
    /// Linear weight copies in the kernels, f32 master weights and optimizer state, dynamic loss
    /// scaling.
    #[arg(long)]
    pub(crate) precision: Option<Precision>,
    /// How text becomes tokens: chars, gpt2 (GPT-2's byte-level BPE), or auto (characters for
    /// text, GPT-2 for token files and GPT-2 checkpoints).
    #[arg(long)]
    pub(crate) tokenizer: Option<Tokenizer>,
    /// Write a checkpoint every N steps (and at the end).
    #[arg(long)]
    pub(crate) checkpoint_every: Option<u64>,
    /// Evaluate on the validation split every N steps.
    #[arg(long)]
    pub(crate) eval_every: Option<u64>,
    /// Tokens to sample at the end (0: none).
    #[arg(long)]
    pub(crate) sample_len: Option<usize>,
    /// Text the end-of-run sample continues (default: the vocabulary's start token).
    #[arg(long)]
    pub(crate) sample_prompt: Option<String>,
    #[command(flatten)]
    pub(crate) sampling: SamplingArgs,
    /// Print one JSON line with the results at the end.
    #[arg(long)]
    pub(crate) json: bool,
    /// GPU byte budget for tensors, e.g. 512MiB, 2GiB, or auto (the device-local memory less a
    /// margin, where the driver reports it; else 4 × the adapter's largest buffer).
    #[arg(long, value_parser = parse_budget)]
    pub(crate) gpu_budget: Option<Budget>,
    /// Where tensors live on the host: a directory of memory-mapped files (default: OUT/store),
    /// or `memory`. Each rank of an MPI run keeps its own in DIR/rank-R.
    #[arg(long)]
    pub(crate) store: Option<String>,
    /// Which of the best adapters to use (`pagetrain info` lists them); under mpirun, by
    /// default the rank's index among the ranks on its host.
    #[arg(long, value_name = "INDEX")]
    pub(crate) adapter: Option<usize>,
}

/// A GPU budget: bytes, or `auto` (None), and how it was written.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    pub(crate) bytes: Option<u64>,
    pub(crate) text: String,
}

pub(crate) fn parse_budget(s: &str) -> Result<Budget, String> {
    let bytes = if s.eq_ignore_ascii_case("auto") { None } else { Some(parse_bytes(s)?) };
    Ok(Budget { bytes, text: s.to_string() })
}

/// What a run is asked to do: defaults, then `--config`'s file, then the flags.
pub(crate) struct Run {
    pub(crate) cfg: TrainConfig,
    pub(crate) budget: Option<u64>,
    pub(crate) store: StoreKind,
    /// The effective configuration as a run file, written beside each checkpoint.
    pub(crate) file: RunFile,
}

impl TrainArgs {
    pub(crate) fn resolve(&self) -> Result<Run, Error> {
        let file = match &self.config {
            Some(path) => RunFile::load(path)?,
            None => RunFile::default(),
        };
        let mut c = file.apply(TrainConfig::default())?;
        macro_rules! flag {
            ($($key:ident),*) => { $( if let Some(v) = &self.$key { c.$key = v.clone(); } )* };
        }
        flag!(model, steps, batch_size, seq_len, lr, seed, out, eval_every, sample_len, accum);
        flag!(optimizer_on, precision, tokenizer, checkpoint_every);
        for (flag, field) in [
            (&self.data, &mut c.data),
            (&self.val_data, &mut c.val_data),
            (&self.resume, &mut c.resume),
            (&self.init_from, &mut c.init_from),
        ] {
            if flag.is_some() {
                field.clone_from(flag);
            }
        }
        if self.delayed_update.is_some() {
            c.delayed_update = self.delayed_update;
        }
        if self.freeze_int8.is_some() {
            c.freeze_int8.clone_from(&self.freeze_int8);
        }
        if self.sample_prompt.is_some() {
            c.sample_prompt.clone_from(&self.sample_prompt);
        }
        c.sampling = self.sampling.apply(c.sampling);
        c.recompute |= self.recompute;
        c.auto_recompute &= !self.no_auto_recompute;
        let budget_text = match (&self.gpu_budget, &file.gpu_budget) {
            (Some(b), _) => b.text.clone(),
            (None, Some(t)) => t.clone(),
            (None, None) => "auto".to_string(),
        };
        let budget = parse_budget(&budget_text).map_err(|msg| Error::Invalid { what: "gpu_budget", msg })?.bytes;
        let store_text = self.store.clone().or(file.store.clone());
        let store = match store_text.as_deref() {
            Some("memory") => StoreKind::Memory,
            Some(dir) => StoreKind::Mmap(PathBuf::from(dir)),
            None => StoreKind::Mmap(c.out.join("store")),
        };
        let file = RunFile::from_config(&c, Some(budget_text), store_text);
        Ok(Run { cfg: c, budget, store, file })
    }
}

/// Progress bar on stderr: step, loss, tokens/s.
struct Bar {
    pub(crate) bar: ProgressBar,
}

impl Bar {
    /// A line above the bar, or plainly on stderr when there is no terminal to draw the bar on.
    pub(crate) fn say(&self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

impl Reporter for Bar {
    fn on_start(&mut self, t: &Trainer) {
        let c = t.model.config;
        self.say(format!(
            "model: {} layers, {} heads, {} channels, block {}, vocab {} — {:.2}M parameters",
            c.n_layer,
            c.n_head,
            c.n_embd,
            c.block_size,
            c.vocab_size,
            c.num_params() as f64 / 1e6
        ));
        self.say(format!(
            "data: {} ({} tokens, {} train / {} val)",
            t.data.path.display(),
            t.data.len(),
            t.data.split_len(pagetrain::train::Split::Train),
            t.data.split_len(pagetrain::train::Split::Val)
        ));
        self.say(format!("optimizer on the {} ({})", t.opt.name(), t.optimizer_reason));
        self.say(format!("precision: {}", t.precision_note));
        if let Some(p) = &t.cfg.freeze_int8 {
            let frozen: usize = t.model.blocks.iter().map(|b| b.frozen()).sum();
            self.say(format!(
                "{frozen} Linear layers matching `{p}` frozen as int8; {} trainable parameters",
                t.model.num_params()
            ));
        }
        self.bar.set_position(t.step);
    }
    fn on_step(&mut self, r: &StepReport) {
        self.bar.set_position(r.step);
        self.bar.set_message(format!("loss {:.4} | lr {:.2e} | {:.0} tok/s", r.loss, r.lr, r.tokens_per_s));
    }
    fn on_eval(&mut self, step: u64, val: f32) {
        self.say(format!("step {step}: val loss {val:.4}"));
    }
    fn on_message(&mut self, msg: &str) {
        self.say(msg.to_string());
    }
}

/// This process's rank when `mpirun` started several (None: a single process).
fn join_ranks() -> Result<Option<Rc<Dist>>, Error> {
    #[cfg(feature = "mpi")]
    return pagetrain::dist::mpi::init();
    #[cfg(not(feature = "mpi"))]
    match pagetrain::dist::launcher_world_size() {
        Some(n) if n > 1 => Err(Error::Invalid {
            what: "launch",
            msg: format!("started as one of {n} MPI ranks, but this pagetrain was built without the `mpi` cargo feature (cargo build --release --features mpi)"),
        }),
        _ => Ok(None),
    }
}

/// Trains alone, or as one rank of an MPI job: an error on any rank stops every rank, naming it.
pub(crate) async fn train(args: TrainArgs) -> Result<(), Error> {
    let dist = join_ranks()?;
    let result = train_rank(args, dist.clone()).await;
    if let (Err(e), Some(d)) = (&result, &dist) {
        eprintln!("error on {}", d.describe_error(e));
        if let Some(hint) = e.hint() {
            eprintln!("HINT: {hint}");
        }
        d.comm.abort(1);
    }
    result
}

async fn train_rank(args: TrainArgs, dist: Option<Rc<Dist>>) -> Result<(), Error> {
    let Run { cfg, budget, mut store, file } = args.resolve()?;
    cfg.validate()?;
    let lead = dist.as_ref().is_none_or(|d| d.is_lead());
    // Before anything is trained: --out must be writable and no other run's (the ranks of one
    // run share it; rank 0 holds the lock).
    let _out = if lead { Some(pagetrain::lock::DirLock::acquire(&cfg.out, "output directory")?) } else { None };
    let mut device = pagetrain::device::DeviceOptions { adapter_index: args.adapter, ..Default::default() };
    if let Some(d) = &dist {
        if let StoreKind::Mmap(dir) = &store {
            store = StoreKind::Mmap(dir.join(format!("rank-{}", d.rank())));
        }
        device.adapter_index = device.adapter_index.or(Some(d.local_rank));
    }
    let gpu_pool = GpuPool::for_run(cfg.precision == Precision::F16, budget.is_some());
    let pager = PagerOptions { budget, gpu_pool, ..Default::default() };
    let ctx = Context::new(&ContextOptions { pager, store, device }).await?;
    let who = dist.as_ref().map_or(String::new(), |d| format!("rank {} of {}: ", d.rank(), d.size()));
    eprintln!(
        "{who}store: {}; GPU budget {} MiB ({}); uploads by {}; tensors in {}",
        ctx.pager.describe_store(),
        ctx.pager.budget() >> 20,
        ctx.pager.budget_source(),
        ctx.pager.upload_path(),
        ctx.pager.gpu_pool()
    );
    eprintln!("{who}adapter: {}", ctx.gpu.describe());
    let mut trainer = Trainer::with_dist(&ctx, cfg, None, dist.clone())?;
    trainer.run_file = Some(file.to_toml());
    if !lead {
        // Rank 0 alone reports; the others train, exchange and write their shards.
        trainer.run(&ctx, &mut pagetrain::train::Quiet).await?;
        return Ok(());
    }
    let bar = ProgressBar::new(trainer.cfg.steps);
    bar.set_style(
        ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg} ({elapsed} / ~{eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut reporter = Bar { bar };
    let summary = trainer.run(&ctx, &mut reporter).await?;
    reporter.bar.finish_and_clear();
    if summary.ranks > 1 {
        let c = summary.comm_per_step;
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        eprintln!(
            "ranks: {} × batch {} (global batch {}); per step each rank sent {:.1} MiB in {:.1} ms of exchange, {:.1} ms of it exposed; optimizer state per rank {:?} MiB",
            summary.ranks,
            trainer.effective_batch(),
            trainer.global_batch(),
            mib(c.bytes),
            c.seconds * 1e3,
            c.exposed_s * 1e3,
            summary.optimizer_state_bytes_per_rank.iter().map(|&b| (mib(b) * 10.0).round() / 10.0).collect::<Vec<_>>()
        );
    }
    eprintln!(
        "final: train loss {:.4}, val loss {:.4} (unigram baseline {:.4}), {:.0} tokens/s, {} steps, {} parameters",
        summary.final_train_loss,
        summary.final_val_loss,
        summary.baseline_loss,
        summary.tokens_per_s,
        summary.steps,
        summary.params
    );
    if let Some(s) = summary.first_step_s {
        eprintln!("first step finished {s:.2} s after start");
    }
    let per_step = |b: u64| b as f64 / summary.steps.max(1) as f64 / (1 << 20) as f64;
    eprintln!(
        "memory: footprint {:.1} MiB, GPU budget {:.1} MiB, GPU peak {:.1} MiB; per step {:.1} MiB up, {:.1} MiB back, {:.2} s stalled in all",
        summary.footprint_bytes as f64 / (1 << 20) as f64,
        summary.budget_bytes as f64 / (1 << 20) as f64,
        summary.peak_gpu_bytes as f64 / (1 << 20) as f64,
        per_step(summary.bytes_uploaded),
        per_step(summary.bytes_written_back),
        summary.stall_s
    );
    if summary.recompute {
        eprintln!(
            "recompute: {:.1} MiB of block activations per step not kept from forward to backward",
            summary.recompute_dropped_bytes_per_step as f64 / (1 << 20) as f64
        );
    }
    if let Some(why) = &summary.recompute_choice {
        eprintln!("recompute trial: {why}");
    }
    if let Some(why) = &summary.upload_choice {
        eprintln!("upload trial: {why}");
    }
    let c = ctx.pager.counters();
    eprintln!(
        "pager: {} hits, {} misses, {} evictions, {} prefetches, {} write-backs; {:.2} s filling staging",
        c.hits, c.misses, c.evictions, c.prefetches, c.writebacks, c.fill_s
    );
    let profile = ctx.kernels.profile();
    if let Some((how, lost)) = ctx.kernels.profile_method() {
        eprintln!("profile: GPU time per kernel entry, timed by {how}; {lost} dispatches' timestamps lost");
    }
    for (entry, n, secs) in profile {
        eprintln!(
            "profile: {entry:<28} {n:>7} dispatches {:>9.1} ms {:>8.3} ms each",
            secs * 1e3,
            secs * 1e3 / n as f64
        );
    }
    if !summary.sample.is_empty() {
        eprintln!("sample:\n{}\n", summary.sample);
    }
    if args.json {
        let mut v = serde_json::to_value(&summary).expect("serializable");
        if let Some(o) = v.as_object_mut() {
            o.remove("losses");
        }
        println!("{v}");
    }
    Ok(())
}

/// How tokens are drawn (generation, and the sample at the end of a run).
#[derive(Args, Default)]
pub(crate) struct SamplingArgs {
    /// Divides the logits; 0 takes the most likely token.
    #[arg(long)]
    pub(crate) temperature: Option<f32>,
    /// Draw only among the K most likely tokens (0: all).
    #[arg(long)]
    pub(crate) top_k: Option<usize>,
    /// Draw only among the most likely tokens holding P of the probability (1: all).
    #[arg(long)]
    pub(crate) top_p: Option<f32>,
}

impl SamplingArgs {
    pub(crate) fn apply(&self, base: Sampling) -> Sampling {
        Sampling {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
        }
    }
}
