//! `PAGETRAIN_PROFILE=timeline`: where the GPU does no kernel work in a step. The profile's
//! timestamps (see `profile`) are kept in order as spans on the GPU's clock; the time between
//! one dispatch's end and the next one's start is what ran no kernel: the pager's copies (uploads
//! from the staging ring, write-backs), the GPU waiting for the host to submit, or both. Listing
//! the longest of those gaps with the dispatches around them says which part of a step the
//! GPU waited in — the stall counters only say how long the host waited.

/// A dispatch as the GPU ran it: its entry (or shape label), start and end in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub entry: &'static str,
    pub start_ns: f64,
    pub end_ns: f64,
}

/// The time between two dispatches of one step.
#[derive(Clone, Debug)]
pub struct Gap {
    /// Dispatches of the step before the gap.
    pub after_index: usize,
    pub before: &'static str,
    pub after: &'static str,
    pub ms: f64,
    /// The profile read its timestamps back here: a wait that unprofiled steps do not have.
    pub profiler_wait: bool,
}

/// One step on the GPU: from its first dispatch's start to the next step's first dispatch's
/// start (or its own last dispatch's end).
#[derive(Clone, Debug)]
pub struct StepTimeline {
    pub dispatches: usize,
    pub span_ms: f64,
    /// Sum of the dispatches' own times.
    pub kernel_ms: f64,
    /// Every gap, longest first.
    pub gaps: Vec<Gap>,
}

impl StepTimeline {
    /// Time between dispatches, the profiler's own read-back waits left out.
    pub fn between_ms(&self) -> f64 {
        self.gaps.iter().filter(|g| !g.profiler_wait).map(|g| g.ms).sum()
    }
}

/// Spans in dispatch order, where steps start, and where the profile read its timestamps back.
#[derive(Default)]
pub(super) struct Timeline {
    spans: Vec<Span>,
    /// Indices into `spans` (counting dispatches not yet read back) of each step's first dispatch.
    step_starts: Vec<usize>,
    /// Indices of the first dispatch after each read-back.
    read_backs: Vec<usize>,
}

impl Timeline {
    pub(super) fn push(&mut self, span: Span) {
        self.spans.push(span);
    }

    /// The next dispatch (the `pending`-th not yet read back) starts a step.
    pub(super) fn mark_step(&mut self, pending: usize) {
        self.step_starts.push(self.spans.len() + pending);
    }

    /// The spans read so far end where the profile waited for its timestamps.
    pub(super) fn mark_read_back(&mut self) {
        self.read_backs.push(self.spans.len());
    }

    /// Every marked step whose dispatches have all been read back.
    pub(super) fn steps(&self) -> Vec<StepTimeline> {
        let mut bounds = self.step_starts.clone();
        bounds.push(self.spans.len());
        bounds.windows(2).filter(|w| w[0] < w[1] && w[1] <= self.spans.len()).map(|w| self.step(w[0], w[1])).collect()
    }

    fn step(&self, from: usize, to: usize) -> StepTimeline {
        let spans = &self.spans[from..to];
        let end = self.spans.get(to).map_or(spans[spans.len() - 1].end_ns, |next| next.start_ns);
        let mut gaps: Vec<Gap> = Vec::new();
        for (i, pair) in self.spans[from..(to + 1).min(self.spans.len())].windows(2).enumerate() {
            let ns = pair[1].start_ns - pair[0].end_ns;
            if ns > 0.0 {
                gaps.push(Gap {
                    after_index: i + 1,
                    before: pair[0].entry,
                    after: pair[1].entry,
                    ms: ns * 1e-6,
                    profiler_wait: self.read_backs.contains(&(from + i + 1)),
                });
            }
        }
        gaps.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        StepTimeline {
            dispatches: spans.len(),
            span_ms: (end - spans[0].start_ns) * 1e-6,
            kernel_ms: spans.iter().map(|s| (s.end_ns - s.start_ns).max(0.0)).sum::<f64>() * 1e-6,
            gaps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Span, Timeline};

    fn span(entry: &'static str, start_ns: f64, end_ns: f64) -> Span {
        Span { entry, start_ns, end_ns }
    }

    #[test]
    fn steps_split_at_their_marks_and_gaps_name_the_dispatches_around_them() {
        let mut t = Timeline::default();
        t.mark_step(0);
        t.push(span("a", 0.0, 1e6));
        t.push(span("b", 3e6, 4e6)); // 2 ms after a
        t.mark_read_back();
        t.push(span("c", 9e6, 10e6)); // 5 ms after b: the profiler's wait
        t.mark_step(0);
        t.push(span("a", 10.5e6, 11e6)); // next step, 0.5 ms after c
        t.push(span("b", 11e6, 12e6));
        let steps = t.steps();
        assert_eq!(steps.len(), 2, "two marked steps, both read back");
        let first = &steps[0];
        assert_eq!(first.dispatches, 3);
        assert!((first.span_ms - 10.5).abs() < 1e-9, "to the next step's start: {}", first.span_ms);
        assert!((first.kernel_ms - 3.0).abs() < 1e-9);
        let g: Vec<_> = first.gaps.iter().map(|g| (g.before, g.after, g.ms, g.profiler_wait)).collect();
        assert_eq!(g.len(), 3, "{g:?}");
        assert_eq!((g[0].0, g[0].1, g[0].3), ("b", "c", true));
        assert!((g[0].2 - 5.0).abs() < 1e-9);
        assert_eq!((g[1].0, g[1].1, g[1].3), ("a", "b", false));
        assert_eq!((g[2].0, g[2].1), ("c", "a"), "the gap before the next step is this step's");
        assert!((first.between_ms() - 2.5).abs() < 1e-9, "without the profiler's wait");
        assert_eq!(steps[1].gaps.len(), 0);
        assert!((steps[1].span_ms - 1.5).abs() < 1e-9);
    }

    #[test]
    fn a_step_not_yet_read_back_is_not_reported() {
        let mut t = Timeline::default();
        t.mark_step(0);
        t.push(span("a", 0.0, 1.0));
        t.mark_step(3); // three more dispatches recorded, not read back
        assert_eq!(t.steps().len(), 0, "the first step's end is not known yet");
    }
}
