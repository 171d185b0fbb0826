//! The runtime's errors: configuration, compilation, mapping and execution.

use primjit_codegen::CodegenError;

/// A buffer passed to `Primitive::execute` that does not match the primitive's key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("{key}: the {role} buffer holds {found} floats but shape {shape:?} needs {expected}")]
    BufferLength {
        key: String,
        role: &'static str,
        expected: usize,
        found: usize,
        shape: Vec<usize>,
    },
    #[error("{key}: the {role} buffer is missing")]
    MissingBuffer { key: String, role: &'static str },
    #[error("{key}: this primitive takes no {role} buffer")]
    UnexpectedBuffer { key: String, role: &'static str },
    #[error("{key}: work items {start}..{end} are not within 0..{limit}")]
    WorkItems {
        key: String,
        start: usize,
        end: usize,
        limit: usize,
    },
    #[error("{key}: extents {extents:?} are not valid for this primitive: {reason}")]
    Extents {
        key: String,
        extents: [usize; 2],
        reason: String,
    },
    #[error("{key}: expected {expected} extra buffers (residuals or second source), found {found}")]
    ExtraCount {
        key: String,
        expected: usize,
        found: usize,
    },
}

/// A bad configuration value, from the environment or the API.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}={value}: {reason}")]
    Invalid {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("the thread pool could not be created: {0}")]
    ThreadPool(String),
}

/// Any error of compiling or running a primitive.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    #[error("mapping executable pages for {key} failed: {message}")]
    Map { key: String, message: String },
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}
