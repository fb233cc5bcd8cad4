"""The n-gram backend: ARPA reading, the memory-mapped binary format and its model folders,
KenLM-exact scoring and next-token distributions.

    model = NgramModel.from_arpa("kjv.5gram.arpa.gz")   # model.NgramModel, or .load("x.lmbin")
    model.score(encode_token_lists([["in", "the", "beginning"]], model.vocab)).totals

The package itself imports nothing: its modules import its C extensions (`_kernel`,
`_arpa_import`) from it, so importing them here would make each module import itself.
"""
