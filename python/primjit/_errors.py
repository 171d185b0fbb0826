"""The exceptions primjit raises; each carries the Rust library's message.

Every one derives from :class:`primjit.Error`, and from ``ValueError`` or ``TypeError`` where
the fault is in a value or type the caller passed, so that ``except ValueError`` keeps working
around primjit calls. An argument of the wrong type raises the exception of what it is for
(a ``threads`` that is a float is a ``ConfigError``, an ``inputs`` that is a list a
``ShapeError``), its message starting with the argument's name. Files that cannot be read
raise the built-in ``OSError`` subclasses (``FileNotFoundError``, ``PermissionError``, ...),
with the file name; a file that is not a regular file (a directory, a device such as
``/dev/zero``, a FIFO) is refused before it is opened with an ``OSError`` whose message names
it (``cannot read `PATH`: it is a FIFO, not a regular file``); a path that is not a ``str``,
``bytes`` or ``os.PathLike`` the built-in ``TypeError``.
"""

from __future__ import annotations

__all__ = [
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


class Error(Exception):
    """The base of every primjit exception."""


class IrError(Error, ValueError):
    """A model file that does not parse or verify, located in the file.

    The message is the command line's: ``file:line:col: error: message``, the line and a
    caret. Also raised for an ONNX model that does not import (malformed, or with
    unsupported nodes, each listed).
    """


class ParamError(Error, ValueError):
    """A parameter that is missing, of the wrong shape or dtype, or a parameter file that is
    not a safetensors file; also ``params`` omitted for a graph that has parameters, given
    together with ``random_params``, or neither a path nor a dict; a ``random_params`` that is
    not a seed (an int from 0 to 2**64 - 1, not a bool)."""


class ShapeError(Error, ValueError):
    """Inputs that do not fit the graph: an unknown or missing input name, a rank, channel
    count or extent the graph does not accept (a numpy scalar or a 0-d array included), or a
    shape too large for a primitive; also a single-argument call of a model with several
    inputs, and ``Model.run`` given something other than a dict of arrays by input name."""


class DtypeError(Error, TypeError):
    """An argument that is not a float32 numpy array (other dtypes are refused rather than
    converted: convert with ``.astype(numpy.float32)``; a numpy scalar is read as the 0-d array
    it stands for), or a destination that cannot be written in place (not C-contiguous, not
    aligned)."""


class ExecError(Error, ValueError):
    """Buffers that do not match a primitive (``Primitive.execute``, ``pack_weights``): a
    wrong length, a missing or unexpected buffer, the wrong number of extra buffers or an
    ``extra`` that is not a list or tuple, a destination (``dst``, ``scratch``) that shares
    memory with another buffer of the call, is read-only or a numpy scalar. Nothing is
    written. Also an array that another call still running writes (or, to be written,
    uses): an ``execute`` in another thread."""


class DescriptorError(Error, ValueError):
    """A benchdnn descriptor (``Engine.compile_op``) that is not a ``str``, does not parse,
    misses an entry, or describes a problem that cannot exist (an empty output, a window
    larger than the padded input, groups that do not divide the channels, ...)."""


class ConfigError(Error, ValueError):
    """A bad setting: a budget, capacity, thread count, verbosity, mode, layout, pooling or
    convolution algorithm that is not one of the accepted values (or of their type), or a
    malformed ``PRIMJIT_*`` variable
    (``Engine.from_env``); also a run in a child of ``fork``, which inherits the engine but
    not its threads (create a new engine in the child)."""


class CompileError(Error, RuntimeError):
    """A primitive that could not be compiled or placed in executable pages, or a model's
    packed weights that could not be mapped (for example at ``vm.max_map_count``, or out of
    memory). Nothing is cached; a later call may succeed."""
