//! How a paged run's uploads cross the bus on a discrete GPU, decided by a step trial
//! (`super::step_trial`) where pinned host memory is offered. The staging ring's memcpy runs on
//! the copy threads beside the kernels; DMA from pinned memory needs no copy thread but runs on
//! wgpu's one queue in line with them (`pager::upload_path`). Neither wins everywhere: on an
//! H100 (2026-12-06, GPT-2 small, same calls) f16 at a tenth of its footprint stepped in
//! 114.7 / 115.4 ms by DMA against 126.3 / 127.0 through the ring (later 120.3 against 130.7),
//! f16 at a quarter in 89.5 either way, and f32 at a quarter in 363.1 by DMA against
//! 324.5–330.3 through the ring. So once a run pages (before the recompute trial, which then
//! measures on the path kept), the steps of the path `auto` started on (the usual one) are
//! timed, then as many the other way.

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

/// The path a trial tries against `usual` (the staging ring against DMA, and the other way).
pub(super) fn other_than(usual: UploadPath) -> UploadPath {
    if usual == UploadPath::Pinned {
        UploadPath::Ring
    } else {
        UploadPath::Pinned
    }
}

impl UploadDecision {
    /// What a trial that started on `usual` measured and kept.
    pub fn new(usual: UploadPath, o: Outcome) -> Self {
        let kept = if o.other { other_than(usual) } else { usual };
        let (pinned_ms, ring_ms) =
            if usual == UploadPath::Pinned { (o.usual_ms, o.other_ms) } else { (o.other_ms, o.usual_ms) };
        UploadDecision { pinned: kept == UploadPath::Pinned, pinned_ms, ring_ms }
    }

    /// The path kept.
    pub fn path(&self) -> UploadPath {
        if self.pinned {
            UploadPath::Pinned
        } else {
            UploadPath::Ring
        }
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
        let dma = UploadDecision::new(UploadPath::Ring, Outcome { other: true, other_ms: 114.7, usual_ms: 126.3 });
        let said = dma.to_string();
        assert!(said.starts_with("pinned host memory") && said.contains("114.7 ms a step by DMA"), "{said}");
        let ring = UploadDecision::new(UploadPath::Ring, Outcome { other: false, other_ms: 363.1, usual_ms: 324.5 });
        let said = ring.to_string();
        assert!(said.starts_with("staging ring") && said.contains("324.5 ms through"), "{said}");
    }

    #[test]
    fn a_trial_begun_by_dma_times_the_ring_as_the_other_way() {
        let kept = UploadDecision::new(UploadPath::Pinned, Outcome { other: false, other_ms: 130.7, usual_ms: 120.3 });
        assert_eq!(kept, UploadDecision { pinned: true, pinned_ms: 120.3, ring_ms: 130.7 });
        let left = UploadDecision::new(UploadPath::Pinned, Outcome { other: true, other_ms: 324.5, usual_ms: 363.1 });
        assert_eq!(left, UploadDecision { pinned: false, pinned_ms: 363.1, ring_ms: 324.5 });
        assert_eq!(left.path(), UploadPath::Ring);
        assert_eq!(other_than(UploadPath::Ring), UploadPath::Pinned);
    }
}
