"""A run's modes, as its config, config.json and a sweep's index name them, in one place.

Here, in the lowest layer, so every package that compares modes (the config's checks,
the server's schedule, the launch, the simulator, and the plots, which read config.json
and import nothing above rundir) names them by one enum rather than by their words.
"""
from enum import Enum


class Mode(str, Enum):
    """A run's `mode`. A str, so a config file, config.json and the flag read and write
    the words themselves, and a config's plain string compares equal to its member (and
    hashes alike: a dict keyed by members answers to the words)."""

    ASYNC = "async"          # a parameter server and asynchronous clients
    SYNC = "sync"            # the gradients averaged every step (allreduce)
    LOCAL_SGD = "local-sgd"  # the weights averaged every n_sync steps (an outer step: synchronous DiLoCo)

    def __str__(self) -> str:
        return self.value
