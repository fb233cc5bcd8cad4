"""Training of back-off n-gram language models, written as ARPA files (`lmserve train-ngram`).

The pipeline (see `train.py`): tokenize and pick a vocabulary (`vocab.py`), count every n-gram
order with numpy (`counting.py`), smooth with one of the methods in `smoothing/`, write the ARPA
file (`arpa_writer.py`) and hand it to the serving engine, which builds the binary model folder.
"""
