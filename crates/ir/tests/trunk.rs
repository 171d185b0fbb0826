//! The shipped ResNet34 trunk parses, verifies, and has the report's shapes.

use primjit_ir::{Dim, parse, parse_bindings, passes};

fn trunk() -> primjit_ir::Graph {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ir/resnet34_trunk.ir");
    parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn trunk_output_at_w1031_is_256x20x65() {
    let g = trunk();
    let shapes = primjit_ir::infer_shapes(&g, &parse_bindings("W=1031").unwrap()).unwrap();
    let out = g.outputs()[0].1;
    assert_eq!(shapes.concrete(out), Some(vec![1, 256, 20, 65]));
}

#[test]
fn trunk_without_bindings_keeps_width_symbolic() {
    let g = trunk();
    let shapes = g.verify().unwrap();
    let out = shapes.get(g.outputs()[0].1).unwrap();
    assert_eq!(out[..3], [Dim::Known(1), Dim::Known(256), Dim::Known(20)]);
    assert!(out[3].known().is_none());
}

#[test]
fn trunk_optimizes_to_one_conv_per_conv() {
    let mut g = trunk();
    let report = passes::optimize(&mut g);
    // 1 stem conv, 13 blocks x 2 convs, 2 downsamples = 29 convs, each with a batch-norm.
    assert_eq!(report.folded_batchnorms, 29);
    assert_eq!(report.fused_adds, 13);
    assert_eq!(report.fused_relus, 1 + 13 * 2);
    // 29 convs and the max-pool remain.
    assert_eq!(g.node_count(), 30);
    g.verify().unwrap();
}
