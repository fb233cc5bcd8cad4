"""Neural LMs brought from outside: a torch module, an ONNX file or a TorchScript file in, a
served model folder out, under the contract stated in `contract.py`.

The names below load on first use: the command line imports this package to list its
commands, and must not load torch or onnx for that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmserve.export.custom.contract import ContractError, ModelContract, StateSpec
    from lmserve.export.custom.folder import (
        BroughtModel,
        export_module,
        import_onnx,
        import_torchscript,
    )

_WHERE = {
    "ContractError": "contract",
    "ModelContract": "contract",
    "StateSpec": "contract",
    "BroughtModel": "folder",
    "export_module": "folder",
    "import_onnx": "folder",
    "import_torchscript": "folder",
}

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
    import importlib

    if name not in _WHERE:
        raise AttributeError(f"module 'lmserve.export.custom' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lmserve.export.custom.{_WHERE[name]}"), name)
