//! Parameter values from `.safetensors` and `.npz` files, or given by name: the tensors named
//! as a graph's parameters, and the names given that the graph does not declare.
//!
//! A model that carries its own values (an ONNX model's initializers) takes what is given as
//! overrides, each of which must name one of its parameters: a name that does not is a typo,
//! and an error ([`ParamFileError::Unknown`]). A graph without values of its own (IR text)
//! takes what is given as its state dict, which may hold more than the graph uses (a full
//! model's state dict for a graph of part of it): those names are reported back
//! ([`BoundParams::unused`]) for the caller to show.

use std::collections::BTreeSet;
use std::io::Read;
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
    /// Overrides of a model's own values (an ONNX model's initializers) that name no parameter
    /// of its graph: every such name, and the graph's parameters.
    #[error(
        "{origin} names parameters the graph does not have: {}; its parameters: {}",
        at_list(unknown, usize::MAX),
        at_list(declared, 8)
    )]
    Unknown {
        origin: String,
        unknown: Vec<String>,
        declared: Vec<String>,
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
    let (map, origin) = map_regular(path)?;
    safetensors_params(&map, &origin, graph, fallback)
}

/// Maps a parameter file read-only, with the name its errors give it: the crate's one mapping
/// of a parameter file, for [`read_safetensors`] and [`read_params`].
fn map_regular(path: &Path) -> Result<(memmap2::Mmap, String), ParamFileError> {
    let origin = path.display().to_string();
    let read_error = |source| ParamFileError::Read {
        origin: origin.clone(),
        source,
    };
    // Not a device such as `/dev/zero`, whose map would be empty or endless, nor a FIFO,
    // whose opening blocks until a writer comes.
    let file = crate::file::open_regular(path).map_err(read_error)?;
    #[allow(unsafe_code)]
    // SAFETY: the map is read-only and private to its caller, which copies the values out
    // before returning and drops it. memmap2 requires that the file not be truncated or
    // modified by another process while mapped: a parameter file is not written while a model
    // is loaded from it (as for every loader that maps weights).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read_error)?;
    Ok((map, origin))
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
        let tensor = safetensor(&view, name, origin, &param.shape)?;
        params.insert(name.clone(), tensor);
    }
    Ok(params)
}

/// The safetensors tensor `view` as the parameter `name` of shape `expected`: F32 only.
fn safetensor(
    view: &safetensors::tensor::TensorView<'_>,
    name: &str,
    origin: &str,
    expected: &[usize],
) -> Result<Tensor, ParamFileError> {
    if view.dtype() != Dtype::F32 {
        return Err(ParamFileError::Dtype {
            origin: origin.to_string(),
            name: name.to_string(),
            dtype: format!("{:?}", view.dtype()),
        });
    }
    if view.shape() != expected {
        return Err(ParamFileError::Shape {
            origin: origin.to_string(),
            name: name.to_string(),
            expected: expected.to_vec(),
            found: view.shape().to_vec(),
        });
    }
    let data = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Tensor::new(view.shape().to_vec(), data).map_err(|e| ParamFileError::Format {
        origin: origin.to_string(),
        message: format!("parameter @{name}: {e}"),
    })
}

/// `names` with `@`, comma-separated, the first `shown` of them and a count of the rest.
fn at_list(names: &[String], shown: usize) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    let mut text: Vec<String> = names.iter().take(shown).map(|n| format!("@{n}")).collect();
    if names.len() > shown {
        text.push(format!("and {} more", names.len() - shown));
    }
    text.join(", ")
}

/// A graph's parameter values, and the names given that it has no parameter of, in order:
/// legal for a graph without values of its own, whose caller shows them (a warning, a line on
/// stderr), so that a typo does not pass unseen.
#[derive(Clone, Debug, Default)]
pub struct BoundParams {
    pub params: Params,
    pub unused: Vec<String>,
}

/// The format of a parameter file, told from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamFormat {
    /// A zip archive of `.npy` files (`numpy.savez`, `numpy.savez_compressed`).
    Npz,
    /// Anything else: a safetensors file's 8-byte header length and JSON header.
    Safetensors,
}

/// Tells an `.npz` file (a zip archive: `PK\x03\x04`, or `PK\x05\x06` when empty) from a
/// safetensors file by its content, whatever its name.
pub fn sniff_params(bytes: &[u8]) -> ParamFormat {
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        ParamFormat::Npz
    } else {
        ParamFormat::Safetensors
    }
}

/// The graph's declared (non-derived) parameters, in its order.
fn declared(graph: &Graph) -> Vec<String> {
    graph
        .params()
        .filter(|(_, p)| p.derived.is_none())
        .map(|(_, p)| p.name.clone())
        .collect()
}

/// Splits `given` names into none or an error: with `own` values (an ONNX model's), a name the
/// graph does not declare is an error; without, it is returned as unused.
fn check_names(
    graph: &Graph,
    given: impl IntoIterator<Item = String>,
    origin: &str,
    own: bool,
) -> Result<Vec<String>, ParamFileError> {
    let declared = declared(graph);
    let known: BTreeSet<&str> = declared.iter().map(String::as_str).collect();
    // Sorted: a file's tensors (a safetensors header is a JSON map) come in no fixed order,
    // and a message should not change from one run to the next.
    let mut unknown: Vec<String> = given
        .into_iter()
        .filter(|n| !known.contains(n.as_str()))
        .collect();
    unknown.sort_unstable();
    if own && !unknown.is_empty() {
        return Err(ParamFileError::Unknown {
            origin: origin.to_string(),
            unknown,
            declared,
        });
    }
    Ok(unknown)
}

/// Binds parameter values given by name (without `@`) to `graph`: over `initializers`, the
/// model's own values, when it has them (then every name must be a parameter of the graph), or
/// as its whole state dict (then names it does not declare are [`BoundParams::unused`]).
/// `origin` names what gave them in errors (`params`). Missing and mis-shaped parameters are
/// left to [`CompiledGraph::new`](crate::CompiledGraph::new), which checks them all.
pub fn bind_params(
    graph: &Graph,
    initializers: Option<Params>,
    given: Vec<(String, Tensor)>,
    origin: &str,
) -> Result<BoundParams, ParamFileError> {
    let own = initializers.is_some();
    let unused = check_names(graph, given.iter().map(|(n, _)| n.clone()), origin, own)?;
    let mut params = initializers.unwrap_or_default();
    for (name, tensor) in given {
        if !unused.contains(&name) {
            params.insert(name, tensor);
        }
    }
    Ok(BoundParams { params, unused })
}

/// Reads `graph`'s declared parameters from a `.safetensors` or `.npz` file (told apart by
/// content, [`sniff_params`]), a parameter missing from it taking its value from
/// `initializers` (an ONNX model's), whose values it replaces. With `initializers`, every
/// tensor of the file must name a parameter ([`ParamFileError::Unknown`]); without, the
/// names the graph does not declare come back in [`BoundParams::unused`].
///
/// The file is mapped, as [`read_safetensors`] maps it: only the tensors the graph uses are
/// read from it, once, and the mapping is gone when this returns.
pub fn read_params(
    path: &Path,
    graph: &Graph,
    initializers: Option<Params>,
) -> Result<BoundParams, ParamFileError> {
    let (map, origin) = map_regular(path)?;
    params_from_bytes(&map, &origin, graph, initializers)
}

/// [`read_params`] on the file's bytes; `origin` names the file in errors.
pub fn params_from_bytes(
    bytes: &[u8],
    origin: &str,
    graph: &Graph,
    initializers: Option<Params>,
) -> Result<BoundParams, ParamFileError> {
    let own = initializers.is_some();
    match sniff_params(bytes) {
        ParamFormat::Safetensors => {
            let file = SafeTensors::deserialize(bytes).map_err(|e| ParamFileError::Format {
                origin: origin.to_string(),
                message: e.to_string(),
            })?;
            let names = file.names().into_iter().map(str::to_string);
            let unused = check_names(graph, names, origin, own)?;
            // Those the file has replace the initializers, moved rather than copied.
            let mut params = initializers.unwrap_or_default();
            for (_, param) in graph.params() {
                if param.derived.is_some() {
                    continue;
                }
                let name = &param.name;
                match file.tensor(name) {
                    Ok(view) => {
                        let tensor = safetensor(&view, name, origin, &param.shape)?;
                        params.insert(name.clone(), tensor);
                    }
                    Err(_) if params.get(name).is_some() => {}
                    Err(_) => {
                        return Err(ParamFileError::Missing {
                            origin: origin.to_string(),
                            name: name.clone(),
                            expected: param.shape.clone(),
                        });
                    }
                }
            }
            Ok(BoundParams { params, unused })
        }
        ParamFormat::Npz => npz_params(bytes, origin, graph, initializers),
    }
}

/// The declared parameters of `graph` from an `.npz` archive: each `NAME.npy` a float32 (or
/// float64, converted) array in C order.
fn npz_params(
    bytes: &[u8],
    origin: &str,
    graph: &Graph,
    initializers: Option<Params>,
) -> Result<BoundParams, ParamFileError> {
    let format = |message: String| ParamFileError::Format {
        origin: origin.to_string(),
        message,
    };
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| format(format!("not an .npz archive: {e}")))?;
    let names = archive
        .file_names()
        .map(|n| {
            let n = n.map_err(|e| format(format!("an entry's name: {e}")))?;
            Ok(n.strip_suffix(".npy").unwrap_or(&n).to_string())
        })
        .collect::<Result<Vec<String>, ParamFileError>>()?;
    let own = initializers.is_some();
    let unused = check_names(graph, names.iter().cloned(), origin, own)?;
    let mut params = initializers.unwrap_or_default();
    for (_, param) in graph.params() {
        if param.derived.is_some() {
            continue;
        }
        let name = &param.name;
        let entry = format!("{name}.npy");
        if !names.contains(name) {
            if params.get(name).is_some() {
                continue;
            }
            return Err(ParamFileError::Missing {
                origin: origin.to_string(),
                name: name.clone(),
                expected: param.shape.clone(),
            });
        }
        let file = archive
            .by_name(&entry)
            .map_err(|e| format(format!("entry `{entry}`: {e}")))?;
        let tensor = npy_tensor(file, name, origin, &param.shape)?;
        params.insert(name.clone(), tensor);
    }
    Ok(BoundParams { params, unused })
}

/// One `.npy` array of an archive as the parameter `name` of shape `expected`.
fn npy_tensor(
    reader: impl Read,
    name: &str,
    origin: &str,
    expected: &[usize],
) -> Result<Tensor, ParamFileError> {
    let format = |message: String| ParamFileError::Format {
        origin: origin.to_string(),
        message: format!("parameter @{name}: {message}"),
    };
    let npy = npyz::NpyFile::new(reader).map_err(|e| format(format!("not a .npy array: {e}")))?;
    if npy.order() != npyz::Order::C {
        return Err(format(
            "the array is in Fortran order; save it in C order".into(),
        ));
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    if shape != expected {
        return Err(ParamFileError::Shape {
            origin: origin.to_string(),
            name: name.to_string(),
            expected: expected.to_vec(),
            found: shape,
        });
    }
    let dtype = npy.dtype();
    let data: Vec<f32> = match &dtype {
        npyz::DType::Plain(t) if t.type_char() == npyz::TypeChar::Float && t.size_field() == 4 => {
            npy.into_vec::<f32>().map_err(|e| format(e.to_string()))?
        }
        npyz::DType::Plain(t) if t.type_char() == npyz::TypeChar::Float && t.size_field() == 8 => {
            npy.into_vec::<f64>()
                .map_err(|e| format(e.to_string()))?
                .into_iter()
                .map(|v| v as f32)
                .collect()
        }
        other => {
            return Err(ParamFileError::Dtype {
                origin: origin.to_string(),
                name: name.to_string(),
                dtype: other.descr(),
            });
        }
    };
    Tensor::new(shape, data).map_err(|e| format(e.to_string()))
}
