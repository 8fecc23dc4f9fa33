//! A host store in pinned host memory (the `cudaHostAlloc` analogue, Vulkan through wgpu-hal):
//! each segment is a buffer over host-visible, host-cached memory that the GPU copies to and
//! from by DMA, so uploads and write-backs of its tensors need no staging copy and no copy
//! threads ([`super::dma`]). The CPU reads and writes it as ordinary cached memory.
//!
//! A segment the driver will not pin (out of pinnable memory, or larger than a buffer may be)
//! is ordinary memory instead, and its tensors go through the staging rings; the store says so.

use super::host::{aligned, Allocator, HostRange, HostStore, SEGMENT_BYTES};
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

    fn new_segment(&mut self, size: usize) -> Segment {
        if self.refused.is_none() {
            let label = format!("pinned store segment {}", self.segments.len());
            let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
            let made = if size as u64 > self.max_buffer {
                Err(format!("a {size}-byte segment is larger than a buffer may be"))
            } else {
                self.pinned.create(&label, size as u64, usage)
            };
            match made {
                Ok(b) => {
                    // Vulkan leaves new memory undefined; the store hands out zeros, as `MemStore` does.
                    // SAFETY: `b` maps `size` bytes for as long as it lives, and nothing else uses them yet.
                    unsafe { std::ptr::write_bytes(b.as_ptr(), 0, size) };
                    return Segment::Pinned(b);
                }
                Err(why) => self.refused = Some(why),
            }
        }
        Segment::Plain(vec![0; size])
    }
}

impl HostStore for PinnedStore {
    fn alloc(&mut self, len: usize) -> Result<HostRange> {
        let len = aligned(len);
        if let Some(r) = self.alloc.find(len) {
            return Ok(r);
        }
        let size = len.max(SEGMENT_BYTES);
        let segment = self.new_segment(size);
        self.segments.push(segment);
        self.alloc.add_segment(size);
        self.alloc.find(len).ok_or_else(|| Error::invalid("pinned store", format!("{len} bytes do not fit a new segment")))
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

    fn is_pinned(&self) -> bool {
        true
    }

    fn capacity(&self) -> usize {
        self.alloc.sizes.iter().sum()
    }

    fn describe(&self) -> String {
        let plain: usize =
            self.segments.iter().filter(|s| matches!(s, Segment::Plain(_))).map(Segment::len).sum::<usize>() >> 20;
        let mut d = format!("pinned memory ({} MiB, {})", self.capacity() >> 20, self.pinned.what);
        if let Some(why) = &self.refused {
            d.push_str(&format!("; {plain} MiB not pinned: {why}"));
        }
        d
    }
}
