"""Keeping the garbage collector off what lives as long as the process: loaded models, codecs,
gRPC and protobuf machinery.

    freeze_long_lived()        # after the models are loaded (and after each reload)

A full collection in a front serving the default models walks ~60k tracked objects: 17 ms,
during which no request is answered and no stream written; under streaming traffic such
collections come every few seconds and set the tail latency. `gc.freeze()` moves everything
alive now out of the collector's sight, so a full collection only walks what requests
allocated since. Calling it again (a reload) first collects what became garbage meanwhile.
"""

from __future__ import annotations

import gc


def freeze_long_lived(*, thaw: bool = True) -> None:
    """Collects, then hides every object alive now from later collections. `thaw=False` leaves
    what is frozen already out of that collection: an engine worker forked from the fork server
    shares those objects' pages with it, and a collection over them would write to (and so
    copy) every one of those pages."""
    if thaw:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
