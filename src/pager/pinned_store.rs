//! A host store in pinned host memory (the `cudaHostAlloc` analogue, Vulkan through wgpu-hal):
//! segments become buffers over host-visible, host-cached memory that the GPU copies to and from
//! by DMA, so uploads and write-backs of their tensors need no staging copy and no copy threads
//! ([`super::dma`]). The CPU reads and writes them as ordinary cached memory.
//!
//! A segment is pinned the first time the pager wants a DMA on it (its bytes copied over once):
//! a run that never pages pins nothing (pinning a GPT-2's 9 GB up front added ~7 s before its
//! first step on an H200). A segment the driver will not pin (out of pinnable memory, or larger
//! than a buffer may be) stays ordinary memory, its tensors go through the staging rings, and
//! the store says so.

use super::host::{aligned, HostRange, HostStore, SEGMENT_BYTES};
use super::ranges::Allocator;
use crate::error::{Error, Result};
use crate::vulkan_hal::{PinnedAllocator, PinnedBuffer};

enum Segment {
    Pinned(PinnedBuffer),
    Plain(Vec<u8>),
}

impl Segment {
    fn len(&self) -> usize {
        match self {
            Segment::Pinned(b) => b.buffer.size() as usize,
            Segment::Plain(v) => v.len(),
        }
    }
}

/// Tensors in pinned host memory.
pub struct PinnedStore {
    pinned: PinnedAllocator,
    max_buffer: u64,
    segments: Vec<Segment>,
    alloc: Allocator,
    /// Why the last segment could not be pinned (later ones are not tried).
    refused: Option<String>,
}

impl PinnedStore {
    /// A pinned store on `device`, or why there can be none (not Vulkan, no such memory).
    pub fn new(device: &wgpu::Device) -> std::result::Result<PinnedStore, String> {
        Ok(PinnedStore {
            pinned: PinnedAllocator::new(device)?,
            max_buffer: device.limits().max_buffer_size,
            segments: Vec::new(),
            alloc: Allocator::default(),
            refused: None,
        })
    }

    fn segment(&self, r: &HostRange) -> Result<&Segment> {
        let s = self
            .segments
            .get(r.segment)
            .ok_or_else(|| Error::invalid("host range", format!("{r:?}: no such segment")))?;
        if r.offset + r.len > s.len() {
            return Err(Error::invalid("host range", format!("{r:?} runs past its segment of {} bytes", s.len())));
        }
        Ok(s)
    }

    /// Pins segment `i` (its bytes copied into pinned memory); false where the driver refuses.
    fn pin_segment(&mut self, i: usize) -> bool {
        let size = match &self.segments[i] {
            Segment::Pinned(_) => return true,
            Segment::Plain(v) => v.len(),
        };
        if self.refused.is_some() {
            return false;
        }
        let label = format!("pinned store segment {i}");
        let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let made = if size as u64 > self.max_buffer {
            Err(format!("a {size}-byte segment is larger than a buffer may be"))
        } else {
            self.pinned.create(&label, size as u64, usage)
        };
        match made {
            Ok(b) => {
                if let Segment::Plain(v) = &self.segments[i] {
                    // SAFETY: `b` maps `size` bytes for as long as it lives, nothing else uses them
                    // yet, and `v` is `size` bytes long and a different allocation.
                    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), b.as_ptr(), size) };
                }
                self.segments[i] = Segment::Pinned(b);
                true
            }
            Err(why) => {
                self.refused = Some(why);
                false
            }
        }
    }
}

impl HostStore for PinnedStore {
    fn alloc(&mut self, len: usize) -> Result<HostRange> {
        let len = aligned(len);
        if let Some(r) = self.alloc.find(len) {
            return Ok(r);
        }
        let size = len.max(SEGMENT_BYTES);
        self.segments.push(Segment::Plain(vec![0; size]));
        self.alloc.add_segment(size);
        self.alloc
            .find(len)
            .ok_or_else(|| Error::invalid("pinned store", format!("{len} bytes do not fit a new segment")))
    }

    fn free(&mut self, r: HostRange) {
        self.alloc.release(r);
    }

    fn bytes(&self, r: &HostRange) -> Result<&[u8]> {
        Ok(match self.segment(r)? {
            // SAFETY: the range lies inside the segment's mapping (checked above), which lives as
            // long as the store; the returned borrow of `self` keeps `bytes_mut` away meanwhile.
            Segment::Pinned(b) => unsafe { std::slice::from_raw_parts(b.as_ptr().add(r.offset), r.len) },
            Segment::Plain(v) => &v[r.offset..r.offset + r.len],
        })
    }

    fn bytes_mut(&mut self, r: &HostRange) -> Result<&mut [u8]> {
        self.segment(r)?;
        Ok(match &mut self.segments[r.segment] {
            // SAFETY: as in `bytes`, and `&mut self` makes this the only borrow of the store.
            Segment::Pinned(b) => unsafe { std::slice::from_raw_parts_mut(b.as_ptr().add(r.offset), r.len) },
            Segment::Plain(v) => &mut v[r.offset..r.offset + r.len],
        })
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn dma(&self, r: &HostRange) -> Option<(wgpu::Buffer, u64)> {
        match self.segment(r).ok()? {
            Segment::Pinned(b) => Some((b.buffer.clone(), r.offset as u64)),
            Segment::Plain(_) => None,
        }
    }

    fn pin(&mut self, r: &HostRange) -> bool {
        self.segment(r).is_ok() && self.pin_segment(r.segment)
    }

    /// Until the driver refuses a segment (then the rings take the rest).
    fn is_pinned(&self) -> bool {
        self.refused.is_none()
    }

    fn capacity(&self) -> usize {
        self.alloc.sizes.iter().sum()
    }

    fn describe(&self) -> String {
        let plain: usize =
            self.segments.iter().filter(|s| matches!(s, Segment::Plain(_))).map(Segment::len).sum::<usize>() >> 20;
        let mut d = format!(
            "pinned memory as the GPU pages it ({} MiB, {plain} MiB not pinned yet; {})",
            self.capacity() >> 20,
            self.pinned.what
        );
        if let Some(why) = &self.refused {
            d.push_str(&format!("; the driver pins no more: {why}"));
        }
        d
    }
}
