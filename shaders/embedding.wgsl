// embedding: token + position embedding, GPT-2's input layer.
//   embedding_forward:      out (B,T,C) = wte[tokens[b,t]] + wpe[t]     tokens (B,T) u32  wte (V,C)  wpe (maxT,C)
//   embedding_backward_wte: dwte (V,C) += scatter of dout rows by token  (one thread per channel,
//                           walking all B*T tokens in order: deterministic, no float atomics)
//   embedding_backward_wpe: dwpe (maxT,C) += sum_b dout[b,t]             (one thread per (t, c))
// Token ids are checked against V on the host before they are uploaded.
// CPU references: tests/common/reference.rs `embedding_forward`, `embedding_backward`.

struct Params {
    n: u32,   // B*T
    t: u32,
    c: u32,
    _pad0: u32,
}

// forward: 0 out, 1 tokens, 2 wte, 3 wpe, 4 params
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> wte: array<f32>;
@group(0) @binding(3) var<storage, read> wpe: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

// backward_wte: 0 dwte, 1 tokens, 2 dout, 3 params
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<uniform> pw: Params;

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

@compute @workgroup_size(256)
fn embedding_backward_wte(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    if (ch >= pw.c) {
        return;
    }
    for (var r = 0u; r < pw.n; r++) {
        let dst = tokens[r] * pw.c + ch;
        out[dst] += dout[r * pw.c + ch];
    }
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
