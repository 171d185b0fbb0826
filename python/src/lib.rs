//! primjit's Python package: the extension module `primjit._primjit`, which `primjit/__init__.py`
//! re-exports as `primjit`.
//!
//! A thin layer over the facade crate: `Engine` (module `engine`), `Model` (`model`) and
//! `Primitive` (`primitive`) hold the Rust objects; numpy arrays cross in `arrays`, other
//! arguments (paths, names, numbers) in `args`, and errors in `errors`. The GIL is released
//! wherever kernels run or code is compiled.

mod args;
mod arrays;
mod engine;
mod errors;
mod model;
mod primitive;

use pyo3::prelude::*;

#[pymodule]
fn _primjit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<model::PyModel>()?;
    m.add_class::<primitive::PyPrimitive>()?;
    Ok(())
}
