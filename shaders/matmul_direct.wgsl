// matmul_direct: C[b] = alpha * op(A[b]) . op(B[b]) + beta * C[b] (+ bias), for b < batch, on
// CPU adapters (lavapipe, llvmpipe). Layout as in matmul.wgsl: c (batch, M, N) row-major;
// op(A)[m,k] = a[a_off + b*stride_a + m*a_rs + k*a_cs]; op(B)[k,n] = b[b_off + b*stride_b +
// k*b_rs + n*b_cs]; A and B may be f16 (B1, B2), B int8 (bq, bscale; FLAGS & 16).
// No workgroup memory or barriers (on a CPU a barrier costs more than the cache traffic it
// saves): each thread reads its 8 rows of A and 8 columns of B straight from memory and keeps
// 8x8 outputs. A workgroup computes a 128x128 tile of C; dispatch (ceil(N/128), ceil(M/128), batch).
// Why vec4: llvmpipe turns each storage load into a loop over the SIMD lanes (8 at 256 bits),
// testing each lane and each component against the buffer's size, whatever the addresses; the
// loop costs once per load instruction, so one vec4 load costs far less than four scalar ones,
// and loads, not multiply-adds, bound the kernel. So the depth advances 4 at a time, and an f32
// operand whose stored rows are a multiple of 4 long and start 4-aligned (FLAGS & 4: A, FLAGS & 8:
// B; `a4`, `b4` bind the same views) is read 4 floats a load: along the depth where the depth is
// contiguous (A, or Bᵀ), else 4 rows (Aᵀ) or columns (B) at one depth. FLAGS & 1, & 2: A, B
// stored transposed (needed only with the vec4 bits; the scalar reads go by the strides).
// 16 scalar loads per 64 multiply-adds at a depth became 4 vec4 loads (llvmpipe, char GPT
// shapes: 3.5-4.5 became 6.7-8.3 GFLOP per CPU-second). The depths after the last multiple of 4
// are read one at a time. (16x8 outputs a thread compiled for a minute and ran 5x slower.)
// Adapters with 8- or 16-lane subgroups run `matmul_direct_shared` (matmul_direct_subgroups.wgsl,
// appended to this file) instead where A is read as vec4: one load of A per lane, not 8.
// CPU reference: tests/common/reference.rs `matmul_forward`.

// Params: matmul::Params in src/kernels/matmul.rs (gpu_params!: the WGSL struct is made from it)

@group(0) @binding(0) var<storage, read_write> c: array<B0>;
@group(0) @binding(1) var<storage, read> a: array<B1>;
@group(0) @binding(2) var<storage, read> b: array<B2>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> bq: array<u32>;
@group(0) @binding(5) var<storage, read> bscale: array<f32>;
// a and b again, read 4 floats at a time (FLAGS & 4, & 8), else a small stand-in
@group(0) @binding(6) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

const TRANS_A: bool = (FLAGS & 1u) != 0u;
const TRANS_B: bool = (FLAGS & 2u) != 0u;
const VEC_A: bool = (FLAGS & 4u) != 0u;
const VEC_B: bool = (FLAGS & 8u) != 0u;
const QUANT_B: bool = (FLAGS & 16u) != 0u;

// A thread's operands at 4 depths k..k+3: [2d + h] holds rows (or columns) 4h..4h+3 at depth k + d.
alias Quad = array<vec4<f32>, 8>;

// Element `i` of B: f32 or f16, or int8 (sign-extended from its byte) times its row's scale.
fn load_b(i: u32) -> f32 {
    if (QUANT_B) {
        let byte = (bq[i / 4u] >> ((i % 4u) * 8u)) & 0xFFu;
        let q = bitcast<i32>(byte << 24u) >> 24u;
        return f32(q) * bscale[i / p.q_row_len];
    }
    return f32(b[i]);
}

// 8 values along the depth-major vec4s `v` (v[i] = row i at depths 0..3) as a Quad.
fn by_depth(v: array<vec4<f32>, 8>) -> Quad {
    var q: Quad;
    for (var d = 0u; d < 4u; d++) {
        q[2u * d] = vec4<f32>(v[0][d], v[1][d], v[2][d], v[3][d]);
        q[2u * d + 1u] = vec4<f32>(v[4][d], v[5][d], v[6][d], v[7][d]);
    }
    return q;
}

// op(A) for this thread's rows at depths k..k+3. `ar`: element index of each row's start
// (rows past M clamped to the last), `m0` the first row (a multiple of 8), `base` A's offset.
fn fetch_a(ar: array<u32, 8>, m0: u32, base: u32, k: u32) -> Quad {
    var q: Quad;
    if (VEC_A && TRANS_A) {
        // stored (K, M): rows m0..m0+3 and m0+4..m0+7 (the last 4 rows where past M) at each depth
        let hi = min(m0 + 4u, p.m - 4u);
        for (var d = 0u; d < 4u; d++) {
            let at = base + (k + d) * p.m;
            q[2u * d] = a4[(at + m0) / 4u];
            q[2u * d + 1u] = a4[(at + hi) / 4u];
        }
    } else if (VEC_A) {
        // stored (M, K): each row's 4 depths in one load
        var v: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {
            v[i] = a4[(ar[i] + k) / 4u];
        }
        q = by_depth(v);
    } else {
        for (var d = 0u; d < 4u; d++) {
            let o = (k + d) * p.a_cs;
            q[2u * d] = vec4<f32>(f32(a[ar[0] + o]), f32(a[ar[1] + o]), f32(a[ar[2] + o]), f32(a[ar[3] + o]));
            q[2u * d + 1u] = vec4<f32>(f32(a[ar[4] + o]), f32(a[ar[5] + o]), f32(a[ar[6] + o]), f32(a[ar[7] + o]));
        }
    }
    return q;
}

// op(B) for this thread's columns at depths k..k+3 (`bc`, `n0`, `base` as for A).
fn fetch_b(bc: array<u32, 8>, n0: u32, base: u32, k: u32) -> Quad {
    var q: Quad;
    if (VEC_B && !TRANS_B) {
        // stored (K, N): columns n0..n0+3 and n0+4..n0+7 (the last 4 where past N) at each depth
        let hi = min(n0 + 4u, p.n - 4u);
        for (var d = 0u; d < 4u; d++) {
            let at = base + (k + d) * p.n;
            q[2u * d] = b4[(at + n0) / 4u];
            q[2u * d + 1u] = b4[(at + hi) / 4u];
        }
    } else if (VEC_B) {
        // stored (N, K): each column's 4 depths in one load
        var v: array<vec4<f32>, 8>;
        for (var j = 0u; j < 8u; j++) {
            v[j] = b4[(bc[j] + k) / 4u];
        }
        q = by_depth(v);
    } else {
        for (var d = 0u; d < 4u; d++) {
            let o = (k + d) * p.b_rs;
            q[2u * d] = vec4<f32>(load_b(bc[0] + o), load_b(bc[1] + o), load_b(bc[2] + o), load_b(bc[3] + o));
            q[2u * d + 1u] = vec4<f32>(load_b(bc[4] + o), load_b(bc[5] + o), load_b(bc[6] + o), load_b(bc[7] + o));
        }
    }
    return q;
}

// Writes 4 outputs of row gm from column gn: alpha·acc (+ bias) (+ beta·C), in bounds only.
fn store4(c_base: u32, gm: u32, gn: u32, acc: vec4<f32>) {
    if (gm >= p.m) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let n = gn + j;
        if (n < p.n) {
            let idx = c_base + gm * p.n + n;
            var v = p.alpha * acc[j];
            if (p.has_bias == 1u) {
                v += bias[n];
            }
            if (p.beta != 0.0) {
                v += p.beta * f32(c[idx]);
            }
            c[idx] = B0(v);
        }
    }
}

// lo[i] += row i of `qa` times columns 0..3 of `qb` (hi: columns 4..7), at each of the 4 depths.
fn mac_quad(lo: ptr<function, array<vec4<f32>, 8>>, hi: ptr<function, array<vec4<f32>, 8>>, qa: Quad, qb: Quad) {
    for (var d = 0u; d < 4u; d++) {
        let a0 = qa[2u * d];
        let a1 = qa[2u * d + 1u];
        let b0 = qb[2u * d];
        let b1 = qb[2u * d + 1u];
        (*lo)[0] += a0.x * b0;
        (*hi)[0] += a0.x * b1;
        (*lo)[1] += a0.y * b0;
        (*hi)[1] += a0.y * b1;
        (*lo)[2] += a0.z * b0;
        (*hi)[2] += a0.z * b1;
        (*lo)[3] += a0.w * b0;
        (*hi)[3] += a0.w * b1;
        (*lo)[4] += a1.x * b0;
        (*hi)[4] += a1.x * b1;
        (*lo)[5] += a1.y * b0;
        (*hi)[5] += a1.y * b1;
        (*lo)[6] += a1.z * b0;
        (*hi)[6] += a1.z * b1;
        (*lo)[7] += a1.w * b0;
        (*hi)[7] += a1.w * b1;
    }
}

// The depths after the last multiple of 4 (one scalar load per operand element), then the
// stores of the thread's 8x8 outputs.
fn finish(lo: ptr<function, array<vec4<f32>, 8>>, hi: ptr<function, array<vec4<f32>, 8>>, ar: array<u32, 8>, bc: array<u32, 8>, m0: u32, n0: u32, c_base: u32) {
    for (var k = p.k - p.k % 4u; k < p.k; k++) {
        let ak = k * p.a_cs;
        let bk = k * p.b_rs;
        let b0 = vec4<f32>(load_b(bc[0] + bk), load_b(bc[1] + bk), load_b(bc[2] + bk), load_b(bc[3] + bk));
        let b1 = vec4<f32>(load_b(bc[4] + bk), load_b(bc[5] + bk), load_b(bc[6] + bk), load_b(bc[7] + bk));
        for (var i = 0u; i < 8u; i++) {
            let av = f32(a[ar[i] + ak]);
            (*lo)[i] += av * b0;
            (*hi)[i] += av * b1;
        }
    }
    for (var i = 0u; i < 8u; i++) {
        store4(c_base, m0 + i, n0, (*lo)[i]);
        store4(c_base, m0 + i, n0 + 4u, (*hi)[i]);
    }
}

// Element index where each of the 8 rows of A from m0 starts (rows past M clamped to the last).
fn row_starts(a_base: u32, m0: u32) -> array<u32, 8> {
    var ar: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        ar[i] = a_base + min(m0 + i, p.m - 1u) * p.a_rs;
    }
    return ar;
}

// Element index where each of the 8 columns of B from n0 starts (past N clamped to the last).
fn column_starts(b_base: u32, n0: u32) -> array<u32, 8> {
    var bc: array<u32, 8>;
    for (var j = 0u; j < 8u; j++) {
        bc[j] = b_base + min(n0 + j, p.n - 1u) * p.b_cs;
    }
    return bc;
}

@compute @workgroup_size(16, 16)
fn matmul_direct(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * 128u + lid.y * 8u;
    let n0 = wid.x * 128u + lid.x * 8u;
    if (m0 >= p.m || n0 >= p.n) {
        return;
    }
    let a_base = p.a_off + wid.z * p.stride_a;
    let b_base = p.b_off + wid.z * p.stride_b;
    let ar = row_starts(a_base, m0);
    let bc = column_starts(b_base, n0);
    // lo[i], hi[i]: row m0 + i, columns n0..n0+3 and n0+4..n0+7
    var lo: array<vec4<f32>, 8>;
    var hi: array<vec4<f32>, 8>;
    for (var k = 0u; k < p.k - p.k % 4u; k += 4u) {
        mac_quad(&lo, &hi, fetch_a(ar, m0, a_base, k), fetch_b(bc, n0, b_base, k));
    }
    finish(&lo, &hi, ar, bc, m0, n0, p.c_off + wid.z * p.stride_c);
}
