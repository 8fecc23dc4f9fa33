//! The GPU byte budget means GPU memory: `auto` is what the device-local heap holds (or what
//! `VK_EXT_memory_budget` says this process may use of it) less a margin for what the pool does
//! not count, a budget over the device is refused by name, and the staging rings grow only to a
//! share of the budget instead of a fixed ~1 GiB each.

use crate::device::Gpu;
use crate::error::{Error, Result};

/// Kept back from the heap for what the pool does not count: kernels' scratch and uniforms,
/// pipelines, the driver's own allocations, other processes.
const MARGIN_FRACTION: u64 = 16;
const MARGIN_MIN: u64 = 512 << 20;
/// Each staging ring grows to at most this share of the budget (and at least `RING_MIN_SLOTS`).
const RING_SHARE: u64 = 4;
const RING_MIN_SLOTS: usize = 4;

/// The budget `auto` gives on this GPU, and how it was found.
pub fn auto_budget(gpu: &Gpu) -> (u64, String) {
    let fallback = || {
        let b = gpu.limits.max_buffer_size.saturating_mul(4);
        (b, format!("4 × the largest buffer ({}): {:?} does not report its memory to wgpu", mib(b), gpu.info.backend))
    };
    let Some(heap) = gpu.heap_sizes() else { return fallback() };
    let usable = heap.budget.map_or(heap.device_local, |b| b.min(heap.device_local));
    let source = match heap.budget {
        Some(b) => format!("memory budget {} of the {} device-local heap", mib(b), mib(heap.device_local)),
        None => format!("{} device-local heap", mib(heap.device_local)),
    };
    if heap.unified {
        // The GPU's memory is the host's: the host store needs its half.
        let b = usable / 2;
        return (b, format!("half the {source}, unified memory shared with the host store"));
    }
    let margin = (usable / MARGIN_FRACTION).max(MARGIN_MIN);
    let b = usable.saturating_sub(margin);
    if b == 0 {
        return fallback();
    }
    (b, format!("{source} less a {} margin", mib(margin)))
}

/// `Err` naming both sizes when `budget` is more than the GPU has.
pub fn check_budget(gpu: &Gpu, budget: u64) -> Result<()> {
    let Some(heap) = gpu.heap_sizes() else { return Ok(()) };
    if budget > heap.device_local {
        return Err(Error::invalid(
            "gpu_budget",
            format!(
                "{} is more than the {} of device-local memory on {}; use --gpu-budget auto ({})",
                mib(budget),
                mib(heap.device_local),
                gpu.info.name,
                mib(auto_budget(gpu).0),
            ),
        ));
    }
    Ok(())
}

/// How many staging slots of `slot_bytes` a ring in GPU memory (the mapped upload ring of a
/// discrete GPU: VRAM behind the BAR) may grow to under `budget`: the caller's `max`, but no
/// more than a quarter of the budget (and never fewer than 4). Rings in host memory (the
/// readback ring, a pinned upload ring) take no GPU memory and are not bounded by it.
pub fn ring_slots(budget: u64, slot_bytes: u64, max: usize) -> usize {
    // (PAGETRAIN_RING_SHARE=N: 1/N of the budget instead, for measuring)
    let ring_share = std::env::var("PAGETRAIN_RING_SHARE").ok().and_then(|v| v.parse::<u64>().ok());
    let share = (budget / ring_share.unwrap_or(RING_SHARE).max(1) / slot_bytes.max(1)) as usize;
    max.min(share.max(RING_MIN_SLOTS)).max(1)
}

fn mib(bytes: u64) -> String {
    if bytes >= 10 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::ring_slots;

    #[test]
    fn rings_stay_within_a_quarter_of_the_budget_but_keep_a_few_slots() {
        let slot = 8 << 20;
        assert_eq!(ring_slots(64 << 30, slot, 128), 128, "a large budget keeps the asked-for ring");
        assert_eq!(ring_slots(2 << 30, slot, 128), 64, "2 GiB: 512 MiB of slots");
        assert_eq!(ring_slots(64 << 20, slot, 128), 4, "tiny budgets still get a few slots");
        assert_eq!(ring_slots(64 << 20, slot, 2), 2, "never more than asked");
        for budget in [1u64 << 20, 100 << 20, 3 << 30, 7 << 30] {
            let n = ring_slots(budget, slot, 128);
            assert!(n as u64 * slot <= (budget / 4).max(4 * slot), "{budget}: {n} slots");
        }
    }
}
