"""Distillation after the search (``--distill-rescues``): an over-budget round distilled twice, each student on one
half of the evaluation images and judged on the other, merged into one paired result on every evaluation image;
the round's model is judged alone, and deployed, only on the half it did not see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import agents.evaluation
from agents.context import Context
from agents.evaluation import spec_for
from agents.planning.selection import kept_round, robust_rounds, round_to_distill
from agents.state import state_of
from graph.routing import route_after_quantize_model
from tests.helpers import digits_vit_report, round_result, typed_state
from tools.compression import distill_budget as distill
from tools.evaluation.datasets import evaluation_halves
from tools.evaluation.paired import ImagePredictions, merge_halves
from tools.schemas import PairedAccuracy, RoundResult
from tools.stages.deployment import accuracy_control
from tools.stages.run_data import EvalSpec
from tools.stats import Budget


def test_halves_are_disjoint_seeded_and_cover_the_part() -> None:
    first, second = evaluation_halves(11, seed=3)
    assert sorted(first + second) == list(range(11)) and len(first) == 5
    assert first == sorted(first) and second == sorted(second)
    assert evaluation_halves(11, seed=3) == (first, second)
    assert evaluation_halves(11, seed=4) != (first, second)


def test_merged_answers_follow_the_whole_part_and_skip_unmatched_images() -> None:
    labels = [0, 9, 1, 2, 9, 3]  # 9: a class the model does not have
    halves = ([0, 1, 3], [2, 4, 5])
    on_first = ImagePredictions(key={}, predictions=[10, 12], correct=[1, 0])  # positions 0 and 3
    on_second = ImagePredictions(key={}, predictions=[11, 13], correct=[1, 1])  # positions 2 and 5
    predictions, correct = merge_halves(halves, labels, lambda label: label != 9, [on_first, on_second])
    assert predictions == [10, 11, 12, 13] and correct == [1, 1, 0, 1]
    with pytest.raises(ValueError, match="do not match"):
        merge_halves(halves, labels, lambda label: True, [on_first, on_second])


def test_a_spec_of_one_half_reads_that_half_and_keeps_its_own_predictions_file() -> None:
    spec = EvalSpec(dataset="digits", samples=100, calibration_samples=32, seed=0)
    whole = spec.part("evaluation")
    half = spec.model_copy(update={"evaluation_half": 1})
    rows = half.part("evaluation").indices
    assert rows == [whole.indices[i] for i in evaluation_halves(len(whole), 0)[1]]
    assert half.part_label("evaluation") == "evaluation-half1" and spec.part_label("evaluation") == "evaluation"
    assert half.part_label("calibration") == "calibration" and half.whole() == spec


def _round(index: int, params: int, drop: float, within: bool, **extra: Any) -> RoundResult:
    metrics = {"params": params, "latency_s": 1.0, "accuracy": 0.9 - drop / 100, "artifact": f"r{index}"}
    return round_result(
        {"round": index, "metrics": metrics, "accuracy_drop_points": drop, "within_budget": within, **extra}
    )


def test_the_round_nearest_the_budget_among_those_smaller_than_the_kept_one_goes_first() -> None:
    rounds = [_round(0, 80, 0.3, True), _round(1, 60, 4.0, False), _round(2, 70, 1.6, False), _round(3, 90, 1.1, False)]
    assert round_to_distill(rounds, "accuracy", 1.0, 1, 100).round == 2  # 3 is larger than the kept round 0
    tried = [*rounds, _round(4, 70, 0.4, True, cross_fit={"source_round": 2})]
    assert round_to_distill(tried, "accuracy", 1.0, 1, 100) is None  # one rescue asked for, done
    # round 4 came back: what it recovered sets the next one (tests/unit/test_distill_target.py); without a paired
    # result it measured nothing, so nothing more is distilled
    assert round_to_distill(tried, "accuracy", 1.0, 2, 100) is None
    failed = [*rounds, _round(4, 70, 1.4, False, cross_fit={"source_round": 2})]
    assert round_to_distill(failed, "accuracy", 1.0, 2, 100).round == 1  # still over: the next nearest
    # passed the budget test alone, refused as the best of several: smaller than the kept one, so it is tried
    refused = [_round(0, 80, 0.3, True), _round(1, 60, 4.0, False), _round(2, 70, 0.85, True)]
    for r, se in zip(refused, (0.05, 0.5, 0.1), strict=True):  # round 2: 0.85 + 1 se <= 1, 0.85 + 1.83 se > 1
        delta = -(r.accuracy_drop_points or 0.0)
        r.metrics.paired = PairedAccuracy.model_validate(
            {
                **{"delta_points": delta, "ci95_low_points": delta - 1.96 * se, "ci95_high_points": delta + 1.96 * se},
                **{"agreement": 0.9, "samples": 1000, "gained": 10, "lost": 20},
            }
        )
    assert kept_round(refused, "smallest-within-budget", 1.0) == refused[2]  # within alone: the confirmation judges
    assert [r.round for r in robust_rounds(refused, 1.0)] == [0]
    assert round_to_distill(refused, "accuracy", 1.0, 1, 100).round == 2  # likeliest to fail: distilled all the same
    nothing_kept = [_round(0, 90, 3.0, False), _round(1, 95, 2.0, False)]
    assert round_to_distill(nothing_kept, "accuracy", 1.0, 1, 100).round == 1  # the original's size bounds it


def test_a_distilled_round_is_judged_by_its_other_half(tmp_path: Path) -> None:
    rounds = [_round(0, 60, 2.0, False), _round(1, 60, 0.2, True, cross_fit={"judged_on_half": 0})]
    rounds[1].metrics.artifact = str(tmp_path / "r1")
    state = typed_state({"rounds": rounds, "dataset": "digits"})
    assert spec_for(state, Context(), tmp_path / "r1").evaluation_half == 0
    assert spec_for(state, Context(), tmp_path / "r0").evaluation_half is None


def test_a_run_distils_its_round_over_the_budget_and_deploys_it_judged_on_its_other_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distill, "AUTO_DISTILL_STEPS", (10, 20))  # a tiny model would take the 1,000-step cap
    # the search's rounds are judged over the budget (the bundled ViT loses nothing to what the planner asks), so
    # the first one is distilled; the distilled round is judged by the real test against the 50-point budget
    monkeypatch.setattr(agents.evaluation, "within_budget", lambda *args, **kwargs: False)
    run_dir = tmp_path / "run"
    report = digits_vit_report(
        run_dir,
        iterations=0,
        eval_samples=300,
        calibration_samples=64,
        quantize=True,
        quant_backend="torch-ao-dynamic",
        distill_rescues=1,  # the search goes on after a rescue while distillations are left (tests/unit/test_routing)
        unit_kinds="structured,head,head_dim",  # blocks removed from the 4-layer ViT would lose most of it
    )
    rounds = report["rounds"]
    assert len(rounds) == 2 and not rounds[0]["within_budget"] and rounds[0]["cross_fit"] is None
    distilled = rounds[1]
    cross_fit = distilled["cross_fit"]
    assert cross_fit["source_round"] == 0 and cross_fit["judged_on_half"] == 1
    students = cross_fit["students"]
    assert [s["judged_on_half"] for s in students] == [1, 0]
    evaluation = report["baseline"]["data_parts"]["evaluation"]
    first, second = evaluation_halves(evaluation, 0)
    assert [s["samples"] for s in students] == [len(second), len(first)]
    assert distilled["metrics"]["samples"] == distilled["metrics"]["paired"]["samples"] == evaluation
    assert cross_fit["images_per_student"] == 64 + len(first)
    assert distilled["metrics"]["params"] == rounds[0]["metrics"]["params"]  # the same pruned widths
    assert distilled["prune_report"]["finetune"]["steps"] == 20
    folder = run_dir / "rounds" / "round-01"
    meta = json.loads((folder / "model" / "artifact.json").read_text())
    assert meta["recipe"]["distilled"]["source"] == rounds[0]["metrics"]["artifact"]
    assert (folder / "model-second" / "artifact.json").is_file()
    assert (folder / "model.predictions.evaluation-half1.json").is_file()
    assert any("round 1: round 0 (over the 50-point budget" in note for note in report["notes"])
    # kept, and its int8 judged only on the images its model was not distilled on
    assert distilled["within_budget"] and report["pruned"]["round"] == 1
    assert report["quantized"]["samples"] == len(second)
    assert report["quantized"]["paired"]["samples"] == len(second)
    deployed = [c for c in report["deployment"]["candidates"] if c.get("paired")]
    assert deployed and all(c["paired"]["samples"] == len(second) for c in deployed)


def test_a_distilled_model_of_the_same_recipe_is_reused_not_trained_again(tmp_path: Path) -> None:
    import torch

    from tests.helpers import save_tiny, tiny_vit
    from tools.compression.distill import DistillConfig
    from tools.compression.recipes import PruningConfig
    from tools.schemas import OptimizationPlan, PruningRecommendation
    from tools.stages import ops
    from tools.stages.cross_fit import distill_saved

    original = tmp_path / "original"
    ops.acquire(str(save_tiny(tiny_vit(), tmp_path / "vit", 16)), original)
    shape = ops.resolve_input_shape(original)
    plan = OptimizationPlan(
        pruning_recommendations=[
            PruningRecommendation(layer=r"^vit\.layers\.\d+\.mlp\.fc1$", pruning_type="structured", pruning_ratio=0.5)
        ]
    )
    ops.prune(original, plan, shape, tmp_path / "pruned", PruningConfig(importance="l1"))
    images = torch.randn(16, *shape.as_tuple())
    config = DistillConfig(steps=3, batch_size=8)
    first = distill_saved(tmp_path / "pruned", original, tmp_path / "student", images, config)
    mtime = (tmp_path / "student" / "artifact.json").stat().st_mtime_ns
    again = distill_saved(tmp_path / "pruned", original, tmp_path / "student", images, config)
    assert again == first and first["steps"] == 3
    assert (tmp_path / "student" / "artifact.json").stat().st_mtime_ns == mtime  # reused
    other = distill_saved(tmp_path / "pruned", original, tmp_path / "student", images[:8], config)
    assert other["samples"] == 8  # other images: another recipe, distilled again


def test_students_trained_side_by_side_are_those_trained_one_after_the_other(tmp_path: Path) -> None:
    import torch

    from tests.helpers import save_tiny, tiny_vit
    from tools import load_compressed
    from tools.compression.distill import DistillConfig
    from tools.compression.recipes import PruningConfig
    from tools.schemas import OptimizationPlan, PruningRecommendation
    from tools.stages import ops
    from tools.stages.cross_fit import _distil_both

    original = tmp_path / "original"
    ops.acquire(str(save_tiny(tiny_vit(), tmp_path / "vit", 16)), original)
    shape = ops.resolve_input_shape(original)
    fc1 = PruningRecommendation(layer=r"^vit\.layers\.\d+\.mlp\.fc1$", pruning_type="structured", pruning_ratio=0.5)
    ops.prune(original, OptimizationPlan(pruning_recommendations=[fc1]), shape, tmp_path / "p", PruningConfig())
    config = DistillConfig(steps=4, batch_size=8)
    halves = [torch.randn(16, *shape.as_tuple(), generator=torch.Generator().manual_seed(i)) for i in (0, 1)]

    def jobs(folder: str) -> list[Any]:
        return [(tmp_path / "p", original, tmp_path / folder / str(i), halves[i], config, None) for i in (0, 1)]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = _distil_both(jobs("alone"), workers=1)
        together = _distil_both(jobs("together"), workers=2)  # the second student in a spawned process
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads or threads != 1
    assert [r["steps"] for r in together] == [r["steps"] for r in alone] == [4, 4]
    for i in (0, 1):
        a, b = load_compressed(tmp_path / "alone" / str(i)), load_compressed(tmp_path / "together" / str(i))
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_the_second_student_deploys_when_the_first_is_over_the_budget_on_its_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept round is a distilled one: its second student is the first alternative the deployment builds, judged
    on the half it did not see; when a candidate of it is chosen, the same round is the pruned model, now with the
    second student's artifact."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.runtime import Runtime

    import agents.quantization
    from graph import build_graph
    from tools.deploy.choice import DeployCandidate, DeployChoice

    monkeypatch.setattr(distill, "AUTO_DISTILL_STEPS", (10, 20))
    monkeypatch.setattr(agents.evaluation, "within_budget", lambda *args, **kwargs: False)
    run_dir = tmp_path / "run"
    ctx = Context(
        run_dir=str(run_dir),
        max_accuracy_drop=50.0,
        latency_repeats=2,
        progress=False,
        iterations=0,
        eval_samples=300,
        calibration_samples=64,
        quantize=False,
        distill_rescues=1,
        unit_kinds="structured,head,head_dim",
    )
    graph = build_graph().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    graph.invoke({"model": "digits-vit", "dataset": "digits"}, config, context=ctx, durability="sync")
    state = graph.get_state(config).values
    assert state["pruned"]["round"] == 1
    second = run_dir / "rounds" / "round-01" / "model-second"
    seen: dict[str, Any] = {}

    def fake_deploy(source: Path, *args: Any, alternatives: list[Path], judging: Any, **kwargs: Any) -> DeployChoice:
        judged = {Path(p).resolve(): j for p, j in judging.items()}
        # the deployment gets values, and calls nothing of the agents back: the budget test is a record, the
        # accuracy control a recipe of tools.stages.deployment's own function
        assert isinstance(kwargs["within_budget"], Budget) and kwargs["control"].func is accuracy_control
        seen.update(
            source=source,
            alternatives=alternatives,
            halves=[judged[Path(p).resolve()].spec.evaluation_half for p in (source, second)],
            twins=[judged[Path(p).resolve()].twin for p in (source, second)],
        )
        chosen = DeployCandidate(
            backend="torch", runtime="pytorch", precision="fp32", ran=True, within_budget=True, latency_s=1e-3
        )
        return DeployChoice(
            chosen="torch",
            why="test",
            source=str(alternatives[0]),
            ships=kwargs["ships"][str(alternatives[0])],  # the node says which model each source is
            candidates=[chosen.model_copy(update={"source": str(alternatives[0])})],
        )

    monkeypatch.setattr(agents.quantization, "deploy", fake_deploy)
    typed = state_of(state)
    changes: Any = agents.quantization.quantize_model(typed, Runtime(context=ctx))
    assert Path(seen["alternatives"][0]).resolve() == second.resolve()  # before the headroom round and the original
    assert seen["halves"] == [1, 0]  # each student judged on the half it was not distilled on
    assert seen["twins"] == [second.resolve(), Path(seen["source"]).resolve()]  # and each build with the other's
    assert changes["deployment"].ships == "second_student" and "pruned" not in changes  # the choice only
    typed = typed.model_copy(update={"deployment": changes["deployment"]})
    assert route_after_quantize_model(typed) == "adopt_second_student"
    adopted: Any = agents.quantization.adopt_second_student(typed, Runtime(context=ctx))
    assert adopted["pruned"].round == 1 and adopted["pruned"].student == 2
    assert Path(adopted["pruned"].artifact).resolve() == second.resolve()
    assert any("round 1's second student" in note and "first student's" in note for note in adopted["notes"])
    typed = typed.model_copy(update={"pruned": adopted["pruned"]})
    built: Any = agents.quantization.build_deployed_model(typed, Runtime(context=ctx))
    assert Path(built["quantized"].source).resolve() == second.resolve()


def test_a_ladder_step_s_student_starts_from_the_step_before_with_its_further_blocks_removed(tmp_path: Path) -> None:
    """A round that removes blocks beyond a distilled round's starts its students from that round's (the depth
    ladder): the saved student holds both rounds' blocks removed and the earlier student's weights, and a round that
    changes anything else cannot start there."""
    import torch

    from tests.helpers import save_tiny, tiny_vit
    from tools import load_compressed
    from tools.compression.distill import DistillConfig
    from tools.compression.recipes import PruningConfig
    from tools.schemas import OptimizationPlan, PruningRecommendation
    from tools.stages import ops
    from tools.stages.cross_fit import distill_saved, extends_by_blocks

    original = tmp_path / "original"
    ops.acquire(str(save_tiny(tiny_vit(layers=3), tmp_path / "vit", 16)), original)
    shape = ops.resolve_input_shape(original)

    def pruned(name: str, *recs: tuple[str, str, float]) -> Path:
        found = [PruningRecommendation(layer=layer, pruning_type=kind, pruning_ratio=r) for layer, kind, r in recs]
        plan = OptimizationPlan(pruning_recommendations=found)
        ops.prune(original, plan, shape, tmp_path / name, PruningConfig(importance="l1"))
        return tmp_path / name

    one = pruned("one", (r"^vit\.layers\.0$", "block", 1.0))
    two = pruned("two", (r"^vit\.layers\.[01]$", "block", 1.0))
    other = pruned("other", (r"^vit\.layers\.[01]$", "block", 1.0), (r"^vit\.layers\.2\.mlp\.fc1$", "structured", 0.5))
    images = torch.randn(16, *shape.as_tuple())
    distill_saved(one, original, tmp_path / "student-one", images, DistillConfig(steps=3, batch_size=8, lr=1e-2))
    assert extends_by_blocks(two, tmp_path / "student-one") and not extends_by_blocks(other, tmp_path / "student-one")
    assert not extends_by_blocks(one, tmp_path / "student-one")  # no block more

    frozen = DistillConfig(steps=1, batch_size=8, lr=1e-12)
    distill_saved(two, original, tmp_path / "from-one", images, frozen, start=tmp_path / "student-one")
    meta = json.loads((tmp_path / "from-one" / "artifact.json").read_text())
    assert meta["recipe"]["distilled"]["start"] == str(tmp_path / "student-one")
    assert {n for n, e in meta["structure"].items() if e.get("replace", {}).get("type") == "SkippedBlock"} == {
        "vit.layers.0",
        "vit.layers.1",
    }
    student, earlier, fresh = (load_compressed(p) for p in (tmp_path / "from-one", tmp_path / "student-one", two))
    weight = "vit.layers.2.mlp.fc1.weight"
    assert torch.allclose(student.state_dict()[weight], earlier.state_dict()[weight])
    assert not torch.allclose(student.state_dict()[weight], fresh.state_dict()[weight])
    with pytest.raises(ValueError, match="cannot start there"):
        distill_saved(other, original, tmp_path / "bad", images, frozen, start=tmp_path / "student-one")


def test_a_ladder_step_starts_from_the_distilled_round_of_the_most_of_its_blocks() -> None:
    from agents.planning.selection import ladder_starts

    def blocks(index: int, names: list[str], within: bool = True, **extra: Any) -> RoundResult:
        applied = [{"pattern": "x", "pruning_type": "block", "ratio": 1.0, "modules": names}]
        return _round(index, 90 - len(names), 0.2, within, prune_report={"applied": applied}, **extra)

    students = {"students": [{"artifact": "a", "judged_on_half": 1}, {"artifact": "b", "judged_on_half": 0}]}
    two = blocks(1, ["l.1", "l.2"], cross_fit={"source_round": 0, **students})
    three = blocks(3, ["l.1", "l.2", "l.4"], cross_fit={"source_round": 2, **students})
    elsewhere = blocks(5, ["l.7", "l.8", "l.9"], cross_fit={"source_round": 4, **students})
    undistilled = blocks(6, ["l.1", "l.2", "l.4", "l.5"])
    step = blocks(7, ["l.1", "l.2", "l.4", "l.5", "l.6"], within=False)
    rounds = [two, three, elsewhere, undistilled, step]
    assert [r.round for r in ladder_starts(rounds, step)] == [3, 1]
    assert ladder_starts(rounds, three) == [two] and ladder_starts(rounds, two) == []
