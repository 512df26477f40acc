"""Run an MPI job as a child and say afterwards what became of it.

`asgd train` typed without mpiexec lands here. The ranks name a dead peer themselves
(see paramserver/liveness.py); what is left for the supervisor: a run that lost clients
under `--on-client-failure continue` but completed is a success, whatever the
launcher's exit status (it reports the dead rank's signal); a job that ended before
its run directory could say so gets a failed summary; a resumable run says how.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from paramserver.rundir import RunDir

STDIO_FDS = "ASGD_STDIO_FDS"


def supervise(command: list[str], env: dict[str, str], out: str) -> int:
    """Run `command` (Ctrl-C reaches it too: same process group); the exit status the
    user should see."""
    sys.stdout.flush()
    # The ranks write straight to our stdout and stderr (a rank on this host inherits
    # them through the launcher): MPICH's launcher kills every rank that writes through
    # it after one rank died, which would end a run meant to go on without that rank.
    stdio = os.dup(1), os.dup(2)
    try:
        returncode = subprocess.call(command, env={**env, STDIO_FDS: f"{stdio[0]},{stdio[1]}"}, pass_fds=stdio)
    finally:
        for fd in stdio:
            os.close(fd)
    if returncode == 0:
        return 0
    status = _status(Path(out))
    if status == "complete":
        print(f"asgd: run {out} completed (the launcher's exit status {returncode} is from a lost client)",
              file=sys.stderr)
        return 0
    if status is None and (Path(out) / "config.json").exists():
        RunDir(out).write_summary({"status": f"failed: the MPI job ended with exit status {returncode}",
                                   "final_test_error": None})
    if RunDir(out).checkpoint_path.exists():
        print(f"asgd: resume with: asgd train --resume {out}", file=sys.stderr)
    return returncode


def _status(run: Path) -> str | None:
    return RunDir(run).status()


def direct_stdio() -> None:
    """In a rank the supervisor started: write to its stdout and stderr directly, where
    they were inherited (on another host they were not; output goes through the launcher)."""
    fds = os.environ.get(STDIO_FDS, "")
    try:
        out, err = (int(fd) for fd in fds.split(","))
        os.fstat(out), os.fstat(err)
    except (ValueError, OSError):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(err, 2)
