"""Word lattices: HTK SLF and Kaldi text lattices read into one graph and written back
(`graph`, `slf`, `kaldi`, `formats`), and their rescoring with a model (`expand`: nodes
expanded by model history, `paths`: the best and n best paths through the expansion)."""
