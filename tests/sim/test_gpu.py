"""The GPU paths: the server's weights on a GPU, pinned staging on clients, CUDA-aware MPI.

What runs without a GPU runs everywhere: the CPU store's shared memory, the
server_device config key, the CUDA-aware MPI check. The rest needs CUDA and skips
without it, and the fused server kernels (paramserver/compute/fused.py) need cupy as well
(bench/gpu_check.sh runs this file on a GPU machine).
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from clients.client import Client, Replica
from clients.data import load_dataset
from clients.models import build_model
from clients.sampling import ShardSampler
from experiments.cli import main
from experiments.run.provenance import provenance
from paramserver.compute import gpu
from paramserver.compute.arrays import ServerArrays
from runconfig.settings import ConfigError, RunConfig
from paramserver.compute.gpu import cuda_aware_mpi
from paramserver.rules import RULES, make_rule
from paramserver.store import Store
from rundir.durable import load_arrays, save_arrays
from tests.conftest import assert_same_store

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cupy_imports() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


needs_cupy = pytest.mark.skipif(not (torch.cuda.is_available() and cupy_imports()),
                                reason="needs a CUDA device and cupy (the fused server kernels)")
SETTINGS = RunConfig(lr=0.1, server_lr=0.1, server_momentum=0.9)


def pinned(array: np.ndarray) -> bool:
    return torch.from_numpy(array).is_pinned()


@needs_cuda
@pytest.mark.parametrize("rule", RULES)
def test_cuda_store_equals_cpu_store(tmp_path, rule):
    """The same pulls and pushes on a GPU server and a CPU one (the rules' one torch code);
    then a checkpoint of the GPU one goes on in a CPU one (so the rule's state crosses too)."""
    rng = np.random.default_rng(3)
    start = rng.standard_normal(1000).astype(np.float32)
    pushes = [rng.standard_normal(1000).astype(np.float32) * 0.01 for _ in range(7)]
    host = Store(start, make_rule(rule, SETTINGS, 2))
    on_device = Store(start, make_rule(rule, SETTINGS, 2), backend=ServerArrays("cuda"))
    for i, push in enumerate(pushes[:6]):
        host.pull(i % 2)
        on_device.pull(i % 2)
        assert host.apply(i % 2, push.copy()).accepted and on_device.apply(i % 2, push.copy()).accepted
    weights = on_device.weights
    assert isinstance(weights, np.ndarray) and weights.dtype == np.float32
    np.testing.assert_allclose(weights, host.weights, atol=1e-5, rtol=0)
    save_arrays(tmp_path / "ck.npz", on_device.state())
    resumed = Store(np.zeros(1000, np.float32), make_rule(rule, SETTINGS, 2))
    resumed.load_state(load_arrays(tmp_path / "ck.npz"))
    resumed.apply(0, pushes[6].copy())
    host.apply(0, pushes[6].copy())
    np.testing.assert_allclose(resumed.weights, host.weights, atol=1e-5, rtol=0)


@needs_cupy
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("settings", [SETTINGS, RunConfig(lr=0.1, server_momentum=0.0, weight_decay=0.0)])
def test_fused_kernel_equals_the_torch_rule_on_the_gpu(rule, settings):
    """Each rule's one cupy kernel against its torch kernels, both on the GPU, push by
    push (pulls, staleness, state carried); a NaN and an Inf push are rejected by the
    kernel's flag and leave the weights and the rule's state as they were."""
    rng = np.random.default_rng(5)
    start = rng.standard_normal(100_003).astype(np.float32)  # not a multiple of a block
    fused_store = Store(start, make_rule(rule, settings, 3), backend=ServerArrays("cuda"))
    torch_store = Store(start, make_rule(rule, settings, 3), backend=ServerArrays("cuda"))
    assert fused_store.fused is not None
    torch_store.fused = None
    for i, client in enumerate([0, 1, 0, 2, 1, 0, 2, 0, 1, 0]):
        if client != 2:  # client 2 never pulls: its staleness grows, dcasgd has no copy for it
            fused_store.pull(client)
            torch_store.pull(client)
        push = (rng.standard_normal(start.size) * (1.0 if rule == "easgd" else 0.1)).astype(np.float32)
        if i in (3, 6):
            push[i * 1000] = np.nan if i == 3 else -np.inf
        got, expected = fused_store.apply(client, push.copy()), torch_store.apply(client, push.copy())
        assert got == expected and got.accepted == (i not in (3, 6))
        assert_same_store(fused_store, torch_store, f"push {i}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_store_rejects_a_bad_push_before_it_reaches_the_weights(device):
    store = Store(np.arange(4, dtype=np.float32), make_rule("add", RunConfig()), backend=ServerArrays(device))
    assert not store.apply(0, np.array([1, np.nan, 1, 1], np.float32)).accepted
    np.testing.assert_array_equal(store.weights, np.arange(4))


def test_cpu_server_shares_its_weights_with_the_wire():
    store = Store(np.arange(4, dtype=np.float32), make_rule("add", RunConfig()))
    assert np.shares_memory(store.weights, store.array.numpy())  # no copy on the CPU path
    push = np.ones(4, np.float32)
    store.apply(0, push)
    np.testing.assert_array_equal(store.weights, np.arange(4) + 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_cuda_server_without_cuda_says_so():
    with pytest.raises(ValueError, match="server_device: cuda:0, but torch finds no CUDA device"):
        ServerArrays("cuda:0")


@pytest.mark.parametrize("value", ["cpu", "cuda", "cuda:1"])
def test_server_device_accepts_cpu_and_cuda(value):
    assert RunConfig(server_device=value).server_device == value


@pytest.mark.parametrize("value", ["gpu", "auto", "cuda:", "cuda:x", "CUDA", "cuda:0 "])
def test_server_device_rejects_anything_else(value):
    with pytest.raises(ConfigError, match="^server_device: expected cpu or cuda"):
        RunConfig(server_device=value)


def test_server_device_needs_a_server():
    with pytest.raises(ConfigError, match="^server_device: needs --mode async"):
        RunConfig(mode="sync", server_device="cuda")


def test_cuda_aware_mpi_is_unknown_without_mpi(monkeypatch):
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert cuda_aware_mpi() is None


def test_cuda_aware_mpi_answers_once_mpi_runs(monkeypatch):
    from mpi4py import MPI  # starts MPI in this process, as the server module does

    assert MPI.Is_initialized()
    answer = cuda_aware_mpi()
    assert answer is None or isinstance(answer, bool)
    if "pypi.org/p/mpich" in MPI.Get_library_version():
        assert answer is False  # the wheel is built without CUDA
    monkeypatch.setattr(gpu, "_loaded_mpi_libraries", lambda: ["/nonexistent/libmpi.so"])
    assert cuda_aware_mpi() is None  # a library we cannot ask


def test_provenance_records_cuda_aware_mpi():
    record = provenance("test", [{"rank": 0, "host": "here"}])
    assert record["cuda_aware_mpi"] in (None, True, False) and json.dumps(record)


@needs_cuda
def test_cuda_client_stages_through_pinned_buffers(tiny_npz):
    dataset = load_dataset(str(tiny_npz))
    replica = Replica(build_model("cnn", dataset.shape, dataset.num_classes, 0), lr=0.05, momentum=0.9,
                      weight_decay=5e-4, device="cuda")
    client = Client(replica, dataset.train, ShardSampler(np.arange(len(dataset.train)), 32, 0, 0))
    client.incoming[:] = client.base  # as the driver takes the server's weights
    client.sync(client.incoming)
    client.step()
    push = client.take_push()
    assert pinned(push) and pinned(client.base) and pinned(client.incoming)
    np.testing.assert_array_equal(client.base, client.weights.cpu().numpy())
    store = Store(client.base, make_rule("add", RunConfig()), backend=ServerArrays("cuda"))
    assert pinned(store.weights)


@needs_cuda
@pytest.mark.parametrize("rule,momentum", [("add", 0.0), ("sgd", 0.9)])
def test_one_client_on_gpus_equals_cpu(tmp_path, tiny_npz, monkeypatch, rule, momentum):
    """A 1-client run (the simulator: the MPI run's Client, Store and handler) with the
    client and the server on the GPU ends where the CPU run ends."""
    # TF32 convolutions would differ from the CPU in the third decimal
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)

    def run(device: str) -> np.ndarray:
        out = tmp_path / device
        assert main(["train", "--backend", "sim", "--clients", "1", "--steps", "10", "--data", str(tiny_npz),
                     "--batch-size", "32", "--lr", "0.05", "--rule", rule, "--server-momentum", str(momentum),
                     "--sim-step-time", "0.01", "--sim-apply-time", "0.001", "--eval-samples", "50", "--quiet",
                     "--device", device, "--server-device", device, "--out", str(out)]) == 0
        return load_arrays(out / "checkpoint" / "latest.npz")["weights"]

    np.testing.assert_allclose(run("cuda"), run("cpu"), atol=1e-5, rtol=0)
