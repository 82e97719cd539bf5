"""Compression: structured/head pruning and dynamic quantization, driven by a plan and a recipe.

Modules, each importing only ones listed above it:

* ``importance`` -- the IMPORTANCE registry of channel criteria, and the head norm degrees.
* ``reports`` -- AppliedPruning, SkippedPruning, PruneReport, PrunableLayers.
* ``forward`` -- forward checks on example inputs, and snapshot/restore for rollback.
* ``heads`` -- ATTENTION_SPECS and attention-head pruning.
* ``channels`` -- structured channel pruning through Torch-Pruning's dependency graph.
* ``quantization`` -- QUANTIZATION_BACKENDS: dynamic quantization backends and their artifacts.
* ``recipes`` -- PruningConfig and QuantizationConfig, validated against those registries.
* ``pruning`` -- ``apply_pruning(model, recommendations, example_inputs, config)`` and ``prunable_layers``.
* ``baselines`` -- the uniform pruning baselines of ``profiling-agent bench``.
"""
