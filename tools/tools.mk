# Control-plane tools built from Go modules (tools/build.sh; docs/control-plane.md).
#   make tools         build etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#                      kubectl, kwok, kwokctl, helm and Kueue (kueue + its CRDs) into a
#                      versioned cache (or reuse it)
#   make cluster-up    local control plane + kwok GPU nodes; kubeconfig in $(CLUSTER_DIR)/
#   make cluster-down  stop it
# RLSCHED_TOOLS_BIN (exported) is the bin directory; rlsched_dev.tools.find_tools reads it.

ifeq ($(origin RLSCHED_TOOLS_BIN),undefined)
RLSCHED_TOOLS_BIN := $(shell bash tools/build.sh --print-bin 2>/dev/null)
endif
export RLSCHED_TOOLS_BIN
CLUSTER_DIR ?= .kube
EXTENDER_URL ?=

.PHONY: tools cluster-up cluster-down
tools:
	@bash tools/build.sh

cluster-up: venv tools
	$(VENV)/bin/rlsched cluster up --dir $(CLUSTER_DIR) $(if $(EXTENDER_URL),--extender-url $(EXTENDER_URL),)

cluster-down: venv
	$(VENV)/bin/rlsched cluster down --dir $(CLUSTER_DIR) --missing-ok

TEST_DEPS += tools
