//! Tensor files: .npy inputs and outputs (f32, C order) and .safetensors parameters (F32,
//! read by the facade's `params_file`); and opening the files the CLI reads (models, widths,
//! tensors) only when they are regular files.

use std::fs::{File, FileType};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use npyz::WriterBuilder;
use primjit_ir::{Graph, Params, Tensor};

/// Opens `path` for reading when it is a regular file, following symlinks; anything else is
/// an [`io::ErrorKind::InvalidInput`] error that says what it is: read, a directory fails late,
/// a device such as `/dev/zero` never ends, and a FIFO blocks.
///
/// The type is checked before opening (opening a FIFO blocks until a writer comes) and again
/// on the opened file, in case the path was replaced in between.
pub fn open_regular(path: &Path) -> io::Result<File> {
    refuse_irregular(std::fs::metadata(path)?.file_type())?;
    let file = File::open(path)?;
    refuse_irregular(file.metadata()?.file_type())?;
    Ok(file)
}

/// Reads a regular file as UTF-8 text ([`open_regular`]).
pub fn read_regular_to_string(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    open_regular(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// Fails when `path` exists and is not a regular file, for a file that another crate opens
/// (the facade's safetensors reader, which maps it).
fn check_regular(path: &Path) -> io::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) => refuse_irregular(m.file_type()),
        // The reader reports a missing or unreadable file itself.
        Err(_) => Ok(()),
    }
}

fn refuse_irregular(t: FileType) -> io::Result<()> {
    if t.is_file() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {}, not a regular file", describe(t)),
    ))
}

/// What a file that is not a regular one is, with its article.
fn describe(t: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// Reads a .npy file holding f32 values in C order.
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let file = open_regular(path).with_context(|| format!("cannot open `{}`", path.display()))?;
    let npy = npyz::NpyFile::new(BufReader::new(file))
        .with_context(|| format!("`{}` is not a .npy file", path.display()))?;
    if npy.order() != npyz::Order::C {
        bail!(
            "`{}` is in Fortran order; only C order is supported",
            path.display()
        );
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    match npy.dtype() {
        npyz::DType::Plain(t) if t.type_char() == npyz::TypeChar::Float && t.size_field() == 4 => {}
        npyz::DType::Plain(t) => bail!(
            "`{}` holds values of dtype {t}; only f32 is supported",
            path.display()
        ),
        other => bail!(
            "`{}` holds values of dtype {}; only f32 is supported",
            path.display(),
            other.descr()
        ),
    }
    let data = npy
        .into_vec::<f32>()
        .with_context(|| format!("cannot read the data of `{}`", path.display()))?;
    Tensor::new(shape, data).with_context(|| format!("`{}` is truncated", path.display()))
}

/// Writes a tensor as a .npy file of f32 values in C order.
pub fn write_npy(path: &Path, tensor: &Tensor) -> Result<()> {
    let context = || format!("cannot write `{}`", path.display());
    let file = File::create(path).with_context(context)?;
    let shape: Vec<u64> = tensor.shape.iter().map(|&d| d as u64).collect();
    let mut out = BufWriter::new(file);
    let mut writer = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&shape)
        .writer(&mut out)
        .begin_nd()
        .with_context(context)?;
    writer
        .extend(tensor.data.iter().copied())
        .with_context(context)?;
    writer.finish().with_context(context)?;
    out.flush().with_context(context)?;
    Ok(())
}

/// Reads the values of `graph`'s declared parameters from a safetensors file, a parameter
/// missing from it taking its value from `fallback` (an ONNX model's initializers) when that
/// has one ([`primjit::params_file::read_safetensors`]).
pub fn read_safetensors_params(
    path: &Path,
    graph: &Graph,
    fallback: Option<&Params>,
) -> Result<Params> {
    check_regular(path).with_context(|| format!("cannot read `{}`", path.display()))?;
    Ok(primjit::params_file::read_safetensors(
        path, graph, fallback,
    )?)
}

/// Writes parameter values as a safetensors file of F32 tensors named as the parameters.
pub fn write_safetensors_params(path: &Path, params: &Params) -> Result<()> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = params
        .iter()
        .map(|(name, t)| {
            let data = t.data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name.to_string(), t.shape.clone(), data)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                .map(|v| (name.as_str(), v))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::tensor::serialize_to_file(views, None, path)
        .with_context(|| format!("cannot write `{}`", path.display()))
}
