# make test: system packages (Debian, only when missing) + .venv + pytest. Idempotent; fast when installed.
# make demo: .venv + clusterctl launch of the quickstart job.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEB_PACKAGES := openssh-server openssh-client podman runc catatonit iproute2 procps psmisc util-linux
TORCH := torch==2.13.0

.PHONY: test demo deps venv clean-venv

test: deps venv
	$(PY) -m pytest -q tests

demo: deps venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/clusterctl launch examples/quickstart/job.yaml

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if ! $(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1; then missing="$$missing python3-venv"; fi; \
	if [ -n "$$(echo $$missing)" ]; then \
		echo "installing Debian packages:" $$missing; \
		apt-get update -q </dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing </dev/null; \
	fi

venv: $(VENV)/.installed

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install when the project's metadata changes; a stamp keeps repeated runs fast.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

clean-venv:
	rm -rf $(VENV)
