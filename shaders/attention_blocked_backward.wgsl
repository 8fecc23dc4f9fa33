// attention_blocked_backward: the gradient of fused causal self-attention (attention_blocked.wgsl's
// forward, whose `out` and `lse` it reads) for head sizes up to 64, in two passes:
//   blocked_backward_q:  delta (B,H,T) = Σ_d dout·out;  dqkv[q] += scale·Σ_j p·(dout·v_j − delta)·k_j
//   blocked_backward_kv: dqkv[k] += scale·Σ_i p·(dout_i·v − delta_i)·q_i;  dqkv[v] += Σ_i p·dout_i
//                        (reads delta, so it runs after blocked_backward_q)
// dQ has its own pass, not atomics from the key blocks, so every sum keeps one order.
// A workgroup of 64 threads (8 × 8) owns a block of CB rows of one (batch, head) — queries
// (backward_q) or keys (backward_kv) — with its two operands (q and dout, or k and v) resident in
// workgroup memory, and streams CB-row tiles of the other side through it; tiles wholly above the
// causal diagonal are never visited. Every product is register-tiled: a thread owns rows ty + 8i
// and columns tx + 8c (i, c < 4) of a CB × CB score tile, held as a mat4x4 (column c, component
// i), and the same four rows × vec4 column groups tx and tx + 8 of its gradient rows (a `Grad`).
// Registers hold only scalars, vectors and matrices: function-local arrays end up in slow local
// memory on drivers that do not unroll every loop indexing them (the reason this kernel replaced
// an array-based one that ran 3–7× slower than the per-row kernels on the H200).
// Workgroup memory: one vec4 array `sm`, rows padded to DP4 + 1 vec4s (pad columns of the data
// rows zero) so that row-strided reads fall on different banks; the same bytes as the forward at
// CB rows (`attention::blocked_workgroup_bytes(DIM, CB)`).
// grid (ceil(T/CB), B·H folded into y and z); the heavy blocks run first.
// qkv, out, dout, dqkv may be f16 (converted on load into f32 workgroup memory); lse, delta f32.
// CPU reference: tests/common/reference.rs `attention_backward`.

// Params: attention::Params in src/kernels/attention.rs; qkv_row, out_row: shaders/attention_layout.wgsl

// Rows of a block and of a streamed tile (`attention::BLOCKED_BACKWARD_TILE`).
const CB: u32 = 32u;
const NT: u32 = 64u;
const DP4: u32 = (DIM + 3u) / 4u;
const SD4: u32 = DP4 + 1u;
const PS4: u32 = CB / 4u + 1u;

// Regions of sm (vec4 offsets): the block's two operands, two streamed tiles, two score tiles.
const R0: u32 = 0u;
const R1: u32 = CB * SD4;
const T0: u32 = 2u * CB * SD4;
const T1: u32 = 3u * CB * SD4;
const P0: u32 = 4u * CB * SD4;
const P1: u32 = P0 + CB * PS4;
var<workgroup> sm: array<vec4<f32>, 4u * CB * SD4 + 2u * CB * PS4>;
// The block's delta (backward_q); the tile's lse and delta (backward_kv). As large as the
// forward's `stat`, so both passes need the memory `blocked_workgroup_bytes` budgets.
var<workgroup> stat: array<f32, 2u * CB * (CB / 4u)>;

// backward_q: 0 dqkv, 1 delta, 2 qkv, 3 dout, 4 lse, 5 out, 6 params; backward_kv: params at 5
@group(0) @binding(0) var<storage, read_write> dqkv: array<B0>;
@group(0) @binding(1) var<storage, read_write> delta: array<f32>;
@group(0) @binding(2) var<storage, read> qkv: array<B2>;
@group(0) @binding(3) var<storage, read> dout: array<B3>;
@group(0) @binding(4) var<storage, read> lse_saved: array<f32>;
@group(0) @binding(5) var<storage, read> out_saved: array<B5>;
@group(0) @binding(6) var<uniform> pq: Params;
@group(0) @binding(5) var<uniform> pk: Params;

// A thread's share of a CB × DIM gradient: rows ty + 8i (column i) of vec4 groups tx and tx + 8.
struct Grad {
    g0: mat4x4<f32>,
    g1: mat4x4<f32>,
}

// Element d of a row starting at `a`, 0 in the pad columns (the index is clamped: no read past DIM).
fn ld_qkv(a: u32, d: u32) -> f32 {
    return select(0.0, f32(qkv[a + min(d, DIM - 1u)]), d < DIM);
}

fn ld_dout(a: u32, d: u32) -> f32 {
    return select(0.0, f32(dout[a + min(d, DIM - 1u)]), d < DIM);
}

// CB rows from r0 (clamped to T-1: rows past T are masked or never written) of part `part` of
// qkv, times `mul`, into sm from vec4 offset `dst`.
fn load_qkv(prm: Params, bh: u32, r0: u32, part: u32, mul: f32, dst: u32, lid: u32) {
    for (var e = lid; e < CB * DP4; e += NT) {
        let a = qkv_row(prm, bh, min(r0 + e / DP4, prm.t - 1u), part);
        let d = (e % DP4) * 4u;
        let v = vec4(ld_qkv(a, d), ld_qkv(a, d + 1u), ld_qkv(a, d + 2u), ld_qkv(a, d + 3u));
        sm[dst + (e / DP4) * SD4 + e % DP4] = v * mul;
    }
}

// The same for rows of dout.
fn load_dout(prm: Params, bh: u32, r0: u32, dst: u32, lid: u32) {
    for (var e = lid; e < CB * DP4; e += NT) {
        let a = out_row(prm, bh, min(r0 + e / DP4, prm.t - 1u));
        let d = (e % DP4) * 4u;
        sm[dst + (e / DP4) * SD4 + e % DP4] = vec4(ld_dout(a, d), ld_dout(a, d + 1u), ld_dout(a, d + 2u), ld_dout(a, d + 3u));
    }
}

// Column c, component i: row ty + 8i of the rows at xo · row tx + 8c of the rows at yo.
fn scores(xo: u32, yo: u32, ty: u32, tx: u32) -> mat4x4<f32> {
    var s = mat4x4<f32>();
    for (var d = 0u; d < DP4; d++) {
        let x = mat4x4<f32>(sm[xo + ty * SD4 + d], sm[xo + (ty + 8u) * SD4 + d],
                            sm[xo + (ty + 16u) * SD4 + d], sm[xo + (ty + 24u) * SD4 + d]);
        let y = mat4x4<f32>(sm[yo + tx * SD4 + d], sm[yo + (tx + 8u) * SD4 + d],
                            sm[yo + (tx + 16u) * SD4 + d], sm[yo + (tx + 24u) * SD4 + d]);
        s += transpose(x) * y;
    }
    return s;
}

// Columns tx + 8c of a score row (component c of v) into the row at vec4 offset `row`.
fn store_row(row: u32, v: vec4<f32>, tx: u32) {
    let j = row + tx / 4u;
    let k = tx % 4u;
    sm[j][k] = v.x;
    sm[j + 2u][k] = v.y;
    sm[j + 4u][k] = v.z;
    sm[j + 6u][k] = v.w;
}

// A thread's score tile as rows ty + 8i of the score rows at vec4 offset po.
fn store_scores(po: u32, s: mat4x4<f32>, ty: u32, tx: u32) {
    let r = transpose(s);
    store_row(po + ty * PS4, r[0], tx);
    store_row(po + (ty + 8u) * PS4, r[1], tx);
    store_row(po + (ty + 16u) * PS4, r[2], tx);
    store_row(po + (ty + 24u) * PS4, r[3], tx);
}

// acc + Σ_j S[ty + 8i][j] · B[j] over the CB score rows at po and the CB data rows at bo, in the
// thread's two vec4 column groups (clamped to the last group: sums past DIM are not stored).
fn accumulate(acc: Grad, po: u32, bo: u32, ty: u32, tx: u32) -> Grad {
    var r = acc;
    let c0 = min(tx, DP4 - 1u);
    let c1 = min(tx + 8u, DP4 - 1u);
    for (var j4 = 0u; j4 < CB / 4u; j4++) {
        let a = mat4x4<f32>(sm[po + ty * PS4 + j4], sm[po + (ty + 8u) * PS4 + j4],
                            sm[po + (ty + 16u) * PS4 + j4], sm[po + (ty + 24u) * PS4 + j4]);
        let b = bo + 4u * j4 * SD4;
        let b0 = mat4x4<f32>(sm[b + c0], sm[b + SD4 + c0], sm[b + 2u * SD4 + c0], sm[b + 3u * SD4 + c0]);
        let b1 = mat4x4<f32>(sm[b + c1], sm[b + SD4 + c1], sm[b + 2u * SD4 + c1], sm[b + 3u * SD4 + c1]);
        r.g0 += b0 * a;
        r.g1 += b1 * a;
    }
    return r;
}

// dqkv elements d0.. (those below DIM) of the row at `a` += v.
fn add4(a: u32, d0: u32, v: vec4<f32>) {
    for (var k = 0u; k < min(4u, DIM - min(d0, DIM)); k++) {
        dqkv[a + d0 + k] = B0(f32(dqkv[a + d0 + k]) + v[k]);
    }
}

// dqkv part `part` row `row` (if below T) += mul·(v0 in vec4 group tx, v1 in group tx + 8).
fn add_row(prm: Params, bh: u32, row: u32, part: u32, v0: vec4<f32>, v1: vec4<f32>, mul: f32, tx: u32) {
    if (row < prm.t) {
        let a = qkv_row(prm, bh, row, part);
        add4(a, 4u * tx, v0 * mul);
        add4(a, 4u * (tx + 8u), v1 * mul);
    }
}

fn add_rows(prm: Params, bh: u32, r0: u32, part: u32, g: Grad, mul: f32, ty: u32, tx: u32) {
    add_row(prm, bh, r0 + ty, part, g.g0[0], g.g1[0], mul, tx);
    add_row(prm, bh, r0 + ty + 8u, part, g.g0[1], g.g1[1], mul, tx);
    add_row(prm, bh, r0 + ty + 16u, part, g.g0[2], g.g1[2], mul, tx);
    add_row(prm, bh, r0 + ty + 24u, part, g.g0[3], g.g1[3], mul, tx);
}

// p·(dp − delta) where `live`, else 0, with p = exp(s − lse): one score column of backward_q.
fn grad_column(s: vec4<f32>, dp: vec4<f32>, ls: vec4<f32>, dl: vec4<f32>, live: vec4<bool>) -> vec4<f32> {
    return select(vec4(0.0), exp(s - ls) * (dp - dl), live);
}

// exp(s − lse) where `live`, else 0: one score column of backward_kv.
fn prob_column(s: vec4<f32>, ls: f32, live: vec4<bool>) -> vec4<f32> {
    return select(vec4(0.0), exp(s - vec4(ls)), live);
}

@compute @workgroup_size(NT)
fn blocked_backward_q(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= pq.b * pq.h) {
        return;
    }
    // late blocks see the most keys: they go first
    let q0 = (nwg.x - 1u - wid.x) * CB;
    let ty = lid / 8u;
    let tx = lid % 8u;
    load_qkv(pq, bh, q0, 0u, pq.scale, R0, lid);
    load_dout(pq, bh, q0, R1, lid);
    workgroupBarrier();
    for (var r = lid; r < CB; r += NT) {
        let row = min(q0 + r, pq.t - 1u);
        let oa = out_row(pq, bh, row);
        var dl = 0.0;
        for (var d = 0u; d < DIM; d++) {
            dl += sm[R1 + r * SD4 + d / 4u][d % 4u] * f32(out_saved[oa + d]);
        }
        stat[r] = dl;
        if (q0 + r < pq.t) {
            delta[bh * pq.t + row] = dl;
        }
    }
    workgroupBarrier();
    let rows = vec4(q0 + ty) + vec4(0u, 8u, 16u, 24u);
    let at = vec4(bh * pq.t) + min(rows, vec4(pq.t - 1u));
    let ls = vec4(lse_saved[at.x], lse_saved[at.y], lse_saved[at.z], lse_saved[at.w]);
    let dl = vec4(stat[ty], stat[ty + 8u], stat[ty + 16u], stat[ty + 24u]);
    var dq = Grad();
    let keys = min(q0 + CB, pq.t);
    for (var k0 = 0u; k0 < keys; k0 += CB) {
        load_qkv(pq, bh, k0, 1u, 1.0, T0, lid);
        load_qkv(pq, bh, k0, 2u, 1.0, T1, lid);
        workgroupBarrier();
        // column c: key k0 + tx + 8c; component i: query row i
        let s = scores(R0, T0, ty, tx);
        let dp = scores(R1, T1, ty, tx);
        let key = k0 + tx;
        let ds = mat4x4<f32>(grad_column(s[0], dp[0], ls, dl, rows >= vec4(key)),
                             grad_column(s[1], dp[1], ls, dl, rows >= vec4(key + 8u)),
                             grad_column(s[2], dp[2], ls, dl, rows >= vec4(key + 16u)),
                             grad_column(s[3], dp[3], ls, dl, rows >= vec4(key + 24u)));
        store_scores(P0, ds, ty, tx);
        workgroupBarrier();
        dq = accumulate(dq, P0, T0, ty, tx);
        workgroupBarrier();
    }
    add_rows(pq, bh, q0, 0u, dq, pq.scale, ty, tx);
}

@compute @workgroup_size(NT)
fn blocked_backward_kv(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= pk.b * pk.h) {
        return;
    }
    // early blocks are seen by the most queries: they go first
    let k0 = wid.x * CB;
    let ty = lid / 8u;
    let tx = lid % 8u;
    load_qkv(pk, bh, k0, 1u, pk.scale, R0, lid);
    load_qkv(pk, bh, k0, 2u, 1.0, R1, lid);
    let keys = vec4(k0 + ty) + vec4(0u, 8u, 16u, 24u);
    var dk = Grad();
    var dv = Grad();
    // Queries before the block's first key see none of its keys.
    for (var q0 = k0; q0 < pk.t; q0 += CB) {
        load_qkv(pk, bh, q0, 0u, 1.0, T0, lid);
        load_dout(pk, bh, q0, T1, lid);
        if (lid < CB) {
            let r = bh * pk.t + min(q0 + lid, pk.t - 1u);
            stat[lid] = lse_saved[r];
            stat[CB + lid] = delta[r];
        }
        workgroupBarrier();
        // transposed scores: column c is query q0 + tx + 8c, component i key row i
        let s = scores(R0, T0, ty, tx);
        let dp = scores(R1, T1, ty, tx);
        let q = vec4(q0 + tx) + vec4(0u, 8u, 16u, 24u);
        let live = q < vec4(pk.t);
        let p = mat4x4<f32>(prob_column(s[0], stat[tx], (keys <= vec4(q.x)) & vec4(live.x)),
                            prob_column(s[1], stat[tx + 8u], (keys <= vec4(q.y)) & vec4(live.y)),
                            prob_column(s[2], stat[tx + 16u], (keys <= vec4(q.z)) & vec4(live.z)),
                            prob_column(s[3], stat[tx + 24u], (keys <= vec4(q.w)) & vec4(live.w)));
        let ds = mat4x4<f32>(p[0] * (dp[0] - vec4(stat[CB + tx])), p[1] * (dp[1] - vec4(stat[CB + tx + 8u])),
                             p[2] * (dp[2] - vec4(stat[CB + tx + 16u])), p[3] * (dp[3] - vec4(stat[CB + tx + 24u])));
        store_scores(P0, p, ty, tx);
        store_scores(P1, ds, ty, tx);
        workgroupBarrier();
        dv = accumulate(dv, P0, T1, ty, tx);
        dk = accumulate(dk, P1, T0, ty, tx);
        workgroupBarrier();
    }
    add_rows(pk, bh, k0, 1u, dk, pk.scale, ty, tx);
    add_rows(pk, bh, k0, 2u, dv, 1.0, ty, tx);
}
