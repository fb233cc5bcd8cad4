"""The front process itself: assembly, start and stop, ports, reloads, the other fronts."""
