//! `auto_pad=same_upper` / `same_lower` in shape inference: symbolic outputs of
//! `ceil(in / stride)`, the padding resolved at each bound shape exactly as explicit pads of
//! the same values would be, and the refusals that need the bound extents.

use primjit_ir::{AutoPad, Bindings, Dim, Op, infer_shapes, parse, parse_bindings};

fn graph(op: &str) -> String {
    format!(
        "graph g {{
  input %x: f32[1, 2, H, W]
  param @w: f32[3, 2, 3, 5]
  %y = {op}
  output y = %y
}}
"
    )
}

fn output(text: &str, bindings: &Bindings) -> Result<Vec<Dim>, String> {
    let g = parse(text).map_err(|e| e.to_string())?;
    let shapes = infer_shapes(&g, bindings).map_err(|e| e.to_string())?;
    Ok(shapes.get(g.outputs()[0].1).unwrap().to_vec())
}

#[test]
fn every_bound_shape_is_that_of_the_resolved_explicit_pads() {
    let ops = [
        "conv2d(%x, @w, strides=[2, 3], auto_pad=same_upper)",
        "conv2d(%x, @w, strides=[3, 2], dilations=[2, 1], auto_pad=same_lower)",
        "maxpool2d(%x, kernel=[3, 2], strides=[2, 2], auto_pad=same_lower)",
        "avgpool2d(%x, kernel=[2, 3], strides=[3, 2], auto_pad=same_upper, ceil_mode=true)",
    ];
    for op in ops {
        let text = graph(op);
        let g = parse(&text).unwrap();
        // Unbound: ceil(in / stride), whatever the split.
        let unbound = output(&text, &Bindings::new()).unwrap();
        let (strides, kernel) = match &g.nodes().next().unwrap().1.op {
            Op::Conv2d(c) => (c.strides, [3, 5]),
            Op::Pool2d(p) => (p.window.strides, p.window.kernel),
            other => panic!("{other:?}"),
        };
        for h in 1..12usize {
            for w in 1..12usize {
                let b = parse_bindings(&format!("H={h},W={w}")).unwrap();
                let want = [h.div_ceil(strides[0]), w.div_ceil(strides[1])];
                let resolved: Vec<Dim> = unbound.iter().map(|d| d.resolve(&b).unwrap()).collect();
                let bound = output(&text, &b).unwrap_or_else(|e| panic!("{op} {h}x{w}: {e}"));
                assert_eq!(bound, resolved, "{op} {h}x{w}");
                assert_eq!(
                    bound[2..],
                    [Dim::Known(want[0] as u64), Dim::Known(want[1] as u64)],
                    "{op} {h}x{w}"
                );
                // The same node with the resolved pads written out has the same shape.
                let pads = match &g.nodes().next().unwrap().1.op {
                    Op::Conv2d(c) => c.pads_at(kernel, [h, w]).unwrap(),
                    Op::Pool2d(p) => p.window_at([h, w]).unwrap().pads,
                    other => panic!("{other:?}"),
                };
                let auto = if op.contains("same_upper") {
                    AutoPad::SameUpper
                } else {
                    AutoPad::SameLower
                };
                let explicit = text.replace(
                    &format!("auto_pad={auto}"),
                    &format!(
                        "pads=[{}, {}, {}, {}]",
                        pads.top, pads.left, pads.bottom, pads.right
                    ),
                );
                assert_eq!(output(&explicit, &b).unwrap(), bound, "{explicit}");
            }
        }
    }
}

#[test]
fn refusals_name_the_attribute() {
    let err =
        |op: &str, dims: &str| output(&graph(op), &parse_bindings(dims).unwrap()).unwrap_err();
    assert!(
        err("conv2d(%x, @w, pads=[0, 0, 0, 1], auto_pad=same_lower)", "")
            .contains("pads and auto_pad=same_lower are both set"),
    );
    assert!(
        err("conv2d(%x, @w, strides=[0, 2], auto_pad=same_upper)", "")
            .contains("strides must be at least 1"),
    );
    assert!(
        err(
            "conv2d(%x, @w, strides=[2, 1073741824], auto_pad=same_upper)",
            ""
        )
        .contains("strides must be at most 536870912"),
    );
    // Dilation 2^29 over a 5-tap row pads 2^30 cells: refused once the width is bound.
    let huge = "conv2d(%x, @w, dilations=[1, 536870912], strides=[1, 2], auto_pad=same_upper)";
    assert!(output(&graph(huge), &Bindings::new()).is_ok());
    assert!(err(huge, "H=4,W=4").contains("pads must be at most 536870912"));
}
