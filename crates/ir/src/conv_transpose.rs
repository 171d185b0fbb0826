//! Transposed convolution (ONNX `ConvTranspose`, 2-D): the op and its output extents, known or
//! symbolic.
//!
//! Output pixel `o` along an axis sums the taps `k` whose input `i = (o + pad_begin - k *
//! dilation) / stride` is whole and inside the input; the output extent is
//! `(input - 1) * stride - pad_begin - pad_end + dilation * (kernel - 1) + output_padding + 1`.

use crate::dim::Dim;
use crate::graph::{Pads, Param, PostOp, Value};

/// A 2-D transposed convolution with ONNX `ConvTranspose` semantics; weights are
/// `[I, O / groups, KH, KW]` (input channels first, as ONNX and PyTorch store them).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvTranspose2d {
    pub input: Value,
    pub weight: Param,
    pub bias: Option<Param>,
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: Pads,
    /// Extra rows and columns at the bottom and right of the output (each below its axis's
    /// stride or dilation), which only the bias and taps that reach them fill.
    pub output_padding: [usize; 2],
    pub groups: usize,
    /// Applied to each output element after the bias: `relu`, `clip` and the activations
    /// (`fuse_post_ops` fuses a sole reader; the parser refuses the other post-ops).
    pub post_ops: Vec<PostOp>,
}

/// `(input - 1) * stride - pad_begin - pad_end + dilation * (kernel - 1) + output_padding + 1`,
/// or `None` when it is below 1 or overflows.
pub fn conv_transpose_output_extent(
    input: usize,
    pad_begin: usize,
    pad_end: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    output_padding: usize,
) -> Option<usize> {
    let c = transpose_offset(pad_begin, pad_end, kernel, stride, dilation, output_padding)?;
    let out = (input as i128)
        .checked_mul(stride as i128)?
        .checked_add(c)?;
    usize::try_from(out).ok().filter(|&o| o >= 1)
}

/// The constant `c` of `output = input * stride + c`.
fn transpose_offset(
    pad_begin: usize,
    pad_end: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    output_padding: usize,
) -> Option<i128> {
    let reach = (dilation as i128).checked_mul(kernel.checked_sub(1)? as i128)?;
    Some(reach + output_padding as i128 + 1 - stride as i128 - pad_begin as i128 - pad_end as i128)
}

/// The output extent of a transposed convolution over `input` (see
/// [`conv_transpose_output_extent`]), folded when `input` is known. A symbolic extent is
/// `input * stride` shifted by the constant, written as a unit-stride window over the scaled
/// input (`Dim::Window` with stride 1 is `input + offset + 1`), so that binding the symbol
/// evaluates it; `None` when a known extent is below 1 or anything overflows.
pub(crate) fn conv_transpose_dim(
    input: &Dim,
    pad_begin: usize,
    pad_end: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    output_padding: usize,
) -> Option<Dim> {
    if let Dim::Known(n) = input {
        return conv_transpose_output_extent(
            usize::try_from(*n).ok()?,
            pad_begin,
            pad_end,
            kernel,
            stride,
            dilation,
            output_padding,
        )
        .map(|o| Dim::Known(o as u64));
    }
    let c = transpose_offset(pad_begin, pad_end, kernel, stride, dilation, output_padding)?;
    let scaled = input.scaled(stride as u64)?;
    let offset = c - 1;
    let (pad, extent) = if offset >= 0 {
        (u64::try_from(offset).ok()?, 0)
    } else {
        (0, u64::try_from(-offset).ok()?)
    };
    scaled.window(pad, 0, extent, 1, false).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dim::parse_bindings;

    #[test]
    fn extents_match_onnx() {
        // ONNX's convtranspose_pads: 3x3 input, kernel 3, strides [3, 2], pads [1, 2, 1, 2]
        // -> [7, 3]; with output_padding [1, 1] (convtranspose_output_shape's) -> [8, 4].
        assert_eq!(conv_transpose_output_extent(3, 1, 1, 3, 3, 1, 0), Some(7));
        assert_eq!(conv_transpose_output_extent(3, 2, 2, 3, 2, 1, 0), Some(3));
        assert_eq!(conv_transpose_output_extent(3, 1, 1, 3, 3, 1, 1), Some(8));
        assert_eq!(conv_transpose_output_extent(3, 2, 2, 3, 2, 1, 1), Some(4));
        // Kernel 2, stride 2 doubles.
        assert_eq!(conv_transpose_output_extent(7, 0, 0, 2, 2, 1, 0), Some(14));
        // Pads that eat the whole output.
        assert_eq!(conv_transpose_output_extent(1, 1, 1, 1, 1, 1, 0), None);
    }

    #[test]
    fn symbolic_extents_resolve_to_the_known_ones() {
        let w = Dim::Sym("W".into());
        for (pb, pe, k, s, d, op) in [
            (0, 0, 2, 2, 1, 0),
            (1, 1, 4, 2, 1, 0),
            (1, 1, 3, 2, 1, 1),
            (0, 0, 3, 1, 2, 0),
            (2, 3, 3, 3, 1, 2),
            (0, 0, 1, 3, 1, 0),
        ] {
            let sym = conv_transpose_dim(&w, pb, pe, k, s, d, op).unwrap();
            for n in 2..9u64 {
                let b = parse_bindings(&format!("W={n}")).unwrap();
                let known = conv_transpose_output_extent(n as usize, pb, pe, k, s, d, op);
                assert_eq!(
                    sym.resolve(&b).ok(),
                    known.map(|o| Dim::Known(o as u64)),
                    "{sym} at W={n}"
                );
            }
        }
        let doubled = conv_transpose_dim(&w, 0, 0, 2, 2, 1, 0).unwrap();
        assert_eq!(doubled, w.scaled(2).unwrap(), "k2 s2 is a plain doubling");
        assert_eq!(doubled.to_string(), "W * 2");
    }
}
