//! Whether a paged run recomputes its blocks in backward, decided by measuring. Recompute trades
//! a second forward's kernels for the activations' trips over the bus, and which costs more
//! depends on the GPU, the precision and the budget: on an H100 (2026-12-06), GPT-2 small in
//! f16 stepped in 141 ms recomputed against 175 ms paged at a tenth of its footprint, 120
//! against 119 at a quarter, and in f32 at a quarter 391 against 335. So once a step has had to
//! evict tensors to stay in the GPU budget, a few steps are timed as they are, then as many with
//! the blocks recomputed, and recompute is kept for the rest of the run where its median step
//! beat the other way's by a margin.

/// Steps after the first that evicted before timing: a run's first paged steps are slow while
/// the host store pins its pages and the GPU raises its clocks (H100, GPT-2 small at a tenth:
/// 8.6, 2.3, 1.7 and 3.0 s, then 0.18 s a step).
const FIRST_SETTLE: u32 = 4;
/// Steps after a change before timing: the pager plans a step from the last one's accesses, and
/// a step after a change has none to go by.
const SETTLE: u32 = 2;
/// Steps timed each way; the median counts, so neither one step slowed by something else (an
/// evaluation) nor one lucky step does. The fastest counted before: on an H100, GPT-2 small in
/// f16 at a quarter with AdamW split measured 106.6 ms at its fastest without recompute (105.0
/// with it), kept it off, and then stepped in 148 ms, against 88–90 in runs that kept it on.
const TIMED: usize = 3;
/// Recompute is kept only where its median step is at least this much faster: a tie keeps the
/// way without a second forward. On an H100, GPT-2 small in f16 at a quarter of its footprint
/// measured within 5 % either way in five calls (noise), at a tenth 17–24 % faster recomputed.
/// The way without is also timed first, nearer the run's slow start, which favours recompute.
const MARGIN: f64 = 0.05;

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// No step has evicted yet (or the trial is not wanted).
    Idle,
    Settling {
        on: bool,
        left: u32,
    },
    /// `times`: the steps timed so far, in seconds (`taken` of them).
    Timing {
        on: bool,
        taken: usize,
        times: [f64; TIMED],
    },
    Done,
}

/// What the trial measured and kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecomputeDecision {
    /// Recompute is kept on.
    pub on: bool,
    /// The median timed step each way, in milliseconds.
    pub recomputed_ms: f64,
    pub kept_ms: f64,
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

/// The trial's progress; the trainer times the steps it asks for and applies its switches.
#[derive(Debug)]
pub struct RecomputeTrial {
    state: State,
    /// Seconds of the median step timed without recompute.
    without: f64,
    /// What was measured and kept, once done.
    decision: Option<RecomputeDecision>,
}

impl Default for RecomputeTrial {
    fn default() -> Self {
        RecomputeTrial { state: State::Idle, without: 0.0, decision: None }
    }
}

impl RecomputeTrial {
    /// A step evicted tensors: begin (once), recompute still off.
    pub fn start(&mut self) {
        if self.state == State::Idle {
            self.state = State::Settling { on: false, left: FIRST_SETTLE };
        }
    }

    /// Whether the trial has begun and not yet decided.
    pub fn running(&self) -> bool {
        !matches!(self.state, State::Idle | State::Done)
    }

    /// Whether the next step is to be timed (the trainer then times it from an idle GPU to an
    /// idle GPU, so that work between steps does not count).
    pub fn times_next_step(&self) -> bool {
        matches!(self.state, State::Timing { .. })
    }

    /// After a step, with its seconds if it was timed: `Some(on)` when recompute is to change
    /// from the next step.
    pub fn after_step(&mut self, seconds: Option<f64>) -> Option<bool> {
        match self.state {
            State::Idle | State::Done => None,
            State::Settling { on, left } => {
                self.state = match left {
                    0 | 1 => State::Timing { on, taken: 0, times: [f64::INFINITY; TIMED] },
                    _ => State::Settling { on, left: left - 1 },
                };
                None
            }
            State::Timing { on, taken, mut times } => {
                times[taken] = seconds.unwrap_or(f64::INFINITY);
                if taken + 1 < TIMED {
                    self.state = State::Timing { on, taken: taken + 1, times };
                    return None;
                }
                times.sort_by(f64::total_cmp);
                let median = times[TIMED / 2];
                if !on {
                    self.without = median;
                    self.state = State::Settling { on: true, left: SETTLE };
                    return Some(true);
                }
                let keep = median < self.without * (1.0 - MARGIN);
                self.decision =
                    Some(RecomputeDecision { on: keep, recomputed_ms: median * 1e3, kept_ms: self.without * 1e3 });
                self.state = State::Done;
                (!keep).then_some(false)
            }
        }
    }

    /// What the trial measured and kept, once it has decided.
    pub fn decision(&self) -> Option<RecomputeDecision> {
        self.decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs steps whose timed seconds are `off` without recompute and `on` with it; returns the
    /// switches made (step index, on) and the final choice.
    fn trial(off: f64, on: f64) -> (Vec<(usize, bool)>, RecomputeTrial) {
        let mut t = RecomputeTrial::default();
        let mut recompute = false;
        let mut switches = Vec::new();
        assert!(!t.running() && t.after_step(None).is_none(), "idle until started");
        t.start();
        for step in 0..30 {
            // (one slow step each way, which the median ignores)
            let slow = if step % 3 == 0 { 10.0 } else { 1.0 };
            let timed = t.times_next_step().then_some(slow * if recompute { on } else { off });
            if let Some(next) = t.after_step(timed) {
                recompute = next;
                switches.push((step, next));
            }
        }
        (switches, t)
    }

    #[test]
    fn keeps_recompute_where_it_was_faster() {
        let (switches, t) = trial(0.175, 0.141);
        assert_eq!(switches, vec![(FIRST_SETTLE as usize + 3 - 1, true)], "one switch on, after settling and timing");
        assert!(!t.running());
        let why = t.decision().expect("decided").to_string();
        assert!(why.starts_with("recompute on") && why.contains("141.0 ms") && why.contains("175.0 ms"), "{why}");
    }

    #[test]
    fn turns_recompute_off_again_where_it_was_slower() {
        let (switches, t) = trial(0.335, 0.391);
        assert_eq!(switches, vec![(6, true), (11, false)]);
        assert!(t.decision().expect("decided").to_string().starts_with("recompute off"));
    }

    #[test]
    fn keeps_recompute_off_where_it_was_faster_by_less_than_the_margin() {
        let (switches, t) = trial(0.1725, 0.166);
        assert_eq!(switches, vec![(6, true), (11, false)]);
        assert!(t.decision().expect("decided").to_string().starts_with("recompute off"));
    }

    #[test]
    fn starts_once() {
        let mut t = RecomputeTrial::default();
        t.start();
        t.after_step(None);
        t.start();
        assert_eq!(t.state, State::Settling { on: false, left: FIRST_SETTLE - 1 }, "a second start changes nothing");
    }
}
