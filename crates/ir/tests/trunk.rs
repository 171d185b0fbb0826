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
    // The max-pool fuses into the stem conv, leaving the 29 convs.
    assert_eq!(report.fused_pools, 1);
    assert_eq!(g.node_count(), 29);
    g.verify().unwrap();
}

#[test]
fn trunk_stem_fuses_its_pool_and_keeps_every_shape() {
    let original = trunk();
    let mut g = original.clone();
    passes::optimize(&mut g);
    let text = g.to_string();
    assert!(
        text.contains("%conv1 = conv2d(%x, @conv1.weight.bnfold, bias=@conv1.weight.bnfold_bias, strides=[2, 2], pads=[3, 3, 3, 3], post=[relu, maxpool(kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])])"),
        "{text}"
    );
    // layer1.0 reads the pooled stem twice: as its conv's input and as its residual.
    assert!(text.contains("%layer1.0.conv1 = conv2d(%conv1,"), "{text}");
    assert!(text.contains("post=[add(%conv1), relu]"), "{text}");
    let stem = g.value_by_name("conv1").unwrap();
    let pool = original.value_by_name("maxpool").unwrap();
    let unbound = primjit_ir::Bindings::new();
    let (fused, unfused) = (
        primjit_ir::infer_shapes(&g, &unbound).unwrap(),
        primjit_ir::infer_shapes(&original, &unbound).unwrap(),
    );
    assert_eq!(fused.get(stem), unfused.get(pool));
    let w1031 = parse_bindings("W=1031").unwrap();
    let fused = primjit_ir::infer_shapes(&g, &w1031).unwrap();
    assert_eq!(fused.concrete(stem), Some(vec![1, 64, 80, 258]));
    assert_eq!(fused.concrete(g.outputs()[0].1), Some(vec![1, 256, 20, 65]));
}
