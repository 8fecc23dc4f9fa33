"""Disassembles the kernels an NVIDIA Vulkan driver compiled for pagetrain, from wgpu's pipeline
cache file, to see what the tensor-core kernels became (registers, HMMA/LDSM counts, spills).

The cache (`$PAGETRAIN_CACHE_DIR`, written by any pagetrain run) holds one zstd frame per
pipeline; each decompresses to an "NVDANVVMNVuc" container whose first section entry (at byte
0x48: type, size, offset as little-endian u32) points at the raw SM code, 8 bytes past `offset`.
`nvdisasm -b SM90` (CUDA toolkit; the lent H200 has /usr/local/cuda-13.0/bin) reads raw code.
Found by inspection of driver 580.159.04's cache: an undocumented format, so expect to adjust.

    PAGETRAIN_CACHE_DIR=/tmp/pc pagetrain bench --gemm 4096x4096x4096:nn:coop:f16 ...
    python3 nvidia_sass.py /tmp/pc out/ [/path/to/nvdisasm]   # ZSTD=/path/to/zstd if not on PATH

Writes out/k<i>.sass per pipeline and out/summary.txt: code size, highest register, and the
most frequent opcodes (the cooperative matmul is the one with HMMA and LDSM).
"""
import collections
import glob
import os
import re
import struct
import subprocess
import sys

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def pipelines(cache_file):
    data = open(cache_file, "rb").read()
    starts = [m.start() for m in re.finditer(re.escape(ZSTD_MAGIC), data)] + [len(data)]
    for i, (a, b) in enumerate(zip(starts, starts[1:])):
        r = subprocess.run([os.environ.get("ZSTD", "zstd"), "-d", "-c"], input=data[a:b], capture_output=True)
        if r.stdout.startswith(b"NVDA"):
            size, offset = struct.unpack_from("<II", r.stdout, 0x4C)
            yield i, r.stdout[offset + 8:offset + 8 + size]


def main():
    src, out = sys.argv[1], sys.argv[2]
    nvdisasm = sys.argv[3] if len(sys.argv) > 3 else "nvdisasm"
    os.makedirs(out, exist_ok=True)
    lines = []
    for cache_file in glob.glob(os.path.join(src, "*")):
        for i, code in pipelines(cache_file):
            raw = os.path.join(out, f"k{i}.bin")
            open(raw, "wb").write(code)
            text = subprocess.run([nvdisasm, "-b", "SM90", raw], capture_output=True, text=True)
            sass = text.stdout + text.stderr
            open(os.path.join(out, f"k{i}.sass"), "w").write(sass)
            ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass))
            regs = max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1)
            top = ", ".join(f"{k}:{v}" for k, v in ops.most_common(20))
            lines.append(f"k{i}: {len(code)} bytes, registers to R{regs}: {top}")
    open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
