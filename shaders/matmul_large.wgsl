// matmul_large: C[b] = alpha * op(A[b]) . op(B[b]) + beta * C[b] (+ bias), for b < batch, for big
// shapes on GPUs: the product, Params and bindings of `matmul` (shaders/matmul.wgsl) plus a4 and b4.
// Layout and epilogue are fixed when the pipeline is compiled (FLAGS: 1 A transposed, 2 B
// transposed, 4 bias, 8 beta != 0, 16 int8 B, 32 A read a vec4 at a time, 64 B likewise, 128
// narrow tiles), so there are no runtime strides or layout branches.
//   c (batch, M, N) row-major;  a (M,K), or (K,M) when FLAGS & 1;  b (K,N), or (N,K) when FLAGS & 2.
// Bindings: c, a, b, bias, bq, bscale (as in `matmul`), a4, b4, Params. a4 and b4 are a and b
// again, read 4 floats at a time, when FLAGS & 32 (A) or FLAGS & 64 (B): the operand is f32, its
// stored rows are a multiple of 4 long and it starts 4-aligned, so a vec4 never straddles a row or
// the matrix's edge. Otherwise a4/b4 are a stand-in and each element is read alone (any shape).
// Tiling: a workgroup of 256 threads computes a 128xTN tile of C, each thread 8x8 outputs in
// registers (TN = 128), or 8x6 with narrow tiles (FLAGS & 128: TN = 96, for products whose
// 128-wide tiles would leave the GPU's last wave half empty); K advances 8 at a time through two
// workgroup buffers, the next slice loaded into registers while the current one is multiplied
// (one barrier a slice).
// Dispatch (ceil(N/TN), ceil(M/128), batch). Loads are guarded, so any shape is correct.
// CPU reference: tests/common/reference.rs `matmul_forward`.

// Params: matmul::Params in src/kernels/matmul.rs (gpu_params!: the WGSL struct is made from it)

@group(0) @binding(0) var<storage, read_write> c: array<B0>;
@group(0) @binding(1) var<storage, read> a: array<B1>;
@group(0) @binding(2) var<storage, read> b: array<B2>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> bq: array<u32>;
@group(0) @binding(5) var<storage, read> bscale: array<f32>;
@group(0) @binding(6) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

const LT: u32 = 128u;
// Columns of a tile: 128, or 96 with narrow tiles.
const NARROW: bool = (FLAGS & 128u) != 0u;
const TN: u32 = 128u - 32u * ((FLAGS >> 7u) & 1u);
// vec4 groups of B's columns in a depth row of a slice (32 or 24).
const BQ: u32 = TN / 4u;
// Depth of a K slice (16 measured slower on the H200).
const LK: u32 = 8u;
// vec4 slots per depth row of a buffer: 32 for the 128 rows (A) or columns (B), plus one of
// padding so that depth-contiguous stores (8 depths x 4 rows a warp) hit 32 distinct banks.
const ROW: u32 = 33u;
// vec4s of A (and of B) each thread fetches per slice.
const LV: u32 = LK / 8u;
// Row step between a thread's depth-contiguous fetches (256 threads, LK of them to a row).
const RS: u32 = 256u / LK;
const TRANS_A: bool = (FLAGS & 1u) != 0u;
const TRANS_B: bool = (FLAGS & 2u) != 0u;
const BIAS: bool = (FLAGS & 4u) != 0u;
const ACCUMULATE: bool = (FLAGS & 8u) != 0u;
const QUANT_B: bool = (FLAGS & 16u) != 0u;
const VEC_A: bool = (FLAGS & 32u) != 0u;
const VEC_B: bool = (FLAGS & 64u) != 0u;
// Threads that load B: with B read by element along its depth, all (each holds 4 columns, or 3
// of a narrow tile); else two a column (vec4 along the depth) or 8 a depth row of BQ vec4s,
// which is 2·TN either way (256 for 128-wide tiles).
const B_BY_ELEMENT_DEPTH: u32 = ((FLAGS >> 1u) & 1u) * (1u - ((FLAGS >> 6u) & 1u));
const B_LOADERS: u32 = 2u * TN + (256u - 2u * TN) * B_BY_ELEMENT_DEPTH;

// Two buffers of one slice each: [buffer][k][128 rows (A) or columns (B) as 32 vec4, 1 spare]
// (16.5 KiB in all: adapters with less workgroup memory use the 64x64 kernel).
var<workgroup> Al: array<vec4<f32>, 2u * LK * ROW>;
var<workgroup> Bl: array<vec4<f32>, 2u * LK * ROW>;

// Element `i` of an int8 B: sign-extended from its byte, times its stored row's scale.
fn quant_b(i: u32) -> f32 {
    let byte = (bq[i / 4u] >> ((i % 4u) * 8u)) & 0xFFu;
    let q = bitcast<i32>(byte << 24u) >> 24u;
    return f32(q) * bscale[i / p.q_row_len];
}

// A's element (row gm, depth gk) of op(A), zero outside the matrix. `checked` is a literal at
// each call, so the unchecked copy (slices wholly inside the matrix) compiles without the tests.
fn large_a(base: u32, gm: u32, gk: u32, checked: bool) -> f32 {
    if (checked && (gm >= p.m || gk >= p.k)) {
        return 0.0;
    }
    if (TRANS_A) {
        return f32(a[base + gk * p.m + gm]);
    }
    return f32(a[base + gm * p.k + gk]);
}

// B's element (depth gk, column gn) of op(B), zero outside the matrix (`checked` as for A).
fn large_b(base: u32, gk: u32, gn: u32, checked: bool) -> f32 {
    if (checked && (gn >= p.n || gk >= p.k)) {
        return 0.0;
    }
    var i = base + gk * p.n + gn;
    if (TRANS_B) {
        i = base + gn * p.k + gk;
    }
    if (QUANT_B) {
        return quant_b(i);
    }
    return f32(b[i]);
}

// With VEC_A / VEC_B: the 4 elements from index i of a or b (i a multiple of 4), zero where
// `inside` (the tests of the scalar path, true for all 4 since rows are a multiple of 4 long)
// fails.
fn large_a4(i: u32, inside: bool) -> vec4<f32> {
    if (!inside) {
        return vec4<f32>(0.0);
    }
    return a4[i / 4u];
}

fn large_b4(i: u32, inside: bool) -> vec4<f32> {
    if (!inside) {
        return vec4<f32>(0.0);
    }
    return b4[i / 4u];
}

// Fetch j of a thread (LV per operand and slice), chosen so that a warp's loads are coalesced.
// Where rows are contiguous (transposed A, B), it holds rows 4q..4q+3 (q = tid % 32) at depth
// tid / 32 + 8j. Where the depth is contiguous (row-major A, transposed B): read by element, LK
// threads read one row's LK depths and fetch j holds rows r + RS·(4j + c), c < 4, at depth
// tid % LK (r = tid / LK); read by vec4, 2 threads read one row and fetch j holds depths
// 4(tid % 2)..+3 of row tid / 2 + 128j (see `large_put`).
fn large_fetch_a(base: u32, m0: u32, k0: u32, tid: u32, j: u32, ch: bool) -> vec4<f32> {
    if (TRANS_A) {
        let k = k0 + tid / 32u + 8u * j;
        let m = m0 + (tid % 32u) * 4u;
        if (VEC_A) {
            return large_a4(base + k * p.m + m, !ch || (k < p.k && m < p.m));
        }
        return vec4<f32>(large_a(base, m, k, ch), large_a(base, m + 1u, k, ch), large_a(base, m + 2u, k, ch), large_a(base, m + 3u, k, ch));
    }
    if (VEC_A) {
        let m = m0 + tid / 2u + 128u * j;
        let k = k0 + (tid % 2u) * 4u;
        return large_a4(base + m * p.k + k, !ch || (m < p.m && k < p.k));
    }
    let m = m0 + tid / LK + RS * 4u * j;
    let k = k0 + tid % LK;
    return vec4<f32>(large_a(base, m, k, ch), large_a(base, m + RS, k, ch), large_a(base, m + 2u * RS, k, ch), large_a(base, m + 3u * RS, k, ch));
}

fn large_fetch_b(base: u32, n0: u32, k0: u32, tid: u32, j: u32, ch: bool) -> vec4<f32> {
    if (TRANS_B) {
        if (VEC_B) {
            let n = n0 + tid / 2u + 128u * j;
            let k = k0 + (tid % 2u) * 4u;
            return large_b4(base + n * p.k + k, !ch || (n < p.n && k < p.k));
        }
        let n = n0 + tid / LK + RS * 4u * j;
        let k = k0 + tid % LK;
        // (a narrow tile's 96 columns need no fourth)
        var last = 0.0;
        if (!NARROW) {
            last = large_b(base, k, n + 3u * RS, ch);
        }
        return vec4<f32>(large_b(base, k, n, ch), large_b(base, k, n + RS, ch), large_b(base, k, n + 2u * RS, ch), last);
    }
    let k = k0 + tid / BQ + 8u * j;
    let n = n0 + (tid % BQ) * 4u;
    if (VEC_B) {
        return large_b4(base + k * p.n + n, !ch || (k < p.k && n < p.n));
    }
    return vec4<f32>(large_b(base, k, n, ch), large_b(base, k, n + 1u, ch), large_b(base, k, n + 2u, ch), large_b(base, k, n + 3u, ch));
}

// Slot of vec4 group q (rows or columns 4q..4q+3) at depth k of buffer `buf`.
fn large_slot(buf: u32, k: u32, q: u32) -> u32 {
    return (buf * LK + k) * ROW + q;
}

// Writes one scalar at (buffer `buf`, depth k, row or column r) of A's or B's buffers.
fn large_put1(is_a: bool, buf: u32, k: u32, r: u32, v: f32) {
    if (is_a) {
        Al[large_slot(buf, k, r / 4u)][r % 4u] = v;
    } else {
        Bl[large_slot(buf, k, r / 4u)][r % 4u] = v;
    }
}

// Writes fetch j into buffer `buf`: one vec4 where rows are contiguous, else a lane per row
// (`by_vec4`: the fetch is 4 depths of one row; else one depth of 4 rows). Either way a warp's
// 32 stores of a step fall in 32 distinct banks (rows padded to 33 vec4). `quads`: vec4 groups
// in a depth row of this operand's tile (32, or BQ for B).
fn large_put(is_a: bool, depth_fast: bool, by_vec4: bool, quads: u32, buf: u32, tid: u32, j: u32, v: vec4<f32>) {
    if (depth_fast && by_vec4) {
        let k = (tid % 2u) * 4u;
        let r = tid / 2u + 128u * j;
        large_put1(is_a, buf, k, r, v.x);
        large_put1(is_a, buf, k + 1u, r, v.y);
        large_put1(is_a, buf, k + 2u, r, v.z);
        large_put1(is_a, buf, k + 3u, r, v.w);
    } else if (depth_fast) {
        // (one lane and slot arithmetic for the 4 rows: with this, 8192x768x3072 NN ran 39.6
        // TFLOP/s on the H200; storing each row through `large_put1`, 27.8)
        let k = tid % LK;
        let r = tid / LK + RS * 4u * j;
        let g = RS / 4u;
        let q = r / 4u;
        let slots = vec4<u32>(large_slot(buf, k, q), large_slot(buf, k, q + g), large_slot(buf, k, q + 2u * g), large_slot(buf, k, q + 3u * g));
        let lane = r % 4u;
        if (is_a) {
            Al[slots.x][lane] = v.x;
            Al[slots.y][lane] = v.y;
            Al[slots.z][lane] = v.z;
            Al[slots.w][lane] = v.w;
        } else {
            Bl[slots.x][lane] = v.x;
            Bl[slots.y][lane] = v.y;
            Bl[slots.z][lane] = v.z;
            if (!NARROW) {
                Bl[slots.w][lane] = v.w;
            }
        }
    } else {
        let at = large_slot(buf, tid / quads + 8u * j, tid % quads);
        if (is_a) {
            Al[at] = v;
        } else {
            Bl[at] = v;
        }
    }
}

// The epilogue indexes the accumulators and their lanes only by constants. A loop over them
// relies on the driver unrolling it: NVIDIA's did not once every binding was read-write (GPU pool
// in slabs), and the accumulators went to local memory (8192×3072×768: 11 → 200 ms a step).

// Stores output (gm, n): alpha·v (+ bias) (+ beta·C), in bounds only.
fn large_store_one(c_base: u32, gm: u32, n: u32, v0: f32) {
    if (n < p.n) {
        let idx = c_base + gm * p.n + n;
        var v = p.alpha * v0;
        if (BIAS) {
            v += bias[n];
        }
        if (ACCUMULATE) {
            v += p.beta * f32(c[idx]);
        }
        c[idx] = B0(v);
    }
}

// Stores row gm's outputs of one thread: 4 from column 4tx (`lo`), then 4 from 64 + 4tx, or 2
// from 64 + 2tx with narrow tiles (`hi`).
fn large_store_row(c_base: u32, gm: u32, n0: u32, tx: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (gm >= p.m) {
        return;
    }
    let gn = n0 + 4u * tx;
    large_store_one(c_base, gm, gn, lo.x);
    large_store_one(c_base, gm, gn + 1u, lo.y);
    large_store_one(c_base, gm, gn + 2u, lo.z);
    large_store_one(c_base, gm, gn + 3u, lo.w);
    let hn = n0 + 64u + select(4u, 2u, NARROW) * tx;
    large_store_one(c_base, gm, hn, hi.x);
    large_store_one(c_base, gm, hn + 1u, hi.y);
    if (!NARROW) {
        large_store_one(c_base, gm, hn + 2u, hi.z);
        large_store_one(c_base, gm, hn + 3u, hi.w);
    }
}

@compute @workgroup_size(256)
fn matmul_large(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = tid % 16u;
    let ty = tid / 16u;
    let m0 = wid.y * LT;
    let n0 = wid.x * TN;
    let a_base = p.a_off + wid.z * p.stride_a;
    let b_base = p.b_off + wid.z * p.stride_b;
    let c_base = p.c_off + wid.z * p.stride_c;

    // acc[2i + h]: row (i < 4 ? 4ty + i : 64 + 4ty + i - 4), columns 4tx.. (h = 0) or 64 + 4tx..
    // (h = 1); narrow tiles: 64 + 2tx, 64 + 2tx + 1 in lanes x, y for h = 1
    let b_loads = tid < B_LOADERS;
    var acc: array<vec4<f32>, 16>; // zeros

    for (var j = 0u; j < LV; j++) {
        large_put(true, !TRANS_A, VEC_A, 32u, 0u, tid, j, large_fetch_a(a_base, m0, 0u, tid, j, true));
        if (b_loads) {
            large_put(false, TRANS_B, VEC_B, BQ, 0u, tid, j, large_fetch_b(b_base, n0, 0u, tid, j, true));
        }
    }
    // Tiles wholly inside M and N load their full-depth slices without bounds tests.
    let inside = m0 + LT <= p.m && n0 + TN <= p.n;
    workgroupBarrier();
    let slices = (p.k + LK - 1u) / LK;
    var na: array<vec4<f32>, LV>;
    var nb: array<vec4<f32>, LV>;
    for (var s = 0u; s < slices; s++) {
        let cur = (s % 2u) * LK * ROW; // large_slot(s % 2, kk, q) = cur + kk * ROW + q
        let more = s + 1u < slices;
        let k1 = (s + 1u) * LK;
        if (more && inside && k1 + LK <= p.k) {
            for (var j = 0u; j < LV; j++) {
                na[j] = large_fetch_a(a_base, m0, k1, tid, j, false);
                if (b_loads) {
                    nb[j] = large_fetch_b(b_base, n0, k1, tid, j, false);
                }
            }
        } else if (more) {
            for (var j = 0u; j < LV; j++) {
                na[j] = large_fetch_a(a_base, m0, k1, tid, j, true);
                if (b_loads) {
                    nb[j] = large_fetch_b(b_base, n0, k1, tid, j, true);
                }
            }
        }
        if (NARROW) {
            for (var kk = 0u; kk < LK; kk++) {
                let row = cur + kk * ROW;
                let a0 = Al[row + ty];
                let a1 = Al[row + 16u + ty];
                let b0 = Bl[row + tx];
                let b_pair = Bl[row + 16u + tx / 2u];
                let b1 = select(b_pair.xy, b_pair.zw, tx % 2u == 1u);
                acc[0] += a0.x * b0;
                acc[1].x += a0.x * b1.x;
                acc[1].y += a0.x * b1.y;
                acc[2] += a0.y * b0;
                acc[3].x += a0.y * b1.x;
                acc[3].y += a0.y * b1.y;
                acc[4] += a0.z * b0;
                acc[5].x += a0.z * b1.x;
                acc[5].y += a0.z * b1.y;
                acc[6] += a0.w * b0;
                acc[7].x += a0.w * b1.x;
                acc[7].y += a0.w * b1.y;
                acc[8] += a1.x * b0;
                acc[9].x += a1.x * b1.x;
                acc[9].y += a1.x * b1.y;
                acc[10] += a1.y * b0;
                acc[11].x += a1.y * b1.x;
                acc[11].y += a1.y * b1.y;
                acc[12] += a1.z * b0;
                acc[13].x += a1.z * b1.x;
                acc[13].y += a1.z * b1.y;
                acc[14] += a1.w * b0;
                acc[15].x += a1.w * b1.x;
                acc[15].y += a1.w * b1.y;
            }
        } else {
            for (var kk = 0u; kk < LK; kk++) {
                let row = cur + kk * ROW;
                let a0 = Al[row + ty];
                let a1 = Al[row + 16u + ty];
                let b0 = Bl[row + tx];
                let b1 = Bl[row + 16u + tx];
                acc[0] += a0.x * b0;
                acc[1] += a0.x * b1;
                acc[2] += a0.y * b0;
                acc[3] += a0.y * b1;
                acc[4] += a0.z * b0;
                acc[5] += a0.z * b1;
                acc[6] += a0.w * b0;
                acc[7] += a0.w * b1;
                acc[8] += a1.x * b0;
                acc[9] += a1.x * b1;
                acc[10] += a1.y * b0;
                acc[11] += a1.y * b1;
                acc[12] += a1.z * b0;
                acc[13] += a1.z * b1;
                acc[14] += a1.w * b0;
                acc[15] += a1.w * b1;
            }
        }
        if (more) {
            let next = 1u - s % 2u;
            for (var j = 0u; j < LV; j++) {
                large_put(true, !TRANS_A, VEC_A, 32u, next, tid, j, na[j]);
                if (b_loads) {
                    large_put(false, TRANS_B, VEC_B, BQ, next, tid, j, nb[j]);
                }
            }
        }
        workgroupBarrier();
    }

    // Rows 4ty..4ty+3 and 64+4ty..64+4ty+3 (acc[2i], acc[2i + 1] for the i-th of them).
    let r0 = m0 + 4u * ty;
    let r1 = m0 + 64u + 4u * ty;
    large_store_row(c_base, r0, n0, tx, acc[0], acc[1]);
    large_store_row(c_base, r0 + 1u, n0, tx, acc[2], acc[3]);
    large_store_row(c_base, r0 + 2u, n0, tx, acc[4], acc[5]);
    large_store_row(c_base, r0 + 3u, n0, tx, acc[6], acc[7]);
    large_store_row(c_base, r1, n0, tx, acc[8], acc[9]);
    large_store_row(c_base, r1 + 1u, n0, tx, acc[10], acc[11]);
    large_store_row(c_base, r1 + 2u, n0, tx, acc[12], acc[13]);
    large_store_row(c_base, r1 + 3u, n0, tx, acc[14], acc[15]);
}
