// attention_coop: fused causal self-attention forward on cooperative matrices (tensor cores), for
// qkv in f16 and head size 64. The contract of attention_blocked.wgsl's forward:
//   coop_forward: out (B,T,C) = softmax(scale·q·kᵀ + causal mask)·v, lse (B,H,T) per query row
// (lse in units of the scaled scores), so either backward takes its results.
// A workgroup of 4 subgroups of 32 lanes owns 64 query rows of one (batch, head), 16 rows a
// subgroup, and streams tiles of 64 key rows through workgroup memory; tiles wholly above the causal
// diagonal are never visited. Each 16x16 score fragment goes to its subgroup's f32 scratch,
// where the lanes read it (lane l has row l % 16, columns 32·(l / 16)..+32), take the online
// softmax's running maximum and sum, and write the probabilities in f16 for P·V. Cooperative
// matrices give no access to single elements, so the output accumulators cannot be rescaled in
// place: each tile's P·V comes back through the scratch and each lane adds it to its 32 outputs,
// kept in registers. (An earlier form took two passes, the row statistics first and then exact
// probabilities, to keep O in fragments: one more Q·Kᵀ and K staging a tile; H200, GPT-2 small
// f16 step: 6.9 ms against this form's 5.7.)
// A subgroup's scratch and probability rows are its own, so a subgroup barrier (not the
// workgroup's) orders their round trips; workgroup barriers guard only the shared tiles. (naga
// gives subgroupBarrier subgroup-memory semantics only: that it orders workgroup memory within a
// subgroup is the driver's behaviour, checked by tests/coop_matrix.rs where cooperative matrices
// run.) A tile's loads are all issued before any is stored (H200, GPT-2 small f16 step: 5.7 ->
// 3.5 ms), but not a tile ahead, into registers during the current one: that took the forward
// from 6.9 to 11.9 ms (and from 3.5 to 8.3 with the batched loads).
// Strides of cooperative loads and stores count elements of the array they address (vec4s here).
// grid (ceil(T/64), B·H folded into y and z); heavy (late) blocks run first. Needs subgroups of
// exactly 32 lanes (the launcher checks).
// CPU reference: tests/common/reference.rs `attention_forward`.

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
// vec4 chunks of a staged tile each thread fetches.
const CHUNKS: u32 = ROWS * DIM / 4u / THREADS;

@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read_write> lse: array<f32>;
// (f16: the launcher refuses f32 qkv; the element type is B2 only because f16 views must bind
// through the Bi aliases)
@group(0) @binding(2) var<storage, read> qkv: array<vec4<B2>>;
@group(0) @binding(3) var<uniform> p: Params;

// Staged rows: the block's queries (then each tile's keys), the tile's values, and each
// subgroup's 16 probability rows.
var<workgroup> ks: array<vec4<f16>, ROWS * KP4>;
var<workgroup> vs: array<vec4<f16>, ROWS * KP4>;
var<workgroup> ps: array<vec4<f16>, ROWS * KP4>;
// Each subgroup's 16 rows of scores (then of its outputs), f32.
var<workgroup> ss: array<f32, ROWS * SP>;

// Rows r0..r0+63 of part `part` (0 q, 1 k, 2 v) as this thread's CHUNKS chunks of 4 halves,
// all loads issued before any is used; rows past T are zero.
fn fetch_rows(bh: u32, r0: u32, part: u32, lid: u32) -> array<vec4<f16>, CHUNKS> {
    var r: array<vec4<f16>, CHUNKS>;
    for (var i = 0u; i < CHUNKS; i++) {
        let e = lid + i * THREADS;
        let row = e / (DIM / 4u);
        let at = qkv_row(p, bh, min(r0 + row, p.t - 1u), part) / 4u + e % (DIM / 4u);
        r[i] = select(vec4<f16>(0.0), vec4<f16>(qkv[at]), r0 + row < p.t);
    }
    return r;
}

// Fetched rows into ks (`to_v` false) or vs.
fn put_rows(r: array<vec4<f16>, CHUNKS>, to_v: bool, lid: u32) {
    for (var i = 0u; i < CHUNKS; i++) {
        let e = lid + i * THREADS;
        let at = (e / (DIM / 4u)) * KP4 + e % (DIM / 4u);
        if (to_v) {
            vs[at] = r[i];
        } else {
            ks[at] = r[i];
        }
    }
}

// Fragment of the staged queries (rows r0.., head columns d0..) as the left operand.
fn frag_q(r0: u32, d0: u32) -> coop_mat16x16<f16, A> {
    let ptr = &ks[(r0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

// Fragment of the staged keys as the right operand kᵀ (head columns d0.., keys k0..).
fn frag_kt(d0: u32, k0: u32) -> coop_mat16x16<f16, B> {
    let ptr = &ks[(k0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoad<coop_mat16x16<f16, B>>(ptr, stride);
}

// Scores of the subgroup's 16 rows against keys k0..k0+15 of the staged tile, into its scratch.
fn scores(q0: coop_mat16x16<f16, A>, q1: coop_mat16x16<f16, A>, q2: coop_mat16x16<f16, A>,
          q3: coop_mat16x16<f16, A>, k0: u32, sg: u32) {
    var s: coop_mat16x16<f32, C>;
    s = coopMultiplyAdd(q0, frag_kt(0u, k0), s);
    s = coopMultiplyAdd(q1, frag_kt(16u, k0), s);
    s = coopMultiplyAdd(q2, frag_kt(32u, k0), s);
    s = coopMultiplyAdd(q3, frag_kt(48u, k0), s);
    let r = s;
    let ptr = &ss[sg * 16u * SP + k0];
    let stride = SP;
    coopStoreT(r, ptr, stride);
}

// This lane's 32 scaled scores of the tile at key k0 for query row `q`, masked above the diagonal.
fn lane_scores(sg: u32, lane: u32, q: u32, k0: u32) -> array<f32, 32> {
    var s: array<f32, 32>;
    let base = (sg * 16u + lane % 16u) * SP + (lane / 16u) * 32u;
    let key0 = k0 + (lane / 16u) * 32u;
    for (var j = 0u; j < 32u; j++) {
        s[j] = select(MASKED, ss[base + j] * p.scale, key0 + j <= q);
    }
    return s;
}

// Fragment of the subgroup's probability rows (keys k0..) as the left operand.
fn frag_p(sg: u32, k0: u32) -> coop_mat16x16<f16, A> {
    let ptr = &ps[(sg * 16u * KP + k0) / 4u];
    let stride = KP4;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

// Fragment of the staged values (keys k0.., head columns d0..) as the right operand.
fn frag_v(k0: u32, d0: u32) -> coop_mat16x16<f16, B> {
    let ptr = &vs[(k0 * KP + d0) / 4u];
    let stride = KP4;
    return coopLoadT<coop_mat16x16<f16, B>>(ptr, stride);
}

// acc + P·V over the 64 keys of the tile, for head columns d0..d0+15.
fn accumulate(acc: coop_mat16x16<f32, C>, p0: coop_mat16x16<f16, A>, p1: coop_mat16x16<f16, A>,
              p2: coop_mat16x16<f16, A>, p3: coop_mat16x16<f16, A>, d0: u32) -> coop_mat16x16<f32, C> {
    var o = acc;
    o = coopMultiplyAdd(p0, frag_v(0u, d0), o);
    o = coopMultiplyAdd(p1, frag_v(16u, d0), o);
    o = coopMultiplyAdd(p2, frag_v(32u, d0), o);
    o = coopMultiplyAdd(p3, frag_v(48u, d0), o);
    return o;
}

// Stores output fragment `o` (head columns d0..) into the subgroup's scratch.
fn store_out_frag(o: coop_mat16x16<f32, C>, sg: u32, d0: u32) {
    let ptr = &ss[sg * 16u * SP + d0];
    let stride = SP;
    coopStoreT(o, ptr, stride);
}

@compute @workgroup_size(THREADS)
fn coop_forward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    if (bh >= p.b * p.h) {
        return;
    }
    let sg = lid / 32u;
    let lane = lid % 32u;
    let q0 = (nwg.x - 1u - wid.x) * ROWS;
    // this lane's query row
    let q = q0 + sg * 16u + lane % 16u;

    put_rows(fetch_rows(bh, q0, 0u, lid), false, lid);
    workgroupBarrier();
    let qf0 = frag_q(sg * 16u, 0u);
    let qf1 = frag_q(sg * 16u, 16u);
    let qf2 = frag_q(sg * 16u, 32u);
    let qf3 = frag_q(sg * 16u, 48u);
    workgroupBarrier();

    // One pass with the online softmax. Fragments cannot be rescaled, so each lane keeps its
    // 32 outputs (row q, head columns 32·(lane / 16)..+32) in registers: every tile's P·V comes
    // back through the subgroup's scratch and is added to them after they are rescaled to the new
    // row maximum (which the two lanes of a row share, so their partial sums are in one unit).
    let keys = min(q0 + ROWS, p.t);
    var m = MASKED;
    var l = 0.0;
    var o: array<f32, 32>;
    let prow = (sg * 16u + lane % 16u) * KP4 + (lane / 16u) * 8u;
    let orow = (sg * 16u + lane % 16u) * SP + (lane / 16u) * 32u;
    for (var k0 = 0u; k0 < keys; k0 += ROWS) {
        // every load of the tile in flight at once (H200: 5.7 -> 3.5 ms a GPT-2 small step,
        // against a loop of four loads, then four stores, and so on)
        let kr = fetch_rows(bh, k0, 1u, lid);
        let vr = fetch_rows(bh, k0, 2u, lid);
        put_rows(kr, false, lid);
        put_rows(vr, true, lid);
        workgroupBarrier();
        scores(qf0, qf1, qf2, qf3, 0u, sg);
        scores(qf0, qf1, qf2, qf3, 16u, sg);
        scores(qf0, qf1, qf2, qf3, 32u, sg);
        scores(qf0, qf1, qf2, qf3, 48u, sg);
        subgroupBarrier();
        let s = lane_scores(sg, lane, q, k0);
        var mt = m;
        for (var j = 0u; j < 32u; j++) {
            mt = max(mt, s[j]);
        }
        mt = max(mt, subgroupShuffleXor(mt, 16u));
        let rescale = exp(m - mt);
        var lt = 0.0;
        for (var j4 = 0u; j4 < 8u; j4++) {
            let e = exp(vec4(s[4u * j4], s[4u * j4 + 1u], s[4u * j4 + 2u], s[4u * j4 + 3u]) - mt);
            lt += e.x + e.y + e.z + e.w;
            ps[prow + j4] = vec4<f16>(e);
        }
        l = l * rescale + lt;
        m = mt;
        subgroupBarrier();
        let p0 = frag_p(sg, 0u);
        let p1 = frag_p(sg, 16u);
        let p2 = frag_p(sg, 32u);
        let p3 = frag_p(sg, 48u);
        var zero: coop_mat16x16<f32, C>;
        let r0 = accumulate(zero, p0, p1, p2, p3, 0u);
        store_out_frag(r0, sg, 0u);
        let r1 = accumulate(zero, p0, p1, p2, p3, 16u);
        store_out_frag(r1, sg, 16u);
        let r2 = accumulate(zero, p0, p1, p2, p3, 32u);
        store_out_frag(r2, sg, 32u);
        let r3 = accumulate(zero, p0, p1, p2, p3, 48u);
        store_out_frag(r3, sg, 48u);
        subgroupBarrier();
        for (var j = 0u; j < 32u; j++) {
            o[j] = o[j] * rescale + ss[orow + j];
        }
        workgroupBarrier();
    }
    let row_l = l + subgroupShuffleXor(l, 16u);
    let row_lse = m + log(row_l);

    if (q < p.t) {
        let at = out_row(p, bh, q) + (lane / 16u) * 32u;
        for (var j = 0u; j < 32u; j++) {
            out[at + j] = B0(o[j] / row_l);
        }
        if (lane < 16u) {
            lse[bh * p.t + q] = row_lse;
        }
    }
}
