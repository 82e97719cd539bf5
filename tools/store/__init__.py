"""On-disk state: ``files`` (atomic writes, JSON, hashes), ``run_paths`` (run-dir layout), ``lock`` (one process
per run dir). Bottom-level infrastructure: it imports nothing of the project above ``tools.schemas``/``tools.text``;
model artifacts are :mod:`tools.artifacts`."""
