"""The simulator: same code as MPI on a virtual clock; deterministic; exact staleness."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import main
from rundir.status import finished

TIMED = ["--sim-step-time", "0.01", "--sim-apply-time", "0.0001", "--batch-size", "32", "--lr", "0.01",
         "--eval-samples", "100", "--quiet"]


def sim(out: Path, data: Path, *flags: str) -> Path:
    assert main(["train", "--backend", "sim", "--data", str(data), "--out", str(out), *TIMED, *flags]) == 0
    return out


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def test_same_seed_same_config_gives_byte_identical_logs(tmp_path, tiny_npz):
    flags = ["--clients", "5", "--steps", "12", "--n-sync", "3", "--speed-jitter", "0.3"]
    a, b = sim(tmp_path / "a", tiny_npz, *flags), sim(tmp_path / "b", tiny_npz, *flags)
    for log in ("clients.jsonl", "server.jsonl"):
        assert (a / log).read_bytes() == (b / log).read_bytes()
    c = sim(tmp_path / "c", tiny_npz, *flags, "--seed", "1")
    assert (a / "clients.jsonl").read_bytes() != (c / "clients.jsonl").read_bytes()


@pytest.mark.parametrize("clients,n_sync", [(4, 1), (8, 3)])
def test_equal_speeds_give_staleness_k_minus_1_after_the_first_round(tmp_path, tiny_npz, clients, n_sync):
    run = sim(tmp_path / "run", tiny_npz, "--rule", "easgd", "--clients", str(clients), "--steps", str(4 * n_sync),
              "--n-sync", str(n_sync))
    pushes = rows(run, "server")
    assert len(pushes) == clients * 4
    first_round, later = pushes[:clients], pushes[clients:]
    assert [p["staleness"] for p in first_round] == list(range(clients))
    assert {p["staleness"] for p in later} == {clients - 1}
    summary = json.loads((run / "summary.json").read_text())
    # 4 pushes a client: the error ends two test samples from chance level (`untrained`) at (4, 1)
    assert finished(summary["status"]) and summary["pushes_sent"] == summary["pushes_applied"] == clients * 4


def test_virtual_time_follows_the_time_model(tmp_path, tiny_npz):
    run = sim(tmp_path / "run", tiny_npz, "--clients", "2", "--steps", "6", "--n-sync", "2")
    config = json.loads((run / "config.json").read_text())
    client_rows = rows(run, "clients")
    steps = sorted(r["time"] for r in client_rows if r["client"] == 0)
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert gaps[0] == pytest.approx(0.01)  # two minibatches in one window: one step time apart
    assert max(gaps) > 0.01  # a sync costs transfers and the apply
    assert config["provenance"]["sim"]["step_time"] == 0.01
    summary = json.loads((run / "summary.json").read_text())
    assert summary["time_s"] == pytest.approx(max(r["time"] for r in rows(run, "server")), rel=0.01)
    assert summary["clock"] == "virtual"  # its time and throughput compare with no MPI run's


def test_paper_profile_charges_the_papers_costs(tmp_path, tiny_npz):
    """1.1 s a minibatch, 240 MB each way at 1.25 GB/s plus 50 us, 0.1 s a push at the
    server: the virtual clock of one client follows them to the microsecond."""
    out = tmp_path / "run"
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(out), "--clients", "1",
                 "--steps", "2", "--batch-size", "32", "--eval-samples", "50", "--quiet",
                 "--sim-profile", "paper"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["sim_step_time"] == 0 and config["provenance"]["sim"]["profile"] == "paper"
    transfer = 5e-5 + 240e6 / 1.25e9
    pulled = 5e-5 + transfer  # the first pull's request, then the weights
    times = [r["time"] for r in rows(out, "clients")]
    assert times == pytest.approx([pulled + 1.1, pulled + 1.1 + transfer + 0.1 + transfer + 1.1], abs=1e-9)


def test_the_servers_push_cost_is_the_real_handlers(tmp_path, tiny_npz):
    """Left at 0, the push cost is measured on the server's own handler (a push with
    n_sync log rows and a reply) and recorded in the run's provenance."""
    from experiments.sim.costs import measure_push
    from runconfig.settings import RunConfig

    cfg = RunConfig(data=str(tiny_npz), n_sync=4)
    cost = measure_push(cfg, 10_000, clients=2)
    assert 0 < cost < 1.0
    out = sim(tmp_path / "run", tiny_npz, "--clients", "2", "--steps", "2", "--sim-apply-time", "0")
    assert 0 < json.loads((out / "config.json").read_text())["provenance"]["sim"]["apply_time"] < 1.0


def test_the_push_cost_can_come_from_a_real_runs_server(tmp_path, tiny_npz, capsys):
    """sim_calibrate: every phase the real server measured but taking the push off the
    wire (the simulated transfer stands for it); a folder without them is one line."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "summary.json").write_text(json.dumps({"status": "complete", "server_push_us": {
        "receive": 300.0, "check": 100.0, "apply": 550.0, "reply": 50.0, "record": 80.0, "total": 1080.0,
        "cpu": 1100.0}}))
    flags = ["--clients", "2", "--steps", "2", "--sim-apply-time", "0", "--sim-calibrate", str(real)]
    out = sim(tmp_path / "run", tiny_npz, *flags)
    sim_costs = json.loads((out / "config.json").read_text())["provenance"]["sim"]
    assert sim_costs["apply_time"] == pytest.approx(780e-6)
    applies = [r["apply_s"] for r in rows(out, "server") if "apply_s" in r]
    assert applies and applies == [pytest.approx(780e-6)] * len(applies)
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(tmp_path / "none"), *TIMED,
                 "--sim-apply-time", "0", "--sim-calibrate", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.startswith(f"asgd: error: sim_calibrate: {tmp_path / 'run'} holds no server "
                                              "time a push")


def checkpoint_weights(run: Path):
    from rundir.durable import load_arrays
    return load_arrays(run / "checkpoint" / "latest.npz")["weights"]


def test_the_default_run_of_one_client_is_plain_pytorch_sgd(tmp_path, tiny_npz):
    """No rule, lr or momentum flag: the defaults (fresh at S = K = 1, the sqrt rule of one
    minibatch, the server's momentum at the clients') are torch.optim.SGD at the default
    lr, momentum and weight decay (DESIGN.md's promise)."""
    from clients.data import load_dataset
    from runconfig.settings import RunConfig
    from tests.reference import assert_steps_close, plain_sgd

    run = tmp_path / "run"
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(run), "--clients", "1",
                 "--steps", "12", "--batch-size", "32", "--quiet"]) == 0
    defaults = RunConfig()
    expected = plain_sgd(load_dataset(str(tiny_npz)), 12, batch_size=32, lr=defaults.lr,
                         momentum=defaults.momentum, weight_decay=defaults.weight_decay)
    assert_steps_close(checkpoint_weights(run), expected, 12)
    assert json.loads((run / "config.json").read_text())["rule"] == "fresh"


def test_the_optimizer_clipping_and_precision_keys_are_the_clients(tmp_path, tiny_npz):
    """The config's keys reach the clients: adamw, clipped, in bf16, is plain torch's with
    one client; a factory of the user's (RMSprop, taking lr and weight decay) too."""
    import torch

    from clients.data import load_dataset
    from tests.reference import plain_sgd

    factory = tmp_path / "opt.py"
    factory.write_text("import torch\n\ndef rmsprop(params, lr, weight_decay):\n"
                       "    return torch.optim.RMSprop(params, lr=lr, weight_decay=weight_decay)\n")
    dataset, flags = load_dataset(str(tiny_npz)), ["--clients", "1", "--steps", "10", "--rule", "add"]
    for optimizer, torch_name, extra, autocast in [("adamw", "AdamW", ["--clip-grad-norm", "0.5", "--precision", "bf16"],
                                                    torch.bfloat16), (f"{factory}:rmsprop", "RMSprop", [], None)]:
        run = sim(tmp_path / torch_name, tiny_npz, *flags, "--optimizer", optimizer, *extra)
        clip = 0.5 if extra else 0.0
        expected = plain_sgd(dataset, 10, batch_size=32, lr=0.01, optimizer=torch_name, clip_grad_norm=clip,
                             autocast=autocast, through_server=True)
        np.testing.assert_array_equal(checkpoint_weights(run), expected)  # the same operations: test_client's
        assert json.loads((run / "config.json").read_text())["optimizer"] == optimizer


def test_the_default_rule_steps_with_the_runs_optimizer(tmp_path, tiny_npz, capsys):
    """Under the default rule the server takes the step: with one client at n_sync 1 the
    run is plain torch's loop with that optimizer (AdamW, clipped; SGD with Nesterov), and
    nothing warns that the setting means something else."""
    from clients.data import load_dataset
    from tests.reference import assert_steps_close, plain_sgd

    dataset = load_dataset(str(tiny_npz))
    for name, flags, expected in [
            ("adamw", ["--optimizer", "adamw", "--clip-grad-norm", "0.5"],
             plain_sgd(dataset, 10, batch_size=32, lr=0.01, optimizer="AdamW", clip_grad_norm=0.5)),
            ("nesterov", ["--nesterov"], plain_sgd(dataset, 10, batch_size=32, lr=0.01, nesterov=True))]:
        run = sim(tmp_path / name, tiny_npz, "--clients", "1", "--steps", "10", *flags)
        assert_steps_close(checkpoint_weights(run), expected, 10)  # the server's step on one flat vector
        assert json.loads((run / "config.json").read_text())["rule"] == "fresh"
    assert "warning" not in capsys.readouterr().err


def test_a_users_optimizer_steps_the_server_when_the_simulator_times_it(tmp_path, tiny_npz):
    """Without --sim-apply-time the simulator times the real server's push, whose rule
    steps with the user's optimizer: its factory must reach that server too."""
    factory = tmp_path / "opt.py"
    factory.write_text("import torch\n\ndef rmsprop(params, lr):\n    return torch.optim.RMSprop(params, lr=lr)\n")
    run = tmp_path / "run"
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(run), "--clients", "2",
                 "--steps", "4", "--batch-size", "32", "--sim-step-time", "0.01", "--quiet",
                 "--optimizer", f"{factory}:rmsprop"]) == 0
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"


def test_an_optimizer_factory_that_fails_is_refused_before_launch(tmp_path, tiny_npz, capsys):
    factory = tmp_path / "opt.py"
    factory.write_text("def nothing(params):\n    return 3\n")
    for optimizer, says in [(f"{factory}:nothing", "returned int, not a torch.optim.Optimizer"),
                            ("lion", "expected sgd, adam, adamw or package.module:factory")]:
        assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(tmp_path / "run"),
                     "--optimizer", optimizer]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and err.startswith("asgd: error: optimizer:") and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_sync_mode_equals_one_process_with_k_times_the_batch(tmp_path, tiny_npz):
    from clients.data import load_dataset
    from tests.reference import assert_steps_close, plain_sgd

    run = sim(tmp_path / "run", tiny_npz, "--mode", "sync", "--clients", "3", "--steps", "10", "--lr-scaling", "none")
    expected = plain_sgd(load_dataset(str(tiny_npz)), 10, batch_size=32, lr=0.01, clients=3)
    assert_steps_close(checkpoint_weights(run), expected, 10)
    assert len(rows(run, "clients")) == 30 and rows(run, "server") == []


def test_local_sgd_averaging_every_step_without_momentum_is_sync(tmp_path, tiny_npz):
    from tests.reference import assert_steps_close
    flags = ["--clients", "3", "--steps", "8", "--momentum", "0", "--lr-scaling", "none", "--n-sync", "1"]
    local = sim(tmp_path / "local", tiny_npz, "--mode", "local-sgd", *flags)
    sync = sim(tmp_path / "sync", tiny_npz, "--mode", "sync", *flags)
    assert_steps_close(checkpoint_weights(local), checkpoint_weights(sync), 8)
    rarely = sim(tmp_path / "rarely", tiny_npz, "--mode", "local-sgd", *flags[:-1], "4")
    assert np.abs(checkpoint_weights(rarely) - checkpoint_weights(sync)).max() > 1e-5  # 30x the tolerance


def test_warm_start_then_init_from_its_checkpoint(tmp_path, tiny_npz):
    fresh = sim(tmp_path / "fresh", tiny_npz, "--clients", "2", "--steps", "4")
    warm = sim(tmp_path / "warm", tiny_npz, "--clients", "2", "--steps", "4", "--warm-start", "30")
    warm_rows = rows(warm, "warm_start")
    assert [r["step"] for r in warm_rows] == list(range(1, 31))
    assert warm_rows[-1]["time"] == pytest.approx(30 * 0.01)  # virtual time, one step time each
    assert rows(warm, "eval")[0]["test_loss"] < 0.7 * rows(fresh, "eval")[0]["test_loss"]
    again = sim(tmp_path / "again", tiny_npz, "--clients", "2", "--steps", "4",
                "--init", str(warm / "checkpoint" / "latest.npz"))
    assert rows(again, "eval")[0]["test_loss"] == rows(warm, "eval")[-1]["test_loss"]


def test_a_checkpoint_of_another_model_is_refused(tmp_path, tiny_npz, capsys):
    np.savez(tmp_path / "small.npz", weights=np.zeros(10, np.float32))
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--init", str(tmp_path / "small.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "init:" in err and "float32 weights of shape (10,)" in err and "needs float32 of shape (" in err


def test_replay_reruns_a_recorded_arrival_order(tmp_path, tiny_npz):
    flags = ["--rule", "easgd", "--clients", "3", "--steps", "6", "--n-sync", "2"]
    jittery = sim(tmp_path / "jittery", tiny_npz, *flags, "--speed-jitter", "0.6", "--seed", "3")
    recorded = [(r["client"], r["staleness"]) for r in rows(jittery, "server")]
    assert len({s for _, s in recorded}) > 1  # jitter gave a pattern worth replaying
    replayed = sim(tmp_path / "replayed", tiny_npz, *flags, "--seed", "3", "--replay", str(jittery))
    assert [(r["client"], r["staleness"]) for r in rows(replayed, "server")] == recorded
    plain = sim(tmp_path / "plain", tiny_npz, *flags, "--seed", "3")
    assert [(r["client"], r["staleness"]) for r in rows(plain, "server")] != recorded


def test_replay_of_a_run_that_does_not_fit_is_refused(tmp_path, tiny_npz, capsys):
    recorded = sim(tmp_path / "rec", tiny_npz, "--clients", "2", "--steps", "4")
    code = main(["train", "--backend", "sim", "--data", str(tiny_npz), "--clients", "2", "--steps", "6",
                 "--replay", str(recorded), "--out", str(tmp_path / "bad")])
    assert code == 2 and "replay:" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_keep_best_keeps_the_curves_best_point_and_export_best_exports_it(tmp_path, tiny_npz, capsys):
    import torch

    from rundir.durable import load_arrays

    run = sim(tmp_path / "run", tiny_npz, "--clients", "2", "--steps", "30", "--eval-every", "6", "--keep-best",
              "--keep-snapshots")
    curve, summary = rows(run, "eval"), json.loads((run / "summary.json").read_text())
    best = min(curve, key=lambda r: (r["test_error"], r["version"]))
    assert (summary["best_version"], summary["best_test_error"]) == (best["version"], best["test_error"])
    kept = load_arrays(run / "checkpoint" / "best.npz")["weights"]
    np.testing.assert_array_equal(kept, load_arrays(run / "snapshots" / f"v{best['version']:09d}.npz")["weights"])
    assert main(["export", str(run), "--best", "--out", str(tmp_path / "best.pt")]) == 0
    exported = torch.cat([v.reshape(-1) for k, v in torch.load(tmp_path / "best.pt").items()])
    np.testing.assert_array_equal(exported.numpy(), kept)  # the cnn holds parameters only
    other = sim(tmp_path / "plain", tiny_npz, "--clients", "2", "--steps", "6")
    capsys.readouterr()
    assert main(["export", str(other), "--best"]) == 2
    assert "checkpoint/best.npz" in capsys.readouterr().err


def test_epochs_derive_the_steps_every_row_carries_its_epoch_and_a_resume_extends_them(tmp_path, tiny_npz, capsys):
    """An epoch of a client is its shard's whole minibatches of 32 (of half the training set)."""
    from clients.data import load_dataset

    per_epoch = len(load_dataset(str(tiny_npz)).train) // 2 // 32
    run = sim(tmp_path / "run", tiny_npz, "--clients", "2", "--epochs", "2")
    config, clients = json.loads((run / "config.json").read_text()), rows(run, "clients")
    assert (config["epochs"], config["steps"]) == (2, 2 * per_epoch) and len(clients) == 4 * per_epoch
    assert [r["epoch"] for r in clients if r["client"] == 1] == [0] * per_epoch + [1] * per_epoch
    assert main(["train", "--resume", str(run), "--epochs", "3", "--quiet"]) == 0
    assert [r["epoch"] for r in rows(run, "clients") if r["client"] == 0] == sorted(list(range(3)) * per_epoch)
    capsys.readouterr()
    for argv in (["train", "--resume", str(run), "--steps", "40"],
                 ["train", "--backend", "sim", "--data", str(tiny_npz), "--epochs", "1", "--steps", "5"]):
        assert main(argv) == 2
        assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_stop_at_error_ends_every_client_at_the_same_point_each_time_and_resumes(tmp_path, tiny_npz, mode):
    """The simulator measures each point as its snapshot is taken: the first point at or
    below 0.3 stops the run there (each client's work pushed, then STOP), in every run
    of the config alike; a resume without the target trains the rest."""
    flags = ["--mode", mode, "--clients", "2", "--steps", "60", "--eval-every", "4", "--stop-at-error", "0.3"]
    runs = [sim(tmp_path / name, tiny_npz, *flags) for name in ("a", "b")]
    assert (runs[0] / "clients.jsonl").read_bytes() == (runs[1] / "clients.jsonl").read_bytes()
    summary, curve = json.loads((runs[0] / "summary.json").read_text()), rows(runs[0], "eval")
    reached = summary["target_reached"]
    assert summary["status"].startswith("complete: reached target") and reached["test_error"] <= 0.3
    assert [p["version"] for p in curve if p["test_error"] <= 0.3][0] == reached["version"]
    steps = [max(r["step"] for r in rows(runs[0], "clients") if r["client"] == c) for c in (0, 1)]
    assert max(steps) < 60 and summary["minibatches"] == len(rows(runs[0], "clients")) == sum(steps)
    assert main(["train", "--resume", str(runs[0]), "--stop-at-error", "0", "--quiet"]) == 0
    resumed = json.loads((runs[0] / "summary.json").read_text())
    assert resumed["status"] == "complete" and resumed["minibatches"] == 120


def test_a_metric_of_yours_is_a_column_of_the_curve_and_in_the_summary(tmp_path, tiny_npz, capsys):
    from clients.data import load_dataset
    from clients.models import build_model, load_flat
    from rundir.durable import load_arrays

    code = tmp_path / "metrics.py"
    code.write_text("def accuracy(outputs, targets):\n    return (outputs.argmax(1) == targets).float().mean()\n\n"
                    "def words(outputs, targets):\n    return 'seven'\n")
    run = sim(tmp_path / "run", tiny_npz, "--clients", "2", "--steps", "12", "--metric", f"{code}:accuracy")
    curve, summary = rows(run, "eval"), json.loads((run / "summary.json").read_text())
    assert all(r["test_metric"] == pytest.approx(1 - r["test_error"]) for r in curve)
    dataset = load_dataset(str(tiny_npz))
    model = build_model("cnn", dataset.shape, dataset.num_classes, 0)
    load_flat(model, load_arrays(run / "checkpoint" / "latest.npz")["weights"])
    x, y = dataset.test.batch(np.arange(len(dataset.test)))
    model.eval()
    assert summary["final_test_metric"] == pytest.approx(float((model(x).argmax(1) == y).float().mean()))
    capsys.readouterr()
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(tmp_path / "no"),
                 "--metric", f"{code}:words"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("asgd: error: metric:") and "did not give a number" in err and len(err.splitlines()) == 1


def test_sharded_servers_compute_what_one_does_in_their_slices_time(tmp_path, tiny_npz):
    """--servers S in the simulator: S servers taking every message in one order, as one
    server with the whole vector does, so at equal speeds the losses are one server's
    (under `wait`: the pace waits at equal speeds); each server's push cost is its slice's
    (the given time) and a reply occupies it for a slice's transfer."""
    flags = ["--rule", "fresh", "--clients", "4", "--steps", "8"]
    one = sim(tmp_path / "one", tiny_npz, *flags, "--fresh-reply", "wait", "--sim-apply-time", "0.002",
              "--servers", "1")
    two = sim(tmp_path / "two", tiny_npz, *flags, "--servers", "2", "--sim-apply-time", "0.001")

    def losses(run: Path) -> list[tuple[int, int, float]]:
        return sorted((r["client"], r["step"], r["loss"]) for r in rows(run, "clients") if "loss" in r)
    assert losses(two) == losses(one)
    one_s, two_s = (json.loads((run / "summary.json").read_text()) for run in (one, two))
    assert two_s["server_busy_s"] == pytest.approx(one_s["server_busy_s"] / 2, rel=0.01)
    assert two_s["time_s"] < one_s["time_s"]
    # a slow client: server 0's pace has the others compute again, with two servers too
    # (their second gradients of a step drop at R = 0); tests/sim/test_servers.py: as one's
    uneven = [*flags, "--steps", "30", "--slow-clients", "1", "--step-sigma", "0.5", "--sim-apply-time", "0.001"]
    paced = sim(tmp_path / "paced", tiny_npz, *uneven, "--servers", "2")
    waits = sim(tmp_path / "waits", tiny_npz, *uneven, "--servers", "2", "--fresh-reply", "wait")
    paced_s, waits_s = (json.loads((run / "summary.json").read_text()) for run in (paced, waits))
    assert paced_s["pushes_dropped"] > 0 == waits_s["pushes_dropped"] and paced_s["time_s"] < waits_s["time_s"]
    # the paper profile's push is passes over memory: each of 2 servers takes half
    paper = tmp_path / "paper"
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(paper), "--clients", "1",
                 "--steps", "2", "--batch-size", "32", "--eval-samples", "50", "--quiet", "--sim-profile", "paper",
                 "--servers", "2"]) == 0
    sim_costs = json.loads((paper / "config.json").read_text())["provenance"]["sim"]
    assert sim_costs["apply_time"] == pytest.approx(0.05) and sim_costs["servers"] == 2
