//! Rust errors as the package's Python exceptions, each carrying the Rust message.
//!
//! The exception classes are defined in Python (`primjit/_errors.py`), where a class can derive
//! from both `primjit.Error` and `ValueError`; this module looks them up by name when it raises
//! one. Which class an error becomes depends on where it happens as much as on its Rust type: a
//! `VerifyError` while loading is a bad graph (`IrError`), while running it is a bad input
//! (`ShapeError`).

use std::path::Path;

use primjit::descriptor::DescriptorError;
use primjit::model_file::ModelError;
use primjit::onnx::OnnxError;
use primjit::params_file::ParamFileError;
use primjit::{GraphError, IrError, RuntimeError};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// The package's exception classes (see `primjit/_errors.py` for when each is raised).
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Ir,
    Param,
    Shape,
    Dtype,
    Exec,
    Descriptor,
    Config,
    Compile,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Ir => "IrError",
            Kind::Param => "ParamError",
            Kind::Shape => "ShapeError",
            Kind::Dtype => "DtypeError",
            Kind::Exec => "ExecError",
            Kind::Descriptor => "DescriptorError",
            Kind::Config => "ConfigError",
            Kind::Compile => "CompileError",
        }
    }
}

/// A `primjit.<kind>` exception with `message`.
pub fn error(py: Python<'_>, kind: Kind, message: impl Into<String>) -> PyErr {
    let class = py
        .import("primjit._errors")
        .and_then(|m| m.getattr(kind.class_name()))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(class) => PyErr::from_type(class, message.into()),
        // The package's own module is missing or broken: say so rather than hide it.
        Err(e) => e,
    }
}

/// An `OSError` for a file that could not be read: `OSError(errno, strerror, filename)`, which
/// Python turns into `FileNotFoundError`, `PermissionError`, ... by the errno.
pub fn os_error(py: Python<'_>, path: &Path, e: &std::io::Error) -> PyErr {
    let filename = path.display().to_string();
    match e.raw_os_error() {
        Some(errno) => {
            let strerror = py
                .import("os")
                .and_then(|os| os.call_method1("strerror", (errno,)))
                .and_then(|s| s.extract::<String>())
                .unwrap_or_else(|_| e.to_string());
            PyOSError::new_err((errno, strerror, filename))
        }
        None => PyOSError::new_err(format!("cannot read `{filename}`: {e}")),
    }
}

/// An IR error rendered against its file, as the CLI prints it: `file:line:col: error: ...`,
/// the line and a caret.
pub fn ir_error(py: Python<'_>, e: impl Into<IrError>, file: &str, text: &str) -> PyErr {
    error(py, Kind::Ir, e.into().render(file, text))
}

/// A runtime error: a bad primitive argument is an `ExecError`, everything else (compiling,
/// mapping pages, the thread pool, perf's map file) a `CompileError` or `ConfigError`.
pub fn runtime_error(py: Python<'_>, e: RuntimeError) -> PyErr {
    let kind = match &e {
        RuntimeError::Exec(_) => Kind::Exec,
        RuntimeError::Config(_) | RuntimeError::PerfMap { .. } | RuntimeError::Tier { .. } => {
            Kind::Config
        }
        RuntimeError::Codegen(_) | RuntimeError::Map { .. } => Kind::Compile,
    };
    error(py, kind, e.to_string())
}

/// An error of running a graph on inputs: inputs that do not fit the graph (unknown, missing,
/// of the wrong shape, or of a shape that makes an invalid primitive) are `ShapeError`s.
pub fn run_error(py: Python<'_>, e: GraphError) -> PyErr {
    match e {
        GraphError::Verify(_) | GraphError::InputData { .. } | GraphError::Unbound { .. } => {
            error(py, Kind::Shape, e.to_string())
        }
        GraphError::Runtime(RuntimeError::Codegen(primjit::CodegenError::InvalidKey(_))) => {
            error(py, Kind::Shape, e.to_string())
        }
        GraphError::Param(_) => error(py, Kind::Param, e.to_string()),
        GraphError::Runtime(r) => runtime_error(py, r),
        GraphError::Weights(_) | GraphError::Workspace { .. } => {
            error(py, Kind::Compile, e.to_string())
        }
        GraphError::OutputCount { .. } => error(py, Kind::Exec, e.to_string()),
    }
}

/// An error of preparing a graph (`Engine.load`): an invalid graph is an `IrError` located in
/// its file, a missing or mis-shaped parameter a `ParamError`.
pub fn load_error(py: Python<'_>, e: GraphError, file: &str, text: &str) -> PyErr {
    match e {
        GraphError::Verify(v) => ir_error(py, v, file, text),
        GraphError::Param(_) => error(py, Kind::Param, e.to_string()),
        GraphError::Runtime(r) => runtime_error(py, r),
        GraphError::InputData { .. } | GraphError::Unbound { .. } => {
            error(py, Kind::Shape, e.to_string())
        }
        GraphError::Weights(_) | GraphError::Workspace { .. } => {
            error(py, Kind::Compile, e.to_string())
        }
        GraphError::OutputCount { .. } => error(py, Kind::Exec, e.to_string()),
    }
}

/// A model that could not be read: an unreadable file is an `OSError`, the rest (not a model,
/// an ONNX model that does not decode or import) `IrError`s.
pub fn model_error(py: Python<'_>, path: Option<&Path>, e: ModelError) -> PyErr {
    match (&e, path) {
        (ModelError::Read { source, .. }, Some(path))
        | (ModelError::Onnx(OnnxError::Read { source, .. }), Some(path)) => {
            os_error(py, path, source)
        }
        _ => error(py, Kind::Ir, e.to_string()),
    }
}

/// A parameter file's error: an unreadable file is an `OSError`, the rest `ParamError`s.
pub fn param_file_error(py: Python<'_>, path: &Path, e: ParamFileError) -> PyErr {
    match &e {
        ParamFileError::Read { source, .. } => os_error(py, path, source),
        _ => error(py, Kind::Param, e.to_string()),
    }
}

pub fn descriptor_error(py: Python<'_>, e: DescriptorError) -> PyErr {
    error(py, Kind::Descriptor, e.to_string())
}
