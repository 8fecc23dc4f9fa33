//! `pagetrain bench`: transfers, products and training steps measured.

use std::path::PathBuf;

use clap::Args;
use pagetrain::kernels::matmul::Gemm;
use pagetrain::kernels::MatmulVariant;
use pagetrain::pager::{GpuPool, PagerOptions};
use pagetrain::tensor::DType;
use pagetrain::train::{parse_bytes, OptimizerOn, Precision, TrainConfig};
use pagetrain::{Context, ContextOptions, Error, StoreKind};

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Print one JSON line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Size of each tensor moved.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    pub(crate) tensor_size: u64,
    /// Number of tensors moved per measurement.
    #[arg(long, default_value_t = 8)]
    pub(crate) tensors: usize,
    /// Measurements per figure (the best is reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Host store: a directory for mmap files, or `memory`.
    #[arg(long, default_value = "memory")]
    pub(crate) store: String,
    /// Also time training steps resident and at 50/25/10 % budgets for this model preset.
    #[arg(long)]
    pub(crate) steps_model: Option<String>,
    /// Sequences per step for the step timing.
    #[arg(long, default_value_t = 16)]
    pub(crate) batch_size: usize,
    #[arg(long, default_value_t = 64)]
    pub(crate) seq_len: usize,
    /// Timed steps per budget (after `--warmup-steps`).
    #[arg(long, default_value_t = 3)]
    pub(crate) steps: usize,
    /// Untimed steps before them. A GPU that idled while pipelines compiled raises its clocks
    /// over the first steps (H100: a paged f16 GPT-2 step's kernels took 135, 87, then 72 ms):
    /// more warm-up steps time the steady state.
    #[arg(long, default_value_t = 2)]
    pub(crate) warmup_steps: usize,
    /// Time the steps with activation recompute.
    #[arg(long)]
    pub(crate) recompute: bool,
    /// Never recompute unasked (`train --no-auto-recompute`). By default a paged run first
    /// times steps with and without recompute, as `train` does, and the warm-up lasts until it
    /// has chosen.
    #[arg(long, conflicts_with = "recompute")]
    pub(crate) no_auto_recompute: bool,
    /// Where AdamW runs in the timed steps; `auto` chooses as `train` does, for the resident
    /// steps and for each budget.
    #[arg(long, default_value = "auto")]
    pub(crate) optimizer_on: OptimizerOn,
    /// Delay host AdamW's updates by one step after STEPS steps (`train --delayed-update`).
    #[arg(long, value_name = "STEPS")]
    pub(crate) delayed_update: Option<u64>,
    /// Global gradient-norm clip of the timed steps (`grad_clip` in a train config; ≤ 0: none). The
    /// first steps of a run from scratch clip at 1.0, later ones mostly do not: the host
    /// optimizer's bets on unclipped steps (`optim::speculative_update`) pay only on those.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) grad_clip: f32,
    /// Precision of the timed steps.
    #[arg(long, default_value = "f32")]
    pub(crate) precision: Precision,
    /// Staging buffers for uploads and for write-backs (each --slot-size).
    #[arg(long)]
    pub(crate) upload_slots: Option<usize>,
    #[arg(long)]
    pub(crate) readback_slots: Option<usize>,
    #[arg(long, value_parser = parse_bytes)]
    pub(crate) slot_size: Option<u64>,
    /// Time the f32 matmul at 4096³ (NN, NT, TN): `auto` on GPUs, not on CPU adapters (minutes there).
    #[arg(long, default_value = "auto")]
    pub(crate) matmul: Toggle,
    /// Only time the resident step (no 50/25/10 % budgets).
    #[arg(long)]
    pub(crate) resident_only: bool,
    /// Time the steps at only these of the 50/25/10 % budgets (repeatable; default all three).
    #[arg(long)]
    pub(crate) percent: Vec<u64>,
    /// Also time the steps at this GPU budget in bytes, e.g. 2GiB (repeatable).
    #[arg(long, value_parser = parse_bytes)]
    pub(crate) budget: Vec<u64>,
    /// How the pager uploads in the timed steps (auto: the fastest measured).
    #[arg(long, default_value = "auto")]
    pub(crate) upload: Upload,
    /// How the pool gives tensors GPU memory in the timed steps: a buffer each, or ranges of
    /// shared slabs (default: `PAGETRAIN_GPU_POOL`, else slabs for f16 steps at a budget and
    /// buffers otherwise, as `train` chooses).
    #[arg(long)]
    pub(crate) gpu_pool: Option<Pool>,
    /// Write back every dirty tensor the pager evicts, even those the plan knows are freed
    /// unread (the behaviour before the plan skipped them), for before/after figures.
    #[arg(long)]
    pub(crate) keep_dead_writebacks: bool,
    /// Also time one product, `MxNxK` with an optional layout `:nn|nt|tn|tt`, variant
    /// `:auto|tiled|direct|large|coop` and operand type `:f32|f16` (repeatable).
    #[arg(long, value_parser = parse_gemm)]
    pub(crate) gemm: Vec<(Gemm, Option<MatmulVariant>, DType)>,
}

/// `--upload`: the pager's upload path.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Upload {
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

/// `--gpu-pool`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Pool {
    Buffers,
    Slabs,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Toggle {
    Auto,
    On,
    Off,
}

/// `MxNxK[:nn|nt|tn|tt[:auto|tiled|direct|large|narrow|coop[:f32|f16]]]` → a product (letters: A, B
/// transposed or not), the variant to time it with (default: the one picked) and the operands'
/// element type (default f32).
fn parse_gemm(s: &str) -> Result<(Gemm, Option<MatmulVariant>, DType), String> {
    let want = || format!("{s}: want MxNxK[:nn|nt|tn|tt[:auto|tiled|direct|large|narrow|coop[:f32|f16]]]");
    let mut parts = s.split(':');
    let dims = parts.next().unwrap_or_default();
    let layout = parts.next().unwrap_or("nn");
    let variant = match parts.next() {
        None | Some("auto") => None,
        Some("tiled") => Some(MatmulVariant::Tiled),
        Some("direct") => Some(MatmulVariant::Direct),
        Some("large") => Some(MatmulVariant::Large),
        Some("narrow") => Some(MatmulVariant::Narrow),
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

pub(crate) async fn bench(args: BenchArgs) -> Result<(), Error> {
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
        let rate = if tflops < 1.0 { format!("{:.2} GFLOP/s", tflops * 1e3) } else { format!("{tflops:.1} TFLOP/s") };
        eprintln!("gemm {}x{}x{}:{layout} {dtype:?}: {rate} ({variant:?})", g.m, g.n, g.k);
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
                auto_recompute: !args.no_auto_recompute,
                optimizer_on: args.optimizer_on,
                delayed_update: args.delayed_update,
                precision: args.precision,
                grad_clip: args.grad_clip,
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
                    gpu_pool: match args.gpu_pool {
                        None => GpuPool::for_run(args.precision == Precision::F16, budget.is_some()),
                        Some(Pool::Buffers) => GpuPool::Buffers,
                        Some(Pool::Slabs) => GpuPool::Slabs,
                    },
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
            if let Some(p) = args.percent.iter().find(|p| ![50, 25, 10].contains(*p)) {
                return Err(Error::Invalid {
                    what: "--percent",
                    msg: format!("{p}: the step budgets are 50, 25 and 10"),
                });
            }
            let budgets: &[u64] = match (args.resident_only, args.percent.is_empty()) {
                (true, _) => &[],
                (false, true) => &[50, 25, 10],
                (false, false) => &args.percent,
            };
            Some(pagetrain::bench::step_times(
                &make,
                &cfg,
                &data,
                r.upload_chosen_gbps,
                pagetrain::bench::Budgets { percent: budgets, bytes: &args.budget },
                args.warmup_steps,
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
        println!("kernel choices: {}", r.kernel_choices);
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
        println!("  write-back:                  {:8.2} GB/s", r.writeback_gbps);
        println!("  host store: {}", r.host_store);
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
            let host_ms = |v: Option<f64>| v.map_or(String::new(), |v| format!(", {v:.0} ms of it host passes"));
            println!(
                "  resident:    {:9.1} ms  ({:.0} tokens/s; AdamW on the {}{})",
                s.step_ms_resident,
                s.resident_tokens_per_s,
                s.optimizer_resident,
                host_ms(s.host_optimizer_ms_resident)
            );
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
                if let Some(on) = &b.optimizer {
                    println!("    AdamW on the {on}{}", host_ms(b.host_optimizer_ms_per_step));
                }
                if let Some(c) = &b.compared {
                    println!("    ({c})");
                }
            }
            println!("  paged runs uploaded by: {}; GPU pool: {}", s.upload_path, s.gpu_pool);
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
