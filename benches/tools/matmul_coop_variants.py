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
  wide:BUFFERS,CK[,TM]            subgroups of 64x64 on a TMx128 tile, TM 256 (8 subgroups, 1
                                  workgroup an SM; the launcher still dispatches 128x128 tiles, so
                                  workgroups of odd tile rows return at once: M a multiple of 256,
                                  loads inside) or 128; BUFFERS 2: the next slice fetched while the
                                  current one multiplies, one barrier a slice (NVIDIA's Vulkan
                                  allows 48 KiB a workgroup: wide:2,16 fits, wide:2,32 does not)
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


def prelude(w, acc, wn, fm, fn, tm):
    """The entry point up to its main loop: the tile (TM rows; at 256 the launcher's odd tile
    rows return), this subgroup's part of it (WN subgroups across, FMxFN accumulators each),
    and accumulators starting from C where the product goes straight to it."""
    w("@compute @workgroup_size(THREADS)")
    w("fn matmul_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>,")
    w("               @builtin(num_workgroups) nwg: vec3<u32>) {")
    w("    let sg = tid / 32u;")
    w("    let lane = tid % 32u;")
    w("    let id = wid.y * nwg.x + wid.x;")
    w("    let per_group = GROUP * nwg.x;")
    w("    let first = (id / per_group) * GROUP;")
    w("    let rows = min(nwg.y - first, GROUP);")
    w("    let tile_row = first + (id % per_group) % rows;")
    if tm == 256:
        w("    if (tile_row % 2u == 1u) {")
        w("        return;")
        w("    }")
    w("    let m0 = tile_row * CT;")
    w("    let n0 = ((id % per_group) / rows) * CT;")
    w(f"    let sm = (sg / {wn}u) * {16 * fm}u;")
    w(f"    let sn = (sg % {wn}u) * {16 * fn}u;")
    w("    let a_base = p.a_off + wid.z * p.stride_a;")
    w("    let b_base = p.b_off + wid.z * p.stride_b;")
    w("    let c_base = p.c_off + wid.z * p.stride_c;")
    for i, j in acc:
        w(f"    var acc{i}_{j}: coop_mat16x16<f32, C>;")
    w(f"    let direct = DIRECT_C & p.alpha == 1.0 & (!ACCUMULATE | p.beta == 1.0) & m0 + {tm}u <= p.m & n0 + CT <= p.n;")
    w("    let at = c_base + (m0 + sm) * p.n + n0 + sn;")
    w("    let stride = p.n;")
    w("    if (direct & ACCUMULATE) {")
    for i, j in acc:
        w(f"        let pc{i}_{j} = &c32[at + {16 * i}u * p.n + {16 * j}u];")
        w(f"        acc{i}_{j} = coopLoadT<coop_mat16x16<f32, C>>(pc{i}_{j}, stride);")
    w("    }")
    w("    let slices = (p.k + CK - 1u) / CK;")


def epilogue(w, acc):
    """The accumulators to C, straight or through the epilogue, and the entry point's end."""
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
    prelude(w, acc, wn, fm, fn, 128)
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
    epilogue(w, acc)
    return head + "\n".join(out) + "\n"


def wide_head(src, double, ck, tm, threads):
    """The committed kernel's declarations and helpers for a TMx128 tile of `threads`, with
    put_at / frag_a_at / frag_b_at taking a buffer's offset."""
    head = src[: src.index("@compute")]
    head = re.sub(r"const CK: u32 = \d+u;", f"const CK: u32 = {ck}u;", head)
    head = re.sub(r"const THREADS: u32 = \d+u;", f"const THREADS: u32 = {threads}u;\nconst TM: u32 = {tm}u;", head)
    head = re.sub(r"const_assert CHUNKS == \d+u;", "const BUF_A: u32 = TM * (CK + PAD) / 4u;", head)
    nbuf = "2u * " if double else ""
    head = head.replace("var<workgroup> As: array<vec4<f16>, BUF>;", f"var<workgroup> As: array<vec4<f16>, {nbuf}BUF_A>;")
    head = head.replace("var<workgroup> Bs: array<vec4<f16>, BUF>;", f"var<workgroup> Bs: array<vec4<f16>, {nbuf}BUF>;")
    old = "return select(CT, CK, depth_inner(is_a));"
    assert old in head
    head = head.replace(old, "return select(select(CT, TM, is_a), CK, depth_inner(is_a));")
    head += """
fn put_at(is_a: bool, q: u32, v: array<vec4<f16>, 2>, off: u32) {
    let place = chunk_place(is_a, q);
    let at = off + (place.x * (tile_inner(is_a) + PAD) + place.y) / 4u;
    if (is_a) {
        As[at] = v[0];
        As[at + 1u] = v[1];
    } else {
        Bs[at] = v[0];
        Bs[at + 1u] = v[1];
    }
}

fn frag_a_at(r0: u32, k0: u32, off: u32) -> coop_mat16x16<f16, A> {
    if (TRANS_A) {
        let ptr = &As[off + (k0 * (TM + PAD) + r0) / 4u];
        let stride = (TM + PAD) / 4u;
        return coopLoad<coop_mat16x16<f16, A>>(ptr, stride);
    }
    let ptr = &As[off + (r0 * (CK + PAD) + k0) / 4u];
    let stride = (CK + PAD) / 4u;
    return coopLoadT<coop_mat16x16<f16, A>>(ptr, stride);
}

fn frag_b_at(k0: u32, n0: u32, off: u32) -> coop_mat16x16<f16, B> {
    if (TRANS_B) {
        let ptr = &Bs[off + (n0 * (CK + PAD) + k0) / 4u];
        let stride = (CK + PAD) / 4u;
        return coopLoad<coop_mat16x16<f16, B>>(ptr, stride);
    }
    let ptr = &Bs[off + (k0 * (CT + PAD) + n0) / 4u];
    let stride = (CT + PAD) / 4u;
    return coopLoadT<coop_mat16x16<f16, B>>(ptr, stride);
}

"""
    return head


def wide(src, double, ck, tm):
    """Workgroups of TM/32 subgroups (2 across N), each 64x64 as 4x4 accumulators, on a TMx128
    tile. Timing only: at TM 256, tiles must cover M in pairs."""
    head = wide_head(src, double, ck, tm, tm)
    acc = [(i, j) for i in range(4) for j in range(4)]
    out = []
    w = out.append
    prelude(w, acc, 2, 4, 4, tm)
    chunks = 128 * ck // 8 // tm
    names = [(f"xa{q}", "true", "m0") for q in range(tm * ck // 8 // tm)] + [(f"xb{q}", "false", "n0") for q in range(chunks)]

    def fetch(name, a, t0, k):
        base = "a_base" if a == "true" else "b_base"
        return f"fetch({a}, {base}, {t0}, {k}, tid + {name[2:]}u * THREADS)"

    def put(name, a, off):
        return f"put_at({a}, tid + {name[2:]}u * THREADS, {name}, {off});"

    def multiply(offa, offb):
        for d in range(0, ck, 16):
            for i in range(4):
                w(f"        let a{i}_{d} = frag_a_at(sm + {16 * i}u, {d}u, {offa});")
            for j in range(4):
                w(f"        let b{j}_{d} = frag_b_at({d}u, sn + {16 * j}u, {offb});")
            for i, j in acc:
                w(f"        acc{i}_{j} = coopMultiplyAdd(a{i}_{d}, b{j}_{d}, acc{i}_{j});")

    if double:
        for name, a, t0 in names:
            w(f"    var {name} = {fetch(name, a, t0, '0u')};")
        for name, a, t0 in names:
            w("    " + put(name, a, "0u"))
        w("    workgroupBarrier();")
        w("    for (var s = 0u; s < slices; s++) {")
        w("        let more = s + 1u < slices;")
        w("        if (more) {")
        for name, a, t0 in names:
            w(f"            {name} = {fetch(name, a, t0, '(s + 1u) * CK')};")
        w("        }")
        w("        let cur_a = (s % 2u) * BUF_A;")
        w("        let cur_b = (s % 2u) * BUF;")
        multiply("cur_a", "cur_b")
        w("        if (more) {")
        for name, a, t0 in names:
            off = "BUF_A - cur_a" if a == "true" else "BUF - cur_b"
            w("            " + put(name, a, off))
        w("        }")
        w("        workgroupBarrier();")
        w("    }")
    else:
        w("    for (var s = 0u; s < slices; s++) {")
        for name, a, t0 in names:
            w(f"        let {name} = {fetch(name, a, t0, 's * CK')};")
        for name, a, t0 in names:
            w("        " + put(name, a, "0u"))
        w("        workgroupBarrier();")
        multiply("0u", "0u")
        w("        workgroupBarrier();")
        w("    }")
    epilogue(w, acc)
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
        elif spec.startswith("wide:"):
            fields = [int(x) for x in spec[len("wide:"):].split(",")]
            text = wide(src, fields[0] == 2, fields[1], fields[2] if len(fields) > 2 else 256)
        else:
            text = probe(src, spec)
        os.makedirs(os.path.join(sys.argv[1], name), exist_ok=True)
        open(os.path.join(sys.argv[1], name, "matmul_coop.wgsl"), "w").write(text)


if __name__ == "__main__":
    main()
