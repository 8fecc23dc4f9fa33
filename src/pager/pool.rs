//! GPU buffer pool: buffers reused by size class, every byte counted against a budget.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

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

/// A buffer from the pool; `mapped` ones were just created mapped for writing (zero-copy mode):
/// host bytes go straight into them, and they must be unmapped before a kernel uses them.
pub struct Taken {
    pub buffer: wgpu::Buffer,
    pub mapped: bool,
}

pub struct Pool {
    /// Free buffers by size class, each by its serial: the oldest is reused first, so the same
    /// sequence of takes and gives hands out the same buffers whatever order a batch of tensors
    /// was dropped in (bind groups kept over them then serve every step: `kernels::bindings`).
    free: HashMap<u64, BTreeMap<u64, wgpu::Buffer>>,
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
    pub fn new(budget: u64, retired: Rc<Cell<u64>>) -> Self {
        Pool {
            free: HashMap::new(),
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

    /// Buffers created so far.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// A buffer of at least `bytes` bytes; reuses a free one of the same class, else creates one,
    /// destroying free buffers first when the budget requires it.
    /// `mapped`: in zero-copy mode, a new buffer created mapped (for host bytes to be written
    /// straight in); otherwise a free one is reused when there is one.
    pub fn take(&mut self, device: &wgpu::Device, label: &str, bytes: u64, mapped: bool) -> Result<Taken> {
        let mapped = mapped && self.zero_copy;
        let class = size_class(bytes);
        if class > self.budget {
            return Err(Error::BudgetTooSmall { tensor: label.into(), needed: class, budget: self.budget });
        }
        if !mapped {
            if let Some((_, buffer)) = self.free.get_mut(&class).and_then(|v| v.pop_first()) {
                self.in_use += class;
                return Ok(Taken { buffer, mapped: false });
            }
        }
        while self.held + class > self.budget {
            if !self.destroy_one_free() {
                return Err(Error::BudgetTooSmall {
                    tensor: label.into(),
                    needed: self.in_use + class,
                    budget: self.budget,
                });
            }
        }
        // The driver may have less memory than the budget promises: an out-of-memory error scope
        // turns that into an `Err` the pager answers by evicting (and the trainer by shrinking
        // the micro-batch), not an abort.
        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let mut usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        if self.zero_copy {
            usage |= wgpu::BufferUsages::MAP_WRITE;
        }
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: class,
            usage,
            mapped_at_creation: mapped,
        });
        // Native wgpu answers at once; where the answer is not ready (the web), a later error
        // surfaces through the device's error handler instead.
        if let Some(Some(_)) = futures::FutureExt::now_or_never(scope.pop()) {
            return Err(Error::OutOfMemory { what: label.into(), bytes: class });
        }
        self.created += 1;
        log::trace!("pool: created {class} bytes for {label} ({} held of {})", self.held + class, self.budget);
        self.held += class;
        self.in_use += class;
        self.peak = self.peak.max(self.held);
        self.serials.insert(buffer.clone(), self.next_serial);
        self.next_serial += 1;
        Ok(Taken { buffer, mapped })
    }

    /// Returns a buffer to its free list.
    pub fn give(&mut self, buf: wgpu::Buffer) {
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

    fn destroy_one_free(&mut self) -> bool {
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

    /// Whether a buffer for `bytes` can be had without evicting a tensor.
    pub fn fits_without_eviction(&self, bytes: u64) -> bool {
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
    use super::size_class;

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
