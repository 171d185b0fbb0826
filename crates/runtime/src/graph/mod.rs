//! The graph executor: runs an IR graph with one JIT primitive per node.
//!
//! A [`CompiledGraph`] is a model made ready once: batch-norms folded and element-wise ops
//! fused into convolutions, parameters materialized, and convolution weights packed (packing
//! depends on channels and kernel only, never on the spatial shape). Each [`CompiledGraph::run`]
//! derives the concrete shapes from its inputs, asks the engine (and so its cache) for the
//! primitive of every node at those shapes, and executes them in order.
//!
//! Activations between nodes live in `nChw4c`; graph inputs stay NCHW (convolutions and
//! pooling read them directly) and outputs are reordered to NCHW at the end. Activation
//! buffers come from a [`Workspace`](crate::Workspace) and return to it after their value's
//! last use.
//!
//! The module by phase:
//! - `prepare.rs`: a [`CompiledGraph`] made from a graph and its parameters (optimized, weights
//!   packed), and its settings;
//! - `keys.rs`: the primitive key of every node at a run's shapes, in a [`ShapeMode`];
//! - `run.rs`: a whole run, node after node on whole tensors, and the liveness it follows
//!   (last uses, convs written over their residuals);
//! - `alias.rs`: values that live in a slice of another's buffer (a concat's inputs, an
//!   aligned block of channels);
//! - `streamed.rs`: the leading convolutions run in column bands through windows (the
//!   streamed segment of [`crate::stream`]), and its description for `dump`.
//!
//! This file holds the public types, among them the compiled graph's fields, which the four
//! phases share.

mod alias;
mod keys;
mod prepare;
mod run;
mod streamed;

use std::sync::Arc;

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{ConvAlgoChoice, Isa, PrimitiveKey};
use primjit_ir::{Graph, ParamError, Tensor, Value, VerifyError};

use crate::error::RuntimeError;
use crate::primitive::Primitive;
use crate::stream::{SegmentRun, Streaming};
use crate::workspace::WorkspaceStats;

pub use keys::{node_keys, node_keys_in};
use prepare::Prepared;
pub use prepare::optimize_graph;
pub use streamed::{BandKernel, describe_stream_plan, stream_band_kernels};

/// Why a graph could not be prepared (`CompiledGraph::new`) or run (`CompiledGraph::run`,
/// `CompiledGraph::keys`, `node_keys`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GraphError {
    /// The graph is invalid, or a run's inputs are unknown, missing or of shapes the graph
    /// does not accept; the error names the value or input.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// A parameter is missing or of the wrong shape (`CompiledGraph::new`).
    #[error(transparent)]
    Param(#[from] ParamError),
    /// A node's primitive could not be compiled, mapped or run; the error names its key.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// An input tensor whose data does not fill its own shape: pass the product of the shape.
    #[error(
        "input %{name}: the tensor has {found} values but its shape {shape:?} needs {expected}"
    )]
    InputData {
        name: String,
        shape: Vec<usize>,
        expected: usize,
        found: usize,
    },
    /// The pages for a convolution's packed weights could not be mapped (`CompiledGraph::new`):
    /// the system is out of memory or mappings. Not produced by a test.
    #[error("mapping pages for packed weights failed: {0}")]
    Weights(String),
    /// `run_into` was given a different number of output tensors than the graph has outputs:
    /// pass one per `graph().outputs()`, in that order.
    #[error("the graph has {expected} outputs but {found} output tensors were given")]
    OutputCount { expected: usize, found: usize },
    /// An activation buffer could not be mapped (out of memory, or at `vm.max_map_count`).
    /// Nothing is leaked; a later run may succeed.
    #[error("mapping {bytes} bytes of activations failed: {message}")]
    Workspace { bytes: usize, message: String },
    /// Keys asked for at bindings that leave a symbolic dimension unbound (`keys`,
    /// `node_keys`): bind every symbol (`W=1031`).
    #[error("%{value}: symbol values are missing, the shape is {shape}")]
    Unbound { value: String, shape: String },
}

/// A graph input as the runner reads it: an NCHW shape and its data, borrowed (a slice of a
/// buffer the caller keeps, or a [`Tensor`]'s).
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub shape: &'a [usize],
    pub data: &'a [f32],
}

impl<'a> From<&'a Tensor> for TensorView<'a> {
    fn from(t: &'a Tensor) -> Self {
        TensorView {
            shape: &t.shape,
            data: &t.data,
        }
    }
}

/// Bytes of a compiled graph's packed weights, by convolution algorithm: one packing per
/// node, made once per model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightBytes {
    /// Weights packed for direct kernels (9 floats per channel pair of a 3x3 kernel).
    pub direct: usize,
    /// Winograd-transformed weights (36 floats per channel pair).
    pub winograd: usize,
}

impl WeightBytes {
    pub fn total(&self) -> usize {
        self.direct + self.winograd
    }
}

/// What one run did, besides its outputs.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// The largest sum of live activation buffers during the run, in bytes.
    pub peak_activation_bytes: usize,
    /// The workspace after the run, its budget applied.
    pub workspace: WorkspaceStats,
    /// Per node that ran a primitive, in graph order: its name, its primitive and its
    /// execution time. A concat whose inputs were written in place, or a channel selection read
    /// in place ([`CompiledGraph::slices_in_place`]), runs none and is not listed.
    pub nodes: Vec<NodeRun>,
    /// The streamed segments of the run (none when streaming is off or the input is at most
    /// `stream::MIN_BANDS` bands wide).
    pub segments: Vec<SegmentRun>,
}

#[derive(Clone, Debug)]
pub struct NodeRun {
    pub name: String,
    pub primitive: Arc<Primitive>,
    /// The fixed-shape key this node computed: the primitive's key, or for a key with runtime
    /// extents, that key at the run's extents. For a streamed node, its first call's.
    pub call_key: PrimitiveKey,
    /// Seconds in its kernel (for a streamed node, the sum over its calls).
    pub seconds: f64,
}

/// How a graph's keys treat spatial extents that depend on a symbol of the IR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ShapeMode {
    /// Every key fixes every extent: one primitive per node and distinct shape.
    #[default]
    Exact,
    /// Convolutions and pooling leave their symbolic spatial extents to run time: one
    /// primitive per node configuration serves every value of the symbols. Global pooling and
    /// standalone element-wise ops stay exact. A node with `auto_pad` fixes the padding its
    /// input's extents give, so it has a primitive per residue of those extents modulo its
    /// strides that splits the padding differently (at most `strides[0] * strides[1]`).
    Runtime,
}

/// A graph made ready to run with JIT primitives.
#[derive(Clone, Debug)]
pub struct CompiledGraph {
    graph: Graph,
    prepared: Vec<Prepared>,
    last_use: Vec<usize>,
    /// Per node: the residual a conv may write its output over (`residual_overwrites`).
    overwrites: Vec<Option<Value>>,
    /// Whether runs write over those residuals (when the primitive allows it).
    in_place: bool,
    /// Values placed in a slice of another's buffer: concats' inputs, aligned channel blocks.
    slices: alias::InPlace,
    /// Whether runs place them there (`with_slices_in_place`).
    slices_in_place: bool,
    /// Per node: the spatial extents of its input that depend on a symbol.
    symbolic: Vec<RuntimeDims>,
    mode: ShapeMode,
    conv_algo: ConvAlgoChoice,
    /// The vector tier the weights are packed for and the keys name.
    isa: Isa,
    /// Chosen with `with_streaming`; `None` follows the mode (`streaming()`).
    streaming: Option<Streaming>,
}
