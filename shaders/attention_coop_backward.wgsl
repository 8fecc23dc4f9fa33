// attention_coop_backward: the causal attention backward on cooperative matrices (tensor cores), for
// qkv in f16 and head size 64: attention_lanes.wgsl's contract, bindings and results (up to
// summation order and f16 rounding of the probabilities and score gradients):
//   coop_backward_q:  delta (B,H,T) = Σ_d dout·out;  dqkv[q] += scale · Σ_j p·(dout·v_j − delta)·k_j
//   coop_backward_kv: dqkv[v] += Σ_i p·dout_i;  dqkv[k] += scale · Σ_i p·(dout_i·v − delta_i)·q_i
//                     (reads delta, so it runs after coop_backward_q)
// A workgroup of 4 subgroups of 32 lanes owns 64 rows of one (batch, head) — queries in _q, keys
// in _kv — 16 a subgroup, whose operands stay in fragments, and streams tiles of 64 rows of the
// other side through workgroup memory. Products that need single elements (the probabilities
// p = exp(s − lse), the score gradients p·(dp − delta)) go through the subgroup's scratch: lane l
// has row l % 16, columns 32·(l / 16)..+32, and writes them back in f16 as the next product's
// left operand. dout is rounded to f16 as it is staged. In _q the next tile of the other side
// travels from memory into registers while the current one is multiplied (H200, GPT-2 small f16
// step: _q 6.1 -> 4.1 ms, _kv 6.9 -> 5.0, which now loads each tile at once as it needs it: 4.3);
// subgroup barriers order each subgroup's own scratch (see attention_coop.wgsl).
// grid (ceil(T/64), B·H folded into y and z); the heavy blocks go first (late queries, early keys).
// Needs subgroups of exactly 32 lanes (the launcher checks).
// CPU reference: tests/common/reference.rs `attention_backward`.

// Params: attention::Params in src/kernels/attention.rs; qkv_row, out_row: shaders/attention_layout.wgsl

const_assert DIM == 64u;
const ROWS: u32 = 64u;
const THREADS: u32 = 128u;
// Halves of a staged row: 64 and 8 of padding, so that fragment rows fall in distinct banks.
const KP: u32 = DIM + 8u;
const KP4: u32 = KP / 4u;
// Floats of a scratch row (a multiple of 4: strides of cooperative stores are whole 16 bytes).
const SP: u32 = ROWS + 4u;
const MASKED: f32 = -3.0e38;
// dqkv is overwritten (not read), not added to: a new gradient (FLAGS & 1).
const OVERWRITE: bool = (FLAGS & 1u) != 0u;
// vec4 chunks of a staged tile each thread fetches.
const CHUNKS: u32 = ROWS * DIM / 4u / THREADS;

// coop_backward_q: 0 dqkv, 1 delta, 2 qkv, 3 dout, 4 lse, 5 out, 6 params
// coop_backward_kv: the same without out: params at 5
@group(0) @binding(0) var<storage, read_write> dqkv: array<B0>;
@group(0) @binding(1) var<storage, read_write> delta: array<f32>;
// (f16: the launcher refuses f32 qkv)
@group(0) @binding(2) var<storage, read> qkv: array<vec4<B2>>;
@group(0) @binding(3) var<storage, read> dout: array<vec4<B3>>;
@group(0) @binding(4) var<storage, read> lse_saved: array<f32>;
@group(0) @binding(5) var<storage, read> out_saved: array<vec4<B5>>;
@group(0) @binding(6) var<uniform> pq: Params;
@group(0) @binding(5) var<uniform> pk: Params;

// Staged rows: xs the other side's q or k, ys its dout or v, ps each subgroup's 16 rows of f16
// probabilities or score gradients.
var<workgroup> xs: array<vec4<f16>, ROWS * KP4>;
var<workgroup> ys: array<vec4<f16>, ROWS * KP4>;
var<workgroup> ps: array<vec4<f16>, ROWS * KP4>;
// Each subgroup's 16 rows of f32 products, then of its results.
var<workgroup> ss: array<f32, ROWS * SP>;
// _kv: lse, then delta, of the staged queries.
var<workgroup> stat: array<f32, 2u * ROWS>;

// Rows r0..r0+63 of part `part` (0 q, 1 k, 2 v) of qkv, or of dout where `part` is 3, as this
// thread's 8 chunks of 4 halves, fetched into registers while the current tile is multiplied;
// rows past T are zero.
fn fetch_rows(prm: Params, bh: u32, r0: u32, part: u32, lid: u32) -> array<vec4<f16>, CHUNKS> {
    var r: array<vec4<f16>, CHUNKS>;
    for (var i = 0u; i < CHUNKS; i++) {
        let e = lid + i * THREADS;
        let row = e / (DIM / 4u);
        let c4 = e % (DIM / 4u);
        let t = min(r0 + row, prm.t - 1u);
        var v: vec4<f16>;
        if (part == 3u) {
            v = vec4<f16>(dout[out_row(prm, bh, t) / 4u + c4]);
        } else {
            v = vec4<f16>(qkv[qkv_row(prm, bh, t, part) / 4u + c4]);
        }
        r[i] = select(vec4<f16>(0.0), v, r0 + row < prm.t);
    }
    return r;
}

// Fetched rows into xs (`to_y` false) or ys.
fn put_rows(r: array<vec4<f16>, CHUNKS>, to_y: bool, lid: u32) {
    for (var i = 0u; i < CHUNKS; i++) {
        let e = lid + i * THREADS;
        let at = (e / (DIM / 4u)) * KP4 + e % (DIM / 4u);
        if (to_y) {
            ys[at] = r[i];
        } else {
            xs[at] = r[i];
        }
    }
}

// Fragments of staged rows r0.. (head columns d0..): as the left operand (a row each), as the
// right operand transposed (a column each: rows·xᵀ) and as it is (the rows' head columns).
fn left_x(r0: u32, d0: u32) -> coop_mat16x16<f16, A> {
    let ptr = &xs[(r0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

fn left_y(r0: u32, d0: u32) -> coop_mat16x16<f16, A> {
    let ptr = &ys[(r0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

fn right_xt(d0: u32, r0: u32) -> coop_mat16x16<f16, B> {
    let ptr = &xs[(r0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoad<coop_mat16x16<f16, B>>(ptr, stride);
}

fn right_yt(d0: u32, r0: u32) -> coop_mat16x16<f16, B> {
    let ptr = &ys[(r0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoad<coop_mat16x16<f16, B>>(ptr, stride);
}

fn right_x(r0: u32, d0: u32) -> coop_mat16x16<f16, B> {
    let ptr = &xs[(r0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoadT<coop_mat16x16<f16, B>>(ptr, stride);
}

fn right_y(r0: u32, d0: u32) -> coop_mat16x16<f16, B> {
    let ptr = &ys[(r0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoadT<coop_mat16x16<f16, B>>(ptr, stride);
}

// Fragment of the subgroup's f16 rows in ps (columns c0..) as the left operand.
fn left_p(sg: u32, c0: u32) -> coop_mat16x16<f16, A> {
    let ptr = &ps[(sg * 16u * KP + c0) / 4u];
    let stride = KP4;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

// Stores fragment `f` at columns c0.. of the subgroup's scratch rows.
fn to_scratch(f: coop_mat16x16<f32, C>, sg: u32, c0: u32) {
    let ptr = &ss[sg * 16u * SP + c0];
    let stride = SP;
    coopStoreT(f, ptr, stride);
}

// Columns c0..c0+15 of the subgroup's 16 rows (fragments a0..a3 over the head columns) times the
// staged rows of xs, transposed, into its scratch; `_y`: of ys.
fn product_xt(a0: coop_mat16x16<f16, A>, a1: coop_mat16x16<f16, A>, a2: coop_mat16x16<f16, A>,
              a3: coop_mat16x16<f16, A>, c0: u32, sg: u32) {
    var s: coop_mat16x16<f32, C>;
    s = coopMultiplyAdd(a0, right_xt(0u, c0), s);
    s = coopMultiplyAdd(a1, right_xt(16u, c0), s);
    s = coopMultiplyAdd(a2, right_xt(32u, c0), s);
    s = coopMultiplyAdd(a3, right_xt(48u, c0), s);
    let r = s;
    to_scratch(r, sg, c0);
}

fn product_yt(a0: coop_mat16x16<f16, A>, a1: coop_mat16x16<f16, A>, a2: coop_mat16x16<f16, A>,
              a3: coop_mat16x16<f16, A>, c0: u32, sg: u32) {
    var s: coop_mat16x16<f32, C>;
    s = coopMultiplyAdd(a0, right_yt(0u, c0), s);
    s = coopMultiplyAdd(a1, right_yt(16u, c0), s);
    s = coopMultiplyAdd(a2, right_yt(32u, c0), s);
    s = coopMultiplyAdd(a3, right_yt(48u, c0), s);
    let r = s;
    to_scratch(r, sg, c0);
}

// acc + (the subgroup's f16 rows in ps, fragments p0..p3) · (the staged rows of xs), head
// columns d0..d0+15; `_y`: of ys.
fn accumulate_x(acc: coop_mat16x16<f32, C>, p0: coop_mat16x16<f16, A>, p1: coop_mat16x16<f16, A>,
                p2: coop_mat16x16<f16, A>, p3: coop_mat16x16<f16, A>, d0: u32) -> coop_mat16x16<f32, C> {
    var o = acc;
    o = coopMultiplyAdd(p0, right_x(0u, d0), o);
    o = coopMultiplyAdd(p1, right_x(16u, d0), o);
    o = coopMultiplyAdd(p2, right_x(32u, d0), o);
    o = coopMultiplyAdd(p3, right_x(48u, d0), o);
    return o;
}

fn accumulate_y(acc: coop_mat16x16<f32, C>, p0: coop_mat16x16<f16, A>, p1: coop_mat16x16<f16, A>,
                p2: coop_mat16x16<f16, A>, p3: coop_mat16x16<f16, A>, d0: u32) -> coop_mat16x16<f32, C> {
    var o = acc;
    o = coopMultiplyAdd(p0, right_y(0u, d0), o);
    o = coopMultiplyAdd(p1, right_y(16u, d0), o);
    o = coopMultiplyAdd(p2, right_y(32u, d0), o);
    o = coopMultiplyAdd(p3, right_y(48u, d0), o);
    return o;
}

// Scratch offset of this lane's 32 values: row lane % 16 of subgroup sg, columns 32·(lane / 16)...
fn lane_at(sg: u32, lane: u32) -> u32 {
    return (sg * 16u + lane % 16u) * SP + (lane / 16u) * 32u;
}

// Writes this lane's 32 values to its place in the subgroup's f16 rows of ps.
fn lane_to_ps(v: array<f32, 32>, sg: u32, lane: u32) {
    let at = (sg * 16u + lane % 16u) * KP4 + (lane / 16u) * 8u;
    for (var j4 = 0u; j4 < 8u; j4++) {
        ps[at + j4] = vec4<f16>(vec4(v[4u * j4], v[4u * j4 + 1u], v[4u * j4 + 2u], v[4u * j4 + 3u]));
    }
}

// dqkv row `row`, part `part`, += (or, OVERWRITE, =) mul · this lane's 32 scratch values (head
// columns 32·(lane / 16)..).
fn add_to_dqkv(prm: Params, bh: u32, row: u32, part: u32, mul: f32, sg: u32, lane: u32) {
    if (row < prm.t) {
        let at = qkv_row(prm, bh, row, part) + (lane / 16u) * 32u;
        let src = lane_at(sg, lane);
        for (var j = 0u; j < 32u; j++) {
            var prior = 0.0;
            if (!OVERWRITE) {
                prior = f32(dqkv[at + j]);
            }
            dqkv[at + j] = B0(prior + mul * ss[src + j]);
        }
    }
}

@compute @workgroup_size(THREADS)
fn coop_backward_q(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= pq.b * pq.h) {
        return;
    }
    let sg = lid / 32u;
    let lane = lid % 32u;
    let q0 = (nwg.x - 1u - wid.x) * ROWS;
    let q = q0 + sg * 16u + lane % 16u;
    let qc = min(q, pq.t - 1u);

    // delta of this lane's row: its half of the head columns, then its partner's
    let o_at = out_row(pq, bh, qc) / 4u + (lane / 16u) * 8u;
    var part = 0.0;
    for (var j4 = 0u; j4 < 8u; j4++) {
        part += dot(vec4<f32>(dout[o_at + j4]), vec4<f32>(out_saved[o_at + j4]));
    }
    let row_delta = part + subgroupShuffleXor(part, 16u);
    if (q < pq.t && lane < 16u) {
        delta[bh * pq.t + q] = row_delta;
    }
    let row_lse = lse_saved[bh * pq.t + qc];

    put_rows(fetch_rows(pq, bh, q0, 0u, lid), false, lid);
    put_rows(fetch_rows(pq, bh, q0, 3u, lid), true, lid);
    workgroupBarrier();
    let qf0 = left_x(sg * 16u, 0u);
    let qf1 = left_x(sg * 16u, 16u);
    let qf2 = left_x(sg * 16u, 32u);
    let qf3 = left_x(sg * 16u, 48u);
    let df0 = left_y(sg * 16u, 0u);
    let df1 = left_y(sg * 16u, 16u);
    let df2 = left_y(sg * 16u, 32u);
    let df3 = left_y(sg * 16u, 48u);
    workgroupBarrier();

    var dq0: coop_mat16x16<f32, C>;
    var dq1: coop_mat16x16<f32, C>;
    var dq2: coop_mat16x16<f32, C>;
    var dq3: coop_mat16x16<f32, C>;
    let keys = min(q0 + ROWS, pq.t);
    let at = lane_at(sg, lane);
    var kr = fetch_rows(pq, bh, 0u, 1u, lid);
    var vr = fetch_rows(pq, bh, 0u, 2u, lid);
    for (var k0 = 0u; k0 < keys; k0 += ROWS) {
        put_rows(kr, false, lid);
        put_rows(vr, true, lid);
        workgroupBarrier();
        if (k0 + ROWS < keys) {
            kr = fetch_rows(pq, bh, k0 + ROWS, 1u, lid);
            vr = fetch_rows(pq, bh, k0 + ROWS, 2u, lid);
        }
        // p = exp(scale·q·k − lse), masked above the diagonal
        product_xt(qf0, qf1, qf2, qf3, 0u, sg);
        product_xt(qf0, qf1, qf2, qf3, 16u, sg);
        product_xt(qf0, qf1, qf2, qf3, 32u, sg);
        product_xt(qf0, qf1, qf2, qf3, 48u, sg);
        subgroupBarrier();
        var pv: array<f32, 32>;
        let key0 = k0 + (lane / 16u) * 32u;
        for (var j = 0u; j < 32u; j++) {
            pv[j] = select(0.0, exp(ss[at + j] * pq.scale - row_lse), key0 + j <= q);
        }
        subgroupBarrier();
        // dp = dout·vᵀ; ds = p·(dp − delta)
        product_yt(df0, df1, df2, df3, 0u, sg);
        product_yt(df0, df1, df2, df3, 16u, sg);
        product_yt(df0, df1, df2, df3, 32u, sg);
        product_yt(df0, df1, df2, df3, 48u, sg);
        subgroupBarrier();
        for (var j = 0u; j < 32u; j++) {
            pv[j] *= ss[at + j] - row_delta;
        }
        lane_to_ps(pv, sg, lane);
        subgroupBarrier();
        // dq += ds·k
        let s0 = left_p(sg, 0u);
        let s1 = left_p(sg, 16u);
        let s2 = left_p(sg, 32u);
        let s3 = left_p(sg, 48u);
        dq0 = accumulate_x(dq0, s0, s1, s2, s3, 0u);
        dq1 = accumulate_x(dq1, s0, s1, s2, s3, 16u);
        dq2 = accumulate_x(dq2, s0, s1, s2, s3, 32u);
        dq3 = accumulate_x(dq3, s0, s1, s2, s3, 48u);
        workgroupBarrier();
    }
    let r0 = dq0;
    to_scratch(r0, sg, 0u);
    let r1 = dq1;
    to_scratch(r1, sg, 16u);
    let r2 = dq2;
    to_scratch(r2, sg, 32u);
    let r3 = dq3;
    to_scratch(r3, sg, 48u);
    subgroupBarrier();
    add_to_dqkv(pq, bh, q, 0u, pq.scale, sg, lane);
}

@compute @workgroup_size(THREADS)
fn coop_backward_kv(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= pk.b * pk.h) {
        return;
    }
    let sg = lid / 32u;
    let lane = lid % 32u;
    // early keys see the most queries: they go first
    let k0 = wid.x * ROWS;
    let key = k0 + sg * 16u + lane % 16u;

    put_rows(fetch_rows(pk, bh, k0, 1u, lid), false, lid);
    put_rows(fetch_rows(pk, bh, k0, 2u, lid), true, lid);
    workgroupBarrier();
    let kf0 = left_x(sg * 16u, 0u);
    let kf1 = left_x(sg * 16u, 16u);
    let kf2 = left_x(sg * 16u, 32u);
    let kf3 = left_x(sg * 16u, 48u);
    let vf0 = left_y(sg * 16u, 0u);
    let vf1 = left_y(sg * 16u, 16u);
    let vf2 = left_y(sg * 16u, 32u);
    let vf3 = left_y(sg * 16u, 48u);
    workgroupBarrier();

    var dk0: coop_mat16x16<f32, C>;
    var dk1: coop_mat16x16<f32, C>;
    var dk2: coop_mat16x16<f32, C>;
    var dk3: coop_mat16x16<f32, C>;
    var dv0: coop_mat16x16<f32, C>;
    var dv1: coop_mat16x16<f32, C>;
    var dv2: coop_mat16x16<f32, C>;
    var dv3: coop_mat16x16<f32, C>;
    let at = lane_at(sg, lane);
    // the staged queries' lse and delta travel with them: lanes below ROWS fetch one row each
    let srow = min(lid, ROWS - 1u);
    for (var q0 = k0; q0 < pk.t; q0 += ROWS) {
        // (fetched as the tile is needed, not a tile ahead: H200, GPT-2 small f16 step 4.51 ->
        // 4.33 ms; _q keeps its fetch ahead: 3.85 against 3.90)
        let qr = fetch_rows(pk, bh, q0, 0u, lid);
        let dr = fetch_rows(pk, bh, q0, 3u, lid);
        let row = bh * pk.t + min(q0 + srow, pk.t - 1u);
        let lr = lse_saved[row];
        let er = delta[row];
        put_rows(qr, false, lid);
        put_rows(dr, true, lid);
        if (lid < ROWS) {
            stat[lid] = lr;
            stat[ROWS + lid] = er;
        }
        workgroupBarrier();
        // pᵀ = exp(scale·k·q − lse), masked below the diagonal and past T
        product_xt(kf0, kf1, kf2, kf3, 0u, sg);
        product_xt(kf0, kf1, kf2, kf3, 16u, sg);
        product_xt(kf0, kf1, kf2, kf3, 32u, sg);
        product_xt(kf0, kf1, kf2, kf3, 48u, sg);
        subgroupBarrier();
        var pt: array<f32, 32>;
        let c0 = (lane / 16u) * 32u;
        for (var j = 0u; j < 32u; j++) {
            let query = q0 + c0 + j;
            pt[j] = select(0.0, exp(ss[at + j] * pk.scale - stat[c0 + j]), key <= query && query < pk.t);
        }
        lane_to_ps(pt, sg, lane);
        subgroupBarrier();
        // dv += pᵀ·dout
        let p0 = left_p(sg, 0u);
        let p1 = left_p(sg, 16u);
        let p2 = left_p(sg, 32u);
        let p3 = left_p(sg, 48u);
        dv0 = accumulate_y(dv0, p0, p1, p2, p3, 0u);
        dv1 = accumulate_y(dv1, p0, p1, p2, p3, 16u);
        dv2 = accumulate_y(dv2, p0, p1, p2, p3, 32u);
        dv3 = accumulate_y(dv3, p0, p1, p2, p3, 48u);
        // dpᵀ = v·doutᵀ; dsᵀ = pᵀ·(dpᵀ − delta)
        product_yt(vf0, vf1, vf2, vf3, 0u, sg);
        product_yt(vf0, vf1, vf2, vf3, 16u, sg);
        product_yt(vf0, vf1, vf2, vf3, 32u, sg);
        product_yt(vf0, vf1, vf2, vf3, 48u, sg);
        subgroupBarrier();
        for (var j = 0u; j < 32u; j++) {
            pt[j] *= ss[at + j] - stat[ROWS + c0 + j];
        }
        lane_to_ps(pt, sg, lane);
        subgroupBarrier();
        // dk += dsᵀ·q
        let s0 = left_p(sg, 0u);
        let s1 = left_p(sg, 16u);
        let s2 = left_p(sg, 32u);
        let s3 = left_p(sg, 48u);
        dk0 = accumulate_x(dk0, s0, s1, s2, s3, 0u);
        dk1 = accumulate_x(dk1, s0, s1, s2, s3, 16u);
        dk2 = accumulate_x(dk2, s0, s1, s2, s3, 32u);
        dk3 = accumulate_x(dk3, s0, s1, s2, s3, 48u);
        workgroupBarrier();
    }
    let v0 = dv0;
    to_scratch(v0, sg, 0u);
    let v1 = dv1;
    to_scratch(v1, sg, 16u);
    let v2 = dv2;
    to_scratch(v2, sg, 32u);
    let v3 = dv3;
    to_scratch(v3, sg, 48u);
    subgroupBarrier();
    add_to_dqkv(pk, bh, key, 2u, 1.0, sg, lane);
    subgroupBarrier();
    let r0 = dk0;
    to_scratch(r0, sg, 0u);
    let r1 = dk1;
    to_scratch(r1, sg, 16u);
    let r2 = dk2;
    to_scratch(r2, sg, 32u);
    let r3 = dk3;
    to_scratch(r3, sg, 48u);
    subgroupBarrier();
    add_to_dqkv(pk, bh, key, 1u, pk.scale, sg, lane);
}
