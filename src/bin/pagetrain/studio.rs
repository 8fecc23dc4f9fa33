//! `pagetrain studio`: the window, or its headless screenshot mode.

use std::path::PathBuf;

use clap::Args;
use pagetrain::Error;

use crate::train::{Run, TrainArgs};

#[derive(Args)]
pub(crate) struct StudioArgs {
    #[command(flatten)]
    pub(crate) train: TrainArgs,
    /// Start the run when the window opens.
    #[arg(long)]
    pub(crate) start: bool,
    /// Headless mode for tests and docs: train in the real window, save a screenshot of it
    /// here after --exit-after-steps steps, and exit.
    #[arg(long, value_name = "FILE.png")]
    pub(crate) screenshot: Option<PathBuf>,
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub(crate) exit_after_steps: u64,
    /// Repaint every frame (to measure the frame rate the UI sustains).
    #[arg(long)]
    pub(crate) continuous: bool,
}

pub(crate) fn studio(args: StudioArgs) -> Result<(), Error> {
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
