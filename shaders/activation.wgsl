// activation: GELU (tanh form, GPT-2's "gelu_new") and ReLU, forward and backward.
//   gelu_forward:  out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))     out (n)  x (n)
//   gelu_backward: dx += dout * gelu'(x)                                      dx (n)   x (n)  dout (n)
//   relu_forward:  out = max(x, 0)                                            out (n)  x (n)
//   relu_backward: dx += dout * (x > 0)                                       dx (n)   x (n)  dout (n)
// Backward accumulates into dx, or overwrites it (unread) where accumulate = 0. Any binding may be f16 (B0 out/dx, B1 x, B2 dout); math is f32. PER_THREAD elements a thread (common.wgsl `strided`; backward PER_THREAD_FEW), 256 threads a workgroup, 2-D folded grid (kernels::grid_strided_by).
// CPU references: tests/common/reference.rs `gelu_forward`, `gelu_backward`, `relu_forward`, `relu_backward`.

@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read> x: array<B1>;
// Params: activation::Params in src/kernels/activation.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(2) var<uniform> p: Params;

@group(0) @binding(2) var<storage, read> dout: array<B2>;
@group(0) @binding(3) var<uniform> pb: Params;

const GELU_SCALE: f32 = 0.7978845608028654; // sqrt(2/pi)

// What backward adds to: dx[i], or nothing where it overwrites dx.
fn prior(i: u32) -> f32 {
    if (pb.accumulate == 1u) {
        return f32(out[i]);
    }
    return 0.0;
}

// tanh through one exp, clamped so it stays finite on every backend (against the builtin, the
// H200's GELU forward took 0.47 ms a GPT-2 step instead of 0.59, the backward 1.13 instead of 1.25).
fn safe_tanh(u: f32) -> f32 {
    return 1.0 - 2.0 / (exp(2.0 * clamp(u, -15.0, 15.0)) + 1.0);
}

// tanh(sqrt(2/pi) (v + 0.044715 v^3)), which GELU and its derivative share.
fn gelu_tanh(v: f32) -> f32 {
    return safe_tanh(GELU_SCALE * (v + 0.044715 * v * v * v));
}

fn gelu(v: f32) -> f32 {
    return 0.5 * v * (1.0 + gelu_tanh(v));
}

fn gelu_grad(v: f32) -> f32 {
    let t = gelu_tanh(v);
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_SCALE * (1.0 + 3.0 * 0.044715 * v * v);
}

// (each thread's loads all go first, then its stores: see `strided`)
@compute @workgroup_size(256)
fn gelu_forward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    var v: array<f32, PER_THREAD>;
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p.n) {
            v[k] = f32(x[i]);
        }
    }
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p.n) {
            out[i] = B0(gelu(v[k]));
        }
    }
}

@compute @workgroup_size(256)
fn gelu_backward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    var v: array<f32, PER_THREAD_FEW>;
    var g: array<f32, PER_THREAD_FEW>;
    var d: array<f32, PER_THREAD_FEW>;
    for (var k = 0u; k < PER_THREAD_FEW; k++) {
        let i = strided_by(wid, nwg, lid, k, PER_THREAD_FEW);
        if (i < pb.n) {
            v[k] = f32(x[i]);
            g[k] = f32(dout[i]);
            d[k] = prior(i);
        }
    }
    for (var k = 0u; k < PER_THREAD_FEW; k++) {
        let i = strided_by(wid, nwg, lid, k, PER_THREAD_FEW);
        if (i < pb.n) {
            out[i] = B0(d[k] + g[k] * gelu_grad(v[k]));
        }
    }
}

@compute @workgroup_size(256)
fn relu_forward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var k = 0u; k < PER_THREAD; k++) {
        let i = strided(wid, nwg, lid, k);
        if (i < p.n) {
            out[i] = B0(max(f32(x[i]), 0.0));
        }
    }
}

@compute @workgroup_size(256)
fn relu_backward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var k = 0u; k < PER_THREAD_FEW; k++) {
        let i = strided_by(wid, nwg, lid, k, PER_THREAD_FEW);
        if (i < pb.n) {
            out[i] = B0(prior(i) + select(0.0, f32(dout[i]), f32(x[i]) > 0.0));
        }
    }
}
