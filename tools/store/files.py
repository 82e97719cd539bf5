"""Files that are complete or absent: atomic writes, a staging directory, JSON reading, hashing.

Also the two file names every model artifact directory holds (:data:`META_FILE`, :data:`WEIGHTS_FILE`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: An artifact's metadata, written last: the artifact is complete once it exists.
META_FILE = "artifact.json"
#: An artifact's weights (safetensors: nothing is unpickled on load).
WEIGHTS_FILE = "model.safetensors"


@functools.cache
def _umask() -> int:
    """The process umask, read once on first use: from ``/proc`` where Linux shows it, else set and set back."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write to a temporary file in the same folder, fsync, then rename: a file that exists is complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; outputs should read like any other file
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: Path) -> Any:
    """The JSON in ``path``; a ``ValueError`` naming the file when it is not valid JSON (OSError when unreadable)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path} is not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno}): the file is damaged or was "
            "edited by hand; fix or restore it"
        ) from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: the file is damaged; restore it") from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class StagingDir:
    """Write a directory under a temporary name and rename it into place when done (removed on error)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if self.target.exists():
            shutil.rmtree(self.target)
        os.replace(self.tmp, self.target)


#: Where Linux keeps an id that changes at every boot.
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot of the machine ("" where the system does not say: not Linux)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def left_by_an_earlier_boot(marker: Path) -> bool:
    """Whether ``marker`` (a file holding :func:`boot_id` while some work is under way) was left by a process the
    machine's restart killed, not by one that died on this boot. A marker without a boot id counts as this boot's."""
    written, now = marker.read_text().strip(), boot_id()
    return bool(written and now and written != now)
