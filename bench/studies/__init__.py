"""Measurements behind one decision each (a reply policy, a transport, a GPU path), run by hand, not by `asgd bench`."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def mpiexec() -> str:
    """The launcher beside this interpreter (the venv's MPI)."""
    return str(Path(sys.executable).with_name("mpiexec"))


def start_server_job(me: list[str], ranks: int, port_file: str) -> subprocess.Popen:
    """The joining studies' server job (`me` with `--role server`), its own session so
    that a stuck job can be killed whole; returns once it has written its port."""
    server = subprocess.Popen([mpiexec(), "-n", str(ranks), *me, "--role", "server", "--port-file", port_file],
                              start_new_session=True)
    while not os.path.exists(port_file) and server.poll() is None:
        time.sleep(0.05)
    return server
