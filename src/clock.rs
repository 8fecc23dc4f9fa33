//! A stopwatch that also works in the browser, where `std::time::Instant` panics: there the
//! performance clock (through `web-time`) reads the time.

#[cfg(not(target_arch = "wasm32"))]
use std::time::Instant;
#[cfg(target_arch = "wasm32")]
use web_time::Instant;

pub(crate) struct Stopwatch(Instant);

impl Stopwatch {
    pub(crate) fn start() -> Self {
        Stopwatch(Instant::now())
    }

    /// Seconds since `start`.
    pub(crate) fn seconds(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}
