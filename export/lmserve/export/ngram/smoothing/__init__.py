"""Smoothing methods: each turns `NgramCounts` into a `BackoffModel` (see `base.py`)."""

from __future__ import annotations

from lmserve.export.ngram.smoothing.add_k import smooth_add_k
from lmserve.export.ngram.smoothing.base import BackoffModel
from lmserve.export.ngram.smoothing.interpolated import smooth_interpolated
from lmserve.export.ngram.smoothing.kneser_ney import smooth_kneser_ney
from lmserve.export.ngram.smoothing.mle import smooth_mle

METHODS = ("mle", "add-k", "interpolated", "kneser-ney", "modified-kneser-ney")

__all__ = [
    "METHODS",
    "BackoffModel",
    "smooth_add_k",
    "smooth_interpolated",
    "smooth_kneser_ney",
    "smooth_mle",
]
