// attention_lanes: the per-row attention backward (attention.wgsl's contract, bindings and
// results up to summation order) with LANES threads per row, each holding a 1/LANES slice of the
// head dimension, so that a thread's registers stay small (at head size 64 and 2 lanes: 32 floats
// of each of k, v, dk, dv instead of 64, which with the rest did not fit 255 registers) and more
// rows fit the GPU at once. More lanes lost on the H200: the shuffles, exp and masks of a row are
// repeated in each of its lanes.
//   lanes_backward_q:  delta (B,H,T) = Σ_d dout·out;  dqkv[q] += scale · Σ_j p·(dout·v_j − delta)·k_j
//   lanes_backward_kv: dqkv[v] += Σ_i p·dout_i;  dqkv[k] += scale · Σ_i p·(dout_i·v − delta_i)·q_i
//                      (reads delta, so it runs after lanes_backward_q)
// Lane l of a row holds vec4 column groups l + LANES·m (m < DPL): a row's lanes read consecutive
// vec4s of a tile row and every row of the workgroup reads the same ones. Each lane sums its part of
// a dot product, and the parts are combined by subgroup shuffles (xor butterfly: every lane of a
// row gets the same bits). The LANES threads of a row are consecutive invocations, so they share a
// subgroup; the adapter must have subgroups of at least LANES (`attention::lanes_supported`).
// LANES = 1 << (FLAGS & 3); tiles of TILE_ROWS rows of DPL·LANES vec4s (pad columns zero).
// ROWS rows a workgroup, grid (ceil(T/ROWS), B·H folded into y and z); the heavy blocks go first.
// qkv, out, dout, dqkv may be f16 (B0 dqkv, B2 qkv, B3 dout, B5 saved out); lse, delta are f32.
// CPU reference: tests/common/reference.rs `attention_backward`.

// Params: attention::Params in src/kernels/attention.rs; qkv_row, out_row: shaders/attention_layout.wgsl

const LANES: u32 = 1u << (FLAGS & 3u);
const ROWS: u32 = 64u;
const NT: u32 = ROWS * LANES;
const TILE: u32 = TILE_ROWS;
const DP4: u32 = (DIM + 3u) / 4u;
// vec4 column groups a lane holds, and a tile row's stride in vec4s
const DPL: u32 = (DP4 + LANES - 1u) / LANES;
const RS: u32 = DPL * LANES;

// backward_q: 0 dqkv, 1 delta, 2 qkv, 3 dout, 4 lse, 5 out, 6 params
// backward_kv: the same without out: params at 5
@group(0) @binding(0) var<storage, read_write> dqkv: array<B0>;
@group(0) @binding(1) var<storage, read_write> delta: array<f32>;
@group(0) @binding(2) var<storage, read> qkv: array<B2>;
@group(0) @binding(3) var<storage, read> dout: array<B3>;
@group(0) @binding(4) var<storage, read> lse_saved: array<f32>;
@group(0) @binding(5) var<storage, read> out_saved: array<B5>;
@group(0) @binding(6) var<uniform> pq: Params;
@group(0) @binding(5) var<uniform> pk: Params;

var<workgroup> rows_a: array<vec4<f32>, TILE * RS>;
var<workgroup> rows_b: array<vec4<f32>, TILE * RS>;

// Elements d..d+4 of the row at `a` of qkv (dout, out), 0 past DIM (indices clamped: no read past DIM).
fn ld_qkv(a: u32, d: u32) -> vec4<f32> {
    let i = min(vec4(d) + vec4(0u, 1u, 2u, 3u), vec4(DIM - 1u));
    let x = vec4(f32(qkv[a + i.x]), f32(qkv[a + i.y]), f32(qkv[a + i.z]), f32(qkv[a + i.w]));
    return select(vec4(0.0), x, vec4(d) + vec4(0u, 1u, 2u, 3u) < vec4(DIM));
}

fn ld_dout(a: u32, d: u32) -> vec4<f32> {
    let i = min(vec4(d) + vec4(0u, 1u, 2u, 3u), vec4(DIM - 1u));
    let x = vec4(f32(dout[a + i.x]), f32(dout[a + i.y]), f32(dout[a + i.z]), f32(dout[a + i.w]));
    return select(vec4(0.0), x, vec4(d) + vec4(0u, 1u, 2u, 3u) < vec4(DIM));
}

fn ld_out(a: u32, d: u32) -> vec4<f32> {
    let i = min(vec4(d) + vec4(0u, 1u, 2u, 3u), vec4(DIM - 1u));
    let x = vec4(f32(out_saved[a + i.x]), f32(out_saved[a + i.y]), f32(out_saved[a + i.z]), f32(out_saved[a + i.w]));
    return select(vec4(0.0), x, vec4(d) + vec4(0u, 1u, 2u, 3u) < vec4(DIM));
}

// dqkv elements d..d+4 (those below DIM) of the row at `a` += v.
fn add4(a: u32, d: u32, v: vec4<f32>) {
    for (var k = 0u; k < 4u; k++) {
        if (d + k < DIM) {
            dqkv[a + d + k] = B0(f32(dqkv[a + d + k]) + v[k]);
        }
    }
}

// acc + (x·y, z·w), term by term (one chain of multiply-adds each, not dot()'s products and sum).
fn add_products(acc: vec2<f32>, x: vec4<f32>, y: vec4<f32>, z: vec4<f32>, w: vec4<f32>) -> vec2<f32> {
    var s = acc;
    s += vec2(x.x, z.x) * vec2(y.x, w.x);
    s += vec2(x.y, z.y) * vec2(y.y, w.y);
    s += vec2(x.z, z.z) * vec2(y.z, w.z);
    s += vec2(x.w, z.w) * vec2(y.w, w.w);
    return s;
}

// The sums of x over the LANES lanes of a row (each lane gets the same bits).
fn lane_sum(x: vec2<f32>) -> vec2<f32> {
    var s = x;
    for (var m = 1u; m < LANES; m <<= 1u) {
        s += subgroupShuffleXor(s, m);
    }
    return s;
}

// Tile rows r0..r0+TILE (rows past T repeat row T-1; they are masked) of qkv parts `pa` into
// rows_a and `pb` into rows_b. Called by all NT threads.
fn load_rows(prm: Params, bh: u32, r0: u32, pa: u32, pb: u32, lid: u32) {
    for (var e = lid; e < TILE * RS; e += NT) {
        let row = min(r0 + e / RS, prm.t - 1u);
        let d = (e % RS) * 4u;
        rows_a[e] = ld_qkv(qkv_row(prm, bh, row, pa), d);
        rows_b[e] = ld_qkv(qkv_row(prm, bh, row, pb), d);
    }
}

// The same with q rows into rows_a and dout rows into rows_b.
fn load_q_dout(prm: Params, bh: u32, r0: u32, lid: u32) {
    for (var e = lid; e < TILE * RS; e += NT) {
        let row = min(r0 + e / RS, prm.t - 1u);
        let d = (e % RS) * 4u;
        rows_a[e] = ld_qkv(qkv_row(prm, bh, row, 0u), d);
        rows_b[e] = ld_dout(out_row(prm, bh, row), d);
    }
}

@compute @workgroup_size(NT)
fn lanes_backward_q(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= pq.b * pq.h) {
        return;
    }
    let lane = lid % LANES;
    // late blocks see the most keys: they go first
    let q0 = (nwg.x - 1u - wid.x) * ROWS;
    let tq = q0 + lid / LANES;
    let live = tq < pq.t;
    let row = min(tq, pq.t - 1u);
    let qa = qkv_row(pq, bh, row, 0u);
    let oa = out_row(pq, bh, row);
    var q: array<vec4<f32>, DPL>;
    var g: array<vec4<f32>, DPL>;
    var dq: array<vec4<f32>, DPL>;
    var dl = 0.0;
    for (var m = 0u; m < DPL; m++) {
        let d = 4u * (lane + LANES * m);
        q[m] = ld_qkv(qa, d) * pq.scale;
        g[m] = ld_dout(oa, d);
        dq[m] = vec4(0.0);
        dl += dot(g[m], ld_out(oa, d));
    }
    dl = lane_sum(vec2(dl, 0.0)).x;
    let ls = lse_saved[bh * pq.t + row];
    let keys = min(q0 + ROWS, pq.t);
    for (var k0 = 0u; k0 < keys; k0 += TILE) {
        load_rows(pq, bh, k0, 1u, 2u, lid);
        workgroupBarrier();
        // the same for every lane of a row
        if (live && k0 <= tq) {
            for (var j = 0u; j < TILE; j++) {
                var sd = vec2(0.0);
                for (var m = 0u; m < DPL; m++) {
                    let at = j * RS + lane + LANES * m;
                    sd = add_products(sd, q[m], rows_a[at], g[m], rows_b[at]);
                }
                sd = lane_sum(sd);
                let pj = select(0.0, exp(sd.x - ls), k0 + j <= tq);
                let ds = pj * (sd.y - dl);
                for (var m = 0u; m < DPL; m++) {
                    dq[m] += ds * rows_a[j * RS + lane + LANES * m];
                }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        if (lane == 0u) {
            delta[bh * pq.t + tq] = dl;
        }
        for (var m = 0u; m < DPL; m++) {
            add4(qa, 4u * (lane + LANES * m), pq.scale * dq[m]);
        }
    }
}

@compute @workgroup_size(NT)
fn lanes_backward_kv(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= pk.b * pk.h) {
        return;
    }
    let lane = lid % LANES;
    // early blocks are seen by the most queries: they go first
    let k0w = wid.x * ROWS;
    let tk = k0w + lid / LANES;
    let row = min(tk, pk.t - 1u);
    let ka = qkv_row(pk, bh, row, 1u);
    let va = qkv_row(pk, bh, row, 2u);
    var k: array<vec4<f32>, DPL>;
    var v: array<vec4<f32>, DPL>;
    var dk: array<vec4<f32>, DPL>;
    var dv: array<vec4<f32>, DPL>;
    for (var m = 0u; m < DPL; m++) {
        let d = 4u * (lane + LANES * m);
        k[m] = ld_qkv(ka, d) * pk.scale;
        v[m] = ld_qkv(va, d);
        dk[m] = vec4(0.0);
        dv[m] = vec4(0.0);
    }
    // Queries before the block's first key see none of its keys. Rows past T compute on row T-1
    // (all lanes stay in step for the shuffles) and store nothing.
    for (var q0 = k0w; q0 < pk.t; q0 += TILE) {
        // rows_a: q rows, rows_b: dout rows
        load_q_dout(pk, bh, q0, lid);
        workgroupBarrier();
        for (var i = 0u; i < TILE; i++) {
            let tq = q0 + i;
            let r = bh * pk.t + min(tq, pk.t - 1u);
            var sd = vec2(0.0);
            for (var m = 0u; m < DPL; m++) {
                let at = i * RS + lane + LANES * m;
                sd = add_products(sd, k[m], rows_a[at], v[m], rows_b[at]);
            }
            sd = lane_sum(sd);
            let pi = select(0.0, exp(sd.x - lse_saved[r]), tq >= tk && tq < pk.t);
            let ds = pi * (sd.y - delta[r]);
            for (var m = 0u; m < DPL; m++) {
                let at = i * RS + lane + LANES * m;
                dv[m] += pi * rows_b[at];
                dk[m] += ds * rows_a[at];
            }
        }
        workgroupBarrier();
    }
    if (tk < pk.t) {
        for (var m = 0u; m < DPL; m++) {
            let d = 4u * (lane + LANES * m);
            add4(ka, d, pk.scale * dk[m]);
            add4(va, d, dv[m]);
        }
    }
}
