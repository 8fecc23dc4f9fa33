// sumsq: sums of squares of up to 7 tensors in one dispatch (the gradient norm's first stage: a
// dispatch per 7 gradients instead of one or two per gradient).
//   sumsq_multi: out[base + j * nwg.x + g] = sum of x_j[i]^2 over the grid-stride slice of
//                workgroup g (i = g * 256 + lid, stepping nwg.x * 256), for j < tensors
//                out (>= base + tensors * blocks)  x0 .. x6 (n[j] each; bind any buffer past
//                `tensors`)   dispatch (blocks, tensors, 1)
//   sumsq_slots: out[slot[j]] = sum of x_j[i]^2 over all i < n[j], workgroup j alone: short
//                tensors in one stage (the gradient norm's sums of biases and gains during
//                backward: a dispatch per 7 instead of one each)   dispatch (tensors, 1, 1)
// Deterministic: the slices and the workgroup sums depend on the shapes only.
// CPU reference: tests/kernels.rs `sumsq_multi_matches_reference`.

@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x0: array<f32>;
@group(0) @binding(2) var<storage, read> x1: array<f32>;
@group(0) @binding(3) var<storage, read> x2: array<f32>;
@group(0) @binding(4) var<storage, read> x3: array<f32>;
@group(0) @binding(5) var<storage, read> x4: array<f32>;
@group(0) @binding(6) var<storage, read> x5: array<f32>;
@group(0) @binding(7) var<storage, read> x6: array<f32>;
// Params: sumsq::Params in src/kernels/sumsq.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(8) var<uniform> p: Params;

// Element i of tensor j (j is the same for the whole workgroup: no divergence).
fn load(j: u32, i: u32) -> f32 {
    switch j {
        case 0u: { return x0[i]; }
        case 1u: { return x1[i]; }
        case 2u: { return x2[i]; }
        case 3u: { return x3[i]; }
        case 4u: { return x4[i]; }
        case 5u: { return x5[i]; }
        default: { return x6[i]; }
    }
}

@compute @workgroup_size(256)
fn sumsq_multi(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let j = wid.y;
    let n = p.n[j / 4u][j % 4u];
    var s = 0.0;
    for (var i = wid.x * 256u + lid; i < n; i += nwg.x * 256u) {
        let v = load(j, i);
        s += v * v;
    }
    let total = block_sum(s, lid);
    if (lid == 0u) {
        out[p.base + j * nwg.x + wid.x] = total;
    }
}

@compute @workgroup_size(256)
fn sumsq_slots(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let j = wid.x;
    let n = p.n[j / 4u][j % 4u];
    // Four loads in flight a thread: one workgroup walks the whole tensor, so each load's
    // latency would bound it.
    var s = 0.0;
    var i = lid;
    while (i + 768u < n) {
        let v = vec4(load(j, i), load(j, i + 256u), load(j, i + 512u), load(j, i + 768u));
        s += dot(v, v);
        i += 1024u;
    }
    while (i < n) {
        let v = load(j, i);
        s += v * v;
        i += 256u;
    }
    let total = block_sum(s, lid);
    if (lid == 0u) {
        out[p.slot[j / 4u][j % 4u]] = total;
    }
}
