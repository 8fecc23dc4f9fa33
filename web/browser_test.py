#!/usr/bin/env python3
"""Drives Debian's chromium (headless, WebGPU on SwiftShader) through chromedriver's WebDriver
protocol (plain HTTP, no client library): opens the demo page, waits until it has trained, takes a
screenshot, compares the page's per-step losses with a native run's, and prints one JSON line.

Usage: browser_test.py URL --steps N --native METRICS.jsonl --screenshot OUT.png [--expect-error TEXT]
"""
import argparse, base64, json, os, shutil, socket, subprocess, sys, tempfile, time, urllib.request

CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--no-first-run", "--disable-quic", "--disable-sync",
    "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage",
    # WebGPU on the CPU: Dawn over SwiftShader's Vulkan.
    "--enable-unsafe-webgpu", "--enable-features=Vulkan", "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader", "--use-angle=swiftshader", "--ignore-gpu-blocklist",
    "--window-size=1600,1000",
]


def chromium_args(no_webgpu):
    if not no_webgpu:
        return CHROMIUM_ARGS
    webgpu = ("--enable-unsafe-webgpu", "--use-webgpu-adapter=swiftshader")
    return [a for a in CHROMIUM_ARGS if a not in webgpu] + ["--disable-features=WebGPU"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["value"]


def native_losses(path):
    with open(path) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    return [l["loss"] for l in lines if "loss" in l and "val_loss" not in l]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--native")
    ap.add_argument("--screenshot")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--expect-error", help="the run must fail with a message containing this")
    ap.add_argument("--no-webgpu", action="store_true", help="start chromium with WebGPU off")
    args = ap.parse_args()

    port = free_port()
    profile = tempfile.mkdtemp(prefix="pagetrain-chromium-")
    driver = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    session = None
    start = time.time()
    try:
        for _ in range(100):
            try:
                call(base, "GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium", "args": chromium_args(args.no_webgpu) + [f"--user-data-dir={profile}"]}}}}
        session = call(base, "POST", "/session", caps)["sessionId"]
        s = f"/session/{session}"
        call(base, "POST", s + "/url", {"url": args.url})
        report = {}
        while time.time() - start < args.timeout:
            text = call(base, "POST", s + "/execute/sync", {
                "script": "const r = document.getElementById('pagetrain-report'); return r ? r.textContent : '';",
                "args": []})
            try:
                report = json.loads(text or "{}")
            except json.JSONDecodeError:
                report = {}
            if report.get("status") in ("finished", "failed", "stopped"):
                break
            time.sleep(0.5)
        seconds = time.time() - start
        if args.screenshot:
            time.sleep(1.0)  # the last frame drawn
            png = base64.b64decode(call(base, "GET", s + "/screenshot"))
            with open(args.screenshot, "wb") as f:
                f.write(png)
        message = call(base, "POST", s + "/execute/sync", {
            "script": "const m = document.getElementById('pagetrain-message'); return m ? m.textContent : '';", "args": []})
    finally:
        if session:
            try:
                call(base, "DELETE", f"/session/{session}")
            except OSError:
                pass
        driver.terminate()
        driver.wait()
        shutil.rmtree(profile, ignore_errors=True)

    failures = []
    if args.expect_error is not None:
        if report.get("status") != "failed" or args.expect_error not in report.get("error", ""):
            failures.append(f"expected a failure naming {args.expect_error!r}, got {report}")
        out = {"status": report.get("status"), "error": report.get("error", ""), "message": message,
               "seconds": round(seconds, 1)}
    else:
        losses = report.get("losses", [])
        if report.get("status") != "finished":
            failures.append(f"the page did not finish: {report.get('status')} {report.get('error', '')} {message}")
        if len(losses) != args.steps:
            failures.append(f"{len(losses)} losses for {args.steps} steps")
        if losses and not losses[-1] < losses[0]:
            failures.append(f"the loss did not fall: {losses}")
        if not report.get("evictions"):
            failures.append("the pager evicted nothing")
        if not report.get("reuploaded_tensors"):
            failures.append("no tensor was uploaded twice")
        worst = None
        if args.native:
            native = native_losses(args.native)[: args.steps]
            if len(native) != len(losses):
                failures.append(f"native run has {len(native)} losses, the page {len(losses)}")
            else:
                worst = max((abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, native)), default=0.0)
                # Same kernels and data; only f32 reduction orders may differ between adapters.
                if worst > 2e-3:
                    failures.append(f"losses differ from native by {worst:.2e} (relative): {losses} vs {native}")
        out = {
            "steps": report.get("steps", 0),
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "uploads": report.get("uploads", 0),
            "evictions": report.get("evictions", 0),
            "writebacks": report.get("writebacks", 0),
            "reuploaded_tensors": report.get("reuploaded_tensors", 0),
            "max_rel_diff_vs_native": worst,
            "train_seconds": round(report.get("seconds", 0.0), 2),
            "tokens_per_s": round(report.get("tokens_per_s", 0.0), 1),
            "adapter": report.get("adapter", ""),
            "limits": report.get("limits", ""),
            "seconds": round(seconds, 1),
        }
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print(json.dumps(out))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
