# One entry point for setting up, running, testing and building the P4 artifacts.
SHELL := /bin/bash
# Debian's python3 so that Debian's mininet imports in the same interpreter.
SYSTEM_PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
CELLS ?= 256
P4C ?= p4c
P4_BUILD ?= p4src/build
PYTEST_ARGS ?=
RUN_ARGS ?=

.PHONY: help venv test run bench stop p4 clean

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(VENV)/.installed: pyproject.toml p4rtproto/generate.py $(wildcard p4rtproto/*.proto)
	test -x $(PY) || $(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m p4rtproto.generate
	touch $@

venv: $(VENV)/.installed  ## create the virtual environment with every dependency

test: venv  ## run the whole test suite (packet tests need root; BMv2 tests run when simple_switch_grpc is installed)
	$(PY) -m pytest $(PYTEST_ARGS)

run: venv  ## the main job: hosts in namespaces aggregate through the switch (needs root)
	$(PY) -m testnet.demo $(RUN_ARGS)

bench: venv  ## benchmarks: switch packet rate, reference switch vs BMv2 (needs root)
	$(PY) -m bench.switch_rate

stop:  ## remove namespaces, links and switches that an interrupted run left behind
	$(PY) -m testnet.cleanup

p4: $(P4_BUILD)/homagg.json  ## compile the P4 program (needs p4c) into the committed artifacts

$(P4_BUILD)/homagg.json: $(wildcard p4src/*.p4 p4src/include/*.p4)
	mkdir -p $(P4_BUILD)
	$(P4C) --target bmv2 --arch v1model -DCELLS_PER_PKT=$(CELLS) \
	  --p4runtime-files $(P4_BUILD)/homagg.p4info.txtpb -o $(P4_BUILD) p4src/homagg.p4
	@# p4c indents its JSON four-fold; the compact form is what gets committed and pushed.
	$(SYSTEM_PYTHON) -c 'import json, sys; p = sys.argv[1]; d = json.load(open(p)); \
	  open(p, "w").write(json.dumps(d, separators=(",", ":")) + "\n")' $(P4_BUILD)/homagg.json
	rm -f $(P4_BUILD)/homagg.p4i

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) p4rtproto/gen .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
