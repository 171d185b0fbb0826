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
"""

from __future__ import annotations

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

__all__ = [
    "__version__",
    "Engine",
    "Model",
    "Primitive",
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
