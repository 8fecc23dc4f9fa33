//! The shader catalogue: every WGSL family in `shaders/` as a [`Shader`] (its source with the
//! files it starts with, and its uniform's WGSL made from the Rust `Params`), and how one
//! compiled [`Variant`] of a family differs from another ([`specialize`]).

use super::grid::{PER_THREAD, PER_THREAD_FEW};
use super::{
    activation, attention, cross_entropy, decode, elementwise, embedding, fill, layernorm, matmul, optim, reduce,
    softmax, sumsq, transpose,
};

/// One WGSL source file and its family name.
#[derive(Clone, Copy, Debug)]
pub struct Shader {
    pub name: &'static str,
    pub source: &'static str,
    /// The WGSL `struct Params` of the family's uniform, made from its Rust side (`gpu_params!`).
    pub params: &'static str,
    /// Every entry writes its workgroup memory before reading it, so the zero fill wgpu adds by
    /// default at the start of each workgroup is wasted work.
    pub writes_workgroup_first: bool,
    /// WGSL extensions the family always needs (`enable …;` lines), put in front of everything.
    pub enables: &'static str,
}

/// Helpers every family uses (`flat`, `block_sum`, `block_max`), prepended to each source.
pub const COMMON: &str = include_str!("../../shaders/common.wgsl");

macro_rules! shader {
    ($name:literal, $params:ty) => {
        shader!($name, $params, false, "")
    };
    // (after the enables: files every source of the family starts with, e.g. shared functions)
    ($name:literal, $params:ty, $writes_first:literal, $enables:literal $(, $prelude:literal)*) => {
        Shader {
            name: $name,
            source: concat!(
                include_str!("../../shaders/common.wgsl"),
                $(include_str!(concat!("../../shaders/", $prelude, ".wgsl")),)*
                include_str!(concat!("../../shaders/", $name, ".wgsl"))
            ),
            params: <$params>::WGSL,
            writes_workgroup_first: $writes_first,
            enables: $enables,
        }
    };
}

pub const ACTIVATION: Shader = shader!("activation", activation::Params);
pub const ATTENTION: Shader = shader!("attention", attention::Params, false, "", "attention_layout");
pub const ATTENTION_BLOCKED: Shader = shader!("attention_blocked", attention::Params, true, "", "attention_layout");
pub const ATTENTION_BLOCKED_BACKWARD: Shader =
    shader!("attention_blocked_backward", attention::Params, true, "", "attention_layout");
/// Attention's forward on cooperative matrices (f16 qkv, head size 64), where the adapter has them.
pub const ATTENTION_COOP: Shader = shader!(
    "attention_coop",
    attention::Params,
    true,
    "enable f16;\nenable wgpu_cooperative_matrix;\n",
    "attention_layout"
);
/// Attention's backward on cooperative matrices, where [`ATTENTION_COOP`] runs.
pub const ATTENTION_COOP_BACKWARD: Shader = shader!(
    "attention_coop_backward",
    attention::Params,
    true,
    "enable f16;\nenable wgpu_cooperative_matrix;\n",
    "attention_layout"
);
pub const ATTENTION_LANES: Shader = shader!("attention_lanes", attention::Params, false, "", "attention_layout");
pub const CROSS_ENTROPY: Shader = shader!("cross_entropy", cross_entropy::Params);
pub const DECODE: Shader = shader!("decode", decode::Params);
pub const ELEMENTWISE: Shader = shader!("elementwise", elementwise::Params);
pub const EMBEDDING: Shader = shader!("embedding", embedding::Params);
pub const FILL: Shader = shader!("fill", fill::Params);
pub const LAYERNORM: Shader = shader!("layernorm", layernorm::Params);
pub const MATMUL: Shader = shader!("matmul", matmul::Params, true, "");
/// Matmul for CPU adapters: no workgroup memory, vec4 operand reads (see the shader's header).
pub const MATMUL_DIRECT: Shader = shader!("matmul_direct", matmul::Params, false, "");
/// `matmul_direct` with A's reads shared by a subgroup (its entry `matmul_direct_shared`), for
/// adapters with 8- or 16-lane subgroups: the same source with the subgroup entry appended.
pub const MATMUL_DIRECT_SUBGROUPS: Shader = Shader {
    name: "matmul_direct_subgroups",
    source: concat!(
        include_str!("../../shaders/common.wgsl"),
        include_str!("../../shaders/matmul_direct.wgsl"),
        include_str!("../../shaders/matmul_direct_subgroups.wgsl")
    ),
    params: matmul::Params::WGSL,
    writes_workgroup_first: false,
    enables: "",
};
pub const MATMUL_LARGE: Shader = shader!("matmul_large", matmul::Params, true, "");
/// Tensor-core matmul for f16 operands; compiled only where the adapter has cooperative matrices
/// (`enable` lines go first: `common.wgsl` comes before the family's own source).
pub const MATMUL_COOP: Shader =
    shader!("matmul_coop", matmul::Params, true, "enable f16;\nenable wgpu_cooperative_matrix;\n");
pub const OPTIM: Shader = shader!("optim", optim::Params);
pub const REDUCE: Shader = shader!("reduce", reduce::Params);
pub const SOFTMAX: Shader = shader!("softmax", softmax::Params);
pub const SUMSQ: Shader = shader!("sumsq", sumsq::Params);
pub const TRANSPOSE: Shader = shader!("transpose", transpose::Params, true, "");

/// How one compiled variant of a family differs from another. Kernels that can read or write f16
/// declare those bindings as `array<B0>` … `array<B7>` and convert on load and store; the prelude
/// [`specialize`] puts in front of the source makes `Bi` f16 where bit i of `f16_bindings` is set
/// and f32 elsewhere. `dim` and `tile` are sizes a family unrolls for (attention's head size and
/// the rows of its streamed tiles), as `DIM` and `TILE_ROWS`; `flags` are choices fixed at compile
/// time (matmul's layout and epilogue), as `FLAGS`. `writable` declares the storage bindings of
/// its set bits read-write: inputs bound to a buffer (a slab of the GPU pool) that an output of
/// the same dispatch is bound to, which wgpu refuses where the input is read-only
/// (`Kernels::dispatch_detailed`). Only those: every other input keeps its read-only loads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Variant {
    pub f16_bindings: u32,
    pub dim: u32,
    pub tile: u32,
    pub flags: u32,
    pub writable: u32,
}

/// Bindings a kernel may declare through the `Bi` aliases.
pub const TYPED_BINDINGS: u32 = 8;

/// The WGSL source of `shader` compiled as `variant`.
pub fn specialize(shader: Shader, variant: Variant) -> String {
    let mut src = String::from(shader.enables);
    if variant.f16_bindings != 0 && !shader.enables.contains("enable f16;") {
        src.push_str("enable f16;\n");
    }
    for i in 0..TYPED_BINDINGS {
        let ty = if variant.f16_bindings & (1 << i) != 0 { "f16" } else { "f32" };
        src.push_str(&format!("alias B{i} = {ty};\n"));
    }
    src.push_str(&format!("const DIM: u32 = {}u;\n", variant.dim.max(1)));
    src.push_str(&format!("const TILE_ROWS: u32 = {}u;\n", variant.tile.max(1)));
    src.push_str(&format!("const FLAGS: u32 = {}u;\n", variant.flags));
    src.push_str(&format!("const PER_THREAD: u32 = {PER_THREAD}u;\n"));
    src.push_str(&format!("const PER_THREAD_FEW: u32 = {PER_THREAD_FEW}u;\n"));
    src.push_str(shader.params);
    let replaced = replacement(shader);
    let source = replaced.as_deref().unwrap_or(shader.source);
    src.push_str(&read_write(source, variant.writable));
    src
}

/// `source` with the read-only storage bindings whose numbers are set in `bindings` declared
/// read-write (declarations are one line each: `@group(0) @binding(i) var<storage, read> …`).
fn read_write(source: &str, bindings: u32) -> std::borrow::Cow<'_, str> {
    if bindings == 0 {
        return source.into();
    }
    let widen = |line: &str| {
        let number = line.split_once("@binding(").and_then(|(_, rest)| rest.split_once(')')?.0.parse::<u32>().ok());
        match number {
            Some(i) if i < 32 && bindings & (1 << i) != 0 => {
                line.replace("var<storage, read>", "var<storage, read_write>")
            }
            _ => line.to_string(),
        }
    };
    source.split_inclusive('\n').map(widen).collect::<String>().into()
}

/// Kernel development: where `PAGETRAIN_SHADER_DIR` holds `<family>.wgsl`, that file (after
/// common.wgsl, in place of the family's own file and its preludes) is compiled instead of the
/// built-in source, so variants of a kernel can be timed on a GPU without rebuilding (how
/// `matmul_coop`'s tilings were compared). Read at each compile; a family without a file there
/// keeps its own.
fn replacement(shader: Shader) -> Option<String> {
    let path = std::path::Path::new(&std::env::var_os("PAGETRAIN_SHADER_DIR")?).join(format!("{}.wgsl", shader.name));
    let body = std::fs::read_to_string(&path).ok()?;
    log::warn!("{} compiled from {} (PAGETRAIN_SHADER_DIR)", shader.name, path.display());
    Some(format!("{COMMON}{body}"))
}

/// Every shader family, for validation and warm-up.
pub const ALL: &[Shader] = &[
    ACTIVATION,
    ATTENTION,
    ATTENTION_BLOCKED,
    ATTENTION_BLOCKED_BACKWARD,
    ATTENTION_COOP,
    ATTENTION_COOP_BACKWARD,
    ATTENTION_LANES,
    CROSS_ENTROPY,
    DECODE,
    ELEMENTWISE,
    EMBEDDING,
    FILL,
    LAYERNORM,
    MATMUL,
    MATMUL_COOP,
    MATMUL_DIRECT,
    MATMUL_DIRECT_SUBGROUPS,
    MATMUL_LARGE,
    OPTIM,
    REDUCE,
    SOFTMAX,
    SUMSQ,
    TRANSPOSE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_compiles_from_the_shader_dir_where_it_has_a_file_there() {
        // (the replacement is fill's own source plus a marker, so a test compiling fill beside
        // this one while the variable is set gets the same kernel)
        let dir = std::env::temp_dir().join(format!("pagetrain-shader-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let own = include_str!("../../shaders/fill.wgsl");
        std::fs::write(dir.join("fill.wgsl"), format!("{own}\n// from the shader dir\n")).unwrap();
        std::env::set_var("PAGETRAIN_SHADER_DIR", &dir);
        let (replaced, other) = (specialize(FILL, Variant::default()), specialize(SUMSQ, Variant::default()));
        std::env::remove_var("PAGETRAIN_SHADER_DIR");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(replaced.contains("// from the shader dir") && replaced.contains(COMMON));
        assert!(!other.contains("// from the shader dir") && other.contains(SUMSQ.source));
        assert!(!specialize(FILL, Variant::default()).contains("// from the shader dir"));
    }
}
