// softmax over rows of length L, with an optional causal mask and input scale (attention).
//   softmax_forward:  y[r,j] = exp(s*x[r,j] - max) / sum          y (R,L)  x (R,L)
//   softmax_backward: dx[r,j] += s * y[r,j] * (dy[r,j] - sum_k dy[r,k] y[r,k])   dx (R,L)  y (R,L)  dy (R,L)
// causal_t > 0: row r is query position t = r % causal_t and only j <= t are kept (y = 0 beyond).
// One workgroup of 256 threads per row (2-D folded grid); backward accumulates into dx.
// CPU references: tests/common/reference.rs `softmax_forward`, `softmax_backward`.

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
// Params: softmax::Params in src/kernels/softmax.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(2) var<uniform> p: Params;

// backward: 0 dx, 1 y (`yb`), 2 dy, 3 params
@group(0) @binding(1) var<storage, read> yb: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<uniform> pb: Params;

fn valid_len(row: u32, len: u32, causal_t: u32) -> u32 {
    if (causal_t == 0u) {
        return len;
    }
    return min(row % causal_t + 1u, len);
}

@compute @workgroup_size(256)
fn softmax_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let lid = lid3.x;
    let base = row * p.len;
    let valid = valid_len(row, p.len, p.causal_t);
    var m = -3.402823e38;
    for (var j = lid; j < valid; j += 256u) {
        m = max(m, p.scale * x[base + j]);
    }
    let row_max = block_max(m, lid);
    var s = 0.0;
    for (var j = lid; j < valid; j += 256u) {
        s += exp(p.scale * x[base + j] - row_max);
    }
    let inv = 1.0 / block_sum(s, lid);
    for (var j = lid; j < p.len; j += 256u) {
        var v = 0.0;
        if (j < valid) {
            v = exp(p.scale * x[base + j] - row_max) * inv;
        }
        y[base + j] = v;
    }
}

@compute @workgroup_size(256)
fn softmax_backward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= pb.rows) {
        return;
    }
    let lid = lid3.x;
    let base = row * pb.len;
    let valid = valid_len(row, pb.len, pb.causal_t);
    var s = 0.0;
    for (var j = lid; j < valid; j += 256u) {
        s += dy[base + j] * yb[base + j];
    }
    let dot = block_sum(s, lid);
    for (var j = lid; j < valid; j += 256u) {
        y[base + j] += pb.scale * yb[base + j] * (dy[base + j] - dot);
    }
}

// Short rows (len <= 128): one thread per row, no barriers; 256 rows per workgroup, 2-D folded.
@compute @workgroup_size(256)
fn softmax_forward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 256u;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.len;
    let valid = valid_len(row, p.len, p.causal_t);
    var m = -3.402823e38;
    for (var j = 0u; j < valid; j++) {
        m = max(m, p.scale * x[base + j]);
    }
    var s = 0.0;
    for (var j = 0u; j < valid; j++) {
        s += exp(p.scale * x[base + j] - m);
    }
    let inv = 1.0 / s;
    for (var j = 0u; j < p.len; j++) {
        y[base + j] = select(0.0, exp(p.scale * x[base + j] - m) * inv, j < valid);
    }
}

@compute @workgroup_size(256)
fn softmax_backward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 256u;
    if (row >= pb.rows) {
        return;
    }
    let base = row * pb.len;
    let valid = valid_len(row, pb.len, pb.causal_t);
    var dot = 0.0;
    for (var j = 0u; j < valid; j++) {
        dot += dy[base + j] * yb[base + j];
    }
    for (var j = 0u; j < valid; j++) {
        y[base + j] += pb.scale * yb[base + j] * (dy[base + j] - dot);
    }
}
