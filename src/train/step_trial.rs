//! Choosing between two ways of running a paged step by timing both: the way the run goes
//! ("usual") for a few steps, then the other for as many, keeping the other only where its
//! median step beat the usual one's by a margin. Which way is faster depends on the GPU, the
//! precision and the budget, so a run measures instead of guessing: whether blocks are
//! recomputed (`super::recompute_trial`), and how uploads cross the bus (`super::upload_trial`).
//! One trial runs at a time; the trainer times the steps a trial asks for and applies its
//! switches.

/// Steps after a change before timing: the pager plans a step from the last one's accesses, and
/// a step after a change has none to go by.
pub const SETTLE: u32 = 2;
/// Steps timed each way; the median counts, so neither one step slowed by something else (an
/// evaluation) nor one lucky step does. The fastest counted before: on an H100, GPT-2 small in
/// f16 at a quarter with AdamW split measured 106.6 ms at its fastest without recompute (105.0
/// with it), kept it off, and then stepped in 148 ms, against 88–90 in runs that kept it on.
pub const TIMED: usize = 3;
/// The other way is kept only where its median step is at least this much faster: a tie keeps
/// the usual way. On an H100, GPT-2 small in f16 at a quarter of its footprint measured within
/// 5 % either way with and without recompute in five calls (noise), at a tenth 17–24 % faster
/// recomputed. The usual way is also timed first, nearer the run's slow start, which favours the
/// other.
const MARGIN: f64 = 0.05;

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Not begun (or not wanted).
    Idle,
    /// `other`: the other way is on.
    Settling {
        other: bool,
        left: u32,
    },
    /// `times`: the steps timed so far, in seconds (`taken` of them).
    Timing {
        other: bool,
        taken: usize,
        times: [f64; TIMED],
    },
    Done,
}

/// What a trial measured and kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// The other way is kept.
    pub other: bool,
    /// The median timed step each way, in milliseconds.
    pub other_ms: f64,
    pub usual_ms: f64,
}

/// A trial's progress.
#[derive(Debug)]
pub struct StepTrial {
    state: State,
    /// Seconds of the median step timed the usual way.
    usual: f64,
    outcome: Option<Outcome>,
}

impl Default for StepTrial {
    fn default() -> Self {
        StepTrial { state: State::Idle, usual: 0.0, outcome: None }
    }
}

impl StepTrial {
    /// Begins (once) the usual way, timing after `settle` steps.
    pub fn start(&mut self, settle: u32) {
        if self.state == State::Idle {
            self.state = State::Settling { other: false, left: settle };
        }
    }

    /// Whether the trial has begun and not yet decided.
    pub fn running(&self) -> bool {
        !matches!(self.state, State::Idle | State::Done)
    }

    /// Whether the trial has begun, decided or not.
    pub fn started(&self) -> bool {
        self.state != State::Idle
    }

    /// Whether the next step is to be timed (the trainer then times it from an idle GPU to an
    /// idle GPU, so that work between steps does not count).
    pub fn times_next_step(&self) -> bool {
        matches!(self.state, State::Timing { .. })
    }

    /// After a step, with its seconds if it was timed: `Some(other)` when the way is to change
    /// from the next step (`true`: to the other one).
    pub fn after_step(&mut self, seconds: Option<f64>) -> Option<bool> {
        match self.state {
            State::Idle | State::Done => None,
            State::Settling { other, left } => {
                self.state = match left {
                    0 | 1 => State::Timing { other, taken: 0, times: [f64::INFINITY; TIMED] },
                    _ => State::Settling { other, left: left - 1 },
                };
                None
            }
            State::Timing { other, taken, mut times } => {
                times[taken] = seconds.unwrap_or(f64::INFINITY);
                if taken + 1 < TIMED {
                    self.state = State::Timing { other, taken: taken + 1, times };
                    return None;
                }
                times.sort_by(f64::total_cmp);
                let median = times[TIMED / 2];
                if !other {
                    self.usual = median;
                    self.state = State::Settling { other: true, left: SETTLE };
                    return Some(true);
                }
                let keep = median < self.usual * (1.0 - MARGIN);
                self.outcome = Some(Outcome { other: keep, other_ms: median * 1e3, usual_ms: self.usual * 1e3 });
                self.state = State::Done;
                (!keep).then_some(false)
            }
        }
    }

    /// What the trial measured and kept, once it has decided.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: u32 = 4;

    /// Runs steps whose timed seconds are `usual` and `other`; returns the switches made (step
    /// index, to the other way) and the final choice.
    fn trial(usual: f64, other: f64) -> (Vec<(usize, bool)>, StepTrial) {
        let mut t = StepTrial::default();
        let mut on = false;
        let mut switches = Vec::new();
        assert!(!t.running() && !t.started() && t.after_step(None).is_none(), "idle until started");
        t.start(FIRST);
        for step in 0..30 {
            // (one slow step each way, which the median ignores)
            let slow = if step % 3 == 0 { 10.0 } else { 1.0 };
            let timed = t.times_next_step().then_some(slow * if on { other } else { usual });
            if let Some(next) = t.after_step(timed) {
                on = next;
                switches.push((step, next));
            }
        }
        (switches, t)
    }

    #[test]
    fn keeps_the_other_way_where_it_was_faster() {
        let (switches, t) = trial(0.175, 0.141);
        assert_eq!(switches, vec![(FIRST as usize + TIMED - 1, true)], "one switch, after settling and timing");
        assert!(!t.running() && t.started());
        assert_eq!(t.outcome(), Some(Outcome { other: true, other_ms: 141.0, usual_ms: 175.0 }));
    }

    #[test]
    fn goes_back_where_the_other_way_was_slower() {
        let (switches, t) = trial(0.335, 0.391);
        assert_eq!(switches, vec![(6, true), (11, false)]);
        assert!(!t.outcome().expect("decided").other);
    }

    #[test]
    fn goes_back_where_the_other_way_was_faster_by_less_than_the_margin() {
        let (switches, t) = trial(0.1725, 0.166);
        assert_eq!(switches, vec![(6, true), (11, false)]);
        assert!(!t.outcome().expect("decided").other);
    }

    #[test]
    fn one_lucky_step_does_not_decide() {
        let mut t = StepTrial::default();
        t.start(0);
        t.after_step(None);
        // The usual way: 100, 150, 150 ms; the other: 120 ms each. The fastest would keep the
        // usual way; its median (150) loses.
        for s in [0.100, 0.150, 0.150, 0.0, 0.0, 0.120, 0.120, 0.120] {
            t.after_step(t.times_next_step().then_some(s));
        }
        assert_eq!(t.outcome(), Some(Outcome { other: true, other_ms: 120.0, usual_ms: 150.0 }));
    }

    #[test]
    fn starts_once() {
        let mut t = StepTrial::default();
        t.start(FIRST);
        t.after_step(None);
        t.start(FIRST);
        assert_eq!(t.state, State::Settling { other: false, left: FIRST - 1 }, "a second start changes nothing");
    }
}
