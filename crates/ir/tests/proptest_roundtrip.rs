//! Property tests of the text format and shape inference.
//!
//! Random valid graphs are built through the `Graph` API from random bytes, which a small
//! interpreter turns into ops with valid attributes while tracking every value's concrete
//! shape independently of the crate. Each graph must print, parse and print identically,
//! verify with its symbols unbound and bound, have the shapes of the model, and keep its output
//! shapes through the optimization passes. Random garbage (token soup, arbitrary strings, and
//! mutations of the shipped IR files) must never panic the parser or shape inference.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use primjit_ir::{
    Activation, AutoPad, BatchNorm, BinaryKind, Bindings, Conv2d, CoordMode, DerivedParam, Dim,
    Graph, IrError, NearestMode, Op, Pads, Param, ParamData, Pool2d, PoolKind, PoolWindow, PostOp,
    Resize, ResizeMode, ResizeSize, ScaleFactor, Value, infer_shapes, parse, passes,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::FileFailurePersistence;

/// Reads small choices out of a seed's bytes, yielding zeros once they run out.
struct Bytes<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Bytes<'_> {
    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        let b = self.bytes.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b as usize % n
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn flag(&mut self) -> bool {
        self.below(2) == 1
    }
}

/// How the graph's input looks: batch, channels, the concrete height and width, and whether
/// each is written as a symbol.
#[derive(Clone, Debug)]
struct InputSpec {
    batch: usize,
    channels: usize,
    height: usize,
    width: usize,
    sym_height: bool,
    sym_width: bool,
    share_symbol: bool,
    second_input: bool,
}

fn input_spec() -> impl Strategy<Value = InputSpec> {
    (
        1usize..=2,
        1usize..=8,
        1usize..=12,
        1usize..=12,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(batch, channels, height, width, sym_height, sym_width, share, second)| InputSpec {
                batch,
                channels,
                height,
                width,
                sym_height,
                sym_width,
                share_symbol: share,
                second_input: second,
            },
        )
}

/// A generated graph with the concrete shape of every value and the bindings that give them.
struct Built {
    graph: Graph,
    shapes: Vec<(Value, [usize; 4])>,
    bindings: Bindings,
}

struct Builder {
    graph: Graph,
    shapes: Vec<(Value, [usize; 4])>,
    /// Global pools' outputs: the values whose symbolic shape is `[N, C, 1, 1]`, not only their
    /// shape under the bindings (a pooled `[1, 1, H, 1]` is `[1, 1, 1, 1]` when `H` is 1, yet
    /// cannot be broadcast per channel).
    per_channel: Vec<(Value, [usize; 4])>,
    names: usize,
}

const FLOATS: [f32; 8] = [0.0, 1.0, 6.0, -1.0, 0.5, -0.25, 1e-3, 100.0];

/// An activation, its attributes (if any) drawn from [`FLOATS`].
fn activation(bytes: &mut Bytes<'_>) -> Activation {
    let mut act = Activation::ALL[bytes.below(Activation::ALL.len())];
    for (name, _) in act.attrs() {
        if bytes.flag() {
            act = act
                .with_attr(name, FLOATS[bytes.below(FLOATS.len())])
                .expect("an attribute of this activation");
        }
    }
    act
}
const EPSILONS: [f32; 4] = [1e-5, 1e-3, 0.0, 0.1];

impl Builder {
    fn fresh(&mut self, base: &str) -> String {
        self.names += 1;
        format!("{base}{}", self.names)
    }

    fn param(&mut self, base: &str, shape: Vec<usize>) -> Param {
        let name = self.fresh(base);
        self.derived(name, shape, None)
    }

    fn derived(&mut self, name: String, shape: Vec<usize>, d: Option<DerivedParam>) -> Param {
        self.graph
            .add_param(ParamData {
                name,
                shape,
                derived: d,
                loc: None,
            })
            .expect("fresh parameter name")
    }

    fn node(&mut self, bytes: &mut Bytes<'_>, op: Op, shape: [usize; 4]) {
        let name = if bytes.flag() {
            self.fresh("n")
        } else {
            self.fresh("block.")
        };
        let v = self.graph.add_node(name, op).expect("fresh value name");
        self.shapes.push((v, shape));
    }

    /// A value of the given shape, if any.
    fn value_of_shape(&self, bytes: &mut Bytes<'_>, shape: [usize; 4]) -> Option<Value> {
        let candidates: Vec<Value> = self
            .shapes
            .iter()
            .filter(|(_, s)| *s == shape)
            .map(|(v, _)| *v)
            .collect();
        (!candidates.is_empty()).then(|| candidates[bytes.below(candidates.len())])
    }

    fn op(&mut self, seed: &[u8]) {
        let mut bytes = Bytes {
            bytes: seed,
            pos: 0,
        };
        let (input, shape) = self.shapes[bytes.below(self.shapes.len())];
        match bytes.below(8) {
            0..=2 => self.conv(&mut bytes, input, shape),
            3 | 4 => self.pool(&mut bytes, input, shape),
            5 => {
                let kind = if bytes.flag() {
                    PoolKind::Max
                } else {
                    PoolKind::Avg
                };
                let [n, c, _, _] = shape;
                self.node(&mut bytes, Op::GlobalPool { kind, input }, [n, c, 1, 1]);
                let pooled = *self.shapes.last().expect("the node just added");
                self.per_channel.push(pooled);
            }
            6 => match bytes.below(7) {
                0 => self.node(&mut bytes, Op::Relu { input }, shape),
                1 => {
                    let rhs = self.value_of_shape(&mut bytes, shape).unwrap_or(input);
                    self.node(&mut bytes, Op::Add { lhs: input, rhs }, shape);
                }
                2 => {
                    let act = activation(&mut bytes);
                    self.node(&mut bytes, Op::Act { act, input }, shape);
                }
                3 => {
                    let slope = self.param("slope", vec![shape[1]]);
                    self.node(&mut bytes, Op::PRelu { input, slope }, shape);
                }
                4 => {
                    let kinds = [
                        BinaryKind::Add,
                        BinaryKind::Sub,
                        BinaryKind::Mul,
                        BinaryKind::Div,
                    ];
                    let kind = kinds[bytes.below(4)];
                    let [n, c, _, _] = shape;
                    let rhs = if bytes.flag() {
                        let candidates: Vec<Value> = self
                            .per_channel
                            .iter()
                            .filter(|(_, s)| *s == [n, c, 1, 1])
                            .map(|(v, _)| *v)
                            .collect();
                        (!candidates.is_empty()).then(|| candidates[bytes.below(candidates.len())])
                    } else {
                        self.value_of_shape(&mut bytes, shape)
                    }
                    .unwrap_or(input);
                    self.node(
                        &mut bytes,
                        Op::Binary {
                            kind,
                            lhs: input,
                            rhs,
                        },
                        shape,
                    );
                }
                5 => self.resize(&mut bytes, input, shape),
                _ => {
                    let other = self.value_of_shape(&mut bytes, shape).unwrap_or(input);
                    let [n, c, h, w] = shape;
                    let inputs = vec![input, other, input];
                    self.node(&mut bytes, Op::Concat { inputs }, [n, 3 * c, h, w]);
                }
            },
            _ => {
                let c = shape[1];
                let bn = BatchNorm {
                    input,
                    scale: self.param("bn.scale", vec![c]),
                    bias: self.param("bn.bias", vec![c]),
                    mean: self.param("bn.mean", vec![c]),
                    var: self.param("bn.var", vec![c]),
                    epsilon: EPSILONS[bytes.below(EPSILONS.len())],
                };
                self.node(&mut bytes, Op::BatchNorm(bn), shape);
            }
        }
    }

    /// A resize in any mode, by whole or fractional factors of the input, to fixed extents, or
    /// to the extents of another value.
    fn resize(&mut self, bytes: &mut Bytes<'_>, input: Value, [n, c, h, w]: [usize; 4]) {
        let mode = if bytes.flag() {
            ResizeMode::Linear
        } else {
            ResizeMode::Nearest(NearestMode::ALL[bytes.below(NearestMode::ALL.len())])
        };
        let coord = CoordMode::ALL[bytes.below(CoordMode::ALL.len())];
        let (size, out) = match bytes.below(3) {
            0 => {
                // Whole factors, or n / 2^k (halves, quarters, eighths) that keep a pixel.
                let mut factor = |extent: usize| {
                    let fraction =
                        ScaleFactor::new(bytes.range(1, 24) as u64, 1 << bytes.range(1, 3));
                    match fraction {
                        Some(f) if bytes.flag() && f.apply(extent as u64) > Some(0) => f,
                        _ => ScaleFactor::whole(bytes.range(1, 3) as u64),
                    }
                };
                let f = [factor(h), factor(w)];
                let out = [f[0].apply(h as u64), f[1].apply(w as u64)].map(|o| o.unwrap() as usize);
                (ResizeSize::Scale(f), out)
            }
            1 => {
                let s = [bytes.range(1, 13), bytes.range(1, 13)];
                (ResizeSize::Sizes([s[0] as u64, s[1] as u64]), s)
            }
            _ => {
                let (like, [_, _, lh, lw]) = self.shapes[bytes.below(self.shapes.len())];
                (ResizeSize::Like(like), [lh, lw])
            }
        };
        let op = Op::Resize(Resize {
            input,
            mode,
            coord,
            size,
        });
        self.node(bytes, op, [n, c, out[0], out[1]]);
    }

    fn conv(&mut self, bytes: &mut Bytes<'_>, input: Value, [n, c, h, w]: [usize; 4]) {
        let (groups, out_channels) = if bytes.flag() {
            // Depthwise, with a channel multiplier of 1 or 2.
            let multiplier = if c <= 4 { bytes.range(1, 2) } else { 1 };
            (c, c * multiplier)
        } else {
            let out_channels = bytes.range(1, 8);
            let common: Vec<usize> = (1..=c)
                .filter(|&g| c.is_multiple_of(g) && out_channels.is_multiple_of(g))
                .collect();
            (common[bytes.below(common.len())], out_channels)
        };
        let auto_pad = auto_pad(bytes);
        let (kh, sh, dh, top, bottom, oh) = conv_axis(bytes, h, auto_pad);
        let (kw, sw, dw, left, right, ow) = conv_axis(bytes, w, auto_pad);
        let weight_shape = vec![out_channels, c / groups, kh, kw];
        let (weight, bias) = if bytes.below(4) == 0 {
            // Batch-norm folded into derived parameters, as the optimizer declares them.
            let raw = self.param("conv.weight", weight_shape.clone());
            let conv_bias = bytes
                .flag()
                .then(|| self.param("conv.bias", vec![out_channels]));
            let per_channel = vec![out_channels];
            let scale = self.param("fold.scale", per_channel.clone());
            let shift = self.param("fold.bias", per_channel.clone());
            let mean = self.param("fold.mean", per_channel.clone());
            let var = self.param("fold.var", per_channel.clone());
            let epsilon = EPSILONS[bytes.below(EPSILONS.len())];
            let weight_name = self.fresh("folded.weight");
            // A 1x1 depthwise conv may be a batch-norm of its own, its weight the scale.
            let derived = if weight_shape[1..] == [1, 1, 1] && bytes.flag() {
                DerivedParam::BnScale {
                    scale,
                    var,
                    epsilon,
                }
            } else {
                DerivedParam::BnFoldWeight {
                    weight: raw,
                    scale,
                    var,
                    epsilon,
                }
            };
            let weight = self.derived(weight_name, weight_shape, Some(derived));
            let bias_name = self.fresh("folded.bias");
            let bias = self.derived(
                bias_name,
                per_channel,
                Some(DerivedParam::BnFoldBias {
                    conv_bias,
                    scale,
                    bias: shift,
                    mean,
                    var,
                    epsilon,
                }),
            );
            (weight, Some(bias))
        } else {
            let weight = self.param("conv.weight", weight_shape);
            let bias = bytes
                .flag()
                .then(|| self.param("conv.bias", vec![out_channels]));
            (weight, bias)
        };
        let out = [n, out_channels, oh, ow];
        let mut post_ops = Vec::new();
        for _ in 0..bytes.below(4) {
            post_ops.push(match bytes.below(4) {
                0 => PostOp::Relu,
                3 => PostOp::Act(activation(bytes)),
                1 => match self.value_of_shape(bytes, out) {
                    Some(r) => PostOp::Add(r),
                    None => PostOp::Relu,
                },
                _ => {
                    let a = FLOATS[bytes.below(FLOATS.len())];
                    let b = FLOATS[bytes.below(FLOATS.len())];
                    PostOp::Clip {
                        lo: a.min(b),
                        hi: a.max(b),
                    }
                }
            });
        }
        // A max pool can only be the last post-op, and gives the conv's result its shape.
        let mut result = out;
        if bytes.below(3) == 1 {
            let ceil_mode = bytes.flag();
            let (kh, sh, dh, top, bottom, ph) = pool_axis(bytes, oh, ceil_mode, None);
            let (kw, sw, dw, left, right, pw) = pool_axis(bytes, ow, ceil_mode, None);
            post_ops.push(PostOp::MaxPool(PoolWindow {
                kernel: [kh, kw],
                strides: [sh, sw],
                pads: Pads {
                    top,
                    left,
                    bottom,
                    right,
                },
                dilations: [dh, dw],
                ceil_mode,
            }));
            result = [n, out_channels, ph, pw];
        }
        let conv = Conv2d {
            input,
            weight,
            bias,
            strides: [sh, sw],
            dilations: [dh, dw],
            pads: Pads {
                top,
                left,
                bottom,
                right,
            },
            auto_pad,
            groups,
            post_ops,
        };
        self.node(bytes, Op::Conv2d(conv), result);
    }

    fn pool(&mut self, bytes: &mut Bytes<'_>, input: Value, [n, c, h, w]: [usize; 4]) {
        let kind = if bytes.flag() {
            PoolKind::Max
        } else {
            PoolKind::Avg
        };
        let ceil_mode = bytes.flag();
        let count_include_pad = kind == PoolKind::Avg && bytes.flag();
        let auto_pad = auto_pad(bytes);
        let (kh, sh, dh, top, bottom, oh) = pool_axis(bytes, h, ceil_mode, auto_pad);
        let (kw, sw, dw, left, right, ow) = pool_axis(bytes, w, ceil_mode, auto_pad);
        let pool = Pool2d {
            kind,
            input,
            window: PoolWindow {
                kernel: [kh, kw],
                strides: [sh, sw],
                pads: Pads {
                    top,
                    left,
                    bottom,
                    right,
                },
                dilations: [dh, dw],
                ceil_mode,
            },
            auto_pad,
            count_include_pad,
        };
        self.node(bytes, Op::Pool2d(pool), [n, c, oh, ow]);
    }
}

/// `auto_pad` for a conv or pooling node: one in four has one.
fn auto_pad(bytes: &mut Bytes<'_>) -> Option<AutoPad> {
    match bytes.below(8) {
        0 => Some(AutoPad::SameUpper),
        1 => Some(AutoPad::SameLower),
        _ => None,
    }
}

/// The `(begin, end)` padding of `auto` along an axis of `input` cells, as ONNX defines it:
/// the output is `ceil(input / s)` windows, the odd cell of padding at the end for SAME_UPPER.
fn auto_axis_pads(auto: AutoPad, input: usize, k: usize, s: usize, d: usize) -> (usize, usize) {
    let out = input.div_ceil(s);
    let total = ((out - 1) * s + d * (k - 1) + 1).saturating_sub(input);
    match auto {
        AutoPad::SameUpper => (total / 2, total - total / 2),
        AutoPad::SameLower => (total - total / 2, total / 2),
    }
}

/// Kernel, stride, dilation, pads and output extent of a conv along one axis of `input`
/// cells; a window that would not fit falls back to a 1-wide kernel. With `auto`, the pads
/// are zero (the node's `auto_pad` pads it) and the output is `ceil(input / stride)`.
fn conv_axis(
    bytes: &mut Bytes<'_>,
    input: usize,
    auto: Option<AutoPad>,
) -> (usize, usize, usize, usize, usize, usize) {
    let (mut k, s, mut d) = (bytes.range(1, 3), bytes.range(1, 3), bytes.range(1, 2));
    let (begin, end) = (bytes.below(3), bytes.below(3));
    if auto.is_some() {
        return (k, s, d, 0, 0, input.div_ceil(s));
    }
    if d * (k - 1) + 1 > input + begin + end {
        (k, d) = (1, 1);
    }
    let out = (input + begin + end - (d * (k - 1) + 1)) / s + 1;
    (k, s, d, begin, end, out)
}

/// Like [`conv_axis`] for pooling: pads stay below the kernel, average pooling has no
/// dilation, `ceil_mode` drops a last window that would start in the end padding, and a
/// window that would cover only padding falls back to a 1-wide kernel without padding.
/// With `auto`, the pads are zero and the output is that of the padding `auto` resolves to.
fn pool_axis(
    bytes: &mut Bytes<'_>,
    input: usize,
    ceil: bool,
    auto: Option<AutoPad>,
) -> (usize, usize, usize, usize, usize, usize) {
    let k = bytes.range(1, 3);
    let s = bytes.range(1, 3);
    // Max and average pooling alike take dilations.
    let d = bytes.range(1, 2);
    let (begin, end) = (bytes.below(k), bytes.below(k));
    if let Some(auto) = auto {
        let (b, e) = auto_axis_pads(auto, input, k, s, d);
        return match pool_extent(input, k, s, d, b, e, ceil) {
            Some(out) => (k, s, d, 0, 0, out),
            // A 1-wide window at any stride needs no padding.
            None => (1, s, 1, 0, 0, input.div_ceil(s)),
        };
    }
    match pool_extent(input, k, s, d, begin, end, ceil) {
        Some(out) => (k, s, d, begin, end, out),
        None => {
            let out = pool_extent(input, 1, s, 1, 0, 0, ceil).expect("a 1-wide window fits");
            (1, s, 1, 0, 0, out)
        }
    }
}

/// The output extent of a pooling window, or `None` when it does not fit or some window
/// position covers only padding.
fn pool_extent(
    input: usize,
    k: usize,
    s: usize,
    d: usize,
    begin: usize,
    end: usize,
    ceil: bool,
) -> Option<usize> {
    let extent = d * (k - 1) + 1;
    let padded = input + begin + end;
    if padded < extent {
        return None;
    }
    let span = padded - extent;
    let mut out = if ceil {
        span.div_ceil(s) + 1
    } else {
        span / s + 1
    };
    if ceil && (out - 1) * s >= input + begin {
        out -= 1;
    }
    let touches = |o: usize| {
        (0..k).any(|j| {
            let cell = (o * s + j * d) as isize - begin as isize;
            cell >= 0 && (cell as usize) < input
        })
    };
    (0..out).all(touches).then_some(out)
}

fn build(spec: &InputSpec, seeds: &[[u8; 32]], extra_outputs: u32) -> Built {
    let mut bindings = Bindings::new();
    let mut dim = |symbolic: bool, name: &str, n: usize| {
        if symbolic {
            bindings.insert(name.to_string(), n as u64);
            Dim::Sym(name.to_string())
        } else {
            Dim::Known(n as u64)
        }
    };
    // A square input may use one symbol for both extents.
    let share = spec.share_symbol && spec.sym_height && spec.sym_width;
    let (h_name, w_name) = if share { ("S", "S") } else { ("H", "W_1") };
    let width = if share { spec.height } else { spec.width };
    let shape = vec![
        Dim::Known(spec.batch as u64),
        Dim::Known(spec.channels as u64),
        dim(spec.sym_height, h_name, spec.height),
        dim(spec.sym_width, w_name, width),
    ];
    let concrete = [spec.batch, spec.channels, spec.height, width];
    let mut b = Builder {
        graph: Graph::new("random"),
        shapes: Vec::new(),
        per_channel: Vec::new(),
        names: 0,
    };
    let x = b.graph.add_input("x", shape.clone()).unwrap();
    b.shapes.push((x, concrete));
    if spec.second_input {
        let x2 = b.graph.add_input("x.skip", shape).unwrap();
        b.shapes.push((x2, concrete));
    }
    for seed in seeds {
        b.op(seed);
    }
    let last = b.shapes.last().expect("an input").0;
    assert!(b.graph.add_output("out", last));
    for (i, (v, _)) in b.shapes.iter().enumerate() {
        if extra_outputs & (1 << (i % 32)) != 0 {
            assert!(b.graph.add_output(format!("out_{i}"), *v));
        }
    }
    Built {
        graph: b.graph,
        shapes: b.shapes,
        bindings,
    }
}

/// The concrete output shapes of a graph by output name.
fn output_shapes(g: &Graph, bindings: &Bindings) -> BTreeMap<String, Option<Vec<usize>>> {
    let shapes = infer_shapes(g, bindings).expect("the graph verifies");
    g.outputs()
        .iter()
        .map(|(name, v)| (name.clone(), shapes.concrete(*v)))
        .collect()
}

/// `cases` cases, with failing inputs saved beside this file (proptest cannot find a `lib.rs`
/// for an integration test, so its default place does not work here).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

fn assert_round_trips(text: &str) -> Graph {
    let parsed =
        parse(text).unwrap_or_else(|e| panic!("printed graph does not parse: {e}\n{text}"));
    assert_eq!(
        parsed.to_string(),
        text,
        "print -> parse -> print changed the text"
    );
    parsed
}

proptest! {
    #![proptest_config(config(384))]

    #[test]
    fn valid_graphs_round_trip_and_verify(
        spec in input_spec(),
        seeds in prop::collection::vec(any::<[u8; 32]>(), 1..12),
        extra_outputs in any::<u32>(),
    ) {
        let Built { graph, shapes, bindings } = build(&spec, &seeds, extra_outputs);
        let text = graph.to_string();
        let parsed = assert_round_trips(&text);

        // Unbound, the symbolic shapes resolve to the model's under the bindings.
        let symbolic = infer_shapes(&parsed, &Bindings::new())
            .unwrap_or_else(|e| panic!("does not verify unbound: {e}\n{text}"));
        let bound = infer_shapes(&parsed, &bindings)
            .unwrap_or_else(|e| panic!("does not verify with {bindings:?}: {e}\n{text}"));
        for (v, expected) in &shapes {
            let name = graph.value_name(*v);
            let pv = parsed.value_by_name(name).expect("the value is in the parsed graph");
            prop_assert_eq!(bound.concrete(pv), Some(expected.to_vec()), "%{} in\n{}", name, text);
            let resolved: Vec<Dim> = symbolic
                .get(pv)
                .expect("a shape")
                .iter()
                .map(|d| d.resolve(&bindings).expect("the window fits"))
                .collect();
            let expected_dims: Vec<Dim> = expected.iter().map(|&n| Dim::Known(n as u64)).collect();
            prop_assert_eq!(resolved, expected_dims, "%{} resolved in\n{}", name, text);
        }
        // The graph built in code verifies the same way as the parsed one.
        prop_assert_eq!(infer_shapes(&graph, &bindings).ok(), Some(bound));

        // The passes keep the output shapes, and their result round-trips too.
        let before = output_shapes(&parsed, &bindings);
        let mut optimized = parsed.clone();
        passes::optimize(&mut optimized);
        let optimized_text = optimized.to_string();
        let reparsed = assert_round_trips(&optimized_text);
        prop_assert_eq!(output_shapes(&reparsed, &bindings), before, "after the passes:\n{}", optimized_text);
        prop_assert!(infer_shapes(&reparsed, &Bindings::new()).is_ok());
    }
}

/// Parses and verifies `text` with several bindings of its symbols; whatever the outcome, no
/// panic. Accepted text must also round-trip, and errors must render.
fn exercise(text: &str) {
    match parse(text) {
        Err(e) => {
            let rendered = IrError::from(e.clone()).render("fuzz.ir", text);
            assert!(
                rendered.contains(&e.message),
                "the rendering shows the message: {rendered}"
            );
        }
        Ok(g) => {
            let printed = g.to_string();
            let again = parse(&printed)
                .unwrap_or_else(|e| panic!("accepted text prints unparsable text: {e}\n{printed}"));
            assert_eq!(
                again.to_string(),
                printed,
                "accepted text does not print stably"
            );
            let symbols = g.symbols();
            for value in [None, Some(1), Some(7), Some(1 << 20), Some(u64::MAX)] {
                let bindings: Bindings = match value {
                    None => Bindings::new(),
                    Some(n) => symbols.iter().map(|s| (s.clone(), n)).collect(),
                };
                if let Err(e) = infer_shapes(&g, &bindings) {
                    let rendered = IrError::from(e).render("fuzz.ir", text);
                    assert!(rendered.contains("error:"), "{rendered}");
                }
            }
        }
    }
}

/// The shipped IR files, whose mutations the garbage tests parse.
fn corpus() -> &'static [String] {
    static CORPUS: OnceLock<Vec<String>> = OnceLock::new();
    CORPUS.get_or_init(read_corpus)
}

fn read_corpus() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ir");
    let mut out = Vec::new();
    for dir in [root.clone(), root.join("examples"), root.join("bad")] {
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "ir"))
            .collect();
        paths.sort();
        out.extend(paths.iter().map(|p| std::fs::read_to_string(p).unwrap()));
    }
    assert!(out.len() > 10, "expected the shipped IR files");
    out
}

/// Splits text into tokens that keep it intact when joined: runs of whitespace, runs of name
/// characters (with sigils and signs), and single other characters.
fn tokenize(text: &str) -> Vec<String> {
    let class = |c: char| {
        if c.is_whitespace() {
            0
        } else if c.is_alphanumeric() || "_.%@-+".contains(c) {
            1
        } else {
            2
        }
    };
    let mut out: Vec<String> = Vec::new();
    let mut prev = None;
    for c in text.chars() {
        let k = class(c);
        match out.last_mut() {
            Some(last) if prev == Some(k) && k != 2 => last.push(c),
            _ => out.push(c.to_string()),
        }
        prev = Some(k);
    }
    out
}

/// Tokens that the mutations insert: every kind of token the format has, and numbers at the
/// edges of every integer and float width.
const POOL: &[&str] = &[
    "graph",
    "input",
    "param",
    "output",
    "f32",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ":",
    "=",
    "\n",
    " ",
    "#",
    "%x",
    "%",
    "@",
    "@w",
    "H",
    "W",
    "conv2d",
    "maxpool2d",
    "avgpool2d",
    "relu",
    "add",
    "batchnorm",
    "global_avgpool",
    "post",
    "clip",
    "maxpool",
    "kernel",
    "strides",
    "pads",
    "dilations",
    "groups",
    "ceil_mode",
    "count_include_pad",
    "epsilon",
    "bias",
    "true",
    "false",
    "bnfold_weight",
    "bn_scale",
    "bnfold_bias",
    "conv_bias",
    "0",
    "1",
    "2",
    "3",
    "-1",
    "65536",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e-5",
    "1e40",
    "-0.0",
    "nan",
    "inf",
    "0.5",
    "1e",
    "+3",
    ".5",
];

#[derive(Clone, Debug)]
enum Mutation {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    Replace(usize, usize),
    Insert(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let any_pos = any::<usize>();
    let pooled = 0..POOL.len();
    prop_oneof![
        any_pos.prop_map(Mutation::Delete),
        any_pos.prop_map(Mutation::Duplicate),
        (any_pos, any_pos).prop_map(|(a, b)| Mutation::Swap(a, b)),
        (any_pos, pooled.clone()).prop_map(|(a, t)| Mutation::Replace(a, t)),
        (any_pos, pooled).prop_map(|(a, t)| Mutation::Insert(a, t)),
    ]
}

fn mutate(tokens: &mut Vec<String>, m: &Mutation) {
    if tokens.is_empty() {
        return;
    }
    let at = |i: usize| i % tokens.len();
    match *m {
        Mutation::Delete(i) => {
            tokens.remove(at(i));
        }
        Mutation::Duplicate(i) => {
            let i = at(i);
            tokens.insert(i, tokens[i].clone());
        }
        Mutation::Swap(i, j) => {
            let (i, j) = (at(i), at(j));
            tokens.swap(i, j);
        }
        Mutation::Replace(i, t) => {
            let i = at(i);
            tokens[i] = POOL[t].to_string();
        }
        Mutation::Insert(i, t) => tokens.insert(at(i), POOL[t].to_string()),
    }
}

fn token_soup() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        4 => prop::sample::select(POOL).prop_map(str::to_string),
        1 => "[%@]?[a-zA-Z_.0-9]{1,6}",
        1 => "[-+]?[0-9]{1,21}(\\.[0-9]{0,3})?(e[-+]?[0-9]{1,3})?",
    ];
    prop::collection::vec(token, 0..80).prop_map(|t| t.join(" "))
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_strings_never_panic(text in "\\PC{0,200}") {
        exercise(&text);
    }

    #[test]
    fn token_soup_never_panics(body in token_soup(), wrap in any::<bool>()) {
        let text = if wrap { format!("graph g {{\n{body}\n}}\n") } else { body };
        exercise(&text);
    }

    #[test]
    fn mutated_files_never_panic(
        file in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let corpus = corpus();
        let mut tokens = tokenize(&corpus[file.index(corpus.len())]);
        for m in &mutations {
            mutate(&mut tokens, m);
        }
        exercise(&tokens.concat());
    }

    #[test]
    fn mutated_random_graphs_never_panic(
        spec in input_spec(),
        seeds in prop::collection::vec(any::<[u8; 32]>(), 1..8),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let text = build(&spec, &seeds, 0).graph.to_string();
        let mut tokens = tokenize(&text);
        for m in &mutations {
            mutate(&mut tokens, m);
        }
        exercise(&tokens.concat());
    }
}

#[test]
fn tokenize_keeps_the_text() {
    for text in corpus() {
        let tokens = tokenize(text);
        assert!(tokens.len() > 10);
        assert_eq!(&tokens.concat(), text);
    }
}

/// The generator reaches the `maxpool` post-op, and graphs where the pass fuses a pool, often
/// enough for the round-trip property to cover them: the post-op takes bytes that a seed may
/// have used up on other choices.
#[test]
fn random_graphs_include_maxpool_post_ops_and_fusable_pools() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (
        input_spec(),
        prop::collection::vec(any::<[u8; 32]>(), 1..12),
    );
    let (mut with_post_op, mut with_fusion) = (0, 0);
    let cases = 200;
    for _ in 0..cases {
        let (spec, seeds) = strategy.new_tree(&mut runner).unwrap().current();
        let mut graph = build(&spec, &seeds, 0).graph;
        if graph.to_string().contains("maxpool(") {
            with_post_op += 1;
        }
        if passes::optimize(&mut graph).fused_pools > 0 {
            with_fusion += 1;
        }
    }
    assert!(
        with_post_op >= cases / 4,
        "{with_post_op} of {cases} graphs have a maxpool post-op"
    );
    assert!(
        with_fusion >= 5,
        "{with_fusion} of {cases} graphs fuse a pool"
    );
}
