//! The driver's compiled pipelines kept on disk between runs (`Features::PIPELINE_CACHE`, Vulkan),
//! so a second run skips the driver compiles that dominate its first step (NVIDIA: about half a
//! second per tensor-core matmul pipeline).
//!
//! One file per adapter and driver (`wgpu::util::pipeline_cache_key`) under
//! `$PAGETRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/pagetrain`, else `~/.cache/pagetrain`.
//! `PAGETRAIN_PIPELINE_CACHE=0` turns it off. The file is read when the kernels are created and
//! written back (to a temporary name, then renamed, so concurrent runs never see half a file)
//! when pipelines were compiled since. wgpu checks the data's header and ignores a file from
//! another driver or wgpu version, but not the driver's data after it (its header keeps room for
//! a hash it does not check yet), and Vulkan drivers need not check it either: the file is sealed
//! with its length and a checksum, and a file that does not match is ignored (with a warning)
//! instead of reaching the driver.

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
        let file = std::fs::read(&path).ok();
        let data = file.as_deref().and_then(|f| {
            let data = unseal(f);
            if data.is_none() {
                log::warn!("pipeline cache {}: damaged or from an older pagetrain, ignored", path.display());
            }
            data
        });
        // SAFETY: the data is either absent or, checksum verified, what `get_data` gave for this
        // adapter key; wgpu validates its header (wgpu version, vendor, device, driver) and with
        // `fallback` starts an empty cache instead of failing when the data does not fit.
        let cache = unsafe {
            gpu.device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("pagetrain pipelines"),
                data,
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
            std::fs::write(&tmp, seal(&data))?;
            std::fs::rename(&tmp, &self.path)
        };
        if let Err(e) = write() {
            log::warn!("pipeline cache {}: {e}", self.path.display());
        }
    }
}

/// What a sealed cache file starts with, before its length and checksum.
const MAGIC: &[u8; 8] = b"PTPCACHE";
const SEAL_BYTES: usize = 8 + 8 + 8;

/// `data` sealed for the disk: [`MAGIC`], its length and its [`checksum`] (little-endian u64s).
fn seal(data: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(SEAL_BYTES + data.len());
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&(data.len() as u64).to_le_bytes());
    file.extend_from_slice(&checksum(data).to_le_bytes());
    file.extend_from_slice(data);
    file
}

/// The data of a sealed file, or `None` where its seal, length or checksum does not match.
fn unseal(file: &[u8]) -> Option<&[u8]> {
    let (seal, data) = file.split_at_checked(SEAL_BYTES)?;
    let word = |i: usize| u64::from_le_bytes(seal[i..i + 8].try_into().expect("8 bytes"));
    (&seal[..8] == MAGIC && word(8) == data.len() as u64 && word(16) == checksum(data)).then_some(data)
}

/// FNV-1a over the data's 8-byte words (and its tail): stable across builds and machines, and
/// fast enough for caches of tens of megabytes at start-up.
pub(super) fn checksum(data: &[u8]) -> u64 {
    const PRIME: u64 = 0x100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(PRIME);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(PRIME);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::{seal, unseal, SEAL_BYTES};

    #[test]
    fn a_sealed_cache_reads_back_and_any_damage_is_refused() {
        let data: Vec<u8> = (0..1001u32).map(|i| (i * 37 % 251) as u8).collect();
        let file = seal(&data);
        assert_eq!(unseal(&file), Some(&data[..]));
        assert_eq!(unseal(&seal(&[])), Some(&[][..]));
        // every single flipped bit, in the seal or the data, is caught
        for at in (0..file.len()).step_by(7) {
            let mut bad = file.clone();
            bad[at] ^= 1 << (at % 8);
            assert_eq!(unseal(&bad), None, "bit flipped at byte {at}");
        }
        // truncated, extended, a file of the old unsealed format, nothing
        assert_eq!(unseal(&file[..file.len() - 1]), None);
        assert_eq!(unseal(&[file.clone(), vec![0]].concat()), None);
        assert_eq!(unseal(&data), None);
        assert_eq!(unseal(&file[..SEAL_BYTES - 1]), None);
    }
}
