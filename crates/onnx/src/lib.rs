//! An ONNX importer for primjit: decodes a `ModelProto` and converts it to a primjit IR
//! [`Graph`](primjit_ir::Graph) plus the [`Params`](primjit_ir::Params) of its initializers.
//!
//! The protobuf is decoded in pure Rust with prost, from message structs written by hand for
//! the part of `onnx.proto` the importer reads ([`proto`]); no protoc, no build script.
//!
//! Supported (default domain, opsets [`MIN_OPSET`] to [`MAX_OPSET`], 7 to 27): `Conv` (2-D;
//! `auto_pad`, `group`, `dilations`, `pads`, `strides`, optional bias, missing
//! `kernel_shape`), `MaxPool` and `AveragePool`
//! (2-D; `ceil_mode`, `dilations`, `pads`, `auto_pad`, `count_include_pad`),
//! `GlobalAveragePool`, `GlobalMaxPool`, `Relu`, `Add` of equal shapes, `Clip` (attributes or
//! constant inputs), `BatchNormalization` (inference), `Identity`, `Dropout` (inference),
//! `Constant`, and a classifier head: `Flatten` (or `Reshape` to `[N, C]`, or `Squeeze` of the
//! height and width; without axes, of every dimension of size 1, which must then be the height
//! and width only, of known N and C) of a 1x1 image followed by `Gemm` or `MatMul`
//! with constant weights, lowered to a 1x1 convolution of the `[N, C, 1, 1]` image (`Flatten` of
//! any known `H x W` too: the dense layer becomes a conv whose kernel covers the image). The
//! activations `Sigmoid`, `HardSigmoid`, `HardSwish` (opset 14 on), `Tanh`, `LeakyRelu`,
//! `PRelu` (one slope, or one per channel), `Elu` and `Exp`, with `Mul(x, Sigmoid(x))` as SiLU
//! and `Mul(x, HardSigmoid(x, 1/6, 1/2))` as HardSwish; `Add`, `Sub`, `Mul` and `Div` of two
//! tensors of one shape or with one of `[N, C, 1, 1]` or `[1, C, 1, 1]` (squeeze-excitation),
//! and with a scalar or per-channel constant (input normalization: a per-channel affine map,
//! folded into the conv before it when that conv has no post-op, else a depthwise 1x1 conv);
//! `ReduceMean` and `ReduceMax` over the height and width (axes as attribute or, from opset
//! 18, input; `keepdims` or not) as global pools; `Concat` on channels; a zero `Pad` of the
//! height and width before a `Conv` (joined to its pads); `Split` and `Slice` (step 1) of
//! channels and the channel shuffle `Reshape` to `[N, g, C / g, H, W]`, `Transpose`
//! `[0, 2, 1, 3, 4]`, `Reshape` back, as channel selections. Inputs must
//! be float NCHW tensors; `dim_param`s become IR symbols. Initializers may be stored in an
//! external data file beside the model (read through a memory map).
//!
//! A model with unsupported parts is an [`OnnxError::Problems`] listing every offending node
//! once, with the attribute or input at fault; malformed protobuf is an
//! [`OnnxError::Decode`], never a panic.
#![deny(unsafe_code)]

mod error;
mod import;
mod names;
pub mod proto;
mod tensor;

use std::path::Path;

use prost::Message;
use prost::bytes::Bytes;

pub use error::{OnnxError, Problem, Subject};
pub use import::{Imported, MAX_OPSET, MIN_OPSET, Metadata, SUPPORTED};
pub use names::{NameKind, Rename};

/// Reads and imports the model at `path`; external data is looked up beside it. A path that
/// is not a regular file (a directory, a device such as `/dev/zero`, a FIFO), also through a
/// symlink, is an [`OnnxError::Read`].
///
/// The file is mapped, not read: the decoded model borrows its weights from the mapping
/// ([`import_shared`]), which is gone when this returns, so that the raw weights are never
/// copied onto the heap besides the parameters made from them. As for every loader that maps
/// its weights, the file must not be truncated or rewritten while this runs.
pub fn import_file(path: &Path) -> Result<Imported, OnnxError> {
    let read_error = |source| OnnxError::Read {
        path: path.display().to_string(),
        source,
    };
    let file = primjit_ir::file::open_regular(path).map_err(read_error)?;
    #[allow(unsafe_code)]
    // SAFETY: the map is read-only and private to this function: the model decoded from it is
    // dropped, and the parameters copied out, before it returns. memmap2 requires that the
    // file not be truncated or modified by another process while mapped: a model is not
    // written while it is loaded (as for every loader that maps weights).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read_error)?;
    let base = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .map(Path::to_path_buf);
    import_shared(
        Bytes::from_owner(map),
        &path.display().to_string(),
        base.as_deref(),
    )
}

/// [`import_bytes`] on a shared buffer: the decoded model's raw tensor data are slices of
/// `bytes`, not copies (a mapped file, or a buffer the caller keeps anyway).
pub fn import_shared(
    bytes: Bytes,
    file: &str,
    base_dir: Option<&Path>,
) -> Result<Imported, OnnxError> {
    let model = proto::ModelProto::decode(bytes).map_err(|error| OnnxError::Decode {
        file: file.to_string(),
        error,
    })?;
    import_model(&model, file, base_dir)
}

/// Imports a serialized model. `file` names it in errors; `base_dir` is where its external
/// data files are (`None`: a model with external data is an error).
pub fn import_bytes(
    bytes: &[u8],
    file: &str,
    base_dir: Option<&Path>,
) -> Result<Imported, OnnxError> {
    let model = proto::ModelProto::decode(bytes).map_err(|error| OnnxError::Decode {
        file: file.to_string(),
        error,
    })?;
    import_model(&model, file, base_dir)
}

/// Imports a decoded model (see [`import_bytes`]).
pub fn import_model(
    model: &proto::ModelProto,
    file: &str,
    base_dir: Option<&Path>,
) -> Result<Imported, OnnxError> {
    import::import_model(model, file, base_dir.map(Path::to_path_buf))
}

/// Decodes a serialized float `TensorProto` (a `.pb` file of the ONNX test data sets) into its
/// name and a tensor. `file` names it in errors.
pub fn decode_tensor(bytes: &[u8], file: &str) -> Result<(String, primjit_ir::Tensor), OnnxError> {
    let t = proto::TensorProto::decode(bytes).map_err(|error| OnnxError::Decode {
        file: file.to_string(),
        error,
    })?;
    let problem = |message: String| OnnxError::Problems {
        file: file.to_string(),
        problems: vec![Problem {
            subject: Subject::Initializer(t.name.clone()),
            message,
        }],
    };
    let c = tensor::decode(&t, &mut tensor::ExternalFiles::new(None)).map_err(problem)?;
    let data = c.floats().map_err(problem)?.to_vec();
    let tensor =
        primjit_ir::Tensor::new(c.dims.clone(), data).expect("decode checks the element count");
    Ok((t.name, tensor))
}
