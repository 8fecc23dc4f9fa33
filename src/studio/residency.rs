//! Tensors of a pager snapshot sorted into what a person looks for: which layer, which kind
//! (weight, gradient, AdamW moment, f16 copy, activation), and where the bytes are.

use eframe::egui::Color32;

use crate::pager::{Location, Snapshot, TensorInfo};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Weight,
    Gradient,
    Moment,
    HalfCopy,
    Activation,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Weight => "weights",
            Kind::Gradient => "gradients",
            Kind::Moment => "optimizer moments",
            Kind::HalfCopy => "f16 copies",
            Kind::Activation => "activations",
        }
    }
}

/// The layer a tensor belongs to: `embedding`, `h.3`, `ln_f`, `head`, or `step` for the
/// temporaries a step makes outside any layer (token ids, backward's gradients of activations).
/// Activations are named `scope/op` by the context's name scopes; parameters by their
/// Hugging Face names.
pub fn layer_of(name: &str) -> String {
    let path = name.split('/').next().unwrap_or(name);
    let path = path.strip_prefix("transformer.").unwrap_or(path);
    if let Some(rest) = path.strip_prefix("h.") {
        let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !n.is_empty() {
            return format!("h.{n}");
        }
    }
    let layer = if path.starts_with("wte") || path.starts_with("wpe") {
        "embedding"
    } else if path.starts_with("ln_f") {
        "ln_f"
    } else if path.starts_with("lm_head") {
        "head"
    } else {
        "step"
    };
    layer.to_string()
}

pub fn kind_of(name: &str) -> Kind {
    let base = name.trim_end();
    if name.contains('/') || layer_of(name) == "step" {
        Kind::Activation
    } else if base.ends_with(".grad") {
        Kind::Gradient
    } else if base.ends_with(".exp_avg") || base.ends_with(".exp_avg_sq") || base.ends_with(".momentum") {
        Kind::Moment
    } else if base.ends_with("(f16)") {
        Kind::HalfCopy
    } else {
        Kind::Weight
    }
}

/// Order of layers on the map: the model's order, then the step's temporaries.
fn layer_rank(layer: &str) -> (u32, u32) {
    match layer {
        "embedding" => (0, 0),
        "ln_f" => (2, 0),
        "head" => (3, 0),
        "step" => (4, 0),
        l => (1, l.strip_prefix("h.").and_then(|n| n.parse().ok()).unwrap_or(u32::MAX)),
    }
}

/// The tensors of one layer and kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub layer: String,
    pub kind: Kind,
    /// Indices into the snapshot's tensors, largest first.
    pub tensors: Vec<usize>,
    pub bytes: u64,
}

/// Groups of `snap`, in layer then kind order.
pub fn groups(snap: &Snapshot) -> Vec<Group> {
    let mut map: std::collections::BTreeMap<((u32, u32), String, Kind), Vec<usize>> = Default::default();
    for (i, t) in snap.tensors.iter().enumerate() {
        let layer = layer_of(&t.name);
        map.entry((layer_rank(&layer), layer, kind_of(&t.name))).or_default().push(i);
    }
    map.into_iter()
        .map(|((_, layer, kind), mut tensors)| {
            tensors.sort_by_key(|&i| (std::cmp::Reverse(snap.tensors[i].bytes), snap.tensors[i].id));
            let bytes = tensors.iter().map(|&i| snap.tensors[i].bytes).sum();
            Group { layer, kind, tensors, bytes }
        })
        .collect()
}

pub const LOCATIONS: [Location; 5] =
    [Location::Gpu, Location::HostRam, Location::Disk, Location::Remade, Location::Nowhere];

pub fn location_label(l: Location) -> &'static str {
    match l {
        Location::Gpu => "GPU",
        Location::HostRam => "host RAM",
        Location::Disk => "disk only",
        Location::Remade => "made again in backward",
        Location::Nowhere => "nowhere yet",
    }
}

pub fn location_color(l: Location) -> Color32 {
    match l {
        Location::Gpu => Color32::from_rgb(67, 160, 71),
        Location::HostRam => Color32::from_rgb(30, 136, 229),
        Location::Disk => Color32::from_rgb(251, 140, 0),
        Location::Remade => Color32::from_rgb(142, 36, 170),
        Location::Nowhere => Color32::from_rgb(97, 97, 97),
    }
}

/// Bytes per location of `tensors`, in [`LOCATIONS`] order.
pub fn bytes_by_location<'a>(tensors: impl IntoIterator<Item = &'a TensorInfo>) -> [u64; LOCATIONS.len()] {
    let mut out = [0; LOCATIONS.len()];
    for t in tensors {
        let k = LOCATIONS.iter().position(|l| *l == t.location).unwrap_or(LOCATIONS.len() - 1);
        out[k] += t.bytes;
    }
    out
}

/// "h.3 · activations" for a group heading.
pub fn group_title(layer: &str, kind: Kind) -> String {
    format!("{layer} · {}", kind.label())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_into_layers_and_kinds() {
        let cases = [
            ("transformer.h.11.attn.c_attn.weight", "h.11", Kind::Weight),
            ("transformer.h.0.mlp.c_fc.bias.grad", "h.0", Kind::Gradient),
            ("transformer.h.2.ln_1.weight.exp_avg_sq", "h.2", Kind::Moment),
            ("transformer.h.2.ln_1.weight.exp_avg", "h.2", Kind::Moment),
            ("transformer.h.5.mlp.c_proj.weight (f16)", "h.5", Kind::HalfCopy),
            ("transformer.h.7/matmul", "h.7", Kind::Activation),
            ("transformer.wte.weight", "embedding", Kind::Weight),
            ("transformer.wpe.weight.grad", "embedding", Kind::Gradient),
            ("transformer.wte/embedding", "embedding", Kind::Activation),
            ("transformer.ln_f.bias", "ln_f", Kind::Weight),
            ("lm_head/ce lse", "head", Kind::Activation),
            ("tokens", "step", Kind::Activation),
            ("grad", "step", Kind::Activation),
        ];
        for (name, layer, kind) in cases {
            assert_eq!((layer_of(name).as_str(), kind_of(name)), (layer, kind), "{name}");
        }
    }
}
