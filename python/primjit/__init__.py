"""primjit: a JIT compiler for CNN primitives, with a primitive cache bounded in bytes.

Load a model once, call it on float32 numpy arrays (NCHW)::

    import numpy as np
    import primjit

    engine = primjit.Engine(budget="64MiB")
    model = engine.load("ir/resnet34_trunk.ir", random_params=0)
    y = model(np.zeros((1, 3, 320, 1031), dtype=np.float32))
    print(y.shape, engine.cache_stats()["bytes"])

Every op of the model is compiled to machine code for the shapes it runs at; the engine's
cache keeps the compiled primitives within its byte budget, evicting the least recently used.

Code written for onnxruntime runs with ``import primjit as ort``: InferenceSession,
SessionOptions, get_available_providers (see primjit._session).
"""

from __future__ import annotations

from typing import Any

from ._errors import (
    CompileError,
    ConfigError,
    DescriptorError,
    DtypeError,
    Error,
    ExecError,
    IrError,
    ParamError,
    ShapeError,
)
from ._primjit import Engine, Model, Primitive, __version__
from ._session import (
    InferenceSession,
    ModelMetadata,
    NodeArg,
    RunOptions,
    SessionOptions,
    get_available_providers,
    get_device,
)


def _document_call() -> None:
    # The extension's __call__ is a slot, whose docstring CPython does not show ("Call self as
    # a function."): a Python method with the docstring calls it, so that help() explains it.
    slot = Model.__call__

    def __call__(self: Model, x: Any) -> Any:
        """Runs the model on its single input x, a float32 NCHW numpy array (read in place
        when C-contiguous); returns its output as a float32 array, or a tuple of arrays in the
        graph's order when it has several outputs.

        The GIL is released while the kernels run. Raises ShapeError (the model has several
        inputs: call model.run({name: array}); x's shape does not fit the graph's input; a
        numpy scalar or 0-d array) and DtypeError (x is not float32).
        """
        return slot(self, x)

    __call__.__qualname__ = "Model.__call__"
    __call__.__module__ = "primjit"
    Model.__call__ = __call__  # type: ignore[method-assign, assignment]


_document_call()

__all__ = [
    "__version__",
    "Engine",
    "Model",
    "Primitive",
    "InferenceSession",
    "SessionOptions",
    "RunOptions",
    "NodeArg",
    "ModelMetadata",
    "get_available_providers",
    "get_device",
    "Error",
    "IrError",
    "ParamError",
    "ShapeError",
    "DtypeError",
    "ExecError",
    "DescriptorError",
    "ConfigError",
    "CompileError",
]
