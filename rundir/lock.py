"""Who writes a run directory (or a sweep folder) now: an exclusive `flock` that names its holder.

The OS releases it when the holder dies, so a second writer is refused in one line,
and a crashed job never leaves a folder locked. The file exists while someone writes
the folder (a killed holder's stays, unlocked, and is taken over): a released lock
removes it.
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
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                refusal = self._refusal(fd)
                os.close(fd)
                raise LockHeld(refusal) from None
            if self._is_current(fd):
                break
            os.close(fd)  # its last holder removed the file between our open and our lock: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%F %T')}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        """Unlock, and remove the file once nobody holds it, so a folder nobody writes keeps
        no `lock`; a folder this lock made and nobody wrote into goes too (bad input found
        after the lock was taken leaves no run directory behind)."""
        if self.fd is None:
            return
        os.close(self.fd)
        self.fd = None
        self._remove_if_free()
        if self.created and not any(self.path.parent.iterdir()):
            self.path.parent.rmdir()

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise RunDirError(f"out: cannot create {self.path.parent} ({error.strerror})") from None

    def _remove_if_free(self) -> None:
        """Unlink the file while holding it afresh: a process that still holds our lock (a
        rank given the descriptor that outlives the job's end) keeps it, and the run
        protected; one that opened the file just before sees it gone (`_is_current`)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if self._is_current(fd):
                self.path.unlink()
        except BlockingIOError:
            pass  # held: by a process of this job still, or already by the next writer
        finally:
            os.close(fd)

    def _is_current(self, fd: int) -> bool:
        """`fd` is still the file at `path`, not one its last holder removed."""
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            return False
        there = os.fstat(fd)
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

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
