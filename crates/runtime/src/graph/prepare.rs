//! Preparing a graph: a [`CompiledGraph`] made from an IR graph and its parameters (optimized,
//! convolution weights packed once per model), and its settings.

use std::sync::Arc;

use primjit_codegen::{ConvAlgo, ConvAlgoChoice, Isa};
use primjit_ir::passes::{self, PassReport};
use primjit_ir::{Graph, Op, Params, PostOp, Value};

use super::alias::InPlace;
use super::keys::{conv_desc_shell, conv_transpose_desc, symbolic_dims};
use super::run::{last_uses, residual_overwrites};
use super::{CompiledGraph, GraphError, ShapeMode, WeightBytes};
use crate::error::RuntimeError;
use crate::exec::WeightBuffer;
use crate::stream::Streaming;

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
    ///
    /// [`Engine::isa`]: crate::Engine::isa
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
    ///
    /// [`Engine::isa`]: crate::Engine::isa
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
                    let slopes = c.post_ops.iter().find_map(|p| match p {
                        PostOp::PRelu(slope) => Some(params.get(*slope)),
                        _ => None,
                    });
                    let desc = conv_desc_shell(&graph, c, &shapes, conv_algo, isa);
                    Prepared::Conv {
                        packed: weight_buffer(&desc.pack_weights(
                            &w.data,
                            b.as_ref().map(|b| b.data.as_slice()),
                            slopes.as_ref().map(|s| s.data.as_slice()),
                        ))?,
                        algo: desc.algo,
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
                        // Its key takes the tier where `ConvTransposeDesc::tier_for` grants
                        // it; the packing is the same at every tier.
                        isa,
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
        let slices = InPlace::plan(&graph, &shapes, &overwrites);
        Ok(CompiledGraph {
            graph,
            prepared,
            last_use,
            overwrites,
            in_place: true,
            slices,
            slices_in_place: true,
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

    /// The same graph, with each concat's inputs written straight into their place in its
    /// output and each `select_channels` of a block of whole 4-channel groups read where it
    /// lies (`true`, the default, for runs of one image), or with a copy each (`false`). The
    /// results are the same to the bit; only the activation memory and the copies differ.
    /// [`Self::slices_in_place`] lists what is placed.
    pub fn with_slices_in_place(mut self, in_place: bool) -> Self {
        self.slices_in_place = in_place;
        self
    }

    /// The values a run of one image places in a slice of another's buffer, as (value, the
    /// value whose buffer holds it, its first channel there), by name: the inputs of concats
    /// (which then run nothing) and the channel blocks that `select_channels` reads in
    /// place. Values computed inside a streamed segment keep buffers of their own.
    pub fn slices_in_place(&self) -> Vec<(String, String, usize)> {
        let name = |v: Value| self.graph.value_name(v).to_string();
        self.graph
            .values()
            .filter_map(|v| {
                self.slices
                    .home(v)
                    .map(|h| (name(v), name(h.root), h.channel))
            })
            .collect()
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

    /// The optimized graph this runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
}

/// What a node needs besides its primitive.
#[derive(Clone, Debug)]
pub(super) enum Prepared {
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

/// Packed weights in pages of their own (huge pages where the system allows).
fn weight_buffer(packed: &[f32]) -> Result<Arc<WeightBuffer>, GraphError> {
    WeightBuffer::from_slice(packed)
        .map(Arc::new)
        .map_err(|e| GraphError::Weights(e.to_string()))
}
