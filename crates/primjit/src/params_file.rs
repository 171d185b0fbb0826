//! Parameter values from `.safetensors` files: the tensors named as a graph's parameters.

use std::path::Path;

use primjit_ir::{Graph, Params, Tensor};
use safetensors::{Dtype, SafeTensors};

/// Why a graph's parameters could not be read from a `.safetensors` file
/// ([`read_safetensors`], [`safetensors_params`]). `origin` is the file, as given.
#[derive(Debug, thiserror::Error)]
pub enum ParamFileError {
    /// The file could not be read (missing, unreadable, or not a regular file: a directory, a
    /// device, a FIFO, which [`crate::file::NotRegularFile::in_error`] finds in `source`);
    /// `source` says why.
    #[error("cannot read `{origin}`")]
    Read {
        origin: String,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a safetensors file (a bad header, truncated data).
    #[error("`{origin}` is not a safetensors file: {message}")]
    Format { origin: String, message: String },
    /// A parameter the graph declares has no tensor of its name (without the `@`) in the file.
    #[error("parameter @{name} is missing from `{origin}` (expected shape {expected:?})")]
    Missing {
        origin: String,
        name: String,
        expected: Vec<usize>,
    },
    /// The parameter's tensor is not F32; convert it when writing the file.
    #[error("parameter @{name} in `{origin}` has dtype {dtype}; only F32 is supported")]
    Dtype {
        origin: String,
        name: String,
        dtype: String,
    },
    /// The parameter's tensor has another shape than the graph declares.
    #[error(
        "parameter @{name} has shape {found:?} in `{origin}` but the graph declares {expected:?}"
    )]
    Shape {
        origin: String,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
}

/// Reads the values of `graph`'s declared (non-derived) parameters from a safetensors file,
/// which must be a regular file ([`crate::file::open_regular`]).
///
/// Tensors are named as the parameters without the `@`; the file may hold others (a full
/// model's state dict for a graph of part of it), which are ignored, whatever their dtype. A
/// parameter missing from the file takes its value from `fallback` (an ONNX model's
/// initializers) when that has one.
///
/// The file is mapped, not read into memory: the parameters' values are converted from the
/// mapping, which is gone when this returns, so the file's bytes are never a second copy of
/// the weights on the heap (and tensors the graph does not use are never read). So the file
/// must not be truncated or rewritten while this runs, as for every loader that maps its
/// weights: a checkpoint saved over it at that moment can end the process with `SIGBUS`. Where
/// that can happen, read the file and pass its bytes to [`safetensors_params`].
pub fn read_safetensors(
    path: &Path,
    graph: &Graph,
    fallback: Option<&Params>,
) -> Result<Params, ParamFileError> {
    let origin = path.display().to_string();
    let read_error = |source| ParamFileError::Read {
        origin: origin.clone(),
        source,
    };
    // Not a device such as `/dev/zero`, whose map would be empty or endless, nor a FIFO,
    // whose opening blocks until a writer comes.
    let file = crate::file::open_regular(path).map_err(read_error)?;
    #[allow(unsafe_code)]
    // SAFETY: the map is read-only and private to this function, which copies the values out
    // before returning and drops it. memmap2 requires that the file not be truncated or
    // modified by another process while mapped: a parameter file is not written while a model
    // is loaded from it (as for every loader that maps weights).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read_error)?;
    safetensors_params(&map, &origin, graph, fallback)
}

/// [`read_safetensors`] on the file's bytes; `origin` names the file in errors.
pub fn safetensors_params(
    bytes: &[u8],
    origin: &str,
    graph: &Graph,
    fallback: Option<&Params>,
) -> Result<Params, ParamFileError> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| ParamFileError::Format {
        origin: origin.to_string(),
        message: e.to_string(),
    })?;
    let mut params = Params::new();
    for (_, param) in graph.params() {
        if param.derived.is_some() {
            continue;
        }
        let name = &param.name;
        let Ok(view) = file.tensor(name) else {
            if let Some(t) = fallback.and_then(|f| f.get(name)) {
                params.insert(name.clone(), t.clone());
                continue;
            }
            return Err(ParamFileError::Missing {
                origin: origin.to_string(),
                name: name.clone(),
                expected: param.shape.clone(),
            });
        };
        if view.dtype() != Dtype::F32 {
            return Err(ParamFileError::Dtype {
                origin: origin.to_string(),
                name: name.clone(),
                dtype: format!("{:?}", view.dtype()),
            });
        }
        if view.shape() != param.shape.as_slice() {
            return Err(ParamFileError::Shape {
                origin: origin.to_string(),
                name: name.clone(),
                expected: param.shape.clone(),
                found: view.shape().to_vec(),
            });
        }
        let data = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let tensor =
            Tensor::new(view.shape().to_vec(), data).map_err(|e| ParamFileError::Format {
                origin: origin.to_string(),
                message: format!("parameter @{name}: {e}"),
            })?;
        params.insert(name.clone(), tensor);
    }
    Ok(params)
}
