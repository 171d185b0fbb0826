//! Running a whole graph: validation through the IR, then one op at a time in program order.

use std::borrow::Cow;

use primjit_ir::{
    Bindings, Dim, Graph, Op, Param, ParamError, Params, PostOp, ResizeSize, Tensor, Value,
    VerifyError,
};

use crate::ops::{self, ConvAttrs, PoolAttrs, Post};

/// Why [`run_graph`] could not run a graph on the given inputs and parameters.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ReferenceError {
    /// The graph is invalid, or an input is missing, unknown or of the wrong shape.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// A declared parameter is missing or has the wrong shape.
    #[error(transparent)]
    Param(#[from] ParamError),
    /// A derived parameter (from batch-norm folding) has no value yet: call
    /// [`Params::materialize`] for the rewritten graph first.
    #[error("derived parameter @{name} has no value (call Params::materialize first)")]
    Unmaterialized { name: String },
    /// The same input name appears twice among the inputs. Give each input once.
    #[error("input %{name} is given twice")]
    DuplicateInput { name: String },
    /// An input tensor with a zero-sized dimension, which the IR's shapes never have. Give every
    /// dimension at least 1.
    #[error("input %{name} has shape {shape:?}, but every dimension must be at least 1")]
    EmptyInput { name: String, shape: Vec<usize> },
    /// A tensor whose data does not fill its shape; `subject` is `%input` or `@param`. Make the
    /// data length the product of the shape.
    #[error("{subject}: the tensor has {found} elements but its shape {shape:?} needs {expected}")]
    BadTensor {
        subject: String,
        shape: Vec<usize>,
        expected: usize,
        found: usize,
    },
}

/// Checks that `t`'s data fills its shape.
fn check_len(subject: String, t: &Tensor) -> Result<(), ReferenceError> {
    let expected = t
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match expected {
        Some(expected) if expected == t.data.len() => Ok(()),
        _ => Err(ReferenceError::BadTensor {
            subject,
            shape: t.shape.clone(),
            expected: expected.unwrap_or(usize::MAX),
            found: t.data.len(),
        }),
    }
}

/// Checks what shape inference takes for granted: every operand and output is a value of this
/// graph defined before its use, and every parameter operand is one of its parameters.
fn check_structure(graph: &Graph) -> Result<(), VerifyError> {
    let value_count = graph.values().count();
    let param_count = graph.params().count();
    let mut defined = vec![false; value_count];
    let fail = |subject: String, message: String| {
        Err(VerifyError {
            loc: None,
            subject,
            message,
        })
    };
    let name = |v: Value| {
        if v.index() < value_count {
            format!("%{}", graph.value_name(v))
        } else {
            format!("value #{}", v.index())
        }
    };
    for input in graph.inputs() {
        if input
            .shape
            .iter()
            .any(|d| !matches!(d, Dim::Known(_) | Dim::Sym(_)))
        {
            return fail(
                name(input.value),
                "an input's dimensions must be numbers or symbols".into(),
            );
        }
        defined[input.value.index()] = true;
    }
    for (_, node) in graph.nodes() {
        let subject = name(node.result);
        for v in node.op.value_operands() {
            if !defined.get(v.index()).copied().unwrap_or(false) {
                return fail(
                    subject,
                    format!("operand {} is not defined before this node", name(v)),
                );
            }
        }
        if let Some(p) = node
            .op
            .param_operands()
            .into_iter()
            .find(|p| p.index() >= param_count)
        {
            return fail(
                subject,
                format!("parameter #{} does not belong to this graph", p.index()),
            );
        }
        match defined.get_mut(node.result.index()) {
            Some(d) if !*d => *d = true,
            _ => {
                return fail(
                    subject,
                    "the node's result is not a fresh value of this graph".into(),
                );
            }
        }
    }
    for (_, data) in graph.params() {
        if let Some(p) = data
            .derived
            .iter()
            .flat_map(|d| d.sources())
            .find(|p| p.index() >= param_count)
        {
            return fail(
                format!("@{}", data.name),
                format!(
                    "source parameter #{} does not belong to this graph",
                    p.index()
                ),
            );
        }
    }
    for (output, v) in graph.outputs() {
        if !defined.get(v.index()).copied().unwrap_or(false) {
            return fail(
                format!("output {output}"),
                format!("reads {}, which nothing defines", name(*v)),
            );
        }
    }
    Ok(())
}

/// Runs `graph` on `inputs`, given by input name (without `%`), with `params`.
///
/// Symbols are bound from the input tensors' shapes ([`Graph::bind_inputs`]) and the graph is
/// verified with those bindings ([`primjit_ir::infer_shapes`]). Every declared parameter must be
/// present with its declared shape, derived ones included: call [`Params::materialize`] after
/// rewriting a graph with [`primjit_ir::passes`] (values of derived parameters are taken as
/// they are, not recomputed). Returns the outputs by name, in the graph's order.
///
/// Never panics on bad input: errors name the input, parameter or node at fault and, for a
/// shape mismatch, both shapes.
pub fn run_graph(
    graph: &Graph,
    params: &Params,
    inputs: &[(&str, &Tensor)],
) -> Result<Vec<(String, Tensor)>, ReferenceError> {
    check_structure(graph)?;
    for (i, (name, t)) in inputs.iter().enumerate() {
        if inputs[..i].iter().any(|(n, _)| n == name) {
            return Err(ReferenceError::DuplicateInput {
                name: name.to_string(),
            });
        }
        check_len(format!("%{name}"), t)?;
        if t.shape.contains(&0) {
            return Err(ReferenceError::EmptyInput {
                name: name.to_string(),
                shape: t.shape.clone(),
            });
        }
    }
    let given: Vec<(&str, &[usize])> = inputs
        .iter()
        .map(|(n, t)| (*n, t.shape.as_slice()))
        .collect();
    let bindings = graph.bind_inputs(&given, &Bindings::new())?;
    let shapes = primjit_ir::infer_shapes(graph, &bindings)?;
    for (_, data) in graph.params() {
        match params.get(&data.name) {
            None if data.derived.is_some() => {
                return Err(ReferenceError::Unmaterialized {
                    name: data.name.clone(),
                });
            }
            None => {
                return Err(ParamError::Missing {
                    name: data.name.clone(),
                    expected: data.shape.clone(),
                }
                .into());
            }
            Some(t) if t.shape != data.shape => {
                return Err(ParamError::Shape {
                    name: data.name.clone(),
                    expected: data.shape.clone(),
                    found: t.shape.clone(),
                }
                .into());
            }
            Some(t) => check_len(format!("@{}", data.name), t)?,
        }
    }

    // The tensor of each live value; a value is dropped after its last reader.
    let mut values: Vec<Option<Cow<'_, Tensor>>> = vec![None; graph.values().count()];
    let mut uses = graph.use_counts();
    for input in graph.inputs() {
        let name = graph.value_name(input.value);
        let (_, t) = inputs
            .iter()
            .find(|(n, _)| *n == name)
            .expect("bind_inputs checked every input is given");
        values[input.value.index()] = Some(Cow::Borrowed(*t));
    }
    let param = |p| {
        params
            .get(&graph.param(p).name)
            .expect("parameters were checked")
    };
    for (_, node) in graph.nodes() {
        let value = |v: Value| {
            values[v.index()]
                .as_deref()
                .expect("operands are defined before use")
        };
        let out = match &node.op {
            Op::Conv2d(c) => {
                let post = post_ops(&c.post_ops, value, |p| param(p));
                let x = value(c.input);
                let w = param(c.weight);
                let attrs = ConvAttrs::at(c, [w.shape[2], w.shape[3]], [x.shape[2], x.shape[3]])
                    .expect("shape inference resolved the padding at these shapes");
                let y = ops::conv2d(x, w, c.bias.map(param), &attrs, &post);
                // A fused max pool (always the last post-op) pools the rounded output, as a
                // separate `maxpool2d` would: rounding is monotonic, so the result is still
                // rounded once.
                match c.post_ops.last() {
                    Some(PostOp::MaxPool(window)) => ops::pool2d(&y, &PoolAttrs::max(window)),
                    _ => y,
                }
            }
            Op::Pool2d(p) => {
                let x = value(p.input);
                let attrs = PoolAttrs::at(p, [x.shape[2], x.shape[3]])
                    .expect("shape inference resolved the padding at these shapes");
                ops::pool2d(x, &attrs)
            }
            Op::GlobalPool { kind, input } => ops::global_pool(value(*input), *kind),
            Op::Relu { input } => ops::relu(value(*input)),
            Op::Add { lhs, rhs } => ops::add(value(*lhs), value(*rhs)),
            Op::BatchNorm(b) => ops::batchnorm(
                value(b.input),
                param(b.scale),
                param(b.bias),
                param(b.mean),
                param(b.var),
                b.epsilon,
            ),
            Op::Act { act, input } => ops::activation(value(*input), *act),
            Op::PRelu { input, slope } => ops::prelu(value(*input), param(*slope)),
            Op::Binary { kind, lhs, rhs } => ops::binary(*kind, value(*lhs), value(*rhs)),
            Op::Concat { inputs } => {
                let inputs: Vec<&Tensor> = inputs.iter().map(|&v| value(v)).collect();
                ops::concat(&inputs)
            }
            Op::SelectChannels { input, select } => ops::select_channels(value(*input), select),
            Op::ConvTranspose(ct) => ops::conv_transpose(
                value(ct.input),
                param(ct.weight),
                ct.bias.map(param),
                &ops::ConvTransposeAttrs::from(ct),
                &post_ops(&ct.post_ops, value, |p| param(p)),
            ),
            Op::Resize(r) => {
                let out = shapes.concrete(node.result).expect("bound above");
                let scale = match r.size {
                    ResizeSize::Scale(factors) => Some(factors),
                    _ => None,
                };
                ops::resize(value(r.input), r.mode, r.coord, [out[2], out[3]], scale)
            }
        };
        debug_assert_eq!(
            Some(&out.shape),
            shapes.concrete(node.result).as_ref(),
            "%{}",
            graph.value_name(node.result)
        );
        for v in node.op.value_operands() {
            uses[v.index()] -= 1;
            if uses[v.index()] == 0 {
                values[v.index()] = None;
            }
        }
        values[node.result.index()] = Some(Cow::Owned(out));
    }
    Ok(graph
        .outputs()
        .iter()
        .map(|(name, v)| {
            (
                name.clone(),
                values[v.index()]
                    .as_deref()
                    .expect("outputs are live")
                    .clone(),
            )
        })
        .collect())
}

#[cfg(test)]
mod tests;

/// The reference's post-ops of a conv's (a fused max pool aside, which the caller applies).
fn post_ops<'a>(
    posts: &[PostOp],
    value: impl Fn(Value) -> &'a Tensor,
    param: impl Fn(Param) -> &'a Tensor,
) -> Vec<Post<'a>> {
    posts
        .iter()
        .filter_map(|p| match *p {
            PostOp::PRelu(slope) => Some(Post::PRelu(param(slope))),
            PostOp::Relu => Some(Post::Relu),
            PostOp::Add(r) => Some(Post::Add(value(r))),
            PostOp::Clip { lo, hi } => Some(Post::Clip { lo, hi }),
            PostOp::MaxPool(_) => None,
            PostOp::Act(a) => Some(Post::Act(a)),
        })
        .collect()
}
