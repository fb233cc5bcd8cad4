"""Type stub for the C extension `_draw.c` (inverse-CDF draws over rows)."""

from typing import Any

def draw_logits(
    logits: Any, width: int, maxes: Any, inv_temps: Any, uniforms: Any, out: Any, /
) -> None: ...
def draw_weights(weights: Any, width: int, uniforms: Any, out: Any, /) -> None: ...
