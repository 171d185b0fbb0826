"""An onnxruntime-style session over primjit's Engine and Model.

Code written for onnxruntime runs after swapping ``import onnxruntime as ort`` for
``import primjit as ort``::

    s = ort.InferenceSession(open("model.onnx", "rb").read())
    y = s.run(None, {s.get_inputs()[0].name: x})[0]

Names are the model file's (an ONNX model's ``"input.1"``), outputs are float32 numpy arrays
in the order asked for. Each session has an engine of its own, configured from its
SessionOptions.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from ._errors import ShapeError
from ._primjit import Engine, Model

__all__ = [
    "InferenceSession",
    "SessionOptions",
    "RunOptions",
    "NodeArg",
    "ModelMetadata",
    "get_available_providers",
    "get_device",
]

CPU_PROVIDER = "CPUExecutionProvider"

_F32 = npt.NDArray[np.float32]
_Provider = Union[str, Tuple[str, Dict[str, Any]]]


def get_available_providers() -> List[str]:
    """The execution providers primjit has: the CPU's alone."""
    return [CPU_PROVIDER]


def get_device() -> str:
    """The device primjit runs on: "CPU"."""
    return "CPU"


class SessionOptions:
    """A session's settings: onnxruntime's that apply to primjit, and primjit's own.

    intra_op_num_threads: threads per call, 0 (the default) for one per core, up to 1024.
    cache_budget: the byte budget of the session's primitive cache ("64MiB", "unlimited", a
        number of bytes).
    workspace_budget: the activation buffers kept between calls (same forms), None for the
        built-in default.
    conv_algo: "auto" (Winograd where it is faster), "direct" or "winograd".
    shape_mode: "dynamic" (the default: one primitive serves every value of a symbolic
        extent) or "exact" (one per shape).

    onnxruntime's other settings (inter_op_num_threads, graph_optimization_level,
    execution_mode, log_severity_level, ...) are accepted and have no effect; setting a name
    that neither has raises AttributeError, so that a typo does not pass unseen.
    """

    _SETTINGS = frozenset(
        (
            "intra_op_num_threads",
            "cache_budget",
            "workspace_budget",
            "conv_algo",
            "shape_mode",
            # onnxruntime's, without effect here.
            "inter_op_num_threads",
            "graph_optimization_level",
            "execution_mode",
            "log_severity_level",
            "log_verbosity_level",
            "logid",
            "enable_cpu_mem_arena",
            "enable_mem_pattern",
            "enable_mem_reuse",
            "enable_profiling",
            "optimized_model_filepath",
            "use_deterministic_compute",
        )
    )

    def __setattr__(self, name: str, value: Any) -> None:
        """Sets a setting; a name that is none raises AttributeError (a typo)."""
        if name not in self._SETTINGS:
            raise AttributeError(f"SessionOptions has no setting {name!r}")
        object.__setattr__(self, name, value)

    def __init__(self) -> None:
        self.intra_op_num_threads: int = 0
        self.cache_budget: Union[str, int] = "64MiB"
        self.workspace_budget: Union[str, int, None] = None
        self.conv_algo: str = "auto"
        self.shape_mode: str = "dynamic"
        self.inter_op_num_threads: int = 0
        self.graph_optimization_level: Any = None
        self.execution_mode: Any = None
        self.log_severity_level: int = 2
        self.log_verbosity_level: int = 0
        self.logid: str = ""
        self.enable_cpu_mem_arena: bool = True
        self.enable_mem_pattern: bool = True
        self.enable_mem_reuse: bool = True
        self.enable_profiling: bool = False
        self.optimized_model_filepath: str = ""
        self.use_deterministic_compute: bool = False


class RunOptions:
    """Accepted by InferenceSession.run for onnxruntime's code; its settings have no effect."""

    def __init__(self) -> None:
        self.log_severity_level: int = 2
        self.log_verbosity_level: int = 0
        self.logid: str = ""
        self.terminate: bool = False


class NodeArg:
    """An input or output of a session: name (the model file's), shape (ints, and strings for
    symbolic extents) and type ("tensor(float)")."""

    def __init__(self, name: str, shape: List[Union[int, str]], type: str) -> None:
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """What a model says about itself, as onnxruntime's ModelMetadata: producer_name,
    graph_name, domain, description, graph_description, version and custom_metadata_map.
    IR files give their graph's name alone."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.producer_name: str = fields["producer_name"]
        self.producer_version: str = fields["producer_version"]
        self.graph_name: str = fields["graph_name"]
        self.domain: str = fields["domain"]
        self.description: str = fields["description"]
        self.graph_description: str = fields["graph_description"]
        self.version: int = fields["version"]
        self.custom_metadata_map: Dict[str, str] = dict(fields["custom_metadata_map"])

    def __repr__(self) -> str:
        return (
            f"ModelMetadata(producer_name={self.producer_name!r}, "
            f"graph_name={self.graph_name!r}, version={self.version})"
        )


def _provider_names(providers: Optional[Sequence[_Provider]]) -> List[str]:
    if providers is None:
        return [CPU_PROVIDER]
    if isinstance(providers, (str, bytes)):
        raise TypeError("providers: expected a list of provider names, found a str")
    names = []
    for p in providers:
        name = p[0] if isinstance(p, tuple) else p
        if not isinstance(name, str):
            raise TypeError(f"providers: expected provider names (str), found {type(name).__name__}")
        names.append(name)
    others = [n for n in names if n != CPU_PROVIDER]
    if others:
        # onnxruntime falls back to the CPU for a provider it lacks, with a warning: the
        # common `providers=["CUDAExecutionProvider", "CPUExecutionProvider"]` must run.
        warnings.warn(
            f"primjit runs on the CPU only: {', '.join(others)} ignored, "
            f"running on {CPU_PROVIDER}",
            RuntimeWarning,
            stacklevel=3,
        )
    return [CPU_PROVIDER]


class InferenceSession:
    """A model loaded for inference, as onnxruntime's InferenceSession.

    path_or_bytes: the model, a path (str or os.PathLike) or its bytes; ONNX or primjit IR,
        told apart by content.
    sess_options: a SessionOptions, or None for the defaults.
    providers: execution providers; "CPUExecutionProvider" is the only one, others are
        ignored with a RuntimeWarning (onnxruntime falls back to the CPU in the same way).
    params: primjit's own: parameter values over the model's (a .safetensors or .npz path,
        or a dict of float32 arrays by parameter name), as Engine.load takes them.

    A session may be called from several Python threads at once (calls release the GIL); see
    Model for how calls share the engine.
    """

    def __init__(
        self,
        path_or_bytes: Union[str, bytes, "os.PathLike[str]"],
        sess_options: Optional[SessionOptions] = None,
        providers: Optional[Sequence[_Provider]] = None,
        provider_options: Optional[Sequence[Dict[str, Any]]] = None,
        *,
        params: Any = None,
    ) -> None:
        options = sess_options if sess_options is not None else SessionOptions()
        if not isinstance(options, SessionOptions):
            raise TypeError(
                f"sess_options: expected a primjit.SessionOptions, found {type(options).__name__}"
            )
        self._providers = _provider_names(providers)
        self._options = options
        self._engine = Engine(
            budget=options.cache_budget,
            threads=options.intra_op_num_threads,
            conv_algo=options.conv_algo,  # type: ignore[arg-type]
            workspace_budget=options.workspace_budget,
        )
        mode = options.shape_mode
        self._model_path: Optional[str] = None
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            self._model = self._engine.load_bytes(bytes(path_or_bytes), params, mode)  # type: ignore[arg-type]
        else:
            self._model = self._engine.load(path_or_bytes, params, mode)  # type: ignore[arg-type]
            self._model_path = os.fsdecode(path_or_bytes)
        model = self._model
        names = model.file_names
        # The file's names (onnxruntime's) to the graph's, inputs and outputs apart.
        self._input_ir = {names[n]: n for n in model.inputs}
        self._output_ir = {names[n]: n for n in model.outputs}
        self._inputs = [
            NodeArg(names[n], list(shape), "tensor(float)") for n, shape in model.inputs.items()
        ]
        out_shapes = model.output_shapes
        self._outputs = [
            NodeArg(names[n], list(out_shapes[n]), "tensor(float)") for n in model.outputs
        ]
        self._meta = ModelMetadata(model.metadata)

    @property
    def model(self) -> Model:
        """The primjit.Model the session runs."""
        return self._model

    @property
    def engine(self) -> Engine:
        """The session's primjit.Engine (its cache, its threads)."""
        return self._engine

    def get_inputs(self) -> List[NodeArg]:
        """The model's inputs, in order: name, shape and type ("tensor(float)")."""
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        """The model's outputs, in order: name, shape and type ("tensor(float)")."""
        return list(self._outputs)

    def get_overridable_initializers(self) -> List[NodeArg]:
        """None: initializers are packed when the model loads (give params= instead)."""
        return []

    def get_modelmeta(self) -> ModelMetadata:
        """What the model says about itself (ModelMetadata)."""
        return self._meta

    def get_providers(self) -> List[str]:
        """The providers the session runs on: ["CPUExecutionProvider"]."""
        return list(self._providers)

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        """Each provider's options: none."""
        return {p: {} for p in self._providers}

    def get_session_options(self) -> SessionOptions:
        """The SessionOptions the session was made with."""
        return self._options

    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Mapping[str, Any],
        run_options: Optional[RunOptions] = None,
    ) -> List[_F32]:
        """Runs the model: input_feed maps input names to float32 arrays; returns the outputs
        named in output_names (None for all) as a list of float32 arrays, in that order.

        Raises ShapeError (an unknown or missing input, an unknown output name, a shape that
        does not fit) and DtypeError (an input that is not float32), as Model.run does.
        """
        if not isinstance(input_feed, Mapping):
            raise ShapeError(
                f"input_feed: expected a dict of arrays by input name, found {type(input_feed).__name__}"
            )
        feed: Dict[str, Any] = {}
        for name, value in input_feed.items():
            ir = self._input_ir.get(name, name) if isinstance(name, str) else name
            feed[ir] = value
        if output_names is None:
            wanted = list(self._model.outputs)
        else:
            if isinstance(output_names, str):
                raise ShapeError("output_names: expected a list of output names or None, found a str")
            wanted = []
            for name in output_names:
                out = self._output_ir.get(name) if isinstance(name, str) else None
                if out is None:
                    known = ", ".join(o.name for o in self._outputs)
                    raise ShapeError(f"output_names: {name!r} is not an output of the model ({known})")
                wanted.append(out)
        outputs = self._model.run(feed)
        return [outputs[n] for n in wanted]

    def run_with_ort_values(self, *args: Any, **kwargs: Any) -> Any:
        """Not supported: primjit takes and returns numpy arrays (use run)."""
        raise NotImplementedError("primjit sessions take and return numpy arrays: use run()")

    def __repr__(self) -> str:
        where = self._model_path if self._model_path is not None else "<bytes>"
        return f"primjit.InferenceSession({where!r})"
