// matmul_params: the uniform every matmul family (matmul, matmul_large, matmul_direct,
// matmul_coop) reads, prepended to each of their sources; its Rust side is `Params` in
// src/kernels/matmul.rs (same fields, same order: 20 words).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    stride_a: u32,
    stride_b: u32,
    stride_c: u32,
    has_bias: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    alpha: f32,
    beta: f32,
    // element offsets of the first batch entry of a, b and c (chunks of larger tensors)
    a_off: u32,
    b_off: u32,
    c_off: u32,
    // quant_b = 1: B is int8, four to a word in `bq`, element e scaled by bscale[e / q_row_len]
    quant_b: u32,
    q_row_len: u32,
    _pad0: u32,
}
