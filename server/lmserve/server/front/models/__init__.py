"""The front's side of each model: its codec, limits and engine (`ServedModel`)."""
