"""The n-gram backend: ARPA reading, the memory-mapped binary format and its model folders,
KenLM-exact scoring and next-token distributions.

model = NgramModel.from_arpa("kjv.5gram.arpa.gz")   # or NgramModel.load("model.lmbin")
model.score(encode_token_lists([["in", "the", "beginning"]], model.vocab)).totals
"""

from lmserve.server.backends.ngram.folder import load_model_folder_binary, write_model_folder
from lmserve.server.backends.ngram.model import NgramModel

__all__ = ["NgramModel", "load_model_folder_binary", "write_model_folder"]
