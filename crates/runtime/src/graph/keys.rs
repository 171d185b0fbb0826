//! The primitive keys of a graph's nodes at a run's shapes, with the layouts the executor
//! uses, exact or with runtime extents ([`ShapeMode`]).

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    Broadcast, ConcatDesc, ConvAlgo, ConvAlgoChoice, ConvDesc, ConvTransposeDesc, EltwiseDesc,
    EltwiseKind, GlobalPoolDesc, Isa, Layout, Pitches, PoolDesc, PostOpDesc, PrimitiveKey,
    ResizeDesc, ResizeOut, SelectDesc,
};
use primjit_ir::{
    BinaryKind, Bindings, Graph, NodeData, Op, PostOp, ResizeSize, Value, infer_shapes,
};

use super::{CompiledGraph, GraphError, Prepared, ShapeMode};
use crate::error::RuntimeError;

impl CompiledGraph {
    /// The primitive key of every node at the shapes that `bindings` give.
    pub fn keys(&self, bindings: &Bindings) -> Result<Vec<(String, PrimitiveKey)>, GraphError> {
        keys_at(
            &self.graph,
            &infer_shapes(&self.graph, bindings)?,
            self.runtime_dims(),
            &self.algos(),
        )
    }

    /// Per node, the convolution algorithm and tier its keys use; for the other nodes, direct
    /// and the engine's tier, which a pooling or element-wise node's key takes where its
    /// tiles cover it (`PoolDesc::tier_for`, `EltwiseDesc::tier_for`).
    pub(super) fn algos(&self) -> Vec<(ConvAlgo, Isa)> {
        self.prepared
            .iter()
            .map(|p| match p {
                Prepared::Conv { algo, isa, .. } => (*algo, *isa),
                Prepared::Slope(_) | Prepared::Other => (ConvAlgo::Direct, self.isa),
            })
            .collect()
    }

    /// The runtime extents of each node's key in this graph's mode.
    pub(super) fn runtime_dims(&self) -> Option<&[RuntimeDims]> {
        (self.mode == ShapeMode::Runtime).then_some(self.symbolic.as_slice())
    }
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
            _ => (ConvAlgo::Direct, isa),
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
/// tier (for a pooling node, the engine's tier).
pub(super) fn keys_at(
    graph: &Graph,
    shapes: &primjit_ir::Shapes,
    runtime: Option<&[RuntimeDims]>,
    algos: &[(ConvAlgo, Isa)],
) -> Result<Vec<(String, PrimitiveKey)>, GraphError> {
    let keys = NodeKeys { graph, shapes };
    let mut out = Vec::new();
    for (i, (_, node)) in graph.nodes().enumerate() {
        let rt = runtime.map_or(RuntimeDims::NONE, |r| r[i]);
        let name = graph.value_name(node.result).to_string();
        out.push((name, keys.key(node, rt, algos[i])?));
    }
    Ok(out)
}

/// What the key of a node is made from besides the node itself: the graph (its parameters'
/// shapes, its inputs' layouts) and the run's inferred shapes.
struct NodeKeys<'a> {
    graph: &'a Graph,
    shapes: &'a primjit_ir::Shapes,
}

impl NodeKeys<'_> {
    /// The concrete shape of `v`, or which symbols it lacks.
    fn concrete(&self, v: Value) -> Result<[usize; 4], GraphError> {
        self.shapes
            .concrete(v)
            .map(|s| [s[0], s[1], s[2], s[3]])
            .ok_or_else(|| GraphError::Unbound {
                value: self.graph.value_name(v).to_string(),
                shape: self.shapes.describe(v),
            })
    }

    /// The padding of a node reading `input`, resolved at the run's shapes; `None` (which
    /// shape inference refuses first) is an error naming the input.
    fn resolved<T>(&self, input: Value, resolved: Option<T>) -> Result<T, GraphError> {
        resolved.ok_or_else(|| {
            GraphError::Verify(primjit_ir::VerifyError {
                loc: None,
                subject: format!("%{}", self.graph.value_name(input)),
                message: format!(
                    "auto_pad cannot be resolved over the shape {}",
                    self.shapes.describe(input)
                ),
            })
        })
    }

    fn src_layout(&self, v: Value) -> Layout {
        layout_of(self.graph, v)
    }

    /// The key of `node`, which leaves the extents `rt` to run time; `algo` is its
    /// convolution algorithm and tier (for a pooling or element-wise node, the engine's tier).
    fn key(
        &self,
        node: &NodeData,
        rt: RuntimeDims,
        algo: (ConvAlgo, Isa),
    ) -> Result<PrimitiveKey, GraphError> {
        Ok(match &node.op {
            Op::Conv2d(c) => PrimitiveKey::Conv(self.conv(c, algo)?.with_runtime(rt)),
            Op::Pool2d(p) => PrimitiveKey::Pool(self.pool(p)?.with_runtime(rt).at_tier(algo.1)),
            Op::GlobalPool { kind, input } => {
                let [n, c, ih, iw] = self.concrete(*input)?;
                PrimitiveKey::GlobalPool(
                    GlobalPoolDesc {
                        kind: *kind,
                        mb: n,
                        c,
                        ih,
                        iw,
                        src_layout: self.src_layout(*input),
                        dst_layout: Layout::Nchw4c,
                        runtime: RuntimeDims::NONE,
                        isa: Isa::X128,
                    }
                    .with_runtime(rt)
                    .at_tier(algo.1),
                )
            }
            Op::Relu { input } => self.eltwise(EltwiseKind::Relu, *input, rt, algo.1)?,
            Op::Add { lhs, .. } => self.eltwise(EltwiseKind::Add, *lhs, rt, algo.1)?,
            Op::BatchNorm(bn) => {
                let [n, c, ih, iw] = self.concrete(bn.input)?;
                let mut d = bn_desc_shell(c, self.src_layout(bn.input));
                d.mb = n;
                d.ih = ih;
                d.iw = iw;
                PrimitiveKey::Conv(d.with_runtime(rt))
            }
            Op::Act { act, input } => self.eltwise(EltwiseKind::Act(*act), *input, rt, algo.1)?,
            Op::PRelu { input, .. } => self.eltwise(EltwiseKind::PRelu, *input, rt, algo.1)?,
            Op::Binary { kind, lhs, rhs } => self.binary(*kind, *lhs, *rhs, rt, algo.1)?,
            Op::Concat { inputs } => self.concat(inputs, rt)?,
            Op::Resize(r) => PrimitiveKey::Resize(self.resize(r, node.result)?.with_runtime(rt)),
            Op::ConvTranspose(ct) => PrimitiveKey::ConvTranspose(
                conv_transpose_desc(self.graph, ct, self.concrete(ct.input)?)
                    .with_runtime(rt)
                    .at_tier(algo.1),
            ),
            Op::SelectChannels { input, select } => {
                let [n, c, h, w] = self.concrete(*input)?;
                PrimitiveKey::SelectChannels(SelectDesc {
                    mb: n,
                    c,
                    h,
                    w,
                    select: select.clone(),
                    layout: Layout::Nchw4c,
                })
            }
        })
    }

    /// A convolution's descriptor with every extent fixed.
    fn conv(
        &self,
        c: &primjit_ir::Conv2d,
        (algo, isa): (ConvAlgo, Isa),
    ) -> Result<ConvDesc, GraphError> {
        let [n, ic, ih, iw] = self.concrete(c.input)?;
        let w = &self.graph.param(c.weight).shape;
        // An `auto_pad` conv's padding follows the bound extents: the key fixes it, so that
        // under runtime extents a layer has one key per residue of its extents modulo the
        // strides that gives a distinct split.
        let pads = self.resolved(c.input, c.pads_at([w[2], w[3]], [ih, iw]))?;
        Ok(ConvDesc {
            mb: n,
            ic,
            ih,
            iw,
            oc: w[0],
            kh: w[2],
            kw: w[3],
            strides: c.strides,
            dilations: c.dilations,
            pads,
            groups: c.groups,
            bias: c.bias.is_some(),
            post_ops: post_op_descs(&c.post_ops),
            pool: fused_pool(c),
            src_layout: self.src_layout(c.input),
            dst_layout: Layout::Nchw4c,
            runtime: RuntimeDims::NONE,
            algo,
            pitches: Pitches::DENSE,
            isa,
        })
    }

    /// A pooling's descriptor with every extent fixed.
    fn pool(&self, p: &primjit_ir::Pool2d) -> Result<PoolDesc, GraphError> {
        let [n, c, ih, iw] = self.concrete(p.input)?;
        let window = self.resolved(p.input, p.window_at([ih, iw]))?;
        Ok(PoolDesc {
            kind: p.kind,
            mb: n,
            c,
            ih,
            iw,
            window,
            count_include_pad: p.count_include_pad,
            src_layout: self.src_layout(p.input),
            dst_layout: Layout::Nchw4c,
            runtime: RuntimeDims::NONE,
            isa: Isa::X128,
        })
    }

    /// The key of a unary element-wise op (or `add`, by its first operand's shape) on `input`,
    /// leaving the extents `rt` to run time, at the tier its kernel uses on an engine of tier
    /// `isa`.
    fn eltwise(
        &self,
        kind: EltwiseKind,
        input: Value,
        rt: RuntimeDims,
        isa: Isa,
    ) -> Result<PrimitiveKey, GraphError> {
        let d = EltwiseDesc {
            kind,
            shape: self.concrete(input)?,
            layout: Layout::Nchw4c,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        };
        Ok(PrimitiveKey::Eltwise(d.with_runtime(rt).at_tier(isa)))
    }

    /// The key of a binary op, its second operand broadcast as its shape asks, leaving the
    /// extents `rt` to run time, at the tier its kernel uses on an engine of tier `isa`.
    fn binary(
        &self,
        kind: BinaryKind,
        lhs: Value,
        rhs: Value,
        rt: RuntimeDims,
        isa: Isa,
    ) -> Result<PrimitiveKey, GraphError> {
        let (a, b) = (self.concrete(lhs)?, self.concrete(rhs)?);
        let rhs = if a == b {
            Broadcast::Full
        } else if b[0] == a[0] {
            Broadcast::PerImageChannel
        } else {
            Broadcast::PerChannel
        };
        let d = EltwiseDesc {
            kind: EltwiseKind::Binary { op: kind, rhs },
            shape: a,
            layout: Layout::Nchw4c,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        };
        Ok(PrimitiveKey::Eltwise(d.with_runtime(rt).at_tier(isa)))
    }

    /// The key of a concat of `inputs` along channels, leaving the extents `rt` to run time.
    fn concat(&self, inputs: &[Value], rt: RuntimeDims) -> Result<PrimitiveKey, GraphError> {
        let shapes = inputs
            .iter()
            .map(|&v| self.concrete(v))
            .collect::<Result<Vec<_>, _>>()?;
        let [n, _, h, w] = shapes[0];
        Ok(PrimitiveKey::Concat(
            ConcatDesc {
                mb: n,
                channels: shapes.iter().map(|s| s[1]).collect(),
                h,
                w,
                layout: Layout::Nchw4c,
                runtime: RuntimeDims::NONE,
            }
            .with_runtime(rt),
        ))
    }

    /// A resize's descriptor with every extent fixed; `result` is its output.
    fn resize(&self, r: &primjit_ir::Resize, result: Value) -> Result<ResizeDesc, GraphError> {
        let [n, c, ih, iw] = self.concrete(r.input)?;
        let [_, _, oh, ow] = self.concrete(result)?;
        let out = match r.size {
            ResizeSize::Scale(factors) => ResizeOut::Scale(factors),
            _ => ResizeOut::Sizes([oh, ow]),
        };
        Ok(ResizeDesc {
            mb: n,
            c,
            ih,
            iw,
            out,
            mode: r.mode,
            coord: r.coord,
            runtime: RuntimeDims::NONE,
        })
    }
}

pub(super) fn layout_of(graph: &Graph, v: Value) -> Layout {
    if graph.inputs().iter().any(|i| i.value == v) {
        Layout::Nchw
    } else {
        Layout::Nchw4c
    }
}

/// A conv descriptor with the node's channels, kernel, layouts, bias and the algorithm
/// `conv_algo` picks for it, at a placeholder spatial size: enough for packing and for the
/// choice, neither of which depends on the spatial shape.
pub(super) fn conv_desc_shell(
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
    // The output's extents where the graph fixes the input's: `auto` weighs the Winograd
    // tiles that would share each transformed weight. Symbolic extents leave the choice to
    // the channels, so that every bound size takes the one packing.
    let fixed = shapes
        .get(c.input)
        .and_then(|s| Some([s[2].known()? as usize, s[3].known()? as usize]));
    let output = fixed.and_then(|[h, w]| {
        let mut at = d.clone();
        (at.ih, at.iw) = (h, w);
        at.pads = c.pads_at([at.kh, at.kw], [h, w])?;
        Some([at.oh(), at.ow()])
    });
    d.algo = conv_algo.pick(&d, output);
    // The post-ops decide the tier (a wide tile computes only some), and so the packing.
    d.post_ops = post_op_descs(&c.post_ops);
    d.isa = d.tier_for(isa);
    d
}

/// A conv's or a transposed conv's post-ops as its key lists them: all but the fused max
/// pool, which is a conv key's `pool`.
fn post_op_descs(posts: &[PostOp]) -> Vec<PostOpDesc> {
    posts
        .iter()
        .filter_map(|p| match p {
            PostOp::Relu => Some(PostOpDesc::Relu),
            PostOp::Add(_) => Some(PostOpDesc::Add),
            PostOp::Clip { lo, hi } => Some(PostOpDesc::Clip { lo: *lo, hi: *hi }),
            PostOp::MaxPool(_) => None,
            PostOp::Act(a) => Some(PostOpDesc::Act(*a)),
            PostOp::PRelu(_) => Some(PostOpDesc::PRelu),
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
pub(super) fn conv_transpose_desc(
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
        post_ops: post_op_descs(&ct.post_ops),
        runtime: RuntimeDims::NONE,
        isa: Isa::X128,
    }
}

/// A batch-norm as a depthwise 1x1 convolution with bias.
pub(super) fn bn_desc_shell(channels: usize, src_layout: Layout) -> ConvDesc {
    let mut d = ConvDesc::new(1, channels, [1, 1], channels, [1, 1]);
    d.groups = channels;
    d.bias = true;
    d.src_layout = src_layout;
    d.dst_layout = Layout::Nchw4c;
    d
}

/// The input whose extents a node's key may leave to run time: a call of such a key runs at
/// this input's extents (a resize to sizes at its output's too). `None` for a channel
/// selection, whose key is always fixed.
pub(super) fn extents_input(op: &Op) -> Option<Value> {
    Some(match op {
        Op::Conv2d(c) => c.input,
        Op::Pool2d(p) => p.input,
        Op::BatchNorm(bn) => bn.input,
        Op::GlobalPool { input, .. } => *input,
        Op::Relu { input } | Op::Act { input, .. } | Op::PRelu { input, .. } => *input,
        Op::Add { lhs, .. } | Op::Binary { lhs, .. } => *lhs,
        Op::Concat { inputs } => inputs[0],
        Op::Resize(r) => r.input,
        Op::ConvTranspose(c) => c.input,
        Op::SelectChannels { .. } => return None,
    })
}

/// Per node of a verified graph: which spatial extents of its [`extents_input`] depend on a
/// symbol; for a resize to sizes, those where its input's or its output's do.
pub(super) fn symbolic_dims(graph: &Graph, shapes: &primjit_ir::Shapes) -> Vec<RuntimeDims> {
    let symbolic = |v: Value| {
        let dims = shapes.get(v).expect("verified");
        RuntimeDims {
            h: dims[2].known().is_none(),
            w: dims[3].known().is_none(),
        }
    };
    graph
        .nodes()
        .map(|(_, node)| {
            let Some(input) = extents_input(&node.op) else {
                return RuntimeDims::NONE;
            };
            let dims = symbolic(input);
            match &node.op {
                // To sizes, an axis whose input or output extent is symbolic takes both at run
                // time: a global context resized to a feature map's extents, or a map resized
                // to fixed ones, compiles once for every size.
                Op::Resize(r) if !matches!(r.size, ResizeSize::Scale(_)) => {
                    let out = symbolic(node.result);
                    RuntimeDims {
                        h: dims.h || out.h,
                        w: dims.w || out.w,
                    }
                }
                _ => dims,
            }
        })
        .collect()
}
