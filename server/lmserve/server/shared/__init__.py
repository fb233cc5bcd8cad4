"""What the front and worker processes share: the typed frames between them, edits, stats."""
