"""The engine: one model's compute, in its worker process (or in-process), and the responses
it builds."""
