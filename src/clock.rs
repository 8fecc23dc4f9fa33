//! A stopwatch that also works in the browser, where `std::time::Instant` panics: there the
//! performance clock (through `web-time`) reads the time.

#[cfg(not(target_arch = "wasm32"))]
use std::time::Instant;
#[cfg(target_arch = "wasm32")]
use web_time::Instant;

#[derive(Clone, Copy)]
pub(crate) struct Stopwatch(Instant);

/// When the process started, as `mark_process_start` (the first line of `main`) saw it.
static PROCESS_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Marks now as the process's start; later calls change nothing. Call it first in `main`, so
/// `first_step_s` counts what a user waits for: start-up, device, model, data, pipelines.
pub fn mark_process_start() {
    PROCESS_START.get_or_init(Instant::now);
}

/// Seconds since [`mark_process_start`] (or since this first call, where nothing marked it).
pub fn since_process_start() -> f64 {
    PROCESS_START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

impl Stopwatch {
    pub(crate) fn start() -> Self {
        Stopwatch(Instant::now())
    }

    /// Seconds since `start`.
    pub(crate) fn seconds(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// Logs (at `info`, `RUST_LOG=pagetrain=info`) that start-up reached `what`, with the seconds
/// since the process started: where the wait before the first step goes.
pub fn startup_phase(what: &str) {
    log::info!("start-up: {what} at {:.3} s", since_process_start());
}
