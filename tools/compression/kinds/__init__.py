"""Unit kinds: one module each (channels, heads, head width, blocks), registered in :mod:`tools.compression.units`."""
