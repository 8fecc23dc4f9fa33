// common: helpers every kernel family shares; prepended to each family's source when its module
// is created (WGSL has no includes), and by the naga validation test.
//   flat(gid, nwg):     the flat thread index of a 2-D folded grid of 256-thread workgroups
//   strided(wid, nwg, lid, k): element k < PER_THREAD of a thread that takes PER_THREAD
//   strided_by(wid, nwg, lid, k, per): element k < per of a thread that takes `per`
//   block_sum(v, lid):  sum of `v` over a 256-thread workgroup (every thread gets it)
//   block_max(v, lid):  maximum of `v` over a 256-thread workgroup
// The block reductions use workgroup barriers: call them from uniform control flow.

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

// Elements a thread of a memory-bound elementwise kernel takes (PER_THREAD: kernels::PER_THREAD,
// which kernels::specialize puts before every source), 256 apart: each of a workgroup's
// PER_THREAD loads is one coalesced run of 256, and loading them all before using any keeps
// PER_THREAD loads in flight a thread (one a thread left an H200's memory 4x short of its
// bandwidth: GELU on GPT-2's 8192x3072 f16, 92 us).

fn strided(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, k: u32) -> u32 {
    return strided_by(wid, nwg, lid, k, PER_THREAD);
}

// `strided` for kernels that take `per` elements a thread (PER_THREAD_FEW: kernels::grid_strided_by).
fn strided_by(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, k: u32, per: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * 256u * per + k * 256u + lid;
}

var<workgroup> red: array<f32, 256>;

fn block_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

fn block_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    return m;
}

