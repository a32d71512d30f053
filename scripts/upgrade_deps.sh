#!/usr/bin/env bash
# `make upgrade-deps`: move constraints.txt forward to the newest releases pyproject.toml allows.
#   1. a dry run of the GPU install, `.[train,eval,gpu]` with torch at TORCH_VERSION, finds the
#      newest versions that resolve with vLLM too (vLLM caps some of what the tests use: numpy);
#   2. a fresh .venv-upgrade gets the test environment at those versions;
#   3. the test suite runs there;
#   4. only when it passes, constraints.txt is rewritten from that environment (`pip freeze`, Rufus
#      and local version labels left out) and scripts/check_resolve.sh checks it again.
# Review `git diff constraints.txt` and commit it. torch moves only with TORCH_VERSION (Makefile).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:?set TORCH_VERSION (the Makefile does)}"
EXTRAS="${EXTRAS:-train,eval,ray,dev,track}"
venv=.venv-upgrade
py="$venv/bin/python"

rm -rf "$venv"
"$PYTHON" -m venv "$venv"
"$py" -m pip install -q "pip==26.3"  # the pip scripts/check_resolve.sh runs (fast-deps)

echo "== 1. the newest versions the GPU install resolves to"
"$py" -m pip install --dry-run --use-feature=fast-deps -q --report "$venv/gpu.json" "torch==$TORCH_VERSION" \
  ".[train,eval,gpu]"
"$py" - "$venv/gpu.json" >"$venv/gpu-pins.txt" <<'EOF'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"].split("+")[0]
    if name.lower() != "rufus":
        print(f"{name}=={version}")
EOF

echo "== 2. the test environment at those versions"
"$py" -m pip install -q "torch==$TORCH_VERSION" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
"$py" -m pip install -q -c "$venv/gpu-pins.txt" -e ".[$EXTRAS]"

echo "== 3. the test suite on them"
"$py" -m pytest -q

echo "== 4. constraints.txt"
{ grep '^#' constraints.txt; "$py" -m pip freeze --exclude-editable | grep -v '^#' | sed -E 's/\+[A-Za-z0-9.]+$//'; } \
  >constraints.txt.new
mv constraints.txt.new constraints.txt
rm -rf "$venv"
bash scripts/check_resolve.sh
git diff --stat -- constraints.txt
