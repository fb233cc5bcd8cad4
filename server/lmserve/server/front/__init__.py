"""The front process: what answers clients (API plumbing, served models, the client ends of
the engine worker processes); it holds no model weights."""
