//! What only Vulkan can say or do, reached through wgpu-hal (`as_hal`): the size of the GPU's
//! device-local heap (and `VK_EXT_memory_budget`'s live budget), and pinned host memory that
//! the GPU reads by DMA — host-visible, host-coherent, preferably host-cached and *not*
//! device-local (the `cudaHostAlloc` analogue) — wrapped as a `wgpu::Buffer`.
//!
//! Why pinned memory: wgpu allocates `MAP_WRITE` staging buffers where gpu-allocator's
//! `CpuToGpu` location prefers `DEVICE_LOCAL | HOST_VISIBLE` (VRAM behind the BAR). The copy
//! threads' memcpy is then itself the PCIe transfer, write-combined, and on an H200 it stops at
//! ~31 GB/s. From host memory, `copy_buffer_to_buffer` is a DMA read by the GPU instead.

use std::ptr::NonNull;

use ash::vk;
use wgpu::hal::api::Vulkan;

use crate::device::HeapSizes;

/// The heap sizes of `adapter`, or `None` when it is not a Vulkan adapter.
pub fn heap_sizes(adapter: &wgpu::Adapter) -> Option<HeapSizes> {
    // SAFETY: the hal adapter is only read (no object is created or destroyed through it) and
    // the guard is dropped before this function returns.
    let hal = unsafe { adapter.as_hal::<Vulkan>() }?;
    let shared = hal.shared_instance();
    let instance = shared.raw_instance();
    let physical = hal.raw_physical_device();
    let caps = hal.physical_device_capabilities();
    let with_budget = shared.instance_api_version() >= vk::API_VERSION_1_1
        && caps.properties().api_version >= vk::API_VERSION_1_1
        && caps.supports_extension(ash::ext::memory_budget::NAME);
    let mut budget_props = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let props = if with_budget {
        let mut props2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget_props);
        // SAFETY: Vulkan 1.1 on both the instance and the device, and the extension the chained
        // struct belongs to is supported by the device (checked above).
        unsafe { instance.get_physical_device_memory_properties2(physical, &mut props2) };
        props2.memory_properties
    } else {
        // SAFETY: a Vulkan 1.0 query on a physical device of this instance.
        unsafe { instance.get_physical_device_memory_properties(physical) }
    };
    let heaps = &props.memory_heaps[..props.memory_heap_count as usize];
    let (index, heap) = heaps
        .iter()
        .enumerate()
        .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .max_by_key(|(_, h)| h.size)?;
    let types = &props.memory_types[..props.memory_type_count as usize];
    let unified = types
        .iter()
        .filter(|t| t.property_flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL))
        .all(|t| t.property_flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE));
    let budget = with_budget.then(|| budget_props.heap_budget[index]).filter(|&b| b > 0);
    Some(HeapSizes { device_local: heap.size, budget, unified })
}

/// Allocates pinned host memory on one wgpu device.
pub struct PinnedAllocator {
    device: wgpu::Device,
    memory_type: u32,
    /// What kind of memory it found, for the upload path's "why".
    pub what: String,
}

/// A pinned buffer: a `wgpu::Buffer` (usable as a copy source or destination) whose memory is
/// mapped into this process for as long as the buffer lives.
pub struct PinnedBuffer {
    pub buffer: wgpu::Buffer,
    ptr: NonNull<u8>,
}

impl PinnedBuffer {
    /// The mapped bytes (`buffer.size()` of them). Writes are seen by the GPU without a flush
    /// (host-coherent memory).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl PinnedAllocator {
    /// A pinned-memory allocator for `device`, or why there is none: not Vulkan, or no
    /// host-visible, host-coherent memory type a transfer buffer can use.
    pub fn new(device: &wgpu::Device) -> Result<PinnedAllocator, String> {
        // SAFETY: read-only use of the hal device; the guard is dropped before returning.
        let hal = unsafe { device.as_hal::<Vulkan>() }.ok_or("not a Vulkan device")?;
        let instance = hal.shared_instance().raw_instance();
        // SAFETY: a Vulkan 1.0 query on this device's physical device.
        let props = unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
        // The memory types a transfer buffer may use: make a small one and ask.
        let raw = hal.raw_device();
        let info = vk::BufferCreateInfo::default()
            .size(4096)
            .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info; the buffer is destroyed right after its requirements are read.
        let probe = unsafe { raw.create_buffer(&info, None) }.map_err(|e| format!("vkCreateBuffer: {e}"))?;
        // SAFETY: `probe` is a live buffer of this device, destroyed once and not used after.
        let allowed = unsafe {
            let r = raw.get_buffer_memory_requirements(probe).memory_type_bits;
            raw.destroy_buffer(probe, None);
            r
        };
        use vk::MemoryPropertyFlags as F;
        let types = &props.memory_types[..props.memory_type_count as usize];
        // Best first: system memory the CPU caches (fast memcpy in, DMA out); then any coherent
        // host memory; on unified memory (no host-visible type outside VRAM) the device-local
        // host-visible types, which are the same RAM there.
        let rank = |f: F| -> Option<u32> {
            if !f.contains(F::HOST_VISIBLE | F::HOST_COHERENT) {
                return None;
            }
            Some(match (f.contains(F::DEVICE_LOCAL), f.contains(F::HOST_CACHED)) {
                (false, true) => 0,
                (false, false) => 1,
                (true, true) => 2,
                (true, false) => 3,
            })
        };
        let (memory_type, flags) = types
            .iter()
            .enumerate()
            .filter(|(i, _)| allowed & (1 << i) != 0)
            .filter_map(|(i, t)| rank(t.property_flags).map(|r| (r, i as u32, t.property_flags)))
            .min_by_key(|(r, i, _)| (*r, *i))
            .map(|(_, i, f)| (i, f))
            .ok_or("no host-visible, host-coherent memory type for transfer buffers")?;
        let what = format!(
            "memory type {memory_type}: {}host-cached, {}",
            if flags.contains(F::HOST_CACHED) { "" } else { "not " },
            if flags.contains(F::DEVICE_LOCAL) { "device-local (unified memory)" } else { "host memory, read by DMA" }
        );
        Ok(PinnedAllocator { device: device.clone(), memory_type, what })
    }

    /// A pinned buffer of `bytes` bytes with `usage` (copy usages only), mapped.
    pub fn create(&self, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> Result<PinnedBuffer, String> {
        debug_assert!((wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST).contains(usage));
        // SAFETY: the hal device is used to create and bind one buffer, which is handed to wgpu
        // (or destroyed on failure) before the guard drops.
        let hal = unsafe { self.device.as_hal::<Vulkan>() }.ok_or("not a Vulkan device")?;
        let raw = hal.raw_device();
        let mut vk_usage = vk::BufferUsageFlags::empty();
        if usage.contains(wgpu::BufferUsages::COPY_SRC) {
            vk_usage |= vk::BufferUsageFlags::TRANSFER_SRC;
        }
        if usage.contains(wgpu::BufferUsages::COPY_DST) {
            vk_usage |= vk::BufferUsageFlags::TRANSFER_DST;
        }
        let info = vk::BufferCreateInfo::default().size(bytes).usage(vk_usage).sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info for this device.
        let buffer = unsafe { raw.create_buffer(&info, None) }.map_err(|e| format!("vkCreateBuffer: {e}"))?;
        // SAFETY: every call below uses the live `buffer` and `memory` of this device; on any
        // failure both are released before returning, and nothing else has seen them.
        unsafe {
            let req = raw.get_buffer_memory_requirements(buffer);
            if req.memory_type_bits & (1 << self.memory_type) == 0 {
                raw.destroy_buffer(buffer, None);
                return Err(format!("memory type {} not allowed for a {bytes}-byte buffer", self.memory_type));
            }
            let alloc = vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(self.memory_type);
            let memory = match raw.allocate_memory(&alloc, None) {
                Ok(m) => m,
                Err(e) => {
                    raw.destroy_buffer(buffer, None);
                    return Err(format!("vkAllocateMemory of {} bytes: {e}", req.size));
                }
            };
            let mapped = raw
                .bind_buffer_memory(buffer, memory, 0)
                .and_then(|_| raw.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()));
            let ptr = match mapped.map(|p| NonNull::new(p.cast::<u8>())) {
                Ok(Some(p)) => p,
                other => {
                    raw.destroy_buffer(buffer, None);
                    raw.free_memory(memory, None);
                    return Err(format!("binding or mapping pinned memory: {:?}", other.err()));
                }
            };
            // wgpu-hal now owns buffer and memory: both are freed (unmapping it) when the wgpu
            // buffer is dropped and the GPU is done with it. wgpu never maps it itself.
            let hal_buffer = wgpu::hal::vulkan::Buffer::from_raw_managed(buffer, memory, 0, req.size);
            drop(hal);
            let desc = wgpu::BufferDescriptor { label: Some(label), size: bytes, usage, mapped_at_creation: false };
            let buffer = self.device.create_buffer_from_hal::<Vulkan>(hal_buffer, &desc);
            Ok(PinnedBuffer { buffer, ptr })
        }
    }
}
