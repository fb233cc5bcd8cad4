"""Serving machinery between the API and the models: micro-batching now, scheduling later."""
