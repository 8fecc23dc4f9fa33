//! Whether the host optimizer bets on unclipped steps (`optim::speculative_update`), decided by a
//! step trial (`super::step_trial`) once a run pages. A bet's thread updates the host share
//! during backward, beside the pager's copy threads and the main thread: on an H100 (2026-12-06,
//! GPT-2 small in f16, unclipped steps) bets took a tenth of the footprint from 122.5 to 117.2 ms
//! a step by DMA, and a quarter from 79.4–80.3 to 84.6–85.9 through the staging ring. So after
//! the upload and recompute trials, steps with bets (the usual way) are timed against as many
//! without. Only steps that bet differ: where every step clips, both ways time the same.

use super::step_trial::{Outcome, TIMED};

/// What the bet trial measured and kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BetDecision {
    /// Bets stay on.
    pub on: bool,
    /// The median timed step each way, in milliseconds.
    pub with_ms: f64,
    pub without_ms: f64,
}

impl From<Outcome> for BetDecision {
    /// The usual way bets; the other does not.
    fn from(o: Outcome) -> Self {
        BetDecision { on: !o.other, with_ms: o.usual_ms, without_ms: o.other_ms }
    }
}

impl std::fmt::Display for BetDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bets on unclipped steps {} (measured, the median of {TIMED} steps each way: {:.1} ms a step with bets, {:.1} ms without)",
            if self.on { "on" } else { "off" },
            self.with_ms,
            self.without_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_what_was_measured_and_kept() {
        let kept = BetDecision::from(Outcome { other: false, other_ms: 122.5, usual_ms: 117.2 });
        assert!(kept.on);
        let said = kept.to_string();
        assert!(said.contains("steps on (") && said.contains("117.2 ms a step with bets, 122.5 ms without"), "{said}");
        let dropped = BetDecision::from(Outcome { other: true, other_ms: 79.4, usual_ms: 84.9 });
        assert!(!dropped.on && dropped.to_string().contains("steps off ("), "{dropped}");
    }
}
