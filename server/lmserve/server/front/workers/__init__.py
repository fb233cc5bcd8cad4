"""The front's ends of the engine worker processes: start, supervise, call."""
