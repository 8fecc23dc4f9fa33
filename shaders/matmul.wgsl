// matmul: C[b] = alpha * op(A[b]) . op(B[b]) + beta * C[b] (+ bias), for b < batch.
//   c (batch, M, N) row-major;  a: op(A)[m,k] = a[b*stride_a + m*a_rs + k*a_cs];
//   b: op(B)[k,n] = b[b*stride_b + k*b_rs + n*b_cs];  bias (N) added when has_bias = 1.
// a_off, b_off, c_off shift all three by whole elements, so a product can work on a row chunk.
// c, a and b may each be f16 (B0, B1, B2: mixed precision); B may also be int8 with one scale per
// stored row (frozen weights, in `bq`). Loads widen to f32, products accumulate in f32.
// Bindings: c, a, b, bias, bq, bscale (unused ones get a small stand-in buffer), Params.
// Strides express transposes: A (M,K) has a_rs = K, a_cs = 1; Aᵀ of a (K,M) array has a_rs = 1, a_cs = M.
// beta = 1 accumulates (backward passes add into gradients); beta = 0 never reads C.
// Tiling: one workgroup of 16x16 threads computes a 64x64 tile of C, each thread a 4x4 block held in
// registers; K advances 16 at a time through workgroup memory. Loads are guarded (zero padding), so
// any M, N, K works. Dispatch (ceil(N/64), ceil(M/64), batch).
// matmul_direct (CPU adapters): shaders/matmul_direct.wgsl.
// matmul_large (big shapes on GPUs, 128x128 tiles): shaders/matmul_large.wgsl.
// CPU reference: tests/common/reference.rs `matmul_forward`.

// Params: matmul::Params in src/kernels/matmul.rs (gpu_params!: the WGSL struct is made from it)

@group(0) @binding(0) var<storage, read_write> c: array<B0>;
@group(0) @binding(1) var<storage, read> a: array<B1>;
@group(0) @binding(2) var<storage, read> b: array<B2>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> bq: array<u32>;
@group(0) @binding(5) var<storage, read> bscale: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

// Writes a thread's 4x4 block of C at (row0, col0): alpha·acc (+ bias) (+ beta·C), in bounds only.
fn store_block(row0: u32, col0: u32, c_base: u32, acc: array<vec4<f32>, 4>) {
    for (var i = 0u; i < 4u; i++) {
        let gm = row0 + i;
        if (gm >= p.m) {
            break;
        }
        for (var j = 0u; j < 4u; j++) {
            let gn = col0 + j;
            if (gn < p.n) {
                let idx = c_base + gm * p.n + gn;
                var v = p.alpha * acc[i][j];
                if (p.has_bias == 1u) {
                    v += bias[gn];
                }
                if (p.beta != 0.0) {
                    v += p.beta * f32(c[idx]);
                }
                c[idx] = B0(v);
            }
        }
    }
}

// Element `i` of B: f32 or f16, or int8 (sign-extended from its byte) times its row's scale.
fn load_b(i: u32) -> f32 {
    if (p.quant_b == 1u) {
        let byte = (bq[i / 4u] >> ((i % 4u) * 8u)) & 0xFFu;
        let q = bitcast<i32>(byte << 24u) >> 24u;
        return f32(q) * bscale[i / p.q_row_len];
    }
    return f32(b[i]);
}

const TILE: u32 = 64u;
const TK: u32 = 16u;

// As[k * 16 + r] holds rows 4r..4r+3 of the A tile at depth k; Bs likewise for columns of B.
var<workgroup> As: array<vec4<f32>, 256>;
var<workgroup> Bs: array<vec4<f32>, 256>;

@compute @workgroup_size(16, 16)
fn matmul(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid.x;
    let ty = lid.y;
    let tid = ty * 16u + tx;
    let m0 = wid.y * TILE;
    let n0 = wid.x * TILE;
    let a_base = p.a_off + wid.z * p.stride_a;
    let b_base = p.b_off + wid.z * p.stride_b;
    let c_base = p.c_off + wid.z * p.stride_c;
    let a_k_fast = p.a_cs == 1u;
    let b_n_fast = p.b_cs == 1u;

    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }

    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        // A tile: 64 rows x 16 depths, 4 elements per thread; consecutive threads walk the
        // dimension that is contiguous in memory.
        for (var l = 0u; l < 4u; l++) {
            let e = tid + l * 256u;
            var mm: u32;
            var kk: u32;
            if (a_k_fast) {
                kk = e % TK;
                mm = e / TK;
            } else {
                mm = e % TILE;
                kk = e / TILE;
            }
            let gm = m0 + mm;
            let gk = k0 + kk;
            var v = 0.0;
            if (gm < p.m && gk < p.k) {
                v = f32(a[a_base + gm * p.a_rs + gk * p.a_cs]);
            }
            As[kk * 16u + mm / 4u][mm % 4u] = v;
        }
        for (var l = 0u; l < 4u; l++) {
            let e = tid + l * 256u;
            var nn: u32;
            var kk: u32;
            if (b_n_fast) {
                nn = e % TILE;
                kk = e / TILE;
            } else {
                kk = e % TK;
                nn = e / TK;
            }
            let gn = n0 + nn;
            let gk = k0 + kk;
            var v = 0.0;
            if (gn < p.n && gk < p.k) {
                v = load_b(b_base + gk * p.b_rs + gn * p.b_cs);
            }
            Bs[kk * 16u + nn / 4u][nn % 4u] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let av = As[kk * 16u + ty];
            let bv = Bs[kk * 16u + tx];
            acc[0] += av.x * bv;
            acc[1] += av.y * bv;
            acc[2] += av.z * bv;
            acc[3] += av.w * bv;
        }
        workgroupBarrier();
    }

    store_block(m0 + ty * 4u, n0 + tx * 4u, c_base, acc);
}
