"""The dataset rows each role of a run read (fit, choose, confirm), recorded by every consumer as it reads them:
what a report's disjointness is computed from, not the plan of the split (``tools.stages.run_data``)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

__all__ = ["DataReads", "read_log", "record_rows"]


class DataReads(BaseModel):
    """The dataset rows each role read (fit, choose, confirm), as recorded by every consumer: what the report's
    disjointness is computed from."""

    rows: dict[str, list[int]] = Field(default_factory=dict)
    extra: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Rows of the user's extra unlabelled images (``--extra-images``, a folder of its own: its rows "
        "never meet the dataset's) each role read: only fit may.",
    )

    def overlaps(self) -> dict[str, int]:
        """Rows read under two roles, by ``"a&b"`` (empty when the roles kept to their own rows)."""
        roles = sorted(self.rows)
        shared = {
            f"{a}&{b}": len(set(self.rows[a]) & set(self.rows[b])) for i, a in enumerate(roles) for b in roles[i + 1 :]
        }
        return {pair: count for pair, count in shared.items() if count}

    def disjoint(self, *roles: str) -> bool:
        """Whether no row was read under two of ``roles`` (all roles when none are named)."""
        names = set(roles) or set(self.rows)
        return not any(set(pair.split("&")) <= names for pair in self.overlaps())


_RECORDED: dict[tuple[str, str, str], set[int]] = {}


def read_log(path: str | Path | None) -> DataReads:
    """The reads recorded at ``path`` (none when absent)."""
    if path is None or not Path(path).is_file():
        return DataReads()
    return DataReads.model_validate_json(Path(path).read_text())


def record_rows(path: Path, role: str, indices: list[int], *, extra: bool = False) -> None:
    """Add the rows ``indices`` to those ``role`` read, in the log at ``path`` (written atomically); ``extra``: rows
    of the extra images, not of the dataset."""
    if not indices:
        return
    known = _RECORDED.setdefault((str(path), "extra" if extra else "rows", role), set())
    if path.is_file() and set(indices) <= known:  # the common case: a part read again in this process
        return
    reads = read_log(path)
    table = reads.extra if extra else reads.rows
    before = set(table.get(role, []))
    known |= before
    if set(indices) <= before:
        return
    table[role] = sorted(before | {int(i) for i in indices})
    known |= set(table[role])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(reads.model_dump()))
    tmp.replace(path)
