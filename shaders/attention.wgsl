// attention: moves heads between the (B,T,3C) / (B,T,C) layouts of the residual stream and the
// (B,H,T,D) layout the batched matmuls of causal self-attention work in (C = H*D).
//   attention_split:          q, k, v (B,H,T,D)  <-  qkv (B,T,3C)
//   attention_split_backward: dqkv (B,T,3C) +=   dq, dk, dv (B,H,T,D)
//   attention_merge:          out (B,T,C)        <-  y (B,H,T,D)
//   attention_merge_backward: dy (B,H,T,D) +=    dout (B,T,C)
// One thread per element of the (B,H,T,D) side, 256 per workgroup, 2-D folded grid.
// CPU reference: tests/common/reference.rs `attention_forward` (the whole attention).

// The (B,H,T,D) side holds batch entries first..first+b of the (B,T,·) side, so attention can
// run one batch entry at a time.
struct Params {
    b: u32,
    t: u32,
    h: u32,
    d: u32,
    first: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// split: 0 q, 1 k, 2 v, 3 qkv, 4 params
@group(0) @binding(0) var<storage, read_write> q: array<f32>;
@group(0) @binding(1) var<storage, read_write> k: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;
@group(0) @binding(3) var<storage, read> qkv: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

// split_backward: 0 dqkv, 1 dq, 2 dk, 3 dv, 4 params
@group(0) @binding(0) var<storage, read_write> dqkv: array<f32>;
@group(0) @binding(1) var<storage, read> dq: array<f32>;
@group(0) @binding(2) var<storage, read> dk: array<f32>;
@group(0) @binding(3) var<storage, read> dv: array<f32>;

// merge: 0 out, 1 y, 2 params; merge_backward: 0 dy, 1 dout, 2 params
@group(0) @binding(1) var<storage, read> heads: array<f32>;
@group(0) @binding(2) var<uniform> pm: Params;

// Index in the (B,T,width·C) layout of element i of the (B,H,T,D) layout (width 3 for qkv).
fn btc_index(i: u32, prm: Params, width: u32) -> u32 {
    let d = i % prm.d;
    let t = (i / prm.d) % prm.t;
    let h = (i / (prm.d * prm.t)) % prm.h;
    let b = prm.first + i / (prm.d * prm.t * prm.h);
    return (b * prm.t + t) * width * prm.h * prm.d + h * prm.d + d;
}

@compute @workgroup_size(256)
fn attention_split(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.b * p.h * p.t * p.d) {
        return;
    }
    let c = p.h * p.d;
    let src = btc_index(i, p, 3u);
    q[i] = qkv[src];
    k[i] = qkv[src + c];
    v[i] = qkv[src + 2u * c];
}

@compute @workgroup_size(256)
fn attention_split_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.b * p.h * p.t * p.d) {
        return;
    }
    let c = p.h * p.d;
    let dst = btc_index(i, p, 3u);
    dqkv[dst] += dq[i];
    dqkv[dst + c] += dk[i];
    dqkv[dst + 2u * c] += dv[i];
}

@compute @workgroup_size(256)
fn attention_merge(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= pm.b * pm.h * pm.t * pm.d) {
        return;
    }
    q[btc_index(i, pm, 1u)] = heads[i];
}

@compute @workgroup_size(256)
fn attention_merge_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= pm.b * pm.h * pm.t * pm.d) {
        return;
    }
    q[i] += heads[btc_index(i, pm, 1u)];
}
