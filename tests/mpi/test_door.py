"""Joining a running MPI job from outside it (`--joinable`, `asgd join RUN_DIR`): over server
0's door (paramserver/wire/door.py), a process no MPI job owns becomes a client; a
stranger is refused and a joiner that dies mid-pull is lost, both leaving the weights as
they were; bad input is one line and exit status 2 before anything is sent."""
from __future__ import annotations

import json
import signal
import socket
import stat
import time
from pathlib import Path

import pytest

from experiments.cli import main
from paramserver.wire import frame
from rundir.durable import load_arrays
from paramserver.wire.protocol import Fail, Join, Tag, Welcome
from paramserver.wire.stream import SocketLink
from clients.driver import join_server
from tests.conftest import BIN, each_logged_once, finish, kill_tree, run_command, start

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
# client 0 fails at its step 5 (4 pushed): the run, unfinished, waits at its door
RUN = ["--clients", "1", "--joinable", "--on-client-failure", "continue", "--inject-fault", "1:5", "--steps", "60",
       "--budget", "client", "--batch-size", "32", "--eval-samples", "50", "--device", "cpu", "--stall-timeout", "60"]


def _rows(run: Path, log: str) -> list[dict]:
    path = run / f"{log}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for(what, timeout: float, server) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert server.poll() is None, f"the run ended before the joiners came: {server.communicate()[1]}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _knock(door: dict) -> SocketLink:
    return SocketLink(socket.create_connection(("127.0.0.1", door["port"]), timeout=10))


def test_every_client_dead_a_stranger_refused_a_joiner_killed_mid_pull_then_one_joins_and_finishes(tmp_path, tiny_npz):
    run = tmp_path / "run"
    args = [str(BIN / "asgd"), "train", "--quiet", "--data", str(tiny_npz), *RUN, "--out", str(run)]
    server = start(args)
    try:
        _wait_for(lambda: any("lost" in r for r in _rows(run, "server")) and (run / "door.json").exists(), 120, server)
        assert stat.S_IMODE((run / "door.json").stat().st_mode) == 0o600
        door = json.loads((run / "door.json").read_text())
        stranger = _knock(door)
        answer = join_server(stranger, "0" * 32, "prober", frame.empty(1), 10)
        assert answer == Fail("join refused: wrong secret")
        dying = _knock(door)
        dying.send(0, Tag.JOIN, Join(door["secret"], "dying"))
        assert isinstance(dying.recv(10).header, Welcome)
        dying.close()  # before its weights are read
        _wait_for(lambda: sum("lost" in r for r in _rows(run, "server")) == 2, 30, server)
        joiner = run_command([str(BIN / "asgd"), "join", str(run)], timeout=120)
        assert joiner.returncode == 0, joiner.stderr
        assert "joined" in joiner.stderr and "as client 2 at version 4" in joiner.stderr
        result = finish(server, args, 120)
    finally:
        kill_tree(server.pid)
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and not (run / "door.json").exists()
    assert [(c["client"], c["last_step"]) for c in summary["lost_clients"]] == [(0, 4), (1, 0)]
    assert [(c["client"], c["host"], c["version"], c["slot"]) for c in summary["joined_clients"]] == \
        [(1, "dying", 4, 0), (2, socket.gethostname(), 4, 0)]  # the dying one changed nothing: still version 4
    [refused] = [r for r in _rows(run, "server") if "join_refused" in r]
    assert refused["host"] == "prober" and refused["join_refused"] == "wrong secret"
    # client 0's shard, where its pushes left it, went on with the joiner: every sample once
    assert each_logged_once([(r["client"], r["step"]) for r in _rows(run, "clients")], 3) == [4, 0, 56]
    late = run_command([str(BIN / "asgd"), "join", str(run)], timeout=60)
    assert late.returncode == 2 and late.stderr.strip().endswith("has finished (complete)")
    assert late.stderr.count("\n") == 1


# Speeds 0.05 and 1: client 0 sleeps 19 times its compute after each minibatch, client 1
# none; a joiner, client 2, runs on client 2 mod 2's hardware (clients/stragglers.py), 20
# times slower than client 1. Client 1's ~900 minibatches of the run's 1,000 take seconds;
# an `asgd join` forked from this process is in within a fraction of one (0.2-0.3 s measured).
# One thread, as each client rank takes on 2 cores: the joiner sets the run's `threads`, and
# at its default (every core) it spun beside the job's ranks, its minibatch 30-400 times
# slower, and the straggler's sleep, 19 times that, held the run's end for 20 s.
SLOW_RUN = ["--clients", "2", "--joinable", "--client-speeds", "0.05,1", "--steps", "500", "--n-sync", "2",
            "--budget", "run", "--rule", "sgd", "--threads", "1", "--batch-size", "32", "--eval-samples", "50",
            "--device", "cpu", "--stall-timeout", "60"]


def test_a_joiner_far_slower_than_the_others_pulls_once_pushes_and_the_budget_holds(tmp_path, tiny_npz):
    """tests/sim/test_join.py's test of the same name, over MPI with a real `asgd join`.
    The joiner's first window computes from the weights its Welcome brought, its one pull
    before it pushes (the simulator's clock ends the run within that window; here the wall
    clock decides how many windows it runs, each from one pull); its pushes are applied
    (`sgd` takes stale pushes: `fresh` at R = 0 would drop them as the fast client's steps
    overtake them), and its windows, told to it out of the run's budget, make that budget
    exact: every minibatch once, the run's 1,000 in all."""
    run = tmp_path / "run"
    args = [str(BIN / "asgd"), "train", "--quiet", "--data", str(tiny_npz), *SLOW_RUN, "--out", str(run)]
    server = start(args)
    try:
        _wait_for(lambda: (run / "door.json").exists(), 120, server)
        joiner = run_command([str(BIN / "asgd"), "join", str(run)], timeout=120)
        assert joiner.returncode == 0, joiner.stderr
        result = finish(server, args, 120)
    finally:
        kill_tree(server.pid)
    assert result.returncode == 0, result.stderr
    [joined] = [r for r in _rows(run, "server") if "joined" in r]
    assert joined["joined"] == 2 and f"as client 2 at version {joined['version']}" in joiner.stderr
    slow = [r for r in _rows(run, "clients") if r["client"] == 2]
    pulls = [r["version_pulled"] for r in slow if "version_pulled" in r]
    applied = [r["version"] for r in _rows(run, "server") if r.get("client") == 2 and "version" in r]
    assert pulls[0] == joined["version"] and len(applied) == len(pulls) >= 1
    counts = each_logged_once([(r["client"], r["step"]) for r in _rows(run, "clients")], 3)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and sum(counts) == summary["minibatches"] == 1000
    assert counts[1] > counts[0] + counts[2]  # the fast client computed most of the budget
    assert [(c["client"], c["slot"]) for c in summary["joined_clients"]] == [(2, 2)]  # a shard of its own


def test_with_two_servers_a_joiner_joins_both_a_wrong_ticket_at_server_1s_door_changing_nothing(tmp_path, tiny_npz):
    """Sharded servers: door.json lists server 1's door beside server 0's; `asgd join`
    is let in by server 0, shows its ticket at server 1's door, pulls from both and runs
    what the lost client's shard had left; a stranger knocking at server 1 with a ticket
    of its own is never let in, and the run completes as if it had not come."""
    run = tmp_path / "run"
    args = [str(BIN / "asgd"), "train", "--quiet", "--data", str(tiny_npz), *RUN[:RUN.index("--inject-fault")],
            "--inject-fault", "2:5", *RUN[RUN.index("--inject-fault") + 2:], "--servers", "2", "--out", str(run)]
    server = start(args)
    stranger = None
    try:
        _wait_for(lambda: any("lost" in r for r in _rows(run, "server")) and (run / "door.json").exists(), 120, server)
        door = json.loads((run / "door.json").read_text())
        [other] = door["servers"]
        assert other["port"] != door["port"]
        stranger = _knock(other)
        stranger.send(0, Tag.JOIN, Join("0" * 32, "prober"))
        joiner = run_command([str(BIN / "asgd"), "join", str(run)], timeout=120)
        assert joiner.returncode == 0, joiner.stderr
        assert "as client 1 at version 4" in joiner.stderr
        result = finish(server, args, 120)
    finally:
        kill_tree(server.pid)
        if stranger is not None:
            stranger.close()
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["minibatches"] == 60
    assert [(c["client"], c["version"], c["slot"]) for c in summary["joined_clients"]] == [(1, 4, 0)]
    assert each_logged_once([(r["client"], r["step"]) for r in _rows(run, "clients")], 2) == [4, 56]


def test_a_run_a_joiner_went_on_in_resumes_with_the_jobs_rank_as_that_joiner(tmp_path, tiny_npz):
    """Client 0 dies at its step 5; a joiner, client 1, goes on with its shard from
    minibatch 4; the job is interrupted (SIGTERM) after a checkpoint that knows the
    joiner. The resume starts the job's one client rank as client 1, from the step and
    the shard position the checkpoint holds: every minibatch of the run once, client 0
    lost for good, the joiner's process gone with the job it joined."""
    run = tmp_path / "run"
    # 400 minibatches: the joiner runs seconds of them, the checkpoint comes 0.2 s after it joined
    flags = ["--quiet", "--data", str(tiny_npz), *RUN[:RUN.index("--steps")], "--steps", "400",
             *RUN[RUN.index("--steps") + 2:], "--checkpoint-every", "0.2", "--out", str(run)]
    server = start([str(BIN / "asgd"), "train", *flags])
    joiner = None
    try:
        _wait_for(lambda: (run / "door.json").exists() and any("lost" in r for r in _rows(run, "server")), 120, server)
        joiner = start([str(BIN / "asgd"), "join", str(run)])

        def knows_the_joiner() -> bool:
            try:
                return len(load_arrays(run / "checkpoint" / "latest.npz")["members.seats"]) == 2
            except (OSError, KeyError, ValueError):
                return False
        _wait_for(knows_the_joiner, 120, server)
        server.send_signal(signal.SIGTERM)
        assert finish(server, flags, 60).returncode == 130
        assert finish(joiner, ["asgd", "join"], 60).returncode != 0  # its server gone
    finally:
        kill_tree(server.pid)
        if joiner is not None:
            kill_tree(joiner.pid)
    steps = load_arrays(run / "checkpoint" / "latest.npz")["tally.client_steps"]
    assert steps[0] == 4 and 0 < steps[1] < 396
    resumed = run_command([str(BIN / "asgd"), "train", "--resume", str(run), "--quiet"], timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["minibatches"] == 400
    [lost] = summary["lost_clients"]
    assert lost["client"] == 0 and "client 1 went on with its shard" in lost["reason"]
    assert [(c["client"], c["slot"]) for c in summary["joined_clients"]] == [(1, 0)]
    assert each_logged_once([(r["client"], r["step"]) for r in _rows(run, "clients")], 2) == [4, 396]


def test_joining_what_is_not_a_joinable_running_run_is_one_line_and_exit_2(tmp_path, tiny_npz, capsys):
    assert main(["join", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    sim = tmp_path / "sim"
    assert main(["train", "--backend", "sim", "--quiet", "--data", str(tiny_npz), "--clients", "1", "--steps", "5",
                 "--out", str(sim)]) == 0
    capsys.readouterr()
    assert main(["join", str(sim)]) == 2
    assert capsys.readouterr().err.strip() == f"asgd: error: join: {sim} is not joinable (start it with --joinable)"
    # as if it were a joinable MPI run whose data was other than this host's: refused before any connection
    config = json.loads((sim / "config.json").read_text())
    config.update(joinable=True, backend="mpi", data_fingerprint={**config["data_fingerprint"], "files": [
        {"path": "elsewhere", "size": 1, "sha256": "0" * 64}]})
    (sim / "config.json").write_text(json.dumps(config))
    (sim / "summary.json").unlink()
    assert main(["join", str(sim)]) == 2
    assert "asgd: error: join: " in capsys.readouterr().err and (sim / "door.json").exists() is False
    (sim / "door.json").write_text(json.dumps({"port": 9, "addresses": ["127.0.0.1"], "secret": "s"}))
    assert main(["join", str(sim)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differs from what the run trained on" in err, err
