"""Recurrent (RNN/LSTM/GRU) and feed-forward language models: the networks, their batches,
and their export to served folders (their trainer is `lmserve.export.trainers`)."""
