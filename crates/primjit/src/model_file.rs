//! Models from a file or from bytes, their format told from the content, not the name: an ONNX
//! model (protobuf) or the IR's text.
//!
//! Every tool that takes a model (the command line, the Python package) reads it here, so that
//! a model loads the same way whatever its suffix and wherever it comes from.

use std::io::Read;
use std::path::Path;

use primjit_ir::{Graph, IrError};
use primjit_onnx::{Imported, Metadata, OnnxError};
pub use prost::bytes::Bytes;

/// A model's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFormat {
    /// An ONNX `ModelProto`, imported ([`primjit_onnx`]).
    Onnx,
    /// The IR's text format ([`crate::ir::parse`]).
    Ir,
}

/// How many leading bytes [`sniff_model`] looks at.
const SNIFF_BYTES: usize = 4096;

/// Tells an ONNX model from IR text by its first bytes: IR text has no control characters but
/// tab, newline, carriage return and form feed, while every ONNX model has them (the key of
/// `ir_version`, 0x08, comes first; every node's output key is 0x12).
pub fn sniff_model(bytes: &[u8]) -> ModelFormat {
    let head = &bytes[..bytes.len().min(SNIFF_BYTES)];
    let binary = head
        .iter()
        .any(|&b| (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0c)) || b == 0x7f);
    if binary {
        ModelFormat::Onnx
    } else {
        ModelFormat::Ir
    }
}

/// Why a model could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read (missing, unreadable, or not a regular file); `source` says
    /// why.
    #[error("cannot read `{origin}`")]
    Read {
        origin: String,
        #[source]
        source: std::io::Error,
    },
    /// The content looks like text but is not UTF-8, as IR text must be.
    #[error("`{origin}` is neither an ONNX model nor IR text: it is not UTF-8 at byte {offset}")]
    NotUtf8 { origin: String, offset: usize },
    /// An ONNX model that does not decode or import; see [`OnnxError`].
    #[error(transparent)]
    Onnx(#[from] OnnxError),
}

/// A model read from a file or bytes: its IR text (an ONNX model's is its imported graph,
/// printed) and, for an ONNX model, what the importer made of it.
#[derive(Debug)]
pub struct ModelSource {
    /// The file, as given, or `<bytes>`.
    pub origin: String,
    pub text: String,
    pub onnx: Option<Imported>,
}

impl ModelSource {
    /// Reads the model at `path`, an ONNX model or IR text whatever its name. A path that is
    /// not a regular file (a directory, a device, a FIFO) is an error, not read.
    pub fn read(path: &Path) -> Result<Self, ModelError> {
        let origin = path.display().to_string();
        let read_error = |source| ModelError::Read {
            origin: origin.clone(),
            source,
        };
        let mut head = Vec::with_capacity(SNIFF_BYTES);
        crate::file::open_regular(path)
            .and_then(|f| f.take(SNIFF_BYTES as u64).read_to_end(&mut head))
            .map_err(read_error)?;
        match sniff_model(&head) {
            ModelFormat::Onnx => {
                // Mapped, its weights borrowed until they are parameters (see import_file).
                let imported = primjit_onnx::import_file(path)?;
                Ok(Self::imported(origin, imported))
            }
            ModelFormat::Ir => {
                let mut bytes = Vec::new();
                crate::file::open_regular(path)
                    .and_then(|mut f| f.read_to_end(&mut bytes))
                    .map_err(read_error)?;
                Self::text(origin, bytes)
            }
        }
    }

    /// A model from its bytes; `origin` names it in errors (`<bytes>`). An ONNX model with
    /// external data is an error: there is no folder to find it in.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Self, ModelError> {
        match sniff_model(bytes) {
            ModelFormat::Onnx => {
                let imported = primjit_onnx::import_bytes(bytes, origin, None)?;
                Ok(Self::imported(origin.to_string(), imported))
            }
            ModelFormat::Ir => Self::text(origin.to_string(), bytes.to_vec()),
        }
    }

    /// [`Self::from_bytes`] on a buffer the model may borrow from while it is imported (a
    /// buffer that the caller holds anyway): an ONNX model's weights are not copied before
    /// they become parameters.
    pub fn from_shared(bytes: Bytes, origin: &str) -> Result<Self, ModelError> {
        match sniff_model(&bytes) {
            ModelFormat::Onnx => {
                let imported = primjit_onnx::import_shared(bytes, origin, None)?;
                Ok(Self::imported(origin.to_string(), imported))
            }
            ModelFormat::Ir => Self::text(origin.to_string(), bytes.to_vec()),
        }
    }

    fn imported(origin: String, imported: Imported) -> Self {
        ModelSource {
            origin,
            text: imported.graph.to_string(),
            onnx: Some(imported),
        }
    }

    fn text(origin: String, bytes: Vec<u8>) -> Result<Self, ModelError> {
        let text = String::from_utf8(bytes).map_err(|e| ModelError::NotUtf8 {
            origin: origin.clone(),
            offset: e.utf8_error().valid_up_to(),
        })?;
        Ok(ModelSource {
            origin,
            text,
            onnx: None,
        })
    }

    pub fn format(&self) -> ModelFormat {
        match self.onnx {
            Some(_) => ModelFormat::Onnx,
            None => ModelFormat::Ir,
        }
    }

    /// The model's graph: an ONNX model's imported graph, or the IR text parsed (not yet
    /// verified). An IR error renders against its `text` ([`IrError::render`]).
    pub fn graph(&self) -> Result<Graph, IrError> {
        match &self.onnx {
            Some(imported) => Ok(imported.graph.clone()),
            None => Ok(crate::ir::parse(&self.text)?),
        }
    }

    /// What the model says about itself: an ONNX model's metadata; for IR text, the graph's
    /// name alone.
    pub fn metadata(&self, graph: &Graph) -> Metadata {
        match &self.onnx {
            Some(imported) => imported.metadata.clone(),
            None => Metadata {
                graph_name: graph.name().to_string(),
                ..Metadata::default()
            },
        }
    }
}
