#!/usr/bin/env python3
"""Writes variants of shaders/matmul_coop.wgsl for PAGETRAIN_SHADER_DIR, to time on a GPU without
rebuilding (how stop 47 chose the kernel's tiling; BENCHMARKS.md).

    python3 benches/tools/matmul_coop_variants.py OUT NAME=SPEC ...
    PAGETRAIN_COMPILE_AHEAD=0 PAGETRAIN_SHADER_DIR=OUT/NAME pagetrain bench --matmul off \
        --tensors 1 --tensor-size 1MiB --repeats 10 --gemm 4096x4096x4096:nn:coop:f16 ...
    PAGETRAIN_REQUIRE_COOP=1 PAGETRAIN_SHADER_DIR=OUT/NAME cargo test --release --test coop_matrix

SPEC is one of:
  tiling:WM,WN,FM,FN,CK[,ahead]  the entry point rewritten: WM x WN subgroups, each FM x FN
                                  accumulators of 16x16 (the tile stays 128x128, which the
                                  launcher dispatches), CK-deep slices; `ahead` fetches the next
                                  slice into registers while the current one is multiplied
  no-loads                        the committed kernel with constant chunks instead of global loads
  no-barriers                     the committed kernel without its main loop's barriers
  no-staging                      the committed kernel with neither loads nor workgroup stores
The probes give wrong products by design: they time what the loads, barriers and stores cost.
Warm the GPU with one throwaway bench first: a fresh machine's first seconds time erratically.
"""
import os
import re
import sys

SHADER = os.path.join(os.path.dirname(__file__), "..", "..", "shaders", "matmul_coop.wgsl")


def tiling(src, wm, wn, fm, fn, ck, ahead):
    assert wm * 16 * fm == 128 and wn * 16 * fn == 128, "the tile must stay 128x128"
    threads = 32 * wm * wn
    chunks = 128 * ck // 8 // threads
    head = src[: src.index("@compute")]
    head = re.sub(r"const THREADS: u32 = \d+u;", f"const THREADS: u32 = {threads}u;", head)
    head = re.sub(r"const CK: u32 = \d+u;", f"const CK: u32 = {ck}u;", head)
    head = re.sub(r"const_assert CHUNKS == \d+u;", f"const_assert CHUNKS == {chunks}u;", head)
    acc = [(i, j) for i in range(fm) for j in range(fn)]
    out = []
    w = out.append
    w("@compute @workgroup_size(THREADS)")
    w("fn matmul_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>,")
    w("               @builtin(num_workgroups) nwg: vec3<u32>) {")
    w("    let sg = tid / 32u;")
    w("    let lane = tid % 32u;")
    w("    let id = wid.y * nwg.x + wid.x;")
    w("    let per_group = GROUP * nwg.x;")
    w("    let first = (id / per_group) * GROUP;")
    w("    let rows = min(nwg.y - first, GROUP);")
    w("    let m0 = (first + (id % per_group) % rows) * CT;")
    w("    let n0 = ((id % per_group) / rows) * CT;")
    w(f"    let sm = (sg / {wn}u) * {16 * fm}u;")
    w(f"    let sn = (sg % {wn}u) * {16 * fn}u;")
    w("    let a_base = p.a_off + wid.z * p.stride_a;")
    w("    let b_base = p.b_off + wid.z * p.stride_b;")
    w("    let c_base = p.c_off + wid.z * p.stride_c;")
    for i, j in acc:
        w(f"    var acc{i}_{j}: coop_mat16x16<f32, C>;")
    w("    let direct = DIRECT_C & p.alpha == 1.0 & (!ACCUMULATE | p.beta == 1.0) & m0 + CT <= p.m & n0 + CT <= p.n;")
    w("    let at = c_base + (m0 + sm) * p.n + n0 + sn;")
    w("    let stride = p.n;")
    w("    if (direct & ACCUMULATE) {")
    for i, j in acc:
        w(f"        let pc{i}_{j} = &c32[at + {16 * i}u * p.n + {16 * j}u];")
        w(f"        acc{i}_{j} = coopLoadT<coop_mat16x16<f32, C>>(pc{i}_{j}, stride);")
    w("    }")
    w("    let slices = (p.k + CK - 1u) / CK;")
    fetches = [(f"xa{q}", f"fetch(true, a_base, m0, K, tid + {q}u * THREADS)") for q in range(chunks)]
    fetches += [(f"xb{q}", f"fetch(false, b_base, n0, K, tid + {q}u * THREADS)") for q in range(chunks)]
    if ahead:
        for name, call in fetches:
            w(f"    var {name} = {call.replace('K', '0u')};")
    w("    for (var s = 0u; s < slices; s++) {")
    if not ahead:
        for name, call in fetches:
            w(f"        let {name} = {call.replace('K', 's * CK')};")
    for name, _ in fetches:
        a = "true" if name.startswith("xa") else "false"
        w(f"        put({a}, tid + {name[2:]}u * THREADS, {name});")
    w("        workgroupBarrier();")
    if ahead:
        w("        if (s + 1u < slices) {")
        for name, call in fetches:
            w(f"            {name} = {call.replace('K', '(s + 1u) * CK')};")
        w("        }")
    for d in range(0, ck, 16):
        for i in range(fm):
            w(f"        let a{i}_{d} = frag_a(sm + {16 * i}u, {d}u);")
        for j in range(fn):
            w(f"        let b{j}_{d} = frag_b({d}u, sn + {16 * j}u);")
        for i, j in acc:
            w(f"        acc{i}_{j} = coopMultiplyAdd(a{i}_{d}, b{j}_{d}, acc{i}_{j});")
    w("        workgroupBarrier();")
    w("    }")
    w("    if (direct) {")
    for i, j in acc:
        w(f"        let d{i}_{j} = acc{i}_{j};")
        w(f"        let pd{i}_{j} = &c32[at + {16 * i}u * p.n + {16 * j}u];")
        w(f"        coopStoreT(d{i}_{j}, pd{i}_{j}, stride);")
    w("    } else {")
    for i, j in acc:
        w(f"        let r{i}_{j} = acc{i}_{j};")
        w(f"        store_frag(r{i}_{j}, m0 + sm + {16 * i}u, n0 + sn + {16 * j}u, c_base, sg, lane);")
    w("    }")
    w("}")
    return head + "\n".join(out) + "\n"


def main_loop(src):
    i0 = src.index("    for (var s = 0u; s < slices; s++) {")
    i1 = src.index("    if (direct) {")
    return src[:i0], src[i0:i1], src[i1:]


def keep_bindings(src):
    # a binding the entry stops reading would leave the pipeline layout's bindings
    body = src.rstrip()
    assert body.endswith("}")
    use = "    if (p.k == 0xffffffffu) { c[0] = B0(f32(a[0]) + f32(b[0]) + bitcast<f32>(a4[0].x) + bitcast<f32>(b4[0].x)); }\n"
    return body[:-1] + use + "}\n"


def probe(src, kind):
    before, loop, after = main_loop(src)
    fetch = re.compile(r"let (x[ab]\d) = fetch\([^;]*\);")
    if kind == "no-loads":
        loop = fetch.sub(lambda m: f"let {m.group(1)} = array<vec4<f16>, 2>(vec4<f16>(f16(tid) * 0.001), vec4<f16>(f16(s) * 0.001));", loop)
        return keep_bindings(before + loop + after)
    if kind == "no-barriers":
        return before + loop.replace("        workgroupBarrier();\n", "") + after
    if kind == "no-staging":
        loop = re.sub(r"        let x[ab]\d = fetch\([^;]*\);\n", "", loop)
        loop = re.sub(r"        put\([^;]*\);\n", "", loop)
        return keep_bindings(before + loop + after)
    raise SystemExit(f"unknown variant {kind!r}")


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    src = open(SHADER).read()
    for arg in sys.argv[2:]:
        name, spec = arg.split("=", 1)
        if spec.startswith("tiling:"):
            fields = spec[len("tiling:"):].split(",")
            wm, wn, fm, fn, ck = (int(x) for x in fields[:5])
            text = tiling(src, wm, wn, fm, fn, ck, fields[5:] == ["ahead"])
        else:
            text = probe(src, spec)
        os.makedirs(os.path.join(sys.argv[1], name), exist_ok=True)
        open(os.path.join(sys.argv[1], name, "matmul_coop.wgsl"), "w").write(text)


if __name__ == "__main__":
    main()
