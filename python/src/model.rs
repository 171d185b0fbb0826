//! `primjit.Model`: a graph loaded, optimized and packed once, run on numpy arrays.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use primjit::ir::{Dim, Graph};
use primjit::model_file::{Bytes, ModelSource};
use primjit::onnx::{Metadata, NameKind};
use primjit::params_file::BoundParams;
use primjit::{
    CompiledGraph, ConvAlgoChoice, Engine, Params, ShapeMode, Tensor, TensorView, Workspace,
};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyDict, PyList, PyMapping, PyMappingMethods, PyTuple};

use crate::args::{self, type_name};
use crate::arrays::{self, Input};
use crate::errors::{Kind, error, ir_error, load_error, model_error, param_file_error, run_error};

/// A model file: its name, its IR text, its graph, and what an ONNX file adds.
struct ModelFile {
    file: String,
    text: String,
    graph: Graph,
    /// An ONNX model's initializers: its parameters unless others are given.
    initializers: Option<Params>,
    /// Outputs an ONNX model gives as `[N, K]`, which the graph computes as `[N, K, 1, 1]`.
    flattened_outputs: Vec<String>,
    metadata: Metadata,
    /// The model file's name of each input and output, by IR name.
    file_names: Vec<(String, String)>,
}

/// Where `Engine.load` reads a model from.
pub enum ModelInput {
    Path(PathBuf),
    /// The model's bytes, borrowed while it is imported.
    Bytes(PyBackedBytes),
}

/// Reads an IR file or an ONNX model, told apart by content ([`primjit::model_file`]), from
/// a file or bytes, and verifies its graph.
fn read_model(py: Python<'_>, input: ModelInput) -> PyResult<ModelFile> {
    let (source, path) = match input {
        ModelInput::Path(path) => {
            let source = py.detach(|| ModelSource::read(&path));
            (source, Some(path))
        }
        ModelInput::Bytes(data) => {
            let bytes = Bytes::from_owner(data);
            (
                py.detach(|| ModelSource::from_shared(bytes, "<bytes>")),
                None,
            )
        }
    };
    let mut source = source.map_err(|e| model_error(py, path.as_deref(), e))?;
    let graph = source
        .graph()
        .map_err(|e| ir_error(py, e, &source.origin, &source.text))?;
    graph
        .verify()
        .map_err(|e| ir_error(py, e, &source.origin, &source.text))?;
    let metadata = source.metadata(&graph);
    // Inputs are values, outputs have names of their own: each is looked up in its kind.
    let io: Vec<(NameKind, String)> = graph
        .inputs()
        .iter()
        .map(|i| (NameKind::Value, graph.value_name(i.value).to_string()))
        .chain(
            graph
                .outputs()
                .iter()
                .map(|(n, _)| (NameKind::Output, n.clone())),
        )
        .collect();
    let file_names = io
        .into_iter()
        .map(|(kind, ir)| {
            let file = source
                .onnx
                .as_ref()
                .and_then(|i| i.names.iter().find(|r| r.kind == kind && r.ir == ir))
                .map_or_else(|| ir.clone(), |r| r.onnx.clone());
            (ir, file)
        })
        .collect();
    let (initializers, flattened_outputs) = match source.onnx.as_mut() {
        Some(i) => (
            Some(std::mem::take(&mut i.params)),
            std::mem::take(&mut i.flattened_outputs),
        ),
        None => (None, Vec::new()),
    };
    Ok(ModelFile {
        file: source.origin,
        text: source.text,
        graph,
        initializers,
        flattened_outputs,
        metadata,
        file_names,
    })
}

/// The graph's declared (non-derived) parameters.
fn declared_params(graph: &Graph) -> Vec<String> {
    graph
        .params()
        .filter(|(_, p)| p.derived.is_none())
        .map(|(_, p)| format!("@{}", p.name))
        .collect()
}

/// The parameters `load` was given: a file, a dict of arrays, a seed, or none; a parameter
/// that a file or dict leaves out takes an ONNX model's initializer, as `primjit run` does.
/// Takes the initializers so that they are dropped here unless they become the parameters.
/// Names given that an IR graph has no parameter of are returned, for a warning; for an ONNX
/// model (overrides of its initializers) they are a ParamError.
fn params_from(
    py: Python<'_>,
    graph: &Graph,
    initializers: Option<Params>,
    params: Option<&Bound<'_, PyAny>>,
    random_params: Option<u64>,
) -> PyResult<BoundParams> {
    match (params, random_params) {
        (Some(_), Some(_)) => Err(error(
            py,
            Kind::Param,
            "give params or random_params, not both",
        )),
        (None, Some(seed)) => Ok(BoundParams {
            params: Params::random(graph, seed),
            unused: Vec::new(),
        }),
        (None, None) if initializers.is_some() => Ok(BoundParams {
            params: initializers.unwrap_or_default(),
            unused: Vec::new(),
        }),
        (None, None) => {
            let declared = declared_params(graph);
            if declared.is_empty() {
                return Ok(BoundParams::default());
            }
            let shown = declared.len().min(3);
            let more = match declared.len() - shown {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            Err(error(
                py,
                Kind::Param,
                format!(
                    "the graph has parameters ({}{more}): pass params= (a .safetensors or .npz file, or a dict of float32 arrays) or random_params=SEED",
                    declared[..shown].join(", ")
                ),
            ))
        }
        (Some(p), None) => {
            if let Ok(mapping) = p.cast::<PyMapping>() {
                let mut given = Vec::new();
                for item in mapping.items()?.iter() {
                    let (name, value) = item.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()?;
                    let name = args::text(&name).ok_or_else(|| {
                        error(
                            py,
                            Kind::Param,
                            format!(
                                "params: the dict's keys must be parameter names (str), found {}",
                                type_name(&name)
                            ),
                        )
                    })?;
                    let name = name.strip_prefix('@').unwrap_or(&name).to_string();
                    let what = format!("parameter @{name}");
                    let input = arrays::input(py, &what, &value)?;
                    let view = input.view();
                    given.push((
                        name,
                        Tensor {
                            shape: view.shape.to_vec(),
                            data: view.data.to_vec(),
                        },
                    ));
                }
                return primjit::params_file::bind_params(graph, initializers, given, "params")
                    .map_err(|e| error(py, Kind::Param, e.to_string()));
            }
            let path = args::path(py, p)?.ok_or_else(|| {
                error(
                    py,
                    Kind::Param,
                    format!(
                        "params: expected a .safetensors or .npz path (str, bytes or os.PathLike) or a dict of float32 arrays by parameter name, found {}",
                        type_name(p)
                    ),
                )
            })?;
            py.detach(|| primjit::params_file::read_params(&path, graph, initializers))
                .map_err(|e| param_file_error(py, &path, e))
        }
    }
}

/// Warns (`UserWarning`) of the names a state dict gave that the graph does not use.
fn warn_unused(py: Python<'_>, origin: &str, unused: &[String]) -> PyResult<()> {
    if unused.is_empty() {
        return Ok(());
    }
    let shown: Vec<&str> = unused.iter().take(10).map(String::as_str).collect();
    let more = match unused.len() - shown.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let message = format!(
        "{origin}: {} tensors the graph does not use, ignored: {}{more}",
        unused.len(),
        shown.join(", ")
    );
    let category = py.get_type::<pyo3::exceptions::PyUserWarning>();
    PyErr::warn(py, &category, &std::ffi::CString::new(message)?, 2)
}

/// `Engine.load`.
pub fn load(
    py: Python<'_>,
    engine: &Arc<Engine>,
    conv_algo: ConvAlgoChoice,
    input: ModelInput,
    params: Option<&Bound<'_, PyAny>>,
    mode: &str,
    random_params: Option<u64>,
) -> PyResult<PyModel> {
    let mode = match mode {
        "exact" => ShapeMode::Exact,
        "dynamic" => ShapeMode::Runtime,
        other => {
            return Err(error(
                py,
                Kind::Config,
                format!("mode `{other}`: expected \"exact\" or \"dynamic\""),
            ));
        }
    };
    let ModelFile {
        file,
        text,
        graph,
        initializers,
        flattened_outputs,
        metadata,
        file_names,
    } = read_model(py, input)?;
    let origin = match params.map(|p| args::path(py, p)) {
        Some(Ok(Some(path))) => path.display().to_string(),
        _ => "params".to_string(),
    };
    let BoundParams { params, unused } =
        params_from(py, &graph, initializers, params, random_params)?;
    warn_unused(py, &origin, &unused)?;
    let compiled = py
        .detach(|| {
            let compiled = CompiledGraph::with_target(&graph, &params, conv_algo, engine.isa());
            // The packed weights are all the model keeps; dropping the values frees tens of
            // megabytes, so it too happens without the GIL.
            drop(params);
            compiled
        })
        .map_err(|e| load_error(py, e, &file, &text))?
        .with_mode(mode);
    let inputs = graph
        .inputs()
        .iter()
        .map(|i| (graph.value_name(i.value).to_string(), i.shape.clone()))
        .collect();
    let outputs = graph.outputs().iter().map(|(n, _)| n.clone()).collect();
    // Output shapes as the graph declares them: ints, and text for extents that depend on a
    // symbol; an ONNX classifier's flattened outputs as the file gives them.
    let shapes = graph.verify().map_err(|e| ir_error(py, e, &file, &text))?;
    let output_shapes = graph
        .outputs()
        .iter()
        .map(|(n, v)| {
            let mut dims = shapes.get(*v).map(<[Dim]>::to_vec).unwrap_or_default();
            if flattened_outputs.contains(n) && dims.len() == 4 {
                dims.truncate(2);
            }
            (n.clone(), dims)
        })
        .collect();
    Ok(PyModel {
        engine: engine.clone(),
        graph: compiled,
        workspaces: Mutex::new(Vec::new()),
        path: file,
        inputs,
        outputs,
        output_shapes,
        flattened_outputs,
        metadata,
        file_names,
    })
}

/// A model loaded by Engine.load: call it on numpy arrays.
///
/// float32 arrays in NCHW are read where they lie when C-contiguous (otherwise copied into C
/// order); other dtypes raise DtypeError. Outputs are new float32 arrays. Calls release the
/// GIL while the kernels run, so several Python threads can run one model at once.
#[pyclass(frozen, name = "Model", module = "primjit")]
pub struct PyModel {
    engine: Arc<Engine>,
    graph: CompiledGraph,
    /// Activation buffers between calls, one workspace per call running at once.
    workspaces: Mutex<Vec<Workspace>>,
    path: String,
    inputs: Vec<(String, Vec<Dim>)>,
    outputs: Vec<String>,
    output_shapes: Vec<(String, Vec<Dim>)>,
    metadata: Metadata,
    /// The model file's name of each input and output, by IR name.
    file_names: Vec<(String, String)>,
    /// An ONNX classifier's `[N, K]` outputs, computed as `[N, K, 1, 1]` and returned as the
    /// file gives them.
    flattened_outputs: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Workspaces hold no invariant a panic could break: a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PyModel {
    /// Runs the graph on named inputs; the GIL is released while it runs.
    fn run_named(
        &self,
        py: Python<'_>,
        inputs: &[(String, Input<'_>)],
    ) -> PyResult<Vec<(String, Tensor)>> {
        let views: Vec<(&str, TensorView<'_>)> =
            inputs.iter().map(|(n, a)| (n.as_str(), a.view())).collect();
        let mut workspace = lock(&self.workspaces).pop().unwrap_or_default();
        // Fresh output tensors: their data moves into numpy arrays afterwards.
        let mut outputs: Vec<Tensor> = self
            .outputs
            .iter()
            .map(|_| Tensor::zeros(vec![0]))
            .collect();
        let result = py.detach(|| {
            self.graph
                .run_into(&self.engine, &views, &mut outputs, &mut workspace)
        });
        lock(&self.workspaces).push(workspace);
        result.map_err(|e| run_error(py, e))?;
        let mut named: Vec<(String, Tensor)> = self.outputs.iter().cloned().zip(outputs).collect();
        for (name, t) in &mut named {
            if self.flattened_outputs.contains(name) && t.shape.len() == 4 {
                t.shape.truncate(2);
            }
        }
        Ok(named)
    }
}

#[pymethods]
impl PyModel {
    /// Runs the model on its single input; returns its output, or a tuple of its outputs in
    /// the graph's order when it has several.
    ///
    /// Raises ShapeError (the model has several inputs, or x's shape does not fit the
    /// graph's input) and DtypeError (x is not a float32 array).
    fn __call__<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let [(name, _)] = self.inputs.as_slice() else {
            return Err(error(
                py,
                Kind::Shape,
                format!(
                    "{}: the graph has {} inputs ({}): call model.run({{name: array, ...}})",
                    self.path,
                    self.inputs.len(),
                    self.input_list()
                ),
            ));
        };
        let input = self.graph_input(py, name, x)?;
        let mut outputs = self.run_named(py, &[(name.clone(), input)])?;
        if outputs.len() == 1 {
            let (_, t) = outputs.pop().expect("one output");
            return Ok(arrays::to_numpy(py, t)?.into_any());
        }
        let arrays = outputs
            .into_iter()
            .map(|(_, t)| arrays::to_numpy(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyTuple::new(py, arrays)?.into_any())
    }

    /// Runs the model on inputs by name (with or without the `%`); returns a dict of its
    /// outputs by name.
    ///
    /// Raises ShapeError (an unknown or missing input, or a shape that does not fit the
    /// graph) and DtypeError (an input that is not a float32 array).
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let inputs = inputs.cast::<PyMapping>().map_err(|_| {
            error(
                py,
                Kind::Shape,
                format!(
                    "inputs: expected a dict of float32 arrays by input name, found {}",
                    type_name(inputs)
                ),
            )
        })?;
        let items = inputs.items()?;
        let mut named = Vec::with_capacity(items.len());
        for item in items.iter() {
            let (name, value) = item.extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>()?;
            let name = args::text(&name).ok_or_else(|| {
                error(
                    py,
                    Kind::Shape,
                    format!(
                        "inputs: the dict's keys must be input names (str), found {}",
                        type_name(&name)
                    ),
                )
            })?;
            let name = name.strip_prefix('%').unwrap_or(&name).to_string();
            let input = self.graph_input(py, &name, &value)?;
            named.push((name, input));
        }
        let outputs = self.run_named(py, &named)?;
        let dict = PyDict::new(py);
        for (name, t) in outputs {
            dict.set_item(name, arrays::to_numpy(py, t)?)?;
        }
        Ok(dict)
    }

    /// The graph's inputs by name, each with its declared shape: ints, and strings for
    /// symbolic dimensions ("W").
    #[getter]
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, shape) in &self.inputs {
            dict.set_item(name, dims_list(py, shape)?)?;
        }
        Ok(dict)
    }

    /// The graph's output names, in order.
    #[getter]
    fn outputs(&self) -> Vec<String> {
        self.outputs.clone()
    }

    /// The graph's outputs by name, each with its shape as the graph computes it: ints, and
    /// strings for extents that depend on a symbolic dimension.
    #[getter]
    fn output_shapes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, shape) in &self.output_shapes {
            dict.set_item(name, dims_list(py, shape)?)?;
        }
        Ok(dict)
    }

    /// The model file's name of each input and output, by the graph's name: an ONNX model's
    /// names ("input.1") where the graph's had to change ("input_1"); the same for IR files.
    #[getter]
    fn file_names<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (ir, file) in &self.file_names {
            dict.set_item(ir, file)?;
        }
        Ok(dict)
    }

    /// What the model says about itself, a dict: producer_name, producer_version,
    /// graph_name, domain, description, graph_description, version (an int) and
    /// custom_metadata_map (a dict of str). An IR file gives its graph's name only.
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = &self.metadata;
        let dict = PyDict::new(py);
        dict.set_item("producer_name", &m.producer_name)?;
        dict.set_item("producer_version", &m.producer_version)?;
        dict.set_item("graph_name", &m.graph_name)?;
        dict.set_item("domain", &m.domain)?;
        dict.set_item("description", &m.description)?;
        dict.set_item("graph_description", &m.graph_description)?;
        dict.set_item("version", m.version)?;
        let custom = PyDict::new(py);
        for (k, v) in &m.custom {
            custom.set_item(k, v)?;
        }
        dict.set_item("custom_metadata_map", custom)?;
        Ok(dict)
    }

    /// The convolution algorithm choice the model was compiled with: "direct", "winograd" or
    /// "auto".
    #[getter]
    fn conv_algo(&self) -> String {
        self.graph.conv_algo().to_string()
    }

    /// "exact" or "dynamic".
    #[getter]
    fn mode(&self) -> &'static str {
        match self.graph.mode() {
            ShapeMode::Exact => "exact",
            ShapeMode::Runtime => "dynamic",
        }
    }

    /// The file the model was loaded from.
    #[getter]
    fn path(&self) -> String {
        self.path.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "primjit.Model({:?}, mode={:?}, inputs=[{}], outputs=[{}])",
            self.path,
            self.mode(),
            self.input_list(),
            self.outputs.join(", ")
        )
    }
}

impl PyModel {
    /// The array given for the input `name`. A numpy scalar or a 0-d array for a declared
    /// input is refused by the rank it lacks; an unknown name is left to the graph to report.
    fn graph_input<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        obj: &Bound<'py, PyAny>,
    ) -> PyResult<Input<'py>> {
        let what = format!("input %{name}");
        if let Some((_, shape)) = self.inputs.iter().find(|(n, _)| n == name)
            && let Some(found) = arrays::rank0_kind(py, obj)?
        {
            return Err(error(
                py,
                Kind::Shape,
                format!(
                    "{what}: expected an array of rank {} ({}), found {found}",
                    shape.len(),
                    dims_text(shape)
                ),
            ));
        }
        arrays::input(py, &what, obj)
    }

    fn input_list(&self) -> String {
        self.inputs
            .iter()
            .map(|(n, s)| format!("%{n}: {}", dims_text(s)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A shape as a list: ints, and strings for symbolic extents.
fn dims_list<'py>(py: Python<'py>, shape: &[Dim]) -> PyResult<Bound<'py, PyList>> {
    let dims = PyList::empty(py);
    for d in shape {
        match d.known() {
            Some(n) => dims.append(n)?,
            None => dims.append(d.to_string())?,
        }
    }
    Ok(dims)
}

/// A declared shape as the graph prints it: `[1, 3, H, W]`.
fn dims_text(shape: &[Dim]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}
