//! Graph rewrites: folding batch-norm into convolutions (or making it one), fusing
//! element-wise ops and max pooling into them, and composing channel selections.
//!
//! The passes are structural: they need no parameter values. Folding declares derived
//! parameters (`bnfold_weight`, `bn_scale`, `bnfold_bias`) whose values
//! [`crate::Params::materialize`] computes, so the rewritten graph prints as a valid IR file
//! that runs with the original parameters. A fused conv keeps its own value name, so `--node
//! layer1.0.conv1` still finds it; readers of a fused op's result, graph outputs included,
//! read the conv's value instead.

use crate::graph::{
    BatchNorm, Conv2d, DerivedParam, Graph, NodeData, Op, Param, ParamData, PoolKind, PostOp, Value,
};

/// What the passes changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub folded_batchnorms: usize,
    /// Batch-norms that follow no foldable conv, made depthwise 1x1 convs.
    pub batchnorm_convs: usize,
    /// Relus and other activations fused into convs.
    pub fused_relus: usize,
    pub fused_adds: usize,
    pub fused_pools: usize,
    /// Channel selections read only by other selections, composed into those and removed.
    pub composed_selections: usize,
}

/// Composes channel selections, folds batch-norm into the preceding conv and makes the others
/// depthwise convs, fuses relu and residual adds into convs, then max pooling after them.
pub fn optimize(graph: &mut Graph) -> PassReport {
    optimize_with(graph, |_, _| true)
}

/// [`optimize`], fusing a max pool into a conv only where `fuse_pool(graph, conv)` says so
/// (`conv` as it is before the pool joins it): a caller that runs some convs by an algorithm
/// that takes no fused pool (Winograd) keeps their pools nodes of their own.
pub fn optimize_with(
    graph: &mut Graph,
    fuse_pool: impl FnMut(&Graph, &Conv2d) -> bool,
) -> PassReport {
    let composed_selections = compose_selections(graph);
    let folded_batchnorms = fold_batchnorm(graph);
    let batchnorm_convs = batchnorms_to_convs(graph);
    let (fused_relus, fused_adds) = fuse_post_ops(graph);
    // Last: a fused pool must be the conv's last post-op, so nothing can be fused after it.
    let fused_pools = fuse_pools_where(graph, fuse_pool);
    PassReport {
        folded_batchnorms,
        batchnorm_convs,
        fused_relus,
        fused_adds,
        fused_pools,
        composed_selections,
    }
}

/// The node after `node` that is the only reader of its value, if the value has exactly one
/// use (`uses`, indexed by value) and is not an output. Nodes are in graph order, so a reader
/// comes after its producer, usually right after.
fn sole_reader(graph: &Graph, uses: &[usize], node: usize) -> Option<usize> {
    let v = graph.nodes[node].result;
    if uses[v.index()] != 1 || graph.outputs.iter().any(|(_, o)| *o == v) {
        return None;
    }
    (node + 1..graph.nodes.len()).find(|&i| graph.nodes[i].op.value_operands().contains(&v))
}

/// Visits every conv and transposed conv once, in graph order, and merges into it the only
/// reader of its value whenever `merged(graph, op, value, reader)` returns the op, whose result
/// is `value`, with that reader folded in. The merged op keeps the conv's value and takes the
/// reader's place, later in the order, where it is visited again and may take its own reader
/// (`relu(add(conv(x), r))`). No merge makes an earlier conv mergeable, since a merge replaces
/// a reader by a conv, which no pass folds. Returns how many merges were made.
fn merge_sole_readers(
    graph: &mut Graph,
    mut merged: impl FnMut(&mut Graph, Op, Value, usize) -> Option<Op>,
) -> usize {
    let mut uses = graph.use_counts();
    let mut merges = 0;
    let mut at = 0;
    while at < graph.nodes.len() {
        if let op @ (Op::Conv2d(_) | Op::ConvTranspose(_)) = &graph.nodes[at].op
            && let Some(reader) = sole_reader(graph, &uses, at)
            && let Some(op) = merged(graph, op.clone(), graph.nodes[at].result, reader)
        {
            let node = NodeData {
                op,
                ..graph.nodes[at].clone()
            };
            // The conv's value now has the reader's readers.
            uses[node.result.index()] = uses[graph.nodes[reader].result.index()];
            merge_into(graph, at, reader, node);
            merges += 1;
            // The node after the old conv is now at its index.
            continue;
        }
        at += 1;
    }
    merges
}

/// Replaces node `user` by `conv` (keeping the conv's value), removes the conv's old
/// position, and redirects every later read of the user's result to the conv's value.
fn merge_into(graph: &mut Graph, conv_idx: usize, user_idx: usize, conv: NodeData) {
    let old = graph.nodes[user_idx].result;
    let new = conv.result;
    graph.nodes[user_idx] = conv;
    graph.nodes.remove(conv_idx);
    for node in &mut graph.nodes {
        node.op.for_each_value_mut(|v| {
            if *v == old {
                *v = new;
            }
        });
    }
    for (_, v) in &mut graph.outputs {
        if *v == old {
            *v = new;
        }
    }
}

fn fresh_param_name(graph: &Graph, base: &str) -> String {
    let mut name = base.to_string();
    let mut n = 1;
    while graph.param_by_name(&name).is_some() {
        n += 1;
        name = format!("{base}{n}");
    }
    name
}

/// Folds every `batchnorm` whose input is a post-op-free conv read by nothing else.
/// Returns how many were folded.
pub fn fold_batchnorm(graph: &mut Graph) -> usize {
    merge_sole_readers(graph, |graph, op, _, reader| {
        let Op::Conv2d(conv) = op else {
            return None;
        };
        if !conv.post_ops.is_empty() {
            return None;
        }
        let Op::BatchNorm(bn) = &graph.nodes[reader].op else {
            return None;
        };
        let bn = bn.clone();
        let w = graph.param(conv.weight).name.clone();
        let names = [
            fresh_param_name(graph, &format!("{w}.bnfold")),
            fresh_param_name(graph, &format!("{w}.bnfold_bias")),
        ];
        Some(Op::Conv2d(fold_batchnorm_params(graph, conv, &bn, names)))
    })
}

/// Makes every `batchnorm` a depthwise 1x1 conv with a derived weight (`BnScale`) and bias
/// (`BnFoldBias` without a conv bias): the kernel a batch-norm runs anyway, and a conv takes the
/// activations and adds after it as post-ops (DenseNet's `batchnorm` ▸ `relu` before each
/// conv). Returns how many it made.
pub fn batchnorms_to_convs(graph: &mut Graph) -> usize {
    let mut made = 0;
    for i in 0..graph.nodes.len() {
        let Op::BatchNorm(bn) = &graph.nodes[i].op else {
            continue;
        };
        let bn = bn.clone();
        let channels = graph.param(bn.scale).shape[0];
        let base = graph.value_name(graph.nodes[i].result).to_string();
        let weight_name = fresh_param_name(graph, &format!("{base}.bn_scale"));
        let weight = graph
            .add_param(ParamData {
                name: weight_name,
                shape: vec![channels, 1, 1, 1],
                derived: Some(DerivedParam::BnScale {
                    scale: bn.scale,
                    var: bn.var,
                    epsilon: bn.epsilon,
                }),
                loc: None,
            })
            .expect("fresh parameter names");
        let bias_name = fresh_param_name(graph, &format!("{base}.bn_shift"));
        let bias = add_bn_bias(graph, None, &bn, bias_name);
        graph.nodes[i].op = Op::Conv2d(Conv2d::per_channel(bn.input, weight, bias, channels));
        made += 1;
    }
    made
}

/// `conv` with `bn` folded into it: a derived weight (`BnFoldWeight`) and bias (`BnFoldBias`)
/// under `names`, which must be fresh, replace its own; `Params::materialize` computes them.
/// `fold_batchnorm` and the ONNX importer both fold through this.
pub fn fold_batchnorm_params(
    graph: &mut Graph,
    mut conv: Conv2d,
    bn: &BatchNorm,
    [weight_name, bias_name]: [String; 2],
) -> Conv2d {
    let shape = graph.param(conv.weight).shape.clone();
    let new_weight = graph
        .add_param(ParamData {
            name: weight_name,
            shape,
            derived: Some(DerivedParam::BnFoldWeight {
                weight: conv.weight,
                scale: bn.scale,
                var: bn.var,
                epsilon: bn.epsilon,
            }),
            loc: None,
        })
        .expect("fresh parameter names");
    conv.bias = Some(add_bn_bias(graph, conv.bias, bn, bias_name));
    conv.weight = new_weight;
    conv
}

/// Declares parameter `name` (fresh), the bias of `bn` folded into a conv whose own bias is
/// `conv_bias` (`BnFoldBias`), and returns it.
fn add_bn_bias(graph: &mut Graph, conv_bias: Option<Param>, bn: &BatchNorm, name: String) -> Param {
    let channels = graph.param(bn.scale).shape[0];
    graph
        .add_param(ParamData {
            name,
            shape: vec![channels],
            derived: Some(DerivedParam::BnFoldBias {
                conv_bias,
                scale: bn.scale,
                bias: bn.bias,
                mean: bn.mean,
                var: bn.var,
                epsilon: bn.epsilon,
            }),
            loc: None,
        })
        .expect("fresh parameter names")
}

/// Makes every `select_channels` that reads another's result read that one's input, the two
/// picks composed, where the inner selection is read only by selections that pick no more
/// channels in all than it has, and is no graph output; the inner one is then removed.
/// ShuffleNet's split of a channel shuffle so copies each channel once, into the half that
/// reads it, where the shuffle and then (for a concat's input) its first half were copied. The
/// count bound keeps a selection read whole by several from being copied by each. Returns how
/// many selections were removed.
pub fn compose_selections(graph: &mut Graph) -> usize {
    let mut removed = 0;
    loop {
        let uses = graph.use_counts();
        let composable = |i: usize| {
            let Op::SelectChannels { select, .. } = &graph.nodes[i].op else {
                return false;
            };
            let v = graph.nodes[i].result;
            let mut picked = 0;
            let readers_select = graph
                .nodes
                .iter()
                .filter(|n| n.op.value_operands().contains(&v))
                .all(|n| match &n.op {
                    // (An index past the inner pick is left for verification to refuse.)
                    Op::SelectChannels { select: outer, .. } => {
                        picked += outer.len();
                        outer.iter().all(|&s| s < select.len())
                    }
                    _ => false,
                });
            uses[v.index()] > 0
                && readers_select
                && picked <= select.len()
                && !graph.outputs.iter().any(|(_, o)| *o == v)
        };
        let Some(at) = (0..graph.nodes.len()).find(|&i| composable(i)) else {
            return removed;
        };
        let Op::SelectChannels {
            input: source,
            select: inner,
        } = graph.nodes[at].op.clone()
        else {
            unreachable!("a selection was found");
        };
        let v = graph.nodes[at].result;
        for node in &mut graph.nodes {
            if let Op::SelectChannels { input, select } = &mut node.op
                && *input == v
            {
                *input = source;
                for s in select.iter_mut() {
                    *s = inner[*s];
                }
            }
        }
        graph.nodes.remove(at);
        removed += 1;
    }
}

/// Fuses a `relu`, an activation, a `prelu` or a residual `add` that is the only reader of a
/// conv's output into the conv's post-ops, repeatedly, so `relu(add(conv(x), r))` becomes one
/// conv with `post=[add(r), relu]`; a conv takes one `prelu`, a transposed conv relus and
/// activations. Returns how many relus (activations and prelus counted) and adds were fused.
pub fn fuse_post_ops(graph: &mut Graph) -> (usize, usize) {
    let (mut relus, mut adds) = (0, 0);
    merge_sole_readers(graph, |graph, mut op, v, reader| {
        let post = match graph.nodes[reader].op {
            Op::Relu { .. } => PostOp::Relu,
            Op::Act { act, .. } => PostOp::Act(act),
            Op::PRelu { slope, .. } => PostOp::PRelu(slope),
            Op::Add { lhs, rhs } if lhs == v && rhs != v => PostOp::Add(rhs),
            Op::Add { lhs, rhs } if rhs == v && lhs != v => PostOp::Add(lhs),
            _ => return None,
        };
        let posts = match &mut op {
            // Nothing follows a pool: its post-op must stay the last one.
            Op::Conv2d(conv) if matches!(conv.post_ops.last(), Some(PostOp::MaxPool(_))) => {
                return None;
            }
            Op::Conv2d(conv)
                if matches!(post, PostOp::PRelu(_))
                    && conv.post_ops.iter().any(|p| matches!(p, PostOp::PRelu(_))) =>
            {
                return None;
            }
            Op::Conv2d(conv) => &mut conv.post_ops,
            Op::ConvTranspose(ct) if !matches!(post, PostOp::Add(_) | PostOp::PRelu(_)) => {
                &mut ct.post_ops
            }
            _ => return None,
        };
        match post {
            PostOp::Relu | PostOp::Act(_) | PostOp::PRelu(_) => relus += 1,
            _ => adds += 1,
        }
        posts.push(post);
        Some(op)
    });
    (relus, adds)
}

/// Fuses a `maxpool2d` that is the only reader of a conv's output into the conv as its last
/// post-op, so that `maxpool2d(relu(conv(x)))` (ResNet's stem) is one conv whose
/// full-resolution output is never stored. Average pooling is left alone. Returns how many
/// pools were fused.
pub fn fuse_pools(graph: &mut Graph) -> usize {
    fuse_pools_where(graph, |_, _| true)
}

/// [`fuse_pools`], for the convs `fuse(graph, conv)` accepts.
pub fn fuse_pools_where(graph: &mut Graph, mut fuse: impl FnMut(&Graph, &Conv2d) -> bool) -> usize {
    merge_sole_readers(graph, |graph, op, _, reader| {
        let Op::Conv2d(mut conv) = op else {
            return None;
        };
        // A pool must be the last post-op, so a conv that ends in one takes no other. A
        // residual is read at full resolution anyway, so fusing the pool after it would not
        // spare a full-resolution tensor, and primjit's kernels do not support it.
        if conv
            .post_ops
            .iter()
            .any(|p| matches!(p, PostOp::MaxPool(_) | PostOp::Add(_)))
        {
            return None;
        }
        let Op::Pool2d(pool) = &graph.nodes[reader].op else {
            return None;
        };
        // A fused pool's window is a fixed one; an `auto_pad` pool's depends on the extents.
        if pool.kind != PoolKind::Max || pool.auto_pad.is_some() || !fuse(graph, &conv) {
            return None;
        }
        conv.post_ops.push(PostOp::MaxPool(pool.window));
        Some(Op::Conv2d(conv))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bindings, Params, infer_shapes, parse};

    const BLOCK: &str = "graph block {
  input %x: f32[1, 4, 5, W]
  param @c1.weight: f32[4, 4, 3, 3]
  param @bn.weight: f32[4]
  param @bn.bias: f32[4]
  param @bn.running_mean: f32[4]
  param @bn.running_var: f32[4]
  %c1 = conv2d(%x, @c1.weight, pads=[1, 1, 1, 1])
  %bn = batchnorm(%c1, @bn.weight, @bn.bias, @bn.running_mean, @bn.running_var, epsilon=1e-5)
  %sum = add(%bn, %x)
  %out = relu(%sum)
  output y = %out
}
";

    #[test]
    fn folds_and_fuses_a_residual_block() {
        let mut g = parse(BLOCK).unwrap();
        let report = optimize(&mut g);
        assert_eq!(
            report,
            PassReport {
                folded_batchnorms: 1,
                batchnorm_convs: 0,
                fused_relus: 1,
                fused_adds: 1,
                fused_pools: 0,
                composed_selections: 0,
            }
        );
        assert_eq!(g.node_count(), 1);
        let text = g.to_string();
        assert!(
            text.contains("%c1 = conv2d(%x, @c1.weight.bnfold, bias=@c1.weight.bnfold_bias, pads=[1, 1, 1, 1], post=[add(%x), relu])"),
            "{text}"
        );
        assert!(text.contains("output y = %c1"), "{text}");
        // The rewritten graph is valid IR and reads back identically.
        let again = parse(&text).unwrap();
        assert_eq!(again.to_string(), text);
        infer_shapes(&again, &Bindings::new()).unwrap();
    }

    /// A transposed conv takes the relu and the activation after it as post-ops, and the
    /// `add` after those stays an op of its own; the result prints and parses back.
    #[test]
    fn fuses_activations_into_a_transposed_conv() {
        let src = "graph up {
  input %x: f32[1, 4, 3, W]
  param @up.weight: f32[4, 8, 2, 2]
  param @r.weight: f32[8, 4, 1, 1]
  %up = conv_transpose(%x, @up.weight, strides=[2, 2])
  %a = relu(%up)
  %s = sigmoid(%a)
  %r = conv2d(%x, @r.weight)
  %big = conv_transpose(%r, @up.weight, strides=[2, 2])
  %sum = add(%s, %big)
  output y = %sum
}
";
        let mut g = parse(src).unwrap();
        let report = optimize(&mut g);
        assert_eq!((report.fused_relus, report.fused_adds), (2, 0));
        let text = g.to_string();
        assert!(
            text.contains(
                "%up = conv_transpose(%x, @up.weight, strides=[2, 2], post=[relu, sigmoid])"
            ),
            "{text}"
        );
        assert!(text.contains("%sum = add(%up, %big)"), "{text}");
        assert_eq!(parse(&text).unwrap().to_string(), text);
    }

    /// A per-channel `prelu` that is a conv's only reader becomes its post-op, one per conv;
    /// a second, and one after a transposed conv, stay standalone.
    #[test]
    fn fuses_one_prelu_into_the_conv_before_it() {
        let src = "graph g {
  input %x: f32[1, 4, 3, W]
  param @w: f32[4, 4, 1, 1]
  param @s: f32[4]
  %c = conv2d(%x, @w)
  %p = prelu(%c, @s)
  %q = prelu(%p, @s)
  %up = conv_transpose(%q, @w, strides=[2, 2])
  %r = prelu(%up, @s)
  output y = %r
}
";
        let mut g = parse(src).unwrap();
        assert_eq!(optimize(&mut g).fused_relus, 1);
        let text = g.to_string();
        assert!(
            text.contains("%c = conv2d(%x, @w, post=[prelu(@s)])"),
            "{text}"
        );
        assert!(text.contains("%q = prelu(%c, @s)"), "{text}");
        assert!(text.contains("%r = prelu(%up, @s)"), "{text}");
        assert_eq!(parse(&text).unwrap().to_string(), text);
        g.verify().unwrap();
    }

    /// ShuffleNet's channel shuffle of two groups and its split into halves: each half reads
    /// the shuffle's input, the shuffle is gone, and the graph still prints and parses.
    #[test]
    fn composes_a_channel_shuffle_into_its_split() {
        let src = "graph unit {
  input %x: f32[1, 8, 2, W]
  %s = select_channels(%x, select=[0, 4, 1, 5, 2, 6, 3, 7])
  %a = select_channels(%s, select=[0, 1, 2, 3])
  %b = select_channels(%s, select=[4, 5, 6, 7])
  %y = add(%a, %b)
  output y = %y
}
";
        let mut g = parse(src).unwrap();
        assert_eq!(optimize(&mut g).composed_selections, 1);
        let text = g.to_string();
        assert!(
            text.contains("%a = select_channels(%x, select=[0, 4, 1, 5])"),
            "{text}"
        );
        assert!(
            text.contains("%b = select_channels(%x, select=[2, 6, 3, 7])"),
            "{text}"
        );
        assert!(!text.contains("%s ="), "{text}");
        assert_eq!(parse(&text).unwrap().to_string(), text);
    }

    /// A selection stays where another op or a graph output reads it, where its readers
    /// would copy more channels than it has, or where one picks a channel it does not have
    /// (which verification refuses; the pass must not panic first).
    #[test]
    fn keeps_selections_that_composing_would_not_spare() {
        let base = "graph unit {
  input %x: f32[1, 8, 2, W]
  %s = select_channels(%x, select=[0, 4, 1, 5, 2, 6, 3, 7])
  %a = select_channels(%s, select=[0, 1, 2, 3])
  READER
  output y = %a
}
";
        for reader in [
            "%b = relu(%s)\n  output z = %b",
            "output z = %s",
            "%b = select_channels(%s, select=[0, 1, 2, 3, 4, 5, 6, 7])\n  output z = %b",
            "%b = select_channels(%s, select=[9])\n  output z = %b",
        ] {
            let mut g = parse(&base.replace("READER", reader)).unwrap();
            assert_eq!(optimize(&mut g).composed_selections, 0, "{reader}");
            assert!(
                g.to_string().contains("%s = select_channels(%x"),
                "{reader}"
            );
        }
    }

    #[test]
    fn does_not_fuse_a_value_with_two_readers() {
        let src = BLOCK.replace("output y = %out", "output y = %out\n  output z = %bn");
        let mut g = parse(&src).unwrap();
        let report = optimize(&mut g);
        // %c1 -> %bn is foldable (single use), but %bn is an output and read by the add.
        assert_eq!(report.folded_batchnorms, 1);
        assert_eq!(report.fused_adds, 0);
        assert_eq!(report.fused_relus, 0);
    }

    /// ResNet's stem as an exporter writes it, at a small size.
    const STEM: &str = "graph stem {
  input %x: f32[1, 3, 20, W]
  param @conv1.weight: f32[8, 3, 7, 7]
  param @bn1.weight: f32[8]
  param @bn1.bias: f32[8]
  param @bn1.running_mean: f32[8]
  param @bn1.running_var: f32[8]
  %conv1 = conv2d(%x, @conv1.weight, strides=[2, 2], pads=[3, 3, 3, 3])
  %bn1 = batchnorm(%conv1, @bn1.weight, @bn1.bias, @bn1.running_mean, @bn1.running_var, epsilon=1e-5)
  %relu = relu(%bn1)
  %maxpool = maxpool2d(%relu, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
  output y = %maxpool
}
";

    fn output_shape(g: &Graph, bindings: &Bindings) -> Vec<crate::Dim> {
        let shapes = infer_shapes(g, bindings).unwrap();
        shapes.get(g.outputs()[0].1).unwrap().to_vec()
    }

    #[test]
    fn fuses_the_stem_into_one_conv_with_the_pooled_shape() {
        let original = parse(STEM).unwrap();
        let mut g = original.clone();
        let report = optimize(&mut g);
        assert_eq!(
            report,
            PassReport {
                folded_batchnorms: 1,
                batchnorm_convs: 0,
                fused_relus: 1,
                fused_adds: 0,
                fused_pools: 1,
                composed_selections: 0,
            }
        );
        assert_eq!(g.node_count(), 1);
        let text = g.to_string();
        assert!(
            text.contains("%conv1 = conv2d(%x, @conv1.weight.bnfold, bias=@conv1.weight.bnfold_bias, strides=[2, 2], pads=[3, 3, 3, 3], post=[relu, maxpool(kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])])"),
            "{text}"
        );
        // The graph output keeps its name and now reads the conv, which has the pooled shape.
        assert!(text.contains("output y = %conv1"), "{text}");
        let again = parse(&text).unwrap();
        assert_eq!(again.to_string(), text);
        let unbound = Bindings::new();
        assert_eq!(
            output_shape(&again, &unbound),
            output_shape(&original, &unbound)
        );
        assert!(output_shape(&again, &unbound)[3].known().is_none());
        // Height 20 -> 10 (conv) -> 5 (pool); width 31 -> 16 -> 8.
        let w31 = crate::parse_bindings("W=31").unwrap();
        let shapes = infer_shapes(&again, &w31).unwrap();
        assert_eq!(
            shapes.concrete(again.outputs()[0].1),
            Some(vec![1, 8, 5, 8])
        );
    }

    #[test]
    fn fuses_a_pool_whose_result_has_several_readers() {
        // As in ResNet's trunk, where layer1.0 reads the pool twice (conv and residual).
        let src = STEM.replace(
            "  output y = %maxpool",
            "  %twice = add(%maxpool, %maxpool)\n  output y = %twice\n  output pooled = %maxpool",
        );
        let mut g = parse(&src).unwrap();
        assert_eq!(optimize(&mut g).fused_pools, 1);
        let text = g.to_string();
        assert!(text.contains("%twice = add(%conv1, %conv1)"), "{text}");
        assert!(text.contains("output pooled = %conv1"), "{text}");
        assert!(g.node_by_name("maxpool").is_none(), "{text}");
        g.verify().unwrap();
    }

    #[test]
    fn keeps_the_pools_the_caller_keeps() {
        let mut g = parse(STEM).unwrap();
        let mut asked = Vec::new();
        let report = optimize_with(&mut g, |_, conv| {
            asked.push(conv.post_ops.clone());
            false
        });
        // Asked once, about the conv with its relu and without the pool.
        assert_eq!(asked, [vec![PostOp::Relu]]);
        assert_eq!((report.fused_relus, report.fused_pools), (1, 0));
        assert!(g.node_by_name("maxpool").is_some());
    }

    #[test]
    fn does_not_fuse_a_pool_that_shares_the_conv_output() {
        let src = STEM.replace(
            "  output y = %maxpool",
            "  output y = %maxpool\n  output act = %relu",
        );
        let mut g = parse(&src).unwrap();
        let report = optimize(&mut g);
        // The relu fuses into the conv, whose result is then an output besides the pool's input.
        assert_eq!((report.fused_relus, report.fused_pools), (1, 0));
        assert!(g.to_string().contains("output act = %conv1"));
        assert!(g.node_by_name("maxpool").is_some());
        let src = STEM.replace(
            "  output y = %maxpool",
            "  %other = relu(%relu)\n  output y = %maxpool\n  output z = %other",
        );
        let mut g = parse(&src).unwrap();
        let report = optimize(&mut g);
        assert_eq!((report.fused_relus, report.fused_pools), (1, 0));
        assert!(g.node_by_name("maxpool").is_some());
    }

    #[test]
    fn does_not_fuse_an_average_pool() {
        let src = STEM.replace("maxpool2d(%relu", "avgpool2d(%relu");
        let mut g = parse(&src).unwrap();
        let report = optimize(&mut g);
        assert_eq!((report.fused_relus, report.fused_pools), (1, 0));
        assert_eq!(g.node_count(), 2);
    }

    #[test]
    fn does_not_fuse_an_auto_pad_pool_but_folds_into_an_auto_pad_conv() {
        // The pool's window depends on the bound extents, so it stays a node of its own; the
        // conv's auto_pad does not stop its relu from fusing.
        let src = STEM
            .replace("pads=[1, 1, 1, 1])", "auto_pad=same_lower)")
            .replace("pads=[3, 3, 3, 3])", "auto_pad=same_upper)");
        assert!(src.contains("auto_pad=same_lower") && src.contains("auto_pad=same_upper"));
        let mut g = parse(&src).unwrap();
        let report = optimize(&mut g);
        assert_eq!(
            (
                report.folded_batchnorms,
                report.fused_relus,
                report.fused_pools
            ),
            (1, 1, 0)
        );
        let text = g.to_string();
        assert!(text.contains("auto_pad=same_upper, post=[relu])"), "{text}");
        assert!(
            text.contains("maxpool2d(%conv1, kernel=[3, 3], strides=[2, 2], auto_pad=same_lower)"),
            "{text}"
        );
    }

    #[test]
    fn does_not_fuse_a_pool_after_a_residual() {
        let src = "graph g {
  input %x: f32[1, 4, 6, 6]
  param @w: f32[4, 4, 3, 3]
  %c = conv2d(%x, @w, pads=[1, 1, 1, 1], post=[add(%x)])
  %p = maxpool2d(%c, kernel=[2, 2], strides=[2, 2])
  output y = %p
}
";
        let mut g = parse(src).unwrap();
        assert_eq!(fuse_pools(&mut g), 0);
        assert_eq!(g.to_string(), src);
    }

    #[test]
    fn fuses_nothing_after_a_fused_pool() {
        let src = "graph g {
  input %x: f32[1, 4, 6, 6]
  param @w: f32[4, 4, 3, 3]
  %c = conv2d(%x, @w, pads=[1, 1, 1, 1], post=[maxpool(kernel=[2, 2], strides=[2, 2])])
  %r = relu(%c)
  %p = maxpool2d(%r, kernel=[2, 2])
  output y = %p
}
";
        let mut g = parse(src).unwrap();
        let report = optimize(&mut g);
        assert_eq!((report.fused_relus, report.fused_pools), (0, 0));
        assert_eq!(g.to_string(), src);
    }

    #[test]
    fn folded_parameters_match_batchnorm_arithmetic() {
        let mut g = parse(BLOCK).unwrap();
        let params = Params::random(&g, 3);
        optimize(&mut g);
        let mut folded = params.clone();
        folded.materialize(&g).unwrap();
        let w = &params.get("c1.weight").unwrap().data;
        let s = &params.get("bn.weight").unwrap().data;
        let var = &params.get("bn.running_var").unwrap().data;
        let fw = &folded.get("c1.weight.bnfold").unwrap().data;
        for o in 0..4 {
            let k = 1.0 / (var[o] as f64 + 1e-5).sqrt() * s[o] as f64;
            for i in 0..36 {
                let idx = o * 36 + i;
                assert!((fw[idx] as f64 - w[idx] as f64 * k).abs() < 1e-6);
            }
        }
        let b = &params.get("bn.bias").unwrap().data;
        let m = &params.get("bn.running_mean").unwrap().data;
        let fb = &folded.get("c1.weight.bnfold_bias").unwrap().data;
        for o in 0..4 {
            let expect = -(m[o] as f64) * s[o] as f64 / (var[o] as f64 + 1e-5).sqrt() + b[o] as f64;
            assert!((fb[o] as f64 - expect).abs() < 1e-6);
        }
    }
}
