# make demo:          what the demo needs (python3-venv when missing) + .venv with clusterctl, torch, numpy;
#                     trains the quickstart on this machine in a checkpoint dir of its own (every run trains).
# make demo-recovery: the same job with a rank killed mid-epoch: detection, relaunch, exact resume, and the
#                     final parameters compared with an uninterrupted run's.
# make test:          the testbed's Debian packages (sshd, podman, ...) when missing + .venv with the test extras
#                     + pytest. Idempotent; fast when installed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_DEB := procps util-linux
TEST_DEB := openssh-server openssh-client podman runc catatonit iproute2 procps psmisc util-linux
TORCH := torch==2.13.0
DEMO_ENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

.PHONY: test demo demo-recovery deps demo-deps test-deps venv demo-venv clean-venv

test: test-deps venv
	$(PY) -m pytest -q --durations=25 tests

demo: demo-deps demo-venv
	$(DEMO_ENV) $(PY) examples/quickstart/demo.py train

demo-recovery: demo-deps demo-venv
	$(DEMO_ENV) $(PY) examples/quickstart/demo.py recovery

deps: test-deps

# $(1): Debian packages; python3-venv is added when this Python cannot make a venv
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if ! $(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1; then missing="$$missing python3-venv"; fi; \
	if [ -n "$$(echo $$missing)" ]; then \
		echo "installing Debian packages:" $$missing; \
		apt-get update -q </dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing </dev/null; \
	fi
endef

demo-deps:
	$(call apt_install,$(DEMO_DEB))

test-deps:
	$(call apt_install,$(TEST_DEB))

venv: $(VENV)/.installed-test
demo-venv: $(VENV)/.installed-demo

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install when the project's metadata changes; a stamp per extra keeps repeated runs fast.
$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed-demo

$(VENV)/.installed-demo: pyproject.toml | $(PY)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[demo]'
	touch $@

clean-venv:
	rm -rf $(VENV)
