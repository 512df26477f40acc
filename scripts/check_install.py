"""`make test-install`'s checks, run by a fresh venv's python (a non-editable install) in an empty folder.

    python -I scripts/check_install.py INSTALLED_COPY_OF_THE_CHECKOUT TORCH_SPEC

Every module and sweep spec is installed and imported from the venv, not the checkout;
every shipped spec loads; the installed `asgd` trains (simulated and on MPI) and runs
the shipped fig1 sweep, shrunk to a few minibatches of generated data. Any failure is
one line and a non-zero status.
"""
import importlib, json, os, pathlib, pkgutil, subprocess, sys, sysconfig, time, tomllib
import numpy as np

START = time.monotonic()

src, torch_spec = pathlib.Path(sys.argv[1]), sys.argv[2]
site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
asgd_command = pathlib.Path(sys.executable).parent / "asgd"
PACKAGES = ("asgd", "rundir", "paramserver", "clients", "experiments", "plots")


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
from experiments.sweep.spec import load_spec
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
