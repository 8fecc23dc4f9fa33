// attention_layout: what every attention family (attention, attention_blocked,
// attention_blocked_backward, attention_lanes) shares, prepended to each of their sources: where a
// head's rows lie in qkv (B,T,3C) and in out/dout (B,T,C), C = H·DIM. Their uniform, Params, is
// attention::Params in src/kernels/attention.rs (gpu_params!: the WGSL struct is made from it).

// Start of row t of part (0 q, 1 k, 2 v) of head `bh % H` of batch entry `bh / H` in qkv (B,T,3C).
fn qkv_row(prm: Params, bh: u32, t: u32, part: u32) -> u32 {
    let c = prm.h * DIM;
    return ((bh / prm.h) * prm.t + t) * 3u * c + part * c + (bh % prm.h) * DIM;
}

// Start of row t of head `bh % H` of batch entry `bh / H` in out (and dout) (B,T,C).
fn out_row(prm: Params, bh: u32, t: u32) -> u32 {
    let c = prm.h * DIM;
    return ((bh / prm.h) * prm.t + t) * c + (bh % prm.h) * DIM;
}
