"""One process per run directory: an exclusive OS file lock on ``RUN/.lock`` that dies with its process.

:func:`run_dir_lock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on the lock file and writes the holder's PID
into it; a second process gets :class:`RunDirBusy` (one line naming the holder's PID) at once. The kernel
drops the lock when the holder exits, however it exits (a SIGKILL included), so a stale file never blocks
anyone: the next process takes the lock and overwrites the PID. Readers (``status``) never wait for it:
:func:`is_locked` and :func:`lock_holder` say whether, and by whom, a run dir is held.

The lock is re-entrant within one process (``demo`` locks its dir, then starts the run inside it), and
the lock file is removed when the outermost holder lets go, so a run dir holds nothing but the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; runs are not protected from each other there
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: The lock file inside a run dir (hidden: it is no output of the run).
LOCK_FILE = ".lock"

_HELD: dict[Path, int] = {}  # run dir -> descriptor of its lock file, for the locks this process holds
_HELD_GUARD = threading.Lock()
_ATTEMPTS, _RETRY_S = 5, 0.02  # a held lock is reported after about 0.1 s


class RunDirLockError(ValueError):
    """The run dir's lock file cannot be created (an unwritable or missing directory)."""


class RunDirBusy(RunDirLockError):
    """Another live process holds the run dir."""

    def __init__(self, run_dir: Path, holder: dict[str, object], hint: str = "") -> None:
        pid = holder.get("pid")
        who = f"process {pid}" if pid else "another process"
        what = f" ({holder['command']})" if holder.get("command") else ""
        since = f" since {holder['started']}" if holder.get("started") else ""
        stop = f" (kill {pid})" if pid else ""
        super().__init__(
            f"run dir {run_dir} is in use by {who}{what}{since}: wait for it to finish or stop it{stop}"
            + (f"; {hint}" if hint else "")
        )
        self.pid = pid if isinstance(pid, int) else None


def lock_holder(run_dir: str | os.PathLike[str]) -> dict[str, object]:
    """What the lock file says about its holder (``pid``, ``command``, ``started``); {} when unknown.

    The file outlives a killed holder: only :func:`is_locked` says whether the holder is alive.
    """
    path = Path(run_dir) / LOCK_FILE
    for _ in range(20):  # the holder writes its PID just after taking the lock: wait a moment for it
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return {}
        if text.strip():
            try:
                data = json.loads(text)
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
        time.sleep(0.01)
    return {}


def is_locked(run_dir: str | os.PathLike[str]) -> bool:
    """Whether a live process (this one included) holds the run dir's lock; takes and drops it to find out."""
    root = Path(run_dir).resolve()
    if root in _HELD:
        return True
    if fcntl is None:
        return False
    try:
        fd = os.open(root / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no file locks on this file system
        return False
    finally:
        os.close(fd)
    return False


def status_hint(run_dir: str | os.PathLike[str]) -> str:
    """The end of a run's :class:`RunDirBusy` message: how to look at the run meanwhile."""
    return f"`profiling-agent status --run-dir {shlex.quote(str(run_dir))}` works meanwhile"


def refuse_if_held(run_dir: str | os.PathLike[str], hint: str = "") -> None:
    """:class:`RunDirBusy` at once when another live process holds ``run_dir``: a cheap check before slow
    imports and setup. It takes nothing: :func:`run_dir_lock` must still be taken before writing."""
    root = Path(run_dir).resolve()
    if root not in _HELD and is_locked(root):
        raise RunDirBusy(root, lock_holder(root), hint)


def _describe_self() -> str:
    """``profiling-agent run``: the program and its first word that is no option."""
    if not sys.argv or not sys.argv[0]:
        return ""
    words = [arg for arg in sys.argv[1:] if not arg.startswith("-")][:1]
    return " ".join([Path(sys.argv[0]).name, *words])


def _flock_exclusive(fd: int, path: Path) -> bool:
    """Take the exclusive lock on ``fd``; False while another process holds it (retried briefly: a ``status``
    takes a shared lock for a moment to see whether the dir is held)."""
    assert fcntl is not None
    for attempt in range(_ATTEMPTS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < _ATTEMPTS:
                time.sleep(_RETRY_S)
        except OSError as exc:  # ENOLCK, EOPNOTSUPP: a file system without locks (some network mounts)
            logger.warning("cannot lock %s (%s): nothing stops a second process from using this run dir", path, exc)
            return True
    return False


def _open_locked(path: Path, run_dir: Path, hint: str) -> int:
    """A descriptor of ``path`` holding its exclusive flock; :class:`RunDirBusy` when another process has it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirLockError(
                f"cannot write to run dir {run_dir}: {exc.strerror or exc}; choose a writable --run-dir"
            ) from exc
        if not _flock_exclusive(fd, path):
            os.close(fd)
            raise RunDirBusy(run_dir, lock_holder(run_dir), hint)
        # the previous holder may have removed the file between our open and our flock: lock the file that is there
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def run_dir_lock(run_dir: str | os.PathLike[str], *, create: bool = True, hint: str = "") -> Iterator[Path]:
    """Hold ``run_dir`` exclusively for the block (re-entrant in one process); yields the lock file's path.

    ``create`` makes the directory when it does not exist. Raises :class:`RunDirBusy` when another live
    process holds it (nothing in the dir is touched; ``hint`` ends its message), :class:`RunDirLockError`
    when the directory cannot be written.
    """
    root = Path(run_dir).resolve()
    path = root / LOCK_FILE
    if root in _HELD:  # this process holds it already (an outer block): nothing to take or release
        yield path
        return
    if fcntl is None:  # pragma: no cover
        logger.warning("no file locks on this platform: nothing stops two processes from sharing %s", root)
        yield path
        return
    if create:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirLockError(
                f"cannot write to run dir {root}: {exc.strerror or exc}; choose a writable --run-dir"
            ) from exc
    fd = _open_locked(path, root, hint)
    holder = {"pid": os.getpid(), "command": _describe_self(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(holder) + "\n").encode("utf-8"))
    with _HELD_GUARD:
        _HELD[root] = fd
    try:
        yield path
    finally:
        with _HELD_GUARD:
            _HELD.pop(root, None)
        with contextlib.suppress(OSError):
            path.unlink()  # while still locked: a process waiting on the old file retries on the new one
        os.close(fd)
