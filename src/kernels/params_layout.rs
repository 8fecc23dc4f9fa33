//! Each kernel family's `Params` uniform is declared twice, in WGSL and in its Rust launcher: a
//! field added to one side only would shift every field after it, silently. Checked here: the Rust
//! struct's size against naga's layout of the WGSL one.

use super::*;

fn wgsl_params_bytes(shader: Shader) -> u32 {
    let src = specialize(shader, Variant { dim: 64, tile: 32, ..Variant::default() });
    let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{}: {e}", shader.name));
    let params = module.types.iter().find(|(_, ty)| ty.name.as_deref() == Some("Params"));
    let (_, ty) = params.unwrap_or_else(|| panic!("{} declares no Params", shader.name));
    match ty.inner {
        naga::TypeInner::Struct { span, .. } => span,
        _ => panic!("{}: Params is not a struct", shader.name),
    }
}

#[test]
fn rust_params_match_the_wgsl_uniforms() {
    use std::mem::size_of;
    let families = [
        (ACTIVATION, size_of::<activation::Params>()),
        (ATTENTION, size_of::<attention::Params>()),
        (ATTENTION_BLOCKED, size_of::<attention::Params>()),
        (ATTENTION_BLOCKED_BACKWARD, size_of::<attention::Params>()),
        (ATTENTION_LANES, size_of::<attention::Params>()),
        (CROSS_ENTROPY, size_of::<cross_entropy::Params>()),
        (DECODE, size_of::<decode::Params>()),
        (ELEMENTWISE, size_of::<elementwise::Params>()),
        (EMBEDDING, size_of::<embedding::Params>()),
        (FILL, size_of::<fill::Params>()),
        (LAYERNORM, size_of::<layernorm::Params>()),
        (MATMUL, size_of::<matmul::Params>()),
        (MATMUL_LARGE, size_of::<matmul::Params>()),
        (MATMUL_COOP, size_of::<matmul::Params>()),
        (MATMUL_DIRECT, size_of::<matmul::Params>()),
        (MATMUL_DIRECT_SUBGROUPS, size_of::<matmul::Params>()),
        (OPTIM, size_of::<optim::Params>()),
        (REDUCE, size_of::<reduce::Params>()),
        (SOFTMAX, size_of::<softmax::Params>()),
        (SUMSQ, size_of::<sumsq::Params>()),
    ];
    let mut wrong = Vec::new();
    for (shader, rust) in families {
        let wgsl = wgsl_params_bytes(shader) as usize;
        if wgsl != rust {
            wrong.push(format!("{}: WGSL Params {wgsl} bytes, Rust {rust}", shader.name));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
