//! numpy arrays in and out: float32 inputs read in place when C-contiguous, outputs handed to
//! numpy without a copy.
//!
//! Only float32 is accepted: converting another dtype would silently change the values
//! (float64) or their meaning (integers), so it is refused with the conversion to write. A
//! float32 array of any other strides (a slice, a transpose, a Fortran-order array) is copied
//! into C order first. A numpy scalar is read as the 0-d array it stands for (numpy's own
//! rule), but cannot be written.
//!
//! A destination is checked against the call's other buffers by the memory they span, not
//! only by the numpy crate's borrow flags: those are kept per base object, so two arrays over
//! one buffer through different objects (two `memoryview`s of a `bytearray`) pass them, and
//! the kernels would write what they read.

use std::ops::Range;

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    BorrowError, IntoPyArray, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyReadwriteArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use primjit::{Tensor, TensorView};
use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

use crate::args::type_name;
use crate::errors::{Kind, error};

/// A float32 array as the engine reads it: borrowed where it lies, or a C-order copy.
pub enum Input<'py> {
    Borrowed(PyReadonlyArrayDyn<'py, f32>),
    Copied(Tensor),
}

impl Input<'_> {
    pub fn view(&self) -> TensorView<'_> {
        match self {
            Input::Borrowed(a) => TensorView {
                shape: a.shape(),
                data: a.as_slice().expect("checked C-contiguous and aligned"),
            },
            Input::Copied(t) => TensorView::from(t),
        }
    }

    /// The memory the kernels read, where it is the caller's array rather than a copy.
    pub fn caller_span(&self) -> Option<Range<usize>> {
        match self {
            Input::Borrowed(_) => Some(slice_span(self.view().data)),
            Input::Copied(_) => None,
        }
    }
}

/// A numpy scalar (`numpy.float32(1.0)`, an instance of `numpy.generic`).
fn is_numpy_scalar(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    obj.is_instance(&py.import("numpy")?.getattr("generic")?)
}

/// What `obj` is when it holds a single value rather than an array of them: `a numpy scalar
/// (numpy.float32)` or `a 0-d array`; None for anything else.
pub fn rank0_kind(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return Ok((array.ndim() == 0).then(|| "a 0-d array".to_string()));
    }
    Ok(is_numpy_scalar(py, obj)?.then(|| format!("a numpy scalar (numpy.{})", type_name(obj))))
}

/// The float32 numpy array `obj` (a numpy scalar as a 0-d array), or a `DtypeError` naming
/// `what` (`input %x`, `src`).
pub fn float32_array<'py>(
    py: Python<'py>,
    what: &str,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let (untyped, found) = match obj.cast::<PyUntypedArray>() {
        Ok(array) => (array.clone(), "the array"),
        Err(_) if is_numpy_scalar(py, obj)? => {
            let array = py.import("numpy")?.call_method1("asarray", (obj,))?;
            (array.cast_into::<PyUntypedArray>()?, "the numpy scalar")
        }
        Err(_) => {
            return Err(error(
                py,
                Kind::Dtype,
                format!(
                    "{what}: expected a numpy.ndarray of float32, found {} (convert it with numpy.asarray(x, dtype=numpy.float32))",
                    type_name(obj)
                ),
            ));
        }
    };
    match untyped.cast::<PyArrayDyn<f32>>() {
        Ok(a) => Ok(a.clone()),
        Err(_) => Err(error(
            py,
            Kind::Dtype,
            format!(
                "{what}: {found}'s dtype is {}, expected float32 in native byte order (convert it with .astype(numpy.float32))",
                untyped.dtype()
            ),
        )),
    }
}

/// The bytes a C-contiguous array's data spans, as addresses.
fn span(data: *const f32, len: usize) -> Range<usize> {
    let start = data as usize;
    start..start + len * size_of::<f32>()
}

/// The bytes a slice spans, as addresses.
pub fn slice_span(data: &[f32]) -> Range<usize> {
    span(data.as_ptr(), data.len())
}

/// The message of a borrow the numpy crate refused. The call's own buffers were checked
/// against each other first ([`output`]), so a buffer already borrowed is held by another
/// call still running: one in another thread, or one that called back into Python (a
/// sequence given as `extra`) and from there into primjit again.
fn borrow_message(what: &str, writing: bool, e: &BorrowError) -> String {
    match e {
        BorrowError::NotWriteable => {
            format!(
                "{what}: the array cannot be written: it is read-only (flags.writeable is False)"
            )
        }
        _ if writing => format!(
            "{what}: the array cannot be written: another call still running reads or writes it"
        ),
        _ => format!(
            "{what}: the array cannot be read: another call still running writes it (a Primitive.execute's dst or scratch)"
        ),
    }
}

/// A graph input or a primitive's source: read in place when C-contiguous and aligned,
/// otherwise copied into C order.
pub fn input<'py>(py: Python<'py>, what: &str, obj: &Bound<'py, PyAny>) -> PyResult<Input<'py>> {
    let array = float32_array(py, what, obj)?;
    let readonly = array
        .try_readonly()
        .map_err(|e| error(py, Kind::Exec, borrow_message(what, false, &e)))?;
    if array.is_c_contiguous() && readonly.as_slice().is_ok() {
        return Ok(Input::Borrowed(readonly));
    }
    let view = readonly.as_array();
    // A strided array can be far larger than the memory it views (a broadcast has stride 0):
    // refuse what no graph accepts before copying, and report a copy that does not fit in
    // memory instead of aborting.
    let len = view.len();
    if len as u64 > primjit::ir::MAX_TENSOR_ELEMENTS {
        return Err(error(
            py,
            Kind::Shape,
            format!(
                "{what}: the array has {len} elements, more than a tensor may hold ({})",
                primjit::ir::MAX_TENSOR_ELEMENTS
            ),
        ));
    }
    let mut data = Vec::new();
    data.try_reserve_exact(len).map_err(|_| {
        PyMemoryError::new_err(format!(
            "{what}: no memory for a C-order copy of the array ({len} floats)"
        ))
    })?;
    // `iter` walks the logical (C) order whatever the strides.
    data.extend(view.iter().copied());
    Ok(Input::Copied(Tensor {
        shape: view.shape().to_vec(),
        data,
    }))
}

/// A destination the kernels write into: a writable, C-contiguous, aligned float32 array
/// (a copy could not be written back, so other arrays are refused) that shares no memory with
/// `others`, the call's buffers named (`src`) and seen as the memory they span.
pub fn output<'py>(
    py: Python<'py>,
    what: &str,
    obj: &Bound<'py, PyAny>,
    others: &[(&str, Range<usize>)],
) -> PyResult<PyReadwriteArrayDyn<'py, f32>> {
    if obj.cast::<PyUntypedArray>().is_err() && is_numpy_scalar(py, obj)? {
        return Err(error(
            py,
            Kind::Exec,
            format!(
                "{what}: a numpy scalar (numpy.{}) cannot be written: pass a writable float32 array",
                type_name(obj)
            ),
        ));
    }
    let array = float32_array(py, what, obj)?;
    if !array.is_c_contiguous() {
        return Err(error(
            py,
            Kind::Dtype,
            format!("{what}: the array must be C-contiguous to be written in place"),
        ));
    }
    let own = span(array.data(), array.len());
    let overlaps = |o: &Range<usize>| {
        !o.is_empty() && !own.is_empty() && o.start < own.end && own.start < o.end
    };
    if let Some((other, _)) = others.iter().find(|(_, o)| overlaps(o)) {
        return Err(error(
            py,
            Kind::Exec,
            format!(
                "{what}: the array shares memory with {other}: a buffer the kernels write must not overlap another of the call (pass a separate array)"
            ),
        ));
    }
    let mut writable = array
        .try_readwrite()
        .map_err(|e| error(py, Kind::Exec, borrow_message(what, true, &e)))?;
    if writable.as_slice_mut().is_err() {
        return Err(error(
            py,
            Kind::Dtype,
            format!("{what}: the array's data is not aligned for float32"),
        ));
    }
    Ok(writable)
}

/// A tensor's data handed to numpy without a copy, in its shape.
pub fn to_numpy(py: Python<'_>, tensor: Tensor) -> PyResult<Bound<'_, PyArrayDyn<f32>>> {
    let array = ArrayD::from_shape_vec(IxDyn(&tensor.shape), tensor.data).map_err(|e| {
        error(
            py,
            Kind::Exec,
            format!("an output does not fill its shape: {e}"),
        )
    })?;
    Ok(array.into_pyarray(py))
}
