"""On-disk state: ``files`` (atomic writes, JSON, hashes), ``run_paths`` (run-dir layout), ``artifacts`` (models)."""
