"""Each rank's device on its node (clients/devices.py), with the node's GPUs faked by
their count: the clients take them one each, the server only where server_device asks."""
from __future__ import annotations

import pytest

from clients.devices import node_devices, pick_device, visible_gpu

SERVER, CLIENT = False, True


def test_eight_clients_and_a_cpu_server_on_an_eight_gpu_node_take_one_gpu_each():
    # before: local rank mod 8, counting the server, put clients 0 and 7 both on cuda:0
    assert node_devices("auto", "cpu", [SERVER] + [CLIENT] * 8, gpus=8) == \
        ["cpu"] + [f"cuda:{g}" for g in range(8)]


def test_a_gpu_server_keeps_its_gpu_and_the_clients_take_the_others():
    assert node_devices("auto", "cuda:0", [SERVER] + [CLIENT] * 3, gpus=4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert node_devices("cuda", "cuda:2", [SERVER, CLIENT, CLIENT], gpus=4) == ["cuda:2", "cuda:0", "cuda:1"]
    assert node_devices("auto", "cuda", [SERVER, CLIENT], gpus=2) == ["cuda", "cuda:1"]  # "cuda": GPU 0


def test_clients_on_a_node_without_the_server_start_at_gpu_0_and_wrap_past_the_last():
    assert node_devices("auto", "cuda:0", [CLIENT] * 3, gpus=2) == ["cuda:0", "cuda:1", "cuda:0"]
    # one GPU, the server's: shared, as there is no other
    assert node_devices("auto", "cuda:0", [SERVER, CLIENT, CLIENT], gpus=1) == ["cuda:0"] * 3


def test_without_a_gpu_auto_is_the_cpu_and_given_devices_stay_as_given():
    assert node_devices("auto", "cpu", [SERVER, CLIENT, CLIENT], gpus=0) == ["cpu"] * 3
    assert node_devices("cpu", "cpu", [SERVER, CLIENT], gpus=8) == ["cpu", "cpu"]
    assert node_devices("cuda:3", "cpu", [SERVER, CLIENT, CLIENT], gpus=8) == ["cpu", "cuda:3", "cuda:3"]
    assert node_devices("cuda", "cpu", [CLIENT], gpus=0) == ["cuda"]  # refused later: no GPU
    assert node_devices("auto", "cpu", [CLIENT] * 4, gpus=0) == ["cpu"] * 4


def test_sync_mode_ranks_are_all_clients_one_gpu_each():
    assert node_devices("auto", "cpu", [CLIENT] * 4, gpus=4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


@pytest.mark.parametrize("visible, device, expected", [
    (None, "cuda:1", "1"),
    ("4,5,6", "cuda:1", "5"),  # Slurm bound this job to GPUs 4-6: cuda:1 is physical GPU 5
    ("GPU-1a2b, GPU-3c4d", "cuda:1", "GPU-3c4d"),
    ("7", "cuda:0", "7"),  # --gpus-per-task=1: each task sees its own GPU as cuda:0
    ("3", "cpu", None),
])
def test_the_physical_gpu_is_the_entry_of_cuda_visible_devices(visible, device, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert visible_gpu(device, environ) == expected


def test_the_simulator_alone_on_a_cpu_node():
    assert pick_device("auto") in ("cpu", "cuda:0")
    assert pick_device("cpu") == "cpu"
