// fill: zeroes a buffer range inside the open compute pass (the pager's clears would otherwise
// end the pass: a clear per gradient per step).
//   fill_zero: out[i] = 0 for i < n        out (n u32 words)   dispatch grid_1d(n), 2-D folded
// CPU reference: tests/kernels.rs `in_pass_clears_zero_exactly_their_range`.

@group(0) @binding(0) var<storage, read_write> out: array<u32>;
// Params: fill::Params in src/kernels/fill.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn fill_zero(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p.n) {
        out[i] = 0u;
    }
}
