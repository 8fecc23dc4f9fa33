// decode: generating one token at a time with a key/value cache, so each new token costs one
// position instead of the whole window.
//   decode_embed:     out (C) = wte[token] + wpe[pos]                      wte (V,C)  wpe (maxT,C)
//   kv_append:        cache[pos0 + r, 0..2C] = qkv[r, C..3C] for r < rows  cache (maxT,2C)  qkv (rows,3C)
//                     (the keys and values of `rows` new positions, heads side by side as in qkv)
//   decode_attention: out (C) = softmax(scale·q·kⱼᵀ, j ≤ pos) · vⱼ per head, q from qkv (3C), kⱼ
//                     and vⱼ from cache rows 0..=pos; scores (H, maxT) is scratch
// out, cache and qkv may be f16 (B0 out/cache, B1 qkv in kv_append, B2 qkv in decode_attention,
// B3 cache there); wte, wpe and scores are f32; arithmetic is f32.
// decode_embed and kv_append: one thread per element (256 a workgroup, folded 2-D grid).
// decode_attention: one 256-thread workgroup per head (grid H).
// CPU references: tests/common/reference.rs `attention_forward` (the last row of a causal window
// equals one decode step) and `embedding_forward`.

// decode_embed: 0 out, 1 wte, 2 wpe, 3 params
@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read> wte: array<f32>;
@group(0) @binding(2) var<storage, read> wpe: array<f32>;
// Params: decode::Params in src/kernels/decode.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(3) var<uniform> p: Params;

// kv_append: 0 cache, 1 qkv (`new_qkv`), 2 params
@group(0) @binding(1) var<storage, read> new_qkv: array<B1>;
@group(0) @binding(2) var<uniform> pa: Params;

// decode_attention: 0 out, 1 scores, 2 qkv, 3 cache (`kv`), 4 params
@group(0) @binding(1) var<storage, read_write> scores: array<f32>;
@group(0) @binding(2) var<storage, read> qkv: array<B2>;
@group(0) @binding(3) var<storage, read> kv: array<B3>;
@group(0) @binding(4) var<uniform> pd: Params;

@compute @workgroup_size(256)
fn decode_embed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let ch = flat(gid, nwg);
    if (ch < p.c) {
        out[ch] = B0(wte[p.token * p.c + ch] + wpe[p.pos * p.c + ch]);
    }
}

@compute @workgroup_size(256)
fn kv_append(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    let width = 2u * pa.c;
    if (i >= pa.token * width) {
        return;
    }
    let r = i / width;
    let j = i % width;
    // `out` is the cache here (binding 0).
    out[(pa.pos + r) * width + j] = B0(f32(new_qkv[r * 3u * pa.c + pa.c + j]));
}

@compute @workgroup_size(256)
fn decode_attention(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let head = wid.x;
    let d = pd.c / pd.token;
    let width = 2u * pd.c;
    let row0 = head * pd.max_t;
    // Scores of keys 0..=pos, each thread a stride of them.
    var local_max = -3.0e38;
    for (var j = lid; j <= pd.pos; j += 256u) {
        var s = 0.0;
        for (var e = 0u; e < d; e++) {
            s += f32(qkv[head * d + e]) * f32(kv[j * width + head * d + e]);
        }
        s *= pd.scale;
        scores[row0 + j] = s;
        local_max = max(local_max, s);
    }
    let m = block_max(local_max, lid);
    var local_sum = 0.0;
    for (var j = lid; j <= pd.pos; j += 256u) {
        let w = exp(scores[row0 + j] - m);
        scores[row0 + j] = w;
        local_sum += w;
    }
    let total = block_sum(local_sum, lid);
    // The weights were written by other threads of this workgroup.
    storageBarrier();
    for (var e = lid; e < d; e += 256u) {
        var acc = 0.0;
        for (var j = 0u; j <= pd.pos; j++) {
            acc += scores[row0 + j] * f32(kv[j * width + pd.c + head * d + e]);
        }
        out[head * d + e] = B0(acc / total);
    }
}
