"""Hugging Face causal LMs in (issue #32, first part): a local checkpoint read without any
download, its decoder exported to ONNX with past key values in the layout optimum writes
(`input_ids`, `attention_mask`, `position_ids`, `past_key_values.N.key/value` in; `logits`,
`present.N.key/value` out), and that graph checked against transformers' own forward.

The server does not serve these graphs yet: the transformer model kind (a growing key/value
cache in every RPC) is the next part of the issue.
"""
