#!/usr/bin/env python3
"""PyTorch's figures beside `pagetrain bench`'s, measured on the same GPU in the same run.

GEMM at 4096^3: fp32 with TF32 off (cuBLAS SGEMM) in the layouts pagetrain's bench times
(A.B, A.B^T, A^T.B), and fp16. 20 products back to back between two synchronizes, best of 3.
Causal attention (scaled_dot_product_attention) forward and backward on GPT-2 small's shape.
The training steps come from ../shared/peers/torch_gpt.py (the workload defined there).
Prints one JSON line.
"""
import json
import time

import torch


def tflops(f, flops, iters=20, repeats=3):
    f()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            f()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / iters)
    return flops / best / 1e12


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    n = 4096
    flops = 2.0 * n**3
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "sgemm_4096_tflops": tflops(lambda: torch.matmul(a, b, out=c), flops),
        "sgemm_4096_nt_tflops": tflops(lambda: torch.matmul(a, b.t(), out=c), flops),
        "sgemm_4096_tn_tflops": tflops(lambda: torch.matmul(a.t(), b, out=c), flops),
    }
    ah, bh, ch = a.half(), b.half(), c.half()
    out["hgemm_4096_tflops"] = tflops(lambda: torch.matmul(ah, bh, out=ch), flops)
    out.update(attention())
    print(json.dumps(out))


def attention():
    """Causal attention on GPT-2 small's shape (8 x 1024, 12 heads of 64) through
    scaled_dot_product_attention, counted as pagetrain's bench counts it: 2·B·H·T²·D useful FLOPs
    forward, 2.5 times that backward."""
    b, h, t, d = 8, 12, 1024, 64
    flops = 2.0 * b * h * t * t * d
    figures = {}
    for name, dtype in (("f32", torch.float32), ("f16", torch.float16)):
        q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(o)
        forward = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        backward = lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
        figures[f"attention_{name}_tflops"] = tflops(forward, flops)
        figures[f"attention_{name}_backward_tflops"] = tflops(backward, 2.5 * flops)
    return figures


if __name__ == "__main__":
    main()
