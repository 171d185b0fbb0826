//! The ops, one plain loop nest each: sums in f64, one rounding to f32 per output element.
//!
//! See the crate documentation for their preconditions and rounding.

use primjit_ir::{
    Activation, BinaryKind, Conv2d, CoordMode, Pads, Pool2d, PoolKind, PoolWindow, ResizeMode,
    ScaleFactor, Tensor, conv_output_extent, linear_taps, nearest_index, pool_output_extent,
};

/// An element-wise operation applied to a convolution's output, in f64, before rounding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Post<'a> {
    Relu,
    /// Adds a tensor of the output's shape (a residual connection).
    Add(&'a Tensor),
    /// Clamps to `[lo, hi]`.
    Clip {
        lo: f32,
        hi: f32,
    },
    /// An activation, in f64 ([`Activation::eval`]).
    Act(Activation),
    /// `acc` for `acc >= 0`, else `slope[c] * acc` ([`prelu`]), one slope (`[C]`) per output
    /// channel.
    PRelu(&'a Tensor),
}

impl Post<'_> {
    /// `acc` after this post-op, `acc` being element `idx` of the output, of channel
    /// `channel`.
    fn apply(&self, acc: f64, idx: usize, channel: usize) -> f64 {
        match *self {
            Post::Relu => relu64(acc),
            Post::Add(r) => acc + r.data[idx] as f64,
            Post::Clip { lo, hi } => acc.clamp(lo as f64, hi as f64),
            Post::Act(a) => a.eval(acc),
            Post::PRelu(slope) if acc < 0.0 => slope.data[channel] as f64 * acc,
            Post::PRelu(_) => acc,
        }
    }
}

/// The attributes of [`conv2d`], as in [`primjit_ir::Conv2d`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvAttrs {
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: Pads,
    pub groups: usize,
}

impl Default for ConvAttrs {
    /// The ONNX defaults: stride 1, dilation 1, no padding, one group.
    fn default() -> Self {
        ConvAttrs {
            strides: [1, 1],
            dilations: [1, 1],
            pads: Pads::default(),
            groups: 1,
        }
    }
}

impl ConvAttrs {
    /// `c`'s attributes over an input of height and width `input`, with the weight's
    /// `kernel`: its `auto_pad`, if it has one, resolved ([`Conv2d::pads_at`]). `None` where
    /// shape inference refuses the node at that input.
    pub fn at(c: &Conv2d, kernel: [usize; 2], input: [usize; 2]) -> Option<Self> {
        Some(ConvAttrs {
            strides: c.strides,
            dilations: c.dilations,
            pads: c.pads_at(kernel, input)?,
            groups: c.groups,
        })
    }
}

/// The attributes of [`pool2d`], as in [`primjit_ir::Pool2d`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolAttrs {
    pub kind: PoolKind,
    pub window: PoolWindow,
    pub count_include_pad: bool,
}

impl PoolAttrs {
    /// Max pooling with `window`, as a conv's `maxpool` post-op applies it (after [`conv2d`]).
    pub fn max(window: &PoolWindow) -> Self {
        PoolAttrs {
            kind: PoolKind::Max,
            window: *window,
            count_include_pad: false,
        }
    }
}

impl PoolAttrs {
    /// `p`'s attributes over an input of height and width `input`: its `auto_pad`, if it has
    /// one, resolved ([`Pool2d::window_at`]). `None` where shape inference refuses the node at
    /// that input.
    pub fn at(p: &Pool2d, input: [usize; 2]) -> Option<Self> {
        Some(PoolAttrs {
            kind: p.kind,
            window: p.window_at(input)?,
            count_include_pad: p.count_include_pad,
        })
    }
}

/// The `[N, C, H, W]` of a rank-4 tensor.
fn dims4(t: &Tensor) -> [usize; 4] {
    assert_eq!(
        t.shape.len(),
        4,
        "expected an NCHW tensor, found shape {:?}",
        t.shape
    );
    debug_assert_eq!(t.data.len(), t.shape.iter().product::<usize>());
    [t.shape[0], t.shape[1], t.shape[2], t.shape[3]]
}

/// The input coordinate of tap `k` of the window at output position `o`, if it lies in
/// `0..len`; padding is what lies outside.
fn tap(
    o: usize,
    k: usize,
    stride: usize,
    dilation: usize,
    pad_begin: usize,
    len: usize,
) -> Option<usize> {
    (o * stride + k * dilation)
        .checked_sub(pad_begin)
        .filter(|&i| i < len)
}

/// A 2-D convolution with ONNX `Conv` semantics, followed by `post_ops` in order.
///
/// `x` is `[N, C, H, W]`, `weight` `[O, C / groups, KH, KW]`, `bias` `[O]`, and every
/// [`Post::Add`] tensor has the output's shape `[N, O, OH, OW]`, where
/// `OH = floor((H + top + bottom - dilation * (KH - 1) - 1) / stride) + 1` and likewise `OW`.
///
/// # Panics
///
/// On shapes the IR rejects (see the crate documentation).
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    attrs: &ConvAttrs,
    post_ops: &[Post<'_>],
) -> Tensor {
    let [n, c, h, w] = dims4(x);
    let [o, cpg, kh, kw] = dims4(weight);
    let ConvAttrs {
        strides: [sh, sw],
        dilations: [dh, dw],
        pads,
        groups,
    } = *attrs;
    assert!(
        groups >= 1 && c == cpg * groups && o % groups == 0,
        "bad channels or groups"
    );
    let oh =
        conv_output_extent(h, pads.top, pads.bottom, kh, sh, dh).expect("window fits the height");
    let ow =
        conv_output_extent(w, pads.left, pads.right, kw, sw, dw).expect("window fits the width");
    let out_shape = vec![n, o, oh, ow];
    if let Some(b) = bias {
        debug_assert_eq!(b.shape, [o]);
    }
    for post in post_ops {
        match post {
            Post::Add(r) => assert_eq!(
                r.shape, out_shape,
                "a residual must have the output's shape"
            ),
            Post::PRelu(slope) => assert_eq!(slope.shape, [o], "the slope must have shape [C]"),
            _ => {}
        }
    }
    let opg = o / groups;

    let mut out = Vec::with_capacity(n * o * oh * ow);
    for b in 0..n {
        for oc in 0..o {
            let group = oc / opg;
            for y in 0..oh {
                for x_ in 0..ow {
                    let mut acc = bias.map_or(0.0, |t| t.data[oc] as f64);
                    for icg in 0..cpg {
                        let ic = group * cpg + icg;
                        for ky in 0..kh {
                            let Some(iy) = tap(y, ky, sh, dh, pads.top, h) else {
                                continue;
                            };
                            for kx in 0..kw {
                                let Some(ix) = tap(x_, kx, sw, dw, pads.left, w) else {
                                    continue;
                                };
                                let xv = x.data[((b * c + ic) * h + iy) * w + ix] as f64;
                                let wv = weight.data[((oc * cpg + icg) * kh + ky) * kw + kx] as f64;
                                acc += xv * wv;
                            }
                        }
                    }
                    let idx = out.len();
                    acc = post_ops.iter().fold(acc, |acc, p| p.apply(acc, idx, oc));
                    out.push(acc as f32);
                }
            }
        }
    }
    Tensor {
        shape: out_shape,
        data: out,
    }
}

/// The larger of `m` and `v`, NaN if either is.
fn max_nan(m: f64, v: f64) -> f64 {
    if v > m || v.is_nan() { v } else { m }
}

/// `max(v, 0)`, keeping NaN.
fn relu64(v: f64) -> f64 {
    if v < 0.0 { 0.0 } else { v }
}

/// A windowed max or average pool with ONNX `MaxPool` / `AveragePool` semantics.
///
/// Output extents are [`primjit_ir::pool_output_extent`]'s: with `ceil_mode` the ceiling,
/// less a last window that would start in the end padding. Max pooling takes the maximum over
/// the taps inside the input (padding never wins). Average pooling sums the taps inside the
/// input and divides by their number, or with `count_include_pad` by the number of taps inside
/// the padded input `[-pad_begin, len + pad_end)` on both axes, so that taps a ceil-mode window
/// hangs past the end padding are never counted (PyTorch's rule).
///
/// # Panics
///
/// On shapes or attributes the IR rejects, in particular a window that covers only padding.
pub fn pool2d(x: &Tensor, attrs: &PoolAttrs) -> Tensor {
    let [n, c, h, w] = dims4(x);
    let PoolAttrs {
        kind,
        window:
            PoolWindow {
                kernel: [kh, kw],
                strides: [sh, sw],
                pads,
                dilations: [dh, dw],
                ceil_mode,
            },
        count_include_pad,
    } = *attrs;
    let oh = pool_output_extent(h, pads.top, pads.bottom, kh, sh, dh, ceil_mode)
        .expect("window fits the height");
    let ow = pool_output_extent(w, pads.left, pads.right, kw, sw, dw, ceil_mode)
        .expect("window fits the width");
    // In padded coordinates (where the window at `o` starts at `o * stride`), the padded
    // input ends at `h_padded` and `w_padded`.
    let (h_padded, w_padded) = (pads.top + h + pads.bottom, pads.left + w + pads.right);

    let mut out = Vec::with_capacity(n * c * oh * ow);
    for p in 0..n * c {
        let plane = &x.data[p * h * w..(p + 1) * h * w];
        for y in 0..oh {
            for x_ in 0..ow {
                let (mut max, mut sum, mut valid, mut padded) =
                    (f64::NEG_INFINITY, 0.0, 0usize, 0usize);
                for ky in 0..kh {
                    for kx in 0..kw {
                        if y * sh + ky * dh < h_padded && x_ * sw + kx * dw < w_padded {
                            padded += 1;
                        }
                        let (Some(iy), Some(ix)) = (
                            tap(y, ky, sh, dh, pads.top, h),
                            tap(x_, kx, sw, dw, pads.left, w),
                        ) else {
                            continue;
                        };
                        let v = plane[iy * w + ix] as f64;
                        max = max_nan(max, v);
                        sum += v;
                        valid += 1;
                    }
                }
                assert!(valid > 0, "a pooling window covers only padding");
                out.push(match kind {
                    PoolKind::Max => max as f32,
                    PoolKind::Avg if count_include_pad => (sum / padded as f64) as f32,
                    PoolKind::Avg => (sum / valid as f64) as f32,
                });
            }
        }
    }
    Tensor {
        shape: vec![n, c, oh, ow],
        data: out,
    }
}

/// The max or mean of each `[H, W]` plane: `[N, C, H, W]` to `[N, C, 1, 1]`.
///
/// # Panics
///
/// When `H` or `W` is 0.
pub fn global_pool(x: &Tensor, kind: PoolKind) -> Tensor {
    let [n, c, h, w] = dims4(x);
    assert!(h * w > 0, "global pooling over an empty plane");
    let data = x
        .data
        .chunks_exact(h * w)
        .map(|plane| match kind {
            PoolKind::Max => plane
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| max_nan(m, v as f64))
                as f32,
            PoolKind::Avg => {
                (plane.iter().map(|&v| v as f64).sum::<f64>() / plane.len() as f64) as f32
            }
        })
        .collect();
    Tensor {
        shape: vec![n, c, 1, 1],
        data,
    }
}

/// `max(x, 0)` element-wise (NaN stays NaN).
pub fn relu(x: &Tensor) -> Tensor {
    Tensor {
        shape: x.shape.clone(),
        data: x.data.iter().map(|&v| relu64(v as f64) as f32).collect(),
    }
}

/// The element-wise sum of two tensors of one shape.
pub fn add(a: &Tensor, b: &Tensor) -> Tensor {
    assert_eq!(a.shape, b.shape, "add needs operands of one shape");
    Tensor {
        shape: a.shape.clone(),
        data: a
            .data
            .iter()
            .zip(&b.data)
            .map(|(&x, &y)| (x as f64 + y as f64) as f32)
            .collect(),
    }
}

/// Inference batch normalization of `[N, C, H, W]` with per-channel `[C]` parameters:
/// `(x - mean) / sqrt(var + epsilon) * scale + bias`.
pub fn batchnorm(
    x: &Tensor,
    scale: &Tensor,
    bias: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    epsilon: f32,
) -> Tensor {
    let [_, c, h, w] = dims4(x);
    for p in [scale, bias, mean, var] {
        assert_eq!(p.shape, [c], "batch-norm parameters must have shape [C]");
    }
    let data = x
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let ch = i / (h * w) % c;
            let inv_std = 1.0 / (var.data[ch] as f64 + epsilon as f64).sqrt();
            ((v as f64 - mean.data[ch] as f64) * inv_std * scale.data[ch] as f64
                + bias.data[ch] as f64) as f32
        })
        .collect();
    Tensor {
        shape: x.shape.clone(),
        data,
    }
}

/// An activation element-wise, in f64 from each f32 and rounded once (NaN stays NaN).
pub fn activation(x: &Tensor, act: Activation) -> Tensor {
    Tensor {
        shape: x.shape.clone(),
        data: x.data.iter().map(|&v| act.eval(v as f64) as f32).collect(),
    }
}

/// `x` where `x >= 0`, else `slope[c] * x`, with a `[C]` slope over `[N, C, H, W]`.
pub fn prelu(x: &Tensor, slope: &Tensor) -> Tensor {
    let [_, c, h, w] = dims4(x);
    assert_eq!(slope.shape, [c], "the slope must have shape [C]");
    let data = x
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let s = slope.data[i / (h * w) % c] as f64;
            let v = v as f64;
            (if v < 0.0 { s * v } else { v }) as f32
        })
        .collect();
    Tensor {
        shape: x.shape.clone(),
        data,
    }
}

/// `a op b` element-wise, where `b` has `a`'s shape or is `[N, C, 1, 1]` or `[1, C, 1, 1]`,
/// broadcast over height and width (and, for the latter, over the batch).
pub fn binary(kind: BinaryKind, a: &Tensor, b: &Tensor) -> Tensor {
    let [n, c, h, w] = dims4(a);
    let [bn, bc, bh, bw] = dims4(b);
    let full = b.shape == a.shape;
    assert!(
        full || (bc == c && bh == 1 && bw == 1 && (bn == n || bn == 1)),
        "the right operand must have the left one's shape or [N, C, 1, 1] or [1, C, 1, 1]"
    );
    let data = a
        .data
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let y = if full {
                b.data[i]
            } else {
                let (image, channel) = (i / (c * h * w), i / (h * w) % c);
                b.data[if bn == 1 { 0 } else { image } * c + channel]
            };
            kind.eval(x as f64, y as f64) as f32
        })
        .collect();
    Tensor {
        shape: a.shape.clone(),
        data,
    }
}

/// The inputs joined along channels: each `[N, C_i, H, W]`, the result `[N, sum C_i, H, W]`.
pub fn concat(inputs: &[&Tensor]) -> Tensor {
    let [n, _, h, w] = dims4(inputs[0]);
    let channels: usize = inputs.iter().map(|t| dims4(t)[1]).sum();
    let mut data = Vec::with_capacity(n * channels * h * w);
    for image in 0..n {
        for t in inputs {
            let [tn, tc, th, tw] = dims4(t);
            assert!(tn == n && th == h && tw == w, "concat joins channels only");
            let plane = tc * h * w;
            data.extend_from_slice(&t.data[image * plane..(image + 1) * plane]);
        }
    }
    Tensor {
        shape: vec![n, channels, h, w],
        data,
    }
}

/// Channels of `x` picked by index: output channel `j` is input channel `select[j]`.
pub fn select_channels(x: &Tensor, select: &[usize]) -> Tensor {
    let [n, c, h, w] = dims4(x);
    let plane = h * w;
    let mut data = Vec::with_capacity(n * select.len() * plane);
    for image in 0..n {
        for &s in select {
            assert!(s < c, "channel {s} of {c}");
            let at = (image * c + s) * plane;
            data.extend_from_slice(&x.data[at..at + plane]);
        }
    }
    Tensor {
        shape: vec![n, select.len(), h, w],
        data,
    }
}

/// `x` resized to `out = [oh, ow]` with ONNX `Resize` semantics (see [`primjit_ir::Resize`]),
/// by the scale factors `scale` where they are given (which then map the coordinates):
/// source coordinates exact ([`CoordMode::source_affine_by`]), nearest indices by exact
/// rounding, linear blends with f64 weights, rows blended first, then the two rows.
pub fn resize(
    x: &Tensor,
    mode: ResizeMode,
    coord: CoordMode,
    [oh, ow]: [usize; 2],
    scale: Option<[ScaleFactor; 2]>,
) -> Tensor {
    let [n, c, h, w] = dims4(x);
    assert!(oh > 0 && ow > 0, "resize to an empty extent");
    // Per output coordinate along one axis: the two taps and the second's weight.
    let taps = |input: usize, output: usize, scale: Option<ScaleFactor>| {
        let (a, b, d) = coord.source_affine_by(input as u64, output as u64, scale);
        (0..output)
            .map(|o| {
                let num = a * o as i128 + b;
                match mode {
                    ResizeMode::Nearest(m) => {
                        let i = nearest_index(m, num, d, input as u64) as usize;
                        (i, i, 0.0)
                    }
                    ResizeMode::Linear => {
                        let (i0, i1, frac) = linear_taps(num, d, input as u64);
                        (i0 as usize, i1 as usize, frac as f64 / d as f64)
                    }
                }
            })
            .collect::<Vec<(usize, usize, f64)>>()
    };
    let (rows, cols) = (
        taps(h, oh, scale.map(|s| s[0])),
        taps(w, ow, scale.map(|s| s[1])),
    );
    let mut data = Vec::with_capacity(n * c * oh * ow);
    for plane in x.data.chunks_exact(h * w) {
        let at = |y: usize, x: usize| plane[y * w + x] as f64;
        for &(y0, y1, fy) in &rows {
            for &(x0, x1, fx) in &cols {
                let v = match mode {
                    ResizeMode::Nearest(_) => at(y0, x0),
                    ResizeMode::Linear => {
                        let top = (1.0 - fx) * at(y0, x0) + fx * at(y0, x1);
                        let bottom = (1.0 - fx) * at(y1, x0) + fx * at(y1, x1);
                        (1.0 - fy) * top + fy * bottom
                    }
                };
                data.push(v as f32);
            }
        }
    }
    Tensor {
        shape: vec![n, c, oh, ow],
        data,
    }
}

/// The attributes of a transposed convolution ([`primjit_ir::ConvTranspose2d`]'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTransposeAttrs {
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: Pads,
    pub output_padding: [usize; 2],
    pub groups: usize,
}

impl From<&primjit_ir::ConvTranspose2d> for ConvTransposeAttrs {
    fn from(c: &primjit_ir::ConvTranspose2d) -> Self {
        ConvTransposeAttrs {
            strides: c.strides,
            dilations: c.dilations,
            pads: c.pads,
            output_padding: c.output_padding,
            groups: c.groups,
        }
    }
}

/// A transposed convolution with ONNX `ConvTranspose` semantics ([`primjit_ir::ConvTranspose2d`]):
/// weights `[C, O / groups, KH, KW]`; output pixel `(oy, ox)` sums, in f64, the taps whose input
/// `((oy + top - kh * dh) / sh, (ox + left - kw * dw) / sw)` is whole and inside the input,
/// over the input channels of its group, then `post_ops` in order (an `Add`'s tensor of the
/// output's shape); one rounding per element.
pub fn conv_transpose(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    ct: &ConvTransposeAttrs,
    post_ops: &[Post<'_>],
) -> Tensor {
    let [n, c, h, w] = dims4(x);
    let [ic, opg, kh, kw] = dims4(weight);
    let g = ct.groups;
    assert!(
        ic == c && c % g == 0,
        "channels do not match the weight and groups"
    );
    let ipg = c / g;
    let [sh, sw] = ct.strides;
    let [dh, dw] = ct.dilations;
    let extent = |input, pb, pe, k, s, d, op| {
        primjit_ir::conv_transpose_output_extent(input, pb, pe, k, s, d, op)
            .expect("a valid transposed convolution")
    };
    let oh = extent(
        h,
        ct.pads.top,
        ct.pads.bottom,
        kh,
        sh,
        dh,
        ct.output_padding[0],
    );
    let ow = extent(
        w,
        ct.pads.left,
        ct.pads.right,
        kw,
        sw,
        dw,
        ct.output_padding[1],
    );
    let oc = opg * g;
    // Along one axis: the `(k, i)` taps of output `o`.
    let taps = |o: usize, pad: usize, k: usize, s: usize, d: usize, input: usize| {
        (0..k)
            .filter_map(|k| {
                let t = (o + pad) as i128 - (k * d) as i128;
                (t >= 0 && t % s as i128 == 0 && ((t / s as i128) as usize) < input)
                    .then(|| (k, (t / s as i128) as usize))
            })
            .collect::<Vec<_>>()
    };
    let rows: Vec<_> = (0..oh)
        .map(|o| taps(o, ct.pads.top, kh, sh, dh, h))
        .collect();
    let cols: Vec<_> = (0..ow)
        .map(|o| taps(o, ct.pads.left, kw, sw, dw, w))
        .collect();
    let mut data = Vec::with_capacity(n * oc * oh * ow);
    for b in 0..n {
        for o in 0..oc {
            let (grp, oo) = (o / opg, o % opg);
            let base = bias.map_or(0.0, |t| t.data[o] as f64);
            for row in &rows {
                for col in &cols {
                    let mut acc = base;
                    for &(ky, iy) in row {
                        for &(kx, ix) in col {
                            for i in grp * ipg..(grp + 1) * ipg {
                                let xv = x.data[((b * c + i) * h + iy) * w + ix] as f64;
                                let wv = weight.data[((i * opg + oo) * kh + ky) * kw + kx] as f64;
                                acc += xv * wv;
                            }
                        }
                    }
                    let idx = data.len();
                    acc = post_ops.iter().fold(acc, |acc, p| p.apply(acc, idx, o));
                    data.push(acc as f32);
                }
            }
        }
    }
    Tensor {
        shape: vec![n, oc, oh, ow],
        data,
    }
}

#[cfg(test)]
mod tests;
