"""Type stubs of the extension module primjit._primjit (re-exported as primjit)."""

from __future__ import annotations

import os
from typing import Any, Generic, Literal, Mapping, Sequence, Union, final

import numpy as np
import numpy.typing as npt
from typing_extensions import TypeVar

__all__ = ["Engine", "Model", "Primitive", "__version__"]

__version__: str
"""The package's version (the Rust workspace's)."""

_Budget = Union[str, int]
_Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
_F32 = npt.NDArray[np.float32]
_ConvAlgo = Literal["direct", "winograd", "auto"]
_Mode = Literal["exact", "dynamic"]
# What calling a model returns: its output array, for the single-output models that most are;
# a model with several outputs returns a tuple of them (annotate it Model[tuple[...]], or use
# Model.run, which returns them by name).
_Out = TypeVar("_Out", default=_F32)

@final
class Engine:
    """Compiles primitives through a primitive cache bounded in bytes, and runs them on a
    pool of threads. Safe to share between Python threads."""

    def __new__(
        cls,
        budget: _Budget | None = "64MiB",
        capacity: int | None = None,
        threads: int | None = 0,
        verbose: int | None = 0,
        conv_algo: _ConvAlgo | None = "auto",
        workspace_budget: _Budget | None = None,
        max_isa: Literal["x128", "avx2", "avx512"] | None = None,
    ) -> Engine:
        """budget: "64MiB", "512KiB", "1GiB", "unlimited", "0" or a number of bytes;
        capacity: an entry-count bound applied with the budget, or None; threads: threads
        per execution, 0 for one per core, up to 1024; verbose: 1 a stderr line per
        primitive creation and eviction, 2 also per execution; conv_algo: the convolution
        algorithm of the models it loads and the ops it compiles; workspace_budget: the
        activation buffers a model keeps between calls; max_isa: the widest vector tier of
        its kernels, None for the host's widest. None is the default of each. Raises
        ConfigError for a bad value (a bool, a float or an int out of range included, and a
        tier above the host's)."""
    @staticmethod
    def from_env() -> Engine:
        """An engine configured from PRIMJIT_CACHE_BUDGET, PRIMJIT_CACHE_CAPACITY,
        PRIMJIT_WORKSPACE_BUDGET, PRIMJIT_THREADS, PRIMJIT_VERBOSE, PRIMJIT_CONV_ALGO,
        PRIMJIT_PERF_MAP, PRIMJIT_COMPILE_AHEAD and PRIMJIT_MAX_ISA, as the command line's."""
    def load(
        self,
        path: _Path,
        params: _Path | Mapping[str, _F32] | None = None,
        mode: _Mode | None = "exact",
        *,
        random_params: int | None = None,
    ) -> Model:
        """Loads an IR or ONNX model (told apart by content) with its parameters (a
        .safetensors or .npz file, a dict of float32 arrays by parameter name, or None for a
        graph without parameters or an ONNX model's initializers; random_params draws them
        from a seed, an int from 0 to 2**64 - 1). Paths are str, bytes or os.PathLike.
        Overrides of an ONNX model's initializers must name its parameters (ParamError);
        tensors an IR graph does not use are ignored with a UserWarning. Raises IrError,
        ParamError, ConfigError, OSError, or TypeError for a path of another type."""
    def load_bytes(
        self,
        data: bytes,
        params: _Path | Mapping[str, _F32] | None = None,
        mode: _Mode | None = "exact",
        *,
        random_params: int | None = None,
    ) -> Model:
        """Loads a model from its bytes (ONNX, or IR text in UTF-8), as load loads a file.
        Raises TypeError when data is not bytes, and what load raises."""
    def compile_op(
        self,
        descriptor: str,
        *,
        pool: Literal["max", "avg_np", "avg_p"] | None = None,
        layout: Literal["nchw", "nchw4c", "nChw4c"] | None = "nchw",
        conv_algo: _ConvAlgo | None = None,
    ) -> Primitive:
        """Compiles one primitive from a benchdnn descriptor
        ("mb1ic64ih80iw80oc64oh80ow80kh3kw3sh1sw1ph1pw1"): a convolution with bias (its
        algorithm conv_algo, None for the engine's), or a pooling with pool=. Raises
        DescriptorError (also for a descriptor that is not a str) or ConfigError."""
    @property
    def isa(self) -> Literal["x128", "avx2", "avx512"]:
        """The widest vector tier of this engine's kernels."""
    def cache_stats(self) -> dict[str, Any]:
        """The cache's counters: entries, bytes, peak_bytes, mapped_bytes, budget (None when
        unlimited), capacity, hits, misses, evictions, evicted_bytes, compiles,
        prefetched (compiled ahead of their first lookup, PRIMJIT_COMPILE_AHEAD),
        failed_compiles, compile_time_s, max_compile_time_s."""
    def cache_entries(self) -> list[dict[str, Any]]:
        """The cache's entries, most recently used first: key, bytes, code_bytes,
        mapped_bytes, heap_bytes, hits, idle_s (seconds since last use), compile_time_s."""
    def set_budget(self, budget: _Budget) -> None:
        """Changes the byte budget, evicting at once what no longer fits."""
    def set_capacity(self, capacity: int | None) -> None:
        """Changes the entry-count bound (None: none), evicting at once what no longer fits."""
    def clear(self) -> None:
        """Drops every cached primitive (not counted as evictions)."""
    @property
    def budget(self) -> str:
        """The byte budget: "64MiB", "unlimited", ..."""
    @property
    def capacity(self) -> int | None:
        """The entry-count bound, or None."""
    @property
    def workspace_budget(self) -> str:
        """The activation buffers a model keeps between calls, as budget is shown."""
    @property
    def threads(self) -> int:
        """The threads each execution runs on."""
    @property
    def conv_algo(self) -> Literal["direct", "winograd", "auto"]:
        """The convolution algorithm choice."""

@final
class Model(Generic[_Out]):
    """A model loaded by Engine.load. float32 NCHW arrays in (read in place when
    C-contiguous), new float32 arrays out; the GIL is released while kernels run."""

    def __call__(self, x: _F32) -> _Out:
        """Runs the model on its single input: its output, or a tuple of its outputs when it
        has several (typed as Model's parameter, an array unless annotated otherwise).
        Raises ShapeError (also for a numpy scalar or a 0-d array) or DtypeError."""
    def run(self, inputs: Mapping[str, _F32]) -> dict[str, _F32]:
        """Runs the model on inputs by name; returns its outputs by name. Raises ShapeError
        (also for inputs that are not a mapping of str to arrays) or DtypeError."""
    @property
    def inputs(self) -> dict[str, list[int | str]]:
        """The inputs' declared shapes; symbolic dimensions are strings."""
    @property
    def outputs(self) -> list[str]:
        """The output names, in order."""
    @property
    def output_shapes(self) -> dict[str, list[int | str]]:
        """The outputs' shapes; extents that depend on a symbol are strings."""
    @property
    def file_names(self) -> dict[str, str]:
        """The model file's name of each input and output, by the graph's name."""
    @property
    def metadata(self) -> dict[str, Any]:
        """producer_name, producer_version, graph_name, domain, description,
        graph_description, version, custom_metadata_map."""
    @property
    def conv_algo(self) -> Literal["direct", "winograd", "auto"]:
        """The convolution algorithm choice the model was compiled with."""
    @property
    def mode(self) -> Literal["exact", "dynamic"]:
        """The shape mode the model was loaded with."""
    @property
    def path(self) -> str:
        """The file the model was loaded from."""

@final
class Primitive:
    """One compiled primitive (Engine.compile_op), run on float32 numpy buffers checked
    against its key before any code runs."""

    @property
    def key(self) -> str:
        """The compiled key; `*` marks an extent left to run time."""
    @property
    def problem(self) -> str:
        """The key at the descriptor's extents."""
    @property
    def name(self) -> str | None:
        """The descriptor's label, n"..."."""
    @property
    def compile_time(self) -> float:
        """Seconds the primitive took to compile."""
    @property
    def scratch_len(self) -> int:
        """Floats of working memory one thread needs; 0 for none."""
    @property
    def flops(self) -> int:
        """Floating-point operations of one execution."""
    def memory(self) -> dict[str, int]:
        """Bytes held: code, mapped, heap, total (mapped plus heap)."""
    def buffers(self) -> list[dict[str, Any]]:
        """The buffers execute takes: role, shape, layout, len."""
    def pack_weights(self, weights: _F32, bias: _F32 | None = None) -> _F32:
        """A convolution's OIHW weights and bias packed for its kernel. Raises ExecError or
        DtypeError."""
    def execute(
        self,
        src: _F32,
        dst: _F32,
        weights: _F32 | None = None,
        extra: Sequence[_F32] | None = (),
        scratch: _F32 | None = None,
    ) -> None:
        """Reads src (weights, extra: a list or tuple, None for none), writes dst in place;
        scratch, when the primitive takes one, is allocated for the call unless given. dst
        and scratch may not share memory with another buffer of the call. Raises ExecError
        or DtypeError; a rejected call writes nothing."""
