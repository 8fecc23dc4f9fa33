// matmul_direct_subgroups: matmul_direct (appended to matmul_direct.wgsl, whose contract, layout
// and helpers it uses) where an 8- or 16-lane subgroup shares its rows of A: the threads of a
// subgroup own the same 8 rows, so where A is read as vec4 (FLAGS & 4) lane j (j < 8) reads the
// j-th of the 8 vec4s a step needs and subgroupBroadcast hands it to the others. llvmpipe pays a
// storage load once per lane, a broadcast is a register move: a step's 16 vec4 loads become 9
// (llvmpipe, char GPT shapes: 6.3-9.1 became 12-15 GFLOP per CPU-second).
// Dispatch as matmul_direct: (ceil(N/128), ceil(M/128), batch), 256 threads a workgroup, thread t
// (t = subgroup_id · subgroup_size + lane) on rows 8·(t / 16).., columns 8·(t % 16)..; launched
// only where the subgroup size is 8 or 16, so that a subgroup's threads share t / 16.
// CPU reference: tests/common/reference.rs `matmul_forward`.

// A's 8 vec4s of a step (as `fetch_a` orders them) from the one each of lanes 0..7 read.
fn share_a(v: vec4<f32>) -> Quad {
    if (TRANS_A) {
        // lane j read depth j / 2, rows 4·(j % 2)..: already a Quad's order
        return Quad(
            subgroupBroadcast(v, 0u),
            subgroupBroadcast(v, 1u),
            subgroupBroadcast(v, 2u),
            subgroupBroadcast(v, 3u),
            subgroupBroadcast(v, 4u),
            subgroupBroadcast(v, 5u),
            subgroupBroadcast(v, 6u),
            subgroupBroadcast(v, 7u),
        );
    }
    // lane j read row j's 4 depths
    return by_depth(array<vec4<f32>, 8>(
        subgroupBroadcast(v, 0u),
        subgroupBroadcast(v, 1u),
        subgroupBroadcast(v, 2u),
        subgroupBroadcast(v, 3u),
        subgroupBroadcast(v, 4u),
        subgroupBroadcast(v, 5u),
        subgroupBroadcast(v, 6u),
        subgroupBroadcast(v, 7u),
    ));
}

@compute @workgroup_size(256)
fn matmul_direct_shared(
    @builtin(subgroup_id) sid: u32,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let t = sid * size + lane;
    let m0 = wid.y * 128u + (t / 16u) * 8u;
    let n0 = wid.x * 128u + (t % 16u) * 8u;
    // (the whole subgroup leaves or stays: it shares m0)
    if (m0 >= p.m) {
        return;
    }
    let a_base = p.a_off + wid.z * p.stride_a;
    let b_base = p.b_off + wid.z * p.stride_b;
    let ar = row_starts(a_base, m0);
    let bc = column_starts(b_base, n0);
    // Threads past N stay for the broadcasts, reading the last columns (their stores are skipped).
    var nb = n0;
    if (VEC_B && !TRANS_B) {
        nb = min(n0, p.n - 4u);
    }
    // the vec4 of A this lane reads at depth 0 (the step's depth is added below)
    let j = lane % 8u;
    var mine = ar[0] + j * p.a_rs;
    if (TRANS_A) {
        mine = a_base + (j / 2u) * p.m + select(m0, min(m0 + 4u, p.m - 4u), j % 2u == 1u);
    }
    mine = select(ar[7], mine, m0 + j < p.m || TRANS_A);
    var lo: array<vec4<f32>, 8>;
    var hi: array<vec4<f32>, 8>;
    for (var k = 0u; k < p.k - p.k % 4u; k += 4u) {
        let qa = share_a(a4[(mine + k * p.a_cs) / 4u]);
        mac_quad(&lo, &hi, qa, fetch_b(bc, nb, b_base, k));
    }
    finish(&lo, &hi, ar, bc, m0, n0, p.c_off + wid.z * p.stride_c);
}
