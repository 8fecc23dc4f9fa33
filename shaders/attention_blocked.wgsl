// attention_blocked: fused causal self-attention forward (flash-attention style) with 2-D register
// tiles. Same contract and bindings as attention.wgsl's forward (which keeps head sizes over 64 and
// OpenGL); its backward is attention_blocked_backward.wgsl.
//   blocked_forward:     out (B,T,C) = softmax(scale·q·kᵀ + causal mask)·v, lse (B,H,T) per query row
// A workgroup owns a block of 2·CB query rows of one (batch, head), kept in workgroup memory, and
// streams tiles of CB key rows through it; tiles wholly above the causal diagonal are never visited. Every
// product is a register-tiled GEMM: a thread owns 4 rows × 4 columns of a score tile (rows
// ty + RB4·i, columns tx + CB4·c) and the same 4 rows × NC vec4 column groups of its outputs, so
// the online-softmax statistics of its rows stay in its registers.
// Workgroup memory is one vec4 array `sm` (layout below, sized in Rust by
// `attention::blocked_workgroup_bytes`): rows are padded to DP+4 floats (DP: DIM rounded up to 4,
// pad columns zero) so that row-strided vec4 reads fall on different banks.
// grid (ceil(T/rows of a block), B·H folded into y and z); heavy (late) blocks run first.
// qkv and out may be f16 (qkv converted on load into f32 workgroup memory); lse is f32.
// CPU reference: tests/common/reference.rs `attention_forward`.

// Params: attention::Params in src/kernels/attention.rs; qkv_row, out_row: shaders/attention_layout.wgsl

const CB: u32 = TILE_ROWS;
const CB4: u32 = CB / 4u;
const DP4: u32 = (DIM + 3u) / 4u;
// Row stride of a data row in vec4s (one vec4 of padding), and of a probability row.
const SD4: u32 = DP4 + 1u;
const PS4: u32 = CB4 + 1u;
// Output vec4 column groups per thread: tx + CB4·n.
const NC: u32 = (DP4 + CB4 - 1u) / CB4;
const NTF: u32 = (CB / 2u) * CB4;
const MASKED: f32 = -3.0e38;

// Regions of sm (vec4 offsets): resident rows (2·CB), two streamed tiles (CB each), and 2·CB
// probability rows of CB+4 floats.
const R0: u32 = 0u;
const T0: u32 = 2u * CB * SD4;
const T1: u32 = 3u * CB * SD4;
const P0: u32 = 4u * CB * SD4;
var<workgroup> sm: array<vec4<f32>, 4u * CB * SD4 + 2u * CB * PS4>;
// Per-row partial maxima and sums across the CB4 threads that share rows.
var<workgroup> stat: array<f32, 2u * CB * CB4>;

@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read_write> lse: array<f32>;
@group(0) @binding(2) var<storage, read> qkv: array<B2>;
@group(0) @binding(3) var<uniform> p: Params;

// Element d of a row starting at `a`, 0 in the pad columns (the index is clamped: no read past DIM).
fn ld_qkv(a: u32, d: u32) -> f32 {
    return select(0.0, f32(qkv[a + min(d, DIM - 1u)]), d < DIM);
}

// Rows r0..r0+n (clamped to T-1: rows past T are masked or never written) of part `part` of
// qkv, times `mul`, into sm from vec4 offset `dst`.
fn load_qkv(prm: Params, bh: u32, r0: u32, n: u32, part: u32, mul: f32, dst: u32, lid: u32, nt: u32) {
    for (var e = lid; e < n * DP4; e += nt) {
        let a = qkv_row(prm, bh, min(r0 + e / DP4, prm.t - 1u), part);
        let d = (e % DP4) * 4u;
        let v = vec4(ld_qkv(a, d), ld_qkv(a, d + 1u), ld_qkv(a, d + 2u), ld_qkv(a, d + 3u));
        sm[dst + (e / DP4) * SD4 + e % DP4] = v * mul;
    }
}

// s[i][c] = x_(ty + rb4·i) · y_(tx + CB4·c): rows of x from vec4 offset xo, of y from yo.
// (Every per-row array in this file is indexed by constants, not by a loop counter: where the
// driver keeps such a loop, as NVIDIA's did once the bindings were all read-write, the whole array
// lives in local memory.)
fn scores(xo: u32, yo: u32, ty: u32, tx: u32, rb4: u32) -> array<vec4<f32>, 4> {
    var s: array<vec4<f32>, 4>;
    for (var d = 0u; d < DP4; d++) {
        let y = mat4x4<f32>(sm[yo + tx * SD4 + d], sm[yo + (tx + CB4) * SD4 + d],
                            sm[yo + (tx + 2u * CB4) * SD4 + d], sm[yo + (tx + 3u * CB4) * SD4 + d]);
        s[0] += sm[xo + ty * SD4 + d] * y;
        s[1] += sm[xo + (ty + rb4) * SD4 + d] * y;
        s[2] += sm[xo + (ty + 2u * rb4) * SD4 + d] * y;
        s[3] += sm[xo + (ty + 3u * rb4) * SD4 + d] * y;
    }
    return s;
}

// Score row `lr` of the block (query q0 + lr) with the keys after the query masked; its maximum
// over the thread's columns into stat.
fn mask_row(s: vec4<f32>, key: vec4<u32>, q0: u32, lr: u32, tx: u32) -> vec4<f32> {
    let r = select(vec4(MASKED), s, key <= vec4(q0 + lr));
    stat[lr * CB4 + tx] = max(max(r.x, r.y), max(r.z, r.w));
    return r;
}

// The largest and the sum of the CB4 partial statistics of block row `lr` in stat.
fn stat_max(lr: u32) -> f32 {
    var x = stat[lr * CB4];
    for (var k = 1u; k < CB4; k++) {
        x = max(x, stat[lr * CB4 + k]);
    }
    return x;
}

fn stat_sum(lr: u32) -> f32 {
    var x = 0.0;
    for (var k = 0u; k < CB4; k++) {
        x += stat[lr * CB4 + k];
    }
    return x;
}

// Columns tx + CB4·c of a probability row (component c of v) into the row at vec4 offset `row`
// (CB4 is a multiple of 4, so column tx + CB4·c is lane tx % 4 of vec4 tx / 4 + c·CB4 / 4).
fn store_p_row(row: u32, v: vec4<f32>, tx: u32) {
    let j = row + tx / 4u;
    let k = tx % 4u;
    sm[j][k] = v.x;
    sm[j + CB4 / 4u][k] = v.y;
    sm[j + CB4 / 2u][k] = v.z;
    sm[j + 3u * CB4 / 4u][k] = v.w;
}

// Stores a score tile as probability rows (row ty + rb4·i, column tx + CB4·c) from vec4 offset po.
fn store_p(po: u32, s: array<vec4<f32>, 4>, ty: u32, tx: u32, rb4: u32) {
    store_p_row(po + ty * PS4, s[0], tx);
    store_p_row(po + (ty + rb4) * PS4, s[1], tx);
    store_p_row(po + (ty + 2u * rb4) * PS4, s[2], tx);
    store_p_row(po + (ty + 3u * rb4) * PS4, s[3], tx);
}

// acc[4·n + i] + Σ_j P[ty + rb4·i][j] · B[j][tx + CB4·n] over the CB columns of the probability
// rows at po and the CB data rows at bo. (By value, not through a pointer: the accumulators must
// stay registers once the compiler inlines this.)
fn accumulate(acc0: array<vec4<f32>, 4u * NC>, po: u32, bo: u32, ty: u32, tx: u32, rb4: u32) -> array<vec4<f32>, 4u * NC> {
    var acc = acc0;
    for (var j4 = 0u; j4 < CB4; j4++) {
        let a0 = sm[po + ty * PS4 + j4];
        let a1 = sm[po + (ty + rb4) * PS4 + j4];
        let a2 = sm[po + (ty + 2u * rb4) * PS4 + j4];
        let a3 = sm[po + (ty + 3u * rb4) * PS4 + j4];
        for (var jj = 0u; jj < 4u; jj++) {
            let brow = bo + (4u * j4 + jj) * SD4;
            for (var n = 0u; n < NC; n++) {
                let bv = sm[brow + min(tx + CB4 * n, DP4 - 1u)];
                acc[4u * n] += a0[jj] * bv;
                acc[4u * n + 1u] += a1[jj] * bv;
                acc[4u * n + 2u] += a2[jj] * bv;
                acc[4u * n + 3u] += a3[jj] * bv;
            }
        }
    }
    return acc;
}

// Every accumulator times its row's `corr` (the online softmax's rescale).
fn rescale(acc0: array<vec4<f32>, 4u * NC>, corr: vec4<f32>) -> array<vec4<f32>, 4u * NC> {
    var acc = acc0;
    for (var n = 0u; n < NC; n++) {
        acc[4u * n] *= corr.x;
        acc[4u * n + 1u] *= corr.y;
        acc[4u * n + 2u] *= corr.z;
        acc[4u * n + 3u] *= corr.w;
    }
    return acc;
}

// Row i's accumulators times `mul`, as an array of their own that the stores may index freely.
fn row_values(acc: array<vec4<f32>, 4u * NC>, i: u32, mul: f32) -> array<vec4<f32>, NC> {
    var r: array<vec4<f32>, NC>;
    for (var n = 0u; n < NC; n++) {
        r[n] = acc[4u * n + i] * mul;
    }
    return r;
}

// out elements d0.. of the row at `a` = v, those below DIM.
fn store4(a: u32, d0: u32, v: vec4<f32>) {
    for (var k = 0u; k < min(4u, DIM - min(d0, DIM)); k++) {
        out[a + d0 + k] = B0(v[k]);
    }
}

// out row `row` (if below T), vec4 groups tx + CB4·n, = v[n]. (Few branches: lavapipe compiles
// each one into the coroutine its barriers make, and that time grows fast with blocks.)
fn store_out_row(prm: Params, bh: u32, row: u32, v: array<vec4<f32>, NC>, tx: u32) {
    if (row < prm.t) {
        let a = out_row(prm, bh, row);
        for (var n = 0u; n < NC; n++) {
            store4(a, (tx + CB4 * n) * 4u, v[n]);
        }
    }
}

// out rows r0 + ty + rb4·i = mul[i]·acc (forward).
fn store_out(prm: Params, bh: u32, r0: u32, acc: array<vec4<f32>, 4u * NC>, mul: vec4<f32>, ty: u32, tx: u32, rb4: u32) {
    store_out_row(prm, bh, r0 + ty, row_values(acc, 0u, mul.x), tx);
    store_out_row(prm, bh, r0 + ty + rb4, row_values(acc, 1u, mul.y), tx);
    store_out_row(prm, bh, r0 + ty + 2u * rb4, row_values(acc, 2u, mul.z), tx);
    store_out_row(prm, bh, r0 + ty + 3u * rb4, row_values(acc, 3u, mul.w), tx);
}

// lse of query `row` (if below T) from its running maximum and sum.
fn store_lse(prm: Params, bh: u32, row: u32, m: f32, l: f32) {
    if (row < prm.t) {
        lse[bh * prm.t + row] = m + log(l);
    }
}

fn head_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y + wid.z * nwg.y;
}

@compute @workgroup_size(NTF)
fn blocked_forward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = head_index(wid, nwg);
    if (bh >= p.b * p.h) {
        return;
    }
    let rb = 2u * CB;
    let rb4 = rb / 4u;
    let q0 = (nwg.x - 1u - wid.x) * rb;
    let ty = lid / CB4;
    let tx = lid % CB4;
    load_qkv(p, bh, q0, rb, 0u, p.scale, R0, lid, NTF);
    var m = vec4(MASKED);
    var l = vec4(0.0);
    var acc: array<vec4<f32>, 4u * NC>;
    let keys = min(q0 + rb, p.t);
    for (var k0 = 0u; k0 < keys; k0 += CB) {
        load_qkv(p, bh, k0, CB, 1u, 1.0, T0, lid, NTF);
        load_qkv(p, bh, k0, CB, 2u, 1.0, T1, lid, NTF);
        workgroupBarrier();
        var s = scores(R0, T0, ty, tx, rb4);
        let key = vec4(k0 + tx) + vec4(0u, CB4, 2u * CB4, 3u * CB4);
        s[0] = mask_row(s[0], key, q0, ty, tx);
        s[1] = mask_row(s[1], key, q0, ty + rb4, tx);
        s[2] = mask_row(s[2], key, q0, ty + 2u * rb4, tx);
        s[3] = mask_row(s[3], key, q0, ty + 3u * rb4, tx);
        workgroupBarrier();
        let mt = max(m, vec4(stat_max(ty), stat_max(ty + rb4), stat_max(ty + 2u * rb4), stat_max(ty + 3u * rb4)));
        let corr = exp(m - mt);
        m = mt;
        s[0] = exp(s[0] - vec4(mt.x));
        s[1] = exp(s[1] - vec4(mt.y));
        s[2] = exp(s[2] - vec4(mt.z));
        s[3] = exp(s[3] - vec4(mt.w));
        let one = vec4(1.0);
        l = l * corr + vec4(dot(s[0], one), dot(s[1], one), dot(s[2], one), dot(s[3], one));
        acc = rescale(acc, corr);
        store_p(P0, s, ty, tx, rb4);
        workgroupBarrier();
        acc = accumulate(acc, P0, T1, ty, tx, rb4);
        workgroupBarrier();
    }
    // Row sums: each thread holds the part over its own key columns.
    stat[ty * CB4 + tx] = l.x;
    stat[(ty + rb4) * CB4 + tx] = l.y;
    stat[(ty + 2u * rb4) * CB4 + tx] = l.z;
    stat[(ty + 3u * rb4) * CB4 + tx] = l.w;
    workgroupBarrier();
    let lt = vec4(stat_sum(ty), stat_sum(ty + rb4), stat_sum(ty + 2u * rb4), stat_sum(ty + 3u * rb4));
    if (tx == 0u) {
        store_lse(p, bh, q0 + ty, m.x, lt.x);
        store_lse(p, bh, q0 + ty + rb4, m.y, lt.y);
        store_lse(p, bh, q0 + ty + 2u * rb4, m.z, lt.z);
        store_lse(p, bh, q0 + ty + 3u * rb4, m.w, lt.w);
    }
    store_out(p, bh, q0, acc, 1.0 / lt, ty, tx, rb4);
}
