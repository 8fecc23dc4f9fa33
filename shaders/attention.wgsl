// attention: fused causal multi-head self-attention, flash-style. The (T,T) scores are never
// stored: keys stream through workgroup memory a tile at a time and each query row keeps an online
// softmax (running max, running sum, weighted sum of values) in registers. Backward recomputes the
// scores from q, k and the row log-sum-exp the forward saved.
//   attention_forward:     out (B,T,C) = softmax(scale·q·kᵀ + causal mask) · v,   q,k,v from qkv (B,T,3C)
//                          lse (B,H,T) = max + log Σ exp(score − max) per query row
//   attention_backward_q:  delta (B,H,T) = Σ_d dout·out;  dqkv[q] += scale · Σ_j p·(dout·v_j − delta)·k_j
//   attention_backward_kv: dqkv[v] += Σ_i p·dout_i;  dqkv[k] += scale · Σ_i p·(dout_i·v − delta_i)·q_i
//                          (reads delta, so it runs after attention_backward_q)
// C = H·DIM; the module is compiled per head size DIM (and tile rows TILE_ROWS) so that a row's
// vectors live in registers.
// One thread per query row (forward, backward_q) or key row (backward_kv), ROWS rows a workgroup;
// grid (ceil(T/ROWS), B·H folded into y and z). Loops run whole tiles with masked scores, so every
// trip count is a constant the compiler can unroll.
// qkv, out, dout and dqkv may be f16 (B0 dqkv/out, B2 qkv, B3 dout, B5 saved out); lse, delta are f32.
// CPU reference: tests/common/reference.rs `attention_forward`; backward by finite differences.

// Params: attention::Params in src/kernels/attention.rs; qkv_row, out_row: shaders/attention_layout.wgsl

const ROWS: u32 = 64u;
// Rows of the streamed tiles (TILE_ROWS, from the adapter's tuning): two tiles of TILE x DIM floats
// take at most 16 KiB of workgroup memory, WebGPU's default limit.
const TILE: u32 = TILE_ROWS;
// A score below any real one: its exp is 0 (WGSL has no infinities in constants).
const MASKED: f32 = -3.0e38;

@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read_write> lse: array<f32>;
@group(0) @binding(2) var<storage, read> qkv: array<B2>;
@group(0) @binding(3) var<uniform> p: Params;

// backward_q: 0 dqkv, 1 delta, 2 qkv, 3 dout, 4 lse, 5 out, 6 params
// backward_kv: the same without out: params at 5
@group(0) @binding(0) var<storage, read_write> dqkv: array<B0>;
@group(0) @binding(1) var<storage, read_write> delta: array<f32>;
@group(0) @binding(3) var<storage, read> dout: array<B3>;
@group(0) @binding(4) var<storage, read> lse_saved: array<f32>;
@group(0) @binding(5) var<storage, read> out_saved: array<B5>;
@group(0) @binding(6) var<uniform> pq: Params;
@group(0) @binding(5) var<uniform> pk: Params;

var<workgroup> tile_a: array<f32, TILE * DIM>;
var<workgroup> tile_b: array<f32, TILE * DIM>;

// Tile rows r0..r0+TILE of parts `pa` and `pv` into tile_a and tile_b (rows past T repeat row
// T-1; they are masked). Called by all ROWS threads of a workgroup.
fn load_tiles(prm: Params, bh: u32, r0: u32, pa: u32, pv: u32, lid: u32) {
    for (var e = lid; e < TILE * DIM; e += ROWS) {
        let row = min(r0 + e / DIM, prm.t - 1u);
        tile_a[e] = f32(qkv[qkv_row(prm, bh, row, pa) + e % DIM]);
        tile_b[e] = f32(qkv[qkv_row(prm, bh, row, pv) + e % DIM]);
    }
}

@compute @workgroup_size(ROWS)
fn attention_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= p.b * p.h) {
        return;
    }
    let lid = lid3.x;
    let q0 = wid.x * ROWS;
    let tq = q0 + lid;
    let live = tq < p.t;
    let qa = qkv_row(p, bh, min(tq, p.t - 1u), 0u);
    var q: array<f32, DIM>;
    var acc: array<f32, DIM>;
    for (var d = 0u; d < DIM; d++) {
        q[d] = f32(qkv[qa + d]) * p.scale;
        acc[d] = 0.0;
    }
    var m = MASKED;
    var l = 0.0;
    let keys = min(q0 + ROWS, p.t);
    for (var k0 = 0u; k0 < keys; k0 += TILE) {
        load_tiles(p, bh, k0, 1u, 2u, lid);
        workgroupBarrier();
        if (live && k0 <= tq) {
            var s: array<f32, TILE>;
            var mt = m;
            for (var j = 0u; j < TILE; j++) {
                var dot = 0.0;
                for (var d = 0u; d < DIM; d++) {
                    dot += q[d] * tile_a[j * DIM + d];
                }
                s[j] = select(MASKED, dot, k0 + j <= tq);
                mt = max(mt, s[j]);
            }
            let corr = exp(m - mt);
            l *= corr;
            for (var d = 0u; d < DIM; d++) {
                acc[d] *= corr;
            }
            for (var j = 0u; j < TILE; j++) {
                let pj = exp(s[j] - mt);
                l += pj;
                for (var d = 0u; d < DIM; d++) {
                    acc[d] += pj * tile_b[j * DIM + d];
                }
            }
            m = mt;
        }
        workgroupBarrier();
    }
    if (live) {
        let oa = out_row(p, bh, tq);
        let inv = 1.0 / l;
        for (var d = 0u; d < DIM; d++) {
            out[oa + d] = B0(acc[d] * inv);
        }
        lse[bh * p.t + tq] = m + log(l);
    }
}

// The backward's tiles: rows of DP4 vec4s (pad columns zero), read a vec4 at a time (a scalar
// read per multiply-add made the kernels wait on workgroup-memory reads).
const DP4: u32 = (DIM + 3u) / 4u;
var<workgroup> rows_a: array<vec4<f32>, TILE * DP4>;
var<workgroup> rows_b: array<vec4<f32>, TILE * DP4>;

// acc + x·y, term by term in a scalar loop's order (dot() would sum in another, and the backward's
// results are kept exactly what the scalar kernels gave).
fn add_products(acc: f32, x: vec4<f32>, y: vec4<f32>) -> f32 {
    var s = acc;
    s += x.x * y.x;
    s += x.y * y.y;
    s += x.z * y.z;
    s += x.w * y.w;
    return s;
}

// Element d of the row at `a` of qkv (dout), 0 past DIM (the index is clamped: no read past DIM).
fn ld_qkv(a: u32, d: u32) -> f32 {
    return select(0.0, f32(qkv[a + min(d, DIM - 1u)]), d < DIM);
}

fn ld_dout(a: u32, d: u32) -> f32 {
    return select(0.0, f32(dout[a + min(d, DIM - 1u)]), d < DIM);
}

// Tile rows r0..r0+TILE (rows past T repeat row T-1; they are masked) of qkv parts `pa` into
// rows_a and `pb` into rows_b. Called by all ROWS threads.
fn load_rows(prm: Params, bh: u32, r0: u32, pa: u32, pb: u32, lid: u32) {
    for (var e = lid; e < TILE * DP4; e += ROWS) {
        let row = min(r0 + e / DP4, prm.t - 1u);
        let d = (e % DP4) * 4u;
        let a = qkv_row(prm, bh, row, pa);
        let b = qkv_row(prm, bh, row, pb);
        rows_a[e] = vec4(ld_qkv(a, d), ld_qkv(a, d + 1u), ld_qkv(a, d + 2u), ld_qkv(a, d + 3u));
        rows_b[e] = vec4(ld_qkv(b, d), ld_qkv(b, d + 1u), ld_qkv(b, d + 2u), ld_qkv(b, d + 3u));
    }
}

// The same with q rows into rows_a and dout rows into rows_b.
fn load_q_dout(prm: Params, bh: u32, r0: u32, lid: u32) {
    for (var e = lid; e < TILE * DP4; e += ROWS) {
        let row = min(r0 + e / DP4, prm.t - 1u);
        let d = (e % DP4) * 4u;
        let a = qkv_row(prm, bh, row, 0u);
        let o = out_row(prm, bh, row);
        rows_a[e] = vec4(ld_qkv(a, d), ld_qkv(a, d + 1u), ld_qkv(a, d + 2u), ld_qkv(a, d + 3u));
        rows_b[e] = vec4(ld_dout(o, d), ld_dout(o, d + 1u), ld_dout(o, d + 2u), ld_dout(o, d + 3u));
    }
}

@compute @workgroup_size(ROWS)
fn attention_backward_q(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= pq.b * pq.h) {
        return;
    }
    let lid = lid3.x;
    let q0 = wid.x * ROWS;
    let tq = q0 + lid;
    let live = tq < pq.t;
    let row = min(tq, pq.t - 1u);
    let qa = qkv_row(pq, bh, row, 0u);
    let oa = out_row(pq, bh, row);
    // padded to whole vec4s with zeros
    var q: array<f32, 4u * DP4>;
    var g: array<f32, 4u * DP4>;
    var dq: array<f32, 4u * DP4>;
    var dl = 0.0;
    for (var d = 0u; d < 4u * DP4; d++) {
        q[d] = ld_qkv(qa, d) * pq.scale;
        g[d] = ld_dout(oa, d);
        dq[d] = 0.0;
        dl += g[d] * select(0.0, f32(out_saved[oa + min(d, DIM - 1u)]), d < DIM);
    }
    let ls = lse_saved[bh * pq.t + row];
    let keys = min(q0 + ROWS, pq.t);
    for (var k0 = 0u; k0 < keys; k0 += TILE) {
        load_rows(pq, bh, k0, 1u, 2u, lid);
        workgroupBarrier();
        if (live && k0 <= tq) {
            for (var j = 0u; j < TILE; j++) {
                var s = 0.0;
                var dp = 0.0;
                for (var d4 = 0u; d4 < DP4; d4++) {
                    let d = 4u * d4;
                    s = add_products(s, vec4(q[d], q[d + 1u], q[d + 2u], q[d + 3u]), rows_a[j * DP4 + d4]);
                    dp = add_products(dp, vec4(g[d], g[d + 1u], g[d + 2u], g[d + 3u]), rows_b[j * DP4 + d4]);
                }
                let pj = select(0.0, exp(s - ls), k0 + j <= tq);
                let ds = pj * (dp - dl);
                for (var d4 = 0u; d4 < DP4; d4++) {
                    let d = 4u * d4;
                    let k = rows_a[j * DP4 + d4];
                    dq[d] += ds * k.x;
                    dq[d + 1u] += ds * k.y;
                    dq[d + 2u] += ds * k.z;
                    dq[d + 3u] += ds * k.w;
                }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        delta[bh * pq.t + tq] = dl;
        for (var d = 0u; d < DIM; d++) {
            dqkv[qa + d] = B0(f32(dqkv[qa + d]) + pq.scale * dq[d]);
        }
    }
}

@compute @workgroup_size(ROWS)
fn attention_backward_kv(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= pk.b * pk.h) {
        return;
    }
    let lid = lid3.x;
    let k0w = wid.x * ROWS;
    let tk = k0w + lid;
    let live = tk < pk.t;
    let row = min(tk, pk.t - 1u);
    let ka = qkv_row(pk, bh, row, 1u);
    let va = qkv_row(pk, bh, row, 2u);
    // padded to whole vec4s with zeros
    var k: array<f32, 4u * DP4>;
    var v: array<f32, 4u * DP4>;
    var dk: array<f32, 4u * DP4>;
    var dv: array<f32, 4u * DP4>;
    for (var d = 0u; d < 4u * DP4; d++) {
        k[d] = ld_qkv(ka, d) * pk.scale;
        v[d] = ld_qkv(va, d);
        dk[d] = 0.0;
        dv[d] = 0.0;
    }
    // Queries before the block's first key see none of its keys.
    for (var q0 = k0w; q0 < pk.t; q0 += TILE) {
        // rows_a: q rows, rows_b: dout rows
        load_q_dout(pk, bh, q0, lid);
        workgroupBarrier();
        if (live) {
            for (var i = 0u; i < TILE; i++) {
                let tq = q0 + i;
                let r = min(tq, pk.t - 1u);
                var s = 0.0;
                var dp = 0.0;
                for (var d4 = 0u; d4 < DP4; d4++) {
                    let d = 4u * d4;
                    s = add_products(s, vec4(k[d], k[d + 1u], k[d + 2u], k[d + 3u]), rows_a[i * DP4 + d4]);
                    dp = add_products(dp, vec4(v[d], v[d + 1u], v[d + 2u], v[d + 3u]), rows_b[i * DP4 + d4]);
                }
                let pi = select(0.0, exp(s - lse_saved[bh * pk.t + r]), tq >= tk && tq < pk.t);
                let ds = pi * (dp - delta[bh * pk.t + r]);
                for (var d4 = 0u; d4 < DP4; d4++) {
                    let d = 4u * d4;
                    let qv = rows_a[i * DP4 + d4];
                    let gv = rows_b[i * DP4 + d4];
                    dv[d] += pi * gv.x;
                    dv[d + 1u] += pi * gv.y;
                    dv[d + 2u] += pi * gv.z;
                    dv[d + 3u] += pi * gv.w;
                    dk[d] += ds * qv.x;
                    dk[d + 1u] += ds * qv.y;
                    dk[d + 2u] += ds * qv.z;
                    dk[d + 3u] += ds * qv.w;
                }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var d = 0u; d < DIM; d++) {
            dqkv[ka + d] = B0(f32(dqkv[ka + d]) + pk.scale * dk[d]);
            dqkv[va + d] = B0(f32(dqkv[va + d]) + dv[d]);
        }
    }
}
