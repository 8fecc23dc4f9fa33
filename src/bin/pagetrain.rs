//! The `pagetrain` command line: `train` (the default), `generate`, `info`, `bench`, `prepare`,
//! `studio`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use pagetrain::dist::Dist;
use pagetrain::kernels::matmul::Gemm;
use pagetrain::kernels::MatmulVariant;
use pagetrain::nn::Module;
use pagetrain::pager::PagerOptions;
use pagetrain::tensor::DType;
use pagetrain::train::{
    parse_bytes, OptimizerOn, Precision, Reporter, RunFile, Sampling, StepReport, Tokenizer, TrainConfig, Trainer,
};
use pagetrain::{Context, ContextOptions, Error, StoreKind};

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

#[cfg(feature = "studio")]
#[derive(Args)]
struct StudioArgs {
    #[command(flatten)]
    train: TrainArgs,
    /// Start the run when the window opens.
    #[arg(long)]
    start: bool,
    /// Headless mode for tests and docs: train in the real window, save a screenshot of it
    /// here after --exit-after-steps steps, and exit.
    #[arg(long, value_name = "FILE.png")]
    screenshot: Option<PathBuf>,
    #[arg(long, default_value_t = 5, value_name = "N")]
    exit_after_steps: u64,
    /// Repaint every frame (to measure the frame rate the UI sustains).
    #[arg(long)]
    continuous: bool,
}

#[derive(Args)]
struct GenerateArgs {
    /// A checkpoint directory (a run's --out, a `step-N` directory, or a Hugging Face GPT-2 one).
    checkpoint: PathBuf,
    /// Text the generation continues (empty: the vocabulary's start token).
    #[arg(long, default_value = "")]
    prompt: String,
    #[arg(long, default_value_t = 200)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// How text becomes tokens: auto (the checkpoint's characters, or GPT-2's BPE for GPT-2's
    /// vocabulary), chars or gpt2.
    #[arg(long, default_value = "auto")]
    tokenizer: Tokenizer,
    /// Print one JSON line (prompt, text, tokens, tokens/s) instead of streaming the text.
    #[arg(long)]
    json: bool,
    /// GPU byte budget, e.g. 512MiB, or auto.
    #[arg(long, value_parser = parse_budget)]
    gpu_budget: Option<Budget>,
}

/// How tokens are drawn (generation, and the sample at the end of a run).
#[derive(Args, Default)]
struct SamplingArgs {
    /// Divides the logits; 0 takes the most likely token.
    #[arg(long)]
    temperature: Option<f32>,
    /// Draw only among the K most likely tokens (0: all).
    #[arg(long)]
    top_k: Option<usize>,
    /// Draw only among the most likely tokens holding P of the probability (1: all).
    #[arg(long)]
    top_p: Option<f32>,
}

impl SamplingArgs {
    fn apply(&self, base: Sampling) -> Sampling {
        Sampling {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
        }
    }
}

#[derive(Args)]
struct PrepareArgs {
    /// A UTF-8 text file.
    input: PathBuf,
    /// The token file to write.
    #[arg(short, long)]
    output: PathBuf,
    /// Only gpt2 (GPT-2's byte-level BPE) is written to token files.
    #[arg(long, default_value = "gpt2")]
    tokenizer: Tokenizer,
}

#[derive(Args)]
struct BenchArgs {
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
    /// Size of each tensor moved.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    tensor_size: u64,
    /// Number of tensors moved per measurement.
    #[arg(long, default_value_t = 8)]
    tensors: usize,
    /// Measurements per figure (the best is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Host store: a directory for mmap files, or `memory`.
    #[arg(long, default_value = "memory")]
    store: String,
    /// Also time training steps resident and at 50/25/10 % budgets for this model preset.
    #[arg(long)]
    steps_model: Option<String>,
    /// Sequences per step for the step timing.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    #[arg(long, default_value_t = 64)]
    seq_len: usize,
    /// Timed steps per budget (after two warm-up steps).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Time the steps with activation recompute.
    #[arg(long)]
    recompute: bool,
    /// Where AdamW runs in the timed steps.
    #[arg(long, default_value = "gpu")]
    optimizer_on: OptimizerOn,
    /// Precision of the timed steps.
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Staging buffers for uploads and for write-backs (each --slot-size).
    #[arg(long)]
    upload_slots: Option<usize>,
    #[arg(long)]
    readback_slots: Option<usize>,
    #[arg(long, value_parser = parse_bytes)]
    slot_size: Option<u64>,
    /// Time the f32 matmul at 4096³ (NN, NT, TN): `auto` on GPUs, not on CPU adapters (minutes there).
    #[arg(long, default_value = "auto")]
    matmul: Toggle,
    /// Only time the resident step (no 50/25/10 % budgets).
    #[arg(long)]
    resident_only: bool,
    /// Also time the steps at this GPU budget in bytes, e.g. 2GiB (repeatable).
    #[arg(long, value_parser = parse_bytes)]
    budget: Vec<u64>,
    /// How the pager uploads in the timed steps (auto: the fastest measured).
    #[arg(long, default_value = "auto")]
    upload: Upload,
    /// Write back every dirty tensor the pager evicts, even those the plan knows are freed
    /// unread (the behaviour before the plan skipped them), for before/after figures.
    #[arg(long)]
    keep_dead_writebacks: bool,
    /// Also time one product, `MxNxK` with an optional layout `:nn|nt|tn|tt`, variant
    /// `:auto|tiled|direct|large|coop` and operand type `:f32|f16` (repeatable).
    #[arg(long, value_parser = parse_gemm)]
    gemm: Vec<(Gemm, Option<MatmulVariant>, DType)>,
}

/// `--upload`: the pager's upload path.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Upload {
    Auto,
    Ring,
    Pinned,
    ZeroCopy,
}

impl From<Upload> for pagetrain::pager::UploadPath {
    fn from(u: Upload) -> Self {
        use pagetrain::pager::UploadPath;
        match u {
            Upload::Auto => UploadPath::Auto,
            Upload::Ring => UploadPath::Ring,
            Upload::Pinned => UploadPath::Pinned,
            Upload::ZeroCopy => UploadPath::ZeroCopy,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Toggle {
    Auto,
    On,
    Off,
}

#[derive(Args, Default)]
struct TrainArgs {
    /// A TOML run file: keys named as these flags with underscores (`batch_size = 8`), plus
    /// n_layer/n_head/n_embd/block_size, min_lr, warmup_steps, weight_decay, grad_clip,
    /// eval_batches. Flags override it; each checkpoint holds the effective one as run.toml.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Model preset: tiny, small, gpt2-124m, gpt2-medium, gpt2-large, gpt2-xl.
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    steps: Option<u64>,
    #[arg(long)]
    batch_size: Option<usize>,
    #[arg(long)]
    seq_len: Option<usize>,
    /// Peak learning rate.
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    /// Training data: a text file (characters become tokens) or a `.bin` uint16 token file.
    #[arg(long)]
    data: Option<PathBuf>,
    /// A separate validation file (then all of --data trains); by default the last tenth of --data.
    #[arg(long)]
    val_data: Option<PathBuf>,
    /// Directory for the checkpoint.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue training from a checkpoint directory.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Start from the weights of a GPT-2-layout checkpoint directory (e.g. Hugging Face's).
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Micro-batches per optimizer step (gradient accumulation); the effective batch is
    /// --batch-size × --accum.
    #[arg(long)]
    accum: Option<usize>,
    /// Where AdamW runs: gpu (fused kernels over paged states), host (worker threads over
    /// host-resident states; ~8 instead of ~28 bytes per parameter on the bus), or auto.
    #[arg(long)]
    optimizer_on: Option<OptimizerOn>,
    /// Keep only each block's input in forward and recompute the block in backward.
    #[arg(long)]
    recompute: bool,
    /// Freeze the Linear layers whose parameter names contain PATTERN (e.g. `mlp`, `h.0.`) as
    /// int8 weights with per-row scales, dequantized inside the matmul kernel.
    #[arg(long, value_name = "PATTERN")]
    freeze_int8: Option<String>,
    /// f32, or f16 (on adapters with shader-f16): f16 activations, activation gradients and
    /// Linear weight copies in the kernels, f32 master weights and optimizer state, dynamic loss
    /// scaling.
    #[arg(long)]
    precision: Option<Precision>,
    /// How text becomes tokens: chars, gpt2 (GPT-2's byte-level BPE), or auto (characters for
    /// text, GPT-2 for token files and GPT-2 checkpoints).
    #[arg(long)]
    tokenizer: Option<Tokenizer>,
    /// Write a checkpoint every N steps (and at the end).
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Evaluate on the validation split every N steps.
    #[arg(long)]
    eval_every: Option<u64>,
    /// Tokens to sample at the end (0: none).
    #[arg(long)]
    sample_len: Option<usize>,
    /// Text the end-of-run sample continues (default: the vocabulary's start token).
    #[arg(long)]
    sample_prompt: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Print one JSON line with the results at the end.
    #[arg(long)]
    json: bool,
    /// GPU byte budget for tensors, e.g. 512MiB, 2GiB, or auto (the device-local memory less a
    /// margin, where the driver reports it; else 4 × the adapter's largest buffer).
    #[arg(long, value_parser = parse_budget)]
    gpu_budget: Option<Budget>,
    /// Where tensors live on the host: a directory of memory-mapped files (default: OUT/store),
    /// or `memory`. Each rank of an MPI run keeps its own in DIR/rank-R.
    #[arg(long)]
    store: Option<String>,
    /// Which of the best adapters to use (`pagetrain info` lists them); under mpirun, by
    /// default the rank's index among the ranks on its host.
    #[arg(long, value_name = "INDEX")]
    adapter: Option<usize>,
}

/// A GPU budget: bytes, or `auto` (None), and how it was written.
#[derive(Clone, Debug)]
struct Budget {
    bytes: Option<u64>,
    text: String,
}

fn parse_budget(s: &str) -> Result<Budget, String> {
    let bytes = if s.eq_ignore_ascii_case("auto") { None } else { Some(parse_bytes(s)?) };
    Ok(Budget { bytes, text: s.to_string() })
}

/// What a run is asked to do: defaults, then `--config`'s file, then the flags.
struct Run {
    cfg: TrainConfig,
    budget: Option<u64>,
    store: StoreKind,
    /// The effective configuration as a run file, written beside each checkpoint.
    file: RunFile,
}

impl TrainArgs {
    fn resolve(&self) -> Result<Run, Error> {
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
        if self.freeze_int8.is_some() {
            c.freeze_int8.clone_from(&self.freeze_int8);
        }
        if self.sample_prompt.is_some() {
            c.sample_prompt.clone_from(&self.sample_prompt);
        }
        c.sampling = self.sampling.apply(c.sampling);
        c.recompute |= self.recompute;
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
    bar: ProgressBar,
}

impl Bar {
    /// A line above the bar, or plainly on stderr when there is no terminal to draw the bar on.
    fn say(&self, line: String) {
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
async fn train(args: TrainArgs) -> Result<(), Error> {
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
    let pager = PagerOptions { budget, ..Default::default() };
    let ctx = Context::new(&ContextOptions { pager, store, device }).await?;
    let who = dist.as_ref().map_or(String::new(), |d| format!("rank {} of {}: ", d.rank(), d.size()));
    eprintln!(
        "{who}store: {}; GPU budget {} MiB ({}); uploads by {}",
        ctx.pager.describe_store(),
        ctx.pager.budget() >> 20,
        ctx.pager.budget_source(),
        ctx.pager.upload_path()
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
    let c = ctx.pager.counters();
    eprintln!(
        "pager: {} hits, {} misses, {} evictions, {} prefetches, {} write-backs; {:.2} s filling staging",
        c.hits, c.misses, c.evictions, c.prefetches, c.writebacks, c.fill_s
    );
    for (entry, n, secs) in ctx.kernels.profile() {
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

/// `MxNxK[:nn|nt|tn|tt[:auto|tiled|direct|large|coop[:f32|f16]]]` → a product (letters: A, B
/// transposed or not), the variant to time it with (default: the one picked) and the operands'
/// element type (default f32).
fn parse_gemm(s: &str) -> Result<(Gemm, Option<MatmulVariant>, DType), String> {
    let want = || format!("{s}: want MxNxK[:nn|nt|tn|tt[:auto|tiled|direct|large|coop[:f32|f16]]]");
    let mut parts = s.split(':');
    let dims = parts.next().unwrap_or_default();
    let layout = parts.next().unwrap_or("nn");
    let variant = match parts.next() {
        None | Some("auto") => None,
        Some("tiled") => Some(MatmulVariant::Tiled),
        Some("direct") => Some(MatmulVariant::Direct),
        Some("large") => Some(MatmulVariant::Large),
        Some("coop") => Some(MatmulVariant::Coop),
        Some(_) => return Err(want()),
    };
    let dtype = match parts.next() {
        None | Some("f32") => DType::F32,
        Some("f16") => DType::F16,
        Some(_) => return Err(want()),
    };
    let d: Vec<usize> = dims.split('x').map(|v| v.parse().ok()).collect::<Option<_>>().ok_or_else(want)?;
    let (&[m, n, k], &[ta, tb]) = (d.as_slice(), layout.as_bytes()) else { return Err(want()) };
    Ok((Gemm { trans_a: ta == b't', trans_b: tb == b't', ..Gemm::new(m, n, k) }, variant, dtype))
}

async fn bench(args: BenchArgs) -> Result<(), Error> {
    let store = if args.store == "memory" { StoreKind::Memory } else { StoreKind::Mmap(PathBuf::from(&args.store)) };
    let ctx = Context::new(&ContextOptions { store, ..Default::default() }).await?;
    let r = pagetrain::bench::transfers(&ctx, args.tensors, args.tensor_size as usize, args.repeats)?;
    let on_cpu = ctx.gpu.info.device_type == wgpu::DeviceType::Cpu;
    let mm = match args.matmul {
        Toggle::On => true,
        Toggle::Off => false,
        Toggle::Auto => !on_cpu,
    };
    let mm = if mm { Some(pagetrain::bench::kernels::matmuls(&ctx, 20, args.repeats)?) } else { None };
    for &(g, forced, dtype) in &args.gemm {
        let variant = forced.unwrap_or_else(|| pagetrain::bench::kernels::picked(&ctx, &g, dtype));
        let tflops = pagetrain::bench::kernels::time_matmul(&ctx, g, Some(variant), dtype, 10, args.repeats)?;
        let layout = format!("{}{}", if g.trans_a { 't' } else { 'n' }, if g.trans_b { 't' } else { 'n' });
        eprintln!("gemm {}x{}x{}:{layout} {dtype:?}: {tflops:.1} TFLOP/s ({variant:?})", g.m, g.n, g.k);
    }
    drop(ctx);
    let steps = match &args.steps_model {
        Some(model) => {
            let cfg = TrainConfig {
                model: model.clone(),
                batch_size: args.batch_size,
                seq_len: args.seq_len,
                sample_len: 0,
                recompute: args.recompute,
                optimizer_on: args.optimizer_on,
                precision: args.precision,
                ..TrainConfig::default()
            };
            let make = |budget: Option<u64>| {
                let d = PagerOptions::default();
                let pager = PagerOptions {
                    budget,
                    upload_slots: args.upload_slots.unwrap_or(d.upload_slots),
                    readback_slots: args.readback_slots.unwrap_or(d.readback_slots),
                    slot_bytes: args.slot_size.unwrap_or(d.slot_bytes),
                    upload: args.upload.into(),
                    drop_dead_writebacks: !args.keep_dead_writebacks,
                    ..d
                };
                pollster::block_on(Context::new(&ContextOptions { pager, ..Default::default() }))
            };
            let data = || -> Result<pagetrain::train::Dataset, Error> {
                if model.starts_with("gpt2") {
                    let mut rng = pagetrain::rng::Rng::new(1);
                    let tokens = (0..4_000_000).map(|_| rng.below(50257) as u32).collect();
                    pagetrain::train::Dataset::from_tokens(tokens, 50257, "random GPT-2 tokens")
                } else {
                    pagetrain::train::Dataset::from_text(pagetrain::train::corpus::DEMO, "demo corpus", None)
                }
            };
            let budgets: &[u64] = if args.resident_only { &[] } else { &[50, 25, 10] };
            Some(pagetrain::bench::step_times(
                &make,
                &cfg,
                &data,
                r.upload_chosen_gbps,
                pagetrain::bench::Budgets { percent: budgets, bytes: &args.budget },
                2,
                args.steps,
            )?)
        }
        None => None,
    };
    if args.json {
        let mut v = serde_json::to_value(&r).expect("serializable");
        let parts =
            [serde_json::to_value(&mm).expect("serializable"), serde_json::to_value(&steps).expect("serializable")];
        for part in parts {
            if let (serde_json::Value::Object(m), Some(o)) = (part, v.as_object_mut()) {
                o.extend(m);
            }
        }
        println!("{v}");
    } else {
        println!("adapter: {}", r.adapter);
        println!("{} tensors of {} MiB, best of {}", r.tensors, r.tensor_bytes >> 20, args.repeats);
        println!("  upload, staging ring:        {:8.2} GB/s", r.upload_ring_gbps);
        match r.upload_pinned_gbps {
            Some(p) => println!("  upload, pinned host memory:  {p:8.2} GB/s  (DMA)"),
            None => println!("  upload, pinned host memory:  not offered (Vulkan only)"),
        }
        if let Some(z) = r.upload_zero_copy_gbps {
            println!("  upload, zero-copy:           {z:8.2} GB/s");
        }
        println!(
            "  upload, queue.write_buffer:  {:8.2} GB/s  (ring is {:.2}x)",
            r.upload_write_buffer_gbps, r.upload_ring_vs_write_buffer
        );
        println!("  write-back, readback ring:   {:8.2} GB/s", r.writeback_gbps);
        println!("  the pager uploads by: {}", r.upload_path);
        if let Some(m) = &mm {
            println!(
                "matmul f32 4096³: {:.1} TFLOP/s (A·B), {:.1} (A·Bᵀ), {:.1} (Aᵀ·B)",
                m.matmul_f32_4096_tflops, m.matmul_f32_4096_nt_tflops, m.matmul_f32_4096_tn_tflops
            );
            if let (Some(nn), Some(nt), Some(tn)) =
                (m.matmul_f16_4096_tflops, m.matmul_f16_4096_nt_tflops, m.matmul_f16_4096_tn_tflops)
            {
                let kernel = m.matmul_f16_kernel.as_deref().unwrap_or("?");
                println!("matmul f16 4096³: {nn:.1} TFLOP/s (A·B), {nt:.1} (A·Bᵀ), {tn:.1} (Aᵀ·B) ({kernel})");
            }
        }
        if let Some(s) = &steps {
            let ms = |v: Option<f64>| v.map_or("does not fit".to_string(), |v| format!("{v:9.1} ms"));
            let mib = |v: Option<u64>, up: Option<u64>| match (v, up) {
                (Some(v), Some(up)) => {
                    format!("({} MiB moved per step: {} up, {} back)", v >> 20, up >> 20, (v - up) >> 20)
                }
                _ => String::new(),
            };
            println!(
                "training step, {} ({} tokens, footprint {} MiB):",
                s.model,
                s.tokens_per_step,
                s.footprint_bytes >> 20
            );
            println!("  resident:    {:9.1} ms  ({:.0} tokens/s)", s.step_ms_resident, s.resident_tokens_per_s);
            println!(
                "  50% budget:  {}  {}",
                ms(s.step_ms_budget50),
                mib(s.bytes_per_step_budget50, s.bytes_up_per_step_budget50)
            );
            println!(
                "  25% budget:  {}  {}",
                ms(s.step_ms_budget25),
                mib(s.bytes_per_step_budget25, s.bytes_up_per_step_budget25)
            );
            if let (Some(h), Some(r)) = (s.hidden_fraction_budget25, s.budget25_vs_resident) {
                println!("               {:.0}% of transfer time hidden; {:.2}x resident throughput", h * 100.0, r);
            }
            println!(
                "  10% budget:  {}  {}",
                ms(s.step_ms_budget10),
                mib(s.bytes_per_step_budget10, s.bytes_up_per_step_budget10)
            );
            if let Some(u) = s.bytes_unread_writeback_per_step_budget25 {
                println!("  at 25%: {} MiB a step written back and freed unread", u >> 20);
            }
            for b in &s.at_budgets {
                println!(
                    "  {} MiB budget: {}  {}{}",
                    b.budget_bytes >> 20,
                    ms(b.step_ms),
                    mib(b.bytes_up_per_step.zip(b.bytes_down_per_step).map(|(u, d)| u + d), b.bytes_up_per_step),
                    b.vs_resident.map_or(String::new(), |r| format!(" {r:.2}x resident"))
                );
            }
            println!("  paged runs uploaded by: {}", s.upload_path);
            if !s.host_optimizer_at.is_empty() {
                println!(
                    "  (AdamW on the host at {:?} % budgets: the GPU update's tensors do not fit)",
                    s.host_optimizer_at
                );
            }
        }
    }
    Ok(())
}

async fn generate(args: GenerateArgs) -> Result<(), Error> {
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
    let rest = stream.finish();
    let text = vocab.decode(&tokens);
    if json {
        let v = serde_json::json!({
            "prompt": args.prompt, "text": text, "tokens": tokens, "tokens_per_s": tokens.len() as f64 / secs,
        });
        println!("{v}");
    } else {
        println!("{rest}");
        eprintln!("{} tokens in {secs:.2} s ({:.1} tokens/s)", tokens.len(), tokens.len() as f64 / secs);
    }
    Ok(())
}

fn prepare(args: PrepareArgs) -> Result<(), Error> {
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

#[cfg(feature = "studio")]
fn studio(args: StudioArgs) -> Result<(), Error> {
    use pagetrain::studio::{native, RunSetup};
    let mut train_args = args.train;
    if train_args.out.is_none() && train_args.config.is_none() {
        train_args.out = Some(PathBuf::from("runs/studio"));
    }
    let Run { cfg, budget, store, .. } = train_args.resolve()?;
    let setup = RunSetup { store, budget, device: Default::default(), train: cfg };
    let opts = native::Options {
        setup,
        start: args.start,
        screenshot: args.screenshot,
        exit_after_steps: args.exit_after_steps,
        continuous: args.continuous,
    };
    let headless = opts.screenshot.is_some();
    let r = native::run(opts).map_err(|msg| Error::Invalid { what: "studio", msg })?;
    if headless {
        eprintln!(
            "studio: {} steps at {:.0} tokens/s; {} frames, {} fps, UI {:.1} ms a frame (slowest {:.1} ms); screenshot {}",
            r.steps,
            r.tokens_per_s,
            r.frames,
            r.fps.map_or("-".to_string(), |f| format!("{f:.0}")),
            r.mean_ui_ms,
            r.slowest_ui_ms,
            r.screenshot.as_ref().map_or("none".to_string(), |p| p.display().to_string())
        );
    }
    Ok(())
}

async fn info() -> Result<(), Error> {
    let adapters = pagetrain::device::list_adapters().await;
    println!("adapters wgpu sees:");
    for a in &adapters {
        println!(
            "  {} ({:?}, {:?}) driver: {}{}",
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            if a.compute { "" } else { "  [no compute: unusable]" }
        );
    }
    let gpu = pagetrain::device::Gpu::new(&Default::default()).await?;
    let l = &gpu.limits;
    println!("chosen: {}", gpu.describe());
    println!("  max buffer size:            {} bytes", l.max_buffer_size);
    println!("  max storage binding:        {} bytes", l.max_storage_buffer_binding_size);
    println!("  max storage buffers/stage:  {}", l.max_storage_buffers_per_shader_stage);
    println!("  max workgroup storage:      {} bytes", l.max_compute_workgroup_storage_size);
    println!("  max invocations/workgroup:  {}", l.max_compute_invocations_per_workgroup);
    println!("  max workgroups/dimension:   {}", l.max_compute_workgroups_per_dimension);
    println!("  storage offset alignment:   {}", l.min_storage_buffer_offset_alignment);
    let f = gpu.features;
    println!(
        "  features: shader-f16 {}, subgroups {}, timestamp queries {}",
        f.contains(wgpu::Features::SHADER_F16),
        f.contains(wgpu::Features::SUBGROUP),
        f.contains(wgpu::Features::TIMESTAMP_QUERY)
    );
    println!(
        "  shader runtime checks: {}",
        if gpu.shader_checks { "on" } else { "off (PAGETRAIN_SHADER_CHECKS=1 turns them on)" }
    );
    Ok(())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        None => pollster::block_on(train(TrainArgs::default())),
        Some(Command::Train(args)) => pollster::block_on(train(args)),
        Some(Command::Generate(args)) => pollster::block_on(generate(args)),
        Some(Command::Info) => pollster::block_on(info()),
        Some(Command::Bench(args)) => pollster::block_on(bench(args)),
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
