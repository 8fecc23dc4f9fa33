// layernorm: out = (x - mean) * rstd * weight + bias over the last dim, rstd = 1/sqrt(var + eps).
//   layernorm_forward:          out (N,C)  mean (N)  rstd (N)  x (N,C)  weight (C)  bias (C)
//   layernorm_backward:         dx (N,C) += ...          dout (N,C)  x (N,C)  weight (C)  mean (N)  rstd (N)
//   layernorm_backward_params:  dweight (C) += sum_n dout*norm, dbias (C) += sum_n dout;  dout, x, mean, rstd
// forward/backward (C <= 128 * 16): two rows a workgroup, 128 threads a row, each thread holding
//   its DIM (a power of two >= C / 128) elements in registers, so x is read once (H200, GPT-2
//   small's f16 step, against a workgroup a row re-reading x: forward 0.96 -> 0.61 ms, backward
//   1.11 -> 0.88; 64 threads a row held too much a thread, 256 left the forward slower)
//   dispatch ceil(N / 2) workgroups (2-D folded)
// *_wide variants (longer rows): one workgroup of 256 threads per row, threads stride over C.
// *_rows variants (C <= 128): one thread per row, no barriers, 256 rows per workgroup.
// backward_params: one thread per column, walking the rows (deterministic, no atomics).
//   layernorm_backward_param_blocks: the same sums over blocks of block_rows rows side by side
//     (stage one when there are few columns): 0 dweight partials (blocks,C), 1 dbias partials,
//     2 dout, 3 x, 4 mean, 5 rstd; dispatch (ceil(C/256), blocks, 1); reduce's sum_rows over
//     each partials array is stage two
// x, out, dx and dout may be f16 (B3 x, B0 out/dx, B1 and B2 dout, B2 x in backward); mean, rstd,
// weight, bias and their gradients are f32 (binding 0 is dweight, f32, in backward_params).
// CPU references: tests/common/reference.rs `layernorm_forward`, `layernorm_backward`.

// forward
@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(2) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<B3>;
@group(0) @binding(4) var<storage, read> weight: array<f32>;
@group(0) @binding(5) var<storage, read> bias: array<f32>;
// Params: layernorm::Params in src/kernels/layernorm.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(6) var<uniform> p: Params;

// backward (dx): 0 dx, 1 dout, 2 x (as `bx`), 3 weight (`bw`), 4 mean, 5 rstd, 6 params
@group(0) @binding(0) var<storage, read_write> dx: array<B0>;
@group(0) @binding(1) var<storage, read> dout: array<B1>;
@group(0) @binding(2) var<storage, read> bx: array<B2>;
@group(0) @binding(3) var<storage, read> bw: array<f32>;
@group(0) @binding(4) var<storage, read> mean_in: array<f32>;
@group(0) @binding(5) var<storage, read> rstd_in: array<f32>;

// backward_params: 0 dweight, 1 dbias, 2 dout, 3 x, 4 mean, 5 rstd, 6 params
@group(0) @binding(1) var<storage, read_write> dbias: array<f32>;
@group(0) @binding(2) var<storage, read> pdout: array<B2>;
@group(0) @binding(3) var<storage, read> px: array<B3>;

// Threads a row takes in layernorm_forward / _backward (src/kernels/layernorm.rs launches by the
// same number: a test there checks), and the rows a workgroup holds.
const ROW_THREADS: u32 = 128u;
const GROUP_ROWS: u32 = 256u / ROW_THREADS;

var<workgroup> row_parts: array<vec2<f32>, 256>;

// Sum of v over the ROW_THREADS threads of this thread's row; every thread of the row gets it.
fn row_sum(v: vec2<f32>, lid: u32) -> vec2<f32> {
    let lane = lid % ROW_THREADS;
    row_parts[lid] = v;
    workgroupBarrier();
    for (var s = ROW_THREADS / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            row_parts[lid] += row_parts[lid + s];
        }
        workgroupBarrier();
    }
    let total = row_parts[lid - lane];
    workgroupBarrier();
    return total;
}

// The row thread `lid` of workgroup `wid` takes (past the last row in a ragged last workgroup).
fn held_row(lid: u32, wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.x + wid.y * nwg.x) * GROUP_ROWS + lid / ROW_THREADS;
}

@compute @workgroup_size(256)
fn layernorm_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % ROW_THREADS;
    let row = held_row(lid, wid, nwg);
    // (no early return past the last row: the row sums' barriers need every thread)
    let live = row < p.rows;
    let base = row * p.c;
    var v: array<f32, DIM>;
    var s = 0.0;
    for (var k = 0u; k < DIM; k++) {
        let i = lane + k * ROW_THREADS;
        if (live && i < p.c) {
            v[k] = f32(x[base + i]);
            s += v[k];
        }
    }
    let mean = row_sum(vec2(s, 0.0), lid).x / f32(p.c);
    var s2 = 0.0;
    for (var k = 0u; k < DIM; k++) {
        if (live && lane + k * ROW_THREADS < p.c) {
            let d = v[k] - mean;
            s2 += d * d;
        }
    }
    let rstd = inverseSqrt(row_sum(vec2(s2, 0.0), lid).x / f32(p.c) + p.eps);
    for (var k = 0u; k < DIM; k++) {
        let i = lane + k * ROW_THREADS;
        if (live && i < p.c) {
            out[base + i] = B0((v[k] - mean) * rstd * weight[i] + bias[i]);
        }
    }
    if (live && lane == 0u) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

@compute @workgroup_size(256)
fn layernorm_backward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % ROW_THREADS;
    let row = held_row(lid, wid, nwg);
    let live = row < p.rows;
    let base = row * p.c;
    let at = min(row, p.rows - 1u);
    let mean = mean_in[at];
    let rstd = rstd_in[at];
    // every load first: normalized x, dout * weight and the dx added to
    var norm: array<f32, DIM>;
    var dn: array<f32, DIM>;
    var prior: array<f32, DIM>;
    var s = vec2(0.0);
    for (var k = 0u; k < DIM; k++) {
        let i = lane + k * ROW_THREADS;
        if (live && i < p.c) {
            norm[k] = (f32(bx[base + i]) - mean) * rstd;
            dn[k] = f32(dout[base + i]) * bw[i];
            prior[k] = f32(dx[base + i]);
            s += vec2(dn[k], dn[k] * norm[k]);
        }
    }
    let m = row_sum(s, lid) / f32(p.c);
    for (var k = 0u; k < DIM; k++) {
        let i = lane + k * ROW_THREADS;
        if (live && i < p.c) {
            dx[base + i] = B0(prior[k] + rstd * (dn[k] - m.x - norm[k] * m.y));
        }
    }
}

@compute @workgroup_size(256)
fn layernorm_forward_wide(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let lid = lid3.x;
    let base = row * p.c;
    var s = 0.0;
    for (var i = lid; i < p.c; i += 256u) {
        s += f32(x[base + i]);
    }
    let mean = block_sum(s, lid) / f32(p.c);
    var s2 = 0.0;
    for (var i = lid; i < p.c; i += 256u) {
        let d = f32(x[base + i]) - mean;
        s2 += d * d;
    }
    let rstd = inverseSqrt(block_sum(s2, lid) / f32(p.c) + p.eps);
    for (var i = lid; i < p.c; i += 256u) {
        out[base + i] = B0((f32(x[base + i]) - mean) * rstd * weight[i] + bias[i]);
    }
    if (lid == 0u) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

@compute @workgroup_size(256)
fn layernorm_backward_wide(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let lid = lid3.x;
    let base = row * p.c;
    let mean = mean_in[row];
    let rstd = rstd_in[row];
    var s_dn = 0.0;
    var s_dn_n = 0.0;
    for (var i = lid; i < p.c; i += 256u) {
        let norm = (f32(bx[base + i]) - mean) * rstd;
        let dn = f32(dout[base + i]) * bw[i];
        s_dn += dn;
        s_dn_n += dn * norm;
    }
    let mean_dn = block_sum(s_dn, lid) / f32(p.c);
    let mean_dn_n = block_sum(s_dn_n, lid) / f32(p.c);
    for (var i = lid; i < p.c; i += 256u) {
        let norm = (f32(bx[base + i]) - mean) * rstd;
        let dn = f32(dout[base + i]) * bw[i];
        dx[base + i] = B0(f32(dx[base + i]) + rstd * (dn - mean_dn - norm * mean_dn_n));
    }
}

@compute @workgroup_size(256)
fn layernorm_backward_params(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    if (col >= p.c) {
        return;
    }
    var dw = 0.0;
    var db = 0.0;
    for (var r = 0u; r < p.rows; r++) {
        let g = f32(pdout[r * p.c + col]);
        dw += g * (f32(px[r * p.c + col]) - mean_in[r]) * rstd_in[r];
        db += g;
    }
    dx[col] = B0(f32(dx[col]) + dw);
    dbias[col] += db;
}

@compute @workgroup_size(256)
fn layernorm_backward_param_blocks(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    if (col >= p.c) {
        return;
    }
    let r0 = gid.y * p.block_rows;
    let r1 = min(r0 + p.block_rows, p.rows);
    var dw = 0.0;
    var db = 0.0;
    for (var r = r0; r < r1; r++) {
        let g = f32(pdout[r * p.c + col]);
        dw += g * (f32(px[r * p.c + col]) - mean_in[r]) * rstd_in[r];
        db += g;
    }
    dx[gid.y * p.c + col] = B0(dw);
    dbias[gid.y * p.c + col] = db;
}

@compute @workgroup_size(256)
fn layernorm_forward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 256u;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    var s = 0.0;
    for (var i = 0u; i < p.c; i++) {
        s += f32(x[base + i]);
    }
    let mean = s / f32(p.c);
    var s2 = 0.0;
    for (var i = 0u; i < p.c; i++) {
        let d = f32(x[base + i]) - mean;
        s2 += d * d;
    }
    let rstd = inverseSqrt(s2 / f32(p.c) + p.eps);
    for (var i = 0u; i < p.c; i++) {
        out[base + i] = B0((f32(x[base + i]) - mean) * rstd * weight[i] + bias[i]);
    }
    mean_out[row] = mean;
    rstd_out[row] = rstd;
}

@compute @workgroup_size(256)
fn layernorm_backward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 256u;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    let mean = mean_in[row];
    let rstd = rstd_in[row];
    var s_dn = 0.0;
    var s_dn_n = 0.0;
    for (var i = 0u; i < p.c; i++) {
        let norm = (f32(bx[base + i]) - mean) * rstd;
        let dn = f32(dout[base + i]) * bw[i];
        s_dn += dn;
        s_dn_n += dn * norm;
    }
    let mean_dn = s_dn / f32(p.c);
    let mean_dn_n = s_dn_n / f32(p.c);
    for (var i = 0u; i < p.c; i++) {
        let norm = (f32(bx[base + i]) - mean) * rstd;
        let dn = f32(dout[base + i]) * bw[i];
        dx[base + i] = B0(f32(dx[base + i]) + rstd * (dn - mean_dn - norm * mean_dn_n));
    }
}
