"""How an RPC takes its model: validated, noted for metrics, and held for the call.

    with use_model(models, request.model) as served:    # "name" or "name@version"
        ...

Holding the model (`ServedModels.use`) is what lets a hot reload replace it with no request
dropped: the old `ServedModel` is closed only after the last call holding it ends.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from lmserve.server.front.api.interceptors import note_model
from lmserve.server.front.api.validation import validate_model_name
from lmserve.server.front.models.served_model import ServedModel
from lmserve.server.front.models.served_models import ServedModels


def use_model(models: ServedModels, model: str) -> AbstractContextManager[ServedModel]:
    """The model named by a request, held until the block ends (errors as `ready` raises)."""
    name = validate_model_name(model)
    if name in models:
        note_model(models.base_name(name))
    return models.use(name)


def same_model(models: ServedModels, served: ServedModel, model: str) -> bool:
    """Whether a later stream message's `model` names the stream's model (any spelling)."""
    return not model or models.base_name(model) == served.name
