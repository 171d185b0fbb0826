//! Verification and shape inference: ranks, channel counts, attributes, and every value's shape.

use crate::auto_pad::AutoPad;
use crate::dim::{Bindings, Dim, WindowError};
use crate::error::{SourceLoc, VerifyError};
use crate::graph::{Graph, Op, Pads, PoolWindow, PostOp, Value};
use crate::resize::{ResizeSize, ScaleFactor};

/// The largest number of elements any tensor may have: 2^31, so that every byte offset a
/// kernel forms fits in a signed 32-bit displacement times four and no count overflows.
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 31;

/// The largest stride, dilation or pad of a convolution or pooling window: 2^29. Compiled
/// kernels address rows with i64 byte offsets, a step times a row of up to 2^33 bytes, so code
/// generation refuses larger ones (its `MAX_STEP`, the same bound); verification refuses them
/// first, at the node.
pub const MAX_STEP: usize = 1 << 29;

/// The inferred shape of every value of a graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Shapes {
    shapes: Vec<Option<Vec<Dim>>>,
}

impl Shapes {
    /// The shape of `v`, or `None` for a value no live node defines (after a rewrite).
    pub fn get(&self, v: Value) -> Option<&[Dim]> {
        self.shapes[v.index()].as_deref()
    }

    /// The shape of `v` when every dimension is known.
    pub fn concrete(&self, v: Value) -> Option<Vec<usize>> {
        self.get(v)?
            .iter()
            .map(|d| d.known().map(|n| n as usize))
            .collect()
    }

    /// The shape of `v` as text, e.g. `[1, 64, 80, W]`.
    pub fn describe(&self, v: Value) -> String {
        match self.get(v) {
            Some(dims) => describe(dims),
            None => "[?]".to_string(),
        }
    }
}

fn describe(dims: &[Dim]) -> String {
    format!(
        "[{}]",
        dims.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The output extent of a convolution along one axis, or `None` when the window does not fit.
pub fn conv_output_extent(
    input: usize,
    pad_begin: usize,
    pad_end: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
) -> Option<usize> {
    pool_output_extent(input, pad_begin, pad_end, kernel, stride, dilation, false)
}

/// The output extent of a pooling window along one axis, or `None` when it does not fit.
pub fn pool_output_extent(
    input: usize,
    pad_begin: usize,
    pad_end: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    ceil: bool,
) -> Option<usize> {
    let extent = kernel
        .checked_sub(1)?
        .checked_mul(dilation)?
        .checked_add(1)?;
    crate::dim::window_extent(
        input as u64,
        pad_begin as u64,
        pad_end as u64,
        extent as u64,
        stride as u64,
        ceil,
    )
    .ok()
    .map(|n| n as usize)
}

/// One axis of a window as the IR spells it: its name for errors, its padding, its taps and
/// their spacing, its stride, and whether a last partial window counts.
#[derive(Clone, Copy)]
struct AxisWindow<'a> {
    axis: &'a str,
    pad_begin: usize,
    pad_end: usize,
    kernel: usize,
    dilation: usize,
    stride: usize,
    ceil: bool,
}

impl AxisWindow<'static> {
    /// The height and width axes of a 2-D window.
    fn pair(
        pads: Pads,
        kernel: [usize; 2],
        dilations: [usize; 2],
        strides: [usize; 2],
        ceil: bool,
    ) -> [Self; 2] {
        let axis = |axis, pad_begin, pad_end, i: usize| AxisWindow {
            axis,
            pad_begin,
            pad_end,
            kernel: kernel[i],
            dilation: dilations[i],
            stride: strides[i],
            ceil,
        };
        [
            axis("height", pads.top, pads.bottom, 0),
            axis("width", pads.left, pads.right, 1),
        ]
    }
}

struct Ctx<'g> {
    graph: &'g Graph,
    subject: String,
    loc: Option<SourceLoc>,
}

impl Ctx<'_> {
    fn fail<T>(&self, message: impl Into<String>) -> Result<T, VerifyError> {
        Err(VerifyError {
            loc: self.loc,
            subject: self.subject.clone(),
            message: message.into(),
        })
    }

    fn positive(&self, what: &str, values: &[usize]) -> Result<(), VerifyError> {
        if values.contains(&0) {
            return self.fail(format!("{what} must be at least 1, found {values:?}"));
        }
        Ok(())
    }

    /// Strides, dilations and pads: at least 1 (but pads) and at most [`MAX_STEP`].
    fn window_steps(
        &self,
        strides: &[usize; 2],
        dilations: &[usize; 2],
        pads: &Pads,
    ) -> Result<(), VerifyError> {
        self.positive("strides", strides)?;
        self.positive("dilations", dilations)?;
        let pads = [pads.top, pads.left, pads.bottom, pads.right];
        for (what, values) in [
            ("strides", &strides[..]),
            ("dilations", &dilations[..]),
            ("pads", &pads[..]),
        ] {
            if values.iter().any(|&v| v > MAX_STEP) {
                return self.fail(format!(
                    "{what} must be at most {MAX_STEP}, found {values:?}"
                ));
            }
        }
        Ok(())
    }

    fn rank4<'s>(
        &self,
        shapes: &'s [Option<Vec<Dim>>],
        v: Value,
        role: &str,
    ) -> Result<&'s [Dim], VerifyError> {
        let Some(dims) = shapes[v.index()].as_deref() else {
            return self.fail(format!(
                "{role} %{} is used before it is defined",
                self.graph.value_name(v)
            ));
        };
        if dims.len() != 4 {
            return self.fail(format!(
                "{role} %{} must have rank 4 (NCHW), found {}",
                self.graph.value_name(v),
                describe(dims)
            ));
        }
        Ok(dims)
    }

    fn channels(&self, dims: &[Dim], v: Value) -> Result<u64, VerifyError> {
        match dims[1].known() {
            Some(c) => Ok(c),
            None => self.fail(format!(
                "the channel dimension of %{} must be a number, found `{}`",
                self.graph.value_name(v),
                dims[1]
            )),
        }
    }

    /// A window's pads over `x` (rank 4) and whether each axis is symbolic under `auto`: its
    /// explicit `pads`, or `auto` resolved on each axis whose input extent is known. An axis
    /// of `auto` over a symbolic extent has pads 0 here and `true`: its output is
    /// `ceil(input / stride)` however the padding splits ([`Ctx::axis_extent`]).
    fn resolve_pads(
        &self,
        x: &[Dim],
        pads: Pads,
        auto: Option<AutoPad>,
        kernel: [usize; 2],
        strides: [usize; 2],
        dilations: [usize; 2],
    ) -> Result<(Pads, [bool; 2]), VerifyError> {
        let Some(auto) = auto else {
            return Ok((pads, [false, false]));
        };
        if !pads.is_zero() {
            return self.fail(format!(
                "pads and auto_pad={auto} are both set: auto_pad takes no pads"
            ));
        }
        // Strides and dilations first, so that an error names them rather than the padding.
        self.window_steps(&strides, &dilations, &pads)?;
        let mut sides = [(0, 0); 2];
        let mut symbolic = [false; 2];
        for (axis, name) in ["height", "width"].into_iter().enumerate() {
            match x[2 + axis].known() {
                Some(n) => {
                    let resolved = usize::try_from(n).ok().and_then(|n| {
                        auto.axis_pads(n, kernel[axis], strides[axis], dilations[axis])
                    });
                    let Some(p) = resolved else {
                        return self
                            .fail(format!("the {name} padding of auto_pad={auto} overflows"));
                    };
                    sides[axis] = p;
                }
                None => symbolic[axis] = true,
            }
        }
        let [(top, bottom), (left, right)] = sides;
        Ok((
            Pads {
                top,
                left,
                bottom,
                right,
            },
            symbolic,
        ))
    }

    /// The extent a window of `kernel` taps `dilation` apart spans, at most `i64::MAX`.
    fn extent(&self, axis: &str, kernel: usize, dilation: usize) -> Result<u64, VerifyError> {
        let extent = (dilation as u64)
            .checked_mul(kernel as u64 - 1)
            .and_then(|e| e.checked_add(1))
            .filter(|&e| e <= i64::MAX as u64);
        match extent {
            Some(e) => Ok(e),
            None => self.fail(format!("the {axis} window extent overflows")),
        }
    }

    /// The output extent of one axis of a window: [`Ctx::window`], or for an `auto_pad` axis
    /// over a symbolic extent (`auto`), `ceil(input / stride)`, which is the window count of a
    /// 1-tap window with no padding, `floor((input - 1) / stride) + 1`.
    fn axis_extent(&self, input: &Dim, auto: bool, w: AxisWindow<'_>) -> Result<Dim, VerifyError> {
        if !auto {
            return self.window(input, w);
        }
        // The window's extent must be representable, as with explicit pads.
        self.extent(w.axis, w.kernel, w.dilation)?;
        let one_tap = AxisWindow {
            pad_begin: 0,
            pad_end: 0,
            kernel: 1,
            dilation: 1,
            ceil: false,
            ..w
        };
        self.window(input, one_tap)
    }

    fn window(&self, input: &Dim, w: AxisWindow<'_>) -> Result<Dim, VerifyError> {
        let AxisWindow {
            axis,
            pad_begin,
            pad_end,
            kernel,
            dilation,
            stride,
            ceil,
        } = w;
        let extent = self.extent(axis, kernel, dilation)?;
        if pad_begin as u128 + pad_end as u128 > i64::MAX as u128 {
            return self.fail(format!("the {axis} padding overflows"));
        }
        input.window(pad_begin as u64, pad_end as u64, extent, stride as u64, ceil).or_else(|WindowError { padded_input, extent }| {
            self.fail(format!(
                "output {axis} would be less than 1: the padded input {axis} is {padded_input} but the window spans {extent}"
            ))
        })
    }

    fn same_shape(&self, a: &[Dim], b: &[Dim], what: &str) -> Result<(), VerifyError> {
        if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.provably_differs(y)) {
            return self.fail(format!(
                "{what}: {} and {} differ",
                describe(a),
                describe(b)
            ));
        }
        Ok(())
    }

    fn param_shape(
        &self,
        p: crate::Param,
        expected: &[usize],
        role: &str,
    ) -> Result<(), VerifyError> {
        let data = self.graph.param(p);
        if data.shape != expected {
            return self.fail(format!(
                "{role} @{} must have shape {expected:?}, found {:?}",
                data.name, data.shape
            ));
        }
        Ok(())
    }
}

/// Every window position along an axis must cover at least one input cell, or a pooling
/// output would reduce over padding only.
/// `axis` names the axis in the error (`row`, `column`); `w` is its window.
fn check_windows_touch_input(
    ctx: &Ctx<'_>,
    axis: &str,
    input: u64,
    out: u64,
    w: AxisWindow<'_>,
) -> Result<(), VerifyError> {
    let AxisWindow {
        pad_begin,
        kernel,
        stride,
        dilation,
        ..
    } = w;
    // A window that starts inside the input covers its first cell, and one that starts past
    // the input covers none; only the windows that start in the begin padding need a look.
    // (A loop over every position ran as long as the output extent, not checked yet: 2^50
    // times for a kernel of 2^50 over as much padding.)
    let stride = stride.max(1) as u128;
    let starting_in_padding = (pad_begin as u128).div_ceil(stride).min(out as u128);
    if starting_in_padding > MAX_TENSOR_ELEMENTS as u128 {
        return ctx.fail(format!(
            "the pooling output {axis} would exceed {MAX_TENSOR_ELEMENTS} positions"
        ));
    }
    let only_padding = |o: u128| {
        ctx.fail(format!(
            "pooling window at output {axis} {o} covers only padding"
        ))
    };
    for o in 0..starting_in_padding {
        // The window's cells are `start + k * dilation` for k in 0..kernel; the first one at
        // or after 0 is the only candidate inside the input.
        let start = o as i128 * stride as i128 - pad_begin as i128;
        let dilation = dilation.max(1) as i128;
        let first = if start >= 0 {
            0
        } else {
            (-start + dilation - 1) / dilation
        };
        let touches = first < kernel as i128 && start + first * dilation < input as i128;
        if !touches {
            return only_padding(o);
        }
    }
    let past_input = (input as u128 + pad_begin as u128).div_ceil(stride);
    if past_input < out as u128 {
        return only_padding(past_input);
    }
    Ok(())
}

/// The shape of max or average pooling `x` (a rank-4 shape with known channels) with
/// `window`: the rules of `maxpool2d` and `avgpool2d`, and of a conv's `maxpool` post-op on the
/// conv's output.
fn pool_shape(
    ctx: &Ctx<'_>,
    x: &[Dim],
    window: &PoolWindow,
    auto: Option<AutoPad>,
) -> Result<Vec<Dim>, VerifyError> {
    ctx.positive("kernel", &window.kernel)?;
    let (pads, symbolic) = ctx.resolve_pads(
        x,
        window.pads,
        auto,
        window.kernel,
        window.strides,
        window.dilations,
    )?;
    ctx.window_steps(&window.strides, &window.dilations, &pads)?;
    let [rows, cols] = AxisWindow::pair(
        pads,
        window.kernel,
        window.dilations,
        window.strides,
        window.ceil_mode,
    );
    let oh = ctx.axis_extent(&x[2], symbolic[0], rows)?;
    let ow = ctx.axis_extent(&x[3], symbolic[1], cols)?;
    if let (Some(h), Some(oh)) = (x[2].known(), oh.known()) {
        check_windows_touch_input(ctx, "row", h, oh, rows)?;
    }
    if let (Some(w), Some(ow)) = (x[3].known(), ow.known()) {
        check_windows_touch_input(ctx, "column", w, ow, cols)?;
    }
    Ok(vec![x[0].clone(), x[1].clone(), oh, ow])
}

fn element_count(dims: &[Dim]) -> Option<u64> {
    dims.iter()
        .try_fold(1u64, |acc, d| acc.checked_mul(d.known().unwrap_or(1)))
}

/// Verifies the graph and infers every value's shape, resolving the given symbol bindings.
///
/// Symbols left unbound stay symbolic; checks that need their values (extents, residual
/// shapes) are made again once they are bound. An empty `bindings` still validates ranks,
/// channel counts and attributes.
pub fn infer_shapes(graph: &Graph, bindings: &Bindings) -> Result<Shapes, VerifyError> {
    let mut shapes: Vec<Option<Vec<Dim>>> = vec![None; graph.value_names.len()];

    for (_, param) in graph.params() {
        let ctx = Ctx {
            graph,
            subject: format!("@{}", param.name),
            loc: param.loc,
        };
        let count = param
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        if count.is_none_or(|c| c > MAX_TENSOR_ELEMENTS) {
            return ctx.fail(format!(
                "{:?} has more than {MAX_TENSOR_ELEMENTS} elements",
                param.shape
            ));
        }
        if let Some(d) = &param.derived {
            for source in d.source_shapes(&param.shape).or_else(|why| ctx.fail(why))? {
                ctx.param_shape(source.param, &source.shape, source.role)?;
            }
        }
    }

    for input in &graph.inputs {
        let ctx = Ctx {
            graph,
            subject: format!("%{}", graph.value_name(input.value)),
            loc: input.loc,
        };
        // Numbers and symbols only: `bind_inputs` binds a given tensor's extents to them, and
        // a window (which only the API can declare) would leave its extent unchecked.
        if input
            .shape
            .iter()
            .any(|d| !matches!(d, Dim::Known(_) | Dim::Sym(_)))
        {
            return ctx.fail(format!(
                "a graph input's dimensions must be numbers or symbols, found {}",
                describe(&input.shape)
            ));
        }
        let dims = input
            .shape
            .iter()
            // Numbers and symbols resolve without error; the fallback is never taken.
            .map(|d| d.resolve(bindings).unwrap_or_else(|_| d.clone()))
            .collect::<Vec<_>>();
        // Every operation reads NCHW values, and a graph input passed straight to an output
        // is one too: the runtime hands out outputs as 4-dimensional tensors.
        if dims.len() != 4 {
            return ctx.fail(format!(
                "a graph input must have rank 4 (NCHW), found {}",
                describe(&dims)
            ));
        }
        if element_count(&dims).is_none_or(|c| c > MAX_TENSOR_ELEMENTS) {
            return ctx.fail(format!(
                "{} has more than {MAX_TENSOR_ELEMENTS} elements",
                describe(&dims)
            ));
        }
        shapes[input.value.index()] = Some(dims);
    }

    for (_, node) in graph.nodes() {
        let ctx = Ctx {
            graph,
            subject: format!("%{}", graph.value_name(node.result)),
            loc: node.loc,
        };
        let out = infer_node(&ctx, &shapes, &node.op)?;
        if element_count(&out).is_none_or(|c| c > MAX_TENSOR_ELEMENTS) {
            return ctx.fail(format!(
                "output {} has more than {MAX_TENSOR_ELEMENTS} elements",
                describe(&out)
            ));
        }
        shapes[node.result.index()] = Some(out);
    }
    Ok(Shapes { shapes })
}

fn infer_node(
    ctx: &Ctx<'_>,
    shapes: &[Option<Vec<Dim>>],
    op: &Op,
) -> Result<Vec<Dim>, VerifyError> {
    let graph = ctx.graph;
    Ok(match op {
        Op::Conv2d(c) => {
            let x = ctx.rank4(shapes, c.input, "the input")?;
            let channels = ctx.channels(x, c.input)?;
            let w = graph.param(c.weight);
            if w.shape.len() != 4 {
                return ctx.fail(format!(
                    "the weight @{} must have rank 4 (OIHW), found {:?}",
                    w.name, w.shape
                ));
            }
            let [o, i, kh, kw] = [w.shape[0], w.shape[1], w.shape[2], w.shape[3]];
            ctx.positive("the weight's output and input channels", &[o, i])?;
            ctx.positive("kernel", &[kh, kw])?;
            ctx.positive("groups", &[c.groups])?;
            let (pads, symbolic) =
                ctx.resolve_pads(x, c.pads, c.auto_pad, [kh, kw], c.strides, c.dilations)?;
            ctx.window_steps(&c.strides, &c.dilations, &pads)?;
            let g = c.groups as u64;
            if channels % g != 0 {
                return ctx.fail(format!(
                    "groups ({g}) must divide the input channels ({channels})"
                ));
            }
            if !(o as u64).is_multiple_of(g) {
                return ctx.fail(format!(
                    "groups ({g}) must divide the output channels ({o}) of @{}",
                    w.name
                ));
            }
            // In u128, so that no product of a weight's channels and groups wraps.
            let expected = i as u128 * g as u128;
            if expected != channels as u128 {
                return ctx.fail(format!(
                    "channel mismatch: the input has {channels} channels but @{} expects {expected} ({i} per group x {g} groups)",
                    w.name,
                ));
            }
            if let Some(b) = c.bias {
                ctx.param_shape(b, &[o], "the bias")?;
            }
            let [rows, cols] = AxisWindow::pair(pads, [kh, kw], c.dilations, c.strides, false);
            let oh = ctx.axis_extent(&x[2], symbolic[0], rows)?;
            let ow = ctx.axis_extent(&x[3], symbolic[1], cols)?;
            let out = vec![x[0].clone(), Dim::Known(o as u64), oh, ow];
            for (i, post) in c.post_ops.iter().enumerate() {
                match post {
                    PostOp::Add(r) => {
                        let rs = ctx.rank4(shapes, *r, "the residual")?;
                        ctx.same_shape(
                            &out,
                            rs,
                            &format!(
                                "the residual %{} must have the output's shape",
                                graph.value_name(*r)
                            ),
                        )?;
                    }
                    PostOp::Clip { lo, hi } if lo > hi => {
                        return ctx
                            .fail(format!("clip needs lo <= hi, found clip({lo:?}, {hi:?})"));
                    }
                    PostOp::MaxPool(_) if i + 1 != c.post_ops.len() => {
                        return ctx.fail("maxpool must be the last post-op");
                    }
                    PostOp::PRelu(slope) => {
                        let prelus = c.post_ops.iter().filter(|p| matches!(p, PostOp::PRelu(_)));
                        if prelus.count() > 1 {
                            return ctx.fail("a conv takes at most one prelu post-op");
                        }
                        ctx.param_shape(*slope, &[o], "the prelu slope")?;
                    }
                    _ => {}
                }
            }
            match c.post_ops.last() {
                Some(PostOp::MaxPool(window)) => {
                    // The full-resolution output is held to the limit of a stored tensor too,
                    // so that a graph is valid with the pool fused exactly when it is valid
                    // with a separate `maxpool2d`.
                    if element_count(&out).is_none_or(|n| n > MAX_TENSOR_ELEMENTS) {
                        return ctx.fail(format!(
                            "the output before its maxpool post-op, {}, has more than {MAX_TENSOR_ELEMENTS} elements",
                            describe(&out)
                        ));
                    }
                    pool_shape(ctx, &out, window, None).map_err(|e| VerifyError {
                        message: format!("maxpool post-op: {}", e.message),
                        ..e
                    })?
                }
                _ => out,
            }
        }
        Op::ConvTranspose(c) => {
            let x = ctx.rank4(shapes, c.input, "the input")?;
            let channels = ctx.channels(x, c.input)?;
            let w = graph.param(c.weight);
            if w.shape.len() != 4 {
                return ctx.fail(format!(
                    "the weight @{} must have rank 4 ([I, O / groups, KH, KW]), found {:?}",
                    w.name, w.shape
                ));
            }
            let [i, o, kh, kw] = [w.shape[0], w.shape[1], w.shape[2], w.shape[3]];
            ctx.positive("the weight's input and output channels", &[i, o])?;
            ctx.positive("kernel", &[kh, kw])?;
            ctx.positive("groups", &[c.groups])?;
            ctx.window_steps(&c.strides, &c.dilations, &c.pads)?;
            if c.output_padding.iter().any(|&p| p > MAX_STEP) {
                return ctx.fail(format!(
                    "output_padding must be at most {MAX_STEP}, found {:?}",
                    c.output_padding
                ));
            }
            for axis in 0..2 {
                if c.output_padding[axis] >= c.strides[axis].max(c.dilations[axis]) {
                    return ctx.fail(format!(
                        "output_padding {:?} must be less than the stride {:?} or the dilation {:?} on each axis",
                        c.output_padding, c.strides, c.dilations
                    ));
                }
            }
            if i as u64 != channels {
                return ctx.fail(format!(
                    "channel mismatch: the input has {channels} channels but @{} expects {i}",
                    w.name
                ));
            }
            if i % c.groups != 0 {
                return ctx.fail(format!(
                    "groups ({}) must divide the input channels ({i})",
                    c.groups
                ));
            }
            let Some(out_channels) = o.checked_mul(c.groups) else {
                return ctx.fail("the output channels overflow");
            };
            if let Some(b) = c.bias {
                ctx.param_shape(b, &[out_channels], "the bias")?;
            }
            let dim = |axis: &str, input: &Dim, k: usize, a: usize, pb: usize, pe: usize| {
                crate::conv_transpose::conv_transpose_dim(
                    input,
                    pb,
                    pe,
                    k,
                    c.strides[a],
                    c.dilations[a],
                    c.output_padding[a],
                )
                .map_or_else(
                    || {
                        ctx.fail(format!(
                            "output {axis} would be less than 1 or overflows: the input {axis} {input} with kernel {k}, stride {}, dilation {}, pads {pb} and {pe}, output_padding {}",
                            c.strides[a], c.dilations[a], c.output_padding[a]
                        ))
                    },
                    Ok,
                )
            };
            let oh = dim("height", &x[2], kh, 0, c.pads.top, c.pads.bottom)?;
            let ow = dim("width", &x[3], kw, 1, c.pads.left, c.pads.right)?;
            vec![x[0].clone(), Dim::Known(out_channels as u64), oh, ow]
        }
        Op::Pool2d(p) => {
            let x = ctx.rank4(shapes, p.input, "the input")?;
            ctx.channels(x, p.input)?;
            pool_shape(ctx, x, &p.window, p.auto_pad)?
        }
        Op::GlobalPool { input, .. } => {
            let x = ctx.rank4(shapes, *input, "the input")?;
            ctx.channels(x, *input)?;
            vec![x[0].clone(), x[1].clone(), Dim::Known(1), Dim::Known(1)]
        }
        Op::Relu { input } => ctx.rank4(shapes, *input, "the input")?.to_vec(),
        Op::Add { lhs, rhs } => {
            let a = ctx.rank4(shapes, *lhs, "the left operand")?;
            let b = ctx.rank4(shapes, *rhs, "the right operand")?;
            ctx.same_shape(a, b, "add needs operands of one shape")?;
            a.to_vec()
        }
        Op::BatchNorm(b) => {
            let x = ctx.rank4(shapes, b.input, "the input")?;
            let c = ctx.channels(x, b.input)? as usize;
            for (p, role) in [
                (b.scale, "the scale"),
                (b.bias, "the bias"),
                (b.mean, "the mean"),
                (b.var, "the variance"),
            ] {
                ctx.param_shape(p, &[c], role)?;
            }
            // Written so that a NaN epsilon is rejected too.
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            if !(b.epsilon >= 0.0) {
                return ctx.fail(format!(
                    "epsilon must be non-negative, found {:?}",
                    b.epsilon
                ));
            }
            x.to_vec()
        }
        Op::Act { input, .. } => ctx.rank4(shapes, *input, "the input")?.to_vec(),
        Op::PRelu { input, slope } => {
            let x = ctx.rank4(shapes, *input, "the input")?;
            let c = ctx.channels(x, *input)? as usize;
            ctx.param_shape(*slope, &[c], "the slope")?;
            x.to_vec()
        }
        Op::Binary { kind, lhs, rhs } => {
            let a = ctx.rank4(shapes, *lhs, "the left operand")?;
            let b = ctx.rank4(shapes, *rhs, "the right operand")?;
            let one = Dim::Known(1);
            let per_channel = b[2] == one
                && b[3] == one
                && (b[0] == one || !b[0].provably_differs(&a[0]))
                && !b[1].provably_differs(&a[1]);
            if !per_channel {
                ctx.same_shape(
                    a,
                    b,
                    &format!(
                        "{} needs a right operand of the left one's shape, or of [N, C, 1, 1] or [1, C, 1, 1]",
                        kind.name()
                    ),
                )?;
            } else {
                ctx.channels(a, *lhs)?;
            }
            a.to_vec()
        }
        Op::Concat { inputs } => {
            let Some(&first) = inputs.first() else {
                return ctx.fail("concat needs at least one input");
            };
            let x = ctx.rank4(shapes, first, "the first input")?.to_vec();
            let mut channels = 0u64;
            for &v in inputs {
                let y = ctx.rank4(shapes, v, "an input")?;
                channels = channels.saturating_add(ctx.channels(y, v)?);
                for (axis, what) in [(0, "batch"), (2, "height"), (3, "width")] {
                    if y[axis].provably_differs(&x[axis]) {
                        return ctx.fail(format!(
                            "concat joins channels only: the {what} of %{} ({}) differs from that of %{} ({})",
                            graph.value_name(v),
                            y[axis],
                            graph.value_name(first),
                            x[axis]
                        ));
                    }
                }
            }
            vec![
                x[0].clone(),
                Dim::Known(channels),
                x[2].clone(),
                x[3].clone(),
            ]
        }
        Op::SelectChannels { input, select } => {
            let x = ctx.rank4(shapes, *input, "the input")?;
            let c = ctx.channels(x, *input)?;
            if let Some(&bad) = select.iter().find(|&&s| s as u64 >= c) {
                return ctx.fail(format!(
                    "select_channels picks channel {bad}, but %{} has {c}",
                    graph.value_name(*input)
                ));
            }
            if select.is_empty() {
                return ctx.fail("select_channels needs at least one channel");
            }
            vec![
                x[0].clone(),
                Dim::Known(select.len() as u64),
                x[2].clone(),
                x[3].clone(),
            ]
        }
        Op::Resize(r) => {
            let x = ctx.rank4(shapes, r.input, "the input")?;
            ctx.channels(x, r.input)?;
            let (h, w) = match r.size {
                ResizeSize::Scale(factors) => {
                    if factors
                        .iter()
                        .any(|f| f.num() == 0 || f.num() > MAX_STEP as u64)
                    {
                        return ctx.fail(format!(
                            "resize scale factors must be above 0 and at most {MAX_STEP}, found {}, {}",
                            factors[0], factors[1]
                        ));
                    }
                    let scaled = |d: &Dim, f: ScaleFactor| match d.scaled_ratio(f.num(), f.den()) {
                        Some(Dim::Known(0)) => ctx.fail(format!(
                            "the resized extent {d} * {f} is 0: the output must have a pixel"
                        )),
                        Some(d) => Ok(d),
                        None => ctx.fail(format!("the resized extent {d} * {f} overflows")),
                    };
                    (scaled(&x[2], factors[0])?, scaled(&x[3], factors[1])?)
                }
                ResizeSize::Sizes(sizes) => {
                    if sizes.contains(&0) {
                        return ctx
                            .fail(format!("resize sizes must be at least 1, found {sizes:?}"));
                    }
                    (Dim::Known(sizes[0]), Dim::Known(sizes[1]))
                }
                ResizeSize::Like(like) => {
                    let y = ctx.rank4(shapes, like, "the size operand")?;
                    (y[2].clone(), y[3].clone())
                }
            };
            vec![x[0].clone(), x[1].clone(), h, w]
        }
    })
}

impl Graph {
    /// Verifies the graph without bindings: ranks, channels, attributes.
    pub fn verify(&self) -> Result<Shapes, VerifyError> {
        infer_shapes(self, &Bindings::new())
    }
}

impl Graph {
    /// Derives symbol bindings from the concrete shapes of the graph's inputs, given by input
    /// name (without `%`), merged over `explicit` bindings. Fails, naming the input, when an
    /// input is missing, unknown or given twice, has the wrong rank or a wrong fixed
    /// dimension, or when a symbol would take two values.
    pub fn bind_inputs(
        &self,
        given: &[(&str, &[usize])],
        explicit: &Bindings,
    ) -> Result<Bindings, VerifyError> {
        let mut bindings = explicit.clone();
        for (i, (name, _)) in given.iter().enumerate() {
            // Given twice, one tensor would be bound and the other silently dropped.
            if given[..i].iter().any(|(n, _)| n == name) {
                return Err(VerifyError {
                    loc: None,
                    subject: format!("%{name}"),
                    message: "the input is given twice".into(),
                });
            }
            if !self
                .inputs
                .iter()
                .any(|i| self.value_name(i.value) == *name)
            {
                return Err(VerifyError {
                    loc: None,
                    subject: format!("%{name}"),
                    message: "the graph has no such input".into(),
                });
            }
        }
        for input in &self.inputs {
            let name = self.value_name(input.value);
            let fail = |message: String| {
                Err(VerifyError {
                    loc: input.loc,
                    subject: format!("%{name}"),
                    message,
                })
            };
            let Some((_, shape)) = given.iter().find(|(n, _)| *n == name) else {
                return fail(format!(
                    "no tensor was given for this input (expected shape {})",
                    describe(&input.shape)
                ));
            };
            if shape.len() != input.shape.len() {
                return fail(format!(
                    "the tensor has shape {shape:?} but the input is declared {}",
                    describe(&input.shape)
                ));
            }
            if shape.contains(&0) {
                return fail(format!(
                    "the tensor has shape {shape:?}: every dimension must be at least 1"
                ));
            }
            for (dim, &n) in input.shape.iter().zip(shape.iter()) {
                let n = n as u64;
                match dim {
                    Dim::Known(k) if *k != n => {
                        return fail(format!(
                            "the tensor has shape {shape:?} but the input is declared {}",
                            describe(&input.shape)
                        ));
                    }
                    Dim::Sym(s) => match bindings.get(s) {
                        Some(&b) if b != n => {
                            return fail(format!(
                                "the tensor has shape {shape:?}, binding {s}={n}, but {s}={b} already"
                            ));
                        }
                        _ => {
                            bindings.insert(s.clone(), n);
                        }
                    },
                    _ => {}
                }
            }
        }
        Ok(bindings)
    }
}
