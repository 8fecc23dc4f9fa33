//! Which neighbours in one slab to clear so that it has a free range long enough for the next
//! tensor (slab mode, `slabs.rs`): the run of neighbours, gaps included, whose clearing costs
//! least. The pager's cost is the bytes it must move inside GPU memory (compaction,
//! `eviction.rs`); a tensor that cannot leave (held by the op being recorded) ends every run.

/// A tensor's range in a slab.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub offset: u64,
    pub size: u64,
}

/// Indices into `placed` (one slab's tensors, sorted by offset, in a slab of `slab` bytes) of
/// the run whose clearing opens a free range of `len` bytes at least cost, with that cost: the
/// sum of `cost` over it (`cost` of an index: `None` where that tensor cannot leave, so no run
/// passes it). Among equal costs, the first. `None` if no run opens such a range.
pub fn cheapest_run(
    placed: &[Placed],
    slab: u64,
    len: u64,
    cost: impl Fn(usize) -> Option<u64>,
) -> Option<(std::ops::Range<usize>, u64)> {
    let mut best: Option<(std::ops::Range<usize>, u64)> = None;
    for i in 0..placed.len() {
        let start = if i == 0 { 0 } else { placed[i - 1].offset + placed[i - 1].size };
        let mut total = 0;
        for j in i..placed.len() {
            let Some(c) = cost(j) else { break };
            total += c;
            let end = placed.get(j + 1).map_or(slab, |next| next.offset);
            if end - start >= len {
                if best.as_ref().is_none_or(|(_, b)| total < *b) {
                    best = Some((i..j + 1, total));
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

    fn at(offset: u64, size: u64) -> Placed {
        Placed { offset, size }
    }

    #[test]
    fn the_cheapest_run_is_cleared_and_none_passes_what_cannot_leave() {
        let placed = [at(0, 100), at(100, 100), at(200, 100), at(300, 100)];
        let costs = [None, Some(30), Some(5), Some(40)];
        let cheapest = |len| cheapest_run(&placed, 400, len, |i| costs[i]);
        assert_eq!(cheapest(100), Some((2..3, 5)));
        assert_eq!(cheapest(200), Some((1..3, 35)), "35 against 45");
        assert_eq!(cheapest(300), Some((1..4, 75)));
        assert_eq!(cheapest(301), None, "the tensor at 0 stays");
    }

    #[test]
    fn gaps_count_toward_the_range() {
        // A 50-byte gap after the tensor at 0, 100 free bytes at the end of the slab.
        let placed = [at(0, 100), at(150, 100), at(250, 150)];
        let cost = |i: usize| Some([7, 9, 12][i]);
        let cheapest = |len| cheapest_run(&placed, 500, len, cost);
        assert_eq!(cheapest(150), Some((0..1, 7)), "[0, 150) once the first goes");
        assert_eq!(cheapest(200), Some((2..3, 12)), "[250, 500) against [0, 250) for 16");
        assert_eq!(cheapest(400), Some((1..3, 21)), "[100, 500)");
        assert_eq!(cheapest(500), Some((0..3, 28)));
        assert_eq!(cheapest(501), None);
    }
}
