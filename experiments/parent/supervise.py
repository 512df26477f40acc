"""Run an MPI job as a child and say afterwards what became of it.

`asgd train` typed without mpiexec lands here. The ranks name a dead peer themselves
(see paramserver/wire/liveness.py); what is left for the supervisor:
- the job's life is ours: the launcher runs in a session of its own (a terminal's
  Ctrl-C reaches us alone) under a `lifeline`, which ends it and every process below
  it should we die, even by SIGKILL; Ctrl-C or SIGTERM is passed on as one SIGTERM,
  which the launcher forwards to every rank, and a job still there after
  `STOP_GRACE_S` is killed;
- the run's lock is ours: we hold it until the job's last process on this host is
  gone. Its descriptor goes to the launcher; MPICH's hands it on to every rank, so each
  holds it; Open MPI's closes it (every inherited descriptor above 2) before it starts
  a rank, so there the ranks do not, and a rank that outlived its launcher (killed
  alone; measured: the ranks follow within seconds) is waited for and then killed
  (`_end_stragglers`) before we let the lock go;
- a run that lost clients under `--on-client-failure continue` but finished is a
  success, whatever the launcher's exit status (it reports the dead rank's signal); a
  job that ended before its run directory could say so gets a failed summary (naming
  the rank that failed first, when one said so); a resumable run says how;
- Open MPI's launcher now and then fails before any rank starts (PMIx's startup race:
  `LAUNCHER_RACE`, docs/reliability.md): nothing of ours ran, so the job is started
  again, up to `LAUNCH_TRIES` launches in all (CI saw the real race at the retry of a
  test's faked one: one retry was not enough).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from experiments.parent.lifeline import STOP_GRACE_S, lifeline
from experiments.parent.tree import descendants, kill_tree
from experiments.parent.mpiexec import launcher_rank
from experiments.run.resume import resume_hint
from rundir.layout import RunDir
from rundir.status import finished, word
from rundir.summary import mark_failed

STDIO_FDS = "ASGD_STDIO_FDS"
LOCKED_RUN = "ASGD_LOCKED_RUN"  # the run directory whose lock the job's supervisor holds
LAUNCHER_RACE = "PMIx server's listener thread failed to start"  # Open MPI's, before any rank
LAUNCH_TRIES = 3
RETRY_PAUSE_S = 1.0


def supervise(command: list[str], env: dict[str, str], out: str, lock_fd: int, forwarded: bool = False) -> int:
    """Run `command`; the exit status the user should see. `forwarded`: the launcher
    forwards its ranks' output itself (Open MPI's: its ranks cannot inherit ours)."""
    returncode, interrupted, tee = _launch(command, env, out, lock_fd, forwarded)
    for _ in range(LAUNCH_TRIES - 1):
        if returncode == 0 or interrupted or not tee.race or (Path(out) / "config.json").exists():
            break
        print("asgd: Open MPI's launcher failed before any rank started (PMIx's startup race); "
              "starting the job once more", file=sys.stderr, flush=True)
        time.sleep(RETRY_PAUSE_S)
        returncode, interrupted, tee = _launch(command, env, out, lock_fd, forwarded)
    return _outcome(RunDir(out), returncode, interrupted, tee.failure)


def _launch(command: list[str], env: dict[str, str], out: str, lock_fd: int,
            forwarded: bool) -> tuple[int, bool, "Tee"]:
    """One launch: the launcher's exit status, whether we were interrupted, and its Tee."""
    sys.stdout.flush()
    # The ranks write straight to our stdout and stderr (a rank on this host inherits
    # them through MPICH's launcher): MPICH's launcher kills every rank that writes through
    # it after one rank died, which would end a run meant to go on without that rank.
    # Their stderr passes through us (`Tee`), so the summary can name the rank that failed;
    # so does a forwarding launcher's (not hydra's, whose ranks write to us directly).
    tee = Tee()
    stdio = os.dup(1), tee.fd
    env = {**env, STDIO_FDS: ",".join(map(_identity, stdio)), LOCKED_RUN: str(Path(out).resolve())}
    interrupted = False
    try:
        job = subprocess.Popen(lifeline(command), env=env, stderr=tee.fd if forwarded else None,
                               pass_fds=(*stdio, lock_fd), start_new_session=True)
        for fd in stdio:
            os.close(fd)  # the job holds them now: the tee ends when the job's last process does
        try:
            returncode = _wait(job)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.Interrupted)
            interrupted = True
            returncode = stop(job)
    finally:
        _end_stragglers(env[LOCKED_RUN])
        tee.close()
    return returncode, interrupted, tee


def _wait(job: subprocess.Popen) -> int:
    """The launcher's exit status. A launcher that had ranks on this host and has had none
    for `STOP_GRACE_S` is killed: it has nothing left here to wait for (a job's rank 0,
    its server or recorder, runs on the launcher's host), and one that waits anyway
    would hold the run's lock forever (Open MPI under ULFM may, after a rank was killed)."""
    had_ranks, alone_since = False, None
    while True:
        try:
            return job.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if any(rank_of(pid) is not None for pid in descendants(job.pid)):
            had_ranks, alone_since = True, None
        elif had_ranks and alone_since is None:
            alone_since = time.monotonic()
        elif alone_since is not None and time.monotonic() - alone_since > STOP_GRACE_S:
            print(f"asgd: the launcher outlived every rank of its job by {STOP_GRACE_S:.0f} s; killed it",
                  file=sys.stderr, flush=True)
            kill_tree(job.pid)
            return job.wait()


def rank_of(pid: int) -> int | None:
    """The rank a launcher gave process `pid` (None: not a rank, or gone)."""
    try:
        entries = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    return launcher_rank(dict(entry.partition("=")[::2] for entry in entries))


def _end_stragglers(run: str) -> None:
    """Wait up to `STOP_GRACE_S` for the job's processes on this host that outlived the
    launcher (found by the `LOCKED_RUN` every one of them inherited), then kill them: a
    rank that does not hold the lock must not write after it is let go."""
    marker = f"{LOCKED_RUN}={run}\0".encode()
    deadline = time.monotonic() + STOP_GRACE_S
    while (left := _carrying(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _carrying(marker: bytes) -> list[int]:
    """Live processes whose environment holds `marker` (a zombie's reads empty)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


class Tee:
    """A pipe whose lines go on to our stderr; keeps the first line in which a rank says
    it failed (experiments/rank/entry.py's `_fail`), and whether the launcher lost
    PMIx's startup race (`race`)."""

    FAILED = re.compile(r"^asgd: (rank \d+ \(.*\) failed: .*)$")

    def __init__(self) -> None:
        read, self.fd = os.pipe()
        self.failure: str | None = None
        self.race = False
        self.thread = threading.Thread(target=self._pump, args=(read,), daemon=True)
        self.thread.start()

    def _pump(self, read: int) -> None:
        with open(read, "rb", buffering=0) as lines:
            for line in lines:
                os.write(2, line)
                text = line.decode(errors="replace").rstrip()
                self.race = self.race or LAUNCHER_RACE in text
                found = self.FAILED.match(text)
                if found and self.failure is None:
                    self.failure = found.group(1)

    def close(self) -> None:
        """Wait for the job's last words (a process that outlived the job keeps the pipe
        open: not for long)."""
        self.thread.join(timeout=5)


def stop(job: subprocess.Popen) -> int:
    """End a job: SIGTERM to its launcher, which forwards it to every rank; what is left
    after the grace time, or at a second Ctrl-C, is killed."""
    try:
        job.send_signal(signal.SIGTERM)
        return job.wait(timeout=STOP_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        kill_tree(job.pid)
        return job.wait()


def _outcome(run: RunDir, returncode: int, interrupted: bool, failure: str | None) -> int:
    status = run.status()
    if finished(status):
        if returncode != 0:
            print(f"asgd: run {run.path} ended {word(status)} (the launcher's exit status {returncode} "
                  "is from a lost client)", file=sys.stderr)
        return 0
    started = (run.path / "config.json").exists()
    if interrupted or returncode != 0 or started:
        # A started run that did not finish failed, whatever the launcher says: Open MPI
        # under ULFM has ended 0 after its clients aborted at a killed server (CI).
        if started:
            mark_failed(run, None if interrupted else
                        failure or f"the MPI job ended with exit status {returncode}, no rank said why")
        # the recorded reason again: the rank's own line may not have come through (hydra can
        # end the job before it forwards the failing rank's last output)
        what = "interrupted" if interrupted else run.status() or "failed"
        print(f"asgd: run {run.path} {what}{resume_hint(run.path)}", file=sys.stderr)
        return 130 if interrupted else returncode or 1
    return returncode


def direct_stdio() -> None:
    """In a rank the supervisor started: write to its stdout and stderr directly, where
    they were inherited. Each descriptor is taken only if it is still the very pipe or
    file the supervisor handed on: Open MPI's launcher closes every inherited descriptor
    above 2 and its runtime reuses the numbers for its own (and on another host nothing
    was inherited); there the output goes through the launcher."""
    try:
        out, err = (_inherited(spec) for spec in os.environ.get(STDIO_FDS, "").split(","))
    except ValueError:
        return
    if out is None or err is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(err, 2)


def _identity(fd: int) -> str:
    """`fd:device:inode`: what `_inherited` checks a descriptor against."""
    stat = os.fstat(fd)
    return f"{fd}:{stat.st_dev}:{stat.st_ino}"


def _inherited(spec: str) -> int | None:
    """The descriptor `spec` (from `_identity`) names, if it is still that pipe or file."""
    fd, device, inode = (int(part) for part in spec.split(":"))
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return fd if (stat.st_dev, stat.st_ino) == (device, inode) else None
