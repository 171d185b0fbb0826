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
//! buffers come from a [`Workspace`] and return to it after their value's last use.

use std::collections::HashMap;
use std::sync::Arc;

use primjit_codegen::Isa;
use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    Broadcast, ConcatDesc, ConvAlgo, ConvAlgoChoice, ConvDesc, ConvPlan, ConvTransposeDesc,
    EltwiseDesc, EltwiseKind, GlobalPoolDesc, Layout, Pitches, PoolDesc, PostOpDesc, PrimitiveKey,
    ResizeDesc, ResizeOut, SelectDesc,
};
use primjit_ir::passes::{self, PassReport};
use primjit_ir::{
    Bindings, Graph, GraphParams, Node, Op, ParamError, Params, PostOp, ResizeSize, Shapes, Tensor,
    Value, VerifyError, infer_shapes,
};

use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::exec::{ExecArgs, WeightBuffer};
use crate::layout;
use crate::primitive::Primitive;
use crate::stream::{self, Call, Schedule, Segment, SegmentRun, Streaming};
use crate::workspace::{Buffer, REUSE_SLACK, Workspace, WorkspaceStats};

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

/// What a node needs besides its primitive.
#[derive(Clone, Debug)]
enum Prepared {
    /// Packed weights of a convolution (or of a batch-norm run as a depthwise 1x1 conv), in
    /// the layout of the algorithm its keys use.
    Conv {
        packed: Arc<WeightBuffer>,
        algo: ConvAlgo,
        isa: Isa,
    },
    /// A PReLU's slopes, one per channel, rounded up to whole vectors with zeros.
    Slope(Vec<f32>),
    Other,
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
    /// Per node: its name, its primitive (if it ran one) and its execution time.
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
    /// standalone element-wise ops stay exact.
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
    /// Per node: the spatial extents of its input that depend on a symbol.
    symbolic: Vec<RuntimeDims>,
    mode: ShapeMode,
    conv_algo: ConvAlgoChoice,
    /// The vector tier the weights are packed for and the keys name.
    isa: Isa,
    /// Chosen with `with_streaming`; `None` follows the mode (`streaming()`).
    streaming: Option<Streaming>,
}

fn layout_of(graph: &Graph, v: Value) -> Layout {
    if graph.inputs().iter().any(|i| i.value == v) {
        Layout::Nchw
    } else {
        Layout::Nchw4c
    }
}

fn per_channel_bn(params: &GraphParams<'_>, bn: &primjit_ir::BatchNorm) -> (Vec<f32>, Vec<f32>) {
    let (s, b, m, v) = (
        params.get(bn.scale),
        params.get(bn.bias),
        params.get(bn.mean),
        params.get(bn.var),
    );
    let (s, b, m, v) = (&s.data, &b.data, &m.data, &v.data);
    let mut w = Vec::with_capacity(s.len());
    let mut bias = Vec::with_capacity(s.len());
    for c in 0..s.len() {
        let k = s[c] as f64 / (v[c] as f64 + bn.epsilon as f64).sqrt();
        w.push(k as f32);
        bias.push((b[c] as f64 - m[c] as f64 * k) as f32);
    }
    (w, bias)
}

impl CompiledGraph {
    /// Optimizes `graph` and packs every convolution's weights, read from `params` (derived
    /// ones computed one at a time), for the algorithm [`ConvAlgoChoice::Auto`] picks. The
    /// packed weights are all it keeps: `params` may be dropped once this returns.
    pub fn new(graph: &Graph, params: &Params) -> Result<Self, GraphError> {
        Self::with_conv_algo(graph, params, ConvAlgoChoice::Auto)
    }

    /// [`Self::new`] with the convolution algorithms `conv_algo` chooses. Each convolution's
    /// algorithm depends on its channels and window only, so its weights are packed once,
    /// for that algorithm, and serve every input size.
    ///
    /// The weights are packed for the vector tier of an engine made from the environment
    /// ([`crate::env_isa`]: the host's, or `PRIMJIT_MAX_ISA`); a graph run on an
    /// engine with another cap takes [`Self::with_target`] and that engine's [`Engine::isa`].
    pub fn with_conv_algo(
        graph: &Graph,
        params: &Params,
        conv_algo: ConvAlgoChoice,
    ) -> Result<Self, GraphError> {
        let isa = crate::config::env_isa().map_err(RuntimeError::from)?;
        Self::with_target(graph, params, conv_algo, isa)
    }

    /// [`Self::with_conv_algo`] with the weights packed for the vector tier `isa`, which the
    /// engines that run the graph must have ([`Engine::isa`]): a model holds one tier's
    /// packing.
    pub fn with_target(
        graph: &Graph,
        params: &Params,
        conv_algo: ConvAlgoChoice,
        isa: Isa,
    ) -> Result<Self, GraphError> {
        graph.verify()?;
        let mut graph = graph.clone();
        optimize_graph(&mut graph, conv_algo, isa);
        let shapes = graph.verify()?;
        let params = params.for_graph(&graph)?;
        let mut prepared = Vec::with_capacity(graph.node_count());
        for (_, node) in graph.nodes() {
            let p = match &node.op {
                Op::Conv2d(c) => {
                    let w = params.get(c.weight);
                    let b = c.bias.map(|b| params.get(b));
                    let desc = conv_desc_shell(&graph, c, &shapes, conv_algo, isa);
                    Prepared::Conv {
                        packed: weight_buffer(
                            &desc.pack_weights(&w.data, b.as_ref().map(|b| b.data.as_slice())),
                        )?,
                        algo: desc.algo,
                        isa: desc.isa,
                    }
                }
                Op::BatchNorm(bn) => {
                    let (w, b) = per_channel_bn(&params, bn);
                    let desc = bn_desc_shell(w.len(), layout_of(&graph, bn.input));
                    Prepared::Conv {
                        packed: weight_buffer(&ConvPlan::new(&desc).pack_weights(&w, Some(&b)))?,
                        algo: ConvAlgo::Direct,
                        isa: desc.isa,
                    }
                }
                Op::ConvTranspose(ct) => {
                    let w = params.get(ct.weight);
                    let b = ct.bias.map(|b| params.get(b));
                    // Packing depends on channels, window and groups only: any extents do.
                    let desc =
                        conv_transpose_desc(&graph, ct, [1, graph.param(ct.weight).shape[0], 1, 1]);
                    Prepared::Conv {
                        packed: weight_buffer(&primjit_codegen::pack_conv_transpose_weights(
                            &desc,
                            &w.data,
                            b.as_ref().map(|b| b.data.as_slice()),
                        ))?,
                        algo: ConvAlgo::Direct,
                        isa: Isa::X128,
                    }
                }
                Op::PRelu { slope, .. } => {
                    let mut s = params.get(*slope).data.to_vec();
                    s.resize(s.len().div_ceil(4) * 4, 0.0);
                    Prepared::Slope(s)
                }
                _ => Prepared::Other,
            };
            prepared.push(p);
        }
        let symbolic = symbolic_dims(&graph, &shapes);
        let last_use = last_uses(&graph);
        let overwrites = residual_overwrites(&graph, &last_use);
        Ok(CompiledGraph {
            graph,
            prepared,
            last_use,
            overwrites,
            in_place: true,
            symbolic,
            mode: ShapeMode::Exact,
            conv_algo,
            isa,
            streaming: None,
        })
    }

    /// The choice of convolution algorithms this graph was compiled with.
    pub fn conv_algo(&self) -> ConvAlgoChoice {
        self.conv_algo
    }

    /// The vector tier this graph's weights are packed for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Per node, the convolution algorithm and tier its keys use (direct and `x128` for nodes
    /// that are not convolutions).
    fn algos(&self) -> Vec<(ConvAlgo, Isa)> {
        self.prepared
            .iter()
            .map(|p| match p {
                Prepared::Conv { algo, isa, .. } => (*algo, *isa),
                Prepared::Slope(_) | Prepared::Other => (ConvAlgo::Direct, Isa::X128),
            })
            .collect()
    }

    /// Bytes of the packed weights this graph holds, by algorithm.
    pub fn weight_bytes(&self) -> WeightBytes {
        let mut bytes = WeightBytes::default();
        for p in &self.prepared {
            if let Prepared::Conv { packed, algo, .. } = p {
                let n = packed.mapped_bytes();
                match algo {
                    ConvAlgo::Direct => bytes.direct += n,
                    ConvAlgo::WinogradF4x3 => bytes.winograd += n,
                }
            }
        }
        bytes
    }

    /// The same graph with keys made in `mode`.
    pub fn with_mode(mut self, mode: ShapeMode) -> Self {
        self.mode = mode;
        self
    }

    pub fn mode(&self) -> ShapeMode {
        self.mode
    }

    /// The same graph, writing convs' outputs over their residuals where liveness allows it
    /// (`true`, the default) or never (`false`: every value gets a buffer of its own). The
    /// results are the same to the bit; only the activation memory differs.
    pub fn with_residual_in_place(mut self, in_place: bool) -> Self {
        self.in_place = in_place;
        self
    }

    /// The same graph, running its leading convolutions in column bands or as whole tensors.
    /// The results are the same to the bit; only the activation memory differs. Without a
    /// choice, a graph streams when its keys take widths at run time
    /// ([`ShapeMode::Runtime`]), where bands need no more than three primitives per node (a
    /// left border, the middle, a right border); with exact keys each band width and border
    /// would be one more primitive per input width.
    pub fn with_streaming(mut self, streaming: Streaming) -> Self {
        self.streaming = Some(streaming);
        self
    }

    /// The streaming a run uses: the one chosen, else on for runtime widths and off for exact
    /// ones.
    pub fn streaming(&self) -> Streaming {
        self.streaming.unwrap_or(match self.mode {
            ShapeMode::Runtime => Streaming::ON,
            ShapeMode::Exact => Streaming::OFF,
        })
    }

    /// The segment a run at `bindings` streams, with its schedule, if any.
    pub fn stream_plan(
        &self,
        bindings: &Bindings,
    ) -> Result<Option<(Segment, stream::Schedule)>, GraphError> {
        if self.streaming().band().is_none() {
            return Ok(None);
        }
        let shapes = infer_shapes(&self.graph, bindings)?;
        let keys = keys_at(&self.graph, &shapes, self.runtime_dims(), &self.algos())?;
        Ok(self.streamed_segment(&shapes, &keys).map(|(s, band)| {
            let schedule = s.schedule(band);
            (s, schedule)
        }))
    }

    /// The segment a run with these shapes and node keys streams, and its band.
    fn streamed_segment(
        &self,
        shapes: &Shapes,
        keys: &[(String, PrimitiveKey)],
    ) -> Option<(Segment, usize)> {
        let overwrites = match self.in_place {
            true => honoured_overwrites(&self.overwrites, keys),
            false => vec![None; self.overwrites.len()],
        };
        stream::streamed_segment(
            &self.graph,
            shapes,
            keys,
            &self.last_use,
            &overwrites,
            self.streaming(),
        )
    }

    /// The convs that may write their output over a residual, as (node, residual) names: the
    /// residual has no reader after the conv, is not a graph output and is not the conv's
    /// own input. A run does so when its primitive allows it too
    /// (`Primitive::residual_in_place`).
    pub fn residual_overwrites(&self) -> Vec<(String, String)> {
        self.graph
            .nodes()
            .zip(&self.overwrites)
            .filter_map(|((_, node), r)| {
                r.map(|r| {
                    (
                        self.graph.value_name(node.result).to_string(),
                        self.graph.value_name(r).to_string(),
                    )
                })
            })
            .collect()
    }

    /// The runtime extents of each node's key in this graph's mode.
    fn runtime_dims(&self) -> Option<&[RuntimeDims]> {
        (self.mode == ShapeMode::Runtime).then_some(self.symbolic.as_slice())
    }

    /// The optimized graph this runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The primitive key of every node at the shapes that `bindings` give.
    pub fn keys(&self, bindings: &Bindings) -> Result<Vec<(String, PrimitiveKey)>, GraphError> {
        keys_at(
            &self.graph,
            &infer_shapes(&self.graph, bindings)?,
            self.runtime_dims(),
            &self.algos(),
        )
    }

    /// Runs the graph on `inputs` (by input name, NCHW), returning its outputs in NCHW.
    pub fn run(
        &self,
        engine: &Engine,
        inputs: &[(&str, &Tensor)],
        workspace: &mut Workspace,
    ) -> Result<(Vec<(String, Tensor)>, RunStats), GraphError> {
        let views: Vec<(&str, TensorView<'_>)> = inputs
            .iter()
            .map(|(n, t)| (*n, TensorView::from(*t)))
            .collect();
        let mut outputs: Vec<Tensor> = self
            .graph
            .outputs()
            .iter()
            .map(|_| Tensor {
                shape: Vec::new(),
                data: Vec::new(),
            })
            .collect();
        let stats = self.run_into(engine, &views, &mut outputs, workspace)?;
        let names = self.graph.outputs().iter().map(|(n, _)| n.clone());
        Ok((names.zip(outputs).collect(), stats))
    }

    /// Runs the graph on `inputs` (by input name: NCHW views, such as slices of one buffer the
    /// caller keeps) and writes its outputs, in the order of `graph().outputs()`, into
    /// `outputs`: each is reshaped and its data resized in place, so that tensors kept from
    /// call to call are allocated once, at the largest output.
    ///
    /// After the run, the workspace keeps at most its budget of buffers (its own, else the
    /// engine's) and returns the rest to the operating system.
    pub fn run_into(
        &self,
        engine: &Engine,
        inputs: &[(&str, TensorView<'_>)],
        outputs: &mut [Tensor],
        workspace: &mut Workspace,
    ) -> Result<RunStats, GraphError> {
        engine.check_process().map_err(RuntimeError::from)?;
        if outputs.len() != self.graph.outputs().len() {
            return Err(GraphError::OutputCount {
                expected: self.graph.outputs().len(),
                found: outputs.len(),
            });
        }
        let compiles = engine.cache().stats().compiles;
        let mut blocked: Vec<Option<Buffer>> =
            (0..self.graph.values().count()).map(|_| None).collect();
        // The run drives its kernels from the engine's first thread, which takes a share of
        // every parallel call itself, with the others waiting busily for theirs.
        let result =
            engine.run_hot(|| self.execute(engine, inputs, outputs, workspace, &mut blocked));
        // Every buffer goes back, also after an error, so that the workspace's count stays true.
        for buf in blocked.into_iter().flatten() {
            workspace.give(buf);
        }
        workspace.finish_run(engine.workspace_config().budget);
        // Compiling a kernel allocates and frees megabytes that the C heap would keep: a run
        // that compiled gives those pages back.
        if engine.cache().stats().compiles != compiles {
            crate::exec::return_free_heap();
        }
        let mut stats = result?;
        stats.workspace = workspace.stats();
        Ok(stats)
    }

    /// The body of [`CompiledGraph::run_into`]: values' buffers are left in `blocked`.
    fn execute(
        &self,
        engine: &Engine,
        inputs: &[(&str, TensorView<'_>)],
        outputs: &mut [Tensor],
        workspace: &mut Workspace,
        blocked: &mut [Option<Buffer>],
    ) -> Result<RunStats, GraphError> {
        let given: Vec<(&str, &[usize])> = inputs.iter().map(|(n, t)| (*n, t.shape)).collect();
        let bindings = self.graph.bind_inputs(&given, &Bindings::new())?;
        for (name, t) in inputs {
            // A count that overflows is reported as needing `usize::MAX`, as the reference does.
            let expected = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if expected != Some(t.data.len()) {
                return Err(GraphError::InputData {
                    name: name.to_string(),
                    shape: t.shape.to_vec(),
                    expected: expected.unwrap_or(usize::MAX),
                    found: t.data.len(),
                });
            }
        }
        let shapes = infer_shapes(&self.graph, &bindings)?;
        let keys = keys_at(&self.graph, &shapes, self.runtime_dims(), &self.algos())?;
        let run_inputs = RunInputs {
            engine,
            keys: &keys,
            shapes: &shapes,
            inputs,
        };

        // Values in nChw4c buffers; graph inputs are read from the caller's tensors, and get a
        // blocked copy only where an op needs one.
        let mut live_bytes = 0usize;
        for input in self.graph.inputs() {
            if self.needs_blocked(input.value) {
                let t = run_inputs.input(&self.graph, input.value);
                let s = run_inputs.shape4(input.value);
                let mut buf = take_whole(workspace, Layout::Nchw4c.buffer_len(s))?;
                // The reorder writes real channels only: the padding lanes must be zeros.
                buf.fill(0.0);
                layout::reorder(t.data, Layout::Nchw, &mut buf, Layout::Nchw4c, s);
                live_bytes += buf.len() * 4;
                blocked[input.value.index()] = Some(buf);
            }
        }
        let mut stats = RunStats {
            peak_activation_bytes: live_bytes,
            ..RunStats::default()
        };

        // The leading convolutions in bands, when the image is wider than one: their calls'
        // kernels, and the other nodes', are all known before the first runs, so that the
        // missing ones compile at once on the engine's threads.
        let banded = self.banded_run(&shapes, &keys);
        // The segment is the graph's first nodes; the others run on whole tensors.
        let whole_from = banded.as_ref().map_or(0, |b| b.segment.nodes.len());
        engine.prefetch(
            banded
                .iter()
                .flat_map(|b| &b.kernels)
                .chain(keys[whole_from..].iter().map(|(_, k)| k)),
        );
        let mut streamed = 0;
        if let Some(banded) = &banded {
            let run = self.execute_segment(
                banded, run_inputs, workspace, blocked, live_bytes, &mut stats,
            )?;
            streamed = banded.segment.nodes.len();
            live_bytes += run.whole_bytes;
            for input in self.graph.inputs() {
                if self.last_use[input.value.index()] < streamed
                    && let Some(buf) = blocked[input.value.index()].take()
                {
                    live_bytes -= buf.len() * 4;
                    workspace.give(buf);
                }
            }
            stats.segments.push(run);
            // The segment's band buffers are too small for the whole tensors that follow:
            // kept free, they stayed under them (at W=7680, 36 MB of bands below 22 MB of
            // whole tensors and scratch: a workspace peak of 58 MB for 32 MB live). They are
            // idle for the rest of the run, so the budget for idle buffers applies to them now
            // rather than after the run; the next streamed call maps what it lost again.
            workspace.trim_to_budget(engine.workspace_config().budget);
        }

        for (n, _) in self.graph.nodes().skip(streamed) {
            self.execute_node(
                n,
                run_inputs,
                workspace,
                blocked,
                &mut live_bytes,
                &mut stats,
            )?;
        }

        for ((_, v), out) in self.graph.outputs().iter().zip(outputs) {
            let s = run_inputs.shape4(*v);
            out.shape.clear();
            out.shape.extend_from_slice(&s);
            out.data.resize(Layout::Nchw.buffer_len(s), 0.0);
            layout::reorder(
                blocked[v.index()].as_deref().expect("outputs are computed"),
                Layout::Nchw4c,
                &mut out.data,
                Layout::Nchw,
                s,
            );
        }
        Ok(stats)
    }

    /// Runs node `n` on whole tensors: its destination from the workspace (or its residual's
    /// buffer, when it writes over it), its scratch for the call, and back to the workspace the
    /// buffers of the values it reads for the last time.
    fn execute_node(
        &self,
        n: Node,
        run: RunInputs<'_>,
        workspace: &mut Workspace,
        blocked: &mut [Option<Buffer>],
        live_bytes: &mut usize,
        stats: &mut RunStats,
    ) -> Result<(), GraphError> {
        let engine = run.engine;
        let (i, node) = (n.index(), self.graph.node(n));
        let (name, key) = &run.keys[i];
        let primitive = engine.compile(key)?;
        let out_len = Layout::Nchw4c.buffer_len(run.shape4(node.result));
        // A conv writes over its residual when nothing reads the residual after it (planned
        // in `new`), its kernel allows it, and the residual has a buffer of the output's
        // length; the residual's buffer then becomes the output's.
        let over_residual = self.overwrites[i]
            .filter(|_| self.in_place && primitive.residual_in_place())
            .filter(|r| {
                blocked[r.index()]
                    .as_ref()
                    .is_some_and(|b| b.len() == out_len)
            });
        let mut dst = match over_residual {
            Some(r) => blocked[r.index()].take().expect("checked above"),
            None => {
                let dst = take_whole(workspace, out_len)?;
                *live_bytes += out_len * 4;
                dst
            }
        };
        stats.peak_activation_bytes = stats.peak_activation_bytes.max(*live_bytes);
        let src_of = |v: Value| -> &[f32] {
            match (&blocked[v.index()], layout_of(&self.graph, v)) {
                (_, Layout::Nchw) => run.input(&self.graph, v).data,
                (Some(b), _) => b,
                (None, _) => unreachable!("values are computed before use"),
            }
        };
        let blocked_of =
            |v: Value| -> &[f32] { blocked[v.index()].as_deref().expect("blocked before use") };
        // A runtime key runs at its input's extents.
        let extents = match &node.op {
            Op::Conv2d(c) if key.runtime_dims().any() => Some(c.input),
            Op::Pool2d(p) if key.runtime_dims().any() => Some(p.input),
            Op::BatchNorm(bn) if key.runtime_dims().any() => Some(bn.input),
            Op::Resize(r) if key.runtime_dims().any() => Some(r.input),
            Op::ConvTranspose(c) if key.runtime_dims().any() => Some(c.input),
            _ => None,
        }
        .map(|v| {
            let [_, _, h, w] = run.shape4(v);
            [h, w]
        });
        let execute = |args: ExecArgs<'_>| match (over_residual, extents) {
            (Some(_), e) => engine.execute_over_residual(&primitive, args, e),
            (None, Some(e)) => engine.execute_at(&primitive, args, e),
            (None, None) => engine.execute(&primitive, args),
        };
        let start = std::time::Instant::now();
        // Per thread: a fused pool's band of the conv's output, or Winograd's transformed
        // tiles.
        let band = match key {
            PrimitiveKey::Conv(d) => extents.map_or_else(|| d.clone(), |e| d.at(e)).scratch_len(),
            _ => 0,
        };
        let mut scratch = match band {
            0 => None,
            _ => Some(take_whole(workspace, band * engine.threads())?),
        };
        let scratch_bytes = scratch.as_ref().map_or(0, |s| s.len() * 4);
        stats.peak_activation_bytes = stats.peak_activation_bytes.max(*live_bytes + scratch_bytes);
        let (src, weights, extra) = call_operands(
            &node.op,
            &self.prepared[i],
            over_residual,
            src_of,
            blocked_of,
        );
        let ran = execute(ExecArgs {
            src,
            weights,
            dst: &mut dst,
            extra: &extra,
            scratch: scratch.as_deref_mut(),
        });
        if let Some(s) = scratch {
            workspace.give(s);
        }
        // The destination is the value's buffer from here on, also when the call failed,
        // so that the caller gives it back.
        blocked[node.result.index()] = Some(dst);
        ran?;
        stats.nodes.push(NodeRun {
            name: name.clone(),
            call_key: extents.map_or_else(|| key.clone(), |e| key.at(e)),
            primitive,
            seconds: start.elapsed().as_secs_f64(),
        });
        // Buffers whose value is read for the last time by this node go back.
        for v in node.op.value_operands() {
            if self.last_use[v.index()] == i
                && let Some(buf) = blocked[v.index()].take()
            {
                *live_bytes -= buf.len() * 4;
                workspace.give(buf);
            }
        }
        Ok(())
    }

    /// Whether graph input `input` needs a blocked (`nChw4c`) copy: an op reads it as a
    /// value's buffer (element-wise operands, residuals, concat, resize), or it is an output.
    /// Convolutions and pooling read the caller's NCHW data where it lies.
    fn needs_blocked(&self, input: Value) -> bool {
        let read_blocked = |op: &Op| match op {
            Op::Relu { input: x } => *x == input,
            Op::Add { lhs, rhs } => *lhs == input || *rhs == input,
            Op::Conv2d(c) => c.post_ops.contains(&PostOp::Add(input)),
            Op::Act { .. }
            | Op::PRelu { .. }
            | Op::Binary { .. }
            | Op::Concat { .. }
            | Op::SelectChannels { .. }
            | Op::ConvTranspose(_) => op.value_operands().contains(&input),
            // Only the resized value is read; the one whose extents it takes is not.
            Op::Resize(r) => r.input == input,
            _ => false,
        };
        self.graph.nodes().any(|(_, n)| read_blocked(&n.op))
            || self.graph.outputs().iter().any(|(_, v)| *v == input)
    }
}

/// What a node's call reads besides its destination and scratch: its source (`src_of`: a
/// graph input's own NCHW data, or a value's `nChw4c` buffer), its packed weights, and its
/// other operands (`blocked_of`): a conv's residuals but the one it writes over, a binary
/// op's second operand, PReLU's slopes, Concat's other inputs.
fn call_operands<'a>(
    op: &'a Op,
    prepared: &'a Prepared,
    over_residual: Option<Value>,
    src_of: impl Fn(Value) -> &'a [f32],
    blocked_of: impl Fn(Value) -> &'a [f32],
) -> (&'a [f32], Option<&'a [f32]>, Vec<&'a [f32]>) {
    match (op, prepared) {
        (Op::Conv2d(c), Prepared::Conv { packed, .. }) => {
            let residuals = c
                .post_ops
                .iter()
                .filter_map(|p| match p {
                    PostOp::Add(r) if over_residual != Some(*r) => Some(blocked_of(*r)),
                    _ => None,
                })
                .collect();
            (src_of(c.input), Some(packed.as_slice()), residuals)
        }
        (Op::BatchNorm(bn), Prepared::Conv { packed, .. }) => {
            (src_of(bn.input), Some(packed.as_slice()), Vec::new())
        }
        (Op::ConvTranspose(c), Prepared::Conv { packed, .. }) => {
            (blocked_of(c.input), Some(packed.as_slice()), Vec::new())
        }
        (Op::Pool2d(p), _) => (src_of(p.input), None, Vec::new()),
        (Op::GlobalPool { input, .. }, _) => (src_of(*input), None, Vec::new()),
        (
            Op::Relu { input }
            | Op::Act { input, .. }
            | Op::SelectChannels { input, .. }
            | Op::Resize(primjit_ir::Resize { input, .. }),
            _,
        ) => (blocked_of(*input), None, Vec::new()),
        (Op::Add { lhs, rhs } | Op::Binary { lhs, rhs, .. }, _) => {
            (blocked_of(*lhs), None, vec![blocked_of(*rhs)])
        }
        (Op::PRelu { input, .. }, Prepared::Slope(slope)) => {
            (blocked_of(*input), None, vec![slope.as_slice()])
        }
        (Op::Concat { inputs }, _) => {
            let rest = inputs[1..].iter().map(|&v| blocked_of(v)).collect();
            (blocked_of(inputs[0]), None, rest)
        }
        (
            Op::Conv2d(_) | Op::BatchNorm(_) | Op::ConvTranspose(_),
            Prepared::Slope(_) | Prepared::Other,
        )
        | (Op::PRelu { .. }, Prepared::Conv { .. } | Prepared::Other) => {
            unreachable!("convs and prelus are prepared")
        }
    }
}

/// Folds and fuses a verified graph as [`CompiledGraph`] runs it with `conv_algo`'s
/// algorithms at tier `isa` (`passes::optimize_with`): a max pool fuses into the conv before
/// it unless that conv takes Winograd, which takes no fused pool and gains more than the fusion
/// would (CRNN's 512-channel conv with its 2x1 pool: 14.3 ms direct and fused, 6.1 ms in
/// Winograd and 0.07 ms of pool). What `dump` and `run` show and run is this graph.
pub fn optimize_graph(graph: &mut Graph, conv_algo: ConvAlgoChoice, isa: Isa) -> PassReport {
    let mut channels = None;
    passes::optimize_with(graph, |graph, conv| {
        // Channel counts, which fusing pools does not change, as the graph has them before
        // the first pool joins its conv.
        let Ok(shapes) = channels.get_or_insert_with(|| graph.verify()) else {
            return true;
        };
        conv_desc_shell(graph, conv, shapes, conv_algo, isa).algo == ConvAlgo::Direct
    })
}

/// Per value of `graph`: the index of the last node reading it, `usize::MAX` for outputs.
fn last_uses(graph: &Graph) -> Vec<usize> {
    let mut last_use = vec![0; graph.values().count()];
    for (i, (_, node)) in graph.nodes().enumerate() {
        for v in node.op.value_operands() {
            last_use[v.index()] = i;
        }
    }
    for (_, v) in graph.outputs() {
        last_use[v.index()] = usize::MAX;
    }
    last_use
}

/// The streamed segment of an optimized graph at `bindings` with `streaming` and `conv_algo`'s
/// algorithms, as a run would execute it (`dump --stage plan`): its nodes, their calls, windows and halos, and the bytes
/// it holds. `None` when nothing streams (streaming is off, no convolution leads the graph,
/// or the run is too narrow or small to stream: `Segment::pays_at`).
pub fn describe_stream_plan(
    graph: &Graph,
    bindings: &Bindings,
    conv_algo: ConvAlgoChoice,
    isa: Isa,
    streaming: Streaming,
) -> Result<Option<String>, GraphError> {
    let Some(StreamedRun {
        shapes,
        segment,
        band,
        schedule,
    }) = streamed_run(
        graph,
        bindings,
        &node_keys_in(graph, bindings, ShapeMode::Exact, conv_algo, isa)?,
        streaming,
    )?
    else {
        return Ok(None);
    };
    let name = |v: Value| graph.value_name(v);
    let first = segment.nodes[0].output;
    let last = segment.nodes.last().expect("non-empty").output;
    let mut text = format!(
        "streamed segment %{}..%{}: bands of {band} columns of %{}, {} sweeps, {} calls\n",
        name(first),
        name(last),
        name(first),
        schedule.sweeps,
        schedule.calls.len()
    );
    if let Some((node, reads)) = segment.ends_before {
        let next = graph
            .nodes()
            .nth(node)
            .expect("a node of the graph")
            .1
            .result;
        text.push_str(&format!(
            "  ends before %{}: its band calls would read its weights from memory {reads:.2} \
             times as often per flop as a whole call (more than {})\n",
            name(next),
            stream::MAX_BAND_WEIGHT_READS
        ));
    }
    let (mut window_bytes, mut whole_bytes) = (0, 0);
    for (i, (node, &whole)) in segment.nodes.iter().zip(&segment.whole).enumerate() {
        let s = shapes.concrete(node.output).expect("bound");
        let column_bytes = Layout::Nchw4c.buffer_len([s[0], s[1], s[2], 1]) * 4;
        let widest = schedule
            .calls
            .iter()
            .filter(|c| c.node == i)
            .map(|c| c.x1 - c.x0)
            .max()
            .unwrap_or(0);
        let calls = schedule.calls.iter().filter(|c| c.node == i).count();
        let held = if whole {
            whole_bytes += column_bytes * node.out_width();
            format!("whole tensor ({} bytes)", column_bytes * node.out_width())
        } else if let Some(r) = schedule.overwritten(&segment, i) {
            let home = segment.nodes[schedule.home(i)].output;
            format!("written over %{} in the window of %{}", name(r), name(home))
        } else {
            let (cols, pitch) = (schedule.window_columns[i], schedule.window_pitch[i]);
            let (rows, _) = stream::rows_and_elem(Layout::Nchw4c, [s[0], s[1], s[2], s[3]]);
            let bytes = Window::len(rows, pitch, node.out_width()) * 4;
            window_bytes += bytes;
            format!(
                "window of {cols} columns in rows of {pitch}: bands of up to {widest} and {} of \
                 halo ({bytes} bytes)",
                cols - widest.min(cols),
            )
        };
        text.push_str(&format!(
            "  %{}: {} columns in {calls} calls, {held}\n",
            name(node.output),
            node.out_width()
        ));
    }
    text.push_str(&format!(
        "  holds {window_bytes} bytes of windows and {whole_bytes} bytes of whole tensors; \
         kernels read and write the windows in place, and copy in only graph inputs and whole \
         tensors\n"
    ));
    Ok(Some(text))
}

/// What a run of an optimized graph at some bindings streams: the shapes, the segment, its
/// band and its calls.
struct StreamedRun {
    shapes: primjit_ir::Shapes,
    segment: Segment,
    band: usize,
    schedule: Schedule,
}

/// The streamed segment of a run of an optimized `graph` at `bindings` with `streaming`, whose
/// nodes have `keys` (in any shape mode: whether a kernel writes over its residual does not
/// depend on it), as the run plans it; `None` when nothing streams.
fn streamed_run(
    graph: &Graph,
    bindings: &Bindings,
    keys: &[(String, PrimitiveKey)],
    streaming: Streaming,
) -> Result<Option<StreamedRun>, GraphError> {
    if streaming.band().is_none() {
        return Ok(None);
    }
    let shapes = infer_shapes(graph, bindings)?;
    let last_use = last_uses(graph);
    let overwrites = honoured_overwrites(&residual_overwrites(graph, &last_use), keys);
    let streamed =
        stream::streamed_segment(graph, &shapes, keys, &last_use, &overwrites, streaming);
    Ok(streamed.map(|(segment, band)| StreamedRun {
        schedule: segment.schedule(band),
        shapes,
        segment,
        band,
    }))
}

/// A kernel that a streamed run calls for one node of its segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BandKernel {
    /// The node (its value's name, without `%`).
    pub node: String,
    /// The key: the node's with a band's width and padding and its windows' row pitches.
    pub key: PrimitiveKey,
    /// How many of the node's calls use it.
    pub calls: usize,
    /// The output columns `[begin, end)` of the first of them.
    pub first_columns: [usize; 2],
}

/// The kernels a run of an optimized `graph` at `bindings` calls for the nodes of its
/// streamed segment (`dump --bands`): each node's distinct keys once (nodes of one shape share
/// their primitives in the engine's cache, but each lists its own), in the order of first call,
/// made in `mode` with `conv_algo`'s algorithms as [`node_keys_in`] makes the nodes' own.
/// `None` when nothing streams (see [`describe_stream_plan`]).
pub fn stream_band_kernels(
    graph: &Graph,
    bindings: &Bindings,
    mode: ShapeMode,
    conv_algo: ConvAlgoChoice,
    isa: Isa,
    streaming: Streaming,
) -> Result<Option<Vec<BandKernel>>, GraphError> {
    let keys = node_keys_in(graph, bindings, mode, conv_algo, isa)?;
    let Some(run) = streamed_run(graph, bindings, &keys, streaming)? else {
        return Ok(None);
    };
    let mut kernels: Vec<BandKernel> = Vec::new();
    for call in &run.schedule.calls {
        let s = &run.segment.nodes[call.node];
        let input = run.shapes.concrete(s.input).expect("bound");
        let (name, whole) = &keys[s.node];
        let key = run
            .segment
            .call_key(&run.schedule, call, whole, [input[2], input[3]]);
        match kernels.iter_mut().find(|k| k.node == *name && k.key == key) {
            Some(k) => k.calls += 1,
            None => kernels.push(BandKernel {
                node: name.clone(),
                key,
                calls: 1,
                first_columns: [call.x0, call.x1],
            }),
        }
    }
    Ok(Some(kernels))
}

/// Packed weights in pages of their own (huge pages where the system allows).
fn weight_buffer(packed: &[f32]) -> Result<Arc<WeightBuffer>, GraphError> {
    WeightBuffer::from_slice(packed)
        .map(Arc::new)
        .map_err(|e| GraphError::Weights(e.to_string()))
}

/// Of `overwrites` (per node, the residual its conv may write over), those whose node's kernel
/// (`keys`) can (`primjit_codegen::residual_in_place`); the kernel's width, padding and row
/// pitches do not change that, so a streamed node's band kernels can as its whole key can.
fn honoured_overwrites(
    overwrites: &[Option<Value>],
    keys: &[(String, PrimitiveKey)],
) -> Vec<Option<Value>> {
    overwrites
        .iter()
        .zip(keys)
        .map(|(r, (_, key))| r.filter(|_| primjit_codegen::residual_in_place(key)))
        .collect()
}

/// Per node of an optimized graph: the residual its conv may write its output over. That is a
/// conv's only `add` post-op (and no fused pool) whose value no later node reads
/// (`last_use`, with `usize::MAX` for graph outputs), and which is not the conv's own input:
/// the kernel then reads each residual element only right before it writes the output
/// element at the same place (`primjit_codegen::residual_in_place`), and nothing else reads it.
fn residual_overwrites(graph: &Graph, last_use: &[usize]) -> Vec<Option<Value>> {
    graph
        .nodes()
        .enumerate()
        .map(|(i, (_, node))| {
            let Op::Conv2d(c) = &node.op else {
                return None;
            };
            let mut adds = c.post_ops.iter().filter_map(|p| match p {
                PostOp::Add(r) => Some(*r),
                _ => None,
            });
            let pooled = c.post_ops.iter().any(|p| matches!(p, PostOp::MaxPool(_)));
            match (adds.next(), adds.next()) {
                (Some(r), None) if !pooled && r != c.input && last_use[r.index()] == i => Some(r),
                _ => None,
            }
        })
        .collect()
}

/// A conv descriptor with the node's channels, kernel, layouts, bias and the algorithm
/// `conv_algo` picks for it, at a placeholder spatial size: enough for packing and for the
/// choice, neither of which depends on the spatial shape.
fn conv_desc_shell(
    graph: &Graph,
    c: &primjit_ir::Conv2d,
    shapes: &primjit_ir::Shapes,
    conv_algo: ConvAlgoChoice,
    isa: Isa,
) -> ConvDesc {
    let w = &graph.param(c.weight).shape;
    let ic = shapes
        .get(c.input)
        .and_then(|s| s[1].known())
        .expect("verified channels") as usize;
    let ext = |k: usize, d: usize| d * (k - 1) + 1;
    let mut d = ConvDesc::new(
        1,
        ic,
        [ext(w[2], c.dilations[0]), ext(w[3], c.dilations[1])],
        w[0],
        [w[2], w[3]],
    );
    d.dilations = c.dilations;
    d.groups = c.groups;
    d.strides = c.strides;
    d.pool = fused_pool(c);
    d.src_layout = layout_of(graph, c.input);
    d.dst_layout = Layout::Nchw4c;
    d.bias = c.bias.is_some();
    d.algo = conv_algo.pick(&d);
    // The post-ops decide the tier (a wide tile computes only some), and so the packing.
    d.post_ops = post_op_descs(c);
    d.isa = d.tier_for(isa);
    d
}

/// A conv's post-ops as its key lists them: all but the fused max pool, which is the key's
/// `pool`.
fn post_op_descs(c: &primjit_ir::Conv2d) -> Vec<PostOpDesc> {
    c.post_ops
        .iter()
        .filter_map(|p| match p {
            PostOp::Relu => Some(PostOpDesc::Relu),
            PostOp::Add(_) => Some(PostOpDesc::Add),
            PostOp::Clip { lo, hi } => Some(PostOpDesc::Clip { lo: *lo, hi: *hi }),
            PostOp::MaxPool(_) => None,
            PostOp::Act(a) => Some(PostOpDesc::Act(*a)),
        })
        .collect()
}

/// The window of a conv's fused max pool, if it has one.
fn fused_pool(c: &primjit_ir::Conv2d) -> Option<primjit_codegen::PoolWindow> {
    c.post_ops.iter().find_map(|p| match p {
        PostOp::MaxPool(w) => Some(*w),
        _ => None,
    })
}

/// The key of a transposed convolution whose input has shape `[n, ic, ih, iw]`.
fn conv_transpose_desc(
    graph: &Graph,
    ct: &primjit_ir::ConvTranspose2d,
    [n, ic, ih, iw]: [usize; 4],
) -> ConvTransposeDesc {
    let w = &graph.param(ct.weight).shape;
    ConvTransposeDesc {
        mb: n,
        ic,
        ih,
        iw,
        oc: w[1] * ct.groups,
        kh: w[2],
        kw: w[3],
        strides: ct.strides,
        dilations: ct.dilations,
        pads: ct.pads,
        output_padding: ct.output_padding,
        groups: ct.groups,
        bias: ct.bias.is_some(),
        runtime: RuntimeDims::NONE,
    }
}

/// A batch-norm as a depthwise 1x1 convolution with bias.
fn bn_desc_shell(channels: usize, src_layout: Layout) -> ConvDesc {
    let mut d = ConvDesc::new(1, channels, [1, 1], channels, [1, 1]);
    d.groups = channels;
    d.bias = true;
    d.src_layout = src_layout;
    d.dst_layout = Layout::Nchw4c;
    d
}

/// Per node of a verified graph: which spatial extents of its input depend on a symbol (for
/// convolutions, pooling and batch-norms; none for other ops).
fn symbolic_dims(graph: &Graph, shapes: &primjit_ir::Shapes) -> Vec<RuntimeDims> {
    graph
        .nodes()
        .map(|(_, node)| {
            let input = match &node.op {
                Op::Conv2d(c) => c.input,
                Op::Pool2d(p) => p.input,
                Op::BatchNorm(bn) => bn.input,
                // Fixed sizes and another value's extents are not a function of the input's.
                Op::Resize(r) if matches!(r.size, ResizeSize::Scale(_)) => r.input,
                Op::ConvTranspose(c) => c.input,
                _ => return RuntimeDims::NONE,
            };
            let dims = shapes.get(input).expect("verified");
            RuntimeDims {
                h: dims[2].known().is_none(),
                w: dims[3].known().is_none(),
            }
        })
        .collect()
}

/// The primitive key of every node of an optimized graph at the shapes that `bindings` give,
/// with the layouts the executor uses.
pub fn node_keys(
    graph: &Graph,
    bindings: &Bindings,
) -> Result<Vec<(String, PrimitiveKey)>, GraphError> {
    let isa = crate::config::env_isa().map_err(RuntimeError::from)?;
    node_keys_in(graph, bindings, ShapeMode::Exact, ConvAlgoChoice::Auto, isa)
}

/// [`node_keys`] in a given [`ShapeMode`] and with the convolution algorithms `conv_algo`
/// chooses, as [`CompiledGraph::with_conv_algo`] would: with `Runtime`, the keys of
/// convolutions and pooling leave their symbolic extents to run time.
pub fn node_keys_in(
    graph: &Graph,
    bindings: &Bindings,
    mode: ShapeMode,
    conv_algo: ConvAlgoChoice,
    isa: Isa,
) -> Result<Vec<(String, PrimitiveKey)>, GraphError> {
    let verified = graph.verify()?;
    let algos: Vec<(ConvAlgo, Isa)> = graph
        .nodes()
        .map(|(_, node)| match &node.op {
            Op::Conv2d(c) => {
                let d = conv_desc_shell(graph, c, &verified, conv_algo, isa);
                (d.algo, d.isa)
            }
            _ => (ConvAlgo::Direct, Isa::X128),
        })
        .collect();
    let shapes = infer_shapes(graph, bindings)?;
    match mode {
        ShapeMode::Exact => keys_at(graph, &shapes, None, &algos),
        ShapeMode::Runtime => {
            let symbolic = symbolic_dims(graph, &verified);
            keys_at(graph, &shapes, Some(&symbolic), &algos)
        }
    }
}

/// The primitive key of every node, given the graph's inferred shapes; `runtime` gives, per
/// node, the extents its key leaves to run time, and `algos` its convolution algorithm and
/// tier.
fn keys_at(
    graph: &Graph,
    shapes: &primjit_ir::Shapes,
    runtime: Option<&[RuntimeDims]>,
    algos: &[(ConvAlgo, Isa)],
) -> Result<Vec<(String, PrimitiveKey)>, GraphError> {
    let concrete = |v: Value| {
        shapes
            .concrete(v)
            .map(|s| [s[0], s[1], s[2], s[3]])
            .ok_or_else(|| GraphError::Unbound {
                value: graph.value_name(v).to_string(),
                shape: shapes.describe(v),
            })
    };
    let mut out = Vec::new();
    for (i, (_, node)) in graph.nodes().enumerate() {
        let rt = runtime.map_or(RuntimeDims::NONE, |r| r[i]);
        let name = graph.value_name(node.result).to_string();
        let src_layout = |v| layout_of(graph, v);
        let key = match &node.op {
            Op::Conv2d(c) => {
                let [n, ic, ih, iw] = concrete(c.input)?;
                let w = &graph.param(c.weight).shape;
                PrimitiveKey::Conv(
                    ConvDesc {
                        mb: n,
                        ic,
                        ih,
                        iw,
                        oc: w[0],
                        kh: w[2],
                        kw: w[3],
                        strides: c.strides,
                        dilations: c.dilations,
                        pads: c.pads,
                        groups: c.groups,
                        bias: c.bias.is_some(),
                        post_ops: post_op_descs(c),
                        pool: fused_pool(c),
                        src_layout: src_layout(c.input),
                        dst_layout: Layout::Nchw4c,
                        runtime: RuntimeDims::NONE,
                        algo: algos[i].0,
                        pitches: Pitches::DENSE,
                        isa: algos[i].1,
                    }
                    .with_runtime(rt),
                )
            }
            Op::Pool2d(p) => {
                let [n, c, ih, iw] = concrete(p.input)?;
                PrimitiveKey::Pool(
                    PoolDesc {
                        kind: p.kind,
                        mb: n,
                        c,
                        ih,
                        iw,
                        window: p.window,
                        count_include_pad: p.count_include_pad,
                        src_layout: src_layout(p.input),
                        dst_layout: Layout::Nchw4c,
                        runtime: RuntimeDims::NONE,
                    }
                    .with_runtime(rt),
                )
            }
            Op::GlobalPool { kind, input } => {
                let [n, c, ih, iw] = concrete(*input)?;
                PrimitiveKey::GlobalPool(GlobalPoolDesc {
                    kind: *kind,
                    mb: n,
                    c,
                    ih,
                    iw,
                    src_layout: src_layout(*input),
                    dst_layout: Layout::Nchw4c,
                })
            }
            Op::Relu { input } => PrimitiveKey::Eltwise(EltwiseDesc {
                kind: EltwiseKind::Relu,
                shape: concrete(*input)?,
                layout: Layout::Nchw4c,
            }),
            Op::Add { lhs, .. } => PrimitiveKey::Eltwise(EltwiseDesc {
                kind: EltwiseKind::Add,
                shape: concrete(*lhs)?,
                layout: Layout::Nchw4c,
            }),
            Op::BatchNorm(bn) => {
                let [n, c, ih, iw] = concrete(bn.input)?;
                let mut d = bn_desc_shell(c, src_layout(bn.input));
                d.mb = n;
                d.ih = ih;
                d.iw = iw;
                PrimitiveKey::Conv(d.with_runtime(rt))
            }
            Op::Act { act, input } => PrimitiveKey::Eltwise(EltwiseDesc {
                kind: EltwiseKind::Act(*act),
                shape: concrete(*input)?,
                layout: Layout::Nchw4c,
            }),
            Op::PRelu { input, .. } => PrimitiveKey::Eltwise(EltwiseDesc {
                kind: EltwiseKind::PRelu,
                shape: concrete(*input)?,
                layout: Layout::Nchw4c,
            }),
            Op::Binary { kind, lhs, rhs } => {
                let (a, b) = (concrete(*lhs)?, concrete(*rhs)?);
                let rhs = if a == b {
                    Broadcast::Full
                } else if b[0] == a[0] {
                    Broadcast::PerImageChannel
                } else {
                    Broadcast::PerChannel
                };
                PrimitiveKey::Eltwise(EltwiseDesc {
                    kind: EltwiseKind::Binary { op: *kind, rhs },
                    shape: a,
                    layout: Layout::Nchw4c,
                })
            }
            Op::Concat { inputs } => {
                let shapes = inputs
                    .iter()
                    .map(|&v| concrete(v))
                    .collect::<Result<Vec<_>, _>>()?;
                let [n, _, h, w] = shapes[0];
                PrimitiveKey::Concat(ConcatDesc {
                    mb: n,
                    channels: shapes.iter().map(|s| s[1]).collect(),
                    h,
                    w,
                    layout: Layout::Nchw4c,
                })
            }
            Op::Resize(r) => {
                let [n, c, ih, iw] = concrete(r.input)?;
                let [_, _, oh, ow] = concrete(node.result)?;
                let out = match r.size {
                    ResizeSize::Scale([sh, sw]) => ResizeOut::Scale([sh as usize, sw as usize]),
                    _ => ResizeOut::Sizes([oh, ow]),
                };
                PrimitiveKey::Resize(
                    ResizeDesc {
                        mb: n,
                        c,
                        ih,
                        iw,
                        out,
                        mode: r.mode,
                        coord: r.coord,
                        runtime: RuntimeDims::NONE,
                    }
                    .with_runtime(rt),
                )
            }
            Op::ConvTranspose(ct) => PrimitiveKey::ConvTranspose(
                conv_transpose_desc(graph, ct, concrete(ct.input)?).with_runtime(rt),
            ),
            Op::SelectChannels { input, select } => {
                let [n, c, h, w] = concrete(*input)?;
                PrimitiveKey::SelectChannels(SelectDesc {
                    mb: n,
                    c,
                    h,
                    w,
                    select: select.clone(),
                    layout: Layout::Nchw4c,
                })
            }
        };
        out.push((name, key));
    }
    Ok(out)
}

impl CompiledGraph {
    /// The streamed segment of a run at `shapes` with node keys `keys`, if the run streams:
    /// its schedule, and its calls' distinct kernel keys.
    fn banded_run(
        &self,
        shapes: &primjit_ir::Shapes,
        keys: &[(String, PrimitiveKey)],
    ) -> Option<BandedRun> {
        let (segment, band) = self.streamed_segment(shapes, keys)?;
        let schedule = segment.schedule(band);
        let mut kernels: Vec<PrimitiveKey> = Vec::new();
        let mut index: HashMap<PrimitiveKey, usize> = HashMap::new();
        let call_kernels = schedule
            .calls
            .iter()
            .map(|call| {
                let s = &segment.nodes[call.node];
                let input = shapes.concrete(s.input).expect("bound");
                let (ih, iw) = (input[2], input[3]);
                let key = segment.call_key(&schedule, call, &keys[s.node].1, [ih, iw]);
                *index.entry(key).or_insert_with_key(|key| {
                    kernels.push(key.clone());
                    kernels.len() - 1
                })
            })
            .collect();
        Some(BandedRun {
            segment,
            band,
            schedule,
            kernels,
            call_kernels,
        })
    }

    /// Runs the streamed segment of `banded` at the run's shapes (`run`): its whole outputs
    /// land in `blocked`, its nodes' runs in `stats.nodes`. `live_bytes` is what the run holds
    /// besides.
    fn execute_segment(
        &self,
        banded: &BandedRun,
        run_inputs: RunInputs<'_>,
        workspace: &mut Workspace,
        blocked: &mut [Option<Buffer>],
        live_bytes: usize,
        stats: &mut RunStats,
    ) -> Result<SegmentRun, GraphError> {
        let RunInputs { engine, keys, .. } = run_inputs;
        let BandedRun {
            segment,
            band,
            schedule,
            kernels,
            call_kernels,
        } = banded;
        let mut run = SegmentRun {
            first: keys[segment.nodes[0].node].0.clone(),
            last: keys[segment.nodes.last().expect("non-empty").node]
                .0
                .clone(),
            band: *band,
            sweeps: schedule.sweeps,
            calls: schedule.calls.len(),
            ..SegmentRun::default()
        };
        let mut state = SegmentState {
            segment,
            schedule,
            run: run_inputs,
            windows: Vec::with_capacity(segment.nodes.len()),
        };
        for (s, &whole) in segment.nodes.iter().zip(&segment.whole) {
            if whole {
                let len = Layout::Nchw4c.buffer_len(state.run.shape4(s.output));
                blocked[s.output.index()] = Some(take_buffer(workspace, len)?);
                run.whole_bytes += len * 4;
            }
        }
        let mut result = Ok(());
        for (i, s) in segment.nodes.iter().enumerate() {
            let pitch = schedule.window_pitch[i];
            // A value written over its residual lies in its home's window.
            if segment.whole[i] || schedule.home(i) != i {
                state.windows.push(None);
                continue;
            }
            let (rows, _) = stream::rows_and_elem(Layout::Nchw4c, state.run.shape4(s.output));
            match take_buffer(workspace, Window::len(rows, pitch, s.out_width())) {
                Ok(buf) => {
                    run.window_bytes += buf.len() * 4;
                    state.windows.push(Some(Window { buf, pitch }));
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut node_runs: Vec<Option<NodeRun>> = vec![None; segment.nodes.len()];
        let held = live_bytes + run.whole_bytes + run.window_bytes;
        run.peak_bytes = held;
        // Each kernel is looked up once for the segment, which makes hundreds of calls of a
        // few dozen kernels: looked up call by call, a cache with no room for them (budget 0)
        // compiled one for every call (567 compiles for one W=7680 call of the trunk).
        let mut primitives: Vec<Option<Arc<Primitive>>> = vec![None; kernels.len()];
        if result.is_ok() {
            for (call, &k) in schedule.calls.iter().zip(call_kernels) {
                let primitive = match &primitives[k] {
                    Some(p) => Ok(p.clone()),
                    None => engine
                        .compile(&kernels[k])
                        .inspect(|p| primitives[k] = Some(p.clone()))
                        .map_err(GraphError::from),
                };
                let ran = primitive.and_then(|primitive| {
                    self.execute_band(&mut state, call, &kernels[k], primitive, workspace, blocked)
                });
                match ran {
                    Ok((temp_bytes, node_run)) => {
                        run.peak_bytes = run.peak_bytes.max(held + temp_bytes);
                        match &mut node_runs[call.node] {
                            Some(r) => r.seconds += node_run.seconds,
                            slot => *slot = Some(node_run),
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        for window in state.windows.into_iter().flatten() {
            workspace.give(window.buf);
        }
        result?;
        stats.nodes.extend(node_runs.into_iter().flatten());
        stats.peak_activation_bytes = stats.peak_activation_bytes.max(run.peak_bytes);
        Ok(run)
    }

    /// One call of a streamed node, with its kernel's `key` (`Segment::call_key`) and
    /// `primitive`. The kernel reads its input columns and residuals where they are, in the
    /// windows of their producers, at their row pitch, and writes its output columns into its
    /// own window; only values outside the windows (graph inputs, whole tensors) are copied
    /// in, and a whole output is copied out. Returns the bytes of the copies, scratch and
    /// destination it took, and the node's run.
    fn execute_band(
        &self,
        state: &mut SegmentState<'_>,
        call: &Call,
        key: &PrimitiveKey,
        primitive: Arc<Primitive>,
        workspace: &mut Workspace,
        blocked: &mut [Option<Buffer>],
    ) -> Result<(usize, NodeRun), GraphError> {
        let RunInputs { engine, keys, .. } = state.run;
        let segment = state.segment;
        let s = &segment.nodes[call.node];
        let name = &keys[s.node].0;
        let ih = state.run.shape4(s.input)[2];
        let band_iw = call.input.end - call.input.begin;
        let out_shape = state.run.shape4(s.output);
        let (out_rows, _) = stream::rows_and_elem(Layout::Nchw4c, out_shape);
        let cols = call.x1 - call.x0;
        let schedule = state.schedule;
        let home = schedule.home(call.node);
        let call_key = key.at([ih, band_iw]);
        let specs = call_key.buffers();
        let PrimitiveKey::Conv(call_desc) = &call_key else {
            unreachable!("segments hold convolutions")
        };
        let dst_pitch = call_desc.pitches.dst;
        let band = BandCall {
            node: s,
            call,
            key,
            call_desc,
            specs: &specs,
            primitive: &primitive,
            input_window: schedule.window_of(segment, s.input),
            over_residual: schedule.overwritten(segment, call.node),
            extents: [ih, band_iw],
        };

        // The call's columns overwrite only columns no consumer reads any more (see `Window`).
        let mut out = state.windows[home].take();
        if let Some(w) = &out {
            debug_assert!(
                call.keep_from <= call.x0 && call.x1 - call.keep_from <= w.pitch,
                "the window of %{} holds the call's columns and those still read",
                self.graph.value_name(s.output)
            );
        }

        // Buffers of the call's own: copies in, a destination where the output is not written
        // in place, the scratch. All go back after the call, also when it fails.
        let mut temps: Vec<Buffer> = Vec::new();
        let result = self.run_band(state, &band, out.as_mut(), &mut temps, workspace, blocked);
        let copied_out = result.as_ref().map(|(_, _, dst_copy)| *dst_copy);
        // A destination of its own holds columns of a whole output (a window is written in
        // place): they go to the whole tensor.
        if let Ok(Some(i)) = copied_out {
            let whole = blocked[s.output.index()]
                .as_deref_mut()
                .expect("whole outputs are taken first");
            stream::copy_columns(
                stream::Columns {
                    data: &temps[i],
                    pitch: dst_pitch.unwrap_or(cols),
                    col: 0,
                },
                stream::Columns {
                    data: whole,
                    pitch: out_shape[3],
                    col: call.x0,
                },
                cols,
                out_rows,
                4,
                engine,
            );
        }
        for t in temps {
            workspace.give(t);
        }
        state.windows[home] = out;
        let (temp_bytes, seconds, _) = result?;
        Ok((
            temp_bytes,
            NodeRun {
                name: name.clone(),
                call_key,
                primitive,
                seconds,
            },
        ))
    }

    /// The kernel call of `band`, writing into `out` (the window of its output's home, if it
    /// has one): takes the buffers it needs into `temps`, copies in what lies outside the
    /// windows, and runs. Returns the bytes of `temps`, the call's seconds, and which of
    /// `temps` holds the output where it is not written into a window.
    fn run_band(
        &self,
        state: &SegmentState<'_>,
        band: &BandCall<'_>,
        mut out: Option<&mut Window>,
        temps: &mut Vec<Buffer>,
        workspace: &mut Workspace,
        blocked: &[Option<Buffer>],
    ) -> Result<(usize, f64, Option<usize>), GraphError> {
        let BandCall {
            node: s,
            call,
            key,
            call_desc,
            specs,
            primitive,
            input_window,
            over_residual,
            extents: [ih, band_iw],
        } = *band;
        let RunInputs { engine, .. } = state.run;
        let (segment, schedule) = (state.segment, state.schedule);
        let dst_len = specs[2].len;
        let windows = &state.windows;
        let mut take = |temps: &mut Vec<Buffer>, len: usize| -> Result<usize, GraphError> {
            temps.push(take_buffer(workspace, len)?);
            Ok(temps.len() - 1)
        };
        let src_copy = match input_window {
            Some(_) => None,
            None => Some(take(temps, specs[0].len)?),
        };
        // Residuals in windows of the destination's pitch are read in place; the one it
        // writes over is the destination itself.
        let res_pitch = call_desc.dst_pitch();
        let res_window = |r: Value| {
            schedule
                .window_of(segment, r)
                .and_then(|j| windows[j].as_ref())
                .filter(|w| w.pitch == res_pitch)
        };
        let residuals: Vec<Value> = s
            .residuals
            .iter()
            .copied()
            .filter(|&r| Some(r) != over_residual)
            .collect();
        // The kernel takes the residuals it reads from buffers of their own, in order.
        let res_specs = &specs[3..][..residuals.len()];
        let res_copies = residuals
            .iter()
            .zip(res_specs)
            .map(|(&r, spec)| match res_window(r) {
                Some(_) => Ok(None),
                None => take(temps, spec.len).map(Some),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let dst_copy = match &out {
            Some(_) => None,
            None => Some(take(temps, dst_len)?),
        };
        let scratch = match call_desc.scratch_len() {
            0 => None,
            n => Some(take(temps, n * engine.threads())?),
        };
        if let Some(i) = src_copy {
            self.gather(
                state,
                s.input,
                call.input.begin..call.input.end,
                &mut temps[i],
                band_iw,
                blocked,
            );
        }
        for (&r, copy) in residuals.iter().zip(&res_copies) {
            if let Some(i) = *copy {
                self.gather(
                    state,
                    r,
                    call.x0..call.x1,
                    &mut temps[i],
                    res_pitch,
                    blocked,
                );
            }
        }
        let temp_bytes = temps.iter().map(|b| b.len() * 4).sum::<usize>();

        let mut own: Vec<Option<&mut Buffer>> = temps.iter_mut().map(Some).collect();
        let mut own = |i: usize| own[i].take().expect("each buffer serves once");
        let src: &[f32] = match (input_window, src_copy) {
            (Some(j), _) => windows[j]
                .as_ref()
                .expect("a window")
                .columns(call.input.begin, specs[0].len),
            (None, Some(i)) => own(i),
            (None, None) => unreachable!("copied above"),
        };
        let extra: Vec<&[f32]> = residuals
            .iter()
            .zip(res_specs)
            .zip(&res_copies)
            .map(|((&r, spec), copy)| match copy {
                Some(i) => &own(*i)[..],
                None => res_window(r)
                    .expect("in a window")
                    .columns(call.x0, spec.len),
            })
            .collect();
        let dst: &mut [f32] = match (dst_copy, out.as_mut()) {
            (Some(i), _) => own(i),
            (None, Some(w)) => w.columns_mut(call.x0, dst_len),
            (None, None) => unreachable!("a destination is taken above"),
        };
        let Prepared::Conv { packed, .. } = &self.prepared[s.node] else {
            unreachable!("convs are prepared")
        };
        let args = ExecArgs {
            src,
            weights: Some(packed.as_slice()),
            dst,
            extra: &extra,
            scratch: scratch.map(|i| &mut own(i)[..]),
        };
        let extents = key.runtime_dims().any().then_some([ih, band_iw]);
        let start = std::time::Instant::now();
        match (over_residual, extents) {
            (Some(_), e) => engine.execute_over_residual(primitive, args, e)?,
            (None, Some(e)) => engine.execute_at(primitive, args, e)?,
            (None, None) => engine.execute(primitive, args)?,
        }
        Ok((temp_bytes, start.elapsed().as_secs_f64(), dst_copy))
    }

    /// Copies the columns `columns` of value `v` into `dst`, in rows `pitch` columns apart,
    /// from its window, its whole blocked tensor, or the caller's NCHW input; the rows are
    /// shared among the engine's threads.
    fn gather(
        &self,
        state: &SegmentState<'_>,
        v: Value,
        columns: std::ops::Range<usize>,
        dst: &mut [f32],
        pitch: usize,
        blocked: &[Option<Buffer>],
    ) {
        let RunInputs { engine, inputs, .. } = state.run;
        let (begin, cols) = (columns.start, columns.len());
        let shape = state.run.shape4(v);
        let layout = layout_of(&self.graph, v);
        let (rows, elem) = stream::rows_and_elem(layout, shape);
        // The source as (the column its data starts at, its data, row width).
        let home = state.schedule.window_of(state.segment, v);
        let (x0, data, width): (usize, &[f32], usize) =
            match home.and_then(|i| state.windows[i].as_ref()) {
                Some(w) => (begin, w.rows_from(begin), w.pitch),
                None => {
                    let data: &[f32] = match (&blocked[v.index()], layout) {
                        (Some(b), Layout::Nchw4c) => b,
                        _ => {
                            let name = self.graph.value_name(v);
                            inputs
                                .iter()
                                .find(|(n, _)| *n == name)
                                .map(|(_, t)| t.data)
                                .expect("bound inputs are present")
                        }
                    };
                    (0, data, shape[3])
                }
            };
        stream::copy_columns(
            stream::Columns {
                data,
                pitch: width,
                col: begin - x0,
            },
            stream::Columns {
                data: dst,
                pitch,
                col: 0,
            },
            cols,
            rows,
            elem,
            engine,
        );
    }
}

/// A run's streamed segment with its band, its calls, and their kernels.
struct BandedRun {
    segment: Segment,
    band: usize,
    schedule: Schedule,
    /// The calls' distinct kernel keys ([`Segment::call_key`]), in order of first use.
    kernels: Vec<PrimitiveKey>,
    /// Per call of `schedule`: the index of its kernel in `kernels`.
    call_kernels: Vec<usize>,
}

/// What every call of a run reads and none changes: the engine, the nodes' names and keys
/// (in graph order), the run's shapes and the caller's inputs.
#[derive(Clone, Copy)]
struct RunInputs<'a> {
    engine: &'a Engine,
    keys: &'a [(String, PrimitiveKey)],
    shapes: &'a primjit_ir::Shapes,
    inputs: &'a [(&'a str, TensorView<'a>)],
}

/// One call of a streamed node, at its band's extents: what `execute_band` hands its kernel
/// call (`run_band`).
#[derive(Clone, Copy)]
struct BandCall<'a> {
    node: &'a stream::SegmentNode,
    call: &'a Call,
    /// The kernel's key (`Segment::call_key`).
    key: &'a PrimitiveKey,
    /// The kernel's key at the band's extents, and its buffers.
    call_desc: &'a ConvDesc,
    specs: &'a [primjit_codegen::BufferSpec],
    primitive: &'a Primitive,
    /// The window that holds the call's input, read in place.
    input_window: Option<usize>,
    /// The residual the call writes its output over, in the window of its destination.
    over_residual: Option<Value>,
    /// The band's input extents `[ih, iw]`.
    extents: [usize; 2],
}

/// What a streamed segment holds between its calls: each windowed value's window.
struct SegmentState<'a> {
    segment: &'a Segment,
    schedule: &'a Schedule,
    run: RunInputs<'a>,
    /// Per node of the segment: the window of the values it is the home of
    /// (`Schedule::home`; `None` for a whole output or a value in another node's window).
    windows: Vec<Option<Window>>,
}

impl<'a> RunInputs<'a> {
    /// The run's shape of value `v`, which binding the inputs made concrete.
    fn shape4(&self, v: Value) -> [usize; 4] {
        let s = self.shapes.concrete(v).expect("bound");
        [s[0], s[1], s[2], s[3]]
    }

    /// The caller's tensor of graph input `v`.
    fn input(&self, graph: &Graph, v: Value) -> TensorView<'a> {
        let name = graph.value_name(v);
        self.inputs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .expect("bound inputs are present")
    }
}

/// The columns of a value read only inside its segment that its consumers still read, in
/// `nChw4c` rows `pitch` columns apart: its producer's calls write there, its consumers' read
/// there.
///
/// Column `x` of row `r` lies at float `4 (x + r pitch)` of the buffer, wherever the image
/// has got to: a row's columns past the pitch are the next row's first ones. So the window
/// holds any `pitch` consecutive columns of every row at once, and moves along the image
/// with no copy (the rows start further into the buffer as the columns advance, which is why
/// the buffer is longer than its rows by the value's width). Writing column `x` of a row
/// overwrites column `x - pitch` of the next, which no consumer reads any more: the schedule
/// keeps the columns still read and those a call writes within a pitch (`Call::keep_from`,
/// `Schedule::window_pitch`). A window used to keep its columns at its rows' starts and, before
/// a band passed its end, moved the halo there: 8 of every 64 columns of every row of the
/// trunk's layer1, copied in 128-byte pieces (13-17 ms of a W=7680 call on 2 threads).
struct Window {
    buf: Buffer,
    pitch: usize,
}

impl Window {
    /// Floats of the window of a value of `rows` rows of `width` columns, `pitch` apart.
    fn len(rows: usize, pitch: usize, width: usize) -> usize {
        (rows * pitch + width) * 4
    }

    /// The kernel's view of `len` floats from column `x` of the first row.
    fn columns(&self, x: usize, len: usize) -> &[f32] {
        &self.rows_from(x)[..len]
    }

    fn columns_mut(&mut self, x: usize, len: usize) -> &mut [f32] {
        &mut self.buf[x * 4..][..len]
    }

    /// The buffer from column `x` of the first row on: its rows, `pitch` columns apart.
    fn rows_from(&self, x: usize) -> &[f32] {
        &self.buf[x * 4..]
    }
}

/// A workspace buffer of `len` floats for a whole tensor, its failure as a graph error.
fn take_whole(workspace: &mut Workspace, len: usize) -> Result<Buffer, GraphError> {
    workspace.take(len).map_err(|e| GraphError::Workspace {
        bytes: len * 4,
        message: e.to_string(),
    })
}

/// A workspace buffer of `len` floats for a streamed segment (see [`REUSE_SLACK`]), its
/// failure as a graph error.
fn take_buffer(workspace: &mut Workspace, len: usize) -> Result<Buffer, GraphError> {
    workspace
        .take_within(len, REUSE_SLACK)
        .map_err(|e| GraphError::Workspace {
            bytes: len * 4,
            message: e.to_string(),
        })
}
