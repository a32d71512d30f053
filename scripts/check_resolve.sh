#!/usr/bin/env bash
# Does `pip install ".[train,eval,gpu]"` resolve, vLLM included, against the versions CI tested
# (constraints.txt)? A dry run in a throwaway environment: pip reads the package metadata only,
# installs nothing and needs no GPU (about a minute against PyPI; about 4 minutes against the
# index this was written on, which serves no metadata files). CI runs it before the tests
# (.ci/run). Prints what the GPU install would get; exits non-zero when it does not resolve, or
# when it downloaded a torch wheel (a CUDA build: several hundred MB).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$PYTHON" -m venv "$tmp/venv"
# pip pinned: `fast-deps` (still an opt-in feature) reads a wheel's metadata with HTTP range
# requests where the index does not serve it on its own (PEP 658), instead of downloading the wheel
# (measured here, against an index without it: 168 wheels, 2 GB, the same ~4 minutes)
"$tmp/venv/bin/python" -m pip install -q "pip==26.3"
start=$SECONDS
if ! "$tmp/venv/bin/python" -m pip install --dry-run --use-feature=fast-deps --report "$tmp/report.json" -c constraints.txt \
     ".[train,eval,gpu]" >"$tmp/pip.log" 2>&1; then
  grep -v "is ignored: it is neither" "$tmp/pip.log" | tail -n 30
  echo "check-resolve: .[train,eval,gpu] does NOT resolve against constraints.txt" >&2
  exit 1
fi
"$tmp/venv/bin/python" - "$tmp/report.json" "$tmp/pip.log" $((SECONDS - start)) <<'EOF'
import json, re, sys
report, log, seconds = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), sys.argv[3]
got = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}
shown = ", ".join(f"{name} {got[name]}" for name in ("vllm", "kernels", "deepspeed", "torch", "transformers", "trl", "peft", "accelerate") if name in got)
print(f"check-resolve: .[train,eval,gpu] resolves against constraints.txt in {seconds} s: {len(got)} packages ({shown})")
# A dry run needs only each wheel's metadata: PyPI serves it beside the wheel (PEP 658), fast-deps
# reads it by range requests. A wheel downloaded whole is listed; torch's is a CUDA build of ~0.5 GB
# (unless a CPU build on disk matched first: pip prefers 2.13.0+cpu to 2.13.0).
units = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}
wheels = [(name, float(size) * units[unit]) for name, size, unit in
          re.findall(r"Downloading (\S+\.whl) \(([\d.]+) (kB|MB|GB)\)", log)]
if wheels:
    print(f"check-resolve: pip downloaded {len(wheels)} whole wheels to read their metadata "
          f"({sum(mb for _, mb in wheels):.0f} MB)")
torch = [name for name, _ in wheels if name.startswith("torch-")]
if torch:
    print(f"check-resolve: the dry run downloaded torch itself ({torch}), a CUDA build", file=sys.stderr)
sys.exit(1 if "vllm" not in got or torch else 0)
EOF
