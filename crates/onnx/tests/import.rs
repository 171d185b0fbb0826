//! The importer on small ONNX models built here with the crate's own prost structs: each op
//! and attribute, the text round trip, names, external data, and every error.

use primjit_ir::{AutoPad, Conv2d, Dim, Op, Pads, PoolKind, PostOp, infer_shapes, parse_bindings};
use primjit_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, attribute_type, data_location,
    data_type, tensor_shape_proto, type_proto,
};
use primjit_onnx::{NameKind, OnnxError, import_bytes, import_file, import_model};
use prost::Message;

// ---- building models ------------------------------------------------------------------------

enum A {
    I(i64),
    F(f32),
    S(&'static str),
    Is(Vec<i64>),
    T(TensorProto),
}

fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<(&str, A)>,
) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs
            .into_iter()
            .map(|(n, a)| {
                let mut p = AttributeProto {
                    name: n.into(),
                    ..Default::default()
                };
                match a {
                    A::I(i) => (p.r#type, p.i) = (attribute_type::INT, i),
                    A::F(f) => (p.r#type, p.f) = (attribute_type::FLOAT, f),
                    A::S(s) => (p.r#type, p.s) = (attribute_type::STRING, s.as_bytes().to_vec()),
                    A::Is(v) => (p.r#type, p.ints) = (attribute_type::INTS, v),
                    A::T(t) => (p.r#type, p.t) = (attribute_type::TENSOR, Some(t)),
                }
                p
            })
            .collect(),
        ..Default::default()
    }
}

/// A float tensor with values `0.01 * (i % 17) - 0.08`.
fn init(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    values(
        name,
        dims,
        (0..n).map(|i| 0.01 * (i % 17) as f32 - 0.08).collect(),
    )
}

fn values(name: &str, dims: &[i64], data: Vec<f32>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::FLOAT,
        float_data: data,
        ..Default::default()
    }
}

enum D {
    N(i64),
    P(&'static str),
    Unknown,
}

fn info(name: &str, elem: i32, dims: Vec<D>) -> ValueInfoProto {
    use tensor_shape_proto::{Dimension, dimension::Value};
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .into_iter()
                        .map(|d| Dimension {
                            value: match d {
                                D::N(n) => Some(Value::DimValue(n)),
                                D::P(p) => Some(Value::DimParam(p.into())),
                                D::Unknown => None,
                            },
                        })
                        .collect(),
                }),
            })),
        }),
    }
}

fn x4(name: &str, c: i64, h: i64, w: i64) -> ValueInfoProto {
    info(
        name,
        data_type::FLOAT,
        vec![D::N(1), D::N(c), D::N(h), D::N(w)],
    )
}

fn model(
    opset: i64,
    inputs: Vec<ValueInfoProto>,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    outputs: &[&str],
) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        producer_name: "primjit tests".into(),
        graph: Some(GraphProto {
            name: "test".into(),
            node: nodes,
            initializer: inits,
            input: inputs,
            output: outputs
                .iter()
                .map(|o| ValueInfoProto {
                    name: o.to_string(),
                    r#type: None,
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn import(m: &ModelProto) -> primjit_onnx::Imported {
    let bytes = m.encode_to_vec();
    match import_bytes(&bytes, "model.onnx", None) {
        Ok(i) => i,
        Err(e) => panic!("import failed:\n{e}"),
    }
}

fn import_err(m: &ModelProto) -> String {
    match import_bytes(&m.encode_to_vec(), "model.onnx", None) {
        Ok(i) => panic!("import succeeded:\n{}", i.graph),
        Err(e) => e.to_string(),
    }
}

fn ops(i: &primjit_onnx::Imported) -> Vec<Op> {
    i.graph.nodes().map(|(_, n)| n.op.clone()).collect()
}

fn only_conv(i: &primjit_onnx::Imported) -> Conv2d {
    match ops(i).as_slice() {
        [Op::Conv2d(c)] => c.clone(),
        other => panic!("expected one conv, found {other:?}"),
    }
}

fn only_pool(i: &primjit_onnx::Imported) -> primjit_ir::Pool2d {
    match ops(i).as_slice() {
        [Op::Pool2d(p)] => p.clone(),
        other => panic!("expected one pool, found {other:?}"),
    }
}

/// Prints the graph, parses the text, and checks that the parsed graph prints the same and
/// has the same inputs, parameters, ops and outputs.
fn assert_round_trip(i: &primjit_onnx::Imported) -> String {
    let text = i.graph.to_string();
    let parsed = primjit_ir::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(parsed.to_string(), text);
    let parsed_ops: Vec<Op> = parsed.nodes().map(|(_, n)| n.op.clone()).collect();
    assert_eq!(parsed_ops, ops(i));
    assert_eq!(parsed.outputs(), i.graph.outputs());
    let shapes = |g: &primjit_ir::Graph| -> Vec<Vec<Dim>> {
        g.inputs().iter().map(|x| x.shape.clone()).collect()
    };
    assert_eq!(shapes(&parsed), shapes(&i.graph));
    let params = |g: &primjit_ir::Graph| -> Vec<(String, Vec<usize>)> {
        g.params()
            .map(|(_, p)| (p.name.clone(), p.shape.clone()))
            .collect()
    };
    assert_eq!(params(&parsed), params(&i.graph));
    text
}

// ---- ops and attributes ---------------------------------------------------------------------

#[test]
fn conv_with_bias_strides_pads_dilations_and_groups() {
    let m = model(
        17,
        vec![x4("x", 4, 9, 11)],
        vec![node(
            "Conv",
            "conv",
            &["x", "w", "b"],
            &["y"],
            vec![
                ("kernel_shape", A::Is(vec![3, 3])),
                ("strides", A::Is(vec![2, 1])),
                ("pads", A::Is(vec![1, 0, 2, 1])),
                ("dilations", A::Is(vec![1, 2])),
                ("group", A::I(2)),
            ],
        )],
        vec![init("w", &[6, 2, 3, 3]), init("b", &[6])],
        &["y"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(
        text.contains(
            "%y = conv2d(%x, @w, bias=@b, strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 1], groups=2)"
        ),
        "{text}"
    );
    assert_eq!(i.params.get("w").unwrap().shape, vec![6, 2, 3, 3]);
    assert_eq!(i.params.get("w").unwrap().data[1], 0.01 - 0.08);
    let shapes = i.graph.verify().unwrap();
    let y = i.graph.value_by_name("y").unwrap();
    assert_eq!(shapes.concrete(y), Some(vec![1, 6, 5, 8]));
}

#[test]
fn conv_without_kernel_shape_or_bias() {
    let m = model(
        11,
        vec![x4("x", 3, 5, 5)],
        vec![node("Conv", "c", &["x", "w"], &["y"], vec![])],
        vec![init("w", &[2, 3, 1, 1])],
        &["y"],
    );
    let c = only_conv(&import(&m));
    assert_eq!(c.bias, None);
    assert_eq!(c.strides, [1, 1]);
    assert!(c.pads.is_zero());
}

#[test]
fn conv_auto_pad_same_upper_lower_and_valid() {
    let conv = |auto_pad: &'static str, stride: i64, w: i64, wd: D| {
        model(
            17,
            vec![info(
                "x",
                data_type::FLOAT,
                vec![D::N(1), D::N(1), D::N(w), wd],
            )],
            vec![node(
                "Conv",
                "c",
                &["x", "w"],
                &["y"],
                vec![
                    ("auto_pad", A::S(auto_pad)),
                    ("strides", A::Is(vec![stride, stride])),
                ],
            )],
            vec![init("w", &[1, 1, 4, 3])],
            &["y"],
        )
    };
    // Height 7, kernel 4, stride 2: out 4, total pad (4-1)*2+4-7 = 3; width 8, kernel 3: 1.
    let upper = only_conv(&import(&conv("SAME_UPPER", 2, 7, D::N(8))));
    assert_eq!(
        [
            upper.pads.top,
            upper.pads.left,
            upper.pads.bottom,
            upper.pads.right
        ],
        [1, 0, 2, 1]
    );
    let lower = only_conv(&import(&conv("SAME_LOWER", 2, 7, D::N(8))));
    assert_eq!(
        [
            lower.pads.top,
            lower.pads.left,
            lower.pads.bottom,
            lower.pads.right
        ],
        [2, 1, 1, 0]
    );
    let valid = only_conv(&import(&conv("VALID", 2, 7, D::N(8))));
    assert!(valid.pads.is_zero());
    // Stride 1: the total padding is kernel - 1 whatever the extent, so a symbol is fine.
    let sym = import(&conv("SAME_UPPER", 1, 7, D::P("W")));
    let c = only_conv(&sym);
    assert_eq!([c.pads.left, c.pads.right], [1, 1]);
    assert_eq!([c.pads.top, c.pads.bottom], [1, 2]);
    // Known extents and stride 1 resolve at import: the IR holds plain pads.
    assert_eq!(
        (upper.auto_pad, lower.auto_pad, c.auto_pad),
        (None, None, None)
    );
    // Stride 2 on a symbolic width: the split depends on the width, so the conv keeps the
    // mode, which the IR resolves at each bound shape, both axes alike.
    let sym = import(&conv("SAME_UPPER", 2, 7, D::P("W")));
    let c = only_conv(&sym);
    assert_eq!(c.auto_pad, Some(AutoPad::SameUpper));
    assert!(c.pads.is_zero());
    let text = assert_round_trip(&sym);
    assert!(
        text.contains("%y = conv2d(%x, @w, strides=[2, 2], auto_pad=same_upper)"),
        "{text}"
    );
    let y = sym.graph.value_by_name("y").unwrap();
    let shapes = sym.graph.verify().unwrap();
    assert_eq!(shapes.describe(y), "[1, 1, 4, (W - 1) / 2 + 1]");
    for (w, ow, left) in [(8, 4, 0), (9, 5, 1), (1, 1, 1)] {
        let bound = infer_shapes(&sym.graph, &parse_bindings(&format!("W={w}")).unwrap()).unwrap();
        assert_eq!(bound.concrete(y), Some(vec![1, 1, 4, ow]), "W={w}");
        assert_eq!(c.pads_at([4, 3], [7, w]).unwrap().left, left, "W={w}");
    }
    let lower = only_conv(&import(&conv("SAME_LOWER", 3, 7, D::P("W"))));
    assert_eq!(lower.auto_pad, Some(AutoPad::SameLower));
    let e = import_err(&conv("SAME", 1, 7, D::N(8)));
    assert!(
        e.contains("attribute auto_pad \"SAME\" is not one of"),
        "{e}"
    );
}

/// SAME pools at stride 2 over symbolic extents keep the mode, for the IR to resolve per
/// bound shape; a known extent resolves at import.
#[test]
fn pools_keep_auto_pad_over_symbolic_extents() {
    let pool = |op: &'static str, auto_pad: &'static str, h: D| {
        model(
            17,
            vec![info(
                "x",
                data_type::FLOAT,
                vec![D::N(1), D::N(2), h, D::P("W")],
            )],
            vec![node(
                op,
                "p",
                &["x"],
                &["y"],
                vec![
                    ("kernel_shape", A::Is(vec![3, 3])),
                    ("strides", A::Is(vec![2, 2])),
                    ("auto_pad", A::S(auto_pad)),
                ],
            )],
            vec![],
            &["y"],
        )
    };
    let i = import(&pool("MaxPool", "SAME_LOWER", D::P("H")));
    let text = assert_round_trip(&i);
    assert!(
        text.contains("%y = maxpool2d(%x, kernel=[3, 3], strides=[2, 2], auto_pad=same_lower)"),
        "{text}"
    );
    let p = only_pool(&i);
    assert_eq!(
        (p.kind, p.auto_pad),
        (PoolKind::Max, Some(AutoPad::SameLower))
    );
    let y = i.graph.value_by_name("y").unwrap();
    let bound = infer_shapes(&i.graph, &parse_bindings("H=7,W=8").unwrap()).unwrap();
    assert_eq!(bound.concrete(y), Some(vec![1, 2, 4, 4]));
    // SAME_LOWER 3/2: an odd extent pads one cell on each side, an even one one before.
    let w = p.window_at([7, 8]).unwrap();
    assert_eq!(
        w.pads,
        Pads {
            top: 1,
            left: 1,
            bottom: 1,
            right: 0
        }
    );
    // A known height does not make the node's padding explicit while its width is symbolic.
    let i = import(&pool("AveragePool", "SAME_UPPER", D::N(6)));
    let p = only_pool(&i);
    assert_eq!(
        (p.auto_pad, p.window.pads),
        (Some(AutoPad::SameUpper), Pads::default())
    );
    assert_eq!(
        i.graph
            .verify()
            .unwrap()
            .describe(i.graph.value_by_name("y").unwrap()),
        "[1, 2, 3, (W - 1) / 2 + 1]"
    );
}

#[test]
fn pools_keep_their_window_attributes() {
    let m = model(
        19,
        vec![x4("x", 2, 9, 10)],
        vec![
            node(
                "MaxPool",
                "mp",
                &["x"],
                &["m"],
                vec![
                    ("kernel_shape", A::Is(vec![3, 2])),
                    ("strides", A::Is(vec![2, 2])),
                    ("pads", A::Is(vec![1, 0, 1, 1])),
                    ("dilations", A::Is(vec![1, 2])),
                    ("ceil_mode", A::I(1)),
                ],
            ),
            node(
                "AveragePool",
                "ap",
                &["m"],
                &["a"],
                vec![
                    ("kernel_shape", A::Is(vec![2, 2])),
                    ("pads", A::Is(vec![1, 1, 1, 1])),
                    ("count_include_pad", A::I(1)),
                ],
            ),
            node("GlobalAveragePool", "g1", &["a"], &["g"], vec![]),
            node("GlobalMaxPool", "g2", &["a"], &["h"], vec![]),
        ],
        vec![],
        &["g", "h"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(
        text.contains(
            "%m = maxpool2d(%x, kernel=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], dilations=[1, 2], ceil_mode=true)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "%a = avgpool2d(%m, kernel=[2, 2], pads=[1, 1, 1, 1], count_include_pad=true)"
        ),
        "{text}"
    );
    assert!(text.contains("%g = global_avgpool(%a)"), "{text}");
    assert!(text.contains("%h = global_maxpool(%a)"), "{text}");
}

#[test]
fn relu_add_identity_and_batchnorm() {
    let m = model(
        15,
        vec![x4("x", 3, 4, 4)],
        vec![
            node(
                "Conv",
                "c",
                &["x", "w"],
                &["c"],
                vec![("pads", A::Is(vec![1, 1, 1, 1]))],
            ),
            node(
                "BatchNormalization",
                "bn",
                &["c", "s", "b", "m", "v"],
                &["n"],
                vec![("epsilon", A::F(1e-3))],
            ),
            node("Relu", "r", &["n"], &["r"], vec![]),
            node("Identity", "id", &["x"], &["skip"], vec![]),
            node("Add", "add", &["r", "skip"], &["s0"], vec![]),
            node("Identity", "out", &["s0"], &["y"], vec![]),
        ],
        vec![
            init("w", &[3, 3, 3, 3]),
            init("s", &[3]),
            init("b", &[3]),
            init("m", &[3]),
            values("v", &[3], vec![1.0, 0.5, 2.0]),
        ],
        &["y"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(
        text.contains("%n = batchnorm(%c, @s, @b, @m, @v, epsilon=0.001)"),
        "{text}"
    );
    assert!(text.contains("%s0 = add(%r, %x)"), "{text}");
    assert!(text.contains("output y = %s0"), "{text}");
    // The passes fold and fuse the imported graph as they do a written one.
    let mut g = i.graph.clone();
    let report = primjit_ir::passes::optimize(&mut g);
    assert_eq!(report.folded_batchnorms, 1);
    assert_eq!(g.node_count(), 1);
}

#[test]
fn clip_as_attributes_and_inputs_fuses_into_its_conv_or_stands_alone() {
    // Opset 7 (Clip-6): attributes; max left out.
    let m = model(
        7,
        vec![x4("x", 2, 3, 3)],
        vec![
            node("Conv", "c", &["x", "w"], &["c"], vec![]),
            node("Clip", "clip", &["c"], &["y"], vec![("min", A::F(0.5))]),
        ],
        vec![init("w", &[2, 2, 1, 1])],
        &["y"],
    );
    let i = import(&m);
    let c = only_conv(&i);
    assert_eq!(
        c.post_ops,
        vec![PostOp::Clip {
            lo: 0.5,
            hi: f32::MAX
        }]
    );
    assert_round_trip(&i);
    // With a min of 0 and no max, the clip is relu, which passes +Inf on (clipped at f32::MAX
    // it did not).
    let m = model(
        7,
        vec![x4("x", 2, 3, 3)],
        vec![
            node("Conv", "c", &["x", "w"], &["c"], vec![]),
            node("Clip", "clip", &["c"], &["y"], vec![("min", A::F(0.0))]),
        ],
        vec![init("w", &[2, 2, 1, 1])],
        &["y"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(text.contains("%y = relu(%c)"), "{text}");
    // Opset 13: constant inputs, min left out; the input is no conv's, so a depthwise identity
    // conv carries the clip.
    let six = TensorProto {
        name: "six".into(),
        data_type: data_type::FLOAT,
        float_data: vec![6.0],
        ..Default::default()
    };
    let m = model(
        13,
        vec![x4("x", 2, 3, 3)],
        vec![
            node("Constant", "k", &[], &["hi"], vec![("value", A::T(six))]),
            node("Relu", "r", &["x"], &["r"], vec![]),
            node("Clip", "clip", &["r", "", "hi"], &["y"], vec![]),
        ],
        vec![],
        &["y"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(
        text.contains("%y = conv2d(%r, @y.identity, groups=2, post=[clip(-3.4028235e38, 6.0)])"),
        "{text}"
    );
    assert_eq!(i.params.get("y.identity").unwrap().data, vec![1.0, 1.0]);
    // A conv read twice keeps its clip apart.
    let m = model(
        13,
        vec![x4("x", 2, 3, 3)],
        vec![
            node("Conv", "c", &["x", "w"], &["c"], vec![]),
            node("Clip", "clip", &["c", "lo", "hi"], &["k"], vec![]),
            node("Add", "add", &["c", "k"], &["y"], vec![]),
        ],
        vec![
            init("w", &[2, 2, 1, 1]),
            values("lo", &[], vec![0.0]),
            values("hi", &[], vec![6.0]),
        ],
        &["y"],
    );
    let i = import(&m);
    assert_eq!(i.graph.node_count(), 3);
    let e = import_err(&model(
        13,
        vec![x4("x", 2, 3, 3)],
        vec![node("Clip", "clip", &["x", "hi", "lo"], &["y"], vec![])],
        vec![values("lo", &[], vec![0.0]), values("hi", &[], vec![6.0])],
        &["y"],
    ));
    assert_eq!(
        e,
        "model.onnx: node \"clip\" (Clip, opset 13): min (6) is greater than max (0)"
    );
}

#[test]
fn conv_batchnorm_clip_folds_the_batchnorm_so_the_clip_is_a_post_op() {
    // MobileNet's unfolded Conv, BatchNormalization, Clip(0, 6), then a residual Add.
    let m = model(
        13,
        vec![x4("x", 2, 5, 5)],
        vec![
            node(
                "Conv",
                "c",
                &["x", "w", "b"],
                &["c"],
                vec![("pads", A::Is(vec![1, 1, 1, 1]))],
            ),
            node(
                "BatchNormalization",
                "bn",
                &["c", "s", "sh", "m", "v"],
                &["n"],
                vec![],
            ),
            node("Clip", "relu6", &["n", "lo", "hi"], &["r"], vec![]),
            node("Add", "add", &["x", "r"], &["y"], vec![]),
        ],
        vec![
            init("w", &[2, 2, 3, 3]),
            init("b", &[2]),
            values("s", &[2], vec![0.5, 2.0]),
            init("sh", &[2]),
            init("m", &[2]),
            values("v", &[2], vec![1.0, 0.25]),
            values("lo", &[], vec![0.0]),
            values("hi", &[], vec![6.0]),
        ],
        &["y"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(
        text.contains("%c = conv2d(%x, @w.bnfold, bias=@w.bnfold_bias, pads=[1, 1, 1, 1], post=[clip(0.0, 6.0)])"),
        "{text}"
    );
    assert!(text.contains("%y = add(%x, %c)"), "{text}");
    assert_eq!(i.graph.node_count(), 2);
    // The derived parameters have their values: the weight scaled by 0.5 / sqrt(1 + 1e-5).
    let w = &i.params.get("w").unwrap().data;
    let folded = &i.params.get("w.bnfold").unwrap().data;
    let scale = 0.5 / (1.0f64 + 1e-5).sqrt();
    assert!((folded[1] as f64 - w[1] as f64 * scale).abs() < 1e-7);
    assert_eq!(i.params.get("w.bnfold_bias").unwrap().shape, vec![2]);
}

#[test]
fn classifier_head_becomes_a_1x1_conv() {
    // Global pool, flatten, Gemm with transB (PyTorch's Linear), relu, MatMul + Add.
    let m = model(
        13,
        vec![x4("x", 3, 4, 4)],
        vec![
            node("GlobalAveragePool", "gap", &["x"], &["p"], vec![]),
            node("Flatten", "flat", &["p"], &["f"], vec![("axis", A::I(1))]),
            node(
                "Gemm",
                "fc",
                &["f", "fc.w", "fc.b"],
                &["h"],
                vec![("transB", A::I(1)), ("alpha", A::F(2.0))],
            ),
            node("Relu", "r", &["h"], &["hr"], vec![]),
            node("Dropout", "drop", &["hr"], &["hd"], vec![]),
            node("MatMul", "mm", &["hd", "mm.w"], &["mm"], vec![]),
            node("Add", "bias", &["mm", "mm.b"], &["y"], vec![]),
        ],
        vec![
            values("fc.w", &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            values("fc.b", &[2], vec![0.5, -0.5]),
            values("mm.w", &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            values("mm.b", &[1, 3], vec![0.1, 0.2, 0.3]),
        ],
        &["y"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(
        text.contains("%h = conv2d(%p, @fc.w, bias=@fc.b)"),
        "{text}"
    );
    assert!(
        text.contains("%mm = conv2d(%hr, @mm.w, bias=@mm.b)"),
        "{text}"
    );
    // Gemm with transB: the weight is B (times alpha); MatMul: B transposed.
    assert_eq!(i.params.get("fc.w").unwrap().shape, vec![2, 3, 1, 1]);
    assert_eq!(
        i.params.get("fc.w").unwrap().data,
        vec![2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    );
    assert_eq!(i.params.get("mm.w").unwrap().shape, vec![3, 2, 1, 1]);
    assert_eq!(
        i.params.get("mm.w").unwrap().data,
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
    assert_eq!(i.params.get("mm.b").unwrap().data, vec![0.1, 0.2, 0.3]);
    assert_eq!(i.flattened_outputs, vec!["y".to_string()]);
    let y = i.graph.value_by_name("mm").unwrap();
    assert_eq!(
        i.graph.verify().unwrap().concrete(y),
        Some(vec![1, 3, 1, 1])
    );
}

#[test]
fn a_constant_shared_by_dense_layers_of_other_scales_becomes_one_parameter_each() {
    // The same B and C in two Gemms, with another alpha and beta in the second: each gets
    // its own scaled parameter (the second reused the first's), and the same scales share.
    let gemm = |name: &str, out: &str, alpha: f32, beta: f32| {
        node(
            "Gemm",
            name,
            &["f", "w", "b"],
            &[out],
            vec![
                ("transB", A::I(1)),
                ("alpha", A::F(alpha)),
                ("beta", A::F(beta)),
            ],
        )
    };
    let m = model(
        13,
        vec![x4("x", 3, 4, 4)],
        vec![
            node("GlobalAveragePool", "gap", &["x"], &["p"], vec![]),
            node("Flatten", "flat", &["p"], &["f"], vec![("axis", A::I(1))]),
            gemm("one", "y1", 1.0, 1.0),
            gemm("three", "y3", 3.0, 2.0),
            gemm("again", "y1b", 1.0, 1.0),
        ],
        vec![
            values("w", &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            values("b", &[2], vec![0.5, -0.5]),
        ],
        &["y1", "y3", "y1b"],
    );
    let i = import(&m);
    let convs: Vec<Conv2d> = ops(&i)
        .into_iter()
        .filter_map(|op| match op {
            Op::Conv2d(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(convs.len(), 3);
    let data = |p: primjit_ir::Param| i.params.get(&i.graph.param(p).name).unwrap().data.clone();
    assert_eq!(data(convs[0].weight), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(data(convs[1].weight), vec![3.0, 6.0, 9.0, 12.0, 15.0, 18.0]);
    assert_eq!(data(convs[0].bias.unwrap()), vec![0.5, -0.5]);
    assert_eq!(data(convs[1].bias.unwrap()), vec![1.0, -1.0]);
    assert_eq!(convs[2].weight, convs[0].weight);
    assert_eq!(convs[2].bias, convs[0].bias);
    assert_eq!(i.graph.params().count(), 4);
}

#[test]
fn reshape_and_squeeze_flatten_a_1x1_image_like_flatten() {
    let shape = TensorProto {
        name: "shape".into(),
        dims: vec![2],
        data_type: data_type::INT64,
        int64_data: vec![0, -1],
        ..Default::default()
    };
    let axes = TensorProto {
        name: "axes".into(),
        dims: vec![2],
        data_type: data_type::INT64,
        int64_data: vec![-1, 2],
        ..Default::default()
    };
    let m = model(
        13,
        vec![x4("x", 3, 4, 4)],
        vec![
            node("GlobalAveragePool", "gap", &["x"], &["p"], vec![]),
            node("Reshape", "flat", &["p", "shape"], &["f"], vec![]),
            node("Gemm", "fc", &["f", "w"], &["y"], vec![("transB", A::I(1))]),
            node("GlobalMaxPool", "gmp", &["x"], &["q"], vec![]),
            node("Squeeze", "sq", &["q", "axes"], &["s"], vec![]),
            node("MatMul", "mm", &["s", "v"], &["z"], vec![]),
        ],
        vec![shape, axes, init("w", &[2, 3]), init("v", &[3, 5])],
        &["y", "z"],
    );
    let i = import(&m);
    assert_eq!(i.flattened_outputs, vec!["y".to_string(), "z".to_string()]);
    let text = assert_round_trip(&i);
    assert!(text.contains("%y = conv2d(%p, @w)"), "{text}");
    assert!(text.contains("%z = conv2d(%q, @v)"), "{text}");
    let bad = TensorProto {
        name: "bad".into(),
        dims: vec![2],
        data_type: data_type::INT64,
        int64_data: vec![1, 12],
        ..Default::default()
    };
    let e = import_err(&model(
        13,
        vec![x4("x", 3, 2, 2)],
        vec![node("Reshape", "r", &["x", "bad"], &["y"], vec![])],
        vec![bad],
        &["y"],
    ));
    assert_eq!(
        e,
        "model.onnx: node \"r\" (Reshape, opset 13): input 1 (shape) is [1, 12]: only a reshape to [N, C] of an [N, C, 1, 1] image is supported, the input is [1, 3, 2, 2]"
    );
}

/// `Squeeze` without axes (no attribute before opset 13, no input from 13) removes every
/// dimension of size 1, as the ONNX spec says, not the height and width only: a batch of 1
/// would lose its batch dimension too, which the importer cannot represent.
#[test]
fn squeeze_without_axes_removes_every_dimension_of_size_1() {
    let head = |opset: i64, batch: D, squeeze: NodeProto| {
        model(
            opset,
            vec![info(
                "x",
                data_type::FLOAT,
                vec![batch, D::N(3), D::N(4), D::N(4)],
            )],
            vec![
                node("GlobalMaxPool", "gmp", &["x"], &["q"], vec![]),
                squeeze,
                node("MatMul", "mm", &["s", "v"], &["z"], vec![]),
            ],
            vec![init("v", &[3, 5])],
            &["z"],
        )
    };
    let squeeze = |inputs: &[&str]| node("Squeeze", "sq", inputs, &["s"], vec![]);
    // A batch of 2: [2, 3, 1, 1] becomes [2, 3], the flattened image, at every opset.
    for (opset, inputs) in [(11, &["q"][..]), (13, &["q"]), (13, &["q", ""])] {
        let i = import(&head(opset, D::N(2), squeeze(inputs)));
        assert_eq!(i.flattened_outputs, vec!["z".to_string()]);
        let text = assert_round_trip(&i);
        assert!(text.contains("%z = conv2d(%q, @v)"), "{text}");
    }
    // A batch of 1: ONNX makes [1, 3, 1, 1] a [3] (this imported as [1, 3]).
    for opset in [11, 13] {
        assert_eq!(
            import_err(&head(opset, D::N(1), squeeze(&["q"]))),
            format!(
                "model.onnx: node \"sq\" (Squeeze, opset {opset}): without axes, Squeeze removes every dimension of size 1: the input [1, 3, 1, 1] would become [3], but only an [N, C, 1, 1] image squeezed to [N, C] (N and C not 1) is supported"
            )
        );
    }
    // A symbolic batch may be 1 when the model runs.
    assert_eq!(
        import_err(&head(13, D::P("N"), squeeze(&["q"]))),
        "model.onnx: node \"sq\" (Squeeze, opset 13): without axes, Squeeze removes every dimension of size 1, but dimension 0 of the input [N, 3, 1, 1] is `N`, which may be 1 when the model runs: give the axes to squeeze"
    );
    // With axes 2 and 3, a batch of 1 keeps its batch dimension, as before.
    let axes = TensorProto {
        name: "axes".into(),
        dims: vec![2],
        data_type: data_type::INT64,
        int64_data: vec![2, 3],
        ..Default::default()
    };
    let mut m = head(13, D::N(1), squeeze(&["q", "axes"]));
    m.graph.as_mut().unwrap().initializer.push(axes);
    assert_eq!(import(&m).flattened_outputs, vec!["z".to_string()]);
    // No dimension of size 1: the squeeze changes nothing, and the output is the input's.
    let m = model(
        13,
        vec![info(
            "x",
            data_type::FLOAT,
            vec![D::N(2), D::N(3), D::N(4), D::N(5)],
        )],
        vec![squeeze(&["x"]), node("Relu", "r", &["s"], &["y"], vec![])],
        vec![],
        &["y"],
    );
    let i = import(&m);
    assert!(i.flattened_outputs.is_empty());
    let text = assert_round_trip(&i);
    assert!(text.contains("%y = relu(%x)"), "{text}");
    // Some but not all of H and W of size 1: a [2, 3, 5] is not representable.
    let m = model(
        13,
        vec![info(
            "x",
            data_type::FLOAT,
            vec![D::N(2), D::N(3), D::N(1), D::N(5)],
        )],
        vec![squeeze(&["x"])],
        vec![],
        &["s"],
    );
    assert_eq!(
        import_err(&m),
        "model.onnx: node \"sq\" (Squeeze, opset 13): without axes, Squeeze removes every dimension of size 1: the input [2, 3, 1, 5] would become [2, 3, 5], but only an [N, C, 1, 1] image squeezed to [N, C] (N and C not 1) is supported"
    );
}

#[test]
fn dim_params_become_symbols_and_names_are_sanitized_and_traced() {
    let m = model(
        17,
        vec![info(
            "input:0",
            data_type::FLOAT,
            vec![D::P("batch size"), D::N(3), D::Unknown, D::P("W")],
        )],
        vec![
            node(
                "Relu",
                "/relu/Relu",
                &["input:0"],
                &["/relu/Relu_output_0"],
                vec![],
            ),
            node(
                "Conv",
                "conv",
                &["/relu/Relu_output_0", "conv/w:0"],
                &["out-put"],
                vec![],
            ),
        ],
        vec![init("conv/w:0", &[4, 3, 1, 1])],
        &["out-put"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(
        text.contains("input %input_0: f32[batch_size, 3, input_0_dim2, W]"),
        "{text}"
    );
    assert!(
        text.contains("%_relu_Relu_output_0 = relu(%input_0)"),
        "{text}"
    );
    assert!(text.contains("param @conv_w_0: f32[4, 3, 1, 1]"), "{text}");
    assert!(text.contains("output out_put = %out_put"), "{text}");
    assert_eq!(i.ir_name(NameKind::Value, "input:0"), Some("input_0"));
    assert_eq!(i.ir_name(NameKind::Param, "conv/w:0"), Some("conv_w_0"));
    assert_eq!(
        i.ir_name(NameKind::Symbol, "batch size"),
        Some("batch_size")
    );
    assert_eq!(i.ir_name(NameKind::Output, "out-put"), Some("out_put"));
    assert!(i.changed_names().any(|r| r.onnx == "/relu/Relu_output_0"));
    assert!(i.changed_names().all(|r| r.ir != r.onnx));
    assert_eq!(i.graph.symbols(), vec!["batch_size", "input_0_dim2", "W"]);
}

#[test]
fn constants_come_from_constant_nodes_and_raw_data() {
    let w = TensorProto {
        name: "w".into(),
        dims: vec![1, 1, 1, 1],
        data_type: data_type::FLOAT,
        raw_data: 2.5f32.to_le_bytes().to_vec().into(),
        ..Default::default()
    };
    let m = model(
        13,
        vec![x4("x", 1, 2, 2)],
        vec![
            node("Constant", "k", &[], &["kw"], vec![("value", A::T(w))]),
            node("Conv", "c", &["x", "kw"], &["y"], vec![]),
        ],
        vec![],
        &["y"],
    );
    let i = import(&m);
    assert_eq!(i.params.get("kw").unwrap().data, vec![2.5]);
}

#[test]
fn external_data_is_read_beside_the_model() {
    let dir = std::env::temp_dir().join(format!("primjit-onnx-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let floats: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
    let mut bytes = vec![0u8; 8];
    for f in &floats {
        bytes.extend(f.to_le_bytes());
    }
    std::fs::write(dir.join("model.onnx.data"), &bytes).unwrap();
    let external = |location: &str, offset: usize, length: usize| TensorProto {
        name: "w".into(),
        dims: vec![4, 3, 1, 1],
        data_type: data_type::FLOAT,
        data_location: data_location::EXTERNAL,
        external_data: vec![
            StringStringEntryProto {
                key: "location".into(),
                value: location.into(),
            },
            StringStringEntryProto {
                key: "offset".into(),
                value: offset.to_string(),
            },
            StringStringEntryProto {
                key: "length".into(),
                value: length.to_string(),
            },
        ],
        ..Default::default()
    };
    let with = |t: TensorProto| {
        model(
            17,
            vec![x4("x", 3, 2, 2)],
            vec![node("Conv", "c", &["x", "w"], &["y"], vec![])],
            vec![t],
            &["y"],
        )
    };
    let path = dir.join("model.onnx");
    std::fs::write(
        &path,
        with(external("model.onnx.data", 8, 48)).encode_to_vec(),
    )
    .unwrap();
    let i = import_file(&path).unwrap();
    assert_eq!(i.params.get("w").unwrap().data, floats);

    let problems = |t: TensorProto| {
        std::fs::write(&path, with(t).encode_to_vec()).unwrap();
        import_file(&path).unwrap_err().to_string()
    };
    let e = problems(external("model.onnx.data", 8, 400));
    assert!(
        e.contains("initializer \"w\": external data `")
            && e.contains("holds 56 bytes, fewer than offset 8 plus length 400"),
        "{e}"
    );
    let e = problems(external("../model.onnx.data", 8, 48));
    assert!(
        e.contains("must be a relative path inside the model's folder"),
        "{e}"
    );
    let e = problems(external("missing.data", 0, 48));
    assert!(e.contains("cannot open external data"), "{e}");
    let e = problems(external("model.onnx.data", 0, 40));
    assert!(
        e.contains("need 48 bytes of raw data but the tensor holds 40"),
        "{e}"
    );
    // Without a file, there is no folder to look in.
    let e = import_bytes(
        &with(external("model.onnx.data", 8, 48)).encode_to_vec(),
        "m",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("the model was not read from a file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- errors ---------------------------------------------------------------------------------

#[test]
fn every_unsupported_node_is_listed_once_and_nothing_downstream() {
    let m = model(
        17,
        vec![x4("x", 3, 8, 8)],
        vec![
            node("LRN", "LRN_42", &["x"], &["r"], vec![]),
            // Reads the failed value: not reported again.
            node("Relu", "relu_after", &["r"], &["r2"], vec![]),
            node("Conv", "conv", &["x", "w"], &["c"], vec![("foo", A::I(1))]),
            node("Softplus", "", &["x"], &["s"], vec![]),
            NodeProto {
                domain: "com.microsoft".into(),
                ..node("FusedConv", "fc", &["x"], &["f"], vec![])
            },
            node("Add", "sum", &["r2", "c"], &["y"], vec![]),
        ],
        vec![init("w", &[3, 3, 1, 1])],
        &["y"],
    );
    let e = import_err(&m);
    assert_eq!(
        e,
        [
            "model.onnx: node \"LRN_42\" (LRN, opset 17): unsupported op",
            "model.onnx: node \"conv\" (Conv, opset 17): attribute foo is not supported",
            "model.onnx: node \"#3\" (Softplus, opset 17): unsupported op",
            "model.onnx: node \"fc\" (com.microsoft.FusedConv): unsupported op of the domain com.microsoft, which the model does not import: only ops of the default (ai.onnx) domain are supported",
        ]
        .join("\n")
    );
    let err = import_bytes(&m.encode_to_vec(), "model.onnx", None).unwrap_err();
    assert_eq!(err.problems().len(), 4);
}

#[test]
fn node_errors_name_the_attribute_or_input_at_fault() {
    let one = |opset: i64, n: NodeProto, inits: Vec<TensorProto>| {
        import_err(&model(
            opset,
            vec![x4("x", 2, 6, 6)],
            vec![n],
            inits,
            &["y"],
        ))
    };
    let cases: Vec<(String, &str)> = vec![
        (
            one(
                17,
                node(
                    "MaxPool",
                    "mp",
                    &["x"],
                    &["y", "idx"],
                    vec![("kernel_shape", A::Is(vec![2, 2]))],
                ),
                vec![],
            ),
            "node \"mp\" (MaxPool, opset 17): output 1 (Indices) is not supported",
        ),
        (
            one(
                17,
                node(
                    "MaxPool",
                    "mp",
                    &["x"],
                    &["y"],
                    vec![
                        ("kernel_shape", A::Is(vec![2, 2])),
                        ("storage_order", A::I(1)),
                    ],
                ),
                vec![],
            ),
            "node \"mp\" (MaxPool, opset 17): attribute storage_order=1 is not supported",
        ),
        (
            one(17, node("MaxPool", "mp", &["x"], &["y"], vec![]), vec![]),
            "node \"mp\" (MaxPool, opset 17): attribute kernel_shape is missing",
        ),
        (
            one(
                17,
                node(
                    "MaxPool",
                    "mp",
                    &["x"],
                    &["y"],
                    vec![("kernel_shape", A::Is(vec![2]))],
                ),
                vec![],
            ),
            "node \"mp\" (MaxPool, opset 17): attribute kernel_shape [2]: only 2-D pooling is supported",
        ),
        (
            one(
                17,
                node(
                    "Conv",
                    "c",
                    &["x", "w"],
                    &["y"],
                    vec![("kernel_shape", A::Is(vec![5, 5]))],
                ),
                vec![init("w", &[2, 2, 3, 3])],
            ),
            "node \"c\" (Conv, opset 17): attribute kernel_shape [5, 5] differs from the weight's kernel [3, 3]",
        ),
        (
            one(
                17,
                node("Conv", "c", &["x", "w"], &["y"], vec![]),
                vec![init("w", &[2, 2, 3])],
            ),
            "node \"c\" (Conv, opset 17): input 1 (W) has rank 3: only 2-D convolutions (rank-4 weights) are supported",
        ),
        (
            one(17, node("Conv", "c", &["x", "x"], &["y"], vec![]), vec![]),
            "node \"c\" (Conv, opset 17): input 1 (W) is computed: it must be a constant (an initializer or a Constant node)",
        ),
        (
            one(
                17,
                node("Conv", "c", &["x", "w"], &["y"], vec![]),
                vec![init("w", &[2, 3, 3, 3])],
            ),
            "node \"c\" (Conv, opset 17): channel mismatch: the input has 2 channels but @w expects 3 (3 per group x 1 groups)",
        ),
        (
            one(
                17,
                node("Conv", "c", &["x", "w", "b"], &["y"], vec![]),
                vec![init("w", &[2, 2, 3, 3]), init("b", &[3])],
            ),
            "node \"c\" (Conv, opset 17): input 2 (B) has shape [3], expected [2]",
        ),
        (
            one(
                17,
                node(
                    "Conv",
                    "c",
                    &["x", "w"],
                    &["y"],
                    vec![("strides", A::Is(vec![0, 1]))],
                ),
                vec![init("w", &[2, 2, 3, 3])],
            ),
            "node \"c\" (Conv, opset 17): attribute strides must be at least 1, found 0",
        ),
        (
            one(
                17,
                node(
                    "Conv",
                    "c",
                    &["x", "w"],
                    &["y"],
                    vec![
                        ("pads", A::Is(vec![1, 1, 1, 1])),
                        ("auto_pad", A::S("VALID")),
                    ],
                ),
                vec![init("w", &[2, 2, 3, 3])],
            ),
            "node \"c\" (Conv, opset 17): attributes pads and auto_pad VALID are both set",
        ),
        (
            one(
                17,
                node("Conv", "c", &["x", "w"], &["y"], vec![("group", A::F(2.0))]),
                vec![init("w", &[2, 2, 3, 3])],
            ),
            "node \"c\" (Conv, opset 17): attribute group must be an integer",
        ),
        (
            one(
                17,
                node("Add", "a", &["x", "b"], &["y"], vec![]),
                vec![init("b", &[2, 1, 6])],
            ),
            "node \"a\" (Add, opset 17): input 1 is a constant of shape [2, 1, 6]: only a scalar or one value per channel is supported",
        ),
        (
            one(
                15,
                node(
                    "BatchNormalization",
                    "bn",
                    &["x", "s", "s", "s", "s"],
                    &["y"],
                    vec![("training_mode", A::I(1))],
                ),
                vec![init("s", &[2])],
            ),
            "node \"bn\" (BatchNormalization, opset 15): attribute training_mode=1 is not supported: inference only",
        ),
        (
            one(
                15,
                node(
                    "BatchNormalization",
                    "bn",
                    &["x", "s", "s", "s", "s"],
                    &["y", "rm"],
                    vec![],
                ),
                vec![init("s", &[2])],
            ),
            "node \"bn\" (BatchNormalization, opset 15): output 1 is only computed in training mode: not supported",
        ),
        (
            one(
                15,
                node(
                    "BatchNormalization",
                    "bn",
                    &["x", "s", "s", "s", "t"],
                    &["y"],
                    vec![],
                ),
                vec![init("s", &[2]), init("t", &[3])],
            ),
            "node \"bn\" (BatchNormalization, opset 15): input 4 (input_var) has shape [3], expected [2]",
        ),
        (
            one(
                13,
                node("Div", "d", &["b", "x"], &["y"], vec![]),
                vec![init("b", &[2, 1, 1])],
            ),
            "node \"d\" (Div, opset 13): dividing a constant by a computed tensor is not supported",
        ),
        (
            one(
                13,
                node("Gemm", "g", &["x", "w"], &["y"], vec![]),
                vec![init("w", &[2, 2])],
            ),
            "node \"g\" (Gemm, opset 13): input 0 (A) is not a flattened tensor: only Flatten after a global pool feeds a dense layer",
        ),
        (
            one(
                13,
                node("Clip", "c", &["x", "lo"], &["y"], vec![]),
                vec![init("lo", &[2])],
            ),
            "node \"c\" (Clip, opset 13): input 1 (min) has shape [2]: a scalar is needed",
        ),
        (
            one(
                17,
                node(
                    "AveragePool",
                    "ap",
                    &["x"],
                    &["y"],
                    vec![
                        ("kernel_shape", A::Is(vec![2, 2])),
                        ("pads", A::Is(vec![1, 1])),
                    ],
                ),
                vec![],
            ),
            "node \"ap\" (AveragePool, opset 17): attribute pads [1, 1]: four values (top, left, bottom, right) are needed",
        ),
        (
            one(
                17,
                node(
                    "MaxPool",
                    "mp",
                    &["x"],
                    &["y"],
                    vec![("kernel_shape", A::Is(vec![9, 9]))],
                ),
                vec![],
            ),
            "node \"mp\" (MaxPool, opset 17): output height would be less than 1: the padded input height is 6 but the window spans 9",
        ),
        (
            one(
                17,
                node("Conv", "c", &["x", "w"], &["y"], vec![]),
                vec![init("w", &[2, 2, 0, 3])],
            ),
            "node \"c\" (Conv, opset 17): input 1 (W) has shape [2, 2, 0, 3]: the kernel must be at least 1x1",
        ),
        (
            one(17, node("Relu", "r", &["nowhere"], &["y"], vec![]), vec![]),
            "node \"r\" (Relu, opset 17): input 0 (X) \"nowhere\" is not defined before its use",
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, format!("model.onnx: {want}"));
    }
}

/// SAME padding's arithmetic takes any stride without overflow; a stride over the kernels'
/// bound (2^29) is then refused by verification, at the node.
#[test]
fn same_padding_with_a_huge_stride_does_not_overflow() {
    let m = |stride: i64| {
        model(
            17,
            vec![x4("x", 2, 6, 6)],
            vec![node(
                "Conv",
                "c",
                &["x", "w"],
                &["y"],
                vec![
                    ("auto_pad", A::S("SAME_UPPER")),
                    ("strides", A::Is(vec![1, stride])),
                ],
            )],
            vec![init("w", &[2, 2, 1, 3])],
            &["y"],
        )
    };
    assert_eq!(
        import_err(&m(i64::MAX)),
        "model.onnx: node \"c\" (Conv, opset 17): strides must be at most 536870912, found [1, 9223372036854775807]"
    );
    let c = only_conv(&import(&m(1 << 29)));
    assert_eq!(c.strides, [1, 1 << 29]);
    assert_eq!([c.pads.left, c.pads.right], [0, 0]);
}

#[test]
fn add_of_different_shapes_is_an_error() {
    let m = model(
        17,
        vec![x4("x", 2, 6, 6), x4("z", 2, 6, 1)],
        vec![node("Add", "a", &["x", "z"], &["y"], vec![])],
        vec![],
        &["y"],
    );
    assert_eq!(
        import_err(&m),
        "model.onnx: node \"a\" (Add, opset 17): the operands have shapes [1, 2, 6, 6] and [1, 2, 6, 1]: only equal shapes are supported (no broadcasting)"
    );
}

/// An input past an op's last is refused: ignored, `Add(x, x, x)` computed `2 x`.
#[test]
fn an_input_past_the_ops_last_is_an_error() {
    let m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![
            node("Add", "a", &["x", "x", "x"], &["s"], vec![]),
            node("Relu", "r", &["s", "x"], &["y"], vec![]),
        ],
        vec![],
        &["y"],
    );
    assert_eq!(
        import_err(&m),
        "model.onnx: node \"a\" (Add, opset 17): 3 inputs, but Add takes at most 2"
    );
    let m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![node("Relu", "r", &["x", "x"], &["y"], vec![])],
        vec![],
        &["y"],
    );
    assert_eq!(
        import_err(&m),
        "model.onnx: node \"r\" (Relu, opset 17): 2 inputs, but Relu takes at most 1"
    );
}

/// A value defined twice, or two initializers of one name, is an invalid model: the second
/// would silently replace the first for every later reader.
#[test]
fn a_value_or_initializer_defined_twice_is_an_error() {
    let m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![
            node("Relu", "r", &["x"], &["y"], vec![]),
            node("Relu", "again", &["x"], &["y"], vec![]),
        ],
        vec![],
        &["y"],
    );
    assert_eq!(
        import_err(&m),
        "model.onnx: node \"again\" (Relu, opset 17): output \"y\" is already defined: a value is defined once"
    );
    let m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![node("Conv", "c", &["x", "w"], &["y"], vec![])],
        vec![init("w", &[2, 2, 3, 3]), init("w", &[2, 2, 1, 1])],
        &["y"],
    );
    assert_eq!(
        import_err(&m),
        "model.onnx: initializer \"w\": is given twice: an initializer's name must be unique"
    );
}

#[test]
fn model_level_errors() {
    let ok = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![],
        &["y"],
    );
    let mut no_opset = ok.clone();
    no_opset.opset_import.clear();
    assert_eq!(
        import_err(&no_opset),
        "model.onnx: model: the model imports no version of the default (ai.onnx) opset"
    );
    let mut no_graph = ok.clone();
    no_graph.graph = None;
    assert_eq!(
        import_err(&no_graph),
        "model.onnx: model: the model has no graph"
    );
    let mut int_input = ok.clone();
    int_input.graph.as_mut().unwrap().input = vec![info(
        "x",
        data_type::INT64,
        vec![D::N(1), D::N(2), D::N(3), D::N(3)],
    )];
    assert_eq!(
        import_err(&int_input),
        "model.onnx: input \"x\": has element type int64: only float inputs are supported"
    );
    let mut rank2 = ok.clone();
    rank2.graph.as_mut().unwrap().input = vec![info("x", data_type::FLOAT, vec![D::N(1), D::N(2)])];
    assert_eq!(
        import_err(&rank2),
        "model.onnx: input \"x\": has rank 2: only rank-4 (NCHW) inputs are supported"
    );
    let mut const_out = ok.clone();
    let g = const_out.graph.as_mut().unwrap();
    g.initializer.push(init("k", &[1]));
    g.output.push(ValueInfoProto {
        name: "k".into(),
        r#type: None,
    });
    assert_eq!(
        import_err(&const_out),
        "model.onnx: output \"k\": is a constant: only computed outputs are supported"
    );
    let mut bad_init = ok.clone();
    bad_init
        .graph
        .as_mut()
        .unwrap()
        .initializer
        .push(TensorProto {
            name: "bad".into(),
            dims: vec![3],
            data_type: data_type::FLOAT,
            float_data: vec![1.0],
            ..Default::default()
        });
    assert_eq!(
        import_err(&bad_init),
        "model.onnx: initializer \"bad\": dims [3] need 3 elements but the tensor holds 1 floats"
    );
    let mut huge = ok.clone();
    huge.graph.as_mut().unwrap().input = vec![info(
        "x",
        data_type::FLOAT,
        vec![D::N(1 << 20), D::N(1 << 20), D::N(1), D::N(1)],
    )];
    assert_eq!(
        import_err(&huge),
        "model.onnx: input \"x\": has more than 2147483648 elements"
    );
    let mut undefined_out = ok;
    undefined_out.graph.as_mut().unwrap().output[0].name = "nope".into();
    assert_eq!(
        import_err(&undefined_out),
        "model.onnx: output \"nope\": is not defined by any node or input"
    );
    // The I/O error is the source, not part of the message too, so that a chain of causes
    // (anyhow's `{:#}`) prints it once.
    let e = import_file(std::path::Path::new("/nonexistent/model.onnx")).unwrap_err();
    let OnnxError::Read { source, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
    assert_eq!(e.to_string(), "cannot read `/nonexistent/model.onnx`");
    assert_eq!(
        std::error::Error::source(&e).map(|s| s.to_string()),
        Some(source.to_string())
    );
}

#[test]
fn malformed_and_truncated_protobuf_is_an_error_never_a_panic() {
    let e = import_bytes(b"\xff\xff\xff\xff", "junk.onnx", None).unwrap_err();
    let OnnxError::Decode { error, .. } = &e else {
        panic!("{e}")
    };
    // The decoder's reason is in the message, once: it is not also the source.
    assert_eq!(
        e.to_string(),
        format!("junk.onnx: not a valid ONNX model: {error}")
    );
    assert!(std::error::Error::source(&e).is_none());
    let m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![
            node(
                "Conv",
                "c",
                &["x", "w", "b"],
                &["c"],
                vec![("pads", A::Is(vec![1, 1, 1, 1]))],
            ),
            node("Relu", "r", &["c"], &["y"], vec![]),
        ],
        vec![init("w", &[2, 2, 3, 3]), init("b", &[2])],
        &["y"],
    );
    let bytes = m.encode_to_vec();
    let mut decode_errors = 0;
    for len in 0..bytes.len() {
        // Every prefix is either a decode error or some (smaller) model; none panics.
        if let Err(OnnxError::Decode { .. }) = import_bytes(&bytes[..len], "t.onnx", None) {
            decode_errors += 1;
        }
    }
    assert!(
        decode_errors > bytes.len() / 2,
        "{decode_errors} of {}",
        bytes.len()
    );
    // Flipped bytes likewise.
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x5a;
        let _ = import_bytes(&b, "t.onnx", None);
    }
    // The decoded model imports through the same entry point.
    let decoded = ModelProto::decode(bytes.as_slice()).unwrap();
    assert!(import_model(&decoded, "t.onnx", None).is_ok());
}

#[test]
fn imported_pool_kinds_are_onnx_ones() {
    let m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![node(
            "MaxPool",
            "mp",
            &["x"],
            &["y"],
            vec![("kernel_shape", A::Is(vec![2, 2]))],
        )],
        vec![],
        &["y"],
    );
    match ops(&import(&m)).as_slice() {
        [Op::Pool2d(p)] => assert_eq!(p.kind, PoolKind::Max),
        other => panic!("{other:?}"),
    }
}

// ---- audit: files, opsets, names, external data -------------------------------------------

/// A fresh directory under the system's temporary one, removed by the caller.
fn scratch_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("primjit-onnx-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mkfifo(path: &std::path::Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
}

/// A model path that is a directory, a device (through a symlink too) or a FIFO is refused
/// before it is read: `/dev/zero` was read without end, a FIFO blocked.
#[test]
fn a_model_that_is_not_a_regular_file_is_refused_naming_what_it_is() {
    let dir = scratch_dir("irregular");
    let zero = dir.join("zero.onnx");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let folder = dir.join("folder.onnx");
    std::fs::create_dir(&folder).unwrap();
    let fifo = dir.join("fifo.onnx");
    mkfifo(&fifo);
    for (path, what) in [
        (std::path::PathBuf::from("/dev/zero"), "a character device"),
        (zero, "a character device"),
        (folder, "a directory"),
        (fifo, "a FIFO"),
    ] {
        let e = import_file(&path).unwrap_err();
        let OnnxError::Read { source, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(e.to_string(), format!("cannot read `{}`", path.display()));
        assert_eq!(
            source.to_string(),
            format!("it is {what}, not a regular file")
        );
        assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The default opset is held to the versions the importer knows: onnxruntime refuses the
/// others, and an op's meaning in them is not the one imported.
#[test]
fn a_default_opset_outside_7_to_27_is_an_error() {
    let relu = |opset| {
        model(
            opset,
            vec![x4("x", 2, 6, 6)],
            vec![node("Relu", "r", &["x"], &["y"], vec![])],
            vec![],
            &["y"],
        )
    };
    assert_eq!((primjit_onnx::MIN_OPSET, primjit_onnx::MAX_OPSET), (7, 27));
    for opset in [3, 6, 28, 99] {
        assert_eq!(
            import_err(&relu(opset)),
            format!(
                "model.onnx: model: the model imports ai.onnx opset {opset}, but primjit imports opsets 7 to 27"
            )
        );
    }
    for opset in [7, 21, 22, 27] {
        assert_eq!(import(&relu(opset)).opset, opset);
    }
}

/// Attributes and inputs that the model's opset does not define are refused, at the node:
/// the model is invalid (onnxruntime refuses it) and the value read would mean nothing.
#[test]
fn attributes_and_inputs_of_other_opsets_are_errors() {
    let scalar = |name: &str, v: f32| TensorProto {
        name: name.into(),
        data_type: data_type::FLOAT,
        float_data: vec![v],
        ..Default::default()
    };
    let axes = TensorProto {
        name: "axes".into(),
        dims: vec![2],
        data_type: data_type::INT64,
        int64_data: vec![2, 3],
        ..Default::default()
    };
    let one = |opset: i64, n: NodeProto, inits: Vec<TensorProto>| {
        import_err(&model(
            opset,
            vec![x4("x", 2, 6, 6)],
            vec![n],
            inits,
            &["y"],
        ))
    };
    let kernel = || ("kernel_shape", A::Is(vec![2, 2]));
    let bn_inits = || {
        vec![
            init("s", &[2]),
            init("b", &[2]),
            init("m", &[2]),
            init("v", &[2]),
        ]
    };
    let bn = |attrs| {
        node(
            "BatchNormalization",
            "bn",
            &["x", "s", "b", "m", "v"],
            &["y"],
            attrs,
        )
    };
    let cases: Vec<(String, &str)> = vec![
        (
            one(
                17,
                node(
                    "AveragePool",
                    "ap",
                    &["x"],
                    &["y"],
                    vec![kernel(), ("dilations", A::Is(vec![2, 2]))],
                ),
                vec![],
            ),
            "node \"ap\" (AveragePool, opset 17): attribute dilations is only defined from opset 19 on",
        ),
        (
            one(
                9,
                node(
                    "MaxPool",
                    "mp",
                    &["x"],
                    &["y"],
                    vec![kernel(), ("ceil_mode", A::I(1))],
                ),
                vec![],
            ),
            "node \"mp\" (MaxPool, opset 9): attribute ceil_mode is only defined from opset 10 on",
        ),
        (
            one(
                7,
                node(
                    "MaxPool",
                    "mp",
                    &["x"],
                    &["y"],
                    vec![kernel(), ("storage_order", A::I(0))],
                ),
                vec![],
            ),
            "node \"mp\" (MaxPool, opset 7): attribute storage_order is only defined from opset 8 on",
        ),
        (
            one(9, bn(vec![("spatial", A::I(1))]), bn_inits()),
            "node \"bn\" (BatchNormalization, opset 9): attribute spatial was removed in opset 9",
        ),
        (
            one(13, bn(vec![("training_mode", A::I(0))]), bn_inits()),
            "node \"bn\" (BatchNormalization, opset 13): attribute training_mode is only defined from opset 14 on",
        ),
        (
            one(7, bn(vec![("is_test", A::I(1))]), bn_inits()),
            "node \"bn\" (BatchNormalization, opset 7): attribute is_test was removed in opset 7",
        ),
        (
            one(
                11,
                node("Dropout", "d", &["x"], &["y"], vec![("seed", A::I(3))]),
                vec![],
            ),
            "node \"d\" (Dropout, opset 11): attribute seed is only defined from opset 12 on",
        ),
        (
            one(
                12,
                node("Dropout", "d", &["x"], &["y"], vec![("ratio", A::F(0.5))]),
                vec![],
            ),
            "node \"d\" (Dropout, opset 12): attribute ratio was removed in opset 12",
        ),
        (
            one(
                11,
                node("Dropout", "d", &["x", "r"], &["y"], vec![]),
                vec![scalar("r", 0.5)],
            ),
            "node \"d\" (Dropout, opset 11): 2 inputs, but Dropout takes at most 1 before opset 12",
        ),
        (
            one(
                10,
                node("Clip", "c", &["x", "lo"], &["y"], vec![]),
                vec![scalar("lo", 0.0)],
            ),
            "node \"c\" (Clip, opset 10): 2 inputs, but Clip takes at most 1 before opset 11",
        ),
        (
            one(
                11,
                node("Clip", "c", &["x"], &["y"], vec![("min", A::F(0.0))]),
                vec![],
            ),
            "node \"c\" (Clip, opset 11): attribute min was removed in opset 11",
        ),
        (
            one(
                13,
                node(
                    "Squeeze",
                    "s",
                    &["x"],
                    &["y"],
                    vec![("axes", A::Is(vec![2, 3]))],
                ),
                vec![],
            ),
            "node \"s\" (Squeeze, opset 13): attribute axes was removed in opset 13",
        ),
        (
            one(
                11,
                node("Squeeze", "s", &["x", "axes"], &["y"], vec![]),
                vec![axes],
            ),
            "node \"s\" (Squeeze, opset 11): 2 inputs, but Squeeze takes at most 1 before opset 13",
        ),
        (
            one(
                10,
                node(
                    "Squeeze",
                    "s",
                    &["x"],
                    &["y"],
                    vec![("axes", A::Is(vec![-2, -1]))],
                ),
                vec![],
            ),
            "node \"s\" (Squeeze, opset 10): attribute axes has -2: negative axes are only defined from opset 11 on",
        ),
        (
            one(
                10,
                node("Flatten", "f", &["x"], &["y"], vec![("axis", A::I(-3))]),
                vec![],
            ),
            "node \"f\" (Flatten, opset 10): attribute axis is -3: negative axes are only defined from opset 11 on",
        ),
        (
            one(
                13,
                node(
                    "Reshape",
                    "r",
                    &["x", "shape"],
                    &["y"],
                    vec![("allowzero", A::I(0))],
                ),
                vec![TensorProto {
                    name: "shape".into(),
                    dims: vec![2],
                    data_type: data_type::INT64,
                    int64_data: vec![1, -1],
                    ..Default::default()
                }],
            ),
            "node \"r\" (Reshape, opset 13): attribute allowzero is only defined from opset 14 on",
        ),
        (
            one(
                7,
                node(
                    "Gemm",
                    "g",
                    &["x", "w"],
                    &["y"],
                    vec![("broadcast", A::I(1))],
                ),
                vec![init("w", &[2, 2])],
            ),
            "node \"g\" (Gemm, opset 7): attribute broadcast was removed in opset 7",
        ),
        (
            one(
                11,
                node(
                    "Constant",
                    "k",
                    &[],
                    &["y"],
                    vec![("value_float", A::F(1.0))],
                ),
                vec![],
            ),
            "node \"k\" (Constant, opset 11): attribute value_float is only defined from opset 12 on",
        ),
    ];
    for (e, want) in cases {
        assert_eq!(e, format!("model.onnx: {want}"));
    }
    // At the opsets that define them, the same attributes import.
    let ap = model(
        19,
        vec![x4("x", 2, 6, 6)],
        vec![node(
            "AveragePool",
            "ap",
            &["x"],
            &["y"],
            vec![kernel(), ("dilations", A::Is(vec![2, 2]))],
        )],
        vec![],
        &["y"],
    );
    import(&ap);
    let mp = model(
        10,
        vec![x4("x", 2, 6, 6)],
        vec![node(
            "MaxPool",
            "mp",
            &["x"],
            &["y"],
            vec![kernel(), ("ceil_mode", A::I(1))],
        )],
        vec![],
        &["y"],
    );
    import(&mp);
}

/// Node names, when given, are unique (onnxruntime refuses a model with two nodes of one
/// name); the second node of a name is reported, with both indices.
#[test]
fn a_node_name_used_twice_is_an_error_at_the_second_node() {
    let m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![
            node("Relu", "r", &["x"], &["a"], vec![]),
            node("Relu", "", &["a"], &["b"], vec![]),
            node("Relu", "", &["b"], &["c"], vec![]),
            node("Add", "r", &["a", "c"], &["y"], vec![]),
        ],
        vec![],
        &["y"],
    );
    assert_eq!(
        import_err(&m),
        "model.onnx: node \"r\" (Add, opset 17): node #3 has the name of node #0 (Relu): node names must be unique"
    );
    // Unnamed nodes (two above) are not duplicates of each other.
    let mut unnamed = m.clone();
    unnamed.graph.as_mut().unwrap().node[3].name = "sum".into();
    import(&unnamed);
}

/// A node of another domain is located by that domain's version, not the default opset's.
#[test]
fn a_node_of_another_domain_names_its_domain_and_version() {
    let mut m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![NodeProto {
            domain: "com.microsoft".into(),
            ..node("FusedConv", "fc", &["x"], &["y"], vec![])
        }],
        vec![],
        &["y"],
    );
    m.opset_import.push(OperatorSetIdProto {
        domain: "com.microsoft".into(),
        version: 1,
    });
    assert_eq!(
        import_err(&m),
        "model.onnx: node \"fc\" (com.microsoft.FusedConv, com.microsoft opset 1): unsupported op: only ops of the default (ai.onnx) domain are supported"
    );
    m.opset_import.pop();
    assert_eq!(
        import_err(&m),
        "model.onnx: node \"fc\" (com.microsoft.FusedConv): unsupported op of the domain com.microsoft, which the model does not import: only ops of the default (ai.onnx) domain are supported"
    );
}

/// External data that leaves the model's folder through a symlink is refused like a `..`;
/// a symlink within the folder is followed; a FIFO is not opened; the bounds are stated
/// with the numbers they have.
#[test]
fn external_data_stays_in_the_models_folder_and_reports_its_bounds() {
    let dir = scratch_dir("ext-audit");
    let folder = dir.join("model");
    std::fs::create_dir(&folder).unwrap();
    let floats: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let bytes: Vec<u8> = floats.iter().flat_map(|f| f.to_le_bytes()).collect();
    std::fs::write(dir.join("outside.bin"), &bytes).unwrap();
    std::fs::write(folder.join("inside.bin"), &bytes).unwrap();
    std::os::unix::fs::symlink("../outside.bin", folder.join("out.bin")).unwrap();
    std::os::unix::fs::symlink("inside.bin", folder.join("alias.bin")).unwrap();
    mkfifo(&folder.join("fifo.bin"));
    let external = |entries: &[(&str, &str)]| {
        model(
            17,
            vec![x4("x", 3, 2, 2)],
            vec![node("Conv", "c", &["x", "w"], &["y"], vec![])],
            vec![TensorProto {
                name: "w".into(),
                dims: vec![4, 3, 1, 1],
                data_type: data_type::FLOAT,
                data_location: data_location::EXTERNAL,
                external_data: entries
                    .iter()
                    .map(|(k, v)| StringStringEntryProto {
                        key: k.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
                ..Default::default()
            }],
            &["y"],
        )
    };
    let path = folder.join("m.onnx");
    let import_at = |m: ModelProto| {
        std::fs::write(&path, m.encode_to_vec()).unwrap();
        import_file(&path)
    };
    let alias = import_at(external(&[("location", "alias.bin")])).unwrap();
    assert_eq!(alias.params.get("w").unwrap().data, floats);

    let e = import_at(external(&[("location", "out.bin")]))
        .unwrap_err()
        .to_string();
    let resolved = std::fs::canonicalize(dir.join("outside.bin")).unwrap();
    let resolved_folder = std::fs::canonicalize(&folder).unwrap();
    assert_eq!(
        e,
        format!(
            "{}: initializer \"w\": external data location \"out.bin\" leads to `{}` through a symlink, outside the model's folder `{}`",
            path.display(),
            resolved.display(),
            resolved_folder.display()
        )
    );
    let e = import_at(external(&[("location", "fifo.bin")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("fifo.bin`: it is a FIFO, not a regular file"),
        "{e}"
    );
    // Without a length, the bound is the offset alone (the message had `plus length ?`).
    let e = import_at(external(&[("location", "inside.bin"), ("offset", "60")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("inside.bin` holds 48 bytes, fewer than offset 60"),
        "{e}"
    );
    let e = import_at(external(&[
        ("location", "inside.bin"),
        ("offset", "99999999999999999999"),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        e.ends_with(
            "external data offset=\"99999999999999999999\" is too large: at most 18446744073709551615"
        ),
        "{e}"
    );
    let e = import_at(external(&[("location", "inside.bin"), ("length", "forty")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("external data length=\"forty\" is not a number"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stride over the kernels' bound is refused at the ONNX node, by the IR's verification.
#[test]
fn a_stride_over_the_kernels_bound_is_an_error_at_the_node() {
    let conv = |stride: i64| {
        model(
            17,
            vec![x4("x", 2, 6, 6)],
            vec![node(
                "Conv",
                "c",
                &["x", "w"],
                &["y"],
                vec![("strides", A::Is(vec![stride, 1]))],
            )],
            vec![init("w", &[2, 2, 1, 1])],
            &["y"],
        )
    };
    assert_eq!(
        import_err(&conv(1 << 29 | 1)),
        "model.onnx: node \"c\" (Conv, opset 17): strides must be at most 536870912, found [536870913, 1]"
    );
    assert_eq!(only_conv(&import(&conv(1 << 29))).strides, [1 << 29, 1]);
}

// ---- issue 55: activations, broadcasting binary ops, reductions, concat -------------------------

#[test]
fn activations_binary_ops_reductions_and_concat_import_with_their_attributes() {
    use primjit_ir::{Activation, BinaryKind};
    let m = model(
        18,
        vec![x4("x", 3, 4, 5)],
        vec![
            node(
                "HardSigmoid",
                "hs",
                &["x"],
                &["a"],
                vec![("alpha", A::F(0.25))],
            ),
            node("LeakyRelu", "lr", &["a"], &["b"], vec![]),
            node("PRelu", "pr", &["b", "slope"], &["c"], vec![]),
            node("PRelu", "pr1", &["c", "one"], &["d"], vec![]),
            node("ReduceMean", "rm", &["d", "axes"], &["p"], vec![]),
            node("Mul", "se", &["p", "d"], &["e"], vec![]),
            node("Sigmoid", "sg", &["e"], &["s"], vec![]),
            node("Mul", "silu", &["s", "e"], &["f"], vec![]),
            node("Sub", "sub", &["f", "p"], &["g"], vec![]),
            node(
                "Concat",
                "cat",
                &["g", "x"],
                &["h"],
                vec![("axis", A::I(-3))],
            ),
            node(
                "ReduceMax",
                "mx",
                &["h", "axes"],
                &["y"],
                vec![("keepdims", A::I(0))],
            ),
        ],
        vec![
            init("slope", &[3, 1, 1]),
            values("one", &[1], vec![0.3]),
            TensorProto {
                name: "axes".into(),
                dims: vec![2],
                data_type: data_type::INT64,
                int64_data: vec![3, 2],
                ..Default::default()
            },
        ],
        &["y"],
    );
    let i = import(&m);
    assert_round_trip(&i);
    let ops = ops(&i);
    let x = i.graph.value_by_name("x").unwrap();
    assert!(matches!(
        ops[0],
        Op::Act { act: Activation::HardSigmoid { alpha, beta }, input } if alpha == 0.25 && beta == 0.5 && input == x
    ));
    assert!(
        matches!(ops[1], Op::Act { act: Activation::LeakyRelu { alpha }, .. } if alpha == 0.01)
    );
    assert!(matches!(ops[2], Op::PRelu { .. }));
    // One slope for every channel is a leaky relu.
    assert!(matches!(ops[3], Op::Act { act: Activation::LeakyRelu { alpha }, .. } if alpha == 0.3));
    assert!(matches!(
        ops[4],
        Op::GlobalPool {
            kind: PoolKind::Avg,
            ..
        }
    ));
    // The broadcast operand comes second, whichever side ONNX has it on.
    let (d, p) = (
        i.graph.value_by_name("d").unwrap(),
        i.graph.value_by_name("p").unwrap(),
    );
    assert_eq!(
        ops[5],
        Op::Binary {
            kind: BinaryKind::Mul,
            lhs: d,
            rhs: p
        }
    );
    // Sigmoid then Mul is one SiLU.
    assert!(matches!(
        ops[6],
        Op::Act {
            act: Activation::Silu,
            ..
        }
    ));
    assert!(matches!(
        ops[7],
        Op::Binary {
            kind: BinaryKind::Sub,
            ..
        }
    ));
    assert!(matches!(&ops[8], Op::Concat { inputs } if inputs.len() == 2));
    assert!(matches!(
        ops[9],
        Op::GlobalPool {
            kind: PoolKind::Max,
            ..
        }
    ));
    assert_eq!(i.flattened_outputs, vec!["y".to_string()]);
    assert_eq!(ops.len(), 10);
}

#[test]
fn constants_along_channels_fold_into_the_conv_before_or_make_a_depthwise_conv() {
    let m = model(
        17,
        vec![x4("x", 2, 4, 4)],
        vec![
            node("Sub", "norm", &["x", "mean"], &["n"], vec![]),
            node("Conv", "conv", &["n", "w"], &["c"], vec![]),
            node("Mul", "scale", &["k", "c"], &["y"], vec![]),
        ],
        vec![
            values("mean", &[1, 2, 1, 1], vec![0.5, -0.25]),
            init("w", &[3, 2, 1, 1]),
            values("k", &[3, 1, 1], vec![2.0, 3.0, 4.0]),
        ],
        &["y"],
    );
    let i = import(&m);
    assert_round_trip(&i);
    let ops = ops(&i);
    assert_eq!(ops.len(), 2, "{}", i.graph);
    let Op::Conv2d(norm) = &ops[0] else { panic!() };
    assert_eq!(norm.groups, 2);
    let shift = &i
        .params
        .get(&i.graph.param(norm.bias.unwrap()).name)
        .unwrap()
        .data;
    assert_eq!(shift, &[-0.5, 0.25]);
    // The Mul scales the conv's weights and bias: no node of its own.
    let Op::Conv2d(conv) = &ops[1] else { panic!() };
    let w = &i.params.get(&i.graph.param(conv.weight).name).unwrap().data;
    let original = init("w", &[3, 2, 1, 1]).float_data;
    for (o, k) in [2.0f32, 3.0, 4.0].iter().enumerate() {
        assert_eq!(w[2 * o], original[2 * o] * k);
    }
}

#[test]
fn the_new_ops_refuse_what_they_cannot_run_listing_every_node() {
    let m = model(
        17,
        vec![x4("x", 4, 6, 6), x4("z", 4, 5, 6)],
        vec![
            node("PRelu", "prelu", &["x", "slope"], &["a"], vec![]),
            node(
                "Concat",
                "cat_h",
                &["x", "z"],
                &["b"],
                vec![("axis", A::I(1))],
            ),
            node(
                "Concat",
                "cat_w",
                &["x", "x"],
                &["c"],
                vec![("axis", A::I(3))],
            ),
            node("Concat", "cat_noaxis", &["x", "x"], &["d"], vec![]),
            node(
                "ReduceMean",
                "mean_c",
                &["x"],
                &["e"],
                vec![("axes", A::Is(vec![1]))],
            ),
            node("ReduceMax", "max_all", &["x"], &["f"], vec![]),
            node("Mul", "mul_hw", &["x", "z"], &["g"], vec![]),
            node("Sub", "sub_left", &["p", "x"], &["h"], vec![]),
            node("GlobalAveragePool", "p", &["x"], &["p"], vec![]),
            node(
                "Elu",
                "elu",
                &["x"],
                &["i"],
                vec![("alpha", A::F(f32::INFINITY))],
            ),
            node("HardSwish", "hswish13", &["x"], &["j"], vec![]),
            node("Mul", "mul_full", &["x", "full"], &["k"], vec![]),
            node("Div", "div_const", &["two", "x"], &["l"], vec![]),
        ],
        vec![
            init("slope", &[3]),
            init("full", &[1, 4, 6, 6]),
            values("two", &[1], vec![2.0]),
        ],
        &["a"],
    );
    let mut m13 = m.clone();
    m13.opset_import[0].version = 13;
    let text = import_err(&m13);
    let expected = [
        "node \"prelu\" (PRelu, opset 13): input 1 (slope) has shape [3]: one slope, or one per channel, is supported",
        "node \"cat_h\" (Concat, opset 13): concat joins channels only: the height of %z (5) differs from that of %x (6)",
        "node \"cat_w\" (Concat, opset 13): attribute axis is 3: only concatenating channels (axis 1) is supported",
        "node \"cat_noaxis\" (Concat, opset 13): attribute axis is missing",
        "node \"mean_c\" (ReduceMean, opset 13): axes [1]: only reducing the height and width (axes 2 and 3) is supported",
        "node \"max_all\" (ReduceMax, opset 13): without axes, the reduction is over every dimension: only reducing the height and width (axes 2 and 3) is supported",
        "node \"mul_hw\" (Mul, opset 13): the operands have shapes [1, 4, 6, 6] and [1, 4, 5, 6]: only equal shapes, or a right operand of [N, C, 1, 1] or [1, C, 1, 1] (or a left one), are supported",
        "node \"sub_left\" (Sub, opset 13): input 0 (A) \"p\" is not defined before its use",
        "node \"elu\" (Elu, opset 13): attribute alpha is inf: it must be a finite number",
        "node \"hswish13\" (HardSwish, opset 13): HardSwish is only defined from opset 14 on",
        "node \"mul_full\" (Mul, opset 13): input 1 is a constant of shape [1, 4, 6, 6]: only a scalar or one value per channel is supported",
        "node \"div_const\" (Div, opset 13): dividing a constant by a computed tensor is not supported",
    ];
    let got: Vec<&str> = text
        .lines()
        .map(|l| l.trim_start_matches("model.onnx: "))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn a_zero_pad_joins_the_pads_of_the_conv_after_it_and_is_refused_elsewhere() {
    let pads = |name: &str, v: Vec<i64>| TensorProto {
        name: name.into(),
        dims: vec![8],
        data_type: data_type::INT64,
        int64_data: v,
        ..Default::default()
    };
    let m = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![
            node("Pad", "pad", &["x", "p"], &["px"], vec![]),
            node(
                "Conv",
                "conv",
                &["px", "w"],
                &["y"],
                vec![("pads", A::Is(vec![1, 0, 0, 0]))],
            ),
        ],
        vec![
            pads("p", vec![0, 0, 1, 2, 0, 0, 3, 4]),
            init("w", &[3, 2, 3, 3]),
        ],
        &["y"],
    );
    let i = import(&m);
    assert_round_trip(&i);
    assert_eq!(
        only_conv(&i).pads,
        Pads {
            top: 2,
            left: 2,
            bottom: 3,
            right: 4
        }
    );
    // A Pad before an auto_pad conv over a symbolic width: at stride 1 the padding is known
    // and joins the Pad's; at stride 2 it follows the width and cannot.
    let padded_auto = |stride: i64| {
        model(
            17,
            vec![info(
                "x",
                data_type::FLOAT,
                vec![D::N(1), D::N(2), D::N(6), D::P("W")],
            )],
            vec![
                node("Pad", "pad", &["x", "p"], &["px"], vec![]),
                node(
                    "Conv",
                    "conv",
                    &["px", "w"],
                    &["y"],
                    vec![
                        ("auto_pad", A::S("SAME_UPPER")),
                        ("strides", A::Is(vec![stride, stride])),
                    ],
                ),
            ],
            vec![
                pads("p", vec![0, 0, 1, 2, 0, 0, 3, 4]),
                init("w", &[3, 2, 3, 3]),
            ],
            &["y"],
        )
    };
    let c = only_conv(&import(&padded_auto(1)));
    assert_eq!(
        (c.auto_pad, c.pads),
        (
            None,
            Pads {
                top: 2,
                left: 3,
                bottom: 4,
                right: 5
            }
        )
    );
    assert_eq!(
        import_err(&padded_auto(2)),
        "model.onnx: node \"conv\" (Conv, opset 17): attribute auto_pad SAME_UPPER with strides [2, 2] after a Pad needs a known input height and width"
    );
    let refused = model(
        17,
        vec![x4("x", 2, 6, 6)],
        vec![
            node(
                "Pad",
                "reflect",
                &["x", "p"],
                &["a"],
                vec![("mode", A::S("reflect"))],
            ),
            node("Pad", "channels", &["x", "q"], &["b"], vec![]),
            node("Pad", "zero", &["x", "p"], &["c"], vec![]),
            node("Relu", "relu", &["c"], &["y"], vec![]),
        ],
        vec![
            pads("p", vec![0, 0, 1, 1, 0, 0, 1, 1]),
            pads("q", vec![0, 1, 0, 0, 0, 0, 0, 0]),
        ],
        &["y"],
    );
    assert_eq!(
        import_err(&refused)
            .lines()
            .map(|l| l.trim_start_matches("model.onnx: "))
            .collect::<Vec<_>>(),
        [
            "node \"reflect\" (Pad, opset 17): attribute mode is reflect: only constant (zero) padding before a Conv is supported",
            "node \"channels\" (Pad, opset 17): pads [0, 1, 0, 0, 0, 0, 0, 0]: only the height and width may be padded",
            "node \"relu\" (Relu, opset 17): input 0 (X) is made by a Pad: a zero Pad is only supported before a Conv, whose pads it joins",
        ]
    );
}

#[test]
fn split_slice_and_the_channel_shuffle_select_channels_and_refuse_other_axes() {
    let i64s = |name: &str, v: Vec<i64>| TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: data_type::INT64,
        int64_data: v,
        ..Default::default()
    };
    let m = model(
        17,
        vec![x4("x", 6, 2, 3)],
        vec![
            node(
                "Split",
                "split",
                &["x", "sizes"],
                &["a", "b"],
                vec![("axis", A::I(1))],
            ),
            node("Slice", "slice", &["b", "st", "en", "ax"], &["c"], vec![]),
            node("Reshape", "view", &["x", "s1"], &["v"], vec![]),
            node(
                "Transpose",
                "t",
                &["v"],
                &["tv"],
                vec![("perm", A::Is(vec![0, 2, 1, 3, 4]))],
            ),
            node("Reshape", "back", &["tv", "s2"], &["y"], vec![]),
        ],
        vec![
            i64s("sizes", vec![2, 4]),
            i64s("st", vec![-3]),
            i64s("en", vec![i64::MAX]),
            i64s("ax", vec![-3]),
            i64s("s1", vec![1, 3, 2, 2, -1]),
            i64s("s2", vec![0, 6, 2, 3]),
        ],
        &["a", "c", "y"],
    );
    let i = import(&m);
    assert_round_trip(&i);
    let selects: Vec<Vec<usize>> = ops(&i)
        .into_iter()
        .map(|op| match op {
            Op::SelectChannels { select, .. } => select,
            other => panic!("{other:?}"),
        })
        .collect();
    // Split [2, 4]; channels -3.. of the second part; the shuffle of 3 groups of 2.
    assert_eq!(
        selects,
        [
            vec![0, 1],
            vec![2, 3, 4, 5],
            vec![1, 2, 3],
            vec![0, 2, 4, 1, 3, 5]
        ]
    );
    let refused = model(
        17,
        vec![x4("x", 6, 2, 3)],
        vec![
            node(
                "Split",
                "split_h",
                &["x"],
                &["a", "b"],
                vec![("axis", A::I(2))],
            ),
            node(
                "Slice",
                "slice_step",
                &["x", "st", "en", "ax", "two"],
                &["c"],
                vec![],
            ),
            node(
                "Transpose",
                "t",
                &["x"],
                &["y"],
                vec![("perm", A::Is(vec![0, 1, 3, 2]))],
            ),
        ],
        vec![
            i64s("st", vec![0]),
            i64s("en", vec![4]),
            i64s("ax", vec![1]),
            i64s("two", vec![2]),
        ],
        &["y"],
    );
    assert_eq!(
        import_err(&refused)
            .lines()
            .map(|l| l.trim_start_matches("model.onnx: "))
            .collect::<Vec<_>>(),
        [
            "node \"split_h\" (Split, opset 17): attribute axis is 2: only splitting channels (axis 1) is supported",
            "node \"slice_step\" (Slice, opset 17): only a step of 1 is supported",
            "node \"t\" (Transpose, opset 17): only the Transpose of a channel shuffle ([N, g, C / g, H, W] with perm [0, 2, 1, 3, 4]) is supported",
        ]
    );
}

/// `torch.chunk(x, 2, dim=1)` as torch exports it (shufflenet_v2's blocks): the chunk size
/// `(C + 1) / 2` computed from `Shape` with `Gather`, `Add` and `Div`, the `Slice` bounds
/// `size * 1` and `size * 2` with `Mul`; folded over the known channel count, 5 here, into
/// channels [0, 3) and [3, 5). A symbolic extent in a Slice's bounds, a zero divisor,
/// operands of other lengths and a shape cast to float (whose `Div` would not truncate) are
/// refused, each at its node (`H * 2` is an extent now, see below); cast back to an integer
/// type, it folds again.
#[test]
fn shape_arithmetic_over_known_extents_folds_into_slice_bounds() {
    let chunk = |c: i64| {
        model(
            17,
            vec![x4("x", c, 2, 3)],
            vec![
                node("Shape", "shape", &["x"], &["s"], vec![]),
                node(
                    "Gather",
                    "gather",
                    &["s", "one"],
                    &["c"],
                    vec![("axis", A::I(0))],
                ),
                node("Add", "add", &["c", "one"], &["c1"], vec![]),
                node("Div", "div", &["c1", "two"], &["size"], vec![]),
                node("Mul", "mul1", &["size", "one"], &["end0"], vec![]),
                node("Mul", "mul2", &["size", "two"], &["end1"], vec![]),
                node(
                    "Slice",
                    "first",
                    &["x", "zero", "end0", "one"],
                    &["a"],
                    vec![],
                ),
                node(
                    "Slice",
                    "second",
                    &["x", "end0", "end1", "one"],
                    &["b"],
                    vec![],
                ),
                node("Sub", "sub", &["end1", "end0"], &["d"], vec![]),
                node("Slice", "third", &["x", "d", "end1", "one"], &["e"], vec![]),
            ],
            vec![
                ints_init("zero", &[1], vec![0]),
                ints_init("one", &[1], vec![1]),
                ints_init("two", &[1], vec![2]),
            ],
            &["a", "b", "e"],
        )
    };
    let selects = |c: i64| -> Vec<Vec<usize>> {
        let i = import(&chunk(c));
        assert_round_trip(&i);
        ops(&i)
            .into_iter()
            .map(|op| match op {
                Op::SelectChannels { select, .. } => select,
                other => panic!("{other:?}"),
            })
            .collect()
    };
    // C = 5: size 3, the slices [0, 3), [3, 6) clamped to [3, 5), and [6 - 3, 6) likewise.
    assert_eq!(selects(5), [vec![0, 1, 2], vec![3, 4], vec![3, 4]]);
    assert_eq!(selects(6), [vec![0, 1, 2], vec![3, 4, 5], vec![3, 4, 5]]);

    let refused = model(
        17,
        vec![xsym("x", 4)],
        vec![
            node("Shape", "shape", &["x"], &["s"], vec![]),
            node(
                "Gather",
                "gather_h",
                &["s", "two"],
                &["h"],
                vec![("axis", A::I(0))],
            ),
            node("Mul", "twice_h", &["h", "two"], &["h2"], vec![]),
            node(
                "Gather",
                "gather_c",
                &["s", "one"],
                &["c"],
                vec![("axis", A::I(0))],
            ),
            node("Div", "by_zero", &["c", "zero"], &["q"], vec![]),
            node(
                "Gather",
                "gather_nc",
                &["s", "n_c"],
                &["nc"],
                vec![("axis", A::I(0))],
            ),
            node("Add", "lengths", &["nc", "three"], &["r"], vec![]),
            node("Cast", "to_float", &["nc"], &["ncf"], vec![("to", A::I(1))]),
            node(
                "Gather",
                "gather_f",
                &["ncf", "one"],
                &["cf"],
                vec![("axis", A::I(0))],
            ),
            node("Div", "float_div", &["cf", "two"], &["half"], vec![]),
            node("Cast", "to_int", &["ncf"], &["nci"], vec![("to", A::I(7))]),
            node("Div", "int_div", &["nci", "two"], &["halves"], vec![]),
            node("Slice", "slice", &["x", "zero", "h", "one"], &["y"], vec![]),
        ],
        vec![
            ints_init("zero", &[1], vec![0]),
            ints_init("one", &[1], vec![1]),
            ints_init("two", &[1], vec![2]),
            ints_init("n_c", &[2], vec![0, 1]),
            ints_init("three", &[3], vec![1, 2, 3]),
        ],
        &["y"],
    );
    assert_eq!(
        import_err(&refused)
            .lines()
            .map(|l| l.trim_start_matches("model.onnx: "))
            .collect::<Vec<_>>(),
        [
            "node \"by_zero\" (Div, opset 17): 4 / 0: division by zero",
            "node \"lengths\" (Add, opset 17): the operands have 2 and 3 elements: they must have as many, or one of them one",
            "node \"float_div\" (Div, opset 17): an operand is a shape cast to a floating-point type: only integer arithmetic on shapes is supported",
            "node \"slice\" (Slice, opset 17): input 2 (ends) is computed from the symbolic dimension H: only shape arithmetic over known extents is supported",
        ]
    );
}

fn ints_init(name: &str, dims: &[i64], v: Vec<i64>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::INT64,
        int64_data: v,
        ..Default::default()
    }
}

fn xsym(name: &str, c: i64) -> ValueInfoProto {
    info(
        name,
        data_type::FLOAT,
        vec![D::N(1), D::N(c), D::P("H"), D::P("W")],
    )
}

/// Resize by whole scales, to constant sizes and to sizes computed from the shapes of the
/// input (`Shape`, `Slice`, `Gather`, `Unsqueeze`, `Concat`, `Cast`) at symbolic H and W, and
/// `Resize` of opset 10 and `Upsample` with their asymmetric coordinates.
#[test]
fn resize_imports_scales_sizes_and_sizes_from_shapes() {
    let resize = |name: &str, inputs: &[&str], out: &str, attrs: Vec<(&str, A)>| {
        node("Resize", name, inputs, &[out], attrs)
    };
    let m = model(
        13,
        vec![xsym("x", 4)],
        vec![
            node(
                "Conv",
                "down",
                &["x", "w"],
                &["c"],
                vec![("strides", A::Is(vec![2, 2]))],
            ),
            resize(
                "up",
                &["c", "", "scales"],
                "a",
                vec![
                    ("coordinate_transformation_mode", A::S("asymmetric")),
                    ("nearest_mode", A::S("floor")),
                ],
            ),
            node("Shape", "shape_x", &["x"], &["sx"], vec![]),
            node("Slice", "hw", &["sx", "m2", "big"], &["hw"], vec![]),
            node("Shape", "shape_c", &["c"], &["sc"], vec![]),
            node(
                "Gather",
                "n",
                &["sc", "zero"],
                &["n0"],
                vec![("axis", A::I(0))],
            ),
            node("Unsqueeze", "n_vec", &["n0", "axes0"], &["n1"], vec![]),
            node("Gather", "c_of", &["sc", "one"], &["c1"], vec![]),
            node(
                "Concat",
                "nc",
                &["n1", "c1"],
                &["nc"],
                vec![("axis", A::I(0))],
            ),
            node(
                "Concat",
                "sizes",
                &["nc", "hw"],
                &["s"],
                vec![("axis", A::I(0))],
            ),
            node("Cast", "cast", &["s"], &["s64"], vec![("to", A::I(7))]),
            resize(
                "back",
                &["c", "", "", "s64"],
                "b",
                vec![("mode", A::S("linear"))],
            ),
            resize("fixed", &["c", "", "", "fixed_sizes"], "d", vec![]),
        ],
        vec![
            init("w", &[4, 4, 1, 1]),
            values("scales", &[4], vec![1.0, 1.0, 2.0, 3.0]),
            ints_init("m2", &[1], vec![-2]),
            ints_init("big", &[1], vec![i64::MAX]),
            ints_init("zero", &[], vec![0]),
            ints_init("axes0", &[1], vec![0]),
            ints_init("one", &[1], vec![1]),
            ints_init("fixed_sizes", &[4], vec![1, 4, 5, 7]),
        ],
        &["a", "b", "d"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert_eq!(i.graph.symbols(), ["H", "W"]);
    let x = i.graph.inputs()[0].value;
    let resizes: Vec<primjit_ir::Resize> = ops(&i)
        .into_iter()
        .filter_map(|op| match op {
            Op::Resize(r) => Some(r),
            _ => None,
        })
        .collect();
    use primjit_ir::{CoordMode, NearestMode, ResizeMode, ResizeSize, ScaleFactor};
    let modes: Vec<_> = resizes.iter().map(|r| (r.mode, r.coord, r.size)).collect();
    assert_eq!(
        modes,
        [
            (
                ResizeMode::Nearest(NearestMode::Floor),
                CoordMode::Asymmetric,
                ResizeSize::Scale([ScaleFactor::whole(2), ScaleFactor::whole(3)])
            ),
            (
                ResizeMode::Linear,
                CoordMode::HalfPixel,
                ResizeSize::Like(x)
            ),
            (
                ResizeMode::Nearest(NearestMode::RoundPreferFloor),
                CoordMode::HalfPixel,
                ResizeSize::Sizes([5, 7])
            ),
        ],
        "{text}"
    );
    let shapes = i.graph.verify().unwrap();
    let out = |k: usize| shapes.get(i.graph.outputs()[k].1).unwrap().to_vec();
    assert_eq!(out(1)[2..], [Dim::Sym("H".into()), Dim::Sym("W".into())]);
    assert_eq!(out(0)[2].to_string(), "((H - 1) / 2 + 1) * 2");

    // Before opset 11, coordinates are asymmetric and nearest pixels rounded down.
    for (opset, op, inputs, attrs) in [
        (10, "Resize", vec!["x", "scales"], vec![]),
        (
            9,
            "Upsample",
            vec!["x", "scales"],
            vec![("mode", A::S("linear"))],
        ),
        (7, "Upsample", vec!["x"], vec![]),
    ] {
        let mut n = node(op, "r", &inputs, &["y"], attrs);
        if opset == 7 {
            // An attribute, a list of floats, in opset 7.
            n.attribute.push(AttributeProto {
                name: "scales".into(),
                r#type: attribute_type::FLOATS,
                floats: vec![1.0, 1.0, 2.0, 2.0],
                ..Default::default()
            });
        }
        let m = model(
            opset,
            vec![xsym("x", 4)],
            vec![n],
            vec![values("scales", &[4], vec![1.0, 1.0, 2.0, 2.0])],
            &["y"],
        );
        let i = import(&m);
        assert_round_trip(&i);
        match ops(&i).as_slice() {
            [Op::Resize(r)] => {
                assert_eq!(r.coord, CoordMode::Asymmetric, "{op} {opset}");
                let twice = ScaleFactor::whole(2);
                assert_eq!(r.size, ResizeSize::Scale([twice, twice]), "{op} {opset}");
                let linear = op == "Upsample" && opset == 9;
                assert_eq!(
                    r.mode,
                    if linear {
                        ResizeMode::Linear
                    } else {
                        ResizeMode::Nearest(NearestMode::Floor)
                    }
                );
            }
            other => panic!("{op} {opset}: {other:?}"),
        }
    }
}

/// Fractional scales of the form n / 2^k import as exact factors, over symbols too; opset 10
/// takes them only at least 1 (onnxruntime rounds its nearest pixels otherwise).
#[test]
fn resize_imports_fractional_scales() {
    use primjit_ir::{ResizeSize, ScaleFactor};
    let m = model(
        17,
        vec![xsym("x", 4)],
        vec![node("Resize", "r", &["x", "", "scales"], &["y"], vec![])],
        vec![values("scales", &[4], vec![1.0, 1.0, 1.5, 0.25])],
        &["y"],
    );
    let i = import(&m);
    assert_round_trip(&i);
    let ops = ops(&i);
    let [Op::Resize(r)] = ops.as_slice() else {
        panic!("{ops:?}");
    };
    let factors = [
        ScaleFactor::new(3, 2).unwrap(),
        ScaleFactor::new(1, 4).unwrap(),
    ];
    assert_eq!(r.size, ResizeSize::Scale(factors));
    let shapes = i.graph.verify().unwrap();
    let out = shapes.get(i.graph.outputs()[0].1).unwrap().to_vec();
    assert_eq!(out[2].to_string(), "H * 3 / 2");
    assert_eq!(out[3].to_string(), "W / 4");

    for (scale, ok) in [(1.5, true), (0.5, false)] {
        let m = model(
            10,
            vec![xsym("x", 4)],
            vec![node("Resize", "r", &["x", "scales"], &["y"], vec![])],
            vec![values("scales", &[4], vec![1.0, 1.0, scale, 2.0])],
            &["y"],
        );
        if ok {
            import(&m);
        } else {
            assert_eq!(
                import_err(&m),
                "model.onnx: node \"r\" (Resize, opset 10): scales [1.0, 1.0, 0.5, 2.0]: before opset 11, only factors of at least 1 are supported"
            );
        }
    }
}

#[test]
fn resize_refuses_what_it_cannot_run_listing_every_node() {
    let resize = |name: &str, inputs: &[&str], out: &str, attrs: Vec<(&str, A)>| {
        node("Resize", name, inputs, &[out], attrs)
    };
    let m = model(
        19,
        vec![x4("x", 4, 6, 6)],
        vec![
            resize("fraction", &["x", "", "third"], "a", vec![]),
            resize(
                "cubic",
                &["x", "", "twice"],
                "b",
                vec![("mode", A::S("cubic"))],
            ),
            resize(
                "crop",
                &["x", "", "twice"],
                "c",
                vec![("coordinate_transformation_mode", A::S("tf_crop_and_resize"))],
            ),
            resize("channels", &["x", "", "", "more_channels"], "d", vec![]),
            resize("both", &["x", "", "twice", "sizes"], "e", vec![]),
            node("Shape", "shape", &["x"], &["s"], vec![]),
            node("Mul", "double", &["s", "s"], &["s2"], vec![]),
            resize("from_mul", &["x", "", "", "s2"], "f", vec![]),
            node("Gather", "gather_act", &["x", "idx"], &["g"], vec![]),
            node("Unsqueeze", "unsqueeze_act", &["x", "idx"], &["u"], vec![]),
            resize("neither", &["x"], "h", vec![]),
            resize(
                "antialias",
                &["x", "", "twice"],
                "i",
                vec![("mode", A::S("linear")), ("antialias", A::I(1))],
            ),
        ],
        vec![
            values("third", &[4], vec![1.0, 1.0, 0.5, 1.0 / 3.0]),
            values("twice", &[4], vec![1.0, 1.0, 2.0, 2.0]),
            ints_init("more_channels", &[4], vec![1, 8, 12, 12]),
            ints_init("sizes", &[4], vec![1, 4, 12, 12]),
            ints_init("idx", &[1], vec![0]),
        ],
        &["a", "s"],
    );
    let text = import_err(&m);
    let expected = [
        "node \"fraction\" (Resize, opset 19): scales [1.0, 1.0, 0.5, 0.33333334]: the height's and width's must be whole factors up to 65536 or fractions n / 2^k (n odd, at most 255; k at most 16) such as 0.5 or 1.5 (sizes resize to any extent)",
        "node \"cubic\" (Resize, opset 19): attribute mode is \"cubic\": only nearest and linear are supported",
        "node \"crop\" (Resize, opset 19): attribute coordinate_transformation_mode is \"tf_crop_and_resize\": supported are half_pixel, pytorch_half_pixel, align_corners, asymmetric, tf_half_pixel_for_nearest",
        "node \"channels\" (Resize, opset 19): sizes change the channels from 4 to 8: only the height and width are resized",
        "node \"both\" (Resize, opset 19): both scales and sizes are given: only one may be",
        "node \"from_mul\" (Resize, opset 19): sizes change the channels from 4 to 16: only the height and width are resized",
        "node \"gather_act\" (Gather, opset 19): input 0 (data) is not a vector of shape dimensions: only gathering from a Shape is supported",
        "node \"unsqueeze_act\" (Unsqueeze, opset 19): input 0 is not a scalar shape dimension: only unsqueezing one (as exporters do for a Resize's sizes) is supported",
        "node \"neither\" (Resize, opset 19): neither scales nor sizes are given",
        "node \"antialias\" (Resize, opset 19): attribute antialias is 1: antialiased resizing is not supported",
        "output \"s\": is computed from shapes: only a Resize's sizes and a channel Slice's bounds may be",
    ];
    let got: Vec<&str> = text
        .lines()
        .map(|l| l.trim_start_matches("model.onnx: "))
        .collect();
    assert_eq!(got, expected);
}

// ---- ConvTranspose ---------------------------------------------------------------------------

/// `ConvTranspose` keeps its attributes: strides, pads, dilations, output_padding, a bias, and
/// groups 1 or depthwise; its output extents follow the ONNX formula, also over symbols.
#[test]
fn conv_transpose_imports_with_its_attributes() {
    let m = model(
        17,
        vec![info(
            "x",
            data_type::FLOAT,
            vec![D::N(1), D::N(4), D::P("H"), D::N(5)],
        )],
        vec![
            node(
                "ConvTranspose",
                "up",
                &["x", "w", "b"],
                &["u"],
                vec![
                    ("kernel_shape", A::Is(vec![3, 2])),
                    ("strides", A::Is(vec![2, 3])),
                    ("pads", A::Is(vec![1, 0, 1, 2])),
                    ("dilations", A::Is(vec![1, 2])),
                    ("output_padding", A::Is(vec![1, 0])),
                ],
            ),
            node(
                "ConvTranspose",
                "dw",
                &["u", "wd"],
                &["y"],
                vec![("group", A::I(6)), ("strides", A::Is(vec![2, 2]))],
            ),
        ],
        vec![
            init("w", &[4, 6, 3, 2]),
            init("b", &[6]),
            init("wd", &[6, 1, 2, 2]),
        ],
        &["y"],
    );
    let i = import(&m);
    let text = assert_round_trip(&i);
    assert!(
        text.contains(
            "%u = conv_transpose(%x, @w, bias=@b, strides=[2, 3], dilations=[1, 2], pads=[1, 0, 1, 2], output_padding=[1, 0])"
        ),
        "{text}"
    );
    assert!(
        text.contains("%y = conv_transpose(%u, @wd, strides=[2, 2], groups=6)"),
        "{text}"
    );
    // Height: (H - 1) * 2 - 2 + 2 + 1 + 1 = 2H; width: 4 * 3 - 2 + 2 + 0 + 1 = 13; then
    // doubled by the k2 s2 depthwise one.
    let shapes = i.graph.verify().unwrap();
    let y = i.graph.value_by_name("y").unwrap();
    assert_eq!(shapes.describe(y), "[1, 6, H * 4, 26]");
    let b = primjit_ir::parse_bindings("H=7").unwrap();
    let shapes = primjit_ir::infer_shapes(&i.graph, &b).unwrap();
    assert_eq!(shapes.concrete(y), Some(vec![1, 6, 28, 26]));
}

/// `auto_pad` SAME splits `kernel extent + output_padding - stride` (which no input extent
/// changes, so a symbolic one works), SAME_UPPER with the larger half at the end; VALID is no
/// padding; `output_shape` sets the pads over a known input, an extra end row becoming output
/// padding, as the ONNX operator's reference does.
#[test]
fn conv_transpose_auto_pad_and_output_shape_become_pads() {
    let ct = |attrs: Vec<(&'static str, A)>, h: D| {
        let m = model(
            17,
            vec![info(
                "x",
                data_type::FLOAT,
                vec![D::N(1), D::N(1), h, D::N(3)],
            )],
            vec![node("ConvTranspose", "t", &["x", "w"], &["y"], attrs)],
            vec![init("w", &[1, 2, 3, 3])],
            &["y"],
        );
        match ops(&import(&m)).as_slice() {
            [Op::ConvTranspose(c)] => c.clone(),
            other => panic!("expected one conv_transpose, found {other:?}"),
        }
    };
    let strides = || ("strides", A::Is(vec![2, 2]));
    // Total 3 + 0 - 2 = 1 per axis.
    let upper = ct(vec![strides(), ("auto_pad", A::S("SAME_UPPER"))], D::P("H"));
    assert_eq!(
        upper.pads,
        Pads {
            top: 0,
            left: 0,
            bottom: 1,
            right: 1
        }
    );
    let lower = ct(vec![strides(), ("auto_pad", A::S("SAME_LOWER"))], D::P("H"));
    assert_eq!(
        lower.pads,
        Pads {
            top: 1,
            left: 1,
            bottom: 0,
            right: 0
        }
    );
    let valid = ct(vec![strides(), ("auto_pad", A::S("VALID"))], D::P("H"));
    assert!(valid.pads.is_zero());
    // ONNX's convtranspose_output_shape: 3x3, kernel 3, strides [3, 2] to [10, 8]: totals
    // 6 + 3 - 10 = -1 and 4 + 3 - 8 = -1, so no pads and one row and column of output padding.
    let shaped = ct(
        vec![
            ("strides", A::Is(vec![3, 2])),
            ("output_shape", A::Is(vec![10, 8])),
        ],
        D::N(3),
    );
    assert!(shaped.pads.is_zero());
    assert_eq!(shaped.output_padding, [1, 1]);
}

/// Every refusal names the node and what is wrong, and all are listed at once.
#[test]
fn conv_transpose_refusals_are_listed_at_once() {
    let w = |name: &str, dims: &[i64]| init(name, dims);
    let m = model(
        17,
        vec![info(
            "x",
            data_type::FLOAT,
            vec![D::N(1), D::N(4), D::P("H"), D::P("W")],
        )],
        vec![
            node(
                "ConvTranspose",
                "grouped",
                &["x", "w2"],
                &["a"],
                vec![("group", A::I(2))],
            ),
            node(
                "ConvTranspose",
                "shaped",
                &["x", "w"],
                &["b"],
                vec![("output_shape", A::Is(vec![9, 9]))],
            ),
            node("ConvTranspose", "flat", &["x", "w3"], &["c"], vec![]),
            node(
                "ConvTranspose",
                "padding",
                &["x", "w"],
                &["d"],
                vec![("output_padding", A::Is(vec![1, 1]))],
            ),
            node(
                "ConvTranspose",
                "both",
                &["x", "w"],
                &["e"],
                vec![
                    ("auto_pad", A::S("SAME_UPPER")),
                    ("pads", A::Is(vec![1, 1, 1, 1])),
                ],
            ),
            node(
                "ConvTranspose",
                "kernel",
                &["x", "w"],
                &["f"],
                vec![("kernel_shape", A::Is(vec![2, 2]))],
            ),
            node("Add", "sum", &["a", "b"], &["y"], vec![]),
        ],
        vec![
            w("w", &[4, 2, 3, 3]),
            w("w2", &[4, 2, 3, 3]),
            w("w3", &[4, 2, 3]),
        ],
        &["y"],
    );
    let e = import_err(&m);
    let lines: Vec<&str> = e.lines().collect();
    let expect = [
        "node \"grouped\" (ConvTranspose, opset 17): attribute group 2 with weights [4, 2, 3, 3]: only groups 1 and depthwise",
        "node \"shaped\" (ConvTranspose, opset 17): attribute output_shape needs a known input height, found `H`",
        "node \"flat\" (ConvTranspose, opset 17): input 1 (W) has rank 3",
        "node \"padding\" (ConvTranspose, opset 17): output_padding [1, 1] must be less than the stride [1, 1] or the dilation [1, 1]",
        "node \"both\" (ConvTranspose, opset 17): attributes pads and auto_pad SAME_UPPER are both set",
        "node \"kernel\" (ConvTranspose, opset 17): attribute kernel_shape [2, 2] differs from the weight's kernel [3, 3]",
    ];
    assert_eq!(lines.len(), expect.len(), "{e}");
    for (line, want) in lines.iter().zip(expect) {
        assert!(line.contains(want), "{line}\nwanted: {want}\nall:\n{e}");
    }
}

/// Fuzzing finding (`onnx_import` with overflow checks): a channel-shuffle `Reshape` whose
/// groups times channels per group overflows i64 multiplied them, a panic in builds with
/// overflow checks (debug tests, the fuzz targets); now it is the shuffle's located refusal.
#[test]
fn a_shuffle_reshape_whose_groups_overflow_is_refused() {
    let m = model(
        17,
        vec![x4("x", 6, 2, 3)],
        vec![node("Reshape", "view", &["x", "s1"], &["v"], vec![])],
        vec![TensorProto {
            name: "s1".into(),
            dims: vec![5],
            data_type: data_type::INT64,
            int64_data: vec![1, 1 << 32, 1 << 32, 2, 3],
            ..Default::default()
        }],
        &["v"],
    );
    let err = import_err(&m);
    assert!(
        err.contains("node \"view\" (Reshape, opset 17)")
            && err.contains("only [N, g, C / g, H, W] of a channel shuffle is supported"),
        "{err}"
    );
}

/// Squeeze-excitation at symbolic H and W (torchvision's `scale * input`): a `[1, C, 1, 1]`
/// left operand of `Mul` meets the activation as a broadcast, not as a tensor of the same
/// shape, and so does a right one of `Add`; a `Sub` of the broadcast operand on the left is
/// refused where it is imported. Every extent verifies once bound.
#[test]
fn a_channel_broadcast_meets_symbolic_extents() {
    use primjit_ir::BinaryKind;
    let pool = |name: &str, out: &str| node("GlobalAveragePool", name, &["x"], &[out], vec![]);
    let m = model(
        17,
        vec![xsym("x", 4)],
        vec![
            pool("gap", "s"),
            node("Mul", "scale", &["s", "x"], &["y"], vec![]),
            pool("gap2", "t"),
            node("Add", "shift", &["y", "t"], &["z"], vec![]),
        ],
        vec![],
        &["z"],
    );
    let i = import(&m);
    assert_round_trip(&i);
    let x = i.graph.inputs()[0].value;
    let binaries: Vec<(BinaryKind, bool)> = ops(&i)
        .into_iter()
        .filter_map(|op| match op {
            Op::Binary { kind, lhs, .. } => Some((kind, lhs == x)),
            _ => None,
        })
        .collect();
    // The activation on the left of both: `x * s`, then `y + t`.
    assert_eq!(
        binaries,
        [(BinaryKind::Mul, true), (BinaryKind::Add, false)]
    );
    let bindings = primjit_ir::parse_bindings("H=5,W=7").unwrap();
    primjit_ir::infer_shapes(&i.graph, &bindings).unwrap();

    let refused = model(
        17,
        vec![xsym("x", 4)],
        vec![
            pool("gap", "s"),
            node("Sub", "minus", &["s", "x"], &["y"], vec![]),
        ],
        vec![],
        &["y"],
    );
    assert_eq!(
        import_err(&refused),
        "model.onnx: node \"minus\" (Sub, opset 17): the operands have shapes [1, 4, 1, 1] and [1, 4, H, W]: only equal shapes, or a right operand of [N, C, 1, 1] or [1, C, 1, 1], are supported"
    );
}

/// ShuffleNetV2's channel shuffle at symbolic H and W, as torch exports `x.view(n, g, c / g,
/// h, w)` of `x.size()`: the Reshapes' shapes are computed from `Shape` by `Gather`,
/// `Unsqueeze` and `Concat`, their N, H and W the input's own.
#[test]
fn a_channel_shuffle_over_symbolic_extents_takes_computed_shapes() {
    let gather = |name: &str, at: &str, out: &str| {
        node(
            "Gather",
            name,
            &["shape", at],
            &[out],
            vec![("axis", A::I(0))],
        )
    };
    let unsqueeze =
        |name: &str, x: &str, out: &str| node("Unsqueeze", name, &[x, "axis0"], &[out], vec![]);
    let concat = |name: &str, parts: &[&str], out: &str| {
        node("Concat", name, parts, &[out], vec![("axis", A::I(0))])
    };
    let m = model(
        17,
        vec![xsym("x", 6)],
        vec![
            node("Shape", "shape_of", &["x"], &["shape"], vec![]),
            gather("n", "i0", "n0"),
            gather("h", "i2", "h0"),
            gather("w", "i3", "w0"),
            unsqueeze("un", "n0", "n1"),
            unsqueeze("uh", "h0", "h1"),
            unsqueeze("uw", "w0", "w1"),
            concat(
                "grouped_shape",
                &["n1", "groups", "per_group", "h1", "w1"],
                "s5",
            ),
            node("Reshape", "grouped", &["x", "s5"], &["g"], vec![]),
            node(
                "Transpose",
                "swap",
                &["g"],
                &["t"],
                vec![("perm", A::Is(vec![0, 2, 1, 3, 4]))],
            ),
            concat("flat_shape", &["n1", "minus_one", "h1", "w1"], "s4"),
            node("Reshape", "shuffled", &["t", "s4"], &["y"], vec![]),
        ],
        vec![
            ints_init("i0", &[], vec![0]),
            ints_init("i2", &[], vec![2]),
            ints_init("i3", &[], vec![3]),
            ints_init("axis0", &[1], vec![0]),
            ints_init("groups", &[1], vec![2]),
            ints_init("per_group", &[1], vec![3]),
            ints_init("minus_one", &[1], vec![-1]),
        ],
        &["y"],
    );
    let i = import(&m);
    assert_round_trip(&i);
    match ops(&i).as_slice() {
        [Op::SelectChannels { select, .. }] => assert_eq!(select, &[0, 3, 1, 4, 2, 5]),
        other => panic!("{other:?}"),
    }
}

/// torch's dynamo exporter at symbolic sizes reads a dimension as `Shape` from `start` to
/// `end` and `Squeeze`, computes a later layer's extent as `(H + 1) / 2`, `Reshape`s it to a
/// vector of one and joins the vectors into a Resize's sizes: the extents meet the 3x3/2
/// conv's `(H - 1) / 2 + 1`, so the resize takes that tensor's extents. Arithmetic that is no
/// extent of a symbol is refused where it is imported.
#[test]
fn shape_arithmetic_over_symbols_meets_the_convs_extents() {
    let dim_of = |axis: i64, s: &str, d: &str| {
        vec![
            node(
                "Shape",
                &format!("shape_{s}"),
                &["x"],
                &[s],
                vec![("start", A::I(axis)), ("end", A::I(axis + 1))],
            ),
            node(
                "Squeeze",
                &format!("squeeze_{s}"),
                &[s],
                &[&format!("{d}0")],
                vec![],
            ),
            node(
                "Add",
                &format!("plus_{s}"),
                &[&format!("{d}0"), "one"],
                &[&format!("{d}1")],
                vec![],
            ),
            node(
                "Div",
                &format!("half_{s}"),
                &[&format!("{d}1"), "two"],
                &[&format!("{d}2")],
                vec![],
            ),
            node(
                "Reshape",
                &format!("vector_{s}"),
                &[&format!("{d}2"), "minus_one"],
                &[&format!("{d}3")],
                vec![],
            ),
        ]
    };
    let mut nodes = vec![
        node(
            "Conv",
            "down",
            &["x", "w"],
            &["y"],
            vec![
                ("strides", A::Is(vec![2, 2])),
                ("pads", A::Is(vec![1, 1, 1, 1])),
            ],
        ),
        node("GlobalAveragePool", "context", &["y"], &["g"], vec![]),
    ];
    nodes.extend(dim_of(2, "sh", "h"));
    nodes.extend(dim_of(3, "sw", "w"));
    nodes.extend([
        node(
            "Concat",
            "sizes",
            &["nc", "h3", "w3"],
            &["s4"],
            vec![("axis", A::I(0))],
        ),
        node("Resize", "spread", &["g", "", "", "s4"], &["r"], vec![]),
        node("Add", "sum", &["r", "y"], &["z"], vec![]),
    ]);
    let inits = || {
        vec![
            values("w", &[4, 4, 3, 3], vec![0.5; 144]),
            ints_init("one", &[], vec![1]),
            ints_init("two", &[], vec![2]),
            ints_init("minus_one", &[1], vec![-1]),
            ints_init("nc", &[2], vec![1, 4]),
        ]
    };
    let m = model(17, vec![xsym("x", 4)], nodes, inits(), &["z"]);
    let i = import(&m);
    assert_round_trip(&i);
    let bindings = primjit_ir::parse_bindings("H=9,W=14").unwrap();
    let shapes = primjit_ir::infer_shapes(&i.graph, &bindings).unwrap();
    let out = shapes.get(i.graph.outputs()[0].1).unwrap().to_vec();
    assert_eq!(out, [1, 4, 5, 7].map(Dim::Known));
    assert!(
        ops(&i).iter().any(
            |op| matches!(op, Op::Resize(r) if matches!(r.size, primjit_ir::ResizeSize::Like(_)))
        ),
        "{:?}",
        ops(&i)
    );

    let refused = model(
        17,
        vec![xsym("x", 4)],
        vec![
            node(
                "Shape",
                "shape_h",
                &["x"],
                &["s"],
                vec![("start", A::I(2)), ("end", A::I(3))],
            ),
            node("Squeeze", "squeeze_h", &["s"], &["h"], vec![]),
            node("Sub", "from_two", &["two", "h"], &["d"], vec![]),
            node(
                "Squeeze",
                "squeeze_axis_1",
                &["s", "one_axis"],
                &["q"],
                vec![],
            ),
        ],
        vec![
            ints_init("two", &[], vec![2]),
            ints_init("one_axis", &[1], vec![1]),
        ],
        &["x"],
    );
    assert_eq!(
        import_err(&refused)
            .lines()
            .map(|l| l.trim_start_matches("model.onnx: "))
            .collect::<Vec<_>>(),
        [
            "node \"from_two\" (Sub, opset 17): 2 - H: over a symbolic dimension, only adding or subtracting a number, and multiplying or dividing by a positive one, are supported",
            "node \"squeeze_axis_1\" (Squeeze, opset 17): axes Some([1]): a vector of one squeezes along axis 0 only",
        ]
    );
}
