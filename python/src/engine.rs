//! `primjit.Engine`: the engine with its byte-budgeted primitive cache and thread pool.

use std::sync::Arc;

use primjit::{
    Budget, CacheConfig, CacheStats, ConvAlgoChoice, Engine, EngineConfig, EntryInfo, Isa,
    WorkspaceConfig,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyDict;

use crate::args::{self, is_integer, type_name, whole_number};
use crate::errors::{Kind, error, runtime_error};
use crate::model::{self, PyModel};
use crate::primitive::{self, PyPrimitive};

/// A budget given as `"64MiB"`, `"512KiB"`, `"unlimited"`, `"0"` or a number of bytes.
fn budget_from(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Budget> {
    if let Some(text) = args::text(value) {
        return Budget::parse(&text)
            .map_err(|reason| error(py, Kind::Config, format!("budget `{text}`: {reason}")));
    }
    if is_integer(value)? {
        let expected = format!("expected a number of bytes from 0 to {}", usize::MAX);
        let n = whole_number(
            py,
            value,
            Kind::Config,
            "budget",
            usize::MAX as u64,
            &expected,
        )?;
        return Ok(Budget::Bytes(n as usize));
    }
    Err(error(
        py,
        Kind::Config,
        format!(
            "budget: expected a string such as \"64MiB\" or \"unlimited\", or a number of bytes, found {}",
            type_name(value)
        ),
    ))
}

/// `conv_algo="direct" | "winograd" | "auto"`.
fn conv_algo_from(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<ConvAlgoChoice> {
    let expected = "expected \"direct\", \"winograd\" or \"auto\"";
    let name = args::text_arg(py, value, Kind::Config, "conv_algo", expected)?;
    name.parse()
        .map_err(|e: primjit::codegen::UnknownConvAlgo| {
            error(py, Kind::Config, format!("conv_algo: {e}"))
        })
}

/// `max_isa="x128" | "avx2" | "avx512"`: the cap on the vector tier, strictly parsed.
fn max_isa_from(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Isa> {
    let expected = "expected \"x128\", \"avx2\" or \"avx512\"";
    let name = args::text_arg(py, value, Kind::Config, "max_isa", expected)?;
    name.parse()
        .map_err(|e: primjit::IsaError| error(py, Kind::Config, format!("max_isa: {e}")))
}

/// `mode="exact" | "dynamic"` of `Engine.load` and `Engine.load_bytes`; None is "exact".
fn mode_from(py: Python<'_>, mode: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    match mode {
        Some(m) => {
            let expected = "expected \"exact\" or \"dynamic\"";
            args::text_arg(py, m, Kind::Config, "mode", expected)
        }
        None => Ok("exact".to_string()),
    }
}

/// `random_params`: a seed as the command line's `--random-params` takes it, any `u64`.
fn seed_from(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    let expected = format!("expected a seed from 0 to {}, or None", u64::MAX);
    whole_number(py, value, Kind::Param, "random_params", u64::MAX, &expected)
}

/// The threads setting: 0 (one per core) up to the pool's limit.
fn threads_from(py: Python<'_>, threads: &Bound<'_, PyAny>) -> PyResult<usize> {
    let n = whole_number(
        py,
        threads,
        Kind::Config,
        "threads",
        Engine::MAX_THREADS as u64,
        &format!("expected 0 (one per core) to {}", Engine::MAX_THREADS),
    )?;
    Ok(n as usize)
}

fn capacity_from(py: Python<'_>, capacity: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    capacity
        .map(|c| {
            let n = whole_number(
                py,
                c,
                Kind::Config,
                "capacity",
                usize::MAX as u64,
                "expected a number of entries, 0 or more, or None",
            )?;
            Ok(n as usize)
        })
        .transpose()
}

/// Compiles primitives through a primitive cache bounded in bytes, and runs them on a pool of
/// threads.
///
/// budget: the cache's byte budget, "64MiB", "512KiB", "1GiB", "unlimited", "0" (no
///     caching) or a number of bytes.
/// capacity: an entry-count bound applied with the budget (oneDNN-style), or None.
/// threads: threads per execution, 0 for one per core, up to 1024 (above the hardware threads
///     of the largest hosts: a larger count is a mistake, refused before any thread starts).
/// workspace_budget: the activation buffers a model keeps between calls, as budget; None for
///     the built-in default (Engine.from_env reads PRIMJIT_WORKSPACE_BUDGET).
/// verbose: 1 writes a line per primitive creation and eviction on stderr, 2 also one per
///     execution (the format of PRIMJIT_VERBOSE).
/// conv_algo: the convolution algorithm of the models this engine loads and the ops it
///     compiles: "direct", "winograd" (wherever it applies: 3x3, stride 1 or 2, no groups,
///     nchw4c) or "auto" (Winograd where it is faster).
/// max_isa: the widest vector tier of the kernels, "x128", "avx2" or "avx512" (as oneDNN's
///     ONEDNN_MAX_CPU_ISA); None for the host's widest. A tier above the host's raises
///     ConfigError naming the tiers the host runs. Models are packed for the engine's tier.
///
/// An engine is safe to share between Python threads; calls release the GIL while kernels run.
#[pyclass(frozen, name = "Engine", module = "primjit")]
pub struct PyEngine {
    pub engine: Arc<Engine>,
    /// Models pack their weights for their algorithms when loaded, so the engine keeps the
    /// choice and hands it to each load.
    conv_algo: ConvAlgoChoice,
}

impl PyEngine {
    /// Builds the engine, its thread pool started without the GIL (other Python threads run
    /// meanwhile); Ctrl-C pressed while it starts raises KeyboardInterrupt once it has, and
    /// the engine is dropped.
    fn with_config(py: Python<'_>, config: EngineConfig) -> PyResult<Self> {
        let conv_algo = config.conv_algo;
        let engine = py
            .detach(|| Engine::new(config))
            .map_err(|e| runtime_error(py, e))?;
        py.check_signals()?;
        Ok(PyEngine {
            engine: Arc::new(engine),
            conv_algo,
        })
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &CacheStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("entries", s.entries)?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("peak_bytes", s.peak_bytes)?;
    d.set_item("mapped_bytes", s.mapped_bytes)?;
    d.set_item("budget", s.budget)?;
    d.set_item("capacity", s.capacity)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("evicted_bytes", s.evicted_bytes)?;
    d.set_item("compiles", s.compiles)?;
    d.set_item("prefetched", s.prefetched)?;
    d.set_item("failed_compiles", s.failed_compiles)?;
    d.set_item("compile_time_s", s.compile_time.as_secs_f64())?;
    d.set_item("max_compile_time_s", s.max_compile_time.as_secs_f64())?;
    Ok(d)
}

fn entry_dict<'py>(py: Python<'py>, e: &EntryInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("key", &e.key)?;
    d.set_item("bytes", e.memory.total())?;
    d.set_item("code_bytes", e.memory.code)?;
    d.set_item("mapped_bytes", e.memory.mapped)?;
    d.set_item("heap_bytes", e.memory.heap)?;
    d.set_item("hits", e.hits)?;
    d.set_item("idle_s", e.idle.as_secs_f64())?;
    d.set_item("compile_time_s", e.compile_time.as_secs_f64())?;
    Ok(d)
}

#[pymethods]
impl PyEngine {
    #[new]
    // One parameter per keyword of the Python signature.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(
        signature = (budget=None, capacity=None, threads=None, verbose=None, conv_algo=None, workspace_budget=None, max_isa=None),
        text_signature = "(budget=\"64MiB\", capacity=None, threads=0, verbose=0, conv_algo=\"auto\", workspace_budget=None, max_isa=None)"
    )]
    fn new(
        py: Python<'_>,
        budget: Option<&Bound<'_, PyAny>>,
        capacity: Option<&Bound<'_, PyAny>>,
        threads: Option<&Bound<'_, PyAny>>,
        verbose: Option<&Bound<'_, PyAny>>,
        conv_algo: Option<&Bound<'_, PyAny>>,
        workspace_budget: Option<&Bound<'_, PyAny>>,
        max_isa: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let budget = match budget {
            Some(b) => budget_from(py, b)?,
            None => Budget::DEFAULT,
        };
        // None (the signature's default, shown as 0) is 0: one thread per core, silent; and
        // "auto" for conv_algo.
        let threads = threads.map_or(Ok(0), |t| threads_from(py, t))?;
        let verbose = verbose.map_or(Ok(0), |v| {
            whole_number(py, v, Kind::Config, "verbose", 2, "expected 0, 1 or 2").map(|v| v as u8)
        })?;
        let config = EngineConfig {
            cache: CacheConfig {
                budget,
                capacity: capacity_from(py, capacity)?,
            },
            threads,
            verbose,
            conv_algo: conv_algo.map_or(Ok(ConvAlgoChoice::Auto), |c| conv_algo_from(py, c))?,
            max_isa: max_isa.map(|t| max_isa_from(py, t)).transpose()?,
            ..EngineConfig::default()
        };
        let mut workspace = WorkspaceConfig::default();
        if let Some(b) = workspace_budget {
            workspace.budget = budget_from(py, b)?;
        }
        let config = EngineConfig {
            workspace,
            ..config
        };
        Self::with_config(py, config)
    }

    /// An engine configured as the command line's: PRIMJIT_CACHE_BUDGET,
    /// PRIMJIT_CACHE_CAPACITY, PRIMJIT_WORKSPACE_BUDGET, PRIMJIT_THREADS, PRIMJIT_VERBOSE,
    /// PRIMJIT_CONV_ALGO, PRIMJIT_PERF_MAP, PRIMJIT_COMPILE_AHEAD and PRIMJIT_MAX_ISA, with the defaults for
    /// what is unset; a malformed value raises ConfigError.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Self> {
        let config =
            EngineConfig::from_env().map_err(|e| error(py, Kind::Config, e.to_string()))?;
        Self::with_config(py, config)
    }

    /// Loads a model: an IR file or an ONNX model (told apart by content, whatever the file's
    /// name), verified, optimized (batch-norm folding, post-op and pool fusion) and with its
    /// convolution weights packed. Engine.load_bytes loads one from bytes.
    ///
    /// path: the model file, a str, bytes or os.PathLike, as Python's own file functions take.
    /// params: a .safetensors or .npz file (a path, as path), a mapping (dict) of float32
    ///     arrays by parameter name, or None for a graph without parameters. An ONNX model's
    ///     initializers are its parameters; a file or dict overrides those it names, and a
    ///     name that is no parameter of the graph raises ParamError, listing them all. For an
    ///     IR graph, tensors it does not declare are ignored, as in a full model's state dict,
    ///     with a UserWarning naming them.
    /// mode: "exact" compiles one primitive per node and shape; "dynamic" gives convolutions
    ///     and pooling over a symbolic extent one primitive for every value of it.
    /// random_params: draw the parameters from this seed instead (the CLI's --random-params),
    ///     an int from 0 to 2**64 - 1 (not a bool).
    ///
    /// Raises IrError (the file does not parse, import or verify), ParamError (a parameter is
    /// missing, of the wrong shape or dtype; params or random_params of the wrong type or
    /// range), ConfigError (an unknown mode), OSError (a file cannot be read, or is not a
    /// regular file: a directory, a device, a FIFO) and TypeError (a path that is not a str,
    /// bytes or os.PathLike).
    #[pyo3(
        signature = (path, params=None, mode=None, *, random_params=None),
        text_signature = "($self, path, params=None, mode=\"exact\", *, random_params=None)"
    )]
    fn load(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        params: Option<&Bound<'_, PyAny>>,
        mode: Option<&Bound<'_, PyAny>>,
        random_params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyModel> {
        let path = args::path(py, path)?.ok_or_else(|| {
            PyTypeError::new_err(format!(
                "path: expected a str, bytes or os.PathLike, found {}",
                type_name(path)
            ))
        })?;
        let mode = mode_from(py, mode)?;
        let seed = random_params.map(|r| seed_from(py, r)).transpose()?;
        let input = model::ModelInput::Path(path);
        model::load(py, &self.engine, self.conv_algo, input, params, &mode, seed)
    }

    /// Loads a model from its bytes (an ONNX model's serialization, or IR text encoded as
    /// UTF-8), as Engine.load loads a file; the model's path is "<bytes>". An ONNX model whose
    /// weights are in an external data file cannot be loaded from bytes: load its path.
    ///
    /// Raises TypeError when data is not bytes, and what Engine.load raises.
    #[pyo3(
        signature = (data, params=None, mode=None, *, random_params=None),
        text_signature = "($self, data, params=None, mode=\"exact\", *, random_params=None)"
    )]
    fn load_bytes(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        params: Option<&Bound<'_, PyAny>>,
        mode: Option<&Bound<'_, PyAny>>,
        random_params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyModel> {
        let data = data.extract::<PyBackedBytes>().map_err(|_| {
            PyTypeError::new_err(format!(
                "data: expected bytes (the model file's content), found {}",
                type_name(data)
            ))
        })?;
        let mode = mode_from(py, mode)?;
        let seed = random_params.map(|r| seed_from(py, r)).transpose()?;
        let input = model::ModelInput::Bytes(data);
        model::load(py, &self.engine, self.conv_algo, input, params, &mode, seed)
    }

    /// Compiles one primitive from a benchdnn problem descriptor, such as
    /// "mb1ic64ih80iw80oc64oh80ow80kh3kw3sh1sw1ph1pw1", through this engine's cache.
    ///
    /// pool: None for a convolution (with bias), or a pooling algorithm: "max", "avg_np"
    ///     (padding excluded from the average) or "avg_p" (padding counted).
    /// layout: the activations' layout, "nchw" or "nchw4c" (oneDNN's nChw4c: channels in blocks
    ///     of four; either case).
    /// conv_algo: the convolution's algorithm, "direct", "winograd" or "auto"; None for the
    ///     engine's.
    ///
    /// A `*` after ih or iw ("iw1031*") leaves that extent to run time; the number is the
    /// extent the primitive runs at. Raises DescriptorError for a descriptor that does not
    /// describe a valid problem (or is not a str), ConfigError for a bad pool, layout or
    /// conv_algo.
    #[pyo3(
        signature = (descriptor, *, pool=None, layout=None, conv_algo=None),
        text_signature = "($self, descriptor, *, pool=None, layout=\"nchw\", conv_algo=None)"
    )]
    fn compile_op(
        &self,
        py: Python<'_>,
        descriptor: &Bound<'_, PyAny>,
        pool: Option<&Bound<'_, PyAny>>,
        layout: Option<&Bound<'_, PyAny>>,
        conv_algo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyPrimitive> {
        let descriptor = args::text_arg(
            py,
            descriptor,
            Kind::Descriptor,
            "descriptor",
            "expected a str such as \"mb1ic64ih80iw80oc64oh80ow80kh3kw3sh1sw1ph1pw1\"",
        )?;
        let pool = pool
            .map(|p| {
                let expected = "expected None, \"max\", \"avg_np\" or \"avg_p\"";
                args::text_arg(py, p, Kind::Config, "pool", expected)
            })
            .transpose()?;
        let layout = match layout {
            Some(l) => {
                let expected = "expected \"nchw\" or \"nchw4c\"";
                args::text_arg(py, l, Kind::Config, "layout", expected)?
            }
            None => "nchw".to_string(),
        };
        let conv_algo = match conv_algo {
            Some(name) => conv_algo_from(py, name)?,
            None => self.conv_algo,
        };
        primitive::compile_op(
            py,
            &self.engine,
            &descriptor,
            pool.as_deref(),
            &layout,
            conv_algo,
        )
    }

    /// The widest vector tier of this engine's kernels: "x128", "avx2" or "avx512".
    #[getter]
    fn isa(&self) -> &'static str {
        self.engine.isa().name()
    }

    /// The cache's counters: entries, bytes, peak_bytes, mapped_bytes, budget (bytes, or None
    /// when unlimited), capacity, hits, misses, evictions, evicted_bytes, compiles,
    /// prefetched (compiled ahead of their first lookup, PRIMJIT_COMPILE_AHEAD),
    /// failed_compiles, compile_time_s and max_compile_time_s.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.engine.cache().stats())
    }

    /// The cache's entries, most recently used first, each a dict: key (the primitive's
    /// benchdnn-style one-liner), bytes (what it costs: mapped pages plus heap), code_bytes,
    /// mapped_bytes, heap_bytes, hits, idle_s (seconds since its last use) and compile_time_s.
    fn cache_entries<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.engine
            .cache()
            .entries()
            .iter()
            .map(|e| entry_dict(py, e))
            .collect()
    }

    /// Changes the cache's byte budget ("1MiB", "unlimited", a number of bytes), evicting at
    /// once the least recently used primitives that no longer fit.
    fn set_budget(&self, py: Python<'_>, budget: &Bound<'_, PyAny>) -> PyResult<()> {
        let budget = budget_from(py, budget)?;
        self.engine.cache().set_budget(budget);
        Ok(())
    }

    /// Changes the cache's entry-count bound (None for no bound), evicting at once what no
    /// longer fits.
    fn set_capacity(&self, py: Python<'_>, capacity: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let capacity = capacity_from(py, capacity)?;
        self.engine.cache().set_capacity(capacity);
        Ok(())
    }

    /// Drops every cached primitive (not counted as evictions). Primitives still held (by a
    /// Primitive object, or a call that is running) are freed when released.
    fn clear(&self) {
        self.engine.cache().clear();
    }

    /// The cache's byte budget, as a string: "64MiB", "unlimited", ...
    #[getter]
    fn budget(&self) -> String {
        self.engine.cache().config().budget.to_string()
    }

    /// The cache's entry-count bound, or None.
    #[getter]
    fn capacity(&self) -> Option<usize> {
        self.engine.cache().config().capacity
    }

    /// The workspace budget: the activation buffers a model keeps between calls.
    #[getter]
    fn workspace_budget(&self) -> String {
        self.engine.workspace_config().budget.to_string()
    }

    /// The threads each execution runs on.
    #[getter]
    fn threads(&self) -> usize {
        self.engine.threads()
    }

    /// The convolution algorithm choice: "direct", "winograd" or "auto".
    #[getter]
    fn conv_algo(&self) -> String {
        self.conv_algo.to_string()
    }

    fn __repr__(&self) -> String {
        let config = self.engine.cache().config();
        format!(
            "primjit.Engine(budget={:?}, capacity={}, threads={}, conv_algo={:?})",
            config.budget.to_string(),
            config
                .capacity
                .map_or_else(|| "None".to_string(), |c| c.to_string()),
            self.engine.threads(),
            self.conv_algo.to_string()
        )
    }
}
