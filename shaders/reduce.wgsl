// reduce: sums in two deterministic stages, and column sums.
//   reduce_partials: partials[g] = sum over a grid-stride slice of x (or of x^2 when squares = 1)
//                    partials (groups)  x (n)          dispatch (groups, 1, 1), groups <= 1024
//   reduce_final:    out[slot] = scale * sum(partials[0..count]) (+ out[slot] when accumulate = 1)
//                    out (>= slot+1)  partials (count)   dispatch (1, 1, 1); with squares = 1 it
//                    sums squares, so a short x is reduced in this one stage
//   region_sums:     out[j] = sum(x[j*n .. j*n + n]) (of squares when squares = 1)
//                    out (regions)  x (regions * n)
//                    dispatch (regions, 1, 1) (the gradient norm's per-parameter partial sums)
//   sum_rows:        out (C) += sum over rows of x (R,C)   a thread per column, for many columns
//                    (split-K's partial products)   dispatch grid_1d(C)
//   column_sums:     out (C) += sum over rows of x (R,C)   a workgroup per 64 columns, for few
//                    columns (biases, LayerNorm's parameters)   dispatch (ceil(C/64), 1, 1)
//   column_block_sums: out (blocks,C) = sums over blocks of block_rows rows of x (R,C): stage
//                    one of a column sum that fills the GPU (column_sums over its output is stage
//                    two)   dispatch (ceil(C/64), blocks, 1)
// x may be f16 (B1); sums and outputs are f32.
// CPU references: tests/common/reference.rs `sum_forward`, `sum_rows`.

@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<B1>;
// Params: reduce::Params in src/kernels/reduce.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(2) var<uniform> p: Params;

// x[i] or x[i]^2 (squares = 1), in f32.
fn term(i: u32) -> f32 {
    let v = f32(x[i]);
    return select(v, v * v, p.squares == 1u);
}

// Sum of terms i0, i0 + stride, ... below `end`: four loads in flight a thread, not one (each
// load's latency, not the memory's bandwidth, bounded a grid-stride walk).
fn strided_sum(i0: u32, end: u32, stride: u32) -> f32 {
    var s = 0.0;
    var i = i0;
    while (i + 3u * stride < end) {
        let t = vec4(term(i), term(i + stride), term(i + 2u * stride), term(i + 3u * stride));
        s += (t.x + t.y) + (t.z + t.w);
        i += 4u * stride;
    }
    while (i < end) {
        s += term(i);
        i += stride;
    }
    return s;
}

@compute @workgroup_size(256)
fn reduce_partials(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let total = block_sum(strided_sum(wid.x * 256u + lid, p.n, nwg.x * 256u), lid);
    if (lid == 0u) {
        out[wid.x] = total;
    }
}

@compute @workgroup_size(256)
fn reduce_final(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let total = block_sum(strided_sum(lid, p.n, 256u), lid) * p.scale;
    if (lid == 0u) {
        if (p.accumulate == 1u) {
            out[p.slot] += total;
        } else {
            out[p.slot] = total;
        }
    }
}

@compute @workgroup_size(256)
fn region_sums(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let base = wid.x * p.n;
    let total = block_sum(strided_sum(base + lid, base + p.n, 256u), lid);
    if (lid == 0u) {
        out[wid.x] = total;
    }
}

// (a thread per column: with PER_THREAD columns a thread, loads first, split-K's sums in the
// H200's GPT-2 small f16 step took 1.24 ms against 1.02)
@compute @workgroup_size(256)
fn sum_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let col = flat(gid, nwg);
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

// Rows a column-sum workgroup walks side by side: thread (lane l, quad q) of 256 sums columns
// 4q..4q+3 of the group's 64 over rows l, l + 16, ... (H200, GPT-2 small f16 step: a thread per
// column walking its rows took 3.8 ms a step for the bias and LayerNorm gradients).
const SUM_LANES: u32 = 16u;
var<workgroup> lane_sums: array<vec4<f32>, 256>;

// Sums of rows r0..r1 of the workgroup's 64 columns, valid in threads 0..15 (columns 4·lid..),
// the lanes' partial sums added in a fixed order (deterministic).
fn block_column_sums(lid: u32, group: u32, r0: u32, r1: u32) -> vec4<f32> {
    let c = group * 64u + 4u * (lid % 16u);
    var s = vec4<f32>(0.0);
    // four rows a step, their loads first (all in flight at once)
    for (var r = r0 + lid / 16u; r < r1; r += 4u * SUM_LANES) {
        var v: array<vec4<f32>, 4>;
        for (var j = 0u; j < 4u; j++) {
            let at = (r + j * SUM_LANES) * p.cols + c;
            for (var i = 0u; i < 4u; i++) {
                if (r + j * SUM_LANES < r1 && c + i < p.cols) {
                    v[j][i] = f32(x[at + i]);
                }
            }
        }
        s += (v[0] + v[1]) + (v[2] + v[3]);
    }
    lane_sums[lid] = s;
    workgroupBarrier();
    var t = vec4<f32>(0.0);
    if (lid < 16u) {
        for (var l = 0u; l < SUM_LANES; l++) {
            t += lane_sums[l * 16u + lid];
        }
    }
    return t;
}

@compute @workgroup_size(256)
fn column_sums(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = block_column_sums(lid, wid.x, 0u, p.n / p.cols);
    let c = wid.x * 64u + 4u * lid;
    if (lid < 16u) {
        for (var i = 0u; i < 4u; i++) {
            if (c + i < p.cols) {
                out[c + i] += t[i];
            }
        }
    }
}

@compute @workgroup_size(256)
fn column_block_sums(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let r0 = wid.y * p.block_rows;
    let t = block_column_sums(lid, wid.x, r0, min(r0 + p.block_rows, p.n / p.cols));
    let c = wid.x * 64u + 4u * lid;
    if (lid < 16u) {
        for (var i = 0u; i < 4u; i++) {
            if (c + i < p.cols) {
                out[wid.y * p.cols + c + i] = t[i];
            }
        }
    }
}
