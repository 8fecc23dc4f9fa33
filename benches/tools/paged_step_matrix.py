"""Times GPT-2 small's paged step over the ways pagetrain can page it — a buffer per tensor or
ranges of slabs (`--gpu-pool`), host AdamW at once or delayed by a step (`--delayed-update`) —
at 25 % and 10 % of its footprint, and the resident step through the upload ring, each as its
own `pagetrain bench` process, in alternating order, and prints one table (issue 11's question:
which of them brings the 25 % step to 0.9× the resident one). Every run's JSON is kept.

    python3 paged_step_matrix.py /path/to/pagetrain OUT_DIR [--quick]

`--quick` runs each configuration once instead of twice. About 6 minutes on the H200.
`--smoke` runs the 4-layer char GPT at 4 × 32 instead (budgets of its f32 footprint), to check
the tool on a CPU adapter.
"""
import json
import os
import subprocess
import sys

# `$R` of BENCHMARKS.md: one model, batch 8 × 1024, three timed steps after two warm-ups.
COMMON = (
    "--json --tensors 1 --tensor-size 1MiB --repeats 1 --matmul off --steps-model gpt2-124m "
    "--batch-size 8 --seq-len 1024 --steps 3 --store memory --optimizer-on auto --resident-only"
).split()
F16_25, F32_25, F16_10 = "1854634288", "2700613936", "741853715"

RUNS = [
    ("f16 25% buffers", ["--precision", "f16", "--budget", F16_25, "--gpu-pool", "buffers"]),
    ("f16 25% buffers delayed", ["--precision", "f16", "--budget", F16_25, "--gpu-pool", "buffers", "--delayed-update", "0"]),
    ("f16 25% slabs", ["--precision", "f16", "--budget", F16_25, "--gpu-pool", "slabs"]),
    ("f16 25% slabs delayed", ["--precision", "f16", "--budget", F16_25, "--gpu-pool", "slabs", "--delayed-update", "0"]),
    ("f16 resident ring buffers", ["--precision", "f16", "--upload", "ring", "--gpu-pool", "buffers"]),
    ("f16 resident ring slabs", ["--precision", "f16", "--upload", "ring", "--gpu-pool", "slabs"]),
    ("f32 25% buffers", ["--budget", F32_25, "--gpu-pool", "buffers"]),
    ("f32 25% slabs delayed", ["--budget", F32_25, "--gpu-pool", "slabs", "--delayed-update", "0"]),
    ("f16 10% buffers", ["--precision", "f16", "--budget", F16_10, "--gpu-pool", "buffers"]),
    ("f16 10% slabs delayed", ["--precision", "f16", "--budget", F16_10, "--gpu-pool", "slabs", "--delayed-update", "0"]),
]

FIELDS = [
    ("step_ms", "step ms"),
    ("vs_resident", "vs resident"),
    ("stall_ms_per_step", "stalls ms"),
    ("host_optimizer_ms_per_step", "host AdamW ms"),
    ("buffers_created_per_step", "buffers made"),
    ("bind_groups_per_step", "bind groups"),
    ("bytes_up_per_step", "GB up"),
    ("bytes_down_per_step", "GB down"),
]


def summary(doc):
    """The paged figures of one bench JSON line (the resident ones where nothing paged)."""
    if doc.get("at_budgets"):
        row = doc["at_budgets"][0]
        return {key: row.get(key) for key, _ in FIELDS}
    return {"step_ms": doc.get("step_ms_resident")}


def cell(key, value):
    if value is None:
        return "—"
    if key.startswith("bytes"):
        return f"{value / 1e9:.2f}"
    return f"{value:.3f}" if key == "vs_resident" else f"{value:.1f}"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binary, out = sys.argv[1], sys.argv[2]
    repeats = 1 if "--quick" in sys.argv[3:] else 2
    common, runs = COMMON, RUNS
    if "--smoke" in sys.argv[3:]:
        small = {"gpt2-124m": "small", "8": "4", "1024": "32"}
        common = [small.get(a, a) for a in COMMON]
        budgets = {F16_25: "4586479", F32_25: "4586479", F16_10: "1834591"}
        runs = [(name, [budgets.get(a, a) for a in flags]) for name, flags in RUNS]
    os.makedirs(out, exist_ok=True)
    rows = []
    for r in range(repeats):
        # (the second round runs backwards, so neither order favours a configuration)
        for name, flags in runs if r % 2 == 0 else runs[::-1]:
            path = os.path.join(out, f"{name.replace(' ', '_').replace('%', 'pc')}_{r}.json")
            run = subprocess.run([binary, "bench", *common, *flags], capture_output=True, text=True, timeout=300)
            with open(path, "w") as f:
                f.write(run.stdout)
            if run.returncode != 0 or not run.stdout.strip():
                rows.append((name, {"error": run.stderr.strip().splitlines()[-1:] or ["no output"]}))
                continue
            rows.append((name, summary(json.loads(run.stdout.strip().splitlines()[-1]))))
    print("| run | " + " | ".join(label for _, label in FIELDS) + " |")
    print("|---|" + "---|" * len(FIELDS))
    for name, s in sorted(rows, key=lambda row: [n for n, _ in RUNS].index(row[0])):
        if "error" in s:
            print(f"| {name} | failed: {s['error'][0]} |")
        else:
            print(f"| {name} | " + " | ".join(cell(key, s.get(key)) for key, _ in FIELDS) + " |")


if __name__ == "__main__":
    main()
