"""Autocomplete: sessions kept between keystrokes, their context edits, and the next words."""
