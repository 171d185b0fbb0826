//! The graph data structure: typed entity indices with their data stored beside them.
//!
//! As in Cranelift, `Value`, `Param` and `Node` are small copyable indices into the graph's
//! tables; there is no borrowed graph and no shared ownership. A graph is in SSA form: each
//! value is defined once (by an input or a node) and nodes appear in an order where every
//! operand is defined before its use.

use std::fmt;

use crate::error::SourceLoc;

macro_rules! entity {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u32);

        impl $name {
            /// The index of this entity in its table.
            pub fn index(self) -> usize {
                self.0 as usize
            }

            pub(crate) fn new(index: usize) -> Self {
                Self(u32::try_from(index).expect("fewer than 2^32 entities"))
            }
        }
    };
}

entity!(
    /// An SSA value: a graph input or the result of a node.
    Value
);
entity!(
    /// A named parameter (weights, biases, batch-norm statistics).
    Param
);
entity!(
    /// A node, in program order.
    Node
);

/// Padding in the ONNX order of its attribute: top, left, bottom, right.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Pads {
    pub top: usize,
    pub left: usize,
    pub bottom: usize,
    pub right: usize,
}

impl Pads {
    /// The same padding `n` on all four sides, as a `pads` attribute of four equal values.
    pub const fn uniform(n: usize) -> Pads {
        Pads {
            top: n,
            left: n,
            bottom: n,
            right: n,
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == Pads::default()
    }
}

/// An operation applied to a convolution's output before it is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PostOp {
    Relu,
    /// Adds a value of the output's shape (a residual connection).
    Add(Value),
    /// Clamps to `[lo, hi]`.
    Clip {
        lo: f32,
        hi: f32,
    },
    /// Max pooling of the output as the post-ops before it left it, with `maxpool2d`'s
    /// semantics. Always the last post-op: the conv's result has the pooled shape, so the
    /// full-resolution output never needs to exist.
    MaxPool(PoolWindow),
    /// An element-wise activation ([`Activation`]).
    Act(Activation),
    /// `x` for `x >= 0`, else `slope[c] * x`, one slope per output channel (`[C]`), as the
    /// standalone [`Op::PRelu`]. A conv takes at most one.
    PRelu(Param),
}

/// An element-wise activation with ONNX semantics, standalone ([`Op::Act`]) or as a
/// convolution's post-op ([`PostOp::Act`]). Attributes compare and hash by their bits, so that
/// an activation can be part of a primitive key.
#[derive(Clone, Copy, Debug)]
pub enum Activation {
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `max(0, min(1, alpha * x + beta))`; ONNX's defaults are 0.2 and 0.5.
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    /// `x * max(0, min(1, x / 6 + 1 / 2))`.
    HardSwish,
    Tanh,
    /// `x` for `x >= 0`, else `alpha * x`; ONNX's default is 0.01.
    LeakyRelu {
        alpha: f32,
    },
    /// `x` for `x >= 0`, else `alpha * (exp(x) - 1)`; ONNX's default is 1.
    Elu {
        alpha: f32,
    },
    /// SiLU (Swish): `x * sigmoid(x)`, which exporters write as `Mul(x, Sigmoid(x))`.
    Silu,
    Exp,
}

impl Activation {
    /// Every activation with its default attributes, in the order of `ActKind`.
    pub const ALL: [Activation; 8] = [
        Activation::Sigmoid,
        Activation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        Activation::HardSwish,
        Activation::Tanh,
        Activation::LeakyRelu { alpha: 0.01 },
        Activation::Elu { alpha: 1.0 },
        Activation::Silu,
        Activation::Exp,
    ];

    /// The name of the op and of the post-op in the text format.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Sigmoid => "sigmoid",
            Activation::HardSigmoid { .. } => "hardsigmoid",
            Activation::HardSwish => "hardswish",
            Activation::Tanh => "tanh",
            Activation::LeakyRelu { .. } => "leakyrelu",
            Activation::Elu { .. } => "elu",
            Activation::Silu => "silu",
            Activation::Exp => "exp",
        }
    }

    /// The activation of this name with its default attributes.
    pub fn by_name(name: &str) -> Option<Activation> {
        Activation::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Its attributes as `(name, value)`, in the text format's order.
    pub fn attrs(self) -> Vec<(&'static str, f32)> {
        match self {
            Activation::HardSigmoid { alpha, beta } => vec![("alpha", alpha), ("beta", beta)],
            Activation::LeakyRelu { alpha } | Activation::Elu { alpha } => vec![("alpha", alpha)],
            _ => Vec::new(),
        }
    }

    /// The same activation with attribute `name` set, if it has one of that name.
    pub fn with_attr(self, name: &str, v: f32) -> Option<Activation> {
        Some(match (self, name) {
            (Activation::HardSigmoid { beta, .. }, "alpha") => {
                Activation::HardSigmoid { alpha: v, beta }
            }
            (Activation::HardSigmoid { alpha, .. }, "beta") => {
                Activation::HardSigmoid { alpha, beta: v }
            }
            (Activation::LeakyRelu { .. }, "alpha") => Activation::LeakyRelu { alpha: v },
            (Activation::Elu { .. }, "alpha") => Activation::Elu { alpha: v },
            _ => return None,
        })
    }

    fn bits(self) -> (u8, [u32; 2]) {
        let b = |x: f32| x.to_bits();
        match self {
            Activation::Sigmoid => (0, [0; 2]),
            Activation::HardSigmoid { alpha, beta } => (1, [b(alpha), b(beta)]),
            Activation::HardSwish => (2, [0; 2]),
            Activation::Tanh => (3, [0; 2]),
            Activation::LeakyRelu { alpha } => (4, [b(alpha), 0]),
            Activation::Elu { alpha } => (5, [b(alpha), 0]),
            Activation::Silu => (6, [0; 2]),
            Activation::Exp => (7, [0; 2]),
        }
    }

    /// The activation in f64, as the reference interpreter computes it (NaN stays NaN).
    pub fn eval(self, x: f64) -> f64 {
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        let hard = |x: f64, alpha: f64, beta: f64| {
            let y = alpha * x + beta;
            if y.is_nan() { y } else { y.clamp(0.0, 1.0) }
        };
        match self {
            Activation::Sigmoid => sigmoid(x),
            Activation::HardSigmoid { alpha, beta } => hard(x, alpha as f64, beta as f64),
            Activation::HardSwish => x * hard(x, 1.0 / 6.0, 0.5),
            Activation::Tanh => x.tanh(),
            Activation::LeakyRelu { alpha } => {
                if x < 0.0 {
                    alpha as f64 * x
                } else {
                    x
                }
            }
            Activation::Elu { alpha } => {
                if x < 0.0 {
                    alpha as f64 * x.exp_m1()
                } else {
                    x
                }
            }
            Activation::Silu => x * sigmoid(x),
            Activation::Exp => x.exp(),
        }
    }
}

impl PartialEq for Activation {
    fn eq(&self, other: &Self) -> bool {
        self.bits() == other.bits()
    }
}

impl Eq for Activation {}

impl std::hash::Hash for Activation {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bits().hash(state);
    }
}

/// A binary element-wise op of [`Op::Binary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinaryKind {
    /// The op's name in the text format (`add` is the same-shape [`Op::Add`], fusable as a
    /// residual; its broadcasting form is `add_bcast`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryKind::Add => "add_bcast",
            BinaryKind::Sub => "sub",
            BinaryKind::Mul => "mul",
            BinaryKind::Div => "div",
        }
    }

    /// `a op b` in f64.
    pub fn eval(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryKind::Add => a + b,
            BinaryKind::Sub => a - b,
            BinaryKind::Mul => a * b,
            BinaryKind::Div => a / b,
        }
    }
}

/// The geometry of a pooling window: kernel, strides, pads, dilations and `ceil_mode`.
///
/// The one window type of primjit (as tract's `PoolSpec`): [`Pool2d`], the `maxpool` post-op,
/// the reference's `PoolAttrs` and codegen's `PoolDesc` all hold one, so that the window is
/// spelled, printed and compared the same way everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolWindow {
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    pub pads: Pads,
    pub dilations: [usize; 2],
    pub ceil_mode: bool,
}

impl PoolWindow {
    /// A `kernel` window with unit strides and dilations, no padding, floor mode.
    pub fn new(kernel: [usize; 2]) -> Self {
        PoolWindow {
            kernel,
            strides: [1, 1],
            pads: Pads::default(),
            dilations: [1, 1],
            ceil_mode: false,
        }
    }
}

/// A 2-D convolution with ONNX `Conv` semantics; weights are OIHW (`[O, I / groups, KH, KW]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2d {
    pub input: Value,
    pub weight: Param,
    pub bias: Option<Param>,
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: Pads,
    /// Padding that follows the input's extents (ONNX `auto_pad` SAME_*), resolved per bound
    /// shape by [`Conv2d::pads_at`]; `pads` is then zero. The importer sets it only where the
    /// split depends on a symbolic extent (a stride above 1), and explicit pads otherwise.
    pub auto_pad: Option<crate::AutoPad>,
    pub groups: usize,
    pub post_ops: Vec<PostOp>,
}

impl Conv2d {
    /// A depthwise 1x1 conv of `channels` channels: each channel of `input` times its weight
    /// (`[channels, 1, 1, 1]`) plus its bias. A batch-norm or an affine that follows no conv
    /// runs as one.
    pub fn per_channel(input: Value, weight: Param, bias: Param, channels: usize) -> Conv2d {
        Conv2d {
            input,
            weight,
            bias: Some(bias),
            strides: [1, 1],
            dilations: [1, 1],
            pads: Pads::default(),
            auto_pad: None,
            groups: channels,
            post_ops: Vec::new(),
        }
    }
}

/// Which reduction a windowed pooling op applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    Avg,
}

/// A windowed pooling op with ONNX `MaxPool` / `AveragePool` semantics.
///
/// With `ceil_mode`, a last window that would start inside the bottom or right padding is
/// dropped (the rule of PyTorch and of ONNX since opset 19). `count_include_pad` only applies to
/// average pooling: the divisor then counts padded cells, but never cells past the padding.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool2d {
    pub kind: PoolKind,
    pub input: Value,
    pub window: PoolWindow,
    /// Padding that follows the input's extents (ONNX `auto_pad` SAME_*), resolved per bound
    /// shape by [`Pool2d::window_at`]; `window.pads` is then zero. It is the node's, not the
    /// window's: a [`PoolWindow`] is always concrete, as keys and the `maxpool` post-op hold it.
    pub auto_pad: Option<crate::AutoPad>,
    pub count_include_pad: bool,
}

/// Inference batch normalization: `(x - mean) / sqrt(var + epsilon) * scale + bias`, per channel.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNorm {
    pub input: Value,
    pub scale: Param,
    pub bias: Param,
    pub mean: Param,
    pub var: Param,
    pub epsilon: f32,
}

/// An operation of the graph.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Conv2d(Conv2d),
    Pool2d(Pool2d),
    GlobalPool {
        kind: PoolKind,
        input: Value,
    },
    Relu {
        input: Value,
    },
    /// Element-wise sum of two values of the same shape (no broadcasting).
    Add {
        lhs: Value,
        rhs: Value,
    },
    BatchNorm(BatchNorm),
    /// An element-wise activation.
    Act {
        act: Activation,
        input: Value,
    },
    /// `x` for `x >= 0`, else `slope[c] * x`, with one slope per channel (`[C]`).
    PRelu {
        input: Value,
        slope: Param,
    },
    /// `lhs op rhs`, where `rhs` has `lhs`'s shape or is `[N, C, 1, 1]` or `[1, C, 1, 1]`
    /// (one value per image and channel, or per channel), broadcast over height and width.
    Binary {
        kind: BinaryKind,
        lhs: Value,
        rhs: Value,
    },
    /// The inputs joined along channels (ONNX `Concat` on axis 1): each has the others'
    /// batch, height and width.
    Concat {
        inputs: Vec<Value>,
    },
    /// Channels of the input picked by index, in order (ONNX `Split` and `Slice` on channels):
    /// output channel `j` is input channel `select[j]`.
    SelectChannels {
        input: Value,
        select: Vec<usize>,
    },
    /// Spatial resizing with ONNX `Resize` semantics ([`crate::Resize`]).
    Resize(crate::Resize),
    /// A transposed convolution with ONNX `ConvTranspose` semantics
    /// ([`crate::ConvTranspose2d`]).
    ConvTranspose(crate::ConvTranspose2d),
}

/// The kind of an [`Op`], without its operands: what the text format calls the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Conv2d,
    MaxPool2d,
    AvgPool2d,
    GlobalAvgPool,
    GlobalMaxPool,
    Relu,
    Add,
    BatchNorm,
    /// An activation, by its name ([`Activation::name`]).
    Act(&'static str),
    PRelu,
    Binary(BinaryKind),
    Concat,
    SelectChannels,
    Resize,
    ConvTranspose,
}

impl OpKind {
    pub const ALL: [OpKind; 25] = [
        OpKind::Conv2d,
        OpKind::MaxPool2d,
        OpKind::AvgPool2d,
        OpKind::GlobalAvgPool,
        OpKind::GlobalMaxPool,
        OpKind::Relu,
        OpKind::Add,
        OpKind::BatchNorm,
        OpKind::Act("sigmoid"),
        OpKind::Act("hardsigmoid"),
        OpKind::Act("hardswish"),
        OpKind::Act("tanh"),
        OpKind::Act("leakyrelu"),
        OpKind::Act("elu"),
        OpKind::Act("silu"),
        OpKind::Act("exp"),
        OpKind::PRelu,
        OpKind::Binary(BinaryKind::Add),
        OpKind::Binary(BinaryKind::Sub),
        OpKind::Binary(BinaryKind::Mul),
        OpKind::Binary(BinaryKind::Div),
        OpKind::Concat,
        OpKind::SelectChannels,
        OpKind::Resize,
        OpKind::ConvTranspose,
    ];

    /// The op's name in the text format.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Conv2d => "conv2d",
            OpKind::MaxPool2d => "maxpool2d",
            OpKind::AvgPool2d => "avgpool2d",
            OpKind::GlobalAvgPool => "global_avgpool",
            OpKind::GlobalMaxPool => "global_maxpool",
            OpKind::Relu => "relu",
            OpKind::Add => "add",
            OpKind::BatchNorm => "batchnorm",
            OpKind::Act(name) => name,
            OpKind::PRelu => "prelu",
            OpKind::Binary(kind) => kind.name(),
            OpKind::Concat => "concat",
            OpKind::SelectChannels => "select_channels",
            OpKind::Resize => "resize",
            OpKind::ConvTranspose => "conv_transpose",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Conv2d(_) => OpKind::Conv2d,
            Op::Pool2d(p) => match p.kind {
                PoolKind::Max => OpKind::MaxPool2d,
                PoolKind::Avg => OpKind::AvgPool2d,
            },
            Op::GlobalPool {
                kind: PoolKind::Max,
                ..
            } => OpKind::GlobalMaxPool,
            Op::GlobalPool {
                kind: PoolKind::Avg,
                ..
            } => OpKind::GlobalAvgPool,
            Op::Relu { .. } => OpKind::Relu,
            Op::Add { .. } => OpKind::Add,
            Op::BatchNorm(_) => OpKind::BatchNorm,
            Op::Act { act, .. } => OpKind::Act(act.name()),
            Op::PRelu { .. } => OpKind::PRelu,
            Op::Binary { kind, .. } => OpKind::Binary(*kind),
            Op::Concat { .. } => OpKind::Concat,
            Op::SelectChannels { .. } => OpKind::SelectChannels,
            Op::Resize(_) => OpKind::Resize,
            Op::ConvTranspose(_) => OpKind::ConvTranspose,
        }
    }

    /// The values this op reads, in operand order (a conv's residual post-ops included).
    pub fn value_operands(&self) -> Vec<Value> {
        match self {
            Op::Conv2d(c) => {
                let mut v = vec![c.input];
                v.extend(c.post_ops.iter().filter_map(|p| match p {
                    PostOp::Add(r) => Some(*r),
                    _ => None,
                }));
                v
            }
            Op::Pool2d(p) => vec![p.input],
            Op::GlobalPool { input, .. } | Op::Relu { input } => vec![*input],
            Op::Add { lhs, rhs } => vec![*lhs, *rhs],
            Op::BatchNorm(b) => vec![b.input],
            Op::Act { input, .. } | Op::PRelu { input, .. } | Op::SelectChannels { input, .. } => {
                vec![*input]
            }
            Op::Binary { lhs, rhs, .. } => vec![*lhs, *rhs],
            Op::Concat { inputs } => inputs.clone(),
            // The value whose extents the output takes is read for its shape only, but it
            // counts as a use: passes must not fuse it away while the resize needs it.
            Op::Resize(r) => match r.size {
                crate::ResizeSize::Like(like) => vec![r.input, like],
                _ => vec![r.input],
            },
            Op::ConvTranspose(c) => vec![c.input],
        }
    }

    /// Calls `f` on every value operand, allowing it to be replaced.
    pub fn for_each_value_mut(&mut self, mut f: impl FnMut(&mut Value)) {
        match self {
            Op::Conv2d(c) => {
                f(&mut c.input);
                for p in &mut c.post_ops {
                    if let PostOp::Add(r) = p {
                        f(r);
                    }
                }
            }
            Op::Pool2d(p) => f(&mut p.input),
            Op::GlobalPool { input, .. } | Op::Relu { input } => f(input),
            Op::Add { lhs, rhs } => {
                f(lhs);
                f(rhs);
            }
            Op::BatchNorm(b) => f(&mut b.input),
            Op::Act { input, .. } | Op::PRelu { input, .. } | Op::SelectChannels { input, .. } => {
                f(input)
            }
            Op::Binary { lhs, rhs, .. } => {
                f(lhs);
                f(rhs);
            }
            Op::Concat { inputs } => inputs.iter_mut().for_each(f),
            Op::Resize(r) => {
                f(&mut r.input);
                if let crate::ResizeSize::Like(like) = &mut r.size {
                    f(like);
                }
            }
            Op::ConvTranspose(c) => f(&mut c.input),
        }
    }

    /// The parameters this op reads.
    pub fn param_operands(&self) -> Vec<Param> {
        match self {
            Op::Conv2d(c) => std::iter::once(c.weight)
                .chain(c.bias)
                .chain(c.post_ops.iter().filter_map(|p| match p {
                    PostOp::PRelu(slope) => Some(*slope),
                    _ => None,
                }))
                .collect(),
            Op::ConvTranspose(c) => std::iter::once(c.weight).chain(c.bias).collect(),
            Op::BatchNorm(b) => vec![b.scale, b.bias, b.mean, b.var],
            Op::PRelu { slope, .. } => vec![*slope],
            _ => Vec::new(),
        }
    }
}

/// A node: one op and the value it defines.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeData {
    pub op: Op,
    pub result: Value,
    /// Where the node was written, when it came from text.
    pub loc: Option<SourceLoc>,
}

/// A parameter computed from other parameters, as the batch-norm folding pass creates them.
#[derive(Clone, Debug, PartialEq)]
pub enum DerivedParam {
    /// `weight[o, ...] * scale[o] / sqrt(var[o] + epsilon)`.
    BnFoldWeight {
        weight: Param,
        scale: Param,
        var: Param,
        epsilon: f32,
    },
    /// `scale[o] / sqrt(var[o] + epsilon)`, of shape `[o, 1, 1, 1]`: a batch-norm that follows
    /// no conv, as the weight of a depthwise 1x1 conv (whose bias is a `BnFoldBias` without
    /// `conv_bias`).
    BnScale {
        scale: Param,
        var: Param,
        epsilon: f32,
    },
    /// `(conv_bias[o] - mean[o]) * scale[o] / sqrt(var[o] + epsilon) + bias[o]`, with a
    /// missing `conv_bias` read as zeros.
    BnFoldBias {
        conv_bias: Option<Param>,
        scale: Param,
        bias: Param,
        mean: Param,
        var: Param,
        epsilon: f32,
    },
}

/// A source of a derived parameter, its role in the derivation ("the scale") and the shape
/// the derived parameter's own shape requires of it ([`DerivedParam::source_shapes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceShape {
    pub param: Param,
    pub role: &'static str,
    pub shape: Vec<usize>,
}

impl SourceShape {
    fn new(param: Param, role: &'static str, shape: Vec<usize>) -> Self {
        SourceShape { param, role, shape }
    }
}

impl DerivedParam {
    /// Each parameter that one of `shape` is computed from, with its role and the shape it
    /// must have: a folded weight has its weight's shape and one scale and variance per output
    /// channel, a folded bias is a vector with one of each source per element. Fails, saying
    /// why, when `shape` itself cannot be one. Verification and `Params` both check by it.
    pub fn source_shapes(&self, shape: &[usize]) -> Result<Vec<SourceShape>, String> {
        match (self, shape) {
            (
                DerivedParam::BnFoldWeight {
                    weight, scale, var, ..
                },
                [o, ..],
            ) => Ok(vec![
                SourceShape::new(*weight, "the folded weight", shape.to_vec()),
                SourceShape::new(*scale, "the scale", vec![*o]),
                SourceShape::new(*var, "the variance", vec![*o]),
            ]),
            (DerivedParam::BnScale { scale, var, .. }, [o, 1, 1, 1]) => Ok(vec![
                SourceShape::new(*scale, "the scale", vec![*o]),
                SourceShape::new(*var, "the variance", vec![*o]),
            ]),
            (
                DerivedParam::BnFoldBias {
                    conv_bias,
                    scale,
                    bias,
                    mean,
                    var,
                    ..
                },
                [o],
            ) => Ok([
                (*scale, "the scale"),
                (*bias, "the bias"),
                (*mean, "the mean"),
                (*var, "the variance"),
            ]
            .into_iter()
            .chain(conv_bias.map(|b| (b, "the conv bias")))
            .map(|(p, role)| SourceShape::new(p, role, vec![*o]))
            .collect()),
            (DerivedParam::BnFoldWeight { .. }, _) => {
                Err("a folded weight needs at least one dimension".into())
            }
            (DerivedParam::BnScale { .. }, _) => Err(format!(
                "a batch-norm's scale as a weight must have shape [channels, 1, 1, 1], found {shape:?}"
            )),
            (DerivedParam::BnFoldBias { .. }, _) => {
                Err(format!("a folded bias must have rank 1, found {shape:?}"))
            }
        }
    }

    /// The parameters this one is computed from.
    pub fn sources(&self) -> Vec<Param> {
        match self {
            DerivedParam::BnFoldWeight {
                weight, scale, var, ..
            } => vec![*weight, *scale, *var],
            DerivedParam::BnScale { scale, var, .. } => vec![*scale, *var],
            DerivedParam::BnFoldBias {
                conv_bias,
                scale,
                bias,
                mean,
                var,
                ..
            } => conv_bias
                .iter()
                .copied()
                .chain([*scale, *bias, *mean, *var])
                .collect(),
        }
    }
}

/// A declared parameter: its name, its concrete shape, and how it is computed when derived.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamData {
    pub name: String,
    pub shape: Vec<usize>,
    pub derived: Option<DerivedParam>,
    pub loc: Option<SourceLoc>,
}

/// A graph input: a value with a possibly symbolic shape.
#[derive(Clone, Debug, PartialEq)]
pub struct InputData {
    pub value: Value,
    pub shape: Vec<crate::Dim>,
    pub loc: Option<SourceLoc>,
}

/// A graph: inputs, parameters, nodes in program order, and named outputs.
///
/// Fields are private so that the invariants checked by [`Graph::verify`] (unique names,
/// definitions before uses) can only be broken through the methods that re-check them.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub(crate) name: String,
    pub(crate) value_names: Vec<String>,
    pub(crate) inputs: Vec<InputData>,
    pub(crate) params: Vec<ParamData>,
    pub(crate) nodes: Vec<NodeData>,
    pub(crate) outputs: Vec<(String, Value)>,
}

impl Graph {
    /// An empty graph with the given name.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            value_names: Vec::new(),
            inputs: Vec::new(),
            params: Vec::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value's name, without the `%` sigil.
    pub fn value_name(&self, v: Value) -> &str {
        &self.value_names[v.index()]
    }

    pub fn values(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.value_names.len()).map(Value::new)
    }

    pub fn value_by_name(&self, name: &str) -> Option<Value> {
        self.value_names
            .iter()
            .position(|n| n == name)
            .map(Value::new)
    }

    pub fn inputs(&self) -> &[InputData] {
        &self.inputs
    }

    pub fn params(&self) -> impl Iterator<Item = (Param, &ParamData)> + '_ {
        self.params
            .iter()
            .enumerate()
            .map(|(i, p)| (Param::new(i), p))
    }

    pub fn param(&self, p: Param) -> &ParamData {
        &self.params[p.index()]
    }

    pub fn param_by_name(&self, name: &str) -> Option<Param> {
        self.params
            .iter()
            .position(|p| p.name == name)
            .map(Param::new)
    }

    pub fn nodes(&self) -> impl Iterator<Item = (Node, &NodeData)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (Node::new(i), n))
    }

    pub fn node(&self, n: Node) -> &NodeData {
        &self.nodes[n.index()]
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The node whose result is named `name` (without the `%`).
    pub fn node_by_name(&self, name: &str) -> Option<Node> {
        let v = self.value_by_name(name)?;
        self.nodes.iter().position(|n| n.result == v).map(Node::new)
    }

    pub fn outputs(&self) -> &[(String, Value)] {
        &self.outputs
    }

    /// Adds a value with a fresh name; fails if the name is taken.
    pub fn add_value(&mut self, name: impl Into<String>) -> Option<Value> {
        let name = name.into();
        if self.value_names.contains(&name) {
            return None;
        }
        self.value_names.push(name);
        Some(Value::new(self.value_names.len() - 1))
    }

    /// Declares a graph input; fails if the name is taken.
    pub fn add_input(&mut self, name: impl Into<String>, shape: Vec<crate::Dim>) -> Option<Value> {
        let value = self.add_value(name)?;
        self.inputs.push(InputData {
            value,
            shape,
            loc: None,
        });
        Some(value)
    }

    /// Declares a parameter; fails if the name is taken.
    pub fn add_param(&mut self, data: ParamData) -> Option<Param> {
        if self.param_by_name(&data.name).is_some() {
            return None;
        }
        self.params.push(data);
        Some(Param::new(self.params.len() - 1))
    }

    /// Appends a node defining a new value named `name`; fails if the name is taken.
    pub fn add_node(&mut self, name: impl Into<String>, op: Op) -> Option<Value> {
        let result = self.add_value(name)?;
        self.nodes.push(NodeData {
            op,
            result,
            loc: None,
        });
        Some(result)
    }

    /// Declares a named output; fails if the name is taken.
    pub fn add_output(&mut self, name: impl Into<String>, value: Value) -> bool {
        let name = name.into();
        if self.outputs.iter().any(|(n, _)| *n == name) {
            return false;
        }
        self.outputs.push((name, value));
        true
    }

    /// The symbols that appear in input shapes, in order of first appearance.
    pub fn symbols(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for input in &self.inputs {
            for d in &input.shape {
                d.collect_symbols(&mut out);
            }
        }
        out
    }

    /// How many times each value is read, by nodes and by outputs.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0; self.value_names.len()];
        for node in &self.nodes {
            for v in node.op.value_operands() {
                uses[v.index()] += 1;
            }
        }
        for (_, v) in &self.outputs {
            uses[v.index()] += 1;
        }
        uses
    }
}
