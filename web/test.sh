#!/usr/bin/env bash
# The browser demo end to end: builds the wasm (cargo + wasm-bindgen-cli of the lockfile's
# wasm-bindgen version, installed into .tools/ when absent) into web/pkg/, trains web/demo.toml
# natively for the per-step losses, serves web/ on 127.0.0.1, lets headless Chromium (WebGPU on
# SwiftShader) train the page STEPS steps, then checks: the loss fell, the pager evicted and
# re-uploaded tensors, the losses match the native run's, a screenshot of the page was taken, and
# no WebGPU, a device lost mid-run and a budget that cannot fit are messages on the page (screenshots
# of each in target/web-test/). Prints one JSON
# line last: steps, first_loss, last_loss, uploads, evictions, seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-10}
OUT=target/web-test
mkdir -p "$OUT"

for tool in chromium chromedriver python3; do
    command -v "$tool" >/dev/null || { echo "web/test.sh: $tool is missing (apt-get install chromium chromium-driver)" >&2; exit 1; }
done

echo "== wasm-bindgen-cli" >&2
version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
bindgen=.tools/bin/wasm-bindgen
if [ "$("$bindgen" --version 2>/dev/null)" != "wasm-bindgen $version" ]; then
    # --locked first; a registry mirror that lacks one of its locked dependencies needs a fresh resolve.
    cargo install wasm-bindgen-cli --version "$version" --locked --root .tools >&2 ||
        cargo install wasm-bindgen-cli --version "$version" --root .tools >&2
fi

echo "== build" >&2
build_start=$(date +%s)
cargo build --locked --release --target wasm32-unknown-unknown -p pagetrain-web >&2
rm -rf web/pkg
"$bindgen" --target web --no-typescript --out-dir web/pkg target/wasm32-unknown-unknown/release/pagetrain_web.wasm
echo "wasm: $(stat -c %s web/pkg/pagetrain_web_bg.wasm) bytes, built in $(( $(date +%s) - build_start )) s" >&2

echo "== native run of web/demo.toml" >&2
rm -rf "$OUT/native"
cargo run --locked --release -- train --config web/demo.toml --steps "$STEPS" --out "$OUT/native" --eval-every 0 >&2

echo "== serve and train in headless chromium" >&2
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server "$port" --bind 127.0.0.1 --directory web >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.html')" 2>/dev/null && break; sleep 0.1; done
url="http://127.0.0.1:$port/index.html"

# Bad input first: no WebGPU, a budget below the largest tensor, a device lost after the second step.
python3 web/browser_test.py "$url?autostart=1&steps=$STEPS" --steps "$STEPS" --no-webgpu \
    --expect-error "WebGPU" --screenshot "$OUT/no-webgpu.png" >&2
python3 web/browser_test.py "$url?autostart=1&steps=$STEPS&budget=16KiB" --steps "$STEPS" \
    --expect-error "budget" --screenshot "$OUT/budget-too-small.png" >&2
python3 web/browser_test.py "$url?autostart=1&steps=$STEPS&lose_device_after=2" --steps "$STEPS" \
    --expect-error "lost" --screenshot "$OUT/device-lost.png" >&2
# The run itself: its JSON line is the last thing printed.
python3 web/browser_test.py "$url?autostart=1&steps=$STEPS" --steps "$STEPS" \
    --native "$OUT/native/metrics.jsonl" --screenshot "$OUT/page.png"
