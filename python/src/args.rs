//! Python arguments that are not arrays: paths, names from a fixed set, whole numbers, and the
//! type names that errors about them show.
//!
//! pyo3's own conversions raise `TypeError`s that name neither the argument nor what it takes
//! (`'int' object is not an instance of 'str'`); these raise the package's exceptions instead,
//! each message starting with the argument's name.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyString};

use crate::errors::{Kind, error};

/// The name of `value`'s type, for messages: `list`, `NoneType`, `float32`.
pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |n| n.to_string())
}

/// `value` as text if it is a `str` (a subclass too). Unpaired surrogates, which no accepted
/// value contains, become U+FFFD so that the message can still show the text.
pub fn text(value: &Bound<'_, PyAny>) -> Option<String> {
    value
        .cast::<PyString>()
        .ok()
        .map(|s| s.to_string_lossy().into_owned())
}

/// A `str` argument, else a `kind` error: `NAME: EXPECTED, found TYPE`.
pub fn text_arg(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    kind: Kind,
    name: &str,
    expected: &str,
) -> PyResult<String> {
    text(value).ok_or_else(|| {
        error(
            py,
            kind,
            format!("{name}: {expected}, found {}", type_name(value)),
        )
    })
}

/// A file path given as `str`, `bytes` or an `os.PathLike` of either, as Python's own file
/// functions take it (`os.fsencode`); the bytes are the file name the OS sees, so a name that
/// is not UTF-8 still opens. None when `value` is not a path.
pub fn path(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Option<PathBuf>> {
    let encoded = match py.import("os")?.call_method1("fsencode", (value,)) {
        Ok(encoded) => encoded,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => return Ok(None),
        // A `__fspath__` that raised something else: the caller's own error, shown as it is.
        Err(e) => return Err(e),
    };
    let bytes = encoded.cast_into::<PyBytes>().map_err(PyErr::from)?;
    Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(
        bytes.as_bytes(),
    ))))
}

/// A Python `int` or an integer-like object (`__index__`, such as numpy's integers), but not
/// a `bool`, whose `True` would pass as 1.
pub fn is_integer(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(!value.is_instance_of::<PyBool>() && value.hasattr("__index__")?)
}

/// A whole number from 0 to `max` ([`is_integer`]), else a `kind` error that names the
/// argument and what it expects, where pyo3's own conversion raised `TypeError` or
/// `OverflowError`.
pub fn whole_number(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    kind: Kind,
    name: &str,
    max: u64,
    expected: &str,
) -> PyResult<u64> {
    if !is_integer(value)? {
        return Err(error(
            py,
            kind,
            format!("{name}: {expected}, found {}", type_name(value)),
        ));
    }
    value
        .extract::<u64>()
        .ok()
        .filter(|&n| n <= max)
        .ok_or_else(|| error(py, kind, format!("{name} {value}: {expected}")))
}
