"""The peer for `pagetrain bench`'s transfer rows: host <-> GPU copies in PyTorch (CUDA) from
pinned (cudaHostAlloc) and pageable memory, the same byte counts as the bench (4 tensors of
16 MiB by default), best of 3. Run right after pagetrain in the same call:
    python3 benches/peers/torch_transfers.py [--tensors 4] [--tensor-mib 16]
Prints one JSON line of GB/s (1e9 bytes per second)."""
import argparse
import json
import time

import torch


def best_gbps(copy, nbytes, repeats=3):
    best = 0.0
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        copy()
        torch.cuda.synchronize()
        best = max(best, nbytes / (time.perf_counter() - t) / 1e9)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=4)
    ap.add_argument("--tensor-mib", type=int, default=16)
    a = ap.parse_args()
    n = a.tensor_mib << 18  # f32 elements
    nbytes = a.tensors * n * 4
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "bytes": nbytes}
    dev = [torch.empty(n, device="cuda") for _ in range(a.tensors)]
    for kind, pin in (("pinned", True), ("pageable", False)):
        host = [torch.rand(n).pin_memory() if pin else torch.rand(n) for _ in range(a.tensors)]

        def up():
            for h, d in zip(host, dev):
                d.copy_(h, non_blocking=pin)

        def down():
            for h, d in zip(host, dev):
                h.copy_(d, non_blocking=pin)

        best_gbps(up, nbytes, 1)  # warm-up
        out[f"upload_{kind}_gbps"] = best_gbps(up, nbytes)
        out[f"download_{kind}_gbps"] = best_gbps(down, nbytes)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
