"""Compression: structured/head pruning and training-free recovery, driven by a plan and a recipe.

Modules, each importing only ones listed above it:

* ``forward`` -- forward checks on example inputs, and snapshot/restore for rollback.
* ``reports`` -- AppliedPruning, SkippedPruning, PruneReport, PrunableLayers.
* ``calibration`` -- the rows each Conv2d/Linear sees and produces on calibration images.
* ``importance`` -- the IMPORTANCE registry of channel criteria, and the head norm degrees.
* ``heads`` -- ATTENTION_SPECS and attention-head pruning.
* ``mha`` -- ``nn.MultiheadAttention`` split into q/k/v/o layers (SplitMultiheadAttention): head-prunable.
* ``channels`` -- structured channel pruning through Torch-Pruning's dependency graph.
* ``recovery`` -- RecoveryConfig and ``recover_``: least-squares refit, BatchNorm.
* ``distill`` -- DistillConfig and ``distill_``: optional knowledge distillation.
* ``recipes`` -- PruningConfig (and RecoveryConfig), validated against those registries.
* ``pruning`` -- ``apply_pruning(model, recommendations, example_inputs, config)`` and ``prunable_layers``.
* ``sensitivity`` -- the measured damage of pruning each prunable unit alone.
* ``baselines`` -- the uniform pruning baselines of ``profiling-agent bench``.

Quantization is deployment: its backends and recipe live in :mod:`tools.deploy`.
"""
