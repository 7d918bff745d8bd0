# The optional Pollux environment (make pollux-env): the released Pollux policy from PyPI,
# adaptdl-sched and adaptdl 0.2.11, for the bridge tools/pollux/pollux_bridge.py
# (rlsched.sim.peers.pollux). Its own virtualenv, never rlsched's: the release needs
# numpy<1.24 and pymoo 0.5.0, which newer numpy and pymoo break.
#
# What the policy imports at module level (adaptdl_sched.policy.{pollux,speedup,utils},
# adaptdl.goodput): numpy, scipy, autograd, pymoo; the packages' __init__ files import
# nothing, so no Kubernetes client, aiohttp, redis or pandas is installed (--no-deps).
# pymoo 0.5.0 has no wheel for Python 3.11: it builds from its sdist (setuptools, wheel and
# numpy present: --no-build-isolation); its bundled C++ sources do not compile for 3.11,
# so it installs its pure-Python fallback (correct, slower non-dominated sorting).
POLLUX_VENV ?= .venv-pollux
POLLUX_PYTHON_BASE ?= $(or $(PYTHON),python3)
POLLUX_PY := $(POLLUX_VENV)/bin/python
POLLUX_BASE_PINS := setuptools==65.5.0 wheel==0.42.0 numpy==1.23.5 scipy==1.10.1 autograd==1.7.0
POLLUX_PINS := pymoo==0.5.0
POLLUX_RELEASE := adaptdl==0.2.11 adaptdl-sched==0.2.11
POLLUX_PIP := $(POLLUX_PY) -m pip --disable-pip-version-check

.PHONY: pollux-env pollux-env-clean
pollux-env: $(POLLUX_VENV)/.stamp

$(POLLUX_VENV)/.stamp: tools/pollux/pollux.mk
	test -x $(POLLUX_PY) || $(POLLUX_PYTHON_BASE) -m venv $(POLLUX_VENV)
	$(POLLUX_PIP) install --only-binary=numpy,scipy $(POLLUX_BASE_PINS)
	$(POLLUX_PIP) install --no-deps --no-build-isolation $(POLLUX_PINS)
	$(POLLUX_PIP) install --no-deps $(POLLUX_RELEASE)
	$(POLLUX_PY) tools/pollux/pollux_bridge.py --check
	touch $@

pollux-env-clean:
	rm -rf $(POLLUX_VENV)

# The bridge tests run the released policy for real in `make test` (about 12 s to build).
TEST_DEPS += pollux-env
