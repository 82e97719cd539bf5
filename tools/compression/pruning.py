"""Structured channel pruning and attention-head pruning, driven by ``PruningRecommendation``s.

Two kinds of recommendation are applied, in the order given, to a model **in place**, by one verb,
:func:`apply_pruning` (with a :class:`tools.compression.recipes.PruningConfig`); :func:`prunable_layers`
lists what it can prune. The work is done by :mod:`tools.compression.channels` (structured) and
:mod:`tools.compression.heads` (head), ranked by :mod:`tools.compression.importance`, checked and rolled
back with :mod:`tools.compression.forward`, and reported with :mod:`tools.compression.reports`:

``structured``
    ``layer`` is a regex matched (``re.search``) against the names of ``nn.Conv2d`` / ``nn.Linear``
    modules. For each match, ``pruning_ratio`` of *that module's* output channels is removed with
    Torch-Pruning's ``DependencyGraph``: the whole coupled group (BatchNorm, the next layers' input
    channels, residual adds, ...) is pruned together, ranked by a group importance from ``IMPORTANCE``.
    A coupled group is pruned at most once per ``apply_pruning`` call: when several matched modules share
    a group (e.g. the last conv of every ResNet block of a stage, tied by the residual adds), the first in
    forward order prunes it and the others are reported as skipped, so the ratio does not compound.

``head``
    ``layer`` is a regex matched against the name of a head-prunable attention module *or* the names of
    its q/k/v/o projections (``attention`` and ``attention\\.q_proj`` select the same modules).
    ``round(ratio * heads)`` heads are removed (at least one is kept), ranked by the norm of each head's
    q/k/v rows and o columns. Supported attention classes are listed in ``ATTENTION_SPECS`` (ViT, DeiT,
    Swin, DINOv2, timm's); a new family is one table entry. A ``torch.nn.MultiheadAttention`` the pattern selects
    (by its name or by ``<name>.q_proj``/``k_proj``/``v_proj``/``o_proj``, the names it will have) is first
    replaced by the equal :class:`~tools.compression.mha.SplitMultiheadAttention`, whose heads are then pruned as
    the others'; the modules no pattern selects keep their class (and PyTorch's fused fast path).

What is never pruned, and is reported as ``SkippedPruning`` instead of failing:

* the classifier: every Conv2d/Linear from which the logits are reachable in the traced autograd graph
  without passing through another Conv2d/Linear (plus ``get_output_embeddings()`` when the model has
  one) -- for HF classifiers that is ``classifier`` (``classifier.1`` for ResNet), for torchvision ``fc``;
  groups that would touch its outputs are skipped as well;
* groups that would prune the input channels of a layer fed by the model input;
* q/k/v projections of supported attention modules (use ``pruning_type="head"`` or ``"head_dim"``) and any group coupled
  to their head dimensions;
* for transformer families (models containing attention modules): groups coupled to a ``LayerNorm``,
  i.e. the residual stream / embedding channels (patch embedding, ``o_proj``, ``fc2``, Swin patch
  merging). Torch-Pruning cannot keep those consistent everywhere (Swin's 2x2 patch merging concatenates
  four copies of the channels; ViT's cls token and position embeddings are raw parameters). The MLP
  hidden channels (``fc1``) and attention heads are what is pruned in transformers;
* modules that are not reached by the forward pass, or have a single output channel;
* anything whose pruning raises, or after which the forward pass fails: each recommendation is checked
  with a forward pass on ``example_inputs``; on failure it is rolled back and redone one module at a time,
  keeping the modules that work.

Parameter tensors are never modified in place (pruning builds new ones), so a rollback just restores the
modules' attribute dictionaries.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Sequence

import torch
from torch import nn

from tools.compression.channels import channel_issue, new_context, prunable_names
from tools.compression.forward import ExampleInputs, one_line
from tools.compression.heads import attention_modules, head_dim_of, narrowable
from tools.compression.importance import DATA_AWARE, get_importance
from tools.compression.kinds.base import PruningSession, UnitKind
from tools.compression.kinds.blocks import removable_blocks
from tools.compression.mha import split_attention_
from tools.compression.recipes import PruningConfig
from tools.compression.reports import PrunableLayers, PruneReport, SkippedPruning
from tools.compression.shortcuts import find_channel_shortcuts, to_channel_selects_, to_selection_convs_
from tools.compression.units import kind_of
from tools.models.base import clone_module
from tools.schemas import PruningRecommendation

logger = logging.getLogger(__name__)


def count_params(model: nn.Module) -> int:
    """Number of parameters (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters())


def prunable_layers(model: nn.Module, example_inputs: ExampleInputs) -> PrunableLayers:
    """List what ``apply_pruning`` may prune in ``model`` (traced on ``example_inputs``); see module doc.

    A model Torch-Pruning cannot trace keeps its head-prunable attention and has every Conv2d/Linear blocked
    with the tracer's reason (the run goes on without structured pruning). ``nn.MultiheadAttention`` modules are
    listed as :func:`apply_pruning` prunes them: split into q/k/v/o layers (on a copy; ``model`` is left as it is).
    """
    shortcuts = find_channel_shortcuts(model, example_inputs)
    if shortcuts or any(isinstance(m, nn.MultiheadAttention) for m in model.modules()):
        model = clone_module(model)  # traced as convolutions and split attention, the model left as it is
        split_attention_(model)
        if shortcuts:
            to_selection_convs_(model, example_inputs, shortcuts)
    attention = attention_modules(model).items()
    result = PrunableLayers()
    result.heads = {name: int(getattr(module, spec.heads_attr)) for name, (module, spec) in attention}
    result.head_dims = {
        f"{name}.{spec.qkv_layers[0]}": head_dim_of(module, spec)
        for name, (module, spec) in attention
        if narrowable(module, spec)
    }
    result.blocks = removable_blocks(model, example_inputs)
    try:
        ctx = new_context(model, example_inputs)
    except Exception as exc:  # Torch-Pruning cannot trace it (CvT: a split along tokens, then a cat)
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" in {frames[-1].name}" if frames else ""  # ShuffleNetV2: in update_reshape_index_mapping
        reason = f"Torch-Pruning cannot trace {type(model).__name__}: {one_line(exc)}{where}"
        logger.warning(
            "no channel pruning: %s; its convolutions and linear layers keep their channels (still units: %d whole "
            "blocks, the heads of %d attention modules)",
            reason,
            len(result.blocks),
            len(result.heads),
        )
        result.blocked = {n: reason for n, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)}
        return result
    for name in prunable_names(ctx):
        issue, members = channel_issue(ctx, name)
        if issue is None:
            result.structured.append(name)
            result.coupling[name] = len(members)
            if len(members) > 1:
                result.groups.setdefault(members[0], members)
            module = model.get_submodule(name)
            if isinstance(module, nn.Conv2d) and module.groups > 1:
                result.grouped_convs.append(name)
        else:
            result.blocked[name] = issue
    return result


def apply_pruning(
    model: nn.Module,
    recommendations: Sequence[PruningRecommendation],
    example_inputs: ExampleInputs,
    config: PruningConfig | None = None,
    calibration: torch.Tensor | None = None,
    calibration_targets: torch.Tensor | None = None,
    channel_scores: dict[str, torch.Tensor] | None = None,
) -> PruneReport:
    """Apply ``recommendations`` in order to ``model`` IN PLACE (pass a fresh copy) and report.

    ``example_inputs`` (a tensor, a tuple of positional tensors, or a dict of keyword tensors) is used
    to trace the dependency graph and to check every step with a forward pass. ``config`` (default
    ``PruningConfig()``): ``importance`` names a criterion of ``IMPORTANCE``; ``round_to`` makes kept
    channel counts multiples of it (0: off), ``head_round_to`` narrowed head widths; ``seed`` fixes random importance.
    Recommendations that match nothing give no ``applied`` entry but a ``skipped`` one whose target is the
    pattern. Every recommendation that changed the model is checked with a forward pass (logits of the
    original size), and rolled back module by module on failure, so the returned model always runs.
    Raises ``ValueError`` for an invalid regex (before anything changes). ``calibration`` (a batch of preprocessed
    images) feeds the data-aware criteria (:data:`DATA_AWARE`; ``taylor`` also needs ``calibration_targets``, the
    model class of each image, -1 where unknown); without them they fall back to ``l2``. ``channel_scores`` (the
    criterion's per-layer input-channel scores by layer name, as ``DATA_AWARE[importance]`` gives for this
    model unpruned) saves computing them when the caller prunes many copies of one model.

    The ``nn.MultiheadAttention`` modules a ``head``/``head_dim`` pattern selects are first split into q/k/v/o layers
    (:mod:`tools.compression.mha`, exact), so their ``o_proj`` has scores where ``channel_scores`` come from an
    original split the same way (:func:`~tools.compression.mha.split_attention_`).
    """
    config = config or PruningConfig()
    compiled = _compiled(recommendations)
    model.eval()
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    params_before = count_params(model)
    kinds = {kind.name: kind for _, _, kind in compiled}.values()
    for kind in kinds:  # e.g. nn.MultiheadAttention split (exact), padding shortcuts as convolutions
        kind.prepare(model, [regex for _, regex, k in compiled if k is kind], example_inputs)
    scores = _module_scores(model, config.importance, channel_scores, calibration, calibration_targets)
    report = PruneReport(params_before=params_before, params_after=params_before)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        session = _new_session(model, example_inputs, config, scores, traced=any(kind.traced for kind in kinds))
        _apply_each(session, compiled, report)
    to_channel_selects_(model)  # what is left of the padding shortcuts, parameter-free again
    for name, p in model.named_parameters():  # pruning creates new Parameters: keep frozen ones frozen
        if name in frozen:
            p.requires_grad_(False)
    report.params_after = count_params(model)
    logger.info(
        "pruning: %d applied, %d skipped, params %d -> %d",
        len(report.applied),
        len(report.skipped),
        report.params_before,
        report.params_after,
    )
    return report


_Compiled = list[tuple[PruningRecommendation, re.Pattern[str], UnitKind]]


def _compiled(recommendations: Sequence[PruningRecommendation]) -> _Compiled:
    """Each recommendation with its compiled pattern and its kind; ``ValueError`` for an invalid pattern."""
    compiled: _Compiled = []
    for rec in recommendations:
        try:
            compiled.append((rec, re.compile(rec.layer), kind_of(rec.pruning_type)))
        except re.error as exc:
            raise ValueError(f"invalid layer regex {rec.layer!r}: {exc}") from None
    return compiled


def _module_scores(
    model: nn.Module,
    importance: str,
    channel_scores: dict[str, torch.Tensor] | None,
    calibration: torch.Tensor | None,
    calibration_targets: torch.Tensor | None,
) -> dict[nn.Module, torch.Tensor] | None:
    """The data-aware criterion's ``channel_scores`` by module, computed on ``calibration`` where not given (None:
    ``importance`` is not data-aware, or there are no scores and it falls back to l2, said in a warning)."""
    if importance not in DATA_AWARE:
        return None
    if channel_scores is None and calibration is not None:
        channel_scores = DATA_AWARE[importance](model, calibration, calibration_targets, 64)
    if not channel_scores:
        logger.warning("importance %r has no calibration data; ranking by l2 weight norm instead", importance)
        return None
    return {m: channel_scores[n] for n, m in model.named_modules() if n in channel_scores}


def _new_session(
    model: nn.Module,
    example_inputs: ExampleInputs,
    config: PruningConfig,
    scores: dict[nn.Module, torch.Tensor] | None,
    *,
    traced: bool,
) -> PruningSession:
    """What the recommendations of one call share, the dependency graph traced now where a kind needs it."""
    return PruningSession(
        model=model,
        inputs=example_inputs,
        config=config,
        context=new_context(model, example_inputs, graph=traced),
        importance=get_importance(config.importance, scores),
        scores=scores,
        generator=torch.Generator().manual_seed(config.seed),
    )


def _apply_each(session: PruningSession, compiled: _Compiled, report: PruneReport) -> None:
    """Apply the ``compiled`` recommendations in order, each by its kind, into ``report``."""
    for rec, regex, kind in compiled:
        if not kind.matches(session, regex):
            report.skipped.append(SkippedPruning(target=rec.layer, reason=kind.nothing_matches))
            continue
        applied, skipped = kind.apply(session, rec, regex)
        if applied:
            report.applied.append(applied)
        report.skipped.extend(skipped)


__all__ = ["apply_pruning", "count_params", "prunable_layers"]
