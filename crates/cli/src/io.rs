//! Tensor files: .npy inputs and outputs (f32, C order) and .safetensors parameters written (F32;
//! read, with .npz files, by the facade's `params_file`). Every file the CLI reads (models, widths, tensors) is
//! opened only when it is a regular file, by the facade's `primjit::file` (ONNX models by the
//! importer's own check).

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use npyz::WriterBuilder;
use primjit::file::open_regular;
use primjit_ir::{Params, Tensor};

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
