"""Scoring: requests cut into bounded units, run one fair pass at a time on the model's thread."""
