"""Bad input, generated: whatever a user hands `asgd`, it is accepted or refused in one line.

The hand-picked cases of tests/unit/test_cli.py, test_data.py, tests/sim/test_sweep.py and test_resume.py,
grown into properties (hypothesis): flags, config and sweep TOML, .npz datasets,
checkpoints and run directories. Every input either gets through validation or ends
with exit status 2 and exactly one line `asgd: error: ...` on stderr: never a
traceback, never a run directory left behind. Nothing here trains or starts MPI: the
`sandbox` stops `asgd train` the moment its checks pass (and `asgd sweep` before its
first point), so "launched" below means "validation let it through".
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import shutil
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import experiments.cli
import experiments.sweep.folder
from clients.data import load_dataset
from clients.models import build_model, flat_weights
from experiments.cli import main
from experiments.sweep.spec import OWN_KEYS
from runconfig.load import field_types
from runconfig.settings import RunConfig
from rundir.checkpoint import Checkpoint
from rundir.durable import CorruptFile, load_arrays, save_arrays
from rundir.layout import RunDir
from tests.conftest import BIN, run_command

FIELDS = [f.name for f in fields(RunConfig)]
FLAGS = ["--" + name.replace("_", "-") for name in FIELDS]
KINDS = field_types()
WORDS = ["", " ", "mpi", "sim", "async", "sync", "local-sgd", "add", "sgd", "cnn", "convnet", "auto", "cpu",
         "cuda", "cuda:0", "cuda:x", "abort", "continue", ".", "/", "1:2", "x:y", "fashion-mnist"]
ODD_NUMBERS = ["nan", "-nan", "inf", "-inf", "1e400", "-1", "0", "-0", "1_000", "0x10", "٣", "²", "1e-320",
               "9" * 30, "-" + "9" * 30, "true", "None"]
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------- harness
class Launched(Exception):
    """Raised where training would start: the input got through every check."""


@dataclass
class Sandbox:
    cwd: Path                        # the working directory: nothing may be written here
    files: Path                      # where the tests write the inputs they hand asgd
    accepted: RunConfig | None = None  # the config the latest `asgd train` validated


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """An empty working directory, and `asgd` stopped right after its checks, so an
    accepted input never trains, launches MPI or writes a run directory."""
    box = Sandbox(tmp_path_factory.mktemp("cwd"), tmp_path_factory.mktemp("inputs"))
    check = experiments.cli._check_inputs

    def check_then_stop(cfg: RunConfig, *args: Any) -> None:
        check(cfg, *args)
        box.accepted = cfg
        raise Launched

    def stop(*args: Any, **kwargs: Any) -> None:
        raise Launched

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(box.cwd)
        patch.setattr(experiments.cli, "_check_inputs", check_then_stop)
        patch.setattr(experiments.sweep.folder, "SweepRunner", stop)
        yield box


def asgd(box: Sandbox, *argv: str) -> tuple[int | str, str]:
    """`asgd ARGV` in this process: (exit status, or "launched"; what it wrote to stderr)."""
    box.accepted = None
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as exit_:
            status = exit_.code
        except Launched:
            status = "launched"
    return status, err.getvalue()


def assert_refused_in_one_line(status: int | str, err: str) -> None:
    assert status == 2, (status, err)
    assert err.startswith("asgd: error: ") and err.endswith("\n") and len(err.splitlines()) == 1, err


def assert_accepted_or_refused(box: Sandbox, status: int | str, err: str) -> None:
    """The property every input must have; and the working directory stays untouched."""
    event("accepted" if status == "launched" else "refused")  # pytest --hypothesis-show-statistics
    if status == "launched":
        assert err == "", err
    else:
        assert_refused_in_one_line(status, err)
    assert not any(box.cwd.iterdir()), sorted(box.cwd.iterdir())


def odd(draw) -> bool:
    """True one time in four, for a flaw: few flaws at a time get past the first checks,
    so the later checks meet their inputs too."""
    return draw(st.integers(0, 3)) == 0


@pytest.fixture(scope="module")
def model_size(tiny_npz) -> int:
    """Weights in the model `asgd train --data tiny.npz` builds."""
    data = load_dataset(str(tiny_npz))
    return flat_weights(build_model("cnn", data.shape, data.num_classes, 0)).size


# ---------------------------------------------------------------------------- 1. flags and config files
def not_help(token: str) -> bool:
    """-h, --he... print the usage and exit 0: not an input error."""
    return not token.startswith(("-h", "--h"))


VALUES = (st.sampled_from(ODD_NUMBERS + WORDS) | st.integers(-2**70, 2**70).map(str) | st.floats().map(repr)
          | TEXT).filter(not_help)
TOKENS = st.one_of(
    st.tuples(st.sampled_from(FLAGS), VALUES).map(list),                     # --flag value
    st.tuples(st.sampled_from(FLAGS), VALUES).map(lambda fv: ["=".join(fv)]),  # --flag=value
    st.sampled_from(FLAGS).map(lambda flag: [flag]),                         # a switch, or a missing value
    TEXT.map(lambda name: ["--" + name]).filter(lambda t: not_help(t[0])),   # unknown (or abbreviated) flags
    VALUES.map(lambda value: [value]),                                       # stray positionals: a config path
)
ARGVS = st.lists(TOKENS, max_size=6).map(lambda tokens: [t for token in tokens for t in token])


@FAST
@given(argv=ARGVS)
@example(argv=["\r"])  # was two lines: "config \r: cannot read"
def test_any_command_line_is_accepted_or_refused_in_one_line(sandbox, tiny_npz, argv):
    assert_accepted_or_refused(sandbox, *asgd(sandbox, "train", "--data", str(tiny_npz), *argv))


def typed_value(kind: type) -> st.SearchStrategy[str]:
    """Values argparse lets through for a field of this type, so RunConfig and the input
    checks see them: wide ints, every float (NaN, inf, subnormal), names and paths."""
    if kind is int:
        return st.integers(-2**70, 2**70).map(str) | st.sampled_from(["0", "1", "-1", str(2**63), str(2**64)])
    if kind is float:
        return st.floats().map(repr) | st.sampled_from(["1e400", "-1e400", "nan"])
    return st.sampled_from(WORDS) | TEXT


TYPED_FLAGS = st.lists(st.sampled_from([n for n in FIELDS if n not in ("data", "data_dir")]), max_size=4,
                       unique=True).flatmap(
    lambda names: st.tuples(*(st.just([f"--{n.replace('_', '-')}"]) if KINDS[n] is bool else
                              typed_value(KINDS[n]).map(lambda v, n=n: [f"--{n.replace('_', '-')}={v}"])
                              for n in names)))


def assert_runnable(cfg: RunConfig) -> None:
    """What validation lets through, torch and numpy can take: finite floats, ints that
    fit their 64 bits (torch.manual_seed) and a C int of threads (torch.set_num_threads)."""
    for name, kind in KINDS.items():
        value = getattr(cfg, name)
        if kind is float and value is not None:
            assert math.isfinite(value), f"{name} = {value}"
        if kind is int and value is not None:
            assert -2**63 <= value < 2**63, f"{name} = {value}"
    assert cfg.threads < 2**31


@FAST
@given(flags=TYPED_FLAGS)
@example(flags=(["--lr=inf"],))  # was accepted: trained to NaN, exit 0
@example(flags=([f"--seed={2**64}"],))  # was accepted: torch.manual_seed overflowed after launch
@pytest.mark.long
def test_typed_flag_values_are_refused_or_runnable(sandbox, tiny_npz, flags):
    status, err = asgd(sandbox, "train", "--data", str(tiny_npz), *(t for flag in flags for t in flag))
    assert_accepted_or_refused(sandbox, status, err)
    if status == "launched":
        assert_runnable(sandbox.accepted)


def toml_value(value: Any) -> str:
    """A generated value as TOML (the standard library reads TOML but does not write it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else {math.inf: "inf", -math.inf: "-inf"}.get(value, repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_table(table: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(key)} = {toml_value(value)}\n" for key, value in table.items())


SCALARS = (st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from([10**400, -10**400, 2**63, 2**64])
           | st.floats() | TEXT | st.sampled_from(WORDS))
TOML_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(TEXT, inner, max_size=2), max_leaves=4)
NATIVE = {int: st.integers(0, 64) | st.integers(-2**70, 2**70), str: st.sampled_from(WORDS) | TEXT,
          float: st.floats(0, 1, exclude_max=True) | st.floats(), bool: st.booleans()}


@st.composite
def config_tables(draw, keys: list[str] = FIELDS, size: int = 5) -> dict[str, Any]:
    """Config keys, mostly with a value of their own type (else any TOML value), now and
    then unknown keys."""
    names = draw(st.lists(st.sampled_from(keys), max_size=size, unique=True))
    table = {name: draw(TOML_VALUES if odd(draw) else NATIVE[KINDS[name]]) for name in names}
    return {**table, **(draw(st.dictionaries(TEXT, TOML_VALUES, max_size=2)) if odd(draw) else {})}


@FAST
@given(table=config_tables())
@example(table={"lr": 10**400})  # was OverflowError: int too large to convert to float
def test_any_config_file_is_accepted_or_refused_in_one_line(sandbox, tiny_npz, table):
    path = sandbox.files / "run.toml"
    path.write_text(toml_table({"data": str(tiny_npz), **table}))
    status, err = asgd(sandbox, "train", str(path))
    assert_accepted_or_refused(sandbox, status, err)
    if status == "launched":
        assert_runnable(sandbox.accepted)


RAW_TEXT = (st.binary(max_size=60) | st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass"))
            | st.sampled_from([b"n_sync = " + b"9" * 5000, b"[base]\nx = 1", b"a = [", b"\xff\xfe = 1"]))


@FAST
@given(raw=RAW_TEXT)
@example(raw=b"\x80")  # was UnicodeDecodeError
@example(raw=b"n_sync = " + b"9" * 5000)  # was ValueError: Exceeds the limit (4300 digits)
def test_malformed_config_files_are_refused_in_one_line(sandbox, tiny_npz, raw):
    path = sandbox.files / "raw.toml"
    path.write_bytes(raw)
    assert_accepted_or_refused(sandbox, *asgd(sandbox, "train", str(path), "--data", str(tiny_npz)))


SHELL_CASES = {
    "n_sync of zero": ["--n-sync", "0"],
    "infinite lr": ["--lr", "inf"],
    "seed past 64 bits": ["--backend", "sim", "--seed", str(2**64)],
    "batch bigger than a client's shard": ["--backend", "sim", "--batch-size", "400"],
    "a model name that is not UTF-8": ["--model", os.fsdecode(b"\xff")],
    "an unknown flag": ["--n-snyc", "4"],
    "a dataset without labels": ["--data", "{tmp}/no-y.npz"],
}


@pytest.mark.parametrize("args", SHELL_CASES.values(), ids=SHELL_CASES.keys())
def test_bad_values_from_the_shell(tmp_path, tiny_npz, args):
    out = tmp_path / "run"
    np.savez(tmp_path / "no-y.npz", x=np.zeros((10, 8, 8), np.uint8))
    result = run_command([str(BIN / "asgd"), "train", "--quiet", "--data", str(tiny_npz), "--out", str(out),
                          *(arg.format(tmp=tmp_path) for arg in args)], timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("asgd: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------- 2. sweep specs
SPEC_VALUES = {"name": TEXT, "scale": TEXT, "backend": st.sampled_from(["sim", "mpi", "gpu"]),
               "timeout": st.integers(1, 10**4) | st.floats(), "warm_start": st.integers(0, 20),
               "window": st.integers(-1, 500)}
GRID_VALUES = {"clients": st.integers(0, 3), "n_sync": st.integers(0, 3), "seed": st.integers(-1, 2),
               "start": st.sampled_from(["cold", "warm", "tepid"]),
               "mode": st.sampled_from(["async", "sync", "local-sgd", "x"])}


@st.composite
def sweep_specs(draw) -> str:
    """A spec's TOML: its own keys, [base] and [grid], mostly of the right kind, now and
    then of any kind, unknown, or set where the grid sets them."""
    top = {key: draw(TOML_VALUES if odd(draw) else values) for key, values in SPEC_VALUES.items()
           if draw(st.booleans())}
    top.update(draw(st.dictionaries(TEXT, TOML_VALUES, max_size=2)) if odd(draw) else {})
    base = draw(st.none() | TOML_VALUES | st.just({"clients": 2}) if odd(draw) else
                config_tables(sorted(set(FIELDS) - OWN_KEYS), size=3))
    grid = draw(st.none() | TOML_VALUES | st.just({"bogus": [1]})) if odd(draw) else \
        {key: draw(TOML_VALUES if odd(draw) else st.lists(values, min_size=1, max_size=3))
         for key, values in GRID_VALUES.items() if draw(st.booleans())}
    tables = {}
    for name, value in (("base", base), ("grid", grid)):
        if isinstance(value, dict):
            tables[name] = value
        elif value is not None:
            top[name] = value
    return toml_table(top) + "".join(f"[{name}]\n{toml_table(table)}" for name, table in tables.items())


def run_sweep_spec(box: Sandbox, raw: bytes) -> None:
    """`asgd sweep` on this spec: accepted (then its folder exists) or refused with nothing made."""
    spec, out = box.files / "spec.toml", box.files / "sweep"
    spec.write_bytes(raw)
    status, err = asgd(box, "sweep", str(spec), "--out", str(out), "--quiet")
    assert_accepted_or_refused(box, status, err)
    assert out.exists() == (status == "launched")
    shutil.rmtree(out, ignore_errors=True)


@FAST
@given(text=sweep_specs())
@example(text="base = false\n")  # was TypeError: 'bool' object is not iterable
@example(text='timeout = "x"\n')  # was ValueError: could not convert string to float
@example(text="timeout = 2592000\n")  # 30 days: was OverflowError in every point's wait
def test_any_sweep_spec_is_accepted_or_refused_in_one_line(sandbox, text):
    run_sweep_spec(sandbox, text.encode("utf-8", "surrogatepass"))


@FAST
@given(raw=RAW_TEXT)
@example(raw=b"\x80")  # was UnicodeDecodeError
def test_malformed_sweep_specs_are_refused_in_one_line(sandbox, raw):
    run_sweep_spec(sandbox, raw)


@pytest.mark.parametrize("flags", [["--jobs=-1"], ["--jobs=0x"], ["--out", "{file}"], ["--out", "{file}/sweep"]])
def test_bad_sweep_flags_are_refused_in_one_line(sandbox, tmp_path, flags):
    spec = tmp_path / "spec.toml"
    spec.write_text("[grid]\nclients = [1]\n")
    status, err = asgd(sandbox, "sweep", str(spec), "--out", str(tmp_path / "sweep"),
                       *(flag.format(file=spec) for flag in flags))
    assert_refused_in_one_line(status, err)
    assert not (tmp_path / "sweep").exists()


# ---------------------------------------------------------------------------- 3. .npz datasets
TRIPPED: list[str] = []


def _trip(where: str) -> None:
    """Runs only when a Tripwire is unpickled: loading user files must never do that."""
    TRIPPED.append(where)


class Tripwire:
    """Unpickled, it calls _trip: so TRIPPED says whether any loader unpickled a file."""

    def __init__(self, where: str):
        self.where = where

    def __reduce__(self):
        return _trip, (self.where,)


def write_npz(path: Path, arrays: dict[str, Any]) -> None:
    """np.savez without its keyword clashes ('file', 'allow_pickle'): any member name, pickles too."""
    with zipfile.ZipFile(path, "w") as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", "w") as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=True)


DTYPES = [np.uint8, np.int8, np.int16, np.int64, np.uint64, np.float16, np.float32, np.float64, np.bool_,
          np.complex64, np.dtype("U2"), np.dtype("S2"), np.dtype("M8[s]")]
LABEL_DTYPES = [np.int64, np.int8, np.uint8, np.uint64, np.float32, np.bool_]
ANY_ARRAYS = hnp.arrays(st.sampled_from(DTYPES), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
MEMBER_NAMES = st.sampled_from(["x", "y", "x_test", "y_test"]) | st.from_regex(r"[a-z_/]{1,6}", fullmatch=True)


@st.composite
def image_arrays(draw, n: int) -> np.ndarray:
    shape = draw(st.sampled_from([(4, 4), (3, 2, 2), (0, 4), (4,), (2, 1, 2, 2)])) if odd(draw) else (1, 4, 4)
    dtype = np.dtype(draw(st.sampled_from([np.uint8, np.float32, np.float64]) | st.sampled_from(DTYPES)))
    plain = st.floats(-10, 10, width=16) if dtype.kind == "f" else None  # any width holds these
    return draw(hnp.arrays(dtype, (n, *shape), elements=None if odd(draw) else plain))


@st.composite
def label_arrays(draw, n: int) -> np.ndarray:
    shape = draw(st.sampled_from([(max(0, n - 1),), (n + 1,), (n, 1)])) if odd(draw) else (n,)
    values = st.integers(0, 9) | st.sampled_from([-1, 2**63 - 1, 2**63, 2**64 - 1]) if odd(draw) else \
        st.integers(0, 9)
    dtype = np.dtype(draw(st.sampled_from([np.int64, np.uint64]) | st.sampled_from(LABEL_DTYPES)))
    if dtype.kind not in "iu":
        return draw(hnp.arrays(dtype, shape))
    limits = np.iinfo(dtype)
    return draw(hnp.arrays(dtype, shape, elements=values.filter(lambda v: limits.min <= v <= limits.max)))


@st.composite
def datasets(draw) -> dict[str, Any]:
    """Mostly dataset-shaped: images and labels of near-matching lengths and any values
    (NaN, huge floats, uint64 labels past int64, empty), an optional test split, stray
    members, and now and then a pickled object array."""
    n = draw(st.integers(0, 12))
    arrays = {"x": draw(image_arrays(n)), "y": draw(label_arrays(n))}
    if draw(st.booleans()):
        n_test = 0 if odd(draw) else draw(st.integers(1, 4))
        arrays.update(x_test=draw(image_arrays(n_test)), y_test=draw(label_arrays(n_test)))
    arrays.update(draw(st.dictionaries(MEMBER_NAMES, ANY_ARRAYS, max_size=2)) if odd(draw) else {})
    if draw(st.integers(0, 9)) == 0:
        arrays[draw(MEMBER_NAMES)] = np.array([Tripwire("npz")], dtype=object)
    return arrays


def assert_valid_dataset(path: Path) -> None:
    """What `asgd train --data` accepted is trainable: images finite, labels in range."""
    data = load_dataset(str(path))
    for split in (data.train, data.test):
        images, labels = split.batch(np.arange(len(split)))
        assert len(split) >= 1 and images.shape[1:] == data.shape and labels.dtype == torch.int64
        assert 0 <= int(labels.min()) and int(labels.max()) < data.num_classes, (labels, data.num_classes)
        assert bool(torch.isfinite(images).all())


def train_on(box: Sandbox, arrays_or_bytes: dict[str, Any] | bytes) -> None:
    path = box.files / "data.npz"
    if isinstance(arrays_or_bytes, bytes):
        path.write_bytes(arrays_or_bytes)
    else:
        write_npz(path, arrays_or_bytes)
    status, err = asgd(box, "train", "--data", str(path), "--clients", "1", "--batch-size", "1")
    assert_accepted_or_refused(box, status, err)
    if status == "launched":
        assert_valid_dataset(path)
    assert not TRIPPED


@FAST
@given(arrays=datasets())
@example(arrays={"x": np.zeros((12, 4, 4), np.uint8), "y": np.full(12, 2**63, np.uint64)})  # was label -2**63
@example(arrays={"x": np.full((12, 4, 4), 1e308), "y": np.zeros(12, np.int64)})  # was NaN images
@example(arrays={"x": np.zeros((12, 4, 4), np.float16), "y": np.zeros(12, np.int64)})  # was NaN images: 0 / 0
@pytest.mark.long
def test_any_npz_dataset_loads_valid_or_is_refused_in_one_line(sandbox, arrays):
    train_on(sandbox, arrays)


@FAST
@given(arrays=st.dictionaries(MEMBER_NAMES, ANY_ARRAYS, max_size=4))
def test_npz_of_random_members_loads_valid_or_is_refused_in_one_line(sandbox, arrays):
    train_on(sandbox, arrays)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def npz_bytes(arrays: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


GOOD_NPZ = npz_bytes({"x": np.arange(20 * 16, dtype=np.uint8).reshape(20, 4, 4), "y": np.arange(20) % 3})


@st.composite
def damaged(draw, good: bytes) -> bytes:
    """A good file cut short, with bytes overwritten, or a zip of members that are not .npy."""
    kind = draw(st.sampled_from(["cut", "flip", "members"]))
    if kind == "cut":
        return good[:draw(st.integers(0, len(good) - 1))]
    if kind == "flip":
        data = bytearray(good)
        for at, byte in draw(st.lists(st.tuples(st.integers(0, len(good) - 1), st.integers(0, 255)), min_size=1,
                                      max_size=4)):
            data[at] = byte
        return bytes(data)
    return zip_of(draw(st.dictionaries(st.sampled_from(["x", "y", "x.npy", "y.npy", "z"]), st.binary(max_size=40),
                                       min_size=1, max_size=3)))


def zip_of(members: dict[str, bytes]) -> bytes:
    """A zip archive of these members: what np.load takes for a .npz, whatever they hold."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


@FAST
@given(raw=damaged(GOOD_NPZ))
@example(raw=zip_of({"x": b"", "y.npy": b"hello"}))  # was AttributeError: 'bytes' object has no attribute 'dtype'
def test_damaged_npz_files_are_refused_in_one_line(sandbox, raw):
    train_on(sandbox, raw)


# ---------------------------------------------------------------------------- 4. checkpoints and run directories
def test_every_np_load_refuses_pickles(tmp_path, tiny_npz, monkeypatch):
    """Checkpoints, snapshots and datasets are all read with allow_pickle=False."""
    real, calls = np.load, []

    def spy(*args: Any, **kwargs: Any):
        calls.append(kwargs.get("allow_pickle"))
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "load", spy)
    run = RunDir(tmp_path / "run")
    run.create()
    Checkpoint(np.zeros(3, np.float32), 1, 0.0, (0, 0), (1, 1, 0), np.zeros(1), np.zeros(1)).save(run)
    run.save_snapshot(np.zeros(3, np.float32), version=1, time=0.0, minibatches=1)
    Checkpoint.load(run)
    load_arrays(run.snapshots()[0][1])
    load_dataset(str(tiny_npz))
    assert len(calls) >= 3 and all(allowed is False for allowed in calls), calls


def own_config(data: Path, run: Path) -> dict[str, Any]:
    """The config.json of a small simulated run on `data` into `run`."""
    return RunConfig(data=str(data), backend="sim", clients=1, steps=2, out=str(run)).to_dict()


def fake_run(root: Path, data: Path, weights: Any, config: Any = None, summary: Any = None) -> Path:
    """ROOT/run as a killed run leaves it, its checkpoint holding `weights`; config.json
    and summary.json as given (the run's own config by default, no summary)."""
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)
    (run / "checkpoint").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(own_config(data, run) if config is None else config))
    if summary is not None:
        (run / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    if isinstance(weights, np.ndarray) and weights.dtype != object:
        save_arrays(run / "checkpoint" / "latest.npz", {"weights": weights})
    else:
        write_npz(run / "checkpoint" / "latest.npz", {"weights": weights})
    return run


@pytest.mark.parametrize("where", ["x", "y", "init", "resume"])
def test_pickled_arrays_are_refused_without_unpickling(sandbox, tiny_npz, tmp_path, where):
    pickled = np.array([Tripwire(where)], dtype=object)
    if where == "resume":
        argv = ["--resume", str(fake_run(tmp_path, tiny_npz, pickled))]
    elif where == "init":
        write_npz(tmp_path / "init.npz", {"weights": pickled})
        argv = ["--init", str(tmp_path / "init.npz"), "--data", str(tiny_npz)]
    else:
        write_npz(tmp_path / "data.npz", {"x": np.zeros((4, 2, 2)), "y": np.zeros(4, int), where: pickled})
        argv = ["--data", str(tmp_path / "data.npz")]
    status, err = asgd(sandbox, "train", *argv)
    assert_refused_in_one_line(status, err)
    assert "allow_pickle" in err and not TRIPPED


NOT_CHECKPOINTS = {
    "a .npy array": lambda path: path.write_bytes(npy_bytes(np.zeros(3, np.float32))),
    "a pickle": lambda path: path.write_bytes(pickle.dumps(Tripwire("pickle"))),
    "text": lambda path: path.write_text("weights = [1, 2, 3]\n"),
    "empty": lambda path: path.write_bytes(b""),
    "no weights": lambda path: save_arrays(path, {"version": np.array(1)}),
    "a folder": lambda path: path.mkdir(),
    "missing": lambda path: None,
}


@pytest.mark.parametrize("write", NOT_CHECKPOINTS.values(), ids=NOT_CHECKPOINTS.keys())
def test_an_init_file_that_is_no_checkpoint_is_refused_in_one_line(sandbox, tiny_npz, tmp_path, write):
    path = tmp_path / "weights.npz"
    write(path)
    status, err = asgd(sandbox, "train", "--init", str(path), "--data", str(tiny_npz))
    assert_refused_in_one_line(status, err)
    assert f"init: cannot read weights from {path}" in err and not TRIPPED


WEIGHT_DTYPES = st.sampled_from([np.float32, np.float32, np.float64, np.float16, np.int32])


@st.composite
def start_weights(draw, size: int) -> np.ndarray:
    """The model's weights, or some of another model: other lengths, dtypes, a matrix of as many."""
    shape = draw(st.sampled_from([(size,), (size,), (1, size), (2, size // 2), (), (0,)])
                 | st.integers(1, 2 * size).map(lambda n: (n,)))
    return np.zeros(shape, draw(WEIGHT_DTYPES))


def assert_shapes_named(status: int | str, err: str, weights: np.ndarray, size: int, field: str) -> None:
    """Accepted exactly when the weights fit the model; else one line naming both shapes."""
    if weights.shape == (size,) and weights.dtype == np.float32:
        assert status == "launched", err
        return
    assert_refused_in_one_line(status, err)
    assert f"asgd: error: {field}:" in err and str(weights.shape) in err and f"({size},)" in err, err


@settings(max_examples=50, deadline=None)
@given(data=st.data())
@pytest.mark.long
def test_init_weights_of_another_model_are_refused_naming_both_shapes(sandbox, tiny_npz, model_size, data):
    weights = data.draw(start_weights(model_size))
    init = sandbox.files / "init.npz"
    save_arrays(init, {"weights": weights})
    status, err = asgd(sandbox, "train", "--init", str(init), "--data", str(tiny_npz))
    assert_shapes_named(status, err, weights, model_size, "init")


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_resume_from_another_models_checkpoint_is_refused_naming_both_shapes(sandbox, tiny_npz, model_size, data):
    weights = data.draw(start_weights(model_size))
    run = fake_run(sandbox.files, tiny_npz, weights)
    status, err = asgd(sandbox, "train", "--resume", str(run))
    assert_shapes_named(status, err, weights, model_size, "resume")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=5)
RECORDS = st.dictionaries(st.sampled_from(FIELDS + ["provenance", "num_params", "train_size", "resumed"]) | TEXT,
                          JSON, max_size=3)


@FAST
@given(changes=RECORDS | JSON, summary=st.none() | JSON | TEXT | st.fixed_dictionaries(
    {"status": st.sampled_from(["complete", "failed: x", None, 5])}), steps=st.none() | st.integers(-1, 4))
@example(changes=[], summary=None, steps=None)  # was AttributeError: 'list' object has no attribute 'items'
@example(changes={}, summary="", steps=None)  # was JSONDecodeError
@example(changes={"clients": []}, summary=None, steps=None)  # was TypeError: the joiners' check read it before the config
@pytest.mark.long
def test_resume_of_any_run_directory_is_accepted_or_refused_in_one_line(sandbox, tiny_npz, model_size, changes,
                                                                        summary, steps):
    """config.json and summary.json damaged or edited by hand, --steps given or not."""
    own = own_config(tiny_npz, sandbox.files / "run")
    config = {**own, **changes} if isinstance(changes, dict) else changes
    run = fake_run(sandbox.files, tiny_npz, np.zeros(model_size, np.float32), config, summary)
    flags = [] if steps is None else ["--steps", str(steps)]
    assert_accepted_or_refused(sandbox, *asgd(sandbox, "train", "--resume", str(run), *flags))


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory) -> bytes:
    """A checkpoint file as training writes it (with its checksum)."""
    path = tmp_path_factory.mktemp("checkpoint") / "latest.npz"
    save_arrays(path, {"weights": np.arange(8, dtype=np.float32), "version": np.array(3)})
    return path.read_bytes()


@FAST
@given(data=st.data())
def test_damaged_checkpoints_are_refused_as_corrupt(sandbox, good_checkpoint, data):
    path = sandbox.files / "damaged.npz"
    path.write_bytes(data.draw(damaged(good_checkpoint)))
    try:
        arrays = load_arrays(path)
    except CorruptFile as error:
        assert len(str(error).splitlines()) == 1 and str(path) in str(error)
    else:  # damage the checksum cannot see (zip metadata), or a file of other members without one
        assert all(isinstance(value, np.ndarray) for value in arrays.values())
        if "weights" in arrays:
            np.testing.assert_array_equal(arrays["weights"], np.arange(8, dtype=np.float32))
