// attention_coop: the causal attention forward (same contract as blocked_forward in
// attention_blocked.wgsl: out (B,T,C) = softmax(scale·q·kᵀ + causal mask)·v, lse (B,H,T)) for
// f16 q, k, v of head size 64, with both products on cooperative matrices (tensor cores).
// A workgroup of 4 subgroups owns 64 query rows of one (batch, head), 16 per subgroup, and
// streams 64-key tiles of K and V through workgroup memory; tiles wholly above the diagonal are
// never visited. Per tile each subgroup multiplies its Q fragments (kept from the start) by the
// K tile into four 16x16 f32 score blocks, stores them to its own scratch, and its lanes run
// the online softmax there — lane l owns half of row l / 2 (32 keys), the running maximum shared
// with its partner lane by a shuffle — writing P in f16 for the second product; P·V comes back
// through the same scratch and is added to the lane's 32 output accumulators (registers),
// rescaled as the maximum moves. Workgroup barriers (not subgroup ones: WGSL has none that
// order workgroup memory) separate the steps, the same count in every subgroup.
// Bindings: out (f16 or f32), lse (f32), qkv as vec4<f16>, Params. Needs subgroups of 32 lanes.
// grid (ceil(T/64), B·H folded into y and z); late (heavy) blocks run first.
// CPU reference: tests/common/reference.rs `attention_forward`.

struct Params {
    b: u32,
    t: u32,
    h: u32,
    scale: f32,
}

const D: u32 = 64u;
const ROWS: u32 = 64u;
const KEYS: u32 = 64u;
const THREADS: u32 = 128u;
// Halves in a stored row of a Q, K, V or P tile: 64 and 8 of padding, so 16-byte fragment rows
// fall on distinct banks.
const ROW_H: u32 = 72u;
// The same in vec4<f16> (cooperative loads count strides in the array's elements).
const ROW_V: u32 = ROW_H / 4u;
const TILE_V: u32 = KEYS * ROW_V;
// A subgroup's 16 x 64 f32 scratch (scores, then P·V).
const SCRATCH: u32 = 16u * KEYS;
const MASKED: f32 = -3.0e38;

@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read_write> lse: array<f32>;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<B2>>;
@group(0) @binding(3) var<uniform> p: Params;

// K (then Q at the start) and V tiles, rows of 64 halves + padding.
var<workgroup> ks: array<vec4<f16>, TILE_V>;
var<workgroup> vs: array<vec4<f16>, TILE_V>;
// Each subgroup's P: 16 rows of 64 halves + padding.
var<workgroup> ps: array<vec4<f16>, 4u * 16u * ROW_V>;
var<workgroup> scratch: array<f32, 4u * SCRATCH>;

// Loads rows t0.. (64 of them, zero past T) of part (0 q, 1 k, 2 v) of head bh into a tile.
fn load_tile(bh: u32, t0: u32, part: u32, to_v: bool, tid: u32) {
    let c4 = p.h * D / 4u;
    // 64 rows x 16 vec4s: 8 per thread
    for (var i = 0u; i < KEYS * 16u / THREADS; i++) {
        let e = tid + i * THREADS;
        let r = e / 16u;
        let c = e % 16u;
        let t = t0 + r;
        var v = vec4<f16>(0.0);
        if (t < p.t) {
            v = vec4<f16>(qkv[((bh / p.h) * p.t + t) * 3u * c4 + part * c4 + (bh % p.h) * 16u + c]);
        }
        if (to_v) {
            vs[r * ROW_V + c] = v;
        } else {
            ks[r * ROW_V + c] = v;
        }
    }
}

// Fragment of rows r0.., depths d0.. of the row-major tile in ks (A: Q at the start).
fn q_frag(r0: u32, d0: u32) -> coop_mat16x16<f16, A> {
    let ptr = &ks[r0 * ROW_V + d0 / 4u];
    let stride = ROW_V;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

// Kᵀ fragment (depths d0.., keys k0..): K rows are keys, so this is K read column-major.
fn kt_frag(d0: u32, k0: u32) -> coop_mat16x16<f16, B> {
    let ptr = &ks[k0 * ROW_V + d0 / 4u];
    let stride = ROW_V;
    return coopLoad<coop_mat16x16<f16, B>>(ptr, stride);
}

// V fragment (keys k0.., depths d0..), row-major.
fn v_frag(k0: u32, d0: u32) -> coop_mat16x16<f16, B> {
    let ptr = &vs[k0 * ROW_V + d0 / 4u];
    let stride = ROW_V;
    return coopLoadT<coop_mat16x16<f16, B>>(ptr, stride);
}

// P fragment (this subgroup's 16 rows, keys k0..), row-major.
fn p_frag(sg: u32, k0: u32) -> coop_mat16x16<f16, A> {
    let ptr = &ps[sg * 16u * ROW_V + k0 / 4u];
    let stride = ROW_V;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

fn to_scratch(r: coop_mat16x16<f32, C>, sg: u32, col: u32) {
    let ptr = &scratch[sg * SCRATCH + col];
    let stride = KEYS;
    coopStoreT(r, ptr, stride);
}

@compute @workgroup_size(THREADS)
fn coop_forward(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let bh = wid.y + wid.z * nwg.y;
    // (every thread of a workgroup takes the same branch: the barriers below stay uniform)
    if (bh >= p.b * p.h) {
        return;
    }
    let sg = tid / 32u;
    let lane = tid % 32u;
    let q0 = (nwg.x - 1u - wid.x) * ROWS;
    // the half row this lane owns: row `row` of the subgroup's 16, keys / depths half·32..
    let row = lane / 2u;
    let half = lane % 2u;
    let query = q0 + sg * 16u + row;

    load_tile(bh, q0, 0u, false, tid);
    workgroupBarrier();
    let qf0 = q_frag(sg * 16u, 0u);
    let qf1 = q_frag(sg * 16u, 16u);
    let qf2 = q_frag(sg * 16u, 32u);
    let qf3 = q_frag(sg * 16u, 48u);
    workgroupBarrier();

    var o: array<f32, 32>;
    var m = MASKED;
    var l = 0.0;
    let keys = min(q0 + ROWS, p.t);
    for (var k0 = 0u; k0 < keys; k0 += KEYS) {
        load_tile(bh, k0, 1u, false, tid);
        load_tile(bh, k0, 2u, true, tid);
        workgroupBarrier();
        // scores of keys k0 + 16n.. for the subgroup's rows
        for (var n = 0u; n < 4u; n++) {
            var s: coop_mat16x16<f32, C>;
            s = coopMultiplyAdd(qf0, kt_frag(0u, n * 16u), s);
            s = coopMultiplyAdd(qf1, kt_frag(16u, n * 16u), s);
            s = coopMultiplyAdd(qf2, kt_frag(32u, n * 16u), s);
            s = coopMultiplyAdd(qf3, kt_frag(48u, n * 16u), s);
            let r = s;
            to_scratch(r, sg, n * 16u);
        }
        workgroupBarrier();
        // online softmax over this lane's 32 keys
        let base = sg * SCRATCH + row * KEYS + half * 32u;
        var mt = MASKED;
        for (var j = 0u; j < 32u; j++) {
            let key = k0 + half * 32u + j;
            let x = select(MASKED, scratch[base + j] * p.scale, key <= query && key < p.t);
            scratch[base + j] = x;
            mt = max(mt, x);
        }
        mt = max(mt, subgroupShuffleXor(mt, 1u));
        let m_new = max(m, mt);
        let corr = exp(m - m_new);
        m = m_new;
        var sum = 0.0;
        let prow = (sg * 16u + row) * ROW_V + half * 8u;
        for (var j = 0u; j < 8u; j++) {
            var pv: vec4<f32>;
            for (var c = 0u; c < 4u; c++) {
                let x = scratch[base + 4u * j + c];
                pv[c] = select(0.0, exp(x - m_new), x > MASKED);
            }
            sum += pv.x + pv.y + pv.z + pv.w;
            ps[prow + j] = vec4<f16>(pv);
        }
        l = l * corr + sum;
        for (var i = 0u; i < 32u; i++) {
            o[i] *= corr;
        }
        workgroupBarrier();
        // P·V for depths 16n..
        for (var n = 0u; n < 4u; n++) {
            var acc: coop_mat16x16<f32, C>;
            acc = coopMultiplyAdd(p_frag(sg, 0u), v_frag(0u, n * 16u), acc);
            acc = coopMultiplyAdd(p_frag(sg, 16u), v_frag(16u, n * 16u), acc);
            acc = coopMultiplyAdd(p_frag(sg, 32u), v_frag(32u, n * 16u), acc);
            acc = coopMultiplyAdd(p_frag(sg, 48u), v_frag(48u, n * 16u), acc);
            let r = acc;
            to_scratch(r, sg, n * 16u);
        }
        workgroupBarrier();
        for (var i = 0u; i < 32u; i++) {
            o[i] += scratch[base + i];
        }
        workgroupBarrier();
    }
    // the row's sum is the two halves'
    let total = l + subgroupShuffleXor(l, 1u);
    if (query < p.t) {
        if (half == 0u) {
            lse[bh * p.t + query] = m + log(total);
        }
        let at = ((bh / p.h) * p.t + query) * p.h * D + (bh % p.h) * D + half * 32u;
        for (var i = 0u; i < 32u; i++) {
            out[at + i] = B0(o[i] / total);
        }
    }
}
