"""Recurrent (RNN/LSTM/GRU) language models: the network, its training, and its export."""
