// cross_entropy: softmax cross-entropy over logits rows, fused; rows whose target is `ignore`
// contribute neither loss nor gradient. The mean over valid rows is taken by the reduce kernels.
//   cross_entropy_forward:  losses (N) = lse - logits[target],  lse (N) = log sum exp logits
//                           logits (N,V) f32 or f16 (mixed precision: half the bytes of the
//                           step's largest tensor), summed in f32
//                           targets (N) u32         one workgroup per row (2-D folded)
//   cross_entropy_backward: dlogits (N,V) += dloss[0] * inv_count * (softmax - onehot(target)),
//                           dlogits f32 or f16; with accumulate = 0, dlogits = that instead
//                           (never read: a fresh buffer needs no clearing, and ignored rows get 0);
//                           dlogits rows `stride` long (0: V), 0 past V (tensor-core products read
//                           rows a multiple of 8 long: ops/cross_entropy.rs)
//                           logits (N,V)  targets (N)  lse (N)  dloss (1)   a workgroup per
//                           256 * PER_THREAD columns of a row (2-D folded grid)
// cross_entropy_forward_rows: the same for V <= 128, one thread per row.
// The softmax is recomputed from lse in backward instead of storing (N,V) probabilities.
// CPU references: tests/common/reference.rs `cross_entropy_forward`, `cross_entropy_backward`.

// row0: where this launch's rows start in targets, losses and lse (logits hold just these rows),
// so a large (N,V) head can be computed one chunk of rows at a time.

// forward: 0 losses, 1 lse, 2 logits, 3 targets, 4 params
// (B0: f32 losses in forward; dlogits f32 or f16 in backward, f16 under mixed precision;
// B2 forward's and B1 backward's logits, f32 or f16)
@group(0) @binding(0) var<storage, read_write> losses: array<B0>;
@group(0) @binding(1) var<storage, read_write> lse_out: array<f32>;
@group(0) @binding(2) var<storage, read> logits: array<B2>;
@group(0) @binding(3) var<storage, read> targets: array<u32>;
// Params: cross_entropy::Params in src/kernels/cross_entropy.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(4) var<uniform> p: Params;

// backward: 0 dlogits, 1 logits (`lg`), 2 targets (`tg`), 3 lse, 4 dloss, 5 params
@group(0) @binding(1) var<storage, read> lg: array<B1>;
@group(0) @binding(2) var<storage, read> tg: array<u32>;
@group(0) @binding(3) var<storage, read> lse_in: array<f32>;
@group(0) @binding(4) var<storage, read> dloss: array<f32>;
@group(0) @binding(5) var<uniform> pb: Params;

@compute @workgroup_size(256)
fn cross_entropy_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let lid = lid3.x;
    let base = row * p.v;
    // One read of the row: each thread keeps its running maximum and its sum of exp(x - max),
    // rescaled when the maximum grows (the row is 4 bytes a class, 200 KB for GPT-2's).
    var m = -3.402823e38;
    var s = 0.0;
    for (var j = lid; j < p.v; j += 256u) {
        let x = f32(logits[base + j]);
        if (x > m) {
            s = s * exp(m - x) + 1.0;
            m = x;
        } else {
            s += exp(x - m);
        }
    }
    let row_max = block_max(m, lid);
    let total = block_sum(s * exp(m - row_max), lid);
    if (lid == 0u) {
        let lse = row_max + log(total);
        lse_out[p.row0 + row] = lse;
        let t = targets[p.row0 + row];
        if (t == p.ignore) {
            losses[p.row0 + row] = B0(0.0);
        } else {
            losses[p.row0 + row] = B0(lse - f32(logits[base + t]));
        }
    }
}

// A workgroup takes 256 * PER_THREAD columns of one row (its chunk), so the row's target, lse
// and scale are read once a thread, and no element's row is found by a division.
@compute @workgroup_size(256)
fn cross_entropy_backward(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = select(pb.stride, pb.v, pb.stride == 0u);
    let chunks = (stride + 256u * PER_THREAD - 1u) / (256u * PER_THREAD);
    let w = wid.x + wid.y * nwg.x;
    let row = w / chunks;
    if (row >= pb.rows) {
        return;
    }
    let col0 = (w % chunks) * 256u * PER_THREAD + lid;
    let t = tg[pb.row0 + row];
    let lse = lse_in[pb.row0 + row];
    let scale = dloss[0] * pb.inv_count;
    // (the row's logits are all loaded before any is used: common.wgsl `strided` says why)
    var x: array<f32, PER_THREAD>;
    for (var k = 0u; k < PER_THREAD; k++) {
        let j = col0 + k * 256u;
        if (j < pb.v) {
            x[k] = f32(lg[row * pb.v + j]);
        }
    }
    for (var k = 0u; k < PER_THREAD; k++) {
        let j = col0 + k * 256u;
        // 0 past V (padding, whatever it held) and in ignored rows
        var d = 0.0;
        if (j < pb.v) {
            if (t != pb.ignore) {
                d = scale * (exp(x[k] - lse) - select(0.0, 1.0, j == t));
            }
            if (pb.accumulate == 1u) {
                d += f32(losses[row * stride + j]);
            }
        }
        if (j < stride) {
            losses[row * stride + j] = B0(d);
        }
    }
}

@compute @workgroup_size(256)
fn cross_entropy_forward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 256u;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.v;
    var m = -3.402823e38;
    for (var j = 0u; j < p.v; j++) {
        m = max(m, f32(logits[base + j]));
    }
    var acc = 0.0;
    for (var j = 0u; j < p.v; j++) {
        acc += exp(f32(logits[base + j]) - m);
    }
    let lse = m + log(acc);
    lse_out[p.row0 + row] = lse;
    let t = targets[p.row0 + row];
    losses[p.row0 + row] = B0(select(lse - f32(logits[base + min(t, p.v - 1u)]), 0.0, t == p.ignore));
}
