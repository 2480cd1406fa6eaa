#!/usr/bin/env bash
# GPU-only checks: run on a machine with an NVIDIA GPU and driver (no toolkit needed).
# Reads the real GPUs with NVML, records a snapshot, loads the committed fixture
# libraries through the real libcuda, and prints a short report. Writes under
# ${OUT:-/tmp/buildmatrix-gpu}; commit the recorded snapshot as a fixture. Installs
# into .venv from .whl/ without any network where scripts/gpu-wheels filled it.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/buildmatrix-gpu}"
mkdir -p "$out"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/buildmatrix ]; then
    if [ -d .whl ]; then
        # Offline: the GPU machine has no network. The wheels scripts/gpu-wheels put in
        # .whl/ (docs/development.md, "Tests on a GPU"): nothing is asked of an index.
        "$py" -m venv .venv && .venv/bin/pip install -q --no-index --find-links .whl \
            buildmatrix-gpu pytest || exit 3
    else
        "$py" -m venv .venv && .venv/bin/pip install -q -e '.[test]' || exit 3
    fi
fi
# This tree's package, whichever way .venv was made (the wheel brings the dependencies)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
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
text = open(sys.argv[1]).read()
if not text.strip():  # smoke refused before printing (no GPU, no NVML): its stderr says why
    print(f"{sys.argv[2]:45} exit {sys.argv[3]}  no report")
    sys.exit()
doc = json.loads(text)
checks = {c["name"].split(" on ")[0].split(" ")[0]: c for c in doc["checks"]}
image = next((c for c in doc["checks"] if c["name"].startswith("image ")), None)
load = [c for c in doc["checks"] if c["name"].startswith("load-test ")]
print(f"{sys.argv[2]:45} exit {sys.argv[3]}  check: {'ok' if image and image['ok'] else 'FAIL'}  "
      + "  ".join(("ok " if c["ok"] else "FAIL ") + c["message"] for c in load))
PY
done
echo "== pytest -m gpu"
.venv/bin/pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -5
