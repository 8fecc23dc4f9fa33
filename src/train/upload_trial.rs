//! How a paged run's uploads cross the bus on a discrete GPU, decided by a step trial
//! (`super::step_trial`) where pinned host memory is offered. The staging ring's memcpy runs on
//! the copy threads beside the kernels; DMA from pinned memory needs no copy thread but runs on
//! wgpu's one queue in line with them (`pager::upload_path`). Neither wins everywhere: on an
//! H100 (2026-12-06, GPT-2 small, same calls) f16 at a tenth of its footprint stepped in
//! 114.7 / 115.4 ms by DMA against 126.3 / 127.0 through the ring, f16 at a quarter in 89.5
//! either way, and f32 at a quarter in 363.1 by DMA against 324.5–330.3 through the ring. So
//! after the recompute trial (or at once where it does not run), the ring's steps are timed,
//! then as many by DMA.

use super::step_trial::{Outcome, TIMED};
use crate::pager::UploadPath;

/// What the upload trial measured and kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UploadDecision {
    /// Uploads go by DMA from pinned memory.
    pub pinned: bool,
    /// The median timed step each way, in milliseconds.
    pub pinned_ms: f64,
    pub ring_ms: f64,
}

/// The path a trial's `pinned` stands for.
pub(super) fn path_of(pinned: bool) -> UploadPath {
    if pinned {
        UploadPath::Pinned
    } else {
        UploadPath::Ring
    }
}

impl UploadDecision {
    /// The path kept.
    pub fn path(&self) -> UploadPath {
        path_of(self.pinned)
    }
}

impl From<Outcome> for UploadDecision {
    /// The usual way is the staging ring; the other, DMA from pinned memory.
    fn from(o: Outcome) -> Self {
        UploadDecision { pinned: o.other, pinned_ms: o.other_ms, ring_ms: o.usual_ms }
    }
}

impl std::fmt::Display for UploadDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (measured, the median of {TIMED} paged steps each way: {:.1} ms a step by DMA from pinned memory, {:.1} ms through the staging ring)",
            self.path().name(),
            self.pinned_ms,
            self.ring_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_what_was_measured_and_kept() {
        let dma = UploadDecision::from(Outcome { other: true, other_ms: 114.7, usual_ms: 126.3 }).to_string();
        assert!(dma.starts_with("pinned host memory") && dma.contains("114.7 ms a step by DMA"), "{dma}");
        let ring = UploadDecision::from(Outcome { other: false, other_ms: 363.1, usual_ms: 324.5 }).to_string();
        assert!(ring.starts_with("staging ring") && ring.contains("324.5 ms through"), "{ring}");
    }
}
