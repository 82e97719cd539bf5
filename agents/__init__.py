"""The nodes of the graph, one module per agent of the paper; ``planning/`` holds how plans are made."""
