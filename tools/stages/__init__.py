"""The run's stages, path in and path out: what the nodes in ``agents/`` call.

The top layer of ``tools/``, in layers of its own: ``run_data`` (the run's images: its parts, their reads, batches)
< ``judging`` (a model judged on those images, paired with the original) < ``ops`` (one operation a stage:
profile, prune, quantize, evaluate, time) < ``cross_fit``, ``deployment``, ``predict``.
"""
