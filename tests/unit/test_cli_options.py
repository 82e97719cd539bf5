"""The ``run`` command's options are generated from the settings (``agents.context.Context``): one option per setting,
each with help, and nothing else besides the model, its data and the run's place."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from agents.context import Context
from graph.cli import build_parser
from graph.options import FACTORY_FLAGS, NOT_OPTIONS, context_from, setting_flags

#: What ``run`` takes besides the settings: the model and its factory options, the data, the run's place.
RUN_ONLY = {"help", "model", *FACTORY_FLAGS, "dataset", "split", "run_dir", "thread_id"}


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices["run"]
    return parser


def test_every_setting_is_an_option_with_help_and_no_option_is_extra() -> None:
    actions = _run_parser()._actions
    settings = {f.name for f in fields(Context)} - set(NOT_OPTIONS)
    dests = {a.dest for a in actions}
    assert settings <= dests, f"settings without an option: {sorted(settings - dests)}"
    assert dests - settings == RUN_ONLY, f"options that are no setting: {sorted(dests - settings - RUN_ONLY)}"
    assert all(a.help for a in actions), [a.dest for a in actions if not a.help]
    for f in fields(Context):  # each option's help is its setting's description
        if f.name not in NOT_OPTIONS:
            [action] = [a for a in actions if a.dest == f.name]
            assert f.metadata["description"].replace("%", "%%") in str(action.help)
            assert action.option_strings[0] == setting_flags(f.name)[0]


def test_options_parse_into_the_settings_with_their_defaults_and_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFILING_AGENT_ITERATIONS", "7")  # an environment default is the option's default
    base = ["run", "--model", "m", "--run-dir", "r"]
    args = build_parser().parse_args(base)
    ctx = context_from(args, args.run_dir)
    assert (
        ctx.iterations == 7 and ctx.sensitivity and ctx.quant_backend == Context().quant_backend and ctx.run_dir == "r"
    )
    args = build_parser().parse_args(
        [*base, "--no-sensitivity", "--deploy", "openvino", "--holdout-samples", "50", "--finetune-steps", "auto"]
    )
    ctx = context_from(args, args.run_dir)
    assert not ctx.sensitivity and ctx.quant_backend == "openvino" and ctx.confirm_samples == 50
    assert ctx.finetune_steps == -1
    with pytest.raises(SystemExit):  # choices come from the registries
        build_parser().parse_args([*base, "--deploy", "no-such-runtime"])


def test_the_pruning_ratio_cap_has_one_default() -> None:
    from agents.planning.base import MAX_RATIO
    from tools.compression.recipes import PruningConfig

    assert Context().max_pruning_ratio == PruningConfig().max_ratio == MAX_RATIO
