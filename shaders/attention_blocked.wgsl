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
fn scores(xo: u32, yo: u32, ty: u32, tx: u32, rb4: u32) -> array<vec4<f32>, 4> {
    var s: array<vec4<f32>, 4>;
    for (var d = 0u; d < DP4; d++) {
        let y0 = sm[yo + tx * SD4 + d];
        let y1 = sm[yo + (tx + CB4) * SD4 + d];
        let y2 = sm[yo + (tx + 2u * CB4) * SD4 + d];
        let y3 = sm[yo + (tx + 3u * CB4) * SD4 + d];
        for (var i = 0u; i < 4u; i++) {
            let x = sm[xo + (ty + rb4 * i) * SD4 + d];
            s[i] += vec4(dot(x, y0), dot(x, y1), dot(x, y2), dot(x, y3));
        }
    }
    return s;
}

// Stores a score tile as probability rows (row ty + rb4·i, column tx + CB4·c) from vec4 offset po.
fn store_p(po: u32, s: array<vec4<f32>, 4>, ty: u32, tx: u32, rb4: u32) {
    for (var i = 0u; i < 4u; i++) {
        let row = po + (ty + rb4 * i) * PS4;
        for (var c = 0u; c < 4u; c++) {
            let j = tx + CB4 * c;
            sm[row + j / 4u][j % 4u] = s[i][c];
        }
    }
}

// acc[4·n + i] + Σ_j P[ty + rb4·i][j] · B[j][tx + CB4·n] over the CB columns of the probability
// rows at po and the CB data rows at bo. (By value, not through a pointer: the accumulators must
// stay registers once the compiler inlines this.)
fn accumulate(acc0: array<vec4<f32>, 4u * NC>, po: u32, bo: u32, ty: u32, tx: u32, rb4: u32) -> array<vec4<f32>, 4u * NC> {
    var acc = acc0;
    for (var j4 = 0u; j4 < CB4; j4++) {
        var a: array<vec4<f32>, 4>;
        for (var i = 0u; i < 4u; i++) {
            a[i] = sm[po + (ty + rb4 * i) * PS4 + j4];
        }
        for (var jj = 0u; jj < 4u; jj++) {
            let brow = bo + (4u * j4 + jj) * SD4;
            for (var n = 0u; n < NC; n++) {
                let bv = sm[brow + min(tx + CB4 * n, DP4 - 1u)];
                for (var i = 0u; i < 4u; i++) {
                    acc[4u * n + i] += a[i][jj] * bv;
                }
            }
        }
    }
    return acc;
}

// out rows r0 + ty + rb4·i (below T) = mul[i]·acc (forward). (Few branches: lavapipe compiles
// each one into the coroutine its barriers make, and that time grows fast with blocks.)
fn store_out(prm: Params, bh: u32, r0: u32, acc: array<vec4<f32>, 4u * NC>, mul: vec4<f32>, ty: u32, tx: u32, rb4: u32) {
    for (var i = 0u; i < 4u; i++) {
        let row = r0 + ty + rb4 * i;
        if (row < prm.t) {
            let a = out_row(prm, bh, row);
            for (var n = 0u; n < NC; n++) {
                let d0 = (tx + CB4 * n) * 4u;
                let v = acc[4u * n + i] * mul[i];
                for (var k = 0u; k < min(4u, DIM - min(d0, DIM)); k++) {
                    out[a + d0 + k] = B0(v[k]);
                }
            }
        }
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
        for (var i = 0u; i < 4u; i++) {
            s[i] = select(vec4(MASKED), s[i], key <= vec4(q0 + ty + rb4 * i));
            stat[(ty + rb4 * i) * CB4 + tx] = max(max(s[i].x, s[i].y), max(s[i].z, s[i].w));
        }
        workgroupBarrier();
        var mt = m;
        for (var i = 0u; i < 4u; i++) {
            for (var x = 0u; x < CB4; x++) {
                mt[i] = max(mt[i], stat[(ty + rb4 * i) * CB4 + x]);
            }
        }
        let corr = exp(m - mt);
        m = mt;
        for (var i = 0u; i < 4u; i++) {
            s[i] = exp(s[i] - vec4(mt[i]));
            l[i] = l[i] * corr[i] + s[i].x + s[i].y + s[i].z + s[i].w;
            for (var n = 0u; n < NC; n++) {
                acc[4u * n + i] *= corr[i];
            }
        }
        store_p(P0, s, ty, tx, rb4);
        workgroupBarrier();
        acc = accumulate(acc, P0, T1, ty, tx, rb4);
        workgroupBarrier();
    }
    // Row sums: each thread holds the part over its own key columns.
    for (var i = 0u; i < 4u; i++) {
        stat[(ty + rb4 * i) * CB4 + tx] = l[i];
    }
    workgroupBarrier();
    var lt = vec4(0.0);
    for (var i = 0u; i < 4u; i++) {
        for (var x = 0u; x < CB4; x++) {
            lt[i] += stat[(ty + rb4 * i) * CB4 + x];
        }
        let row = q0 + ty + rb4 * i;
        if (tx == 0u && row < p.t) {
            lse[bh * p.t + row] = m[i] + log(lt[i]);
        }
    }
    store_out(p, bh, q0, acc, 1.0 / lt, ty, tx, rb4);
}
