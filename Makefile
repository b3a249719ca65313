# The two commands of the README:
#   make demo   install into .venv, then run the built-in CPU demo with the hooks on (real verl engine, real dumps)
#   make test   install into .venv, then lint and run the whole test suite (what .ci/run calls)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU torch, pinned: it installs from local disk; an unpinned torch would pull GBs of CUDA wheels.
TORCH := torch==2.13.0

.PHONY: install demo test bench docs clean chromium

$(BIN)/msprobe-hooks: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt $(TORCH)
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $@

install: $(BIN)/msprobe-hooks

demo: install
	cd examples && DUMP_ON=1 PROMPTS_ONLY=1 DUMP_PHASE=all TORCHDYNAMO_DISABLE=1 \
		../$(BIN)/msprobe-hooks run -- ../$(BIN)/python cpu_demo.py

# Headless Chromium renders the compare report in tests/test_compare.py (Debian's package).
chromium:
	@command -v chromium >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

test: install chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python benchmarks/run_all.py

docs: install
	$(BIN)/python scripts/gen_docs.py

clean:
	rm -rf $(VENV) build *.egg-info msprobe_dump examples/msprobe_dump
