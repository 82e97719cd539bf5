"""Counts the report states are computed, not asserted: MACs no rule counted are named with their module types (and
said first)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tools.profiling.static import is_count_note, static_details, uncounted_note


class _FunctionalConv(nn.Module):
    """A layer with a kernel applied through ``F.conv2d``: no ptflops rule knows its type."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 3, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, padding=1)


class _SameConv(nn.Conv2d):
    """A ``Conv2d`` subclass (as third-party TF-style 'same' convolutions are): counted through its base class."""


def test_modules_no_rule_counts_are_named_with_their_type() -> None:
    model = nn.Sequential(_FunctionalConv(), nn.ReLU(), _SameConv(8, 4, 3), nn.Flatten(), nn.LazyLinear(2))
    model(torch.zeros(1, 3, 8, 8))
    details = static_details(model, (3, 8, 8))
    assert details.uncounted == {"_FunctionalConv": 1}
    assert details.macs.get("2", 0) > 0  # the subclass is counted
    note = uncounted_note(details.uncounted)
    assert note is not None and "_FunctionalConv x1" in note and is_count_note(note)


def test_a_model_counted_in_full_has_no_note() -> None:
    details = static_details(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), (3, 8, 8))
    assert details.uncounted == {} and uncounted_note(details.uncounted) is None
