//! Every WGSL file parses and validates with naga (no GPU needed) — each family with the shared
//! `common.wgsl` and the variant prelude (f32 or f16 bindings, head size) prepended, as the kernels
//! are created — opens with a header comment, and is registered with the kernel registry.

use std::path::Path;

use pagetrain::kernels::{specialize, Variant};

#[test]
fn every_shader_validates_with_naga() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut count = 0;
    let mut failures = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "wgsl") {
            continue;
        }
        let own = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(own.starts_with("// "), "{name} must open with a header comment (what, shapes, dispatch, reference)");
        // preludes, not families: common.wgsl goes before every family, attention_layout.wgsl
        // before every attention family's own source
        if name == "common.wgsl" {
            continue;
        }
        if let Some(family) = name.strip_suffix("_layout.wgsl") {
            let users = pagetrain::kernels::ALL.iter().filter(|s| s.name.starts_with(family));
            assert!(users.clone().count() >= 4 && users.clone().all(|s| s.source.contains(&own)), "{name}");
            continue;
        }
        count += 1;
        let stem = name.trim_end_matches(".wgsl");
        let shader = pagetrain::kernels::ALL.iter().find(|s| s.name == stem);
        let shader = *shader.unwrap_or_else(|| panic!("{name} is not in kernels::ALL"));
        assert!(shader.source.ends_with(&own), "{name}: the registry holds another source");
        // all-f32 and all-f16 bindings; head sizes and tile rows as attention uses them
        // and compile-time flags (matmul's layouts and epilogues) all off and all on (4095: the
        // cooperative matmul's 16-byte loads, direct f32 and packed f16 stores, unbounded fetches and stores)
        for (f16_bindings, dim, tile, flags) in [
            (0, 64, 32, 0),
            (u32::MAX >> 24, 64, 32, 31),
            (u32::MAX >> 24, 64, 32, 4095),
            (0, 100, 20, 31),
            (0, 1, 8, 0),
            (u32::MAX >> 24, 1, 8, 0),
        ] {
            // (the cooperative attention forward takes head size 64 only: it asserts so)
            if stem.starts_with("attention_coop") && dim != 64 {
                continue;
            }
            // as written, with every storage binding read-write (inputs sharing a slab with an
            // output), and with some
            for writable in [0, u32::MAX, 0b10110] {
                let src = specialize(shader, Variant { f16_bindings, dim, tile, flags, writable });
                match naga::front::wgsl::parse_str(&src) {
                    Err(e) => failures.push(e.emit_to_string_with_path(&src, &name)),
                    Ok(module) => {
                        let mut v = naga::valid::Validator::new(
                            naga::valid::ValidationFlags::all(),
                            naga::valid::Capabilities::all(),
                        );
                        if let Err(e) = v.validate(&module) {
                            failures.push(e.emit_to_string_with_path(&src, &name));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(count, pagetrain::kernels::ALL.len(), "kernels::ALL lists a shader that is not in shaders/");
}

/// Kernels are dispatched with storage buffers at 0..n and their `Params` uniform at n (bound
/// with a dynamic offset into the uniform arena): every entry point of every family follows it.
#[test]
fn every_entry_binds_storage_then_one_uniform() {
    for shader in pagetrain::kernels::ALL {
        for f16_bindings in [0, u32::MAX >> 24] {
            let variant = Variant { f16_bindings, dim: 64, tile: 32, ..Variant::default() };
            let src = specialize(*shader, variant);
            let sigs = pagetrain::kernels::bindings::reflect(shader.name, &src).unwrap_or_else(|e| panic!("{e}"));
            assert!(!sigs.is_empty(), "{}: no entry points", shader.name);
            // Every kernel writes something: at least one storage binding is read-write.
            for (entry, sig) in &sigs {
                assert!(sig.iter().any(|read_only| !read_only), "{}::{entry} writes nothing: {sig:?}", shader.name);
            }
            // A writable variant binds the same storage, the bindings it names read-write.
            for bits in [u32::MAX, 0b10, 0b101] {
                let src = specialize(*shader, Variant { writable: bits, ..variant });
                let writable =
                    pagetrain::kernels::bindings::reflect(shader.name, &src).unwrap_or_else(|e| panic!("{e}"));
                for (entry, sig) in &sigs {
                    let expected: Vec<bool> =
                        sig.iter().enumerate().map(|(i, &read_only)| read_only && bits & (1 << i) == 0).collect();
                    assert_eq!(writable.get(entry), Some(&expected), "{}::{entry} writable {bits:#b}", shader.name);
                }
            }
        }
    }
    // A module that breaks the convention is refused, naming the entry.
    let bad = "@group(0) @binding(0) var<uniform> p: vec4<f32>;\n\
               @group(0) @binding(1) var<storage, read_write> out: array<f32>;\n\
               @compute @workgroup_size(1) fn broken() { out[0] = p.x; }";
    let err = pagetrain::kernels::bindings::reflect("bad", bad).unwrap_err();
    assert!(err.to_string().contains("broken"), "{err}");
}

/// Workgroup memory a specialised source declares as naga lays it out, without common.wgsl's
/// `red` (the kernels checked here never use it, so the driver drops it).
fn workgroup_bytes(src: &str) -> u64 {
    let module = naga::front::wgsl::parse_str(src).unwrap();
    module
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup && g.name.as_deref() != Some("red"))
        .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()) as u64)
        .sum()
}

#[test]
fn blocked_attention_workgroup_memory_is_what_the_launcher_budgets() {
    // attention::pick chooses tiles by blocked_workgroup_bytes; it must match what naga lays out
    use pagetrain::kernels::attention::blocked_workgroup_bytes;
    use pagetrain::kernels::{attention::BLOCKED_BACKWARD_TILE, ATTENTION_BLOCKED, ATTENTION_BLOCKED_BACKWARD};
    let forward = [(64, 32), (64, 16), (5, 16), (1, 32), (33, 32)].map(|(d, t)| (ATTENTION_BLOCKED, d, t));
    let backward = [64, 5, 33].map(|d| (ATTENTION_BLOCKED_BACKWARD, d, BLOCKED_BACKWARD_TILE));
    for (shader, d, tile) in forward.into_iter().chain(backward) {
        let src = specialize(shader, Variant { dim: d as u32, tile, ..Default::default() });
        assert_eq!(workgroup_bytes(&src), blocked_workgroup_bytes(d, tile), "head size {d}, tile {tile}");
    }
}

#[test]
fn coop_matmul_workgroup_memory_is_what_the_adapter_check_budgets() {
    // Tuning::coop_f16_on asks the adapter for COOP_WORKGROUP_BYTES
    use pagetrain::kernels::{COOP_WORKGROUP_BYTES, MATMUL_COOP};
    let src = specialize(MATMUL_COOP, Variant { f16_bindings: 1, flags: 127, ..Default::default() });
    assert_eq!(workgroup_bytes(&src), COOP_WORKGROUP_BYTES as u64);
    // and binds the storage buffers it asks the adapter for
    let sigs = pagetrain::kernels::bindings::reflect("matmul_coop", &src).unwrap();
    assert_eq!(sigs["matmul_coop"].len(), pagetrain::kernels::COOP_STORAGE_BINDINGS as usize);
}

#[test]
fn coop_attention_workgroup_memory_is_what_the_launcher_budgets() {
    // attention::coop_supported asks the adapter for COOP_WORKGROUP_BYTES, what the larger declares
    use pagetrain::kernels::attention::{COOP_HEAD_DIM, COOP_WORKGROUP_BYTES};
    use pagetrain::kernels::{ATTENTION_COOP, ATTENTION_COOP_BACKWARD};
    let bytes = [ATTENTION_COOP, ATTENTION_COOP_BACKWARD].map(|shader| {
        workgroup_bytes(&specialize(
            shader,
            Variant { f16_bindings: 1, dim: COOP_HEAD_DIM as u32, ..Default::default() },
        ))
    });
    assert!(bytes[0] <= COOP_WORKGROUP_BYTES, "{bytes:?}");
    assert_eq!(bytes[1], COOP_WORKGROUP_BYTES);
}
