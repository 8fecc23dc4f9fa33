//! How host bytes reach GPU buffers, chosen at start-up by measuring the paths the adapter
//! offers: the staging ring of `MAP_WRITE` buffers (every adapter; on a discrete GPU these sit
//! in VRAM behind the BAR, so the copy threads' memcpy is the PCIe transfer), the ring in
//! pinned host memory (Vulkan: the GPU pulls the bytes by DMA in `copy_buffer_to_buffer`), and
//! zero-copy into host-visible pool buffers (unified memory). The choice says why.

use super::{staging, Pager};
use crate::clock::Stopwatch;
use crate::error::{Error, Result};

/// How host bytes reach GPU buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UploadPath {
    /// Through the staging ring of `MAP_WRITE` buffers and a GPU copy (every adapter).
    Ring,
    /// Through a staging ring in pinned host memory and a GPU copy, by DMA (Vulkan only; the
    /// mapped ring where unavailable).
    Pinned,
    /// Straight into host-visible GPU buffers created mapped (unified memory only).
    ZeroCopy,
    /// The fastest of those the adapter offers, measured at start-up; without unified memory
    /// the mapped ring (see `measure_and_pick`).
    Auto,
}

impl UploadPath {
    /// How the pager's texts name the path.
    pub fn name(self) -> &'static str {
        match self {
            UploadPath::Ring => "staging ring",
            UploadPath::Pinned => "pinned host memory",
            UploadPath::ZeroCopy => "zero-copy",
            UploadPath::Auto => "auto",
        }
    }
}

/// Bytes each path moves in the start-up measurement (best of two): enough on a GPU for the
/// copies to stream as paging does (the pinned ring overlaps memcpy and DMA only over many
/// slots), little on CPU adapters where every context pays for it.
fn probe_bytes(gpu: &crate::device::Gpu) -> usize {
    match gpu.info.device_type {
        wgpu::DeviceType::Cpu => 16 << 20,
        _ => 256 << 20,
    }
}

impl Pager {
    /// Switches to `want` (or, for `Auto`, the fastest measured path) and records why.
    pub(super) fn choose_upload_path(&self, want: UploadPath) {
        let pinned_why = self.pinned_unavailable();
        let unified = self.gpu.unified_memory();
        let (path, why) = match want {
            UploadPath::Ring => (UploadPath::Ring, "staging ring (asked for)".to_string()),
            UploadPath::Pinned => match &pinned_why {
                None => (UploadPath::Pinned, format!("pinned host memory (asked for; {})", self.pinned_what())),
                Some(no) => (UploadPath::Ring, format!("staging ring (no pinned memory: {no})")),
            },
            UploadPath::ZeroCopy if unified => (UploadPath::ZeroCopy, "zero-copy (asked for)".to_string()),
            UploadPath::ZeroCopy => (UploadPath::Ring, "staging ring (no unified memory on this adapter)".to_string()),
            UploadPath::Auto => self.measure_and_pick(pinned_why.is_none(), unified, pinned_why.as_deref()),
        };
        let either = matches!(path, UploadPath::Ring | UploadPath::Pinned);
        self.upload_trial.set(want == UploadPath::Auto && either && !unified && pinned_why.is_none());
        self.use_path(path);
        *self.upload_choice.borrow_mut() = (path, why);
    }

    /// Times every path on offer and keeps the fastest. Without unified memory (a discrete
    /// GPU) nothing is measured here: how a path does alone says little about a paged step, and
    /// a paged run times its steps both ways (`train::upload_trial`). It starts by DMA where the
    /// host store is itself pinned memory (no copy on the host either way it goes), else on the
    /// mapped ring: its PCIe transfer is the copy threads' memcpy, which runs beside the kernels,
    /// while a pinned ring's DMA copies run on wgpu's one queue in line with them. Measured on an
    /// H200 (2026-12-01): pinned 38 GB/s vs ring 31 GB/s alone, yet GPT-2 small at a quarter
    /// budget stepped in 581 ms through a pinned ring vs 513 ms on the mapped one. From a pinned
    /// store (H100, 2026-12-06, f16): at a tenth 120.3 ms by DMA against 130.7 on the ring, and
    /// 139.8 where the trial began on the ring and kept it (its write-backs still by DMA).
    fn measure_and_pick(&self, pinned: bool, unified: bool, pinned_why: Option<&str>) -> (UploadPath, String) {
        if !unified && pinned && self.state().store.is_pinned() {
            let why = "no unified memory; the host store is pinned memory, which the GPU reads by DMA \
                       with no copy on the host (a paged run times the staging ring against it)";
            return (UploadPath::Pinned, format!("pinned host memory ({why})"));
        }
        if !unified {
            let why = match pinned_why {
                None => "no unified memory: the ring's memcpy overlaps the kernels, while pinned DMA copies \
                         (--upload pinned) queue with them on wgpu's one queue"
                    .to_string(),
                Some(no) => format!("no unified memory, and no pinned memory: {no}"),
            };
            return (UploadPath::Ring, format!("staging ring ({why})"));
        }
        let mut tried: Vec<(UploadPath, &str, Result<f64>)> = Vec::new();
        self.use_path(UploadPath::Ring);
        tried.push((UploadPath::Ring, "staging ring", self.probe_upload_gbps(probe_bytes(&self.gpu))));
        if pinned {
            self.use_path(UploadPath::Pinned);
            let gbps = if self.state().store.is_pinned() {
                self.probe_direct_gbps(probe_bytes(&self.gpu))
            } else {
                self.probe_upload_gbps(probe_bytes(&self.gpu))
            };
            tried.push((UploadPath::Pinned, "pinned host memory", gbps));
        }
        self.use_path(UploadPath::Ring);
        tried.push((UploadPath::ZeroCopy, "zero-copy", self.probe_zero_copy_gbps(probe_bytes(&self.gpu))));
        let best = tried
            .iter()
            .filter_map(|(p, name, r)| r.as_ref().ok().map(|g| (*p, *name, *g)))
            .max_by(|a, b| a.2.total_cmp(&b.2));
        let figures: Vec<String> = tried
            .iter()
            .map(|(_, name, r)| match r {
                Ok(g) => format!("{name} {g:.1} GB/s"),
                Err(e) => format!("{name} failed ({e})"),
            })
            .collect();
        let mut why = format!("fastest measured: {}", figures.join(", "));
        if let Some(no) = pinned_why {
            why.push_str(&format!("; no pinned memory: {no}"));
        }
        match best {
            Some((path, name, _)) => (path, format!("{name} ({why})")),
            None => (UploadPath::Ring, format!("staging ring ({why})")),
        }
    }

    /// Sets the pool and the ring up for `path`, after the copies in flight on the old one.
    fn use_path(&self, path: UploadPath) {
        self.recorder.flush();
        // A failed wait surfaces at the next use of the GPU; the switch itself cannot fail.
        let _ = self.recorder.wait(None);
        let mut st = self.state();
        st.pool.set_zero_copy(path == UploadPath::ZeroCopy);
        // Mapped staging buffers are GPU memory on a discrete GPU: bounded by the budget there.
        let in_vram = path != UploadPath::Pinned && !self.gpu.unified_memory();
        st.upload.set_max(if in_vram { self.upload_slots.1 } else { self.upload_slots.0 });
        // A pinned store needs no pinned ring: its bytes go by DMA straight from it.
        st.direct_upload = path == UploadPath::Pinned && st.store.is_pinned();
        #[cfg(vulkan_hal)]
        {
            let ring = path == UploadPath::Pinned && !st.direct_upload;
            st.upload.set_pinned(if ring { self.pinned.clone() } else { None });
        }
    }

    /// Why pinned host memory cannot be had here, or `None` when it can.
    fn pinned_unavailable(&self) -> Option<String> {
        if self.state().store.is_pinned() {
            return None;
        }
        #[cfg(vulkan_hal)]
        return self.pinned_error.clone();
        #[cfg(not(vulkan_hal))]
        Some("no Vulkan on this platform".into())
    }

    fn pinned_what(&self) -> String {
        if self.state().store.is_pinned() {
            return "DMA straight from the host store, itself pinned memory".into();
        }
        #[cfg(vulkan_hal)]
        return self.pinned.as_ref().map(|p| p.what.clone()).unwrap_or_default();
        #[cfg(not(vulkan_hal))]
        String::new()
    }

    /// GB/s of `bytes` written into a buffer created mapped (zero-copy), best of two.
    fn probe_zero_copy_gbps(&self, bytes: usize) -> Result<f64> {
        let data: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
        let mut best = 0.0f64;
        for _ in 0..2 {
            let start = Stopwatch::start();
            let dst = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("zero-copy probe"),
                size: bytes as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_WRITE,
                mapped_at_creation: true,
            });
            {
                let mut view = dst
                    .get_mapped_range_mut(..)
                    .map_err(|e| Error::Gpu { context: "zero-copy probe".into(), msg: e.to_string() })?;
                staging::fill_now(&self.state().copier, &mut view, &data);
            }
            dst.unmap();
            best = best.max(bytes as f64 / start.seconds().max(1e-9) / 1e9);
        }
        Ok(best)
    }

    /// GB/s of host bytes into a GPU buffer through the upload ring as it is now (mapped or
    /// pinned slots) and a copy (`bytes` of them, best of two after one untimed pass that makes
    /// the ring's slots, waiting for the GPU).
    pub fn probe_upload_gbps(&self, bytes: usize) -> Result<f64> {
        let data: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let mut best = 0.0f64;
        for pass in 0..3 {
            let desc = wgpu::BufferDescriptor {
                label: Some("upload probe"),
                size: bytes as u64,
                usage,
                mapped_at_creation: false,
            };
            let dst = self.gpu.device.create_buffer(&desc);
            let start = Stopwatch::start();
            self.state().upload.upload(&self.recorder, None, &data, &dst, 0)?;
            let index = self.recorder.flush();
            self.recorder.wait(index)?;
            if pass > 0 {
                best = best.max(bytes as f64 / start.seconds().max(1e-9) / 1e9);
            }
        }
        Ok(best)
    }

    /// GB/s of host bytes into a GPU buffer by DMA straight from the (pinned) host store, best
    /// of two after one untimed pass.
    fn probe_direct_gbps(&self, bytes: usize) -> Result<f64> {
        let host = self.state().store.alloc(bytes)?;
        let result = (|| {
            let (src, offset) = {
                let mut st = self.state();
                let b = st.store.bytes_mut(&host)?;
                for (i, x) in b.iter_mut().enumerate() {
                    *x = i as u8;
                }
                st.store.pin(&host);
                st.store.dma(&host).ok_or_else(|| Error::invalid("probe", "host range not pinned"))?
            };
            let desc = wgpu::BufferDescriptor {
                label: Some("direct upload probe"),
                size: bytes as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            };
            let dst = self.gpu.device.create_buffer(&desc);
            let mut best = 0.0f64;
            for pass in 0..3 {
                let start = Stopwatch::start();
                self.recorder.record(|enc| enc.copy_buffer_to_buffer(&src, offset, &dst, 0, bytes as u64));
                let index = self.recorder.flush();
                self.recorder.wait(index)?;
                if pass > 0 {
                    best = best.max(bytes as f64 / start.seconds().max(1e-9) / 1e9);
                }
            }
            Ok(best)
        })();
        self.state().store.free(host);
        result
    }

    /// Which upload path the pager uses, and why.
    pub fn upload_path(&self) -> String {
        self.upload_choice.borrow().1.clone()
    }

    /// The path in use (never `Auto`).
    pub fn upload_path_kind(&self) -> UploadPath {
        self.upload_choice.borrow().0
    }

    /// Switches the upload path (`ZeroCopy` needs unified memory, `Pinned` Vulkan; each falls
    /// back to the ring and says so). Copies in flight finish first.
    pub fn set_upload_path(&self, path: UploadPath) {
        self.choose_upload_path(path);
    }

    /// Whether `auto` chose the staging ring or DMA without measuring, on a GPU that offers
    /// both, so a paged run may time its steps both ways (`train::upload_trial`).
    pub fn upload_trial_offered(&self) -> bool {
        self.upload_trial.get()
    }

    /// Offers the upload trial where pinned memory is, whatever `auto` chose (on unified memory
    /// `auto` measures the paths at start-up instead): for tests and measurements. Returns
    /// whether it is offered.
    pub fn offer_upload_trial(&self) -> bool {
        self.upload_trial.set(self.pinned_unavailable().is_none());
        self.upload_trial.get()
    }

    /// Switches to `path` while a trial times it (`Ring` or `Pinned`, which this GPU offers:
    /// [`Pager::upload_trial_offered`]), and says so; copies in flight finish first where the
    /// path changes.
    pub fn try_upload_path(&self, path: UploadPath) {
        self.switch_path(path);
        *self.upload_choice.borrow_mut() = (path, format!("{} (on trial: its steps are being timed)", path.name()));
    }

    /// Keeps `path`, as a trial measured it, and says so.
    pub fn keep_upload_path(&self, path: UploadPath, why: String) {
        self.switch_path(path);
        *self.upload_choice.borrow_mut() = (path, why);
        self.upload_trial.set(false);
    }

    /// `use_path` where `path` is not the one in use (which would only wait for the GPU).
    fn switch_path(&self, path: UploadPath) {
        if self.upload_path_kind() != path {
            self.use_path(path);
        }
    }
}
