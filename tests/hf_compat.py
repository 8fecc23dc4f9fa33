"""Loads a pagetrain checkpoint directory into Hugging Face transformers' GPT2LMHeadModel
unchanged and compares its logits with the ones pagetrain computed (examples/hf_logits.rs).

    cargo run --release --example hf_logits -- runs/default/latest
    python3 tests/hf_compat.py runs/default/latest

Needs torch and transformers (not part of `cargo test`; run where they are installed)."""
import json
import sys

import torch
from transformers import GPT2LMHeadModel

d = sys.argv[1] if len(sys.argv) > 1 else "runs/default/latest"
ref = json.load(open(f"{d}/pagetrain_logits.json"))
model = GPT2LMHeadModel.from_pretrained(d).eval()
b, t, v = ref["shape"]
tokens = torch.tensor(ref["tokens"]).reshape(b, t)
with torch.no_grad():
    logits = model(tokens).logits.double()
ours = torch.tensor(ref["logits"], dtype=torch.float64).reshape(b, t, v)
rel = ((logits - ours).norm() / logits.norm()).item()
maxdiff = (logits - ours).abs().max().item()
print(json.dumps({"transformers_logits_rel_err": rel, "maxdiff": maxdiff, "shape": [b, t, v]}))
assert rel < 1e-4, f"logits differ: rel {rel}"
print("OK: transformers' GPT2LMHeadModel gives pagetrain's logits")
