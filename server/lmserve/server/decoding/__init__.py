"""Model-agnostic algorithms over backends: scoring and perplexity now, decoding later."""
