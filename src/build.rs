//! The build script (Cargo.toml's `build`) sets `cfg(vulkan_hal)` on targets where wgpu has its
//! Vulkan backend (wgpu-core's own rule: Windows, and Unix other than Apple's), so the pager may
//! reach Vulkan through wgpu-hal there.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(vulkan_hal)");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let family = var("CARGO_CFG_TARGET_FAMILY");
    let windows = family.split(',').any(|f| f == "windows");
    let unix = family.split(',').any(|f| f == "unix");
    let apple = var("CARGO_CFG_TARGET_VENDOR") == "apple";
    let wasm = var("CARGO_CFG_TARGET_ARCH") == "wasm32";
    if !wasm && (windows || (unix && !apple)) {
        println!("cargo::rustc-cfg=vulkan_hal");
    }
    println!("cargo::rerun-if-changed=src/build.rs");
}
