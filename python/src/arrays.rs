//! numpy arrays in and out: float32 inputs read in place when C-contiguous, outputs handed to
//! numpy without a copy.
//!
//! Only float32 is accepted: converting another dtype would silently change the values
//! (float64) or their meaning (integers), so it is refused with the conversion to write. A
//! float32 array of any other strides (a slice, a transpose, a Fortran-order array) is copied
//! into C order first.

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    IntoPyArray, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyReadwriteArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use primjit::{Tensor, TensorView};
use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

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
}

/// The float32 numpy array `obj`, or a `DtypeError` naming `what` (`input %x`, `src`).
pub fn float32_array<'py>(
    py: Python<'py>,
    what: &str,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
        let type_name = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_string(), |n| n.to_string());
        return Err(error(
            py,
            Kind::Dtype,
            format!(
                "{what}: expected a numpy.ndarray of float32, found {type_name} (convert it with numpy.asarray(x, dtype=numpy.float32))"
            ),
        ));
    };
    match untyped.cast::<PyArrayDyn<f32>>() {
        Ok(a) => Ok(a.clone()),
        Err(_) => Err(error(
            py,
            Kind::Dtype,
            format!(
                "{what}: the array's dtype is {}, expected float32 in native byte order (convert it with .astype(numpy.float32))",
                untyped.dtype()
            ),
        )),
    }
}

/// A graph input or a primitive's source: read in place when C-contiguous and aligned,
/// otherwise copied into C order.
pub fn input<'py>(py: Python<'py>, what: &str, obj: &Bound<'py, PyAny>) -> PyResult<Input<'py>> {
    let array = float32_array(py, what, obj)?;
    let readonly = array
        .try_readonly()
        .map_err(|e| error(py, Kind::Exec, format!("{what}: {e}")))?;
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
/// (a copy could not be written back, so other arrays are refused).
pub fn output<'py>(
    py: Python<'py>,
    what: &str,
    obj: &Bound<'py, PyAny>,
) -> PyResult<PyReadwriteArrayDyn<'py, f32>> {
    let array = float32_array(py, what, obj)?;
    if !array.is_c_contiguous() {
        return Err(error(
            py,
            Kind::Dtype,
            format!("{what}: the array must be C-contiguous to be written in place"),
        ));
    }
    let mut writable = array.try_readwrite().map_err(|e| {
        error(
            py,
            Kind::Exec,
            format!("{what}: the array cannot be written: {e}"),
        )
    })?;
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
