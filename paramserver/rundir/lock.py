"""Who writes a run directory (or a sweep folder) now: an exclusive `flock` that names its holder.

The OS releases it when the holder dies, so a second writer is refused in one line,
and a crashed job never leaves a folder locked.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

LOCK = "lock"


class RunDirError(ValueError):
    """The run directory cannot be used (one line, for the command line)."""


class LockHeld(RunDirError):
    """Another process writes the folder; the message names it."""


class FolderLock:
    """An exclusive `flock` on `folder/lock`, naming its holder in the file. Child processes
    given the descriptor (the MPI launcher, and through it the ranks on this host) hold
    it too, so it is free only once every process of the job is gone."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK
        self.fd: int | None = None

    def acquire(self) -> "FolderLock":
        self.created = not self.path.parent.exists()  # then a job that wrote nothing leaves nothing
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise RunDirError(f"out: cannot create {self.path.parent} ({error.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            refusal = self._refusal(fd)
            os.close(fd)
            raise LockHeld(refusal) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%F %T')}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        """Unlock; a folder this lock made and nobody wrote into goes again (bad input found
        after the lock was taken leaves no run directory behind)."""
        if self.fd is None:
            return
        if self.created and [p.name for p in self.path.parent.iterdir()] == [LOCK]:
            self.path.unlink()
            self.path.parent.rmdir()
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def holder(self) -> str | None:
        """Who holds the lock now (the refusal's line), without taking it or writing
        anything: None when it is free or was never taken."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # let go again by the close
            return None
        except BlockingIOError:
            return self._refusal(fd)
        finally:
            os.close(fd)

    def _refusal(self, fd: int) -> str:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        return f"{self.path.parent} is being written by {holder}; wait for that job to end, or stop it"
