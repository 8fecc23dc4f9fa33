//! Every WGSL file parses and validates with naga (no GPU needed) — each family with the shared
//! `common.wgsl` prepended, as the kernels are created — opens with a header comment, and is
//! registered with the kernel registry.

use std::path::Path;

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
        if name == "common.wgsl" {
            continue;
        }
        count += 1;
        let src = format!("{}{own}", pagetrain::kernels::COMMON);
        match naga::front::wgsl::parse_str(&src) {
            Err(e) => failures.push(e.emit_to_string_with_path(&src, &name)),
            Ok(module) => {
                let mut v =
                    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
                if let Err(e) = v.validate(&module) {
                    failures.push(e.emit_to_string_with_path(&src, &name));
                }
            }
        }
        let stem = name.trim_end_matches(".wgsl");
        assert!(pagetrain::kernels::ALL.iter().any(|s| s.name == stem), "{name} is not in kernels::ALL");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(count, pagetrain::kernels::ALL.len(), "kernels::ALL lists a shader that is not in shaders/");
}
