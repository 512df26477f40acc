"""Bad input: exit status 2 and one line naming the field, before any MPI process starts.

In this process; from the shell: tests/reliability/test_bad_input.py."""
from __future__ import annotations

import numpy as np
import pytest

from asgd.command import main


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "not-npz.npz").write_bytes(b"this is not a zip file")
    np.savez(tmp_path / "no-y.npz", x=np.zeros((10, 8, 8), np.uint8))
    np.savez(tmp_path / "float-y.npz", x=np.zeros((10, 8, 8), np.uint8), y=np.full(10, 0.5))
    (tmp_path / "unknown-key.toml").write_text("n_sync = 5\nbogus = 1\n")
    (tmp_path / "bad.toml").write_text("n_sync = = 5\n")
    (tmp_path / "wrong-type.toml").write_text('steps = "many"\n')
    return tmp_path


CASES = [
    (["--n-sync", "0"], "n_sync: must be at least 1"),
    (["--n-push", "-2"], "n_push: must be at least 1"),
    (["--clients", "0"], "clients: must be at least 1"),
    (["--lr", "0"], "lr: must be positive"),
    (["--lr", "-0.1"], "lr: must be positive"),
    (["--batch-size", "0"], "batch_size: must be at least 1"),
    (["--steps", "0"], "steps: must be at least 1"),
    (["--momentum", "1.5"], "momentum: must be in [0, 1)"),
    (["--model", "resnet9000"], "model: unknown model 'resnet9000'"),
    (["--data", "imagenet21k"], "data: unknown dataset 'imagenet21k'"),
    (["--rule", "magic"], "rule: unknown rule 'magic'"),
    (["--momentum", "automatic"], "argument --momentum: invalid momentum value"),
    (["--dc-lambda", "-1"], "dc_lambda: must be non-negative"),
    (["--easgd-beta", "1.5"], "easgd_beta: must be in (0, 1)"),
    (["--rule", "easgd", "--n-push", "2", "--n-fetch", "4"], "rule: easgd needs n_push == n_fetch"),
    (["--sim-profile", "cray"], "sim_profile: unknown profile 'cray'"),
    (["--sim-push-bytes", "-1"], "sim_push_bytes: must be non-negative"),
    (["--device", "tpu"], "device: expected auto, cpu or cuda"),
    (["--n-sync", "three"], "argument --n-sync: invalid int value"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["{d}/unknown-key.toml"], "unknown key 'bogus'"),
    (["{d}/bad.toml"], "not valid TOML"),
    (["{d}/wrong-type.toml"], "steps: expected int"),
    (["{d}/missing.toml"], "cannot read"),
    (["--data", "{d}/missing.npz"], "data:"),
    (["--data", "{d}/not-npz.npz"], "data:"),
    (["--data", "{d}/no-y.npz"], "'y'"),
    (["--data", "{d}/float-y.npz"], "'y'"),
    (["--data", "fashion-mnist", "--clients", "4", "--batch-size", "20000"], "batch_size:"),
]


@pytest.mark.parametrize("args,expected", CASES)
def test_bad_input_exits_2_with_one_line(bad_files, capsys, args, expected):
    args = [a.format(d=bad_files) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(["train", *args]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("asgd: error: "), err
    assert expected in err


def test_a_used_run_directory_is_refused(tmp_path, capsys, tiny_npz):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    assert main(["train", "--data", str(tiny_npz), "--out", str(tmp_path / "run")]) == 2
    assert "out:" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--servers", "2", "--mode", "sync"], "servers: more than one server needs --mode async"),
    (["--servers", "0"], "servers: must be at least 1"),
    (["--compress", "fp8"], "compress: expected none, fp16, bf16, int8, int4"),
    (["--compress", "bf16", "--mode", "sync"], "compress: needs --mode async"),
    (["--compress", "int3"], "compress: expected none, fp16, bf16, int8, int4, got 'int3'"),
    (["--compress", "int4", "--mode", "local-sgd"], "compress: needs --mode async"),
    (["--compress-pulls"], "compress_pulls: needs a --compress codec"),
    (["--on-client-failure", "retry"], "on_client_failure: expected abort or continue"),
    (["--on-client-failure", "continue", "--mode", "local-sgd"], "on_client_failure: continue needs --mode async"),
])
def test_scale_out_and_failure_flags_are_checked_before_launch(flags, message, capsys):
    assert main(["train", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("flags, message", [
    (["--rule", "fresh", "--fresh-batch", "-1"], "fresh_batch: must be a positive number of minibatches"),
    (["--rule", "fresh", "--fresh-batch", "some"], "argument --fresh-batch: invalid fresh_batch value"),
    (["--rule", "fresh", "--max-staleness", "-2"], "max_staleness: must be non-negative"),
    (["--rule", "fresh", "--fresh-reply", "later"], "fresh_reply: expected wait or again"),
    (["--rule", "fresh", "--fresh-batch", "auto", "--servers", "2"], "fresh_batch: auto needs servers = 1"),
    (["--rule", "nesterov", "--nesterov-every", "-1"], "nesterov_every: must be non-negative"),
    (["--rule", "nesterov", "--nesterov-momentum", "1"], "nesterov_momentum: must be in [0, 1)"),
    (["--mode", "local-sgd", "--nesterov-momentum", "-0.1"], "nesterov_momentum: must be in [0, 1)"),
    (["--mode", "local-sgd", "--outer-lr", "-0.7"], "outer_lr: must be positive"),
    (["--mode", "local-sgd", "--outer-lr", "0"], "outer_lr: must be positive"),
    (["--rule", "fresh", "--outer-lr", "0.7"], "outer_lr: --rule fresh takes no outer step (its clients push "
                                               "gradients"),
    (["--rule", "sgd", "--nesterov-momentum", "0.9"], "nesterov_momentum: --rule sgd takes no outer step"),
    (["--mode", "sync", "--outer-lr", "0.7"], "outer_lr: --mode sync takes no outer step"),
])
def test_bad_rule_settings_exit_2_with_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse exits itself on a value it cannot read
        raise SystemExit(main(["train", *flags]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("command", ["train", "sweep", "export", "bench"])
def test_help_lists_every_setting_and_exits_0(command, capsys):
    """Every config key a flag, each with its help (a help text argparse cannot format,
    a stray % sign, breaks --help for the whole command)."""
    from dataclasses import fields

    from runconfig.settings import RunConfig

    with pytest.raises(SystemExit) as exit:
        main([command, "--help"])
    assert exit.value.code == 0
    shown = capsys.readouterr().out
    if command == "train":
        hidden = {"inject_fault"}  # the fault-injection tests' own
        missing = [k.name for k in fields(RunConfig) if k.name not in hidden and "--" + k.name.replace("_", "-")
                   not in shown]
        assert missing == []
