"""The simulator's costs: what a minibatch, a push at the server and a transfer take on
the virtual clock (`SimTiming`), from the run's `sim_*` keys, a profile, a real MPI run's
measured server time (`sim_calibrate`), or measured here on this host once. Apart from
the event loop (experiments/sim/simulator.py) because they are decided once, before it runs,
and a sweep measures them once for all its points (experiments/sweep/run.py).
"""
from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from clients.client import Client, Replica, StepResult
from clients.data import Dataset
from clients.devices import pick_device, threads_kept
from clients.sampling import ShardSampler
from experiments.run.assemble import build, server_optimizer_factory
from experiments.run.sizing import servers_for
from runconfig.settings import ConfigError, RunConfig
from paramserver.handler import handle
from paramserver.state import ServerState, StateSettings
from paramserver.recorder import Recorder
from paramserver.rules import rule_class
from paramserver.compute.quantkernel import make_codec
from paramserver.wire.protocol import Message, Push, Tag
from rundir.layout import RunDir
from rundir.lock import RunDirError


@dataclass(frozen=True)
class SimTiming:
    """Virtual costs. `push_bytes`: what a push or a pull of float32 weights carries (None:
    the model's own bytes); a compressed payload carries its share of that (its bytes
    over the `size` float32 of the model's). `servers`: the sharded servers the simulated
    one stands for, each sending its slice of a reply."""

    step_time: float
    apply_time: float       # a server's time for a push (of its slice): checks, apply, logs
    bandwidth: float
    latency: float
    push_bytes: float | None = None
    servers: int = 1
    size: int = 0

    def wire_bytes(self, payload: np.ndarray | None) -> float:
        return 0.0 if payload is None else self.carried(payload.nbytes)

    def carried(self, nbytes: int) -> float:
        """What a payload of `nbytes` carries on the simulated wire."""
        return nbytes if self.push_bytes is None else self.push_bytes * nbytes / (4 * self.size)

    def served(self, payload: np.ndarray | None) -> float:
        """What a reply occupies the server for: its slice's transfer (every server
        sends its own at once)."""
        return self.latency + self.wire_bytes(payload) / self.servers / self.bandwidth


# The costs a profile gives the sim_* keys left at 0 (None: measured on this host).
# paper: Paine et al. trained Krizhevsky's cuda-convnet ImageNet network (60 M weights:
# 240 MB as float32 on the wire each way) on 2013 GPUs. Krizhevsky et al. (2012) report
# 90 epochs in 5-6 days on two GTX 580s, 0.56 s a 128-image minibatch for the pair, so
# about 1.1 s on one GPU (10.6 days for about 90 epochs: the paper's single-GPU time).
# The network: 10 Gb/s Ethernet (1.25 GB/s), 50 us a message. The server: 0.1 s a push,
# about three passes over 240 MB at the 7 GB/s of a 2013 Xeon's memory.
PROFILES: dict[str, SimTiming] = {
    "measured": SimTiming(step_time=None, apply_time=None, bandwidth=1.1e10, latency=2e-6),
    "paper": SimTiming(step_time=1.1, apply_time=0.1, bandwidth=1.25e9, latency=5e-5, push_bytes=240e6),
}


STEP_REPEATS = 9    # minibatches timed for the simulator's step time
STEP_SPREAD = 2.0   # slowest over fastest above this: the host was busy while it measured


def sim_timing(cfg: RunConfig, replica: Replica, dataset: Dataset, size: int, clients: int) -> SimTiming:
    """The configured costs, else the profile's; a step or push time neither gives is
    measured here, once. With several servers a push is one server's slice: measured on
    it, or the profile's share (its time is passes over memory, so it goes with bytes)."""
    profile = PROFILES[cfg.sim_profile]
    step = cfg.sim_step_time or profile.step_time or _measure_step(replica, dataset, cfg.batch_size)
    apply = (cfg.sim_apply_time or (cfg.sim_calibrate and calibrated_push(cfg.sim_calibrate))
             or (profile.apply_time and profile.apply_time / cfg.servers)
             or measure_push(cfg, -(-size // cfg.servers), clients))
    return SimTiming(step, apply, cfg.sim_bandwidth or profile.bandwidth, cfg.sim_latency or profile.latency,
                     cfg.sim_push_bytes or profile.push_bytes, cfg.servers, size)


def sized(cfg: RunConfig, replica: Replica, dataset: Dataset, size: int, clients: int) -> tuple[RunConfig, SimTiming]:
    """The run's config and costs, with `servers = auto` the count experiments/run/sizing.py
    picks from one server's costs: a push's apply (a slice's costing 1/S of it: passes
    over memory, as the paper profile's), its reply's send, and each server's link, which
    carries its slice of every push in and every reply out, each in the bytes its codec
    puts on the wire (`compress`, `compress_pulls`). Where it picks several, the
    config records a slice's apply as `sim_apply_time` (a given count reads it so): a
    resume, which keeps the recorded count, or a re-run of config.json charges the same."""
    if cfg.servers != "auto":
        return cfg, sim_timing(cfg, replica, dataset, size, clients)
    one = sim_timing(replace(cfg, servers=1), replica, dataset, size, clients)
    # what a push and a reply carry, as their codecs put them on the wire (int8 a quarter of float32's)
    push, reply = (one.carried(codec.wire_size(size) * np.dtype(codec.wire_dtype).itemsize)
                   for codec in (make_codec(cfg.compress), make_codec(cfg.compress if cfg.compress_pulls else "none")))

    def push_s(servers: int) -> float:
        own = one.apply_time / servers + one.latency + reply / servers / one.bandwidth
        link = max(push, reply) / servers / cfg.sim_server_bandwidth if cfg.sim_server_bandwidth else 0.0
        return max(own, link)
    servers = servers_for(clients, cfg.push_every * one.step_time, push_s, rule_class(cfg.rule).gathers)
    slice_s = one.apply_time / servers
    picked = replace(cfg, servers=servers, **({"sim_apply_time": slice_s} if servers > 1 else {}))
    return picked, replace(one, apply_time=slice_s, servers=servers)


def calibrated_push(run: str) -> float:
    """The server's seconds a push beside the wire's, as a real MPI run's server measured
    them inside its job (summary.json's `server_push_us`: every phase but `receive`,
    which the simulated push's transfer stands for), so simulated clients queue where
    that run's did: on the host, model and rule of that run."""
    try:
        cost = RunDir(run).summary().get("server_push_us") or {}
        seconds = (float(cost["total"]) - float(cost["receive"])) / 1e6
    except (RunDirError, KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"sim_calibrate: {run} holds no server time a push (summary.json's server_push_us, "
                          f"which an MPI run of the async mode writes): {type(error).__name__}: {error}") from None
    if not seconds > 0:
        raise ConfigError(f"sim_calibrate: {run}'s server_push_us gives {seconds} s a push; need a positive time")
    return seconds


def measure_timing(cfg: RunConfig, threads: int) -> tuple[float, float]:
    """(step time, push time) of this config's model and data with `threads` torch threads
    (the count the process had after it)."""
    with threads_kept():
        torch.set_num_threads(threads)
        parts = build(cfg, pick_device(cfg.device), 1, [0])
        client = parts.local[0]
        step = _measure_step(client.replica, parts.dataset, cfg.batch_size)
    return step, measure_push(cfg, client.size, cfg.clients or 1)


def _measure_step(replica: Replica, dataset: Dataset, batch_size: int) -> float:
    """Median of real minibatches on a scratch client (its own vectors and data order),
    with the torch threads the run will use; a spread that says the host was busy
    (slowest over fastest above STEP_SPREAD) is reported, since every virtual second of
    the run inherits it."""
    scratch = Client(replica, dataset.train, ShardSampler(np.arange(len(dataset.train)), batch_size, 0, 0))
    times = []
    for _ in range(2 + STEP_REPEATS):
        start = time.perf_counter()
        scratch.step()
        times.append(time.perf_counter() - start)
    times = times[2:]  # the first steps warm up allocators
    median = float(np.median(times))
    if max(times) > STEP_SPREAD * min(times):
        print(f"asgd: warning: a minibatch took {1e3 * min(times):.1f} to {1e3 * max(times):.1f} ms over "
              f"{STEP_REPEATS} tries (a busy host?); the simulator takes the median, {1e3 * median:.1f} ms "
              "(--sim-step-time sets it)", file=sys.stderr)
    return median


def measure_push(cfg: RunConfig, size: int, clients: int) -> float:
    """The real server's own time for one push beside the wire's: the handler with its
    checks, the decoding of a compressed push, the rule's apply, the client's n_push log
    rows and the reply's encoding (median of 15 after 3), in a scratch run directory, the
    push already landed where the transport lands it.
    Calibrates the simulated server, which adds the wire's part (the reply's transfer
    occupies it, as taking the push off the wire occupies the real one: about the same
    bytes at the same rate), so simulated clients queue at it when real ones would."""
    with tempfile.TemporaryDirectory() as scratch:
        run = RunDir(scratch)
        run.create()
        store = StateSettings.from_config(cfg, clients).store(np.zeros(size, np.float32), clients,
                                                              server_optimizer_factory(cfg))
        state = ServerState(store, [1],
                            codec=make_codec(cfg.compress),
                            pull_codec=make_codec(cfg.compress if cfg.compress_pulls else "none"))
        recorder = Recorder(run, state, time.perf_counter)
        row = StepResult(2.3, 0.9, cfg.batch_size, cfg.lr).row(0, 1, 0.0)
        state.landing[:] = state.codec.encode(np.zeros(size, np.float32))
        times = []
        for step in range(1, 19):
            header = Push(cfg.push_every * step, state.landing.size, True, state.codec.dtype,
                          rows=(row,) * cfg.push_every)
            start = time.perf_counter()
            recorder.record(handle(state, Message(1, Tag.PUSH, header, state.landing))[1])
            times.append(time.perf_counter() - start)
        recorder.close()
    return float(np.median(times[3:]))
