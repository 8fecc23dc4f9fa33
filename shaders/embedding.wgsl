// embedding: token + position embedding, GPT-2's input layer.
//   embedding_forward:      out (B,T,C) = wte[tokens[b,t]] + wpe[t]     tokens (B,T) u32  wte (V,C)  wpe (maxT,C)
//   embedding_token_links:  links (N) u32 = the next row with the same token (N if none), FIRST set
//                           on each token's first row (one thread per row, tokens staged in chunks)
//   embedding_backward_wte: dwte (V,C) += scatter of dout rows by token, reading links: a thread per
//                           (first row of a token, channel) walks that token's rows in order, so
//                           each element gets the additions, in the order, of one walk over all
//                           rows (deterministic, no float atomics), with B*T*C threads, not C
//   embedding_backward_wpe: dwpe (maxT,C) += sum_b dout[b,t]             (one thread per (t, c))
// Token ids are checked against V on the host before they are uploaded.
// CPU references: tests/common/reference.rs `embedding_forward`, `embedding_backward`.

// forward: 0 out, 1 tokens, 2 wte, 3 wpe, 4 params
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> wte: array<f32>;
@group(0) @binding(3) var<storage, read> wpe: array<f32>;
// Params: embedding::Params in src/kernels/embedding.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(4) var<uniform> p: Params;

// token_links: 0 links, 1 tokens, 2 params (`pp`)
@group(0) @binding(0) var<storage, read_write> links: array<u32>;

// backward_wte: 0 dwte, 1 tokens, 2 dout, 3 links (`next_row`), 4 params (`p`)
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read> next_row: array<u32>;

// backward_wpe: 0 dwpe, 1 dout (`dout1`), 2 params
@group(0) @binding(1) var<storage, read> dout1: array<f32>;
@group(0) @binding(2) var<uniform> pp: Params;

@compute @workgroup_size(256)
fn embedding_forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n * p.c) {
        return;
    }
    let row = i / p.c;
    let ch = i % p.c;
    let pos = row % p.t;
    out[i] = wte[tokens[row] * p.c + ch] + wpe[pos * p.c + ch];
}

// Marks a token's first row in links (row indices stay below 2^31).
const FIRST: u32 = 0x80000000u;
var<workgroup> chunk: array<u32, 256>;

@compute @workgroup_size(256)
fn embedding_token_links(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat(gid, nwg);
    let lid = lid3.x;
    let tok = tokens[min(r, pp.n - 1u)];
    var next = pp.n;
    var first = true;
    // every thread of the workgroup stages each chunk (the loop bound is uniform: barriers)
    for (var c0 = 0u; c0 < pp.n; c0 += 256u) {
        chunk[lid] = tokens[min(c0 + lid, pp.n - 1u)];
        workgroupBarrier();
        for (var j = 0u; j < min(256u, pp.n - c0); j++) {
            let same = chunk[j] == tok;
            first = first && !(same && c0 + j < r);
            next = select(next, c0 + j, same && c0 + j > r && next == pp.n);
        }
        workgroupBarrier();
    }
    if (r < pp.n) {
        links[r] = next | select(0u, FIRST, first);
    }
}

@compute @workgroup_size(256)
fn embedding_backward_wte(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n * p.c) {
        return;
    }
    let ch = i % p.c;
    var r = i / p.c;
    if ((next_row[r] & FIRST) == 0u) {
        return;
    }
    let dst = tokens[r] * p.c + ch;
    var s = out[dst];
    loop {
        s += dout[r * p.c + ch];
        r = next_row[r] & ~FIRST;
        if (r >= p.n) {
            break;
        }
    }
    out[dst] = s;
}

@compute @workgroup_size(256)
fn embedding_backward_wpe(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= pp.t * pp.c) {
        return;
    }
    let pos = i / pp.c;
    let ch = i % pp.c;
    let batches = pp.n / pp.t;
    var s = 0.0;
    for (var b = 0u; b < batches; b++) {
        s += dout1[(b * pp.t + pos) * pp.c + ch];
    }
    out[i] += s;
}
