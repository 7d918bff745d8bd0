# deploy/deploy.mk — Helm chart checks, Prometheus, and the live demo.
# Included by the top-level Makefile (`-include deploy/deploy.mk`).
#
#   make helm-lint        helm lint (default values and every optional feature on)
#   make chart-sync-crd   copy operator/crd/*.yaml into the chart (tests hold them equal)
#   make prometheus       install Debian's prometheus package when prometheus or promtool is
#                         not on PATH
#   make demo-live        local control plane + extender + operator + Prometheus + TrainingJobs
#                         (rlsched demo up, from the dev tooling in dev/)
#   make demo-down        stop everything demo-live started

CHART := deploy/helm/rlsched
DEMO_DURATION ?= 180
DEMO_ARGS ?=
# sudo only when not root and available (GitHub runners; this machine runs as root)
SUDO := $(shell [ "$$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && echo sudo)
# helm and kubectl from the tools cache (tools/build.sh prints where)
RLSCHED_TOOLS_BIN ?= $(shell tools/build.sh --print-bin 2>/dev/null)
HELM ?= $(RLSCHED_TOOLS_BIN)/helm

# `make test` needs Prometheus for the observability tests in tests/deploy.
TEST_DEPS += prometheus

.PHONY: prometheus helm-lint chart-sync-crd demo-live demo-down

# The demo and the observability tests run `prometheus` and `promtool` found on PATH
# (another build: `DEMO_ARGS=--prometheus PATH`); the package may start a system
# service, which is stopped: rlsched runs its own instances.
prometheus:
	@if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then \
	  echo "prometheus: $$(command -v prometheus)"; \
	else \
	  echo "prometheus: not on PATH; installing Debian's package (apt-get install prometheus)"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus && \
	  { $(SUDO) systemctl stop prometheus >/dev/null 2>&1 || true; }; \
	fi

chart-sync-crd:
	cp operator/crd/*.yaml $(CHART)/files/crds/

helm-lint: tools
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) \
	  --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
	  --set metrics.prometheusRule.enabled=true --set operator.watchNamespace=team-a \
	  --set operator.replicas=2

demo-live: venv tools prometheus
	$(VENV)/bin/rlsched demo up --duration $(DEMO_DURATION) --out $(OUT)/demo $(DEMO_ARGS)

demo-down: venv
	$(VENV)/bin/rlsched demo down
