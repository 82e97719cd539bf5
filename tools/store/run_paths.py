"""The run directory's layout: where each node writes, so that a resumed run finds what it wrote before."""

from __future__ import annotations

from pathlib import Path


class RunPaths:
    """Fixed locations inside a run directory, so that a resumed node finds what it wrote before."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def settings(self) -> Path:
        return self.root / "settings.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints.sqlite"

    @property
    def data_reads(self) -> Path:
        """The dataset rows each role (fit, choose, confirm) read (``tools.stages.run_data.DataReads``)."""
        return self.root / "data_reads.json"

    @property
    def original(self) -> Path:
        return self.root / "models" / "original"

    @property
    def profile(self) -> Path:
        return self.root / "profile"

    def round(self, index: int) -> Path:
        return self.root / "rounds" / f"round-{index:02d}"

    @property
    def quantized(self) -> Path:
        return self.root / "models" / "quantized"

    @property
    def quantized_original(self) -> Path:
        return self.root / "models" / "quantized-original"

    @property
    def runtime_fp32_original(self) -> Path:
        """The original in the deployed runtime at FP32: the middle step of the decomposed speed-up."""
        return self.root / "models" / "runtime-fp32-original"

    @property
    def report_json(self) -> Path:
        return self.root / "report.json"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"
