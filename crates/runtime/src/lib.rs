//! Primitives that own their executable pages, the byte-budgeted primitive cache, the engine,
//! and the graph executor.
//!
//! All `unsafe` code of the runtime lives in [`exec`]: mapping pages, flipping them to
//! read+execute, and calling kernels. (Elsewhere in primjit, only the read-only mappings of
//! model and parameter files, in the facade's `params_file` and the ONNX importer, are
//! `unsafe`.)

// The compiler holds every other module of the runtime to that.
#![deny(unsafe_code)]

mod cache;
mod config;
mod engine;
mod error;
#[allow(unsafe_code)]
pub mod exec;
mod graph;
pub mod layout;
mod perf_map;
mod primitive;
pub mod stream;
mod workspace;

pub use cache::{CacheKey, CacheStats, EntryInfo, Lookup, PrimitiveCache};
pub use config::{Budget, CacheConfig, ConfigError, EngineConfig, WorkspaceConfig, env_isa};
pub use engine::Engine;
pub use error::{ExecError, RuntimeError};
pub use exec::ExecArgs;
pub use graph::{
    BandKernel, CompiledGraph, GraphError, NodeRun, RunStats, ShapeMode, TensorView, WeightBytes,
    describe_stream_plan, node_keys, node_keys_in, optimize_graph, stream_band_kernels,
};
pub use primitive::{Primitive, PrimitiveMemory};
pub use stream::{SegmentRun, Streaming};
pub use workspace::{MAP_THRESHOLD_BYTES, REUSE_SLACK, Workspace, WorkspaceStats};
