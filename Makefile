# kvscope — `make run` and `make test` set everything up on a fresh Debian 12 machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# setuptools' strict editable mode links every file of the package folders into build/ under its kvscope.…
# name (what mypy, IDEs and tracebacks follow); a file added or removed there needs a reinstall, so the
# stamp is named after the list of those files.
TREE   := $(shell find package agent collectors exporters dashboards -type f -not -path '*/__pycache__/*' \
            2>/dev/null | sort | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-$(TREE)
export KVSCOPE_REQUIRE_TOOLS ?= 1

.PHONY: all run test e2e lint typecheck unit bench fuzz tools gpu-check dashboards clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/pip || { $(PYTHON) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip; }
	$(BIN)/pip install -q --config-settings editable_mode=strict -e '.[dev,web,reference,dashboards,otlp,otlp-grpc]'
	rm -f $(VENV)/.installed-*
	touch $@

# promtool and prometheus, amtool and alertmanager, ss and mkfs.ext4 (tests), node_exporter and fio
# (benchmarks) from Debian's packages when missing.
tools:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v amtool >/dev/null || missing="$$missing prometheus-alertmanager"; \
	command -v prometheus-node-exporter >/dev/null || missing="$$missing prometheus-node-exporter"; \
	command -v fio >/dev/null || missing="$$missing fio"; \
	command -v ss >/dev/null || missing="$$missing iproute2"; \
	command -v mkfs.ext4 >/dev/null || missing="$$missing e2fsprogs"; \
	if [ -n "$$missing" ]; then \
	  echo "installing from Debian:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing >/dev/null; \
	fi
	@# Helm's engine for the chart tests: Helm v4 built as a library (helm-python-sdk, 75 MB from PyPI, ~3 s;
	@# the `chart` extra pins it). No helm binary reaches this machine: Debian 12 has none, no PyPI wheel ships
	@# one, and the Go module proxy is out of reach. Skipped when installed.
	@test -x $(BIN)/python || $(MAKE) -s $(STAMP)
	@$(BIN)/python -c "import helm_python" 2>/dev/null || $(BIN)/pip install -q 'helm-python-sdk==0.2.2'

run: $(STAMP)
	$(BIN)/kvscope demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python scripts/typecheck.py

test: $(STAMP) tools lint
	$(BIN)/pytest

# A real vLLM (the CPU build, in its own venv: e2e/setup_vllm.sh, cached) on a tiny local Llama, and a real
# NVIDIA Dynamo (frontend, KV router, two mocker workers; e2e/setup_dynamo.sh, cached), each with `kvscope run`
# beside it; kvscope's figures against the engines' own counters (e2e/).
E2E_VENV ?= .e2e/vllm
AIPERF_VENV ?= .e2e/aiperf
DYNAMO_VENV ?= .e2e/dynamo
e2e: $(STAMP)
	e2e/setup_vllm.sh $(E2E_VENV)
	e2e/setup_aiperf.sh $(AIPERF_VENV)
	e2e/setup_dynamo.sh $(DYNAMO_VENV)
	KVSCOPE_E2E_VENV=$(abspath $(E2E_VENV)) KVSCOPE_E2E_AIPERF_VENV=$(abspath $(AIPERF_VENV)) \
	  KVSCOPE_E2E_DYNAMO_VENV=$(abspath $(DYNAMO_VENV)) $(BIN)/pytest e2e

# >= 100,000 inputs into every parser and decoder of the agent's inputs; counts and crashes per target,
# crashing inputs kept in fuzz-crashes/ (tests/lib/testkit/fuzz.py; about a minute on 2 cores)
fuzz: $(STAMP)
	PYTHONPATH=tests/lib $(BIN)/python -m testkit.fuzz

# Every benchmark, then one table of every goal (bench/summary.py); exits 1 when a goal is missed or a
# bench fails. bench_fleet.py (1,000 pods in a real Prometheus) takes about 12 minutes and up to 15 GB of scratch disk
# for a while; bench_distributed.py about 7. It says first if it will download AIPerf (bench_aiperf.py, about 1.2 GB).
bench: $(STAMP) tools
	@# VictoriaMetrics single-node, vmagent and vmalert (Debian 12's victoria-metrics 1.79.5) for bench_distributed.py
	@command -v vmalert >/dev/null || { echo "installing from Debian: victoria-metrics"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; $$SUDO apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends victoria-metrics >/dev/null; }
	@results=$$(mktemp); status=0; export KVSCOPE_BENCH_RESULTS=$$results; \
	$(BIN)/python bench/summary.py --before; \
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || status=1; done; \
	$(BIN)/python bench/summary.py $$results || status=1; rm -f $$results; exit $$status

# Regenerates the Grafana JSON and the Kubernetes PrometheusRule from dashboards/ (a test fails when stale).
dashboards: $(STAMP)
	$(BIN)/python scripts/build_dashboards.py

gpu-check: $(STAMP)
	$(BIN)/python scripts/gpu_check.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis fuzz-crashes
