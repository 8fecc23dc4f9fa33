//! Planning from the known future. A training step repeats the same sequence of tensor accesses,
//! so the trace of one step predicts the next: when GPU space runs out, evict the tensor whose
//! next use is farthest away (Belady's rule), and upload ahead what the next ops will read.
//! Tensors are matched across steps by a stable key: persistent tensors by id, tensors made
//! during a step by their allocation order within it. Without a usable trace (the first step,
//! or a step that went differently) the pager falls back to least-recently-used.

use std::collections::{HashMap, HashSet};

use crate::tensor::TensorId;

/// Identity of a tensor that is the same from one step to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// Made outside any step (parameters, gradients, optimizer state): its id.
    Persistent(TensorId),
    /// The n-th tensor made during the step.
    Step(u32),
}

/// Eviction rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Farthest next use in the previous step's trace; LRU where there is none.
    Belady,
    /// Least recently used.
    Lru,
}

/// The previous step's accesses, indexed for "when is this key needed next", and which of its
/// tensors it freed without reading them on the host (their write-backs were wasted).
#[derive(Default)]
pub struct Future {
    trace: Vec<Key>,
    positions: HashMap<Key, Vec<u32>>,
    freed_unread: HashSet<Key>,
}

impl Future {
    pub fn new(trace: Vec<Key>) -> Self {
        let mut positions: HashMap<Key, Vec<u32>> = HashMap::new();
        for (i, k) in trace.iter().enumerate() {
            positions.entry(*k).or_default().push(i as u32);
        }
        Future { trace, positions, freed_unread: HashSet::new() }
    }

    /// The same future, knowing which keys the step freed with no read of their host copy.
    pub fn with_freed_unread(mut self, keys: HashSet<Key>) -> Self {
        self.freed_unread = keys;
        self
    }

    /// Whether the step freed `key` without reading its host copy: once it has no access left
    /// in the step, its values are not needed and a write-back would be wasted.
    pub fn freed_unread(&self, key: Key) -> bool {
        self.freed_unread.contains(&key)
    }

    pub fn len(&self) -> usize {
        self.trace.len()
    }

    pub fn is_empty(&self) -> bool {
        self.trace.is_empty()
    }

    /// The key at position `i`, if the trace is that long.
    pub fn at(&self, i: usize) -> Option<Key> {
        self.trace.get(i).copied()
    }

    /// First position after `cursor` where `key` is accessed (`u32::MAX`: never again this step).
    pub fn next_use(&self, key: Key, cursor: usize) -> u32 {
        self.positions
            .get(&key)
            .and_then(|p| {
                let i = p.partition_point(|&x| x as usize <= cursor);
                p.get(i).copied()
            })
            .unwrap_or(u32::MAX)
    }
}

/// A resident tensor that could make room.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub key: Key,
    pub bytes: u64,
    pub last_use: u64,
    pub dirty: bool,
}

/// Index into `candidates` of the tensor to evict. Belady: farthest next use; among equally far
/// ones (e.g. never used again) clean before dirty (no write-back), then least recently used.
pub fn choose_victim(
    policy: Policy,
    future: Option<&Future>,
    cursor: usize,
    candidates: &[Candidate],
) -> Option<usize> {
    let lru = || (0..candidates.len()).min_by_key(|&i| candidates[i].last_use);
    match (policy, future) {
        (Policy::Belady, Some(f)) if !f.is_empty() => {
            (0..candidates.len()).max_by_key(|&i| rank(policy, Some(f), cursor, &candidates[i]))
        }
        _ => lru(),
    }
}

/// How willingly the policy evicts `c` (the larger, the sooner): Belady's farthest next use,
/// clean before dirty, then least recently used; LRU's least recently used.
fn rank(policy: Policy, future: Option<&Future>, cursor: usize, c: &Candidate) -> (u32, bool, u64) {
    match (policy, future) {
        (Policy::Belady, Some(f)) if !f.is_empty() => (f.next_use(c.key, cursor), !c.dirty, u64::MAX - c.last_use),
        _ => (0, false, u64::MAX - c.last_use),
    }
}

/// Bytes uploaded when a GPU cache of `budget` bytes serves `steps` (each a sequence of
/// single-tensor accesses; `sizes` by key) under `policy`, each step predicted by the one before
/// it, as the pager does. A model of the pager's eviction for property tests and reports;
/// `None` if a tensor is larger than the budget.
pub fn simulate(steps: &[Vec<Key>], sizes: &HashMap<Key, u64>, budget: u64, policy: Policy) -> Option<u64> {
    let mut resident: HashMap<Key, u64> = HashMap::new(); // key -> last use
    let mut used = 0u64;
    let mut uploaded = 0u64;
    let mut clock = 0u64;
    let mut future: Option<Future> = None;
    for step in steps {
        for (cursor, &key) in step.iter().enumerate() {
            clock += 1;
            let size = sizes[&key];
            if size > budget {
                return None;
            }
            if let Some(last) = resident.get_mut(&key) {
                *last = clock;
                continue;
            }
            while used + size > budget {
                let cands: Vec<Candidate> = resident
                    .iter()
                    .map(|(&k, &last_use)| Candidate { key: k, bytes: sizes[&k], last_use, dirty: false })
                    .collect();
                let v = choose_victim(policy, future.as_ref(), cursor, &cands)?;
                used -= cands[v].bytes;
                resident.remove(&cands[v].key);
            }
            resident.insert(key, clock);
            used += size;
            uploaded += size;
        }
        future = Some(Future::new(step.clone()));
    }
    Some(uploaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_use_looks_strictly_ahead() {
        let k = |i| Key::Persistent(i);
        let f = Future::new(vec![k(1), k(2), k(1), k(3)]);
        assert_eq!(f.next_use(k(1), 0), 2);
        assert_eq!(f.next_use(k(1), 2), u32::MAX);
        assert_eq!(f.next_use(k(3), 0), 3);
        assert_eq!(f.next_use(k(9), 0), u32::MAX);
    }

    #[test]
    fn belady_evicts_the_farthest_and_beats_lru_on_a_loop() {
        // A cyclic scan one item larger than the cache: LRU misses every time, Belady does not.
        let keys: Vec<Key> = (0..5).map(Key::Persistent).collect();
        let steps: Vec<Vec<Key>> = (0..10).map(|_| keys.clone()).collect();
        let sizes: HashMap<Key, u64> = keys.iter().map(|&k| (k, 10)).collect();
        let lru = simulate(&steps, &sizes, 40, Policy::Lru).unwrap();
        let opt = simulate(&steps, &sizes, 40, Policy::Belady).unwrap();
        assert_eq!(lru, 500);
        assert!(opt < 250, "belady uploaded {opt}");
    }
}
