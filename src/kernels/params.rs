//! Each kernel family's uniform (`Params`) is declared once, here in Rust, through [`gpu_params!`]:
//! the macro makes the `#[repr(C)]` struct the launcher fills and the WGSL `struct Params` that
//! [`super::specialize`] puts in front of the family's source, from the same field list. A field's
//! WGSL type is its Rust type's name (`u32`, `f32`) unless given after `as`, for arrays, which a
//! uniform lays out differently. The test below checks the two layouts agree field by field, as
//! naga lays out the WGSL one.

/// `gpu_params! { /// doc \n pub(super) struct Params { a: u32, b: f32, n: [u32; 8] as "array<vec4<u32>, 2>" } }`
macro_rules! gpu_params {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($(#[$field_meta:meta])* $field:ident: $ty:ty $(as $wgsl:literal)?),* $(,)?
    }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $($(#[$field_meta])* $vis $field: $ty,)*
        }

        impl $name {
            /// The WGSL declaration of this uniform, as `specialize` puts it before the source.
            pub(super) const WGSL: &'static str = concat!(
                "struct Params {\n",
                $("    ", stringify!($field), ": ", gpu_params!(@wgsl $ty $(, $wgsl)?), ",\n",)*
                "}\n"
            );
            /// Each field's name and byte offset, for the layout check.
            #[cfg(test)]
            pub(super) const FIELDS: &'static [(&'static str, usize)] =
                &[$((stringify!($field), std::mem::offset_of!($name, $field)),)*];
        }
    };
    (@wgsl $ty:ty, $wgsl:literal) => { $wgsl };
    (@wgsl $ty:ty) => { stringify!($ty) };
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// (member name, byte offset) of the `Params` naga lays out from WGSL `src`, and its size.
    fn wgsl_layout(src: &str, what: &str) -> (Vec<(String, usize)>, usize) {
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{what}: {e}"));
        let params = module.types.iter().find(|(_, ty)| ty.name.as_deref() == Some("Params"));
        let (_, ty) = params.unwrap_or_else(|| panic!("{what} declares no Params"));
        match &ty.inner {
            naga::TypeInner::Struct { members, span } => (
                members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize)).collect(),
                *span as usize,
            ),
            _ => panic!("{what}: Params is not a struct"),
        }
    }

    /// How the WGSL layout in `src` differs from the Rust one, if it does.
    fn mismatch(src: &str, what: &str, fields: &[(&str, usize)], size: usize) -> Option<String> {
        let (members, span) = wgsl_layout(src, what);
        let rust: Vec<(String, usize)> = fields.iter().map(|&(n, o)| (n.to_string(), o)).collect();
        (members != rust || span != size)
            .then(|| format!("{what}: WGSL {members:?} ({span} bytes), Rust {rust:?} ({size} bytes)"))
    }

    macro_rules! rust {
        ($t:ty) => {
            (<$t>::FIELDS, std::mem::size_of::<$t>())
        };
    }

    #[test]
    fn rust_params_match_the_wgsl_uniforms() {
        let families = [
            (ACTIVATION, rust!(activation::Params)),
            (ATTENTION, rust!(attention::Params)),
            (ATTENTION_BLOCKED, rust!(attention::Params)),
            (ATTENTION_BLOCKED_BACKWARD, rust!(attention::Params)),
            (ATTENTION_COOP, rust!(attention::Params)),
            (ATTENTION_COOP_BACKWARD, rust!(attention::Params)),
            (ATTENTION_LANES, rust!(attention::Params)),
            (CROSS_ENTROPY, rust!(cross_entropy::Params)),
            (DECODE, rust!(decode::Params)),
            (ELEMENTWISE, rust!(elementwise::Params)),
            (EMBEDDING, rust!(embedding::Params)),
            (FILL, rust!(fill::Params)),
            (LAYERNORM, rust!(layernorm::Params)),
            (MATMUL, rust!(matmul::Params)),
            (MATMUL_LARGE, rust!(matmul::Params)),
            (MATMUL_COOP, rust!(matmul::Params)),
            (MATMUL_DIRECT, rust!(matmul::Params)),
            (MATMUL_DIRECT_SUBGROUPS, rust!(matmul::Params)),
            (OPTIM, rust!(optim::Params)),
            (REDUCE, rust!(reduce::Params)),
            (SOFTMAX, rust!(softmax::Params)),
            (SUMSQ, rust!(sumsq::Params)),
            (TRANSPOSE, rust!(transpose::Params)),
        ];
        assert_eq!(families.len(), ALL.len(), "a family is missing from this check");
        let wrong: Vec<String> = families
            .into_iter()
            .filter_map(|(shader, (fields, size))| {
                let src = specialize(shader, Variant { dim: 64, tile: 32, ..Variant::default() });
                mismatch(&src, shader.name, fields, size)
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn a_wgsl_type_laid_out_otherwise_is_caught() {
        gpu_params! {
            struct Skewed { a: u32, v: [u32; 4] as "vec3<u32>", b: u32 }
        }
        // vec3 aligns to 16 bytes in WGSL, the Rust array to 4
        let src = format!("{}@group(0) @binding(0) var<uniform> p: Params;", Skewed::WGSL);
        let found = mismatch(&src, "Skewed", Skewed::FIELDS, std::mem::size_of::<Skewed>());
        assert!(found.is_some_and(|m| m.contains("(\"v\", 16)") && m.contains("(\"v\", 4)")));
        gpu_params! {
            struct Plain { v: [u32; 4] as "vec4<u32>", a: u32, b: f32, c: u32, d: u32 }
        }
        let src = format!("{}@group(0) @binding(0) var<uniform> p: Params;", Plain::WGSL);
        assert_eq!(mismatch(&src, "Plain", Plain::FIELDS, std::mem::size_of::<Plain>()), None);
    }
}
