//! Whether the host optimizer bets on unclipped steps (`optim::speculative_update`), decided by a
//! step trial (`super::step_trial`) once a run pages. A bet's thread updates the host share
//! during backward, beside the pager's copy threads and the main thread. On an H100 (GPT-2 small
//! in f16, unclipped steps) bets took a tenth of the footprint from 122.5 to 117.2 ms a step by
//! DMA on 2026-12-06, but a quarter from 79.4–80.3 to 84.6–85.9 through the staging ring; on
//! 2026-12-07 they lost in all four trials (a quarter: 82.6–86.1 ms against 77.2–79.5; a tenth:
//! 115.5–119.8 against 112.4–115.3). So after the upload and recompute trials, steps without
//! bets (the usual way) are timed against as many with, and bets stay only where they are 5 %
//! faster (`PAGETRAIN_SPECULATE=1` keeps them without a trial). Only steps that bet differ:
//! where every step clips, both ways time the same.

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
    /// The usual way does not bet; the other does.
    fn from(o: Outcome) -> Self {
        BetDecision { on: o.other, with_ms: o.other_ms, without_ms: o.usual_ms }
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
        let kept = BetDecision::from(Outcome { other: true, other_ms: 110.2, usual_ms: 122.5 });
        assert!(kept.on);
        let said = kept.to_string();
        assert!(said.contains("steps on (") && said.contains("110.2 ms a step with bets, 122.5 ms without"), "{said}");
        let dropped = BetDecision::from(Outcome { other: false, other_ms: 84.9, usual_ms: 79.4 });
        let said = dropped.to_string();
        assert!(!dropped.on && said.contains("steps off (") && said.contains("84.9 ms a step with bets"), "{said}");
    }
}
