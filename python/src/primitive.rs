//! `primjit.Primitive`: one compiled kernel from a benchdnn descriptor, run on numpy buffers.

use std::ops::Range;
use std::sync::Arc;

use numpy::{PyArray1, PyReadwriteArrayDyn};
use primjit::codegen::BufferSpec;
use primjit::descriptor::{self, DescriptorOp};
use primjit::{ConvAlgoChoice, Engine, ExecArgs, Layout, Primitive, PrimitiveKey};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PySequence, PyString};

use crate::args::type_name;
use crate::arrays::{self, Input};
use crate::errors::{Kind, descriptor_error, error, runtime_error};

/// `Engine.compile_op`.
pub fn compile_op(
    py: Python<'_>,
    engine: &Arc<Engine>,
    text: &str,
    pool: Option<&str>,
    layout: &str,
    conv_algo: ConvAlgoChoice,
) -> PyResult<PyPrimitive> {
    // Either case: the keys print oneDNN's `nChw4c`.
    let layout = match layout.to_ascii_lowercase().as_str() {
        "nchw" => Layout::Nchw,
        "nchw4c" => Layout::Nchw4c,
        other => {
            return Err(error(
                py,
                Kind::Config,
                format!("layout `{other}`: expected \"nchw\" or \"nchw4c\""),
            ));
        }
    };
    let op = match pool {
        None => DescriptorOp::Conv(conv_algo),
        Some(alg) => DescriptorOp::pool(alg).ok_or_else(|| {
            error(
                py,
                Kind::Config,
                format!("pool `{alg}`: expected \"max\", \"avg_np\" or \"avg_p\""),
            )
        })?,
    };
    let desc = descriptor::parse(text).map_err(|e| descriptor_error(py, e))?;
    let (key, compiled) = desc.keys(op, layout).map_err(|e| descriptor_error(py, e))?;
    let primitive = py
        .detach(|| engine.compile(&compiled))
        .map_err(|e| runtime_error(py, e))?;
    Ok(PyPrimitive {
        engine: engine.clone(),
        primitive,
        key,
        name: desc.name,
    })
}

/// `execute`'s `extra`: a sequence of arrays (a list, a tuple), or None for none. A str or
/// bytes is a sequence too, but of characters; an ndarray would be one of its rows.
fn extra_arrays<'py>(
    py: Python<'py>,
    extra: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let Some(extra) = extra else {
        return Ok(Vec::new());
    };
    let text_like = extra.is_instance_of::<PyString>()
        || extra.is_instance_of::<PyBytes>()
        || extra.is_instance_of::<PyByteArray>();
    match extra.cast::<PySequence>() {
        Ok(seq) if !text_like => Ok(seq.to_list()?.iter().collect()),
        _ => Err(error(
            py,
            Kind::Exec,
            format!(
                "extra: expected a list or tuple of float32 arrays (one per residual or second source), found {}",
                type_name(extra)
            ),
        )),
    }
}

/// One compiled primitive (Engine.compile_op): a kernel with its executable pages, run on
/// numpy buffers that are checked against its key before any code runs.
///
/// Buffers are flat or shaped float32 arrays holding exactly the elements buffers() lists: the
/// source and destination in the primitive's layout, and for a convolution its weights packed
/// by pack_weights.
#[pyclass(frozen, name = "Primitive", module = "primjit")]
pub struct PyPrimitive {
    engine: Arc<Engine>,
    primitive: Arc<Primitive>,
    /// The problem: the primitive's key at the descriptor's extents.
    key: PrimitiveKey,
    name: Option<String>,
}

fn buffer_dict<'py>(py: Python<'py>, b: &BufferSpec) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("role", b.role)?;
    d.set_item("shape", b.shape.clone())?;
    d.set_item("layout", b.layout.map(|l| l.name()))?;
    d.set_item("len", b.len)?;
    Ok(d)
}

impl PyPrimitive {
    /// The extents a runtime-extent primitive runs at, None for a fixed one.
    fn extents(&self) -> Option<[usize; 2]> {
        self.primitive
            .key()
            .runtime_dims()
            .any()
            .then(|| self.key.input_extents())
    }
}

#[pymethods]
impl PyPrimitive {
    /// The compiled primitive's key, benchdnn-style; `*` marks an extent left to run time.
    #[getter]
    fn key(&self) -> String {
        self.primitive.key().to_string()
    }

    /// The problem this primitive runs: its key at the descriptor's extents.
    #[getter]
    fn problem(&self) -> String {
        self.key.to_string()
    }

    /// The descriptor's label (`n"..."`), or None.
    #[getter]
    fn name(&self) -> Option<String> {
        self.name.clone()
    }

    /// Seconds the primitive took to compile.
    #[getter]
    fn compile_time(&self) -> f64 {
        self.primitive.compile_time().as_secs_f64()
    }

    /// Floats of working memory one thread needs (Winograd convolutions, convolutions with a
    /// fused pool); 0 for primitives that take no scratch.
    #[getter]
    fn scratch_len(&self) -> usize {
        match &self.key {
            PrimitiveKey::Conv(d) => d.scratch_len(),
            _ => 0,
        }
    }

    /// Floating-point operations of one execution.
    #[getter]
    fn flops(&self) -> u64 {
        self.key.flops()
    }

    /// What the primitive holds, in bytes: code, mapped (its executable pages), heap, and
    /// total (mapped plus heap, what the cache counts against its budget).
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.primitive.memory();
        let d = PyDict::new(py);
        d.set_item("code", m.code)?;
        d.set_item("mapped", m.mapped)?;
        d.set_item("heap", m.heap)?;
        d.set_item("total", m.total())?;
        Ok(d)
    }

    /// The buffers execute takes, in order, each a dict: role ("src", "weights", "dst",
    /// "residual" or "src2" for the extra buffers, "scratch" for one thread's scratch),
    /// shape (logical, NCHW), layout ("nchw", "nChw4c", or None for packed weights and
    /// scratch) and len
    /// (the float32 elements it must hold).
    fn buffers<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.key
            .buffers()
            .iter()
            .map(|b| buffer_dict(py, b))
            .collect()
    }

    /// A convolution's weights (OIHW: out channels, in channels per group, kernel height and
    /// width) and bias (out channels, or None for zeros), packed into the layout its kernel
    /// reads: the weights argument of execute.
    ///
    /// Raises ExecError for a pooling primitive or arrays of the wrong shapes, DtypeError
    /// for arrays that are not float32.
    #[pyo3(signature = (weights, bias=None))]
    fn pack_weights<'py>(
        &self,
        py: Python<'py>,
        weights: &Bound<'py, PyAny>,
        bias: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let PrimitiveKey::Conv(desc) = &self.key else {
            return Err(error(
                py,
                Kind::Exec,
                format!("{}: only a convolution takes weights", self.key),
            ));
        };
        let weight_shape = desc.weight_shape();
        let w = arrays::input(py, "weights", weights)?;
        if w.view().shape != weight_shape.as_slice() {
            return Err(error(
                py,
                Kind::Exec,
                format!(
                    "{}: the weights have shape {:?} but the convolution's are {weight_shape:?}",
                    self.key,
                    w.view().shape
                ),
            ));
        }
        let b = bias.map(|b| arrays::input(py, "bias", b)).transpose()?;
        if let Some(b) = &b
            && b.view().shape != [desc.oc].as_slice()
        {
            return Err(error(
                py,
                Kind::Exec,
                format!(
                    "{}: the bias has shape {:?} but the convolution has {} output channels",
                    self.key,
                    b.view().shape,
                    desc.oc
                ),
            ));
        }
        let (w, b) = (w.view().data, b.as_ref().map(|b| b.view().data));
        // A descriptor's key has no post-ops, so no PReLU slopes.
        let packed = py.detach(|| desc.pack_weights(w, b, None));
        Ok(PyArray1::from_vec(py, packed))
    }

    /// Runs the primitive on the engine's threads: reads src (and weights and extra, a list or
    /// tuple of the residuals of a convolution with fused adds, or of an add's second source),
    /// writes dst in place. dst must be a writable C-contiguous float32 array; the others are
    /// read in place when C-contiguous. scratch is working memory for the primitives that take
    /// one (Winograd convolutions): None allocates it for the call, or pass a writable float32
    /// array of at least scratch_len floats per thread (the call runs on as many threads as it
    /// holds), to reuse one. Neither dst nor scratch may share memory with another buffer of
    /// the call.
    ///
    /// Every buffer is checked against the key before any code runs: a wrong length, a
    /// missing or unexpected buffer, or overlapping buffers raise ExecError and write nothing.
    /// The GIL is released while the kernel runs.
    #[pyo3(
        signature = (src, dst, weights=None, extra=None, scratch=None),
        text_signature = "($self, src, dst, weights=None, extra=(), scratch=None)"
    )]
    fn execute<'py>(
        &self,
        py: Python<'py>,
        src: &Bound<'py, PyAny>,
        dst: &Bound<'py, PyAny>,
        weights: Option<&Bound<'py, PyAny>>,
        extra: Option<&Bound<'py, PyAny>>,
        scratch: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let src = arrays::input(py, "src", src)?;
        let weights = weights
            .map(|w| arrays::input(py, "weights", w))
            .transpose()?;
        let extra: Vec<Input<'_>> = extra_arrays(py, extra)?
            .iter()
            .enumerate()
            .map(|(i, e)| arrays::input(py, &format!("extra[{i}]"), e))
            .collect::<PyResult<_>>()?;
        // The call's buffers that lie in the caller's memory (a copy is the package's own),
        // which dst, and then scratch, must not overlap.
        let extra_names: Vec<String> = (0..extra.len()).map(|i| format!("extra[{i}]")).collect();
        let mut buffers: Vec<(&str, Range<usize>)> = [("src", &src)]
            .into_iter()
            .chain(weights.as_ref().map(|w| ("weights", w)))
            .chain(extra_names.iter().map(String::as_str).zip(&extra))
            .filter_map(|(name, input)| Some((name, input.caller_span()?)))
            .collect();
        let mut dst_array: PyReadwriteArrayDyn<'py, f32> =
            arrays::output(py, "dst", dst, &buffers)?;
        let dst = dst_array.as_slice_mut().expect("checked by arrays::output");
        buffers.push(("dst", arrays::slice_span(dst)));
        let extra_views: Vec<&[f32]> = extra.iter().map(|e| e.view().data).collect();
        let mut scratch_array = scratch
            .map(|s| arrays::output(py, "scratch", s, &buffers))
            .transpose()?;
        // One band per thread, as the graph executor gives it.
        let mut own_scratch = match (&scratch_array, self.scratch_len()) {
            (None, n) if n > 0 => vec![0.0f32; n * self.engine.threads()],
            _ => Vec::new(),
        };
        let scratch = match &mut scratch_array {
            Some(a) => Some(a.as_slice_mut().expect("checked by arrays::output")),
            None if !own_scratch.is_empty() => Some(own_scratch.as_mut_slice()),
            None => None,
        };
        let args = ExecArgs {
            src: src.view().data,
            weights: weights.as_ref().map(|w| w.view().data),
            dst,
            extra: &extra_views,
            scratch,
        };
        let extents = self.extents();
        let (engine, primitive) = (&self.engine, &self.primitive);
        py.detach(|| match extents {
            Some(e) => engine.execute_at(primitive, args, e),
            None => engine.execute(primitive, args),
        })
        .map_err(|e| runtime_error(py, e))
    }

    fn __repr__(&self) -> String {
        format!("primjit.Primitive({:?})", self.primitive.key().to_string())
    }
}
