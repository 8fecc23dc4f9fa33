//! Which tensors to evict so that one slab has a free range long enough for the next (slab
//! mode, `slabs.rs`). Evicting the policy's victims one by one until some gap fits frees bytes
//! scattered over every slab; instead, among the runs of neighbours in one slab whose eviction
//! opens a gap that fits, evict the run the policy gives up most willingly: the one whose most
//! wanted tensor is least wanted (Belady: needed farthest ahead), then the fewest bytes.

use super::plan::Candidate;

/// A tensor's range in a slab; `candidate` is `None` where it may not leave now (held by the
/// op being recorded, or dirty and needed again this step without blocking waits).
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub offset: u64,
    pub size: u64,
    pub candidate: Option<Candidate>,
}

/// Indices into `placed` (one slab's tensors, sorted by offset, in a slab of `slab` bytes) of
/// the run to evict for a free range of `len` bytes, with its rank (`rank` of a candidate: the
/// larger, the more willingly evicted); `None` if no run of evictable neighbours makes room.
pub fn choose_run<R: Ord + Copy>(
    placed: &[Placed],
    slab: u64,
    len: u64,
    rank: impl Fn(&Candidate) -> R,
) -> Option<(std::ops::Range<usize>, R, u64)> {
    let mut best: Option<(std::ops::Range<usize>, R, u64)> = None;
    for i in 0..placed.len() {
        let start = if i == 0 { 0 } else { placed[i - 1].offset + placed[i - 1].size };
        let mut worst: Option<R> = None;
        let mut bytes = 0;
        for j in i..placed.len() {
            let Some(c) = &placed[j].candidate else { break };
            let r = rank(c);
            worst = Some(worst.map_or(r, |w| w.min(r)));
            bytes += placed[j].size;
            let end = placed.get(j + 1).map_or(slab, |next| next.offset);
            if end - start >= len {
                let better = match &best {
                    None => true,
                    Some((_, b, b_bytes)) => {
                        (worst, std::cmp::Reverse(bytes)) > (Some(*b), std::cmp::Reverse(*b_bytes))
                    }
                };
                if better {
                    best = Some((i..j + 1, worst.expect("set"), bytes));
                }
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pager::plan::Key;

    fn at(offset: u64, size: u64, next_use: Option<u64>) -> Placed {
        let candidate =
            next_use.map(|n| Candidate { key: Key::Persistent(offset as _), bytes: size, last_use: n, dirty: false });
        Placed { offset, size, candidate }
    }

    /// Ranks by `last_use` standing in for the next use: larger leaves sooner.
    fn run(placed: &[Placed], slab: u64, len: u64) -> Option<std::ops::Range<usize>> {
        choose_run(placed, slab, len, |c| c.last_use).map(|(r, _, _)| r)
    }

    #[test]
    fn the_run_whose_most_wanted_tensor_is_least_wanted_goes() {
        // [0,100) wanted at 5, [100,200) at 50, [200,300) at 40, [300,400) at 1, slab of 400.
        let placed = [at(0, 100, Some(5)), at(100, 100, Some(50)), at(200, 100, Some(40)), at(300, 100, Some(1))];
        assert_eq!(run(&placed, 400, 100), Some(1..2), "one tensor's room: the farthest");
        assert_eq!(run(&placed, 400, 200), Some(1..3), "two neighbours: 50 and 40 beat 5 and 50");
        assert_eq!(run(&placed, 400, 400), Some(0..4));
        assert_eq!(run(&placed, 400, 401), None);
    }

    #[test]
    fn gaps_count_and_held_tensors_split_runs() {
        // A 50-byte gap before a tensor at 150; a held tensor at 300.
        let placed = [at(0, 100, Some(9)), at(150, 100, Some(2)), at(300, 100, None)];
        // [100, 300) once the tensor at 150 goes: 200 bytes for one eviction.
        assert_eq!(run(&placed, 500, 200), Some(1..2));
        // 250 bytes need both; nothing can pass the held tensor, but after it 100 are free.
        assert_eq!(run(&placed, 500, 250), Some(0..2));
        assert_eq!(run(&placed, 500, 301), None, "the held tensor splits the slab");
        let held = [at(0, 100, None), at(100, 100, Some(3)), at(200, 100, None)];
        assert_eq!(run(&held, 300, 100), Some(1..2));
        assert_eq!(run(&held, 300, 101), None);
    }

    #[test]
    fn among_equally_willing_runs_the_fewest_bytes_go() {
        let placed = [at(0, 300, Some(7)), at(300, 100, Some(7)), at(400, 100, Some(7))];
        assert_eq!(run(&placed, 500, 100), Some(1..2));
    }
}
