//! GPU buffer pool: every byte counted against a budget. Tensors get buffers of their own,
//! reused by size class, or (`--gpu-pool slabs`) ranges of a few large buffers (`slabs.rs`).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use super::slabs::{Region, Slabs};
use crate::error::{Error, Result};

/// Storage buffers are sized in classes of four steps per power of two (≤ 19 % slack), so a
/// freed buffer fits the next tensor of about the same size.
pub fn size_class(bytes: u64) -> u64 {
    let bytes = bytes.max(256).div_ceil(256) * 256;
    if bytes <= 4096 {
        return bytes;
    }
    let top = 63 - bytes.leading_zeros() as u64; // floor(log2)
    let step = 1u64 << (top - 2);
    bytes.div_ceil(step) * step
}

/// How the pool gives tensors GPU memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPool {
    /// A buffer per tensor, reused by size class: destroyed and created as a full budget's
    /// tensors change size.
    Buffers,
    /// Ranges of slabs that live as long as the pool.
    Slabs,
}

impl GpuPool {
    /// `PAGETRAIN_GPU_POOL=slabs|buffers`, else buffers.
    pub fn from_env() -> GpuPool {
        GpuPool::asked().unwrap_or(GpuPool::Buffers)
    }

    /// `PAGETRAIN_GPU_POOL`, where it names a pool.
    fn asked() -> Option<GpuPool> {
        match std::env::var("PAGETRAIN_GPU_POOL").as_deref() {
            Ok("slabs") => Some(GpuPool::Slabs),
            Ok("buffers") => Some(GpuPool::Buffers),
            _ => None,
        }
    }

    /// The pool for a training run (`PAGETRAIN_GPU_POOL` where set): slabs where the products
    /// read f16 (`mixed_precision`) and a budget was asked for (`paged`), else buffers. Measured
    /// on an H100 (BENCHMARKS.md, stop 38), GPT-2 small: f16 at a quarter of its footprint 157–172
    /// → 125 ms a step in slabs, the resident f16 step 61 → 62 ms; f32 at a quarter 357–365 →
    /// 406–412 ms (more evictions to open contiguous ranges), at a tenth 561 → 504 (stop 39).
    /// Since slabs compact instead (stop 42), they move what buffers do without the driver
    /// allocations; f32 stays in buffers until a GPU says which is faster.
    pub fn for_run(mixed_precision: bool, paged: bool) -> GpuPool {
        GpuPool::choose(GpuPool::asked(), mixed_precision, paged)
    }

    fn choose(asked: Option<GpuPool>, mixed_precision: bool, paged: bool) -> GpuPool {
        asked.unwrap_or(if mixed_precision && paged { GpuPool::Slabs } else { GpuPool::Buffers })
    }
}

/// A region from the pool; `mapped` ones are buffers of their own just created mapped for
/// writing (zero-copy mode): host bytes go straight into them, and they must be unmapped before
/// a kernel uses them.
pub struct Taken {
    pub region: Region,
    pub mapped: bool,
}

pub struct Pool {
    /// Free buffers by size class, each by its serial: the oldest is reused first, so the same
    /// sequence of takes and gives hands out the same buffers whatever order a batch of tensors
    /// was dropped in (bind groups kept over them then serve every step: `kernels::bindings`).
    free: HashMap<u64, BTreeMap<u64, wgpu::Buffer>>,
    /// `Some` where tensors are ranges of slabs (not in zero-copy mode, whose buffers are each
    /// mapped on their own).
    slabs: Option<Slabs>,
    /// The adapter's largest buffer.
    max_buffer: u64,
    /// Creation serial of every buffer the pool holds.
    serials: HashMap<wgpu::Buffer, u64>,
    next_serial: u64,
    /// Buffers created so far (each a driver allocation: a pool that churns shows here).
    created: u64,
    /// Zero-copy mode (unified memory): buffers are host-visible, and those that receive host
    /// bytes are created mapped so the bytes go straight in.
    zero_copy: bool,
    /// Bytes of every buffer the pool has created and not destroyed: in use + free.
    held: u64,
    in_use: u64,
    peak: u64,
    budget: u64,
    /// Counts dropped buffers (shared with the recorder: bind groups kept over them go too).
    retired: Rc<Cell<u64>>,
}

impl Pool {
    pub fn new(budget: u64, retired: Rc<Cell<u64>>, kind: GpuPool, max_buffer: u64) -> Self {
        Pool {
            max_buffer,
            free: HashMap::new(),
            slabs: (kind == GpuPool::Slabs).then(Slabs::default),
            serials: HashMap::new(),
            next_serial: 0,
            created: 0,
            zero_copy: false,
            held: 0,
            in_use: 0,
            peak: 0,
            budget,
            retired,
        }
    }

    /// Whether buffers are made mapped and filled in place (unified memory).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    pub fn set_zero_copy(&mut self, on: bool) {
        self.zero_copy = on;
        self.trim();
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn held(&self) -> u64 {
        self.held
    }

    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Buffers created so far (slabs included).
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Slabs held now; `None` unless tensors go to slabs (`GpuPool::Slabs`, not zero-copy).
    pub fn slabs_held(&self) -> Option<usize> {
        self.slabs.as_ref().filter(|_| self.uses_slabs()).map(Slabs::count)
    }

    /// Slabs serve tensors unless buffers are mapped one by one (zero-copy).
    fn uses_slabs(&self) -> bool {
        self.slabs.is_some() && !self.zero_copy
    }

    /// Where `region` is in the slabs (`None`: a buffer of its own).
    pub fn place_of(&self, region: &Region) -> Option<(usize, u64)> {
        self.slabs.as_ref()?.place_of(region)
    }

    /// The slabs, where a tensor of `bytes` goes to one (empty otherwise).
    pub fn slabs_for(&self, bytes: u64) -> Vec<wgpu::Buffer> {
        match (self.slab_for(bytes), &self.slabs) {
            (Some(_), Some(s)) => s.buffers().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// The size of the slabs made now (`Slabs::slab_bytes` of this budget).
    pub fn slab_bytes(&self) -> u64 {
        Slabs::slab_bytes(self.budget, self.max_buffer)
    }

    /// The slab size a tensor of `bytes` goes to; `None`: a buffer of its own.
    fn slab_for(&self, bytes: u64) -> Option<u64> {
        let slab = self.slab_bytes();
        (self.uses_slabs() && Slabs::footprint(bytes) <= slab).then_some(slab)
    }

    /// A region of at least `bytes` bytes: a free range of a slab (at `hint`, the place
    /// [`Pool::place_of`] gave for the tensor's last region, where that is free: the same
    /// placements step after step keep their bind groups), or a free buffer of the same class,
    /// else a new slab or buffer, destroying free ones first when the budget requires it.
    /// `mapped`: in zero-copy mode, a new buffer created mapped (for host bytes to be written
    /// straight in); otherwise a free one is reused when there is one.
    pub fn take(
        &mut self,
        device: &wgpu::Device,
        label: &str,
        bytes: u64,
        mapped: bool,
        hint: Option<(usize, u64)>,
    ) -> Result<Taken> {
        let mapped = mapped && self.zero_copy;
        if let Some(slab) = self.slab_for(bytes) {
            let region = self.take_from_slab(device, label, bytes, slab, hint)?;
            return Ok(Taken { region, mapped: false });
        }
        let class = size_class(bytes);
        if class > self.budget {
            return Err(Error::BudgetTooSmall { tensor: label.into(), needed: class, budget: self.budget });
        }
        if !mapped {
            if let Some((_, buffer)) = self.free.get_mut(&class).and_then(|v| v.pop_first()) {
                self.in_use += class;
                return Ok(Taken { region: Region { buffer, offset: 0, size: class }, mapped: false });
            }
        }
        self.make_room(label, class)?;
        let mut usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        if self.zero_copy {
            usage |= wgpu::BufferUsages::MAP_WRITE;
        }
        let buffer = self.create(device, label, class, usage, mapped)?;
        self.in_use += class;
        Ok(Taken { region: Region { buffer, offset: 0, size: class }, mapped })
    }

    /// A range of a slab: at `hint` if free, else the first free one, else one of a new slab
    /// of `size` bytes where the budget has room.
    fn take_from_slab(
        &mut self,
        device: &wgpu::Device,
        label: &str,
        bytes: u64,
        size: u64,
        hint: Option<(usize, u64)>,
    ) -> Result<Region> {
        let len = Slabs::footprint(bytes);
        let slabs = self.slabs.as_mut().expect("slab mode");
        if let Some(region) = hint.and_then(|h| slabs.find_at(h, len)).or_else(|| slabs.find(len)) {
            self.in_use += len;
            return Ok(region);
        }
        self.make_room(label, size)?;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let buffer = self.create(device, "pool slab", size, usage, false)?;
        let slabs = self.slabs.as_mut().expect("slab mode");
        slabs.add(buffer);
        let region = slabs.find(len).expect("a fresh slab fits");
        self.in_use += len;
        Ok(region)
    }

    /// A free range the size of `region` (a slab's) in another slab, for its tensor to move to:
    /// no eviction, no new slab.
    pub fn take_away_from(&mut self, region: &Region) -> Option<Region> {
        let moved = self.slabs.as_mut()?.find_away_from(region)?;
        self.in_use += moved.size;
        Some(moved)
    }

    /// Free bytes in the slabs other than `slab`.
    pub fn free_outside(&self, slab: &wgpu::Buffer) -> u64 {
        self.slabs.as_ref().map_or(0, |s| s.free_outside(slab))
    }

    /// Destroys free buffers and empty slabs until `bytes` more fit the budget.
    fn make_room(&mut self, label: &str, bytes: u64) -> Result<()> {
        while self.held + bytes > self.budget {
            if !self.destroy_one_free() {
                return Err(Error::BudgetTooSmall {
                    tensor: label.into(),
                    needed: self.in_use + bytes,
                    budget: self.budget,
                });
            }
        }
        Ok(())
    }

    /// A new buffer of `size` bytes, counted as held.
    fn create(
        &mut self,
        device: &wgpu::Device,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        mapped: bool,
    ) -> Result<wgpu::Buffer> {
        // The driver may have less memory than the budget promises: an out-of-memory error scope
        // turns that into an `Err` the pager answers by evicting (and the trainer by shrinking
        // the micro-batch), not an abort.
        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: mapped,
        });
        // Native wgpu answers at once; where the answer is not ready (the web), a later error
        // surfaces through the device's error handler instead.
        if let Some(Some(_)) = futures::FutureExt::now_or_never(scope.pop()) {
            return Err(Error::OutOfMemory { what: label.into(), bytes: size });
        }
        self.created += 1;
        log::trace!("pool: created {size} bytes for {label} ({} held of {})", self.held + size, self.budget);
        self.held += size;
        self.peak = self.peak.max(self.held);
        self.serials.insert(buffer.clone(), self.next_serial);
        self.next_serial += 1;
        Ok(buffer)
    }

    /// Returns a region: a slab's range to its slab, a buffer to its free list.
    pub fn give(&mut self, region: Region) {
        if self.slabs.as_mut().is_some_and(|s| s.release(&region)) {
            self.in_use -= region.size;
            return;
        }
        let buf = region.buffer;
        let class = buf.size();
        self.in_use -= class;
        let serial = match self.serials.get(&buf) {
            Some(&s) => s,
            None => {
                // Not made here (cannot happen today): give it a serial of its own.
                self.next_serial += 1;
                self.serials.insert(buf.clone(), self.next_serial - 1);
                self.next_serial - 1
            }
        };
        self.free.entry(class).or_default().insert(serial, buf);
    }

    /// Drops a free buffer (the largest) or an empty slab; `false` if there is neither.
    fn destroy_one_free(&mut self) -> bool {
        if let Some(slab) = self.slabs.as_mut().and_then(Slabs::drop_empty) {
            log::trace!("pool: destroyed an empty slab of {} bytes", slab.size());
            self.serials.remove(&slab);
            self.held -= slab.size();
            self.retired.set(self.retired.get() + 1);
            return true;
        }
        let Some((&class, _)) = self.free.iter().filter(|(_, v)| !v.is_empty()).max_by_key(|(c, _)| **c) else {
            return false;
        };
        // Dropped, not destroyed: commands recorded but not yet submitted may still use it, and
        // wgpu frees it once they are done.
        if let Some((_, buf)) = self.free.get_mut(&class).and_then(|v| v.pop_last()) {
            self.serials.remove(&buf);
            log::trace!("pool: destroyed a free buffer of {class} bytes");
            self.held -= class;
            self.retired.set(self.retired.get() + 1);
            return true;
        }
        false
    }

    /// Whether a region for `bytes` can be had without evicting a tensor.
    pub fn fits_without_eviction(&self, bytes: u64) -> bool {
        if let (Some(slab), Some(slabs)) = (self.slab_for(bytes), self.slabs.as_ref()) {
            return slabs.has_room(Slabs::footprint(bytes)) || self.held + slab <= self.budget;
        }
        let class = size_class(bytes);
        self.free.get(&class).is_some_and(|v| !v.is_empty()) || self.held + class <= self.budget
    }

    pub fn set_budget(&mut self, budget: u64) {
        self.budget = budget;
        while self.held > self.budget && self.destroy_one_free() {}
    }

    /// Destroys every free buffer (e.g. after a phase that needed many temporaries).
    pub fn trim(&mut self) {
        while self.destroy_one_free() {}
    }
}

#[cfg(test)]
mod tests {
    use super::{size_class, GpuPool};

    #[test]
    fn runs_page_f16_products_in_slabs_unless_told_otherwise() {
        use GpuPool::{Buffers, Slabs};
        assert_eq!(GpuPool::choose(None, true, true), Slabs);
        assert_eq!(GpuPool::choose(None, true, false), Buffers, "resident f16");
        assert_eq!(GpuPool::choose(None, false, true), Buffers, "paged f32");
        assert_eq!(GpuPool::choose(Some(Buffers), true, true), Buffers);
        assert_eq!(GpuPool::choose(Some(Slabs), false, false), Slabs);
    }

    #[test]
    fn size_classes_cover_request_with_bounded_slack() {
        for bytes in [1u64, 255, 256, 257, 4095, 4097, 10_000, 1 << 20, (1 << 20) + 1, 123_456_789] {
            let c = size_class(bytes);
            assert!(c >= bytes, "{bytes} -> {c}");
            assert_eq!(c % 256, 0);
            if bytes > 4096 {
                assert!((c as f64) < bytes as f64 * 1.26, "{bytes} -> {c}");
            }
        }
    }
}
