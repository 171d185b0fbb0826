//! The example graphs in `ir/examples` together show every op, every attribute away from its
//! default, every post-op, both derived parameters and symbolic dimensions, so that tests
//! which run them (here and in the kernel crates) cover the whole IR; and they stay small.

use std::collections::BTreeSet;
use std::path::Path;

use primjit_ir::{DerivedParam, Op, OpKind, PoolKind, PostOp, parse};

#[test]
fn examples_cover_every_op_and_attribute() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ir/examples");
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "ir") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let g = parse(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        if text.lines().any(|l| l.starts_with("# dims:")) {
            seen.insert("dims header".to_string());
        } else if !g.symbols().is_empty() {
            seen.insert("unbound symbols".to_string());
        }
        if g.inputs().len() > 1 {
            seen.insert("several inputs".to_string());
        }
        if g.outputs().len() > 1 {
            seen.insert("several outputs".to_string());
        }
        for input in g.inputs() {
            assert!(
                input.shape.len() == 4 && input.shape[1].known().is_some_and(|c| c <= 8),
                "{path:?}: inputs are NCHW with at most 8 channels"
            );
            for d in &input.shape[2..] {
                assert!(
                    d.known().is_none_or(|n| n <= 12),
                    "{path:?}: spatial extents are at most 12"
                );
            }
        }
        for (_, p) in g.params() {
            assert!(
                p.shape.first().is_some_and(|&o| o <= 8),
                "{path:?}: @{} has at most 8 output channels",
                p.name
            );
            match p.derived {
                Some(DerivedParam::BnFoldWeight { .. }) => {
                    seen.insert("bnfold_weight".to_string());
                }
                Some(DerivedParam::BnScale { .. }) => {
                    seen.insert("bn_scale".to_string());
                }
                Some(DerivedParam::BnFoldBias { conv_bias, .. }) => {
                    seen.insert(
                        if conv_bias.is_some() {
                            "bnfold_bias with conv_bias"
                        } else {
                            "bnfold_bias"
                        }
                        .to_string(),
                    );
                }
                None => {}
            }
        }
        for (_, node) in g.nodes() {
            seen.insert(node.op.kind().name().to_string());
            match &node.op {
                Op::Conv2d(c) => {
                    let in_channels = g.param(c.weight).shape[1] * c.groups;
                    let flags = [
                        (c.bias.is_some(), "conv bias"),
                        (c.strides[0] != c.strides[1], "conv rectangular strides"),
                        (c.strides != [1, 1], "conv strides"),
                        (c.dilations != [1, 1], "conv dilations"),
                        (
                            c.pads.top != c.pads.bottom || c.pads.left != c.pads.right,
                            "conv asymmetric pads",
                        ),
                        (c.auto_pad.is_some(), "conv auto_pad"),
                        (c.groups > 1 && c.groups < in_channels, "conv groups"),
                        (c.groups > 1 && c.groups == in_channels, "conv depthwise"),
                        (
                            c.groups == in_channels && g.param(c.weight).shape[0] > in_channels,
                            "conv depthwise multiplier",
                        ),
                    ];
                    for (on, name) in flags {
                        if on {
                            seen.insert(name.to_string());
                        }
                    }
                    for post in &c.post_ops {
                        let name = match post {
                            PostOp::Relu => "post relu",
                            PostOp::Add(_) => "post add",
                            PostOp::Clip { .. } => "post clip",
                            PostOp::MaxPool(_) => "post maxpool",
                            PostOp::Act(_) => "post activation",
                            PostOp::PRelu(_) => "post prelu",
                        };
                        seen.insert(name.to_string());
                    }
                    if c.post_ops.len() > 1 {
                        seen.insert("several post-ops".to_string());
                    }
                }
                Op::Pool2d(p) => {
                    let kind = if p.kind == PoolKind::Max {
                        "max"
                    } else {
                        "avg"
                    };
                    let (w, count_include_pad) = (&p.window, p.count_include_pad);
                    let flags = [
                        (w.strides != [1, 1], "strides"),
                        (!w.pads.is_zero(), "pads"),
                        (
                            w.pads.top != w.pads.bottom || w.pads.left != w.pads.right,
                            "asymmetric pads",
                        ),
                        (w.ceil_mode, "ceil_mode"),
                        (p.auto_pad.is_some(), "auto_pad"),
                        (count_include_pad, "count_include_pad"),
                        (w.dilations != [1, 1], "dilations"),
                        (w.kernel[0] != w.kernel[1], "rectangular kernel"),
                    ];
                    for (on, name) in flags {
                        if on {
                            seen.insert(format!("{kind}pool {name}"));
                        }
                    }
                }
                Op::BatchNorm(_) | Op::GlobalPool { .. } | Op::Relu { .. } | Op::Add { .. } => {}
                Op::Act { .. }
                | Op::PRelu { .. }
                | Op::Binary { .. }
                | Op::Concat { .. }
                | Op::SelectChannels { .. } => {}
                Op::ConvTranspose(c) => {
                    for (shown, name) in [
                        (c.strides != [1, 1], "strides"),
                        (!c.pads.is_zero(), "pads"),
                        (c.output_padding != [0, 0], "output_padding"),
                        (c.dilations != [1, 1], "dilations"),
                        (c.groups > 1, "depthwise"),
                        (c.bias.is_some(), "bias"),
                    ] {
                        if shown {
                            seen.insert(format!("conv_transpose {name}"));
                        }
                    }
                }
                Op::Resize(r) => {
                    let mode = match r.mode {
                        primjit_ir::ResizeMode::Linear => "linear".to_string(),
                        primjit_ir::ResizeMode::Nearest(m) => format!("nearest {m}"),
                    };
                    let size = match r.size {
                        primjit_ir::ResizeSize::Scale(f) if f.iter().any(|f| !f.is_whole()) => {
                            "fractional scale"
                        }
                        primjit_ir::ResizeSize::Scale(_) => "scale",
                        primjit_ir::ResizeSize::Sizes(_) => "size",
                        primjit_ir::ResizeSize::Like(_) => "like",
                    };
                    for name in [mode, format!("coord {}", r.coord), size.to_string()] {
                        seen.insert(format!("resize {name}"));
                    }
                }
            }
        }
    }
    assert!(files >= 5, "expected the example files in {dir:?}");
    let mut wanted: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
    wanted.extend([
        "conv bias",
        "conv strides",
        "conv rectangular strides",
        "conv dilations",
        "conv asymmetric pads",
        "conv auto_pad",
        "conv groups",
        "conv depthwise",
        "conv depthwise multiplier",
        "post relu",
        "post add",
        "post clip",
        "post maxpool",
        "post activation",
        "post prelu",
        "several post-ops",
        "maxpool strides",
        "maxpool pads",
        "maxpool ceil_mode",
        "maxpool dilations",
        "maxpool auto_pad",
        "avgpool strides",
        "avgpool pads",
        "avgpool asymmetric pads",
        "avgpool ceil_mode",
        "avgpool count_include_pad",
        "avgpool dilations",
        "avgpool auto_pad",
        "avgpool rectangular kernel",
        "bnfold_weight",
        "bn_scale",
        "bnfold_bias",
        "bnfold_bias with conv_bias",
        "dims header",
        "unbound symbols",
        "several inputs",
        "several outputs",
        "resize linear",
        "resize nearest round_prefer_floor",
        "resize nearest round_prefer_ceil",
        "resize nearest floor",
        "resize nearest ceil",
        "resize coord half_pixel",
        "resize coord pytorch_half_pixel",
        "resize coord align_corners",
        "resize coord asymmetric",
        "resize coord tf_half_pixel_for_nearest",
        "resize scale",
        "resize fractional scale",
        "resize size",
        "resize like",
        "conv_transpose strides",
        "conv_transpose pads",
        "conv_transpose output_padding",
        "conv_transpose dilations",
        "conv_transpose depthwise",
        "conv_transpose bias",
    ]);
    let missing: Vec<&str> = wanted.into_iter().filter(|w| !seen.contains(*w)).collect();
    assert!(missing.is_empty(), "no example shows: {missing:?}");
}
