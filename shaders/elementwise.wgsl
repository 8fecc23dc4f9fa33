// elementwise: the residual stream's plumbing.
//   add_forward:  out = a + b                      out (n)  a (n)  b (n)
//   axpy:         y += alpha * x                   y (n)    x (n)        (backward of add, grad accumulation)
//   axpy_scalar:  y += alpha * s[0]                y (n)    s (1)        (backward of sum/mean)
//   scale_forward: out = alpha * x                 out (n)  x (n)
//   fill:         out = alpha                      out (n)
//   fill_normal:  out = alpha * N(0, 1)            out (n)        (initial weights, drawn on the GPU)
//   convert:      out = a in out's element type    out (n)  a (n)        (f16 copies, mixed precision)
//   convert_scaled: out = a * grad_half_scale(b[slot]) in out's type   out (n)  a (n)  b (> slot)
//                 (a gradient on its way to the host optimizer in f16, b its sum of squares);
//                 with tail = 1, out (n + 2) also carries the scale's exponent after the values
//                 (out[n]; out[n + 1] = 0), so the gradient lands on the host with its scale
//   convert_scaled_summed: convert_scaled of a small gradient (n <= reduce::ONE_STAGE) in one
//                 workgroup that first takes its sum of squares into sums[slot]   out  a  sums (> slot)
//                 (one dispatch instead of two: half of GPT-2's gradients are biases and gains)
// Every binding may be f16 (B0 out, B1 a, B2 b); arithmetic is f32.
// One thread per element, 256 per workgroup, grid folded into 2-D (flat = gid.x + gid.y * nwg.x * 256);
// add_forward, axpy and scale_forward take PER_THREAD elements a thread (kernels::grid_strided).
// CPU references: tests/common/reference.rs `add_forward`, `axpy`, `scale_forward`;
// `fill_normal`: pagetrain::rng::counter_normal.

@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read> a: array<B1>;
@group(0) @binding(2) var<storage, read> b: array<B2>;
// Params: elementwise::Params in src/kernels/elementwise.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(3) var<uniform> p: Params;

@group(0) @binding(2) var<storage, read_write> sums: array<f32>;

@group(0) @binding(2) var<uniform> p2: Params;
@group(0) @binding(1) var<uniform> p1: Params;

// (add_forward, axpy, scale_forward: PER_THREAD elements a thread, loads first; common.wgsl
// `strided` says why)
@compute @workgroup_size(256)
fn add_forward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    var v: array<f32, PER_THREAD>;
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p.n) {
            v[k] = f32(a[i]) + f32(b[i]);
        }
    }
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p.n) {
            out[i] = B0(v[k]);
        }
    }
}

@compute @workgroup_size(256)
fn axpy(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    var v: array<f32, PER_THREAD>;
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p2.n) {
            v[k] = f32(out[i]) + p2.alpha * f32(a[i]);
        }
    }
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p2.n) {
            out[i] = B0(v[k]);
        }
    }
}

@compute @workgroup_size(256)
fn axpy_scalar(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p2.n) {
        out[i] = B0(f32(out[i]) + p2.alpha * f32(a[0]));
    }
}

@compute @workgroup_size(256)
fn scale_forward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    var v: array<f32, PER_THREAD>;
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p2.n) {
            v[k] = p2.alpha * f32(a[i]);
        }
    }
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p2.n) {
            out[i] = B0(v[k]);
        }
    }
}

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p1.n) {
        out[i] = B0(p1.alpha);
    }
}

@compute @workgroup_size(256)
fn convert(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p2.n) {
        out[i] = B0(a[i]);
    }
}

// The power of two a gradient is multiplied by before it is rounded to f16, from `ss`, the sum of
// the squares of its elements: the largest element then stays under 2^15 (no element exceeds the
// root of the sum), so none overflows f16's 65504, and small ones keep their bits. Made from the
// exponent bits alone, so the host finds the same power (`optim::grad_half_scale`); 1 for
// a sum that is zero, subnormal, infinite or NaN (an overflow then stays one).
fn grad_half_scale(ss: f32) -> f32 {
    return bitcast<f32>(u32(grad_half_exponent(ss) + 127) << 23u);
}

// The exponent k of grad_half_scale(ss) = 2^k: -49 to 77, 0 for the sums the scale is 1 for.
fn grad_half_exponent(ss: f32) -> i32 {
    let e = i32((bitcast<u32>(ss) >> 23u) & 0xffu);
    if (e == 0 || e == 255) {
        return 0;
    }
    // ss < 2^(E + 1) with E = e - 127, so its root is under 2^ceil((E + 1) / 2)
    return 15 - ((e - 127 + 2) >> 1u);
}

@compute @workgroup_size(256)
fn convert_scaled(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    let ss = f32(b[p.slot]);
    if (i < p.n) {
        out[i] = B0(f32(a[i]) * grad_half_scale(ss));
    }
    if (p.tail == 1u && i == 0u) {
        write_exponent_tail(ss);
    }
}

// The tail after a scaled gradient's values: its scale's exponent (a small integer: exact in
// f16), then 0.
fn write_exponent_tail(ss: f32) {
    out[p.n] = B0(f32(grad_half_exponent(ss)));
    out[p.n + 1u] = B0(0.0);
}

@compute @workgroup_size(256)
fn convert_scaled_summed(@builtin(local_invocation_index) lid: u32) {
    var part = 0.0;
    for (var i = lid; i < p.n; i += 256u) {
        let x = f32(a[i]);
        part += x * x;
    }
    let ss = block_sum(part, lid);
    if (lid == 0u) {
        sums[p.slot] = ss;
    }
    let scale = grad_half_scale(ss);
    for (var i = lid; i < p.n; i += 256u) {
        out[i] = B0(f32(a[i]) * scale);
    }
    if (p.tail == 1u && lid == 0u) {
        write_exponent_tail(ss);
    }
}

// A 32-bit integer hash (lowbias32: good avalanche, a few multiplies).
fn mix32(v: u32) -> u32 {
    var x = v;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

// Element i of a tensor drawn with seed (seed0, seed1) is a pure function of the three: any
// adapter draws the same numbers (to its log/cos precision), and the host can recompute them.
@compute @workgroup_size(256)
fn fill_normal(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p1.n) {
        let h1 = mix32(mix32(i ^ mix32(p1.seed0)) ^ p1.seed1);
        let h2 = mix32(h1 ^ 0x9e3779b9u);
        // Box-Muller; u1 in (0, 1] keeps the log finite
        let u1 = (f32(h1 >> 8u) + 1.0) / 16777216.0;
        let u2 = f32(h2 >> 8u) / 16777216.0;
        out[i] = B0(p1.alpha * sqrt(-2.0 * log(u1)) * cos(6.2831855 * u2));
    }
}
