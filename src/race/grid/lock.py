"""Locks: one driver per study, one process per run directory.

Both are ``fcntl.flock`` locks, which the kernel drops when the holding process dies (even
by SIGKILL), so a crashed driver never leaves a study locked. The study lock file keeps
the holder's pid, host and start time for the refusal message.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCK_FILE = ".lock"


class StudyLockedError(RuntimeError):
    """Another driver is running this study."""


class StudyLock:
    """Exclusive lock on ``<study_dir>/.lock`` for a driver's lifetime."""

    def __init__(self, study_dir: str | Path):
        self.study_dir = Path(study_dir)
        self.path = self.study_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> "StudyLock":
        self.study_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise StudyLockedError(self._held_message()) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def _held_message(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        who = f"pid {info.get('pid', '?')} on host {info.get('host', '?')}"
        since = info.get("since")
        when = f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}" if since else ""
        return (f"study {self.study_dir} is already being run by another driver ({who}{when}); wait for it "
                "to finish, stop it, or use another --study-dir. `race grid status` works while it runs.")

    @staticmethod
    def holder(study_dir: str | Path) -> dict | None:
        """The live driver recorded in the lock file (pid, host, since), or None. Reads the
        file only (takes no lock); a driver on another host is reported as is."""
        path = Path(study_dir) / LOCK_FILE
        try:
            info = json.loads(path.read_text() or "null")
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or "pid" not in info:
            return None
        if info.get("host") == socket.gethostname():
            try:
                os.kill(int(info["pid"]), 0)
            except ProcessLookupError:
                return None  # killed without releasing: the kernel already dropped its lock
            except PermissionError:
                pass
        return info

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "StudyLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def run_dir_lock(run_dir: str | Path, timeout_s: float = 600.0) -> Iterator[None]:
    """Exclusive lock on a run directory, waited for: a worker orphaned by a killed driver
    may still be finishing the cell; the next attempt waits for it, then resumes."""
    path = Path(run_dir) / ".cell.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run directory {run_dir} stayed locked by another process for "
                                       f"{timeout_s:.0f} s; is an old worker still running this cell?") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)
