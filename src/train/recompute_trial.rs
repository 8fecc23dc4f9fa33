//! Whether a paged run recomputes its blocks in backward, decided by a step trial
//! (`super::step_trial`). Recompute trades a second forward's kernels for the activations' trips
//! over the bus, and which costs more depends on the GPU, the precision and the budget: on an
//! H100 (2026-12-06), GPT-2 small in f16 stepped in 141 ms recomputed against 175 ms paged at a
//! tenth of its footprint, 120 against 119 at a quarter, and in f32 at a quarter 391 against
//! 335. So once a step has had to evict tensors to stay in the GPU budget, a few steps are timed
//! as they are, then as many with the blocks recomputed.

use super::step_trial::{Outcome, TIMED};

/// Steps after the first that evicted before timing: a run's first paged steps are slow while
/// the host store pins its pages and the GPU raises its clocks (H100, GPT-2 small at a tenth:
/// 8.6, 2.3, 1.7 and 3.0 s, then 0.18 s a step).
pub const FIRST_SETTLE: u32 = 4;

/// What the recompute trial measured and kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecomputeDecision {
    /// Recompute is kept on.
    pub on: bool,
    /// The median timed step each way, in milliseconds.
    pub recomputed_ms: f64,
    pub kept_ms: f64,
}

impl From<Outcome> for RecomputeDecision {
    /// The usual way keeps activations from forward; the other recomputes.
    fn from(o: Outcome) -> Self {
        RecomputeDecision { on: o.other, recomputed_ms: o.other_ms, kept_ms: o.usual_ms }
    }
}

impl std::fmt::Display for RecomputeDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "recompute {} (measured, the median of {TIMED} steps each way: {:.1} ms a step recomputed, {:.1} ms kept from forward)",
            if self.on { "on" } else { "off" },
            self.recomputed_ms,
            self.kept_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_what_was_measured_and_kept() {
        let on = RecomputeDecision::from(Outcome { other: true, other_ms: 141.0, usual_ms: 175.0 }).to_string();
        assert!(on.starts_with("recompute on") && on.contains("141.0 ms") && on.contains("175.0 ms"), "{on}");
        let off = RecomputeDecision::from(Outcome { other: false, other_ms: 391.0, usual_ms: 335.0 }).to_string();
        assert!(off.starts_with("recompute off") && off.contains("391.0 ms a step recomputed"), "{off}");
    }
}
