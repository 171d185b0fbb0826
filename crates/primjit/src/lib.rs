//! primjit: compile CNN primitives to machine code and run graphs of them within a byte budget.
//!
//! ```no_run
//! use primjit::{CompiledGraph, Engine, EngineConfig, Params, Tensor, Workspace};
//!
//! let text = primjit::file::read_regular_to_string("ir/resnet34_trunk.ir".as_ref())?;
//! let graph = primjit::ir::parse(&text)?;
//! let params = Params::random(&graph, 0);
//! let model = CompiledGraph::new(&graph, &params)?;
//! let engine = Engine::new(EngineConfig::from_env()?)?;
//! let x = Tensor::zeros(vec![1, 3, 320, 1031]);
//! let (outputs, _stats) = model.run(&engine, &[("x", &x)], &mut Workspace::new())?;
//! println!("{:?} -> {} cached bytes", outputs[0].1.shape, engine.cache().stats().bytes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The pieces, in the order data flows through them:
//! - [`ir`]: the graph IR, its text format, shape inference and passes;
//! - [`codegen`]: primitive keys ([`PrimitiveKey`]) and their lowering to machine code;
//! - the runtime: [`Primitive`]s that own their executable pages, the [`Engine`] with its
//!   byte-budgeted [`PrimitiveCache`], and the [`CompiledGraph`] executor; [`exec`] holds the
//!   page source an engine maps code from ([`Engine::with_pages`], for fault injection) and
//!   the guard-paged buffers of the tests;
//! - [`reference`](mod@reference): the reference interpreter that every kernel is tested against.
//!
//! Around them, for the tools and bindings that take problems from users: [`descriptor`]
//! parses benchdnn problem descriptors into keys, [`model_file`] reads a model (ONNX or IR
//! text, told apart by content) from a file or bytes, [`params_file`] reads a graph's
//! parameters from a `.safetensors` or `.npz` file and checks overrides' names, and [`file`](mod@file) opens files (graphs,
//! parameters) only when they are regular files, never a device or a FIFO that would be read
//! without end or block.

#![deny(unsafe_code)]

pub mod descriptor;
pub mod model_file;
pub mod params_file;

pub use primjit_onnx as onnx;

pub use primjit_codegen as codegen;
pub use primjit_ir as ir;
pub use primjit_ir::file;
pub use primjit_reference as reference;

pub use primjit_codegen::{
    CallExtents, CodegenError, CodegenOptions, ConvAlgo, ConvAlgoChoice, ConvDesc, ConvPlan,
    EltwiseDesc, EltwiseKind, FmaPattern, GlobalPoolDesc, Isa, IsaError, KeyError, Layout,
    PoolDesc, PoolPlan, PostOpDesc, PrimitiveKey, Target, key::RuntimeDims,
};
pub use primjit_ir::{Graph, IrError, Params, Tensor};
pub use primjit_runtime::{
    BandKernel, Budget, CacheConfig, CacheStats, CompiledGraph, ConfigError, Engine, EngineConfig,
    EntryInfo, ExecArgs, ExecError, GraphError, NodeRun, Primitive, PrimitiveCache,
    PrimitiveMemory, RunStats, RuntimeError, SegmentRun, ShapeMode, Streaming, TensorView,
    WeightBytes, Workspace, WorkspaceConfig, WorkspaceStats, describe_stream_plan, exec,
    exec::GuardedBuffer, layout, node_keys, node_keys_in, optimize_graph, stream,
    stream_band_kernels,
};
