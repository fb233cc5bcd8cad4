"""Generation: continuous batching of sampled streams (`scheduler`) and bounded beam searches."""
