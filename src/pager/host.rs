//! Host stores: where every tensor's bytes truly live. `MmapStore` maps files in a run directory
//! (RAM is the OS page cache, the SSD the tier below); `MemStore` keeps them in memory (wasm,
//! tests). Both carve tensors out of large segments with a first-fit free list.

#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};

use super::ranges::Allocator;
#[cfg(not(target_arch = "wasm32"))]
use crate::error::Error;
use crate::error::Result;

/// Host byte ranges are aligned to this (≥ wgpu's copy and map alignments).
pub const HOST_ALIGN: usize = 256;
/// Segments are at least this large; a bigger tensor gets a segment of its own size.
pub const SEGMENT_BYTES: usize = 64 << 20;

/// Bytes of one tensor in a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostRange {
    pub segment: usize,
    pub offset: usize,
    pub len: usize,
}

/// The host side of the pager.
pub trait HostStore {
    /// Reserves `len` bytes (contents undefined). Disk space is claimed now, so a full disk is
    /// an error here rather than a fault when the bytes are written later.
    fn alloc(&mut self, len: usize) -> Result<HostRange>;
    fn free(&mut self, r: HostRange);
    /// The bytes of `r`, checked to still be backed (a truncated file is an error, not a fault).
    fn bytes(&self, r: &HostRange) -> Result<&[u8]>;
    fn bytes_mut(&mut self, r: &HostRange) -> Result<&mut [u8]>;
    /// Makes the backing files hold every value written so far.
    fn flush(&mut self) -> Result<()>;
    /// Several disjoint ranges at once, mutably (the host optimizer updates a parameter, its
    /// moments and reads its gradient in place).
    fn bytes_mut_many(&mut self, ranges: &[HostRange]) -> Result<Vec<&mut [u8]>> {
        for (i, a) in ranges.iter().enumerate() {
            for b in &ranges[i + 1..] {
                let apart = a.segment != b.segment || a.offset + a.len <= b.offset || b.offset + b.len <= a.offset;
                if !apart {
                    return Err(crate::error::Error::invalid("host ranges", format!("{a:?} and {b:?} overlap")));
                }
            }
        }
        let mut raw = Vec::with_capacity(ranges.len());
        for r in ranges {
            let s = self.bytes_mut(r)?;
            raw.push((s.as_mut_ptr(), s.len()));
        }
        // SAFETY: the ranges were checked to be pairwise disjoint, each pointer came from a live
        // `&mut [u8]` of this store, and the store stays mutably borrowed (so nothing can move
        // or free its memory) for as long as the returned slices live.
        Ok(raw.into_iter().map(|(p, n)| unsafe { std::slice::from_raw_parts_mut(p, n) }).collect())
    }
    /// Fraction of `r`'s pages in RAM (1.0 where the store cannot tell).
    fn ram_fraction(&self, _r: &HostRange) -> f32 {
        1.0
    }
    /// Hints that `r` will be read soon (starts reading it from disk).
    fn will_need(&self, _r: &HostRange) {}
    /// Where the GPU can copy `r`'s bytes to and from directly (a buffer over pinned host memory
    /// and the offset of `r` in it), so transfers need no staging copy. `None`: not pinned (yet).
    fn dma(&self, _r: &HostRange) -> Option<(wgpu::Buffer, u64)> {
        None
    }
    /// Pins the memory holding `r` for DMA if it is not yet (the caller has let every
    /// background copy into or out of the store finish: the bytes may move); false where it
    /// cannot be.
    fn pin(&mut self, _r: &HostRange) -> bool {
        false
    }
    /// Whether the store's memory can be pinned for the GPU (`pin`, then `dma`, answer for its
    /// ranges).
    fn is_pinned(&self) -> bool {
        false
    }
    /// Bytes reserved in all segments.
    fn capacity(&self) -> usize;
    fn describe(&self) -> String;
}

pub(super) fn aligned(len: usize) -> usize {
    len.max(1).div_ceil(HOST_ALIGN) * HOST_ALIGN
}

/// Tensors in memory.
#[derive(Default)]
pub struct MemStore {
    segments: Vec<Vec<u8>>,
    alloc: Allocator,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl HostStore for MemStore {
    fn alloc(&mut self, len: usize) -> Result<HostRange> {
        let len = aligned(len);
        if let Some(r) = self.alloc.find(len) {
            return Ok(r);
        }
        let size = len.max(SEGMENT_BYTES);
        self.segments.push(vec![0; size]);
        self.alloc.add_segment(size);
        Ok(self.alloc.find(len).expect("fresh segment fits"))
    }

    fn free(&mut self, r: HostRange) {
        self.alloc.release(r);
    }

    fn bytes(&self, r: &HostRange) -> Result<&[u8]> {
        Ok(&self.segments[r.segment][r.offset..r.offset + r.len])
    }

    fn bytes_mut(&mut self, r: &HostRange) -> Result<&mut [u8]> {
        Ok(&mut self.segments[r.segment][r.offset..r.offset + r.len])
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn capacity(&self) -> usize {
        self.alloc.sizes.iter().sum()
    }

    fn describe(&self) -> String {
        format!("memory ({} MiB)", self.capacity() >> 20)
    }
}

/// Tensors in memory-mapped files `seg-NNNNN.bin` under a directory.
#[cfg(not(target_arch = "wasm32"))]
pub struct MmapStore {
    dir: PathBuf,
    /// No other store (another run with the same `--out`) writes these files while we live.
    _lock: crate::lock::DirLock,
    segment_bytes: usize,
    segments: Vec<Segment>,
    alloc: Allocator,
}

#[cfg(not(target_arch = "wasm32"))]
struct Segment {
    path: PathBuf,
    file: std::fs::File,
    map: memmap2::MmapMut,
}

#[cfg(not(target_arch = "wasm32"))]
impl MmapStore {
    /// A store in `dir` (created if missing and locked for this store alone: an error naming the
    /// holder's pid while another process uses it; segment files of an earlier store are replaced).
    pub fn new(dir: &Path) -> Result<Self> {
        Self::with_segment_bytes(dir, SEGMENT_BYTES)
    }

    /// A store whose segment files are at least `segment_bytes` large.
    pub fn with_segment_bytes(dir: &Path, segment_bytes: usize) -> Result<Self> {
        let lock = crate::lock::DirLock::acquire(dir, "host store")?;
        let segment_bytes = segment_bytes.max(HOST_ALIGN);
        Ok(MmapStore {
            dir: dir.to_path_buf(),
            _lock: lock,
            segment_bytes,
            segments: Vec::new(),
            alloc: Allocator::default(),
        })
    }

    /// The file behind segment `i`.
    pub fn segment_path(&self, i: usize) -> Option<&Path> {
        self.segments.get(i).map(|s| s.path.as_path())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn add_segment(&mut self, size: usize) -> Result<()> {
        let path = self.dir.join(format!("seg-{:05}.bin", self.segments.len()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        reserve(&file, size).map_err(|e| Error::io(&path, e))?;
        // SAFETY: the file is ours (created and truncated above, the directory locked) and sized
        // before mapping; anyone touching it underneath is detected by `check` before each access.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| Error::io(&path, e))?;
        self.segments.push(Segment { path, file, map });
        self.alloc.add_segment(size);
        Ok(())
    }

    /// Errors (instead of a SIGBUS later) when the segment's file no longer covers `r`.
    fn check(&self, r: &HostRange) -> Result<()> {
        let seg = &self.segments[r.segment];
        let len = seg.file.metadata().map_err(|e| Error::io(&seg.path, e))?.len() as usize;
        if len < r.offset + r.len {
            return Err(Error::Io {
                path: seg.path.clone(),
                source: std::io::Error::other(format!(
                    "store file was truncated underneath to {len} bytes; tensor bytes {}..{} are gone",
                    r.offset,
                    r.offset + r.len
                )),
            });
        }
        Ok(())
    }
}

/// Claims disk blocks for `size` bytes so later writes through the map cannot hit a full disk.
#[cfg(all(not(target_arch = "wasm32"), target_os = "linux"))]
fn reserve(file: &std::fs::File, size: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a file descriptor we own.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

#[cfg(all(not(target_arch = "wasm32"), not(target_os = "linux")))]
fn reserve(file: &std::fs::File, size: usize) -> std::io::Result<()> {
    file.set_len(size as u64)
}

#[cfg(not(target_arch = "wasm32"))]
impl HostStore for MmapStore {
    fn alloc(&mut self, len: usize) -> Result<HostRange> {
        let len = aligned(len);
        if let Some(r) = self.alloc.find(len) {
            return Ok(r);
        }
        self.add_segment(len.max(self.segment_bytes))?;
        Ok(self.alloc.find(len).expect("fresh segment fits"))
    }

    fn free(&mut self, r: HostRange) {
        self.alloc.release(r);
    }

    fn bytes(&self, r: &HostRange) -> Result<&[u8]> {
        self.check(r)?;
        Ok(&self.segments[r.segment].map[r.offset..r.offset + r.len])
    }

    fn bytes_mut(&mut self, r: &HostRange) -> Result<&mut [u8]> {
        self.check(r)?;
        Ok(&mut self.segments[r.segment].map[r.offset..r.offset + r.len])
    }

    fn flush(&mut self) -> Result<()> {
        for seg in &self.segments {
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                let ours = seg.file.metadata().map_err(|e| Error::io(&seg.path, e))?.ino();
                match std::fs::metadata(&seg.path) {
                    Ok(m) if m.ino() == ours => {}
                    _ => {
                        return Err(Error::Io {
                            path: seg.path.clone(),
                            source: std::io::Error::other(
                                "store file was deleted or replaced underneath; its values cannot be made durable",
                            ),
                        })
                    }
                }
            }
            seg.map.flush().map_err(|e| Error::io(&seg.path, e))?;
        }
        Ok(())
    }

    fn ram_fraction(&self, r: &HostRange) -> f32 {
        resident_fraction(&self.segments[r.segment].map[r.offset..r.offset + r.len])
    }

    fn will_need(&self, r: &HostRange) {
        #[cfg(unix)]
        let _ = self.segments[r.segment].map.advise_range(memmap2::Advice::WillNeed, r.offset, r.len);
        #[cfg(not(unix))]
        let _ = r;
    }

    fn capacity(&self) -> usize {
        self.alloc.sizes.iter().sum()
    }

    fn describe(&self) -> String {
        format!("mmap files in {} ({} MiB)", self.dir.display(), self.capacity() >> 20)
    }
}

/// Fraction of the pages under `bytes` that are in RAM (mincore).
#[cfg(all(not(target_arch = "wasm32"), unix))]
fn resident_fraction(bytes: &[u8]) -> f32 {
    if bytes.is_empty() {
        return 1.0;
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = bytes.as_ptr() as usize / page * page;
    let end = bytes.as_ptr() as usize + bytes.len();
    let pages = (end - start).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: [start, end) lies inside a live mapping (page-aligned down from a slice of it), and
    // `vec` has one byte per page as mincore requires.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr() as *mut _) };
    if rc != 0 {
        return 1.0;
    }
    vec.iter().filter(|&&b| b & 1 == 1).count() as f32 / pages as f32
}

#[cfg(all(not(target_arch = "wasm32"), not(unix)))]
fn resident_fraction(_bytes: &[u8]) -> f32 {
    1.0
}
