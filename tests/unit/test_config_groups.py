"""The settings' groups: --help's sections and a config file's tables read one table
(runconfig.settings's declaration), and a file's group tables mean what its flat keys do."""
from __future__ import annotations

import re

import pytest

from experiments.cli import main
from runconfig.load import config_values, group_of, load_config
from runconfig.settings import GROUPS, ConfigError, RunConfig


def _help_sections(capsys) -> dict[str, list[str]]:
    """--help's sections after `options:`, each title -> the flags it lists, in order."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    sections: dict[str, list[str]] = {}
    title = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            sections[title] = []
        elif title is not None:
            sections[title] += re.findall(r"^  (--[\w-]+)", line)
    return sections


def test_help_shows_the_common_settings_first_then_every_group(capsys):
    sections = _help_sections(capsys)
    titles = [t for t in sections if t not in ("positional arguments", "options")]
    assert titles == list(GROUPS.values())
    assert titles[0] == "common settings" and 10 <= len(sections["common settings"]) <= 20
    for name, title in GROUPS.items():
        shown = [flag[2:].replace("-", "_") for flag in sections[title]]
        assert shown == [k for k, g in group_of().items() if g == name and k != "inject_fault"], title


def test_every_group_is_declared_in_one_block_and_named_like_no_key():
    order = list(group_of().values())
    assert order == sorted(order, key=list(GROUPS).index)
    assert set(GROUPS) == set(order) and not set(GROUPS) & set(group_of())


@pytest.mark.parametrize("group, line", [
    ("common", "n_sync = 4"),
    ("schedule", "lr_warmup = 100"),
    ("server", "dc_lambda = 0.5"),
    ("stragglers", "step_sigma = 0.5"),
    ("simulator", "sim_latency = 1e-5"),
    ("performance", "threads = 1"),
    ("inputs", "model_args = { width = 8 }"),
])
def test_a_group_table_means_the_flat_key(tmp_path, group, line):
    flat, grouped = tmp_path / "flat.toml", tmp_path / "grouped.toml"
    flat.write_text(f"steps = 7\n{line}\n")
    grouped.write_text(f"steps = 7\n[{group}]\n{line}\n")
    assert config_values(str(grouped)) == config_values(str(flat))
    assert len(config_values(str(flat))) == 2


def test_a_file_of_several_group_tables_loads_as_its_flat_keys(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[common]\nclients = 3\nlr = 0.1\n[schedule]\nlr_schedule = \"cosine\"\nlr_floor = 0.1\n"
                    "[client]\nprecision = \"bf16\"\n")
    assert load_config(str(path)) == RunConfig(clients=3, lr=0.1, lr_schedule="cosine", lr_floor=0.1,
                                               precision="bf16")


@pytest.mark.parametrize("text, message", [
    ("[server]\nlr_warmup = 100\n", "lr_warmup belongs in [schedule] (or at top level), not in [server]"),
    ("lr_warmup = 100\n[schedule]\nlr_warmup = 200\n", "lr_warmup given twice, at top level and in [schedule]"),
    ("schedule.lr_warmup = 1\n[common]\nlr = 0.1\n", None),
    ("[schedule]\nbogus = 1\n", "unknown key 'bogus' in [schedule]"),
    ("[sched]\nlr_warmup = 1\n", "unknown section [sched]"),
    ("[schedule.lr_warmup]\nx = 1\n", "[schedule] lr_warmup: expected a value, got a table"),
])
def test_a_key_in_the_wrong_table_or_given_twice_is_refused_with_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "run.toml"
    path.write_text(text)
    if message is None:  # a dotted key is its table: read, not refused
        assert config_values(str(path)) == {"lr_warmup": 1, "lr": 0.1}
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_values(str(path))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("asgd: error: ") and message in err, err
