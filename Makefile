# One entry point for setting up, running, testing and building the P4 artifacts.
SHELL := /bin/bash
# Debian's python3 so that Debian's mininet imports in the same interpreter.
SYSTEM_PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
CELLS ?= 256
P4C ?= p4c
P4_BUILD ?= p4src/build
BF_P4C ?= bf-p4c
TNA_CELLS ?= 64
TOFINO_BUILD ?= p4src/tofino/build
PYTEST_ARGS ?=
TYPED_PACKAGES := homagg run bench examples
RUN_ARGS ?=
# make run options (empty: the defaults of `python -m run --help`)
HOSTS ?=
SWITCH ?=
CODEC ?=
BW ?=
TOPO ?=
STEPS ?=
MODEL ?=
MODE ?=
# your own torchrun script instead of make run's model, and its arguments (run/script.py)
SCRIPT ?=
ARGS ?=
RUN_OPTS := $(if $(HOSTS),--hosts $(HOSTS)) $(if $(MODEL),--model $(MODEL)) $(if $(SWITCH),--target $(SWITCH)) $(if $(CODEC),--codec $(CODEC)) \
  $(if $(BW),--bw $(BW)) $(if $(TOPO),--topo $(TOPO)) $(if $(STEPS),--steps $(STEPS)) \
  $(if $(MODE),--overlap $(MODE)) $(if $(SCRIPT),--script '$(SCRIPT)') \
  $(if $(ARGS),--script-args='$(subst ','\'',$(ARGS))')
# Debian packages make run needs: Mininet (no Open vSwitch: our own switch class), venv, tc, ifconfig
RUN_DEBS := mininet python3-venv iproute2 net-tools
# Debian packages the eBPF target compiles and loads its program with (docs/ebpf.md)
EBPF_DEBS := clang llvm libbpf-dev bpftool

.PHONY: help venv test check lint run run-deps ebpf ebpf-deps demo bench stop p4 p4-tofino p4-tofino2 clean

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(VENV)/.installed: pyproject.toml homagg/p4rt/generate.py homagg/api/generate.py \
  $(wildcard homagg/api/*.proto)
	test -x $(PY) || $(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m homagg.p4rt.generate
	$(PY) -m homagg.api.generate
	if command -v clang >/dev/null; then $(PY) -m homagg.ebpf.build; fi
	touch $@

venv: $(VENV)/.installed  ## create the virtual environment with every dependency

test: venv lint ebpf-deps  ## lint, then the whole test suite (packet tests need root; BMv2 and eBPF tests run where their target is available)
	$(PY) -m pytest --durations=25 $(PYTEST_ARGS)

check: venv lint  ## lint, then the unit tier alone (pytest -m "unit and not slow": no root, BMv2 or Mininet; ~2 min on 2 cores)
	$(PY) -m pytest -m "unit and not slow" $(PYTEST_ARGS)

lint: venv  ## ruff (rules and formatting, pyproject.toml) and mypy over the packages
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy $(TYPED_PACKAGES)

run-deps:  ## install Debian's mininet and what it relies on, when missing (needs root)
	@dpkg -s $(RUN_DEBS) >/dev/null 2>&1 || { apt-get update && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(RUN_DEBS); }

ebpf-deps:  ## install Debian's clang, llvm, libbpf-dev and bpftool, when missing (as root; otherwise say so)
	@dpkg -s $(EBPF_DEBS) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(EBPF_DEBS); \
	  else echo "note: $(EBPF_DEBS) missing and not root: the eBPF target is skipped"; fi; }

ebpf: venv  ## compile the eBPF target's program into build/ebpf/ (CELLS=; the switch also does it when stale)
	HOMAGG_CELLS_PER_PKT=$(CELLS) $(PY) -m homagg.ebpf.build

run: run-deps ebpf-deps venv  ## Mininet + switch + controller + torchrun job through the switch vs gloo (needs root; HOSTS= SWITCH= MODEL= CODEC= MODE= BW= TOPO= STEPS=; SCRIPT= ARGS=: your own torchrun script)
	$(PY) -m run $(RUN_OPTS) $(RUN_ARGS)

demo: venv  ## the data-plane demo: int32 contributions through the switch, every sum checked (needs root)
	$(PY) -m homagg.lab.demo

BENCH_REPS ?= 5
BENCH ?= quick
comma := ,
# HOMAGG_BMV2_OPT=<prefix of the optimized BMv2 build> (docs/bmv2.md): training on both builds
# (the quick mode then trains 8-bit lanes only, to keep its time)
# otherwise the default target and the eBPF target beside it where the kernel allows it
BENCH_TARGETS := --targets $(if $(HOMAGG_BMV2_OPT),bmv2$(comma)bmv2-opt,present)
BENCH_QUICK_CODECS := $(if $(HOMAGG_BMV2_OPT),lowbit8,lowbit16$(comma)lowbit8)
# BENCH=full: the long matrix, written beside quick's results as <name>_full.md / .png, so
# neither mode overwrites the other's tables (bench.summary --suffix _full reads them first)
ifeq ($(BENCH),full)
BENCH_SUFFIX = _full
BENCH_RATE = --cells 64 128 256
BENCH_AGGREGATION =
BENCH_WORKER_RATE = --n 4000000 --reps 5 --profile
BENCH_TRAINING = --rounds 2 --steps 15 --models ncf,mlp,lm --codecs lossless,fixed_point,lowbit16,lowbit8
BENCH_PEERS = --rounds 3 --steps 40
BENCH_REGIMES = --rounds 2 --steps 16 --hosts 2,4,8 --bws 100,1000
BENCH_OVERLAP = --rounds 2 --steps 24 --models ncf,mlp,lm --bw 0,100 --also lm:1024:5
BENCH_PROJECTION = --check-workers 2 4 8 16 32 --reps 3
BENCH_TREE = --reps 3
BENCH_EXTRA = echo "== peer methods on 100 Mbit/s links (bench.peers)"; \
	$(PY) -m bench.peers --rounds 2 --steps 30 --bw 100 --name peers_100mbit_full; \
	echo "== convergence with low-bit lanes (bench.lowbit)"; \
	$(PY) -m bench.lowbit --name lowbit_full;
else
BENCH_SUFFIX =
BENCH_RATE = --cells 256
# 10M elements, 3 reps: its dense fixed-point rows take minutes each at 25M (21.5 min in all)
BENCH_AGGREGATION = --n 10000000 --reps 3
BENCH_WORKER_RATE = --n 1000000 --reps 3
BENCH_TRAINING = --rounds 2 --steps 6 --models mlp --codecs $(BENCH_QUICK_CODECS)
BENCH_PEERS = --rounds 1 --steps 10 --models ncf,mlp
BENCH_REGIMES = --rounds 1 --steps 6 --hosts 4,8 --bws '' --codecs lossless
BENCH_OVERLAP = --quick --budget 900
BENCH_PROJECTION = --check-workers 2 4 8 --reps 3
# a smaller gradient: the bytes per worker and the round trips do not depend on it
BENCH_TREE = --n 32768 --reps 2
BENCH_EXTRA =
endif
bench: venv  ## benchmarks (needs root, ~15 min on 2 cores, ~25 with the eBPF target's rows; BENCH=full: hours, *_full results): switch rate, codecs, aggregation, worker packet rate, training, peer methods, link rates and W, overlap and auto, the projection to clusters, one switch against a two-level tree by W; tables and plots in bench/results/
	@start=$$(date +%s); set -e; \
	echo "== switch packet rate (bench.switch_rate)"; $(PY) -m bench.switch_rate $(BENCH_RATE) --reps $(BENCH_REPS) --name switch_rate$(BENCH_SUFFIX); \
	echo "== codecs (bench.codecs)"; $(PY) -m bench.codecs --reps $(BENCH_REPS); \
	echo "== agreements through the switch and gloo (bench.agreement)"; $(PY) -m bench.agreement --rounds $(BENCH_REPS) --per-round 25; \
	echo "== codec=auto's decision through the switch and gloo (bench.auto_decision)"; $(PY) -m bench.auto_decision --rounds $(BENCH_REPS) --per-round 25; \
	echo "== aggregation throughput (bench.aggregation)"; $(PY) -m bench.aggregation $(BENCH_AGGREGATION); \
	echo "== worker packet rate per I/O path (bench.worker_rate)"; $(PY) -m bench.worker_rate $(BENCH_WORKER_RATE) --name worker_rate$(BENCH_SUFFIX); \
	echo "== training iteration time (bench.training)"; $(PY) -m bench.training $(BENCH_TRAINING) $(BENCH_TARGETS) --name training$(BENCH_SUFFIX); \
	echo "== the switch beside the peer methods (bench.peers)"; $(PY) -m bench.peers $(BENCH_PEERS) --name peers$(BENCH_SUFFIX); \
	echo "== link rates and W (bench.regimes)"; $(PY) -m bench.regimes $(BENCH_REGIMES) --target present --name regimes$(BENCH_SUFFIX); \
	echo "== overlap and auto (bench.overlap)"; $(PY) -m bench.overlap $(BENCH_OVERLAP) --name overlap$(BENCH_SUFFIX); \
	echo "== projection to clusters, calibrated and checked here (bench.projection)"; $(PY) -m bench.projection --check $(BENCH_PROJECTION) --name projection$(BENCH_SUFFIX) --check-name projection_check$(BENCH_SUFFIX); \
	$(PY) -m bench.projection --costs refswitch --name projection_refswitch$(BENCH_SUFFIX); \
	echo "== one switch, a two-level tree and gloo by W (bench.tree_scaling)"; $(PY) -m bench.tree_scaling $(BENCH_TREE) --targets present --name tree_scaling$(BENCH_SUFFIX); \
	$(BENCH_EXTRA) \
	echo; $(PY) -m bench.summary $$(( $$(date +%s) - start )) --suffix "$(BENCH_SUFFIX)"

RUN ?=
stop:  ## stop run RUN= (number `make run` printed; default: all of this user's runs) and remove what it made
	$(PY) -m run.stop $(RUN)

p4: $(P4_BUILD)/homagg.json  ## compile the P4 program (needs p4c) into the committed artifacts

$(P4_BUILD)/homagg.json: $(wildcard p4src/*.p4 p4src/include/*.p4)
	mkdir -p $(P4_BUILD)
	$(P4C) --target bmv2 --arch v1model -DCELLS_PER_PKT=$(CELLS) \
	  --p4runtime-files $(P4_BUILD)/homagg.p4info.txtpb -o $(P4_BUILD) p4src/homagg.p4
	@# p4c indents its JSON four-fold; the compact form is what gets committed and pushed.
	$(SYSTEM_PYTHON) -c 'import json, sys; p = sys.argv[1]; d = json.load(open(p)); \
	  open(p, "w").write(json.dumps(d, separators=(",", ":")) + "\n")' $(P4_BUILD)/homagg.json
	rm -f $(P4_BUILD)/homagg.p4i

# bf-p4c's output (out/: tofino.bin, context.json, bfrt.json, logs) stays beside the committed
# P4Info and resource summary, ignored by git: `python -m homagg.control.tofino_pipeline` packs it
# (here into out/device_config.pb) for a Stratum switch. Counters come out as P4Runtime's
# standard counters (--p4runtime-force-std-externs), as Stratum and the controller read them.
define TOFINO_COMPILE
	@command -v $(BF_P4C) >/dev/null || { echo "$(BF_P4C) not found: build p4c with its Tofino back end (-DENABLE_TOFINO=ON, docs/tofino.md) or set BF_P4C="; exit 2; }
	rm -rf $(2)/out && mkdir -p $(2)
	$(BF_P4C) --target $(1) --arch $(3) -g -DTNA_CELLS=$(TNA_CELLS) \
	  --p4runtime-force-std-externs --p4runtime-files $(2)/homagg_tna.p4info.txtpb \
	  -o $(2)/out p4src/tofino/homagg_tna.p4
	$(SYSTEM_PYTHON) p4src/tofino/resources.py $(2)/out > $(2)/resources.txt
	$(SYSTEM_PYTHON) p4src/tofino/sources.py $(1) $(TNA_CELLS) "$$($(BF_P4C) --version | head -1)" > $(2)/sources.txt
	cd $(2)/out && find . -name bfrt.json -o -name context.json -o -name 'tofino*.bin' \
	  | sed 's|^\./||' | LC_ALL=C sort > ../device_files.txt
	$(PY) -m homagg.control.tofino_pipeline $(2)/out -o $(2)/out/device_config.pb
endef

p4-tofino:  ## compile the TNA program for Tofino 1 (needs bf-p4c): P4Info and resource summary in p4src/tofino/build
	$(call TOFINO_COMPILE,tofino,$(TOFINO_BUILD),tna)

p4-tofino2:  ## the same for Tofino 2 (t2na), into p4src/tofino/build/tofino2
	$(call TOFINO_COMPILE,tofino2,$(TOFINO_BUILD)/tofino2,t2na)

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) homagg/p4rt/gen homagg/api/*_pb2.py homagg/api/*_pb2_grpc.py .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
