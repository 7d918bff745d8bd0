# rlsched — every set-up step a fresh machine needs lives here.
#   make test    virtualenv + pinned deps + Go tools, then the whole test suite
#   make demo    the live demo (local control plane, extender, operator, Prometheus)
#   make bench   benchmarks, JSON under bench/results/
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The real trace lives beside the repository in ../shared/data; never committed.
RLSCHED_DATA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
export RLSCHED_DATA_DIR
OUT ?= out
# the 30 slowest tests are listed at the end of every run: the CI budget is watched there
PYTEST_ARGS ?= --durations=30
DEMO_POLICIES ?= fifo/firstfit,sjf/bestfit,tiresias/topology,drf/loadbalance,tetris/fgd,fifo/das

# Targets appended by the included fragments (tools/tools.mk, deploy/deploy.mk).
TEST_DEPS :=

.PHONY: help venv test test-unit demo demo-sim bench bench-peers clean
help:
	@echo "make test   - set up everything and run all tests"
	@echo "make demo   - run the live demo (make demo-sim: the simulator comparison)"
	@echo "make bench  - run the benchmarks (JSON in bench/results/)"
	@echo "make bench-peers - Tiresias, Optimus+Oracle and the released Pollux on the Pollux OSDI'21 workloads"
	@echo "make tools  - build etcd, kube-apiserver, kube-scheduler, kubectl, kwok, helm from Go modules"
	@echo "make cluster-up / cluster-down - local control plane for manual testing"

# rlsched and its dev tooling (dev/: the rlsched-dev distribution, rlsched_dev), both
# editable; the dev tooling is never part of the rlsched wheel or the serving images.
$(VENV)/.stamp: requirements.txt requirements-dev.txt pyproject.toml dev/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check pip==25.3
	$(PIP) install --disable-pip-version-check -r requirements-dev.txt
	$(PIP) install --disable-pip-version-check --no-deps --no-build-isolation -e . -e ./dev
	touch $@

venv: $(VENV)/.stamp

-include tools/tools.mk
-include deploy/deploy.mk
-include tools/pollux/pollux.mk

test: venv $(TEST_DEPS)
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest -m "not k8s" $(PYTEST_ARGS)

demo-sim: venv
	$(if $(RLSCHED_DATA_DIR),$(VENV)/bin/rlsched sim compare --trace alibaba2023:default \
	  --policies $(DEMO_POLICIES) --seed 1 --out $(OUT)/demo-sim/alibaba2023,)
	$(VENV)/bin/rlsched sim compare --trace synthetic:medium \
	  --policies $(DEMO_POLICIES),fifo/firstfit/optimus,fifo/firstfit/beta --seed 1 --out $(OUT)/demo-sim/synthetic

# The live system: control plane, extender, operator, Prometheus, TrainingJobs
# (deploy/deploy.mk). `make demo-sim` is the simulator-only comparison.
demo: demo-live

# Benchmarks write JSON under bench/results/; every figure has a baseline measured in
# the same run (naive full-scan placement; a constant-score aiohttp server; FIFO/FirstFit's
# simulation time; the stock kube-scheduler); bench/summary.py gathers issue 15's figures.
bench: venv $(TEST_DEPS)
	mkdir -p bench/results
	$(PY) bench/run.py --out bench/results
	$(PY) bench/extender_bench.py --sizes 1000,5000 --clients 1,2,4,8 --requests 1500 --out bench/results/extender.json
	$(PY) bench/sim_scaling.py --repeats 3 --out bench/results/sim_scaling.json
	$(PY) bench/scheduling.py --out bench/results/scheduling.json
	$(PY) bench/decision_time.py --out bench/results/decision_time.json
	$(PY) bench/hetero_decision_time.py --out bench/results/hetero_decision_time.json
	$(PY) bench/operator_admission.py --jobs 200 --out bench/results
	$(PY) bench/faults.py --rounds 20 --out bench/results/faults.json
	$(PY) bench/twin.py --jobs 20 --out bench/results/twin.json
	$(PY) bench/trainer_import.py --runs 20 --out bench/results/trainer_import.json
	$(PY) bench/tenancy.py --seeds 5 --out bench/results/tenancy.json
	$(PY) bench/summary.py --results bench/results --out bench/results/summary.json

# The fidelity table (docs/benchmark.md): our Tiresias and Optimus+Oracle and the released
# Pollux policy (its own environment, tools/pollux/pollux.mk) on the paper's 24 workloads.
PEERS_ARGS ?=
bench-peers: venv pollux-env
	mkdir -p bench/results
	$(PY) bench/peers.py --out bench/results/peers.json $(PEERS_ARGS)

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info
