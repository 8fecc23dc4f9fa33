//! Which of a backward's additions to a gradient is its last, known from the backward before:
//! the same ops in the same order add to each gradient as often. What watches a backward for
//! the host optimizer (`super::HalfGrads`, `super::GradsDown`) acts on a gradient then — casts
//! it, or starts its way down — while backward goes on. A backward with no such record (the
//! first, or one whose ops changed) leaves every gradient to the end ([`LastAdditions::finish`]).

use std::hash::{Hash, Hasher};

use crate::context::Context;

/// One slot per gradient.
#[derive(Default)]
pub(super) struct LastAdditions {
    /// The ops of the backward under way (a hash of their names, in order).
    ops: u64,
    /// Per slot: additions so far, and whether the gradient has been acted on.
    added: Vec<u32>,
    done: Vec<bool>,
    /// Gradients acted on before backward ended.
    early: usize,
    /// The last whole backward's ops and additions per slot.
    before: Option<(u64, Vec<u32>)>,
}

impl LastAdditions {
    pub fn new(slots: usize) -> Self {
        LastAdditions { added: vec![0; slots], done: vec![false; slots], ..Default::default() }
    }

    /// Call before the backward watched, with its ops on the tape.
    pub fn begin(&mut self, ctx: &Context) {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        ctx.tape().op_names().hash(&mut hasher);
        self.ops = hasher.finish();
        self.added.iter_mut().for_each(|a| *a = 0);
        self.done.iter_mut().for_each(|d| *d = false);
        self.early = 0;
    }

    /// Counts an addition to `slot`'s gradient; true where the record says it was the last
    /// (the caller acts on it then, and says so with [`LastAdditions::mark_done`]).
    pub fn add(&mut self, slot: usize) -> bool {
        self.added[slot] += 1;
        match &self.before {
            Some((ops, added)) => *ops == self.ops && added[slot] == self.added[slot],
            None => false,
        }
    }

    /// `slot`'s gradient has been acted on: during backward where `early`.
    pub fn mark_done(&mut self, slot: usize, early: bool) {
        self.done[slot] = true;
        self.early += early as usize;
    }

    pub fn is_done(&self, slot: usize) -> bool {
        self.done.get(slot).copied().unwrap_or(false)
    }

    /// Gradients acted on during the last backward, not after it ended.
    pub fn early(&self) -> usize {
        self.early
    }

    /// After backward: keeps its additions as the record for the next, and returns the slots
    /// not acted on yet.
    pub fn finish(&mut self) -> Vec<usize> {
        self.before = Some((self.ops, self.added.clone()));
        (0..self.done.len()).filter(|&i| !self.done[i]).collect()
    }
}
