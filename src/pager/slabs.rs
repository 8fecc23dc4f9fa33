//! The GPU pool's slabs (`--gpu-pool slabs`): tensors as ranges of a few large buffers that live
//! as long as the pool, so a paged step makes and frees no driver allocation once warm.
//!
//! With a buffer per tensor, a budget that is full turns every placement of a tensor of a new
//! size into a free buffer destroyed and another created; on an H200 that was 84 buffers a step
//! for GPT-2 at a quarter budget and 37 % of the main thread in the driver's memory calls
//! (BENCHMARKS.md, round 20). The price of sharing buffers: wgpu tracks usage per buffer, and a
//! buffer bound read-only and read-write in one dispatch is a conflict, so a dispatch whose
//! inputs share a slab with its outputs runs a pipeline with every storage binding declared
//! read-write (`Recorder::set_tensors_share_buffers`).

use std::collections::HashMap;

use super::host::HostRange;
use super::ranges::Allocator;

/// The budget is cut into this many slabs, and a tensor larger than one gets a buffer of its
/// own. One slab the size of the budget would fragment: the tensors an op holds (an AdamW update
/// holds four) can sit so that no gap fits the next one, and no copy can move a tensor within its
/// own buffer. With several, evicting what is not held empties some, and a range is opened by
/// moving tensors into the other slabs' gaps (`eviction.rs`). Measured with the 1/16 model of
/// GPT-2 small's paged step (`examples/paging_proxy.rs`, BENCHMARKS.md stop 42): quarters move
/// what buffers of their own do (f16 at a tenth of the footprint: 75.8 MB up a step against
/// 92.0 with eighths), and the head's logits chunk (an eighth of the budget) fits one.
pub const SLABS_PER_BUDGET: u64 = 4;

/// Offsets in a slab are multiples of this (wgpu's storage binding offset alignment is at most
/// 256 bytes).
pub const SLAB_ALIGN: u64 = 256;

/// Where a tensor lives on the GPU: `size` bytes at `offset` of `buffer` (a buffer of its own at
/// offset 0, or a range of a slab).
#[derive(Clone, Debug)]
pub struct Region {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

#[derive(Default)]
pub struct Slabs {
    buffers: Vec<Option<wgpu::Buffer>>,
    index: HashMap<wgpu::Buffer, usize>,
    ranges: Allocator,
}

impl Slabs {
    /// The size of a slab under `budget`: a quarter of it, at most the adapter's largest buffer.
    /// Tensors larger than that get buffers of their own.
    pub fn slab_bytes(budget: u64, max_buffer: u64) -> u64 {
        (budget / SLABS_PER_BUDGET).min(max_buffer) / SLAB_ALIGN * SLAB_ALIGN
    }

    /// Bytes a tensor of `bytes` takes in a slab.
    pub fn footprint(bytes: u64) -> u64 {
        bytes.max(1).div_ceil(SLAB_ALIGN) * SLAB_ALIGN
    }

    /// A free range of `len` bytes (a [`Slabs::footprint`]), first fit.
    pub fn find(&mut self, len: u64) -> Option<Region> {
        let r = self.ranges.find(usize::try_from(len).ok()?)?;
        let buffer = self.buffers[r.segment].clone().expect("live slab");
        Some(Region { buffer, offset: r.offset as u64, size: len })
    }

    /// A free range the size of `region` in a slab other than its own, the smallest that fits
    /// (where the tensor in `region` can move: a GPU copy cannot stay within one buffer).
    pub fn find_away_from(&mut self, region: &Region) -> Option<Region> {
        let &from = self.index.get(&region.buffer)?;
        let r = self.ranges.find_best_outside(usize::try_from(region.size).ok()?, from)?;
        let buffer = self.buffers[r.segment].clone().expect("live slab");
        Some(Region { buffer, offset: r.offset as u64, size: region.size })
    }

    /// Free bytes in the slabs other than `slab`: what its tensors could move to.
    pub fn free_outside(&self, slab: &wgpu::Buffer) -> u64 {
        self.index.get(slab).map_or(0, |&i| self.ranges.free_outside(i) as u64)
    }

    /// Where `region` is: its slab's index and offset (`None`: not a slab's). A hint for the
    /// next placement of the same tensor ([`Slabs::find_at`]).
    pub fn place_of(&self, region: &Region) -> Option<(usize, u64)> {
        self.index.get(&region.buffer).map(|&i| (i, region.offset))
    }

    /// `len` bytes at a place [`Slabs::place_of`] gave, if they are free now.
    pub fn find_at(&mut self, (slab, offset): (usize, u64), len: u64) -> Option<Region> {
        self.ranges.find_at(slab, usize::try_from(offset).ok()?, usize::try_from(len).ok()?)?;
        let buffer = self.buffers[slab].clone().expect("a live slab has free ranges");
        Some(Region { buffer, offset, size: len })
    }

    pub fn has_room(&self, len: u64) -> bool {
        usize::try_from(len).is_ok_and(|l| self.ranges.has_room(l))
    }

    pub fn add(&mut self, buffer: wgpu::Buffer) {
        let i = self.ranges.add_segment(buffer.size() as usize);
        if i == self.buffers.len() {
            self.buffers.push(None);
        }
        self.index.insert(buffer.clone(), i);
        self.buffers[i] = Some(buffer);
    }

    /// Takes `region` back if it is a slab's (`false`: a buffer of its own).
    pub fn release(&mut self, region: &Region) -> bool {
        let Some(&segment) = self.index.get(&region.buffer) else { return false };
        self.ranges.release(HostRange { segment, offset: region.offset as usize, len: region.size as usize });
        true
    }

    /// Forgets one slab with nothing in it and returns it; `None` if every slab holds a tensor.
    pub fn drop_empty(&mut self) -> Option<wgpu::Buffer> {
        let i = (0..self.buffers.len()).find(|&i| self.buffers[i].is_some() && self.ranges.is_free(i))?;
        self.ranges.remove_segment(i);
        let buffer = self.buffers[i].take().expect("checked");
        self.index.remove(&buffer);
        Some(buffer)
    }

    /// Every slab held.
    pub fn buffers(&self) -> impl Iterator<Item = &wgpu::Buffer> {
        self.buffers.iter().flatten()
    }

    /// Slabs made and not dropped.
    pub fn count(&self) -> usize {
        self.index.len()
    }
}
