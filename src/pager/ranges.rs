//! First-fit allocation of byte ranges inside large segments, with coalescing: the host stores
//! carve tensors out of their segments with it, and the GPU pool out of its slabs
//! (`pool.rs`), where a segment is a slab.

use super::host::HostRange;

/// Free runs per segment; a segment that was removed has none and a size of 0.
#[derive(Default)]
pub(super) struct Allocator {
    /// Per segment: free (offset, len) runs sorted by offset.
    free: Vec<Vec<(usize, usize)>>,
    pub(super) sizes: Vec<usize>,
}

impl Allocator {
    pub(super) fn find(&mut self, len: usize) -> Option<HostRange> {
        for (segment, runs) in self.free.iter_mut().enumerate() {
            if let Some(i) = runs.iter().position(|&(_, l)| l >= len) {
                let (offset, l) = runs[i];
                if l == len {
                    runs.remove(i);
                } else {
                    runs[i] = (offset + len, l - len);
                }
                return Some(HostRange { segment, offset, len });
            }
        }
        None
    }

    /// `len` bytes from the smallest free run that fits outside segment `not_in` (filling small
    /// gaps first keeps the large ones for what needs them).
    pub(super) fn find_best_outside(&mut self, len: usize, not_in: usize) -> Option<HostRange> {
        let (segment, i) = self
            .free
            .iter()
            .enumerate()
            .filter(|&(segment, _)| segment != not_in)
            .flat_map(|(segment, runs)| runs.iter().enumerate().map(move |(i, &(_, l))| (l, segment, i)))
            .filter(|&(l, _, _)| l >= len)
            .min()
            .map(|(_, segment, i)| (segment, i))?;
        let (offset, l) = self.free[segment][i];
        if l == len {
            self.free[segment].remove(i);
        } else {
            self.free[segment][i] = (offset + len, l - len);
        }
        Some(HostRange { segment, offset, len })
    }

    /// `len` bytes at `offset` of `segment`, if they are free.
    pub(super) fn find_at(&mut self, segment: usize, offset: usize, len: usize) -> Option<HostRange> {
        let runs = self.free.get_mut(segment)?;
        let i = runs.partition_point(|&(o, _)| o <= offset).checked_sub(1)?;
        let (start, l) = runs[i];
        if offset + len > start + l {
            return None;
        }
        let after = (offset + len, start + l - offset - len);
        match (offset > start, after.1 > 0) {
            (false, false) => {
                runs.remove(i);
            }
            (false, true) => runs[i] = after,
            (true, false) => runs[i] = (start, offset - start),
            (true, true) => {
                runs[i] = (start, offset - start);
                runs.insert(i + 1, after);
            }
        }
        Some(HostRange { segment, offset, len })
    }

    /// Free bytes in every segment but `not_in`.
    pub(super) fn free_outside(&self, not_in: usize) -> usize {
        let runs = self.free.iter().enumerate().filter(|&(segment, _)| segment != not_in);
        runs.flat_map(|(_, runs)| runs.iter().map(|&(_, l)| l)).sum()
    }

    /// Whether `find(len)` would succeed.
    pub(super) fn has_room(&self, len: usize) -> bool {
        self.free.iter().flatten().any(|&(_, l)| l >= len)
    }

    /// A new segment of `size` bytes, all free; its index. A removed segment's index is reused.
    pub(super) fn add_segment(&mut self, size: usize) -> usize {
        if let Some(i) = self.sizes.iter().position(|&s| s == 0) {
            self.free[i] = vec![(0, size)];
            self.sizes[i] = size;
            return i;
        }
        self.free.push(vec![(0, size)]);
        self.sizes.push(size);
        self.free.len() - 1
    }

    /// Whether nothing of `segment` is allocated.
    pub(super) fn is_free(&self, segment: usize) -> bool {
        self.sizes[segment] > 0 && self.free[segment] == [(0, self.sizes[segment])]
    }

    /// Forgets `segment` (wholly free): nothing is found in it any more.
    pub(super) fn remove_segment(&mut self, segment: usize) {
        debug_assert!(self.is_free(segment));
        self.free[segment].clear();
        self.sizes[segment] = 0;
    }

    pub(super) fn release(&mut self, r: HostRange) {
        let runs = &mut self.free[r.segment];
        let i = runs.partition_point(|&(o, _)| o < r.offset);
        runs.insert(i, (r.offset, r.len));
        // merge with the next, then with the previous run
        if i + 1 < runs.len() && runs[i].0 + runs[i].1 == runs[i + 1].0 {
            runs[i].1 += runs[i + 1].1;
            runs.remove(i + 1);
        }
        if i > 0 && runs[i - 1].0 + runs[i - 1].1 == runs[i].0 {
            runs[i - 1].1 += runs[i].1;
            runs.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_reuses_and_coalesces_freed_runs() {
        let mut a = Allocator::default();
        a.add_segment(1024);
        let x = a.find(256).unwrap();
        let y = a.find(256).unwrap();
        let z = a.find(512).unwrap();
        assert!(a.find(256).is_none());
        assert!(!a.has_room(256));
        a.release(y);
        a.release(x);
        assert_eq!(a.free[0], vec![(0, 512)]);
        assert!(a.has_room(512) && !a.has_room(768));
        assert!(!a.is_free(0));
        a.release(z);
        assert_eq!(a.free[0], vec![(0, 1024)]);
        assert!(a.is_free(0));
        assert_eq!(a.find(1024).unwrap().offset, 0);
    }

    #[test]
    fn a_range_is_taken_where_asked_if_free() {
        let mut a = Allocator::default();
        a.add_segment(1024);
        assert_eq!(a.find_at(0, 256, 256).unwrap().offset, 256, "from the middle of a run");
        assert_eq!(a.free[0], vec![(0, 256), (512, 512)]);
        assert!(a.find_at(0, 128, 256).is_none(), "overlaps a taken range");
        assert!(a.find_at(0, 768, 512).is_none(), "past the segment");
        assert!(a.find_at(1, 0, 4).is_none(), "no such segment");
        assert_eq!(a.find_at(0, 0, 256).unwrap().offset, 0, "a whole run");
        assert_eq!(a.find_at(0, 512, 256).unwrap().offset, 512, "a run's start");
        assert_eq!(a.find_at(0, 896, 128).unwrap().offset, 896, "a run's end");
        assert_eq!(a.free[0], vec![(768, 128)]);
    }

    #[test]
    fn the_smallest_fitting_run_outside_a_segment_is_taken() {
        let mut a = Allocator::default();
        for _ in 0..3 {
            a.add_segment(1024);
        }
        a.find_at(0, 0, 1024).unwrap();
        a.find_at(1, 0, 512).unwrap();
        a.find_at(2, 256, 768).unwrap();
        // free: segment 1 (512, 512), segment 2 (0, 256)
        let r = a.find_best_outside(200, 0).unwrap();
        assert_eq!((r.segment, r.offset), (2, 0), "the 256-byte run, not the 512");
        let r = a.find_best_outside(300, 1);
        assert!(r.is_none(), "segment 1 is excluded and segment 2 is full");
        let r = a.find_best_outside(300, 2).unwrap();
        assert_eq!((r.segment, r.offset, r.len), (1, 512, 300));
        assert_eq!(a.free[1], vec![(812, 212)]);
        assert_eq!((a.free_outside(0), a.free_outside(1), a.free_outside(2)), (212 + 56, 56, 212));
    }

    #[test]
    fn removed_segments_are_skipped_and_reused() {
        let mut a = Allocator::default();
        a.add_segment(512);
        a.add_segment(1024);
        a.remove_segment(0);
        assert!(!a.has_room(1025) && a.has_room(1024));
        let r = a.find(256).unwrap();
        assert_eq!(r.segment, 1, "nothing comes from a removed segment");
        assert_eq!(a.add_segment(2048), 0, "a removed segment's index is reused");
        assert_eq!(a.find(2048).unwrap().segment, 0);
    }
}
