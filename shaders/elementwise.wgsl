// elementwise: the residual stream's plumbing.
//   add_forward:  out = a + b                      out (n)  a (n)  b (n)
//   axpy:         y += alpha * x                   y (n)    x (n)        (backward of add, grad accumulation)
//   axpy_scalar:  y += alpha * s[0]                y (n)    s (1)        (backward of sum/mean)
//   scale_forward: out = alpha * x                 out (n)  x (n)
//   fill:         out = alpha                      out (n)
//   pack_f16:     words[j] = f16 pair (a[2j], a[2j+1])   words (ceil(n/2)) u32   a (n)   (mixed precision)
// One thread per element, 256 per workgroup, grid folded into 2-D (flat = gid.x + gid.y * nwg.x * 256).
// CPU references: tests/common/reference.rs `add_forward`, `axpy`, `scale_forward`.

struct Params {
    n: u32,
    alpha: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@group(0) @binding(2) var<uniform> p2: Params;
@group(0) @binding(0) var<storage, read_write> words: array<u32>;
@group(0) @binding(1) var<uniform> p1: Params;

@compute @workgroup_size(256)
fn add_forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p.n) {
        out[i] = a[i] + b[i];
    }
}

@compute @workgroup_size(256)
fn axpy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p2.n) {
        out[i] = out[i] + p2.alpha * a[i];
    }
}

@compute @workgroup_size(256)
fn axpy_scalar(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p2.n) {
        out[i] = out[i] + p2.alpha * a[0];
    }
}

@compute @workgroup_size(256)
fn scale_forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p2.n) {
        out[i] = p2.alpha * a[i];
    }
}

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p1.n) {
        out[i] = p1.alpha;
    }
}

@compute @workgroup_size(256)
fn pack_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = flat(gid, nwg);
    if (2u * j >= p2.n) {
        return;
    }
    let hi = select(0.0, a[2u * j + 1u], 2u * j + 1u < p2.n);
    words[j] = pack2x16float(vec2<f32>(a[2u * j], hi));
}
