//! The runtime's errors: compilation, mapping and execution. A bad configuration value
//! ([`ConfigError`]) is defined with the configuration, in `config`.

use primjit_codegen::CodegenError;

use crate::config::ConfigError;

/// Arguments of `Primitive::execute` (and `execute_parallel`, `execute_range`,
/// `Engine::execute`) that do not match the primitive's key. Checked before any code runs, in
/// this order: work items, source, weights, destination, the number of extra buffers, each
/// extra buffer, the scratch; a rejected call writes nothing. `key` is the primitive's
/// one-liner and `role` the buffer (`src`, `weights`, `dst`, `residual`, `src2`, `scratch`).
/// `Primitive::buffers` lists what the key expects.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// A buffer of the wrong length: pass exactly `expected` floats for `shape` in the key's
    /// layout (`Layout::buffer_len`; packed weights: `ConvPlan::packed_weights_len`).
    #[error("{key}: the {role} buffer holds {found} floats but shape {shape:?} needs {expected}")]
    BufferLength {
        key: String,
        role: &'static str,
        expected: usize,
        found: usize,
        shape: Vec<usize>,
    },
    /// A conv was given no weights (pass its packed weights, `ConvPlan::pack_weights`), or a
    /// conv with a fused pool no scratch (pass `ConvDesc::scratch_len` floats per thread).
    #[error("{key}: the {role} buffer is missing")]
    MissingBuffer { key: String, role: &'static str },
    /// Weights were given to a primitive that takes none (pooling, element-wise), or scratch to
    /// one without a fused pool: pass `None`.
    #[error("{key}: this primitive takes no {role} buffer")]
    UnexpectedBuffer { key: String, role: &'static str },
    /// `execute_range` with a range that is reversed or ends past the key's work items
    /// (`PrimitiveKey::work_items`, mostly output rows): ask for items within `0..limit`.
    #[error("{key}: work items {start}..{end} are not within 0..{limit}")]
    WorkItems {
        key: String,
        start: usize,
        end: usize,
        limit: usize,
    },
    /// The extents passed with a call do not fit the primitive: a runtime-extent primitive
    /// called without extents, or at extents its key rejects (an empty output, a window over
    /// padding only, too many elements), or a fixed primitive called at other extents.
    #[error("{key}: extents {extents:?} are not valid for this primitive: {reason}")]
    Extents {
        key: String,
        extents: [usize; 2],
        reason: String,
    },
    /// A conv that takes a scratch (a fused pool's band, Winograd's tiles) was given one
    /// smaller than a band (`ConvDesc::scratch_len` of the call's key): pass `per_thread`
    /// floats times the threads that may run the call.
    #[error(
        "{key}: the scratch buffer holds {found} floats but needs at least {per_thread} (a band per thread)"
    )]
    ScratchLength {
        key: String,
        per_thread: usize,
        found: usize,
    },
    /// A call asked a kernel to write its output over its residual, and the kernel's key does
    /// not allow it (`primjit_codegen::residual_in_place`: a conv with one residual, no fused
    /// pool and an unchunked reduction): pass the residual in `extra` instead.
    #[error("{key}: this primitive cannot write its output over its residual")]
    InPlace { key: String },
    /// The wrong number of extra buffers: a conv takes one residual per `add` post-op, an
    /// element-wise add its second source, other primitives none.
    #[error("{key}: expected {expected} extra buffers (residuals or second source), found {found}")]
    ExtraCount {
        key: String,
        expected: usize,
        found: usize,
    },
}

/// Any error of compiling or running a primitive (`Engine::new`, `Engine::compile`,
/// `Engine::execute`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The key could not be compiled; see [`CodegenError`] (in practice an invalid key).
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    /// Executable pages for the compiled code could not be mapped or made read+execute (for
    /// example at `vm.max_map_count`, or out of memory), even after the engine emptied its
    /// cache and tried once more. Nothing is cached or leaked; a later call may succeed.
    /// Lower the load, or raise `vm.max_map_count`.
    #[error("mapping executable pages for {key} failed: {message}")]
    Map { key: String, message: String },
    /// `PRIMJIT_PERF_MAP` (`EngineConfig::perf_map`) is on and perf's map file could not be
    /// opened (`Engine::new`) or written (`Engine::compile`).
    #[error("writing perf's map of jit code {path} failed: {message}")]
    PerfMap { path: String, message: String },
    /// Buffers that do not match the primitive; see [`ExecError`].
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The engine could not be configured; from `Engine::new` only when its thread pool
    /// cannot start ([`ConfigError::ThreadPool`]) or would need more threads than it can run
    /// ([`ConfigError::TooManyThreads`]).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A key of a vector tier above the engine's (`Engine::compile`), e.g. a graph packed for
    /// `avx512` run on an engine capped at `avx2`: compile the graph for the engine's tier
    /// (`CompiledGraph::with_target` with `Engine::isa`).
    #[error("{key} needs the {tier} vector tier, above this engine's {engine}")]
    Tier {
        key: String,
        tier: primjit_codegen::Isa,
        engine: primjit_codegen::Isa,
    },
}
