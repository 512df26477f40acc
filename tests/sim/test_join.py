"""Clients that join a running job, in whole simulated runs (`--joinable --joins C@T`):
growth from K to K' clients, and a run whose every client died going on with a joiner."""
from __future__ import annotations

import json
from collections import Counter

from experiments.cli import main
from rundir.durable import load_arrays, save_arrays
from tests.sim.test_sim import TIMED, rows, sim


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def each_once(run) -> Counter:
    """Minibatches a client in clients.jsonl, having checked every (client, step) is there once."""
    logged = [(r["client"], r["step"]) for r in rows(run, "clients")]
    assert len(logged) == len(set(logged))
    return Counter(client for client, _ in logged)


def test_a_run_grows_from_two_clients_to_four_every_row_once(tmp_path, tiny_npz):
    """Minibatches take 0.01 virtual s: clients 2 and 3 join at 0.05 and 0.1 s, while 0 and 1
    run their 20; with no lost client's shard free each draws from a slot of its own and runs
    the client budget's 20, starting from the weights of the version it joined at."""
    run = sim(tmp_path / "grow", tiny_npz, "--clients", "2", "--steps", "20", "--n-sync", "2", "--budget", "client",
              "--joinable", "--joins", "2@0.05,3@0.1")
    assert each_once(run) == {0: 20, 1: 20, 2: 20, 3: 20}
    joined = [r for r in rows(run, "server") if "joined" in r]
    assert [(r["joined"], r["rank"]) for r in joined] == [(2, 3), (3, 4)]
    assert 0 < joined[0]["version"] < joined[1]["version"]
    assert [(c["client"], c["slot"]) for c in summary(run)["joined_clients"]] == [(2, 2), (3, 3)]
    first = {c: min(r["step"] for r in rows(run, "clients") if r["client"] == c) for c in (2, 3)}
    assert first == {2: 1, 3: 1}
    assert summary(run)["status"] == "complete" and summary(run)["minibatches"] == 80


def test_every_client_dead_then_one_joins_it_pulls_the_last_version_and_does_not_start_over(tmp_path, tiny_npz):
    """One client, 40 steps, pushing every 2: it dies at step 22 (rows 21-22 lost with it)
    after 10 pushes; the server, told at once, goes on with none. A joiner at 1 s takes
    over its shard where its pushes left it (minibatch 20) with the 20 left of its budget,
    from version 10, not from the start: its first loss is below the run's first."""
    run = sim(tmp_path / "dead", tiny_npz, "--clients", "1", "--steps", "40", "--n-sync", "2", "--budget", "client",
              "--lr", "0.05", "--on-client-failure", "continue", "--inject-fault", "1:22", "--joinable",
              "--joins", "1@1.0")
    assert each_once(run) == {0: 20, 1: 20}
    server = rows(run, "server")
    [lost] = [r for r in server if "lost" in r]
    [joined] = [r for r in server if "joined" in r]
    before = [r["version"] for r in server[:server.index(joined)] if "version" in r and "joined" not in r]
    assert lost["client"] == 0 and joined["joined"] == 1 and joined["version"] == max(before) == 10
    assert summary(run)["joined_clients"][0]["slot"] == 0
    assert summary(run)["lost_clients"][0]["client"] == 0
    clients = rows(run, "clients")
    first = next(r for r in clients if r["client"] == 0)
    rejoined = [r for r in clients if r["client"] == 1]
    assert rejoined[1]["version_pulled"] == 10  # its first push's row: the version it pulled on joining
    assert rejoined[0]["loss"] < first["loss"]
    assert summary(run)["status"] == "complete"


def test_a_run_with_joiners_resumes_its_joiners_shard_waiting_for_the_next_joiner(tmp_path, tiny_npz):
    """Joiner 2 on a shard of its own (at 0.05 virtual s); the server fails at version 16,
    after the checkpoint at version 12. The resume starts the job's clients 0 and 1 where
    the checkpoint left them; joiner 2 is not restarted (it was no rank of the job) and is
    lost to the run, its number never given again; the join due at 0.15 s, after the
    checkpoint, comes as client 3 and takes joiner 2's shard where it stood."""
    run = tmp_path / "run"
    flags = [*TIMED, "--rule", "add", "--clients", "2", "--steps", "20", "--n-sync", "2", "--budget", "client",
             "--joinable", "--joins", "2@0.05,3@0.15", "--eval-every", "4"]
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(run), *flags,
                 "--inject-fault", "0:16"]) == 1
    assert main(["train", "--resume", str(run)]) == 0
    left = summary(run)
    assert left["status"] == "complete" and left["minibatches"] == 60
    assert [(c["client"], c["slot"]) for c in left["joined_clients"]] == [(2, 2), (3, 2)]
    [gone] = left["lost_clients"]
    assert gone["client"] == 2 and "a joiner on a shard of its own" in gone["reason"]
    assert each_once(run) == {0: 20, 1: 20, 2: gone["last_step"], 3: 20 - gone["last_step"]}


def test_a_resume_starts_the_jobs_rank_as_the_joiner_that_took_its_lost_clients_shard(tmp_path, tiny_npz):
    """Client 0 dies at its step 7 (6 pushed); joiner 2 takes its shard from minibatch 6
    with the 14 its budget had left. Extended by a resume to 30 steps a client, client 0's
    rank goes on as client 2, to 24 (30 less the 6 it began after); client 0 stays lost."""
    run = sim(tmp_path / "run", tiny_npz, "--rule", "add", "--clients", "2", "--steps", "20", "--n-sync", "2",
              "--budget", "client", "--joinable", "--joins", "2@0.1", "--on-client-failure", "continue",
              "--inject-fault", "1:7")
    assert each_once(run) == {0: 6, 1: 20, 2: 14}
    assert main(["train", "--resume", str(run), "--steps", "30"]) == 0
    assert each_once(run) == {0: 6, 1: 30, 2: 24}
    [lost] = summary(run)["lost_clients"]
    assert lost["client"] == 0 and "client 2 went on with its shard" in lost["reason"]
    assert summary(run)["minibatches"] == 60


def test_a_joiner_far_slower_than_the_others_pulls_once_pushes_and_the_budget_holds(tmp_path, tiny_npz):
    """Speeds 1 and 0.05: joiner 2 runs on client 0's hardware, joiner 3 on client 1's, 20
    times slower. Under the run's budget (40 minibatches) the fast clients compute most of
    it; the slow joiner pulls once (on joining), pushes the window it was told to run, from
    the version it joined at, and is told to stop: the run's minibatches are exactly its budget."""
    run = sim(tmp_path / "slow", tiny_npz, "--clients", "2", "--steps", "20", "--n-sync", "2",
              "--client-speeds", "1,0.05", "--joinable", "--joins", "2@0.05,3@0.06")
    counts = each_once(run)
    joined = {r["joined"]: r["version"] for r in rows(run, "server") if "joined" in r}
    slow = [r for r in rows(run, "clients") if r["client"] == 3]
    pulls = [r["version_pulled"] for r in slow if "version_pulled" in r]
    assert len(slow) == 2 and pulls == [joined[3]]
    assert sum(counts.values()) == summary(run)["minibatches"] == 40 and counts[0] > counts[3]


SPARE_RUN = ["--clients", "2", "--spares", "1", "--on-client-failure", "continue", "--steps", "40", "--budget",
             "client"]


def test_a_spare_joins_when_a_client_is_lost_one_admit_and_one_join_later_on_the_lost_shard(tmp_path, tiny_npz):
    """Client 1 (rank 2) dies at step 5, its 4 pushed; spare rank 3 is admitted at once and
    its JOIN reaches the server two link latencies later (the ADMIT out, the JOIN back; the
    server may be busy with one push then): it is client 2, on client 1's shard from
    minibatch 4 with the 36 left of its steps. tests/mpi/test_spares.py runs the same over MPI."""
    run = sim(tmp_path / "spare", tiny_npz, *SPARE_RUN, "--inject-fault", "2:5", "--sim-latency", "0.001")
    assert each_once(run) == {0: 40, 1: 4, 2: 36}
    server = rows(run, "server")
    [lost] = [r for r in server if "lost" in r]
    [joined] = [r for r in server if "joined" in r]
    assert (joined["joined"], joined["rank"], joined["spare_for"]) == (2, 3, 1)
    assert 0.002 <= joined["time"] - lost["time"] < 0.002 + 0.01  # two latencies, at most a minibatch's wait more
    s = summary(run)
    assert [(c["client"], c["slot"], c["spare_for"]) for c in s["joined_clients"]] == [(2, 1, 1)]
    assert s["spares_left"] == 0 and s["status"] == "complete"


def test_a_spare_no_client_needed_is_left_and_the_run_is_as_without_it(tmp_path, tiny_npz):
    spared = sim(tmp_path / "spared", tiny_npz, *SPARE_RUN)
    plain = sim(tmp_path / "plain", tiny_npz, *SPARE_RUN[:2], *SPARE_RUN[4:])
    assert summary(spared)["spares_left"] == 1 and summary(spared)["joined_clients"] == []
    assert (spared / "clients.jsonl").read_bytes() == (plain / "clients.jsonl").read_bytes()


def test_a_checkpoint_of_joiners_that_does_not_say_their_shards_is_refused_a_resume_in_one_line(tmp_path, tiny_npz,
                                                                                                capsys):
    """As an earlier version wrote it: the membership not in the checkpoint."""
    run = sim(tmp_path / "joined", tiny_npz, "--clients", "1", "--steps", "10", "--n-sync", "2", "--budget", "client",
              "--joinable", "--joins", "1@0.02")
    checkpoint = run / "checkpoint" / "latest.npz"
    save_arrays(checkpoint, {k: v for k, v in load_arrays(checkpoint).items() if not k.startswith("members.")})
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--steps", "20"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not say which shard each trained on" in err
