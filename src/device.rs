//! Adapter choice, device limits and features, and the GPU error channel.
//!
//! `WGPU_BACKEND` (e.g. `vulkan`, `gl`, `metal`, `dx12`) restricts the backends, `WGPU_ADAPTER_NAME`
//! picks an adapter by a substring of its name; otherwise discrete > integrated > virtual > CPU.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// What the caller wants from the device.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Keep wgpu's shader runtime checks (bounds checks) on. Off by default: they cost 15× on a
    /// matmul on NVIDIA, and our kernels index in bounds by construction. Env: `PAGETRAIN_SHADER_CHECKS=1`.
    pub shader_checks: bool,
    /// Backends to look at (overrides `WGPU_BACKEND`); `None`: the environment's, or all.
    pub backends: Option<wgpu::Backends>,
    /// Which of the best adapters to open, counted modulo their number: each rank of a
    /// data-parallel run on one host passes its local rank, so N GPUs get one rank each.
    /// "Best" is the first class in the order below (e.g. the discrete GPUs of one backend).
    pub adapter_index: Option<usize>,
}

/// An opened GPU: adapter, device, queue, and what they can do.
pub struct Gpu {
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    pub shader_checks: bool,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
}

/// The GPU's memory as the driver reports it (Vulkan only: wgpu has no portable query).
#[derive(Clone, Copy, Debug)]
pub struct HeapSizes {
    /// Bytes of the largest device-local heap.
    pub device_local: u64,
    /// What the driver lets this process use of that heap now (`VK_EXT_memory_budget`).
    pub budget: Option<u64>,
    /// Every memory type that is device-local is also host-visible (CPU drivers, unified memory).
    pub unified: bool,
}

/// One line per adapter wgpu can see, for `pagetrain info`.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: wgpu::Backend,
    pub device_type: wgpu::DeviceType,
    pub driver: String,
    pub compute: bool,
}

/// The backends the user asked for (`WGPU_BACKEND`, or `PAGETRAIN_BACKEND`), if any.
fn requested_backends() -> Option<wgpu::Backends> {
    let name = std::env::var("WGPU_BACKEND").or_else(|_| std::env::var("PAGETRAIN_BACKEND")).ok()?;
    Some(wgpu::Backends::from_comma_list(&name))
}

fn instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

fn device_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn backend_rank(b: wgpu::Backend) -> u32 {
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 | wgpu::Backend::BrowserWebGpu => 0,
        wgpu::Backend::Gl => 1,
        _ => 2,
    }
}

fn has_compute(adapter: &wgpu::Adapter) -> bool {
    adapter.get_downlevel_capabilities().flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
        && adapter.limits().max_storage_buffers_per_shader_stage >= 6
}

/// Every adapter wgpu sees, whether or not it can run pagetrain.
pub async fn list_adapters() -> Vec<AdapterSummary> {
    candidates(&instance(requested_backends().unwrap_or(wgpu::Backends::all())))
        .await
        .iter()
        .map(|a| {
            let info = a.get_info();
            AdapterSummary {
                name: info.name.clone(),
                backend: info.backend,
                device_type: info.device_type,
                driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
                compute: has_compute(a),
            }
        })
        .collect()
}

#[cfg(not(target_arch = "wasm32"))]
async fn candidates(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    instance.enumerate_adapters(wgpu::Backends::all()).await
}

#[cfg(target_arch = "wasm32")]
async fn candidates(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    let opts =
        wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
    instance.request_adapter(&opts).await.into_iter().collect()
}

impl Gpu {
    /// Opens the best adapter (see module docs) with all of its limits and the features we use.
    pub async fn new(opts: &DeviceOptions) -> Result<Gpu> {
        // Without a request, look at the primary backends first and only then at OpenGL: probing
        // GL (EGL) is slow and noisy, and it is the fallback on machines with no Vulkan driver.
        let mut adapters = match opts.backends.or_else(requested_backends) {
            Some(b) => candidates(&instance(b)).await,
            None => {
                let primary: Vec<wgpu::Adapter> = candidates(&instance(wgpu::Backends::PRIMARY)).await;
                if primary.iter().any(has_compute) {
                    primary
                } else {
                    candidates(&instance(wgpu::Backends::all())).await
                }
            }
        };
        let seen: Vec<String> =
            adapters.iter().map(|a| format!("{} ({:?})", a.get_info().name, a.get_info().backend)).collect();
        adapters.retain(has_compute);
        if let Ok(want) = std::env::var("WGPU_ADAPTER_NAME") {
            let want = want.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&want));
        }
        adapters.sort_by_key(|a| {
            let i = a.get_info();
            (device_rank(i.device_type), backend_rank(i.backend))
        });
        if let (Some(i), Some(first)) = (opts.adapter_index, adapters.first()) {
            let class = |a: &wgpu::Adapter| (device_rank(a.get_info().device_type), backend_rank(a.get_info().backend));
            let best = class(first);
            let peers = adapters.iter().take_while(|a| class(a) == best).count();
            adapters.rotate_left(i % peers);
        }
        let adapter = adapters.into_iter().next().ok_or_else(|| Error::NoAdapter {
            tried: if seen.is_empty() { "wgpu saw no adapters".into() } else { format!("saw: {}", seen.join(", ")) },
        })?;
        Self::open(adapter, opts).await
    }

    async fn open(adapter: wgpu::Adapter, opts: &DeviceOptions) -> Result<Gpu> {
        let info = adapter.get_info();
        let mut wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::SUBGROUP_BARRIER
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        // Host-visible storage buffers (the pager's zero-copy mode) only where GPU and CPU share
        // memory; on a discrete GPU wgpu warns that they are a performance trap.
        if matches!(info.device_type, wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::Cpu) {
            wanted |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        // Tensor cores from WGSL (f16 products), where the adapter has them; compiled pipelines
        // kept on disk between runs (kernels::pipeline_cache).
        wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::PIPELINE_CACHE;
        let features = adapter.features() & wanted;
        let limits = adapter.limits();
        let experimental_features = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            // SAFETY: wgpu marks cooperative matrices experimental (its validation of them may be
            // incomplete); only `matmul_coop` uses them, on shapes its tests check against the CPU.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("pagetrain"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features,
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::RequestDevice { adapter: info.name.clone(), msg: e.to_string() })?;

        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let lost = Arc::new(Mutex::new(None));
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = lost_sink.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        let env_checks = std::env::var("PAGETRAIN_SHADER_CHECKS").map(|v| v != "0").unwrap_or(false);
        Ok(Gpu {
            adapter,
            limits: device.limits(),
            features: device.features(),
            device,
            queue,
            info,
            shader_checks: opts.shader_checks || env_checks,
            errors,
            lost,
        })
    }

    /// Turns an uncaptured GPU error or a lost device into an `Err`. `context` says what was running.
    pub fn check(&self, context: &str) -> Result<()> {
        if let Some(reason) = self.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(Error::DeviceLost { reason });
        }
        let mut errs =
            self.errors.lock().map_err(|_| Error::Gpu { context: context.into(), msg: "poisoned".into() })?;
        if !errs.is_empty() {
            let msg = errs.join("; ");
            errs.clear();
            return Err(Error::Gpu { context: context.into(), msg });
        }
        Ok(())
    }

    /// Leaves `msg` for the next [`Gpu::check`] (an error found where it cannot be returned).
    pub fn report_error(&self, msg: String) {
        if let Ok(mut errs) = self.errors.lock() {
            errs.push(msg);
        }
    }

    /// Whether storage buffers can be mapped: GPU and host share memory (integrated GPUs, Apple
    /// silicon, CPU drivers), and the pager can fill tensors without a staging copy.
    pub fn unified_memory(&self) -> bool {
        self.features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
    }

    /// The device-local heap (and the driver's budget for this process), where the backend says.
    pub fn heap_sizes(&self) -> Option<HeapSizes> {
        #[cfg(vulkan_hal)]
        return crate::vulkan_hal::heap_sizes(&self.adapter);
        #[cfg(not(vulkan_hal))]
        None
    }

    /// Largest tensor one storage binding can see.
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size)
    }

    /// A one-line description: name, backend, type.
    pub fn describe(&self) -> String {
        // Browsers may leave the name empty (WebGPU exposes a vendor and a description at most).
        let name = [&self.info.name, &self.info.driver, &self.info.driver_info]
            .into_iter()
            .find(|s| !s.trim().is_empty())
            .map_or("unnamed adapter", |s| s.as_str());
        format!("{name} ({:?}, {:?})", self.info.backend, self.info.device_type)
    }

    /// Blocks (native) until submission `index` — or all submitted work, for `None` — is done;
    /// a no-op on the web, where the browser drives.
    pub fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::Wait { submission_index: index, timeout: None })
            .map_err(|e| Error::Gpu { context: "waiting for the GPU".into(), msg: e.to_string() })?;
        #[cfg(target_arch = "wasm32")]
        let _ = index;
        self.check("waiting for the GPU")
    }
}
