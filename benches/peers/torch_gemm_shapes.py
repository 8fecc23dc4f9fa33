#!/usr/bin/env python3
"""cuBLAS SGEMM (TF32 off) on the products given as MxNxK:layout (nn, nt, tn: which operand is
stored transposed, as `pagetrain bench --gemm` takes them), 10 products between two synchronizes,
best of 3. Prints one JSON line: TFLOP/s by product.

    python3 torch_gemm_shapes.py 8192x768x3072:nn 8192x768x3072:nt 768x3072x4096:tn
"""
import json
import sys

import torch

# (the script's folder is on the path: run as `python3 benches/peers/torch_gemm_shapes.py`)
from torch_peer import tflops


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    for spec in sys.argv[1:]:
        dims, layout = spec.split(":")
        m, n, k = map(int, dims.split("x"))
        a = torch.randn(*((k, m) if layout[0] == "t" else (m, k)), device="cuda")
        b = torch.randn(*((n, k) if layout[1] == "t" else (k, n)), device="cuda")
        c = torch.empty(m, n, device="cuda")
        op_a = a.t() if layout[0] == "t" else a
        op_b = b.t() if layout[1] == "t" else b
        out[spec] = round(tflops(lambda: torch.matmul(op_a, op_b, out=c), 2.0 * m * n * k, iters=10), 2)
        del a, b, c
    print(json.dumps(out))


if __name__ == "__main__":
    main()
