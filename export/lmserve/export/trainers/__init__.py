"""The neural trainers and their commands: `train-rnn` (alias `train-neural`) trains a recurrent,
feed-forward or transformer model through one loop (`loop.py`; each trainer brings its batch
step and scorer: `recurrent.py`, `transformer.py`), and `export-rnn` turns its checkpoints into
served folders (the models and their recurrent export are in `lmserve.export.rnn`, the
transformer's in `lmserve.export.hf`). The n-gram trainer is `lmserve.export.ngram`."""
