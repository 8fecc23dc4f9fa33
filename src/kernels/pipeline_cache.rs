//! The driver's compiled pipelines kept on disk between runs (`Features::PIPELINE_CACHE`, Vulkan),
//! so a second run skips the driver compiles that dominate its first step (NVIDIA: about half a
//! second per tensor-core matmul pipeline).
//!
//! One file per adapter and driver (`wgpu::util::pipeline_cache_key`) under
//! `$PAGETRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/pagetrain`, else `~/.cache/pagetrain`.
//! `PAGETRAIN_PIPELINE_CACHE=0` turns it off. The file is read when the kernels are created and
//! written back (to a temporary name, then renamed, so concurrent runs never see half a file)
//! when pipelines were compiled since. wgpu checks the data's header and ignores a file from
//! another driver or wgpu version.

use std::path::PathBuf;

use crate::device::Gpu;

/// An open pipeline cache and where it lives.
pub struct DiskPipelineCache {
    pub cache: wgpu::PipelineCache,
    path: PathBuf,
}

/// The folder pipeline caches go to (see the module docs); `None` without a home.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("PAGETRAIN_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("pagetrain"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("pagetrain"))
}

impl DiskPipelineCache {
    /// The cache for `gpu`, primed from its file where one exists; `None` where the device has
    /// no pipeline caches, the backend has no key, or the user turned it off.
    pub fn open(gpu: &Gpu) -> Option<DiskPipelineCache> {
        if std::env::var("PAGETRAIN_PIPELINE_CACHE").is_ok_and(|v| v == "0")
            || !gpu.features.contains(wgpu::Features::PIPELINE_CACHE)
        {
            return None;
        }
        let key = wgpu::util::pipeline_cache_key(&gpu.info)?;
        let path = cache_dir()?.join(key);
        let data = std::fs::read(&path).ok();
        // SAFETY: the data is either absent or what `get_data` wrote for this adapter key; wgpu
        // validates its header (wgpu version, vendor, device, driver) and with `fallback` starts
        // an empty cache instead of failing when the data does not fit.
        let cache = unsafe {
            gpu.device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("pagetrain pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        Some(DiskPipelineCache { cache, path })
    }

    /// Writes the cache's current data to its file; errors are logged, never fatal (a cache).
    pub fn save(&self) {
        let Some(data) = self.cache.get_data() else { return };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            // a name no other writer uses (other processes, other contexts in this one)
            static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = self.path.with_extension(format!("tmp{}-{n}", std::process::id()));
            std::fs::write(&tmp, &data)?;
            std::fs::rename(&tmp, &self.path)
        };
        if let Err(e) = write() {
            log::warn!("pipeline cache {}: {e}", self.path.display());
        }
    }
}
