"""Training and export: n-gram and neural models in, served model folders out.

`export_module`, `import_onnx` and `import_torchscript` bring a neural LM trained elsewhere
(`lmserve.export.custom`); they load torch and onnx when first used, not on import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmserve.export.custom import (
        BroughtModel,
        ContractError,
        ModelContract,
        StateSpec,
        export_module,
        import_onnx,
        import_torchscript,
    )

# The names `lmserve.export.custom` offers, re-exported here.
__all__ = [
    "BroughtModel",
    "ContractError",
    "ModelContract",
    "StateSpec",
    "export_module",
    "import_onnx",
    "import_torchscript",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from lmserve.export import custom

        return getattr(custom, name)
    raise AttributeError(f"module 'lmserve.export' has no attribute {name!r}")
