// matmul_coop: C[b] = alpha * op(A[b]) . op(B[b]) + beta * C[b] (+ bias), for b < batch, with A and
// B in f16 on cooperative matrices (tensor cores), products accumulated in f32. One of A, B may
// be f32 (B1, B2): it is rounded to f16 as its tiles are staged (mixed-precision products). The same product,
// Params and layouts as `matmul_large` (shaders/matmul_large.wgsl); C may be f32 or f16 (B0).
//   c (batch, M, N) row-major;  a (M,K), or (K,M) when FLAGS & 1;  b (K,N), or (N,K) when FLAGS & 2;
//   bias (N) f32 when FLAGS & 4;  FLAGS & 8: beta != 0 (C is read).
// Bindings: c, a, b, bias, a4, b4, c32, c16, Params. a4 and b4 are a and b again, read 8 elements at a
// time when FLAGS & 16 (A) or FLAGS & 32 (B): the operand's stored rows are a multiple of 8 long
// (or padded to one with zeros: `row_stride`) and start 8-aligned; otherwise each element is read
// alone (any shape), and a4/b4 go unused. They are bound as raw 16-byte words: one word holds 8
// halves (FLAGS & 512 for A, 1024 for B; H200, 4096^3 NN 151 -> 159 TFLOP/s and GPT-2 small's
// f16 step 62.8 -> 60.5 ms against two 8-byte loads), two the floats of an f32 operand.
// FLAGS & 128: both are read so and every chunk the tiles fetch lies inside the operands'
// buffers, zero where a slice runs past K (the launcher checks): no fetch is tested against the
// bounds (H200, 4096^3 NN 147 -> 156 TFLOP/s; the same test as a uniform branch ran 82).
// FLAGS & 256: M and N are multiples of 128, so the epilogue tests none either.
// Tiling: a workgroup of 4 subgroups of 32 lanes computes a 128x128 tile of C, each subgroup
// 64x64 of it as 4x4 accumulators of 16x16. K advances 32 at a time through one workgroup buffer
// of f16 tiles per operand that keeps the global layout (so each operand is read coalesced and
// each 16x16 fragment loads row- or column-major from it): each slice is fetched, stored, and
// multiplied between two barriers. Workgroups of 128 threads (registers to R252) in 24 KiB of
// workgroup memory run two to an SM, so one multiplies while the other waits on memory (H100,
// 4096^3 NN / NT / TN 159-163 / 156-160 / 158-162 -> 221-231 / 200-207 / 233-242 TFLOP/s against
// 8 subgroups of 64x32 fetching 64-deep slices ahead in registers; the same 4x4 subgroups at 64
// deep 155 / 158-161 / 154-156, with two buffers an operand and one barrier a slice (44 KiB)
// 153 / 144 / 133-155). No slice is fetched ahead in WGSL: the driver's compiler already issues
// the next slice's loads among the current slice's multiplies, and written out it only spills
// (190 / 177 / 101-198). The two 16-deep steps of a slice are written out, not looped: the
// accumulators are named variables.
// Accumulators go through a 16x16 f32 scratch per subgroup to the guarded epilogue (alpha, bias,
// beta, f16 rounding; subgroup barriers, as in attention_coop.wgsl, and stores along C's rows:
// H200, GPT-2 small f16 step, 59.6 -> 52.2 ms of products), except in whole tiles of a plain
// f32 C (FLAGS & 64, alpha = 1), which go straight to C.
// Dispatch (ceil(N/128), ceil(M/128), batch), the tiles taken in groups of GROUP rows. Needs
// subgroups of exactly 32 lanes (the launcher checks).
// CPU reference: tests/common/reference.rs `matmul_forward`.

// Params: matmul::Params in src/kernels/matmul.rs (gpu_params!: the WGSL struct is made from it)

@group(0) @binding(0) var<storage, read_write> c: array<B0>;
@group(0) @binding(1) var<storage, read> a: array<B1>;
@group(0) @binding(2) var<storage, read> b: array<B2>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
// (a and b again, or a stand-in where they go unused)
@group(0) @binding(4) var<storage, read> a4: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> b4: array<vec4<u32>>;
// c again when FLAGS & 64 (C f32, rows a multiple of 4 long, 4-aligned, no bias), else a
// stand-in: whole tiles with alpha = 1 then load and store their accumulators here directly.
@group(0) @binding(6) var<storage, read_write> c32: array<f32>;
// c again when FLAGS & 2048 (C f16, rows a multiple of 4 long, 4-aligned), else a stand-in: the
// epilogue stores 4 halves at a time through it, packed in two words.
@group(0) @binding(7) var<storage, read_write> c16: array<vec2<u32>>;
@group(0) @binding(8) var<uniform> p: Params;

const CT: u32 = 128u;
const CK: u32 = 32u;
const GROUP: u32 = 16u;
// Halves of padding after each stored row: 16-byte fragment rows then fall in distinct banks.
const PAD: u32 = 8u;
// The buffer of one operand in vec4s: 128 rows of CK + PAD, or CK rows of 128 + PAD (the larger).
const BUF: u32 = CT * (CK + PAD) / 4u;
// 4 subgroups: 2 down M by 2 across N, each 64x64 of the tile as 4x4 accumulators (16 multiplies
// for 8 fragment loads a 16-deep step).
const THREADS: u32 = 128u;
// 8-half chunks each thread fetches per operand and slice (128 x 32 halves / 8 / THREADS): the
// four registers xa0..xa3 and xb0..xb3 of the main loop.
const CHUNKS: u32 = CT * CK / 8u / THREADS;
const_assert CHUNKS == 4u;
const TRANS_A: bool = (FLAGS & 1u) != 0u;
const TRANS_B: bool = (FLAGS & 2u) != 0u;
const BIAS: bool = (FLAGS & 4u) != 0u;
const ACCUMULATE: bool = (FLAGS & 8u) != 0u;
const VEC_A: bool = (FLAGS & 16u) != 0u;
const VEC_B: bool = (FLAGS & 32u) != 0u;
const DIRECT_C: bool = (FLAGS & 64u) != 0u;
const LOADS_INSIDE: bool = (FLAGS & 128u) != 0u;
const TILES_WHOLE: bool = (FLAGS & 256u) != 0u;
const A_HALVES: bool = (FLAGS & 512u) != 0u;
const B_HALVES: bool = (FLAGS & 1024u) != 0u;
const PACKED_C: bool = (FLAGS & 2048u) != 0u;

// [stored row][halves of the row + PAD] as vec4<f16>; fragments load straight from them
// (cooperative loads count strides in vec4s).
var<workgroup> As: array<vec4<f16>, BUF>;
var<workgroup> Bs: array<vec4<f16>, BUF>;
// One 16x16 f32 accumulator per subgroup on its way to C.
var<workgroup> Cs: array<f32, THREADS * 8u>;

// Whether an operand's depth (K) is its contiguous dimension: A (M,K) and B stored (N,K).
fn depth_inner(is_a: bool) -> bool {
    return select(TRANS_B, !TRANS_A, is_a);
}

// Halves in a stored row of an operand's tile: CK where depth is contiguous, else 128.
fn tile_inner(is_a: bool) -> u32 {
    return select(CT, CK, depth_inner(is_a));
}

// Global bounds of an operand as stored: (rows, row length).
fn operand_dims(is_a: bool) -> vec2<u32> {
    if (is_a) {
        return select(vec2<u32>(p.m, p.k), vec2<u32>(p.k, p.m), TRANS_A);
    }
    return select(vec2<u32>(p.k, p.n), vec2<u32>(p.n, p.k), TRANS_B);
}

// Elements from one stored row of an operand to the next: its row length, or more where the
// launcher pads A's rows (Gemm::a_stride; the padding is finite, so whole chunks may read it).
fn row_stride(is_a: bool) -> u32 {
    if (is_a) {
        return select(p.a_rs, p.a_cs, TRANS_A);
    }
    return select(p.b_rs, p.b_cs, TRANS_B);
}

// 8 elements of an operand read 16 bytes at a time from element `at` (a multiple of 8).
fn load8(is_a: bool, at: u32) -> array<vec4<f16>, 2> {
    if ((is_a && A_HALVES) || (!is_a && B_HALVES)) {
        var w: vec4<u32>;
        if (is_a) {
            w = a4[at / 8u];
        } else {
            w = b4[at / 8u];
        }
        // (naga 30 has no bitcast from u32 to vec2<f16>; the round trip through f32 is exact)
        let lo = vec4<f16>(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)));
        let hi = vec4<f16>(vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
        return array<vec4<f16>, 2>(lo, hi);
    }
    var w0: vec4<u32>;
    var w1: vec4<u32>;
    if (is_a) {
        w0 = a4[at / 4u];
        w1 = a4[at / 4u + 1u];
    } else {
        w0 = b4[at / 4u];
        w1 = b4[at / 4u + 1u];
    }
    return array<vec4<f16>, 2>(vec4<f16>(bitcast<vec4<f32>>(w0)), vec4<f16>(bitcast<vec4<f32>>(w1)));
}

// 4 halves of an operand from element `at` (in row `gr`, column `gc` of the stored layout) read
// one at a time, zero outside the matrix.
fn fetch4(is_a: bool, at: u32, gr: u32, gc: u32) -> vec4<f16> {
    let dims = operand_dims(is_a);
    var h = vec4<f16>(0.0);
    if (gr >= dims.x) {
        return h;
    }
    for (var i = 0u; i < 4u; i++) {
        if (gc + i < dims.y) {
            if (is_a) {
                h[i] = f16(a[at + i]);
            } else {
                h[i] = f16(b[at + i]);
            }
        }
    }
    return h;
}

// Where chunk q of an operand's tile lies: its stored row, and its first half in that row. A
// 16-byte store is served 8 lanes at a time, and rows of CK + PAD halves lie 5 16-byte units
// apart: two neighbouring rows' 4 chunks put lanes 0 and 7 in the same banks (stored at half
// speed), rows r and r + 4 fill all 8 bank groups. So where depth is contiguous, each 8 lanes
// take rows r and r + 4 of a group of 8 rows, 4 chunks each: their loads stay two rows' 64
// contiguous bytes (H100, 4096^3 NN / NT 233 / 212 -> 242 / 216 TFLOP/s, TN unchanged at 246;
// the kernel without global loads, a probe, 308 / 292 -> 339 / 341. Lanes taking one chunk of 8
// rows each stored without conflicts but loaded slower: NN 187).
// (The same holds at other depths: 8 lanes take rows j, j + P, ... of each 8, P chunks each,
// for P = CK / 8 chunks a row of P + 1 units.)
fn chunk_place(is_a: bool, q: u32) -> vec2<u32> {
    let per_row = tile_inner(is_a) / 8u;
    if (depth_inner(is_a)) {
        let lanes = q % 8u;
        let row = (q / (8u * per_row)) * 8u + (q / 8u) % per_row + (lanes / per_row) * per_row;
        return vec2<u32>(row, (lanes % per_row) * 8u);
    }
    return vec2<u32>(q / per_row, (q % per_row) * 8u);
}

// Chunk q (< CT * CK / 8) of the slice at depth k0 of the tile at rows (A) or columns (B) t0: 8 halves.
fn fetch(is_a: bool, base: u32, t0: u32, k0: u32, q: u32) -> array<vec4<f16>, 2> {
    let place = chunk_place(is_a, q);
    let r = place.x;
    let c8 = place.y;
    // stored (row, column) of the chunk's first half
    var gr = k0 + r;
    var gc = t0 + c8;
    if (depth_inner(is_a)) {
        gr = t0 + r;
        gc = k0 + c8;
    }
    let at = base + gr * row_stride(is_a) + gc;
    if ((is_a && VEC_A) || (!is_a && VEC_B)) {
        // rows a multiple of 8 long: a chunk is wholly inside or outside the row
        if (!LOADS_INSIDE) {
            let dims = operand_dims(is_a);
            if (gr >= dims.x || gc >= dims.y) {
                return array<vec4<f16>, 2>(vec4<f16>(0.0), vec4<f16>(0.0));
            }
        }
        return load8(is_a, at);
    }
    return array<vec4<f16>, 2>(fetch4(is_a, at, gr, gc), fetch4(is_a, at + 4u, gr, gc + 4u));
}

// Writes chunk q into an operand's workgroup buffer, at its place in the padded stored layout.
fn put(is_a: bool, q: u32, v: array<vec4<f16>, 2>) {
    let place = chunk_place(is_a, q);
    let at = (place.x * (tile_inner(is_a) + PAD) + place.y) / 4u;
    if (is_a) {
        As[at] = v[0];
        As[at + 1u] = v[1];
    } else {
        Bs[at] = v[0];
        Bs[at + 1u] = v[1];
    }
}

// Fragment (rows r0.., depths k0..) of op(A) from its workgroup buffer.
fn frag_a(r0: u32, k0: u32) -> coop_mat16x16<f16, A> {
    if (TRANS_A) {
        let ptr = &As[(k0 * (CT + PAD) + r0) / 4u];
        let stride = (CT + PAD) / 4u;
        return coopLoad<coop_mat16x16<f16, A>>(ptr, stride);
    }
    let ptr = &As[(r0 * (CK + PAD) + k0) / 4u];
    let stride = (CK + PAD) / 4u;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

// Fragment (depths k0.., columns n0..) of op(B) from its workgroup buffer.
fn frag_b(k0: u32, n0: u32) -> coop_mat16x16<f16, B> {
    if (TRANS_B) {
        let ptr = &Bs[(n0 * (CK + PAD) + k0) / 4u];
        let stride = (CK + PAD) / 4u;
        return coopLoad<coop_mat16x16<f16, B>>(ptr, stride);
    }
    let ptr = &Bs[(k0 * (CT + PAD) + n0) / 4u];
    let stride = (CT + PAD) / 4u;
    return coopLoadT<coop_mat16x16<f16, B>>(ptr, stride);
}
// Writes accumulator `r` to C at (gm0, gn0) through subgroup `sg`'s scratch, with alpha, bias
// and beta·C, in bounds only. Lane l takes column l % 16 of rows 8 (l / 16)..+8, so each store
// writes two rows of 16 neighbours; or, where C is f16 and packed (PACKED_C), 4 neighbours of
// rows l / 4 and 8 + l / 4 at a time (H200: every product with an f16 C 1-4 % faster, 17.0 ->
// 16.7 ms of GPT-2 small's f16 step; the epilogue without its barriers and stores, a probe, took
// the step 60.0 -> 58.0 ms: the barriers are the cost). The scratch is the subgroup's own, so a
// subgroup barrier orders it. Every subgroup calls it the same number of times (the barriers
// stay uniform).
fn store_frag(r: coop_mat16x16<f32, C>, gm0: u32, gn0: u32, c_base: u32, sg: u32, lane: u32) {
    let scratch = sg * 256u;
    let ptr = &Cs[scratch];
    let stride = 16u;
    coopStoreT(r, ptr, stride);
    subgroupBarrier();
    if (PACKED_C) {
        let col = (lane % 4u) * 4u;
        let gn = gn0 + col;
        // (N is a multiple of 4: the 4 columns are all in C or none is)
        if (TILES_WHOLE || gn < p.n) {
            var add = vec4<f32>(0.0);
            if (BIAS) {
                add = vec4<f32>(bias[gn], bias[gn + 1u], bias[gn + 2u], bias[gn + 3u]);
            }
            for (var j = 0u; j < 2u; j++) {
                let row = j * 8u + lane / 4u;
                let gm = gm0 + row;
                if (TILES_WHOLE || gm < p.m) {
                    let at = (c_base + gm * p.n + gn) / 4u;
                    let s = scratch + row * 16u + col;
                    var v = p.alpha * vec4<f32>(Cs[s], Cs[s + 1u], Cs[s + 2u], Cs[s + 3u]) + add;
                    if (ACCUMULATE) {
                        let w = c16[at];
                        v += p.beta * vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
                    }
                    c16[at] = vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));
                }
            }
        }
    } else {
        let col = lane % 16u;
        let gn = gn0 + col;
        // (TILES_WHOLE: every element of the tile is in C)
        if (TILES_WHOLE || gn < p.n) {
            var add = 0.0;
            if (BIAS) {
                add = bias[gn];
            }
            for (var j = 0u; j < 8u; j++) {
                let row = (lane / 16u) * 8u + j;
                let gm = gm0 + row;
                if (TILES_WHOLE || gm < p.m) {
                    let idx = c_base + gm * p.n + gn;
                    var v = p.alpha * Cs[scratch + row * 16u + col] + add;
                    if (ACCUMULATE) {
                        v += p.beta * f32(c[idx]);
                    }
                    c[idx] = B0(v);
                }
            }
        }
    }
    subgroupBarrier();
}

@compute @workgroup_size(THREADS)
fn matmul_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let sg = tid / 32u;
    let lane = tid % 32u;
    // Tiles in groups of GROUP rows, column by column within a group: the workgroups running at
    // once share more rows of A and columns of B than in row order (L2 reuse; H200, GPT-2 small
    // f16 step 66.7 -> 66.0 ms in groups of 8, 65.2 -> 64.9 for 16 against 8).
    let id = wid.y * nwg.x + wid.x;
    let per_group = GROUP * nwg.x;
    let first = (id / per_group) * GROUP;
    let rows = min(nwg.y - first, GROUP);
    let m0 = (first + (id % per_group) % rows) * CT;
    let n0 = ((id % per_group) / rows) * CT;
    // this subgroup's 64x64 of the tile
    let sm = (sg / 2u) * 64u;
    let sn = (sg % 2u) * 64u;
    let a_base = p.a_off + wid.z * p.stride_a;
    let b_base = p.b_off + wid.z * p.stride_b;
    let c_base = p.c_off + wid.z * p.stride_c;

    // accumulators acc{i}{j}: rows sm + 16i, columns sn + 16j (named, not an array: the
    // compiler keeps them in registers; `acc`, since c32 names a binding)
    var acc00: coop_mat16x16<f32, C>;
    var acc01: coop_mat16x16<f32, C>;
    var acc02: coop_mat16x16<f32, C>;
    var acc03: coop_mat16x16<f32, C>;
    var acc10: coop_mat16x16<f32, C>;
    var acc11: coop_mat16x16<f32, C>;
    var acc12: coop_mat16x16<f32, C>;
    var acc13: coop_mat16x16<f32, C>;
    var acc20: coop_mat16x16<f32, C>;
    var acc21: coop_mat16x16<f32, C>;
    var acc22: coop_mat16x16<f32, C>;
    var acc23: coop_mat16x16<f32, C>;
    var acc30: coop_mat16x16<f32, C>;
    var acc31: coop_mat16x16<f32, C>;
    var acc32: coop_mat16x16<f32, C>;
    var acc33: coop_mat16x16<f32, C>;
    // Whole tiles of an f32 C with alpha = 1 skip the scratch: accumulators start from C (beta
    // = 1) and are stored straight to it (a uniform choice: the whole workgroup takes it).
    // (`&`, not `&&`: a short circuit is a branch, which the uniformity analysis cannot follow)
    let direct = DIRECT_C & p.alpha == 1.0 & (!ACCUMULATE | p.beta == 1.0) & m0 + CT <= p.m & n0 + CT <= p.n;
    let at = c_base + (m0 + sm) * p.n + n0 + sn;
    // (pointers and strides as `let`s: naga 30 loses them inside cooperative calls otherwise)
    let stride = p.n;
    if (direct & ACCUMULATE) {
        let pc00 = &c32[at + 0u * p.n + 0u];
        acc00 = coopLoadT<coop_mat16x16<f32, C>>(pc00, stride);
        let pc01 = &c32[at + 0u * p.n + 16u];
        acc01 = coopLoadT<coop_mat16x16<f32, C>>(pc01, stride);
        let pc02 = &c32[at + 0u * p.n + 32u];
        acc02 = coopLoadT<coop_mat16x16<f32, C>>(pc02, stride);
        let pc03 = &c32[at + 0u * p.n + 48u];
        acc03 = coopLoadT<coop_mat16x16<f32, C>>(pc03, stride);
        let pc10 = &c32[at + 16u * p.n + 0u];
        acc10 = coopLoadT<coop_mat16x16<f32, C>>(pc10, stride);
        let pc11 = &c32[at + 16u * p.n + 16u];
        acc11 = coopLoadT<coop_mat16x16<f32, C>>(pc11, stride);
        let pc12 = &c32[at + 16u * p.n + 32u];
        acc12 = coopLoadT<coop_mat16x16<f32, C>>(pc12, stride);
        let pc13 = &c32[at + 16u * p.n + 48u];
        acc13 = coopLoadT<coop_mat16x16<f32, C>>(pc13, stride);
        let pc20 = &c32[at + 32u * p.n + 0u];
        acc20 = coopLoadT<coop_mat16x16<f32, C>>(pc20, stride);
        let pc21 = &c32[at + 32u * p.n + 16u];
        acc21 = coopLoadT<coop_mat16x16<f32, C>>(pc21, stride);
        let pc22 = &c32[at + 32u * p.n + 32u];
        acc22 = coopLoadT<coop_mat16x16<f32, C>>(pc22, stride);
        let pc23 = &c32[at + 32u * p.n + 48u];
        acc23 = coopLoadT<coop_mat16x16<f32, C>>(pc23, stride);
        let pc30 = &c32[at + 48u * p.n + 0u];
        acc30 = coopLoadT<coop_mat16x16<f32, C>>(pc30, stride);
        let pc31 = &c32[at + 48u * p.n + 16u];
        acc31 = coopLoadT<coop_mat16x16<f32, C>>(pc31, stride);
        let pc32 = &c32[at + 48u * p.n + 32u];
        acc32 = coopLoadT<coop_mat16x16<f32, C>>(pc32, stride);
        let pc33 = &c32[at + 48u * p.n + 48u];
        acc33 = coopLoadT<coop_mat16x16<f32, C>>(pc33, stride);
    }
    let slices = (p.k + CK - 1u) / CK;
    for (var s = 0u; s < slices; s++) {
        let k0 = s * CK;
        // all eight fetches issued before any store: one trip to memory a slice
        let xa0 = fetch(true, a_base, m0, k0, tid + 0u * THREADS);
        let xa1 = fetch(true, a_base, m0, k0, tid + 1u * THREADS);
        let xa2 = fetch(true, a_base, m0, k0, tid + 2u * THREADS);
        let xa3 = fetch(true, a_base, m0, k0, tid + 3u * THREADS);
        let xb0 = fetch(false, b_base, n0, k0, tid + 0u * THREADS);
        let xb1 = fetch(false, b_base, n0, k0, tid + 1u * THREADS);
        let xb2 = fetch(false, b_base, n0, k0, tid + 2u * THREADS);
        let xb3 = fetch(false, b_base, n0, k0, tid + 3u * THREADS);
        put(true, tid + 0u * THREADS, xa0);
        put(true, tid + 1u * THREADS, xa1);
        put(true, tid + 2u * THREADS, xa2);
        put(true, tid + 3u * THREADS, xa3);
        put(false, tid + 0u * THREADS, xb0);
        put(false, tid + 1u * THREADS, xb1);
        put(false, tid + 2u * THREADS, xb2);
        put(false, tid + 3u * THREADS, xb3);
        workgroupBarrier();
        // depths 0..15
        let a0_0 = frag_a(sm + 0u, 0u);
        let a1_0 = frag_a(sm + 16u, 0u);
        let a2_0 = frag_a(sm + 32u, 0u);
        let a3_0 = frag_a(sm + 48u, 0u);
        let b0_0 = frag_b(0u, sn + 0u);
        let b1_0 = frag_b(0u, sn + 16u);
        let b2_0 = frag_b(0u, sn + 32u);
        let b3_0 = frag_b(0u, sn + 48u);
        acc00 = coopMultiplyAdd(a0_0, b0_0, acc00);
        acc01 = coopMultiplyAdd(a0_0, b1_0, acc01);
        acc02 = coopMultiplyAdd(a0_0, b2_0, acc02);
        acc03 = coopMultiplyAdd(a0_0, b3_0, acc03);
        acc10 = coopMultiplyAdd(a1_0, b0_0, acc10);
        acc11 = coopMultiplyAdd(a1_0, b1_0, acc11);
        acc12 = coopMultiplyAdd(a1_0, b2_0, acc12);
        acc13 = coopMultiplyAdd(a1_0, b3_0, acc13);
        acc20 = coopMultiplyAdd(a2_0, b0_0, acc20);
        acc21 = coopMultiplyAdd(a2_0, b1_0, acc21);
        acc22 = coopMultiplyAdd(a2_0, b2_0, acc22);
        acc23 = coopMultiplyAdd(a2_0, b3_0, acc23);
        acc30 = coopMultiplyAdd(a3_0, b0_0, acc30);
        acc31 = coopMultiplyAdd(a3_0, b1_0, acc31);
        acc32 = coopMultiplyAdd(a3_0, b2_0, acc32);
        acc33 = coopMultiplyAdd(a3_0, b3_0, acc33);
        // depths 16..31
        let a0_16 = frag_a(sm + 0u, 16u);
        let a1_16 = frag_a(sm + 16u, 16u);
        let a2_16 = frag_a(sm + 32u, 16u);
        let a3_16 = frag_a(sm + 48u, 16u);
        let b0_16 = frag_b(16u, sn + 0u);
        let b1_16 = frag_b(16u, sn + 16u);
        let b2_16 = frag_b(16u, sn + 32u);
        let b3_16 = frag_b(16u, sn + 48u);
        acc00 = coopMultiplyAdd(a0_16, b0_16, acc00);
        acc01 = coopMultiplyAdd(a0_16, b1_16, acc01);
        acc02 = coopMultiplyAdd(a0_16, b2_16, acc02);
        acc03 = coopMultiplyAdd(a0_16, b3_16, acc03);
        acc10 = coopMultiplyAdd(a1_16, b0_16, acc10);
        acc11 = coopMultiplyAdd(a1_16, b1_16, acc11);
        acc12 = coopMultiplyAdd(a1_16, b2_16, acc12);
        acc13 = coopMultiplyAdd(a1_16, b3_16, acc13);
        acc20 = coopMultiplyAdd(a2_16, b0_16, acc20);
        acc21 = coopMultiplyAdd(a2_16, b1_16, acc21);
        acc22 = coopMultiplyAdd(a2_16, b2_16, acc22);
        acc23 = coopMultiplyAdd(a2_16, b3_16, acc23);
        acc30 = coopMultiplyAdd(a3_16, b0_16, acc30);
        acc31 = coopMultiplyAdd(a3_16, b1_16, acc31);
        acc32 = coopMultiplyAdd(a3_16, b2_16, acc32);
        acc33 = coopMultiplyAdd(a3_16, b3_16, acc33);
        workgroupBarrier();
    }

    if (direct) {
        let d00 = acc00;
        let pd00 = &c32[at + 0u * p.n + 0u];
        coopStoreT(d00, pd00, stride);
        let d01 = acc01;
        let pd01 = &c32[at + 0u * p.n + 16u];
        coopStoreT(d01, pd01, stride);
        let d02 = acc02;
        let pd02 = &c32[at + 0u * p.n + 32u];
        coopStoreT(d02, pd02, stride);
        let d03 = acc03;
        let pd03 = &c32[at + 0u * p.n + 48u];
        coopStoreT(d03, pd03, stride);
        let d10 = acc10;
        let pd10 = &c32[at + 16u * p.n + 0u];
        coopStoreT(d10, pd10, stride);
        let d11 = acc11;
        let pd11 = &c32[at + 16u * p.n + 16u];
        coopStoreT(d11, pd11, stride);
        let d12 = acc12;
        let pd12 = &c32[at + 16u * p.n + 32u];
        coopStoreT(d12, pd12, stride);
        let d13 = acc13;
        let pd13 = &c32[at + 16u * p.n + 48u];
        coopStoreT(d13, pd13, stride);
        let d20 = acc20;
        let pd20 = &c32[at + 32u * p.n + 0u];
        coopStoreT(d20, pd20, stride);
        let d21 = acc21;
        let pd21 = &c32[at + 32u * p.n + 16u];
        coopStoreT(d21, pd21, stride);
        let d22 = acc22;
        let pd22 = &c32[at + 32u * p.n + 32u];
        coopStoreT(d22, pd22, stride);
        let d23 = acc23;
        let pd23 = &c32[at + 32u * p.n + 48u];
        coopStoreT(d23, pd23, stride);
        let d30 = acc30;
        let pd30 = &c32[at + 48u * p.n + 0u];
        coopStoreT(d30, pd30, stride);
        let d31 = acc31;
        let pd31 = &c32[at + 48u * p.n + 16u];
        coopStoreT(d31, pd31, stride);
        let d32 = acc32;
        let pd32 = &c32[at + 48u * p.n + 32u];
        coopStoreT(d32, pd32, stride);
        let d33 = acc33;
        let pd33 = &c32[at + 48u * p.n + 48u];
        coopStoreT(d33, pd33, stride);
    } else {
        let r00 = acc00;
        store_frag(r00, m0 + sm + 0u, n0 + sn + 0u, c_base, sg, lane);
        let r01 = acc01;
        store_frag(r01, m0 + sm + 0u, n0 + sn + 16u, c_base, sg, lane);
        let r02 = acc02;
        store_frag(r02, m0 + sm + 0u, n0 + sn + 32u, c_base, sg, lane);
        let r03 = acc03;
        store_frag(r03, m0 + sm + 0u, n0 + sn + 48u, c_base, sg, lane);
        let r10 = acc10;
        store_frag(r10, m0 + sm + 16u, n0 + sn + 0u, c_base, sg, lane);
        let r11 = acc11;
        store_frag(r11, m0 + sm + 16u, n0 + sn + 16u, c_base, sg, lane);
        let r12 = acc12;
        store_frag(r12, m0 + sm + 16u, n0 + sn + 32u, c_base, sg, lane);
        let r13 = acc13;
        store_frag(r13, m0 + sm + 16u, n0 + sn + 48u, c_base, sg, lane);
        let r20 = acc20;
        store_frag(r20, m0 + sm + 32u, n0 + sn + 0u, c_base, sg, lane);
        let r21 = acc21;
        store_frag(r21, m0 + sm + 32u, n0 + sn + 16u, c_base, sg, lane);
        let r22 = acc22;
        store_frag(r22, m0 + sm + 32u, n0 + sn + 32u, c_base, sg, lane);
        let r23 = acc23;
        store_frag(r23, m0 + sm + 32u, n0 + sn + 48u, c_base, sg, lane);
        let r30 = acc30;
        store_frag(r30, m0 + sm + 48u, n0 + sn + 0u, c_base, sg, lane);
        let r31 = acc31;
        store_frag(r31, m0 + sm + 48u, n0 + sn + 16u, c_base, sg, lane);
        let r32 = acc32;
        store_frag(r32, m0 + sm + 48u, n0 + sn + 32u, c_base, sg, lane);
        let r33 = acc33;
        store_frag(r33, m0 + sm + 48u, n0 + sn + 48u, c_base, sg, lane);
    }
}
