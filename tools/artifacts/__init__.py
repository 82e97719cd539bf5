"""Model artifacts on disk: ``io`` (save and load original, pruned and quantized models), ``structure`` (how a
compressed model differs from its original), ``hashes`` (recipe hashes: when an artifact may be reused)."""
