"""Model-agnostic algorithms over backends and steppers, free of gRPC.

Scoring and perplexity (`scoring`, `perplexity`, `prefix_scoring`); generation's parameters,
sampling, beam search, stopping and incremental detokenization (`params`, `sampling`, `draw`,
`beam`, `stopping`, `detokenize`); autocomplete's word search (`completion`); and reranking
arithmetic (`rerank`).
"""
