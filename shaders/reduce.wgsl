// reduce: sums in two deterministic stages, and column sums.
//   reduce_partials: partials[g] = sum over a grid-stride slice of x (or of x^2 when squares = 1)
//                    partials (groups)  x (n)          dispatch (groups, 1, 1), groups <= 1024
//   reduce_final:    out[slot] = scale * sum(partials[0..count]) (+ out[slot] when accumulate = 1)
//                    out (>= slot+1)  partials (count)   dispatch (1, 1, 1); with squares = 1 it
//                    sums squares, so a short x is reduced in this one stage
//   sum_rows:        out (C) += sum over rows of x (R,C)   one thread per column
//   sum_row_blocks:  out (blocks,C) = sums over blocks of block_rows rows of x (R,C): stage one of
//                    a column sum that fills the GPU (sum_rows over its output is stage two)
//                    dispatch (ceil(C/256), blocks, 1)
// x may be f16 (B1); sums and outputs are f32.
// CPU references: tests/common/reference.rs `sum_forward`, `sum_rows`.

@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<B1>;
// Params: reduce::Params in src/kernels/reduce.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn reduce_partials(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    var s = 0.0;
    let stride = nwg.x * 256u;
    for (var i = wid.x * 256u + lid; i < p.n; i += stride) {
        let v = f32(x[i]);
        s += select(v, v * v, p.squares == 1u);
    }
    let total = block_sum(s, lid);
    if (lid == 0u) {
        out[wid.x] = total;
    }
}

@compute @workgroup_size(256)
fn reduce_final(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    var s = 0.0;
    for (var i = lid; i < p.n; i += 256u) {
        let v = f32(x[i]);
        s += select(v, v * v, p.squares == 1u);
    }
    let total = block_sum(s, lid) * p.scale;
    if (lid == 0u) {
        if (p.accumulate == 1u) {
            out[p.slot] += total;
        } else {
            out[p.slot] = total;
        }
    }
}

@compute @workgroup_size(256)
fn sum_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    if (col >= p.cols) {
        return;
    }
    let rows = p.n / p.cols;
    var s = 0.0;
    for (var r = 0u; r < rows; r++) {
        s += f32(x[r * p.cols + col]);
    }
    out[col] += s;
}

@compute @workgroup_size(256)
fn sum_row_blocks(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    if (col >= p.cols) {
        return;
    }
    let rows = p.n / p.cols;
    let r0 = gid.y * p.block_rows;
    let r1 = min(r0 + p.block_rows, rows);
    var s = 0.0;
    for (var r = r0; r < r1; r++) {
        s += f32(x[r * p.cols + col]);
    }
    out[gid.y * p.cols + col] = s;
}
