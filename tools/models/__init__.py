"""Models: where they come from, how they are built and checked, and how the run's original is saved.

Modules, each importing only ones listed above it:

* ``base`` -- LoadedModel, ModelLoadError, ImageNet statistics, preprocessing, logits, device.
* ``checkpoints`` -- state dict files read without unpickling code, and loaded with clear errors.
* ``specs`` -- FactorySpec and Preprocessing, parsed from command-line values.
* ``factory`` -- ``module.path:callable`` models: built, checked, saved and rebuilt.
* ``pretrained`` -- Hugging Face ``save_pretrained`` directories and hub ids.
* ``builtin`` -- the paper's architectures (untrained) and the bundled digits demos.
* ``sources`` -- the registry of model sources and ``acquire_model``.
"""
