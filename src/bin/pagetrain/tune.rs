//! `pagetrain tune`: measures the kernel families this adapter can run and keeps the fastest
//! (see `pagetrain::bench::autotune` and `pagetrain::kernels::tuned`).

use clap::Args;

use pagetrain::bench::autotune::{autotune, Effort};
use pagetrain::kernels::tuned::Tuned;
use pagetrain::{Context, ContextOptions, Error};

#[derive(Args, Default)]
pub(crate) struct TuneArgs {
    /// Which of the best adapters to tune (`pagetrain info` lists them).
    #[arg(long)]
    adapter: Option<usize>,
    /// Measure and print, but keep the choices in effect now (write no file).
    #[arg(long)]
    dry_run: bool,
    /// One timing of one call per candidate (after its compile): quicker, noisier.
    #[arg(long)]
    quick: bool,
    /// Print the measurements and choices as JSON (stdout) instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn tune(args: TuneArgs) -> Result<(), Error> {
    let device = pagetrain::device::DeviceOptions { adapter_index: args.adapter, ..Default::default() };
    let ctx = Context::new(&ContextOptions { device, ..Default::default() }).await?;
    eprintln!("adapter: {}", ctx.gpu.describe());
    let effort = if args.quick { Effort { iters: 1, repeats: 1 } } else { Effort::default() };
    let tuned = autotune(&ctx, effort)?;
    let path = Tuned::path(&ctx.gpu);
    let written = match (&path, args.dry_run) {
        (Some(p), false) => {
            tuned.tuned.save(p)?;
            Some(p.display().to_string())
        }
        _ => None,
    };
    if args.json {
        let report = serde_json::json!({
            "adapter": ctx.gpu.describe(),
            "shapes": tuned.shapes,
            "measured": tuned.measured,
            "chosen": tuned.tuned,
            "written": written,
        });
        println!("{report:#}");
        return Ok(());
    }
    println!("{}", tuned.shapes);
    println!("{:<26} {:<10} {:>10}", "choice", "candidate", "ms a call");
    for m in &tuned.measured {
        println!("{:<26} {:<10} {:>10.3}", m.choice, m.candidate, m.ms);
    }
    let t = &tuned.tuned;
    println!("chosen: matmul {:?}", t.matmul);
    for a in &t.attention {
        println!("        attention at head size {}: forward {:?}, backward {:?}", a.head_size, a.forward, a.backward);
    }
    match (written, path) {
        (Some(p), _) => println!("kept in {p}: every run on this adapter starts from these choices"),
        (None, Some(p)) if args.dry_run => println!("not written (--dry-run); it would go to {}", p.display()),
        _ => println!("not written: no cache folder (set PAGETRAIN_CACHE_DIR or HOME)"),
    }
    Ok(())
}
