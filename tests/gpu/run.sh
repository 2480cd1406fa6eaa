#!/usr/bin/env bash
# GPU-only checks: run on a machine with an NVIDIA GPU and driver (no toolkit needed).
# Reads the real GPUs with NVML, records a snapshot, loads the committed fixture
# libraries through the real libcuda, and prints a short report. Writes under
# ${OUT:-/tmp/buildmatrix-gpu}; commit the recorded snapshot as a fixture.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/buildmatrix-gpu}"
mkdir -p "$out"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/buildmatrix ]; then
    "$py" -m venv .venv && .venv/bin/pip install -q -e '.[test]' || exit 3
fi
bm=.venv/bin/buildmatrix
echo "== nvidia-smi"; nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv 2>&1 | head -20
echo "== smoke --record"
$bm smoke --record "$out/snapshot.json" --json > "$out/smoke.json"; echo "exit $?"
cat "$out/snapshot.json"
echo "== smoke (report)"
$bm smoke --snapshot "$out/snapshot.json" --pools examples/pools.yaml; echo "exit $?"
echo "== load test of the fixture libraries, one image per library"
for lib in tests/fixtures/bin/lib*.so tests/fixtures/bin/*.cubin tests/fixtures/bin/*.ptx tests/fixtures/bin/*.fatbin; do
    $bm smoke --snapshot "$out/snapshot.json" --image "$lib" --load-test --json \
        > "$out/load-$(basename "$lib").json"
    code=$?
    "$py" - "$out/load-$(basename "$lib").json" "$lib" "$code" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
checks = {c["name"].split(" on ")[0].split(" ")[0]: c for c in doc["checks"]}
image = next((c for c in doc["checks"] if c["name"].startswith("image ")), None)
load = [c for c in doc["checks"] if c["name"].startswith("load-test ")]
print(f"{sys.argv[2]:45} exit {sys.argv[3]}  check: {'ok' if image and image['ok'] else 'FAIL'}  "
      + "  ".join(("ok " if c["ok"] else "FAIL ") + c["message"] for c in load))
PY
done
echo "== pytest -m gpu"
.venv/bin/pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -5
