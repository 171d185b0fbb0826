//! The importer's errors: the file could not be read or decoded, or the model has problems,
//! each one located at the node, input, output or initializer it is about.

use std::fmt;

/// What a [`Problem`] is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// The model as a whole (its opsets, its graph).
    Model,
    /// A node: its name (or `#index` when it has none), op type, domain and the version the
    /// model imports of its domain (`None`: the model imports none).
    Node {
        name: String,
        op_type: String,
        domain: String,
        opset: Option<i64>,
    },
    /// A graph input, by its ONNX name.
    Input(String),
    /// A graph output, by its ONNX name.
    Output(String),
    /// An initializer, by its ONNX name.
    Initializer(String),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Model => f.write_str("model"),
            Subject::Node {
                name,
                op_type,
                domain,
                opset,
            } => {
                let default_domain = domain.is_empty() || domain == "ai.onnx";
                match (default_domain, opset) {
                    (true, Some(v)) => write!(f, "node {name:?} ({op_type}, opset {v})"),
                    (true, None) => write!(f, "node {name:?} ({op_type})"),
                    (false, Some(v)) => {
                        write!(f, "node {name:?} ({domain}.{op_type}, {domain} opset {v})")
                    }
                    (false, None) => write!(f, "node {name:?} ({domain}.{op_type})"),
                }
            }
            Subject::Input(n) => write!(f, "input {n:?}"),
            Subject::Output(n) => write!(f, "output {n:?}"),
            Subject::Initializer(n) => write!(f, "initializer {n:?}"),
        }
    }
}

/// One thing the importer cannot turn into primjit IR, and why: the message names the
/// attribute or input at fault (`attribute auto_pad: ...`, `input 1 (W): ...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub subject: Subject,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}

/// Why a model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The model file could not be read: missing, unreadable, or not a regular file (a
    /// directory, a device, a FIFO); `source` says why. Check the path and its permissions.
    #[error("cannot read `{path}`")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The bytes are not a valid protobuf `ModelProto` (truncated, corrupt, or not ONNX).
    /// `error` is part of the message, not its `source`, so that a chain of causes prints it
    /// once.
    #[error("{file}: not a valid ONNX model: {error}")]
    Decode {
        file: String,
        error: prost::DecodeError,
    },
    /// The model decodes but has parts the importer does not support or that are invalid:
    /// every problem, one per line, each node listed once (`file: node "Resize_42" (Resize,
    /// opset 17): unsupported op`). Nothing has run. Rewrite or re-export those parts.
    #[error("{}", render(file, problems))]
    Problems {
        file: String,
        problems: Vec<Problem>,
    },
}

fn render(file: &str, problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("{file}: {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl OnnxError {
    /// The problems of a [`OnnxError::Problems`], empty for the other variants.
    pub fn problems(&self) -> &[Problem] {
        match self {
            OnnxError::Problems { problems, .. } => problems,
            _ => &[],
        }
    }
}
