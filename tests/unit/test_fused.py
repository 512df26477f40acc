"""The fused kernels' formulas (paramserver/compute/fused.py) against the torch rules, in numpy.

Each rule is written twice: on torch tensors (paramserver/rules/, the CPU server) and
as the statements a GPU server compiles into one cupy kernel. Here the statements run in
float32 numpy inside a real Store (through `Fused`, as on a GPU: double-buffered, the
flag rejecting NaN/Inf), push by push beside a Store running the torch rule, and after
each push the weights and the rule's state must agree to float32 precision; and each
kernel's operation must compile as host C++. This runs without a GPU; tests/sim/test_gpu.py runs the compiled kernels where CUDA and cupy are.
"""
from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest
import torch

from paramserver.compute import fused, hostkernel
from runconfig.settings import RunConfig
from paramserver.rules import RULES, FreshRule, Rule, Update, make_rule
from paramserver.rules.base import PushFacts
from paramserver.store import Store
from tests.conftest import assert_same_store

N = 50
SETTINGS = RunConfig(lr=0.05, server_lr=0.1, server_momentum=0.9, weight_decay=1e-3, dc_lambda=2.0)
PLAIN = RunConfig(lr=0.05, server_momentum=0.0, weight_decay=0.0, dc_lambda=0.0)  # sgd without a buffer, ...
# (client, pulls before pushing): client 0 always pulls (staleness 0 on its own, more
# after the others), 1 sometimes, 2 never (staleness grows; dcasgd holds no copy of it)
SCHEDULE = [(0, True), (1, True), (0, True), (2, False), (1, False), (0, True), (2, False), (1, True),
            (0, False), (2, False)]
# fresh taking stale pushes too (S = 2 minibatches, R = 2, linear lr) and nesterov every 2 pushes
GATHERING = RunConfig(lr=0.05, server_momentum=0.9, weight_decay=1e-3, fresh_batch=2, max_staleness=2,
                      lr_scaling="linear", nesterov_every=2)
# delayed Nesterov with an outer lr and its activation c > 0 (asynchronous DiLoCo's outer step)
DILOCO = RunConfig(rule="nesterov", nesterov_every=2, outer_lr=0.7, nesterov_momentum=0.9,
                   nesterov_activation=0.25)
CASES = [(rule, SETTINGS, 3) for rule in RULES] + [(rule, PLAIN, 3) for rule in ("sgd", "adagrad", "dcasgd", "fresh")] + [
    ("easgd", SETTINGS, 1), ("staleness", SETTINGS, 1), ("scaled", SETTINGS, 1), ("fresh", GATHERING, 3),
    ("nesterov", GATHERING, 3), ("nesterov", DILOCO, 3)]


HOST = pytest.param("host", marks=pytest.mark.skipif(not hostkernel.available(),
                                                    reason="needs g++ to compile the host kernels"))
PATHS = ["numpy", HOST]  # numpy: the formulas as a GPU server's double-buffered kernel runs them


def fused_store(start: np.ndarray, rule: str, settings: RunConfig, clients: int, path: str = "numpy") -> Store:
    """A CPU Store whose applies take a fused path: the formulas in numpy through `Fused`
    (double-buffered, as on a GPU), or compiled by g++ (`server_kernel` auto, in place)."""
    if path == "host":
        store = Store(start, make_rule(rule, settings, clients))
        assert isinstance(store.fused, hostkernel.InPlace)
        return store
    store = Store(start, make_rule(rule, settings, clients), kernel="torch")
    store.fused = fused.Fused(store.rule, fused.numpy_kernel)
    return store


def torch_store(start: np.ndarray, rule: str, settings: RunConfig, clients: int) -> Store:
    store = Store(start, make_rule(rule, settings, clients), kernel="torch")
    assert store.fused is None
    return store


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rule,settings,clients", CASES, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(CASES)])
def test_formula_equals_the_torch_rule_push_by_push(rule, settings, clients, path):
    rng = np.random.default_rng(7)
    start = rng.standard_normal(N).astype(np.float32)
    ours, reference = fused_store(start, rule, settings, clients, path), torch_store(start, rule, settings, clients)
    scale = 1.0 if rule == "easgd" else 0.1  # easgd pushes weights
    for step, (client, pulls) in enumerate(SCHEDULE):
        client %= clients
        if pulls:
            ours.pull(client)
            reference.pull(client)
        push = (rng.standard_normal(N) * scale).astype(np.float32)
        got, expected = ours.apply(client, push.copy()), reference.apply(client, push.copy())
        assert got == expected
        assert_same_store(ours, reference, f"push {step} (client {client}, staleness {expected.staleness})")
    assert ours.staleness == reference.staleness and ours.dropped == reference.dropped
    assert max(reference.staleness) >= 2 or sum(reference.dropped.values()) >= 2  # fresh at R = 0 drops them


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_push_changes_neither_weights_nor_state(rule, bad, path):
    """numpy's flag rejects it after the formula ran (the new values went to spare
    buffers); the host kernel's check before it writes anything."""
    rng = np.random.default_rng(8)
    start = rng.standard_normal(N).astype(np.float32)
    ours, reference = fused_store(start, rule, SETTINGS, 2, path), torch_store(start, rule, SETTINGS, 2)
    for push_bad_first in (True, False):  # before the state exists, and after
        for store in (ours, reference):
            store.pull(0)
        push = rng.standard_normal(N).astype(np.float32) * 0.1
        if not push_bad_first:
            assert ours.apply(0, push.copy()).accepted and reference.apply(0, push.copy()).accepted
        push[N // 2] = bad
        got = ours.apply(0, push.copy())
        assert got == reference.apply(0, push.copy()) and not got.accepted and got.reason == "contains NaN or Inf"
        assert_same_store(ours, reference, f"after a push with {bad}")
    assert ours.applied == reference.applied and ours.version == reference.version


def test_every_formula_is_statements_c_and_python_share():
    for code in fused.FORMULAS:
        targets = [target for target, _ in fused.statements(code)]
        assert targets[-1] == "w_out" and "**" not in code and "//" not in code
    with pytest.raises(ValueError, match="not `name = expression;` statements"):
        fused.statements("w_out = w + d")  # no semicolon: C would not compile it


def test_every_rule_has_a_formula():
    assert all(rule.fusable() and rule.FORMULAS for rule in RULES.values())


def test_a_cpu_server_takes_the_host_kernel_where_g_plus_plus_is_and_torch_when_asked():
    store = Store(np.zeros(4, np.float32), make_rule("sgd", SETTINGS))
    assert isinstance(store.fused, hostkernel.InPlace) == hostkernel.available()
    assert Store(np.zeros(4, np.float32), make_rule("sgd", SETTINGS), kernel="torch").fused is None


@pytest.mark.skipif(not hostkernel.available(), reason="needs g++ to compile the host kernels")
@pytest.mark.parametrize("size", [1, 255, 256, 257, 100_003])  # the squares' blocks of 256, and a tail
def test_the_host_kernel_sums_the_noise_scales_squares_and_checks_every_element(size):
    """|d|^2 in float64 to 1e-6 (its blocks in float32), and a NaN anywhere, even in the
    last block, rejects; huge finite values (their float32 squares overflow) pass, as the
    torch path's check lets them."""
    rng = np.random.default_rng(9)
    push = rng.standard_normal(size).astype(np.float32)
    store = Store(np.zeros(size, np.float32), make_rule("sgd", PLAIN))
    assert store.apply(0, push).accepted
    assert store.fused.d_squared == pytest.approx(float(np.dot(push.astype(np.float64), push)), rel=1e-6)
    huge = push * np.float32(1e20)
    assert store.apply(0, huge).accepted
    assert store.fused.d_squared == pytest.approx(float(np.dot(huge.astype(np.float64), huge)), rel=1e-12)
    before = store.weights.copy()
    push[-1] = np.nan
    assert not store.apply(0, push).accepted and np.array_equal(store.weights, before)


@pytest.mark.skipif(not hostkernel.available(), reason="needs g++ to compile the host kernels")
def test_the_host_kernels_squares_are_a_vectors_norm_or_inf():
    """What the noise scale takes its window's norm with, where the host kernel sums the window."""
    vector = np.random.default_rng(10).standard_normal(100_003).astype(np.float32)
    kernel = hostkernel.HostKernel()
    assert kernel.squares(torch.from_numpy(vector)) == pytest.approx(float(np.dot(vector.astype(np.float64), vector)),
                                                                      rel=1e-6)
    vector[7] = np.inf
    assert kernel.squares(torch.from_numpy(vector)) == math.inf
    store = Store(np.zeros(4, np.float32), make_rule("fresh", SETTINGS))
    assert store.fused.sums_noise and store.rule.noise.norm == store.fused.kernel.squares


def test_a_vector_the_update_leaves_as_it_was_is_not_written_back():
    """fresh's gathering push copies w through: in place, writing it back would only move it through memory."""
    code = hostkernel.source(Update(FreshRule.GATHER), ("w", "total"), ())
    assert "total_p[i] = total_out;" in code and "w_p[i] =" not in code
    assert "w_p[i] = w_out;" in hostkernel.source(Update(Rule.ADD), ("w",), ())


@pytest.mark.skipif(not hostkernel.available(), reason="needs g++ to compile the host kernels")
def test_a_kernel_is_compiled_once_into_the_cache_and_a_refused_formula_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("ASGD_KERNEL_CACHE", str(tmp_path))
    code = hostkernel.source(Update(Rule.ADD), ("w",), ())
    first = hostkernel.build(code)
    assert first.parent == tmp_path and hostkernel.build(code) == first and len(list(tmp_path.iterdir())) == 1
    with pytest.raises(hostkernel.KernelError, match="g\\+\\+ refused a fused update"):
        hostkernel.build(hostkernel.source(Update("w_out = w + undefined_name;"), ("w",), ()))


def every_update() -> list[tuple[str, Update, tuple[str, ...], tuple[str, ...]]]:
    """(rule, update, input names, output names) of every formula as a GPU server would
    compile it, each rule past its first and second push (its state made) and dcasgd's
    copy pulled."""
    found = []
    cases = [(rule, SETTINGS) for rule in RULES] + [("sgd", PLAIN), ("fresh", PLAIN), ("fresh", GATHERING),
                                                    ("nesterov", GATHERING), ("nesterov", DILOCO)]
    for rule, settings in cases:
        store = fused_store(np.zeros(4, np.float32), rule, settings, 2)
        store.pull(0)
        for _ in range(3):  # fresh and nesterov: a push gathered, then the one that steps, then (its
            # momentum made) one that reads it
            store.apply(0, np.ones(4, np.float32))
            update = store.rule.fused(PushFacts(torch.ones(4), 0, 1))
            found.append((rule, update, ("w", "d", *update.state, *update.reads), ("w", *update.state)))
    assert {u.code for _, u, _, _ in found} == set(fused.FORMULAS)  # every formula compiled
    return found


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the kernels' C++ on the host")
def test_every_kernel_compiles_as_cpp(tmp_path):
    """The operation cupy would hand NVRTC, in a host C++ function with the same
    parameters (cupy's: const inputs and scalars, float& outputs, a raw int array)."""
    units = ["#include <cmath>", "#define __device__", "using std::isfinite; using std::sqrt;", fused.CUDA_FMADD]
    for rule, update, inputs, outputs in every_update():
        in_params, out_params, body = fused.kernel_source(update, inputs, outputs)
        params = [p.replace("float32 ", "const float ") for p in in_params.split(", ")]
        params += [p.replace("float32 ", "float& ").replace("raw int32 ", "int* ") for p in out_params.split(", ")]
        units.append(f"void {rule}_{len(units)}({', '.join(params)}) {{\n{body}\n}}")
    (tmp_path / "kernels.cpp").write_text("\n".join(units))
    result = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", str(tmp_path / "kernels.cpp")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_kernel_that_fails_to_compile_or_launch_falls_back_to_torch_with_a_warning():
    """A GPU server whose cupy kernel cannot run (a driver or toolkit it cannot use) goes
    on with the rule's torch arithmetic: the same weights, a warning, and a NaN push
    still refused."""
    def broken(update, inputs, outputs):
        outputs["w"].fill_(7.0)  # what a half-run kernel may leave in a spare buffer
        raise fused.KernelFailed("the cupy kernel failed (CompileException: nvrtc: error)")

    start = np.arange(N, dtype=np.float32)
    store = Store(start, make_rule("sgd", SETTINGS, 2), kernel="torch")
    store.fused = fused.Fused(store.rule, broken)
    reference = torch_store(start, "sgd", SETTINGS, 2)
    push = np.linspace(-1, 1, N, dtype=np.float32)
    with pytest.warns(RuntimeWarning, match="server_kernel: the cupy kernel failed .*torch arithmetic"):
        assert store.apply(0, push).accepted
    assert store.fused is None
    reference.apply(0, push)
    assert_same_store(store, reference)
    assert not store.apply(1, np.full(N, np.nan, np.float32)).accepted
    reference.apply(1, np.full(N, np.nan, np.float32))
    assert_same_store(store, reference, "after a NaN push")
