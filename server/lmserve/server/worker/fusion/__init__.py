"""Shallow fusion: each Fuse stream's hypotheses and their model states (`sessions`), stepped
together across every stream of the model (`steps`)."""
