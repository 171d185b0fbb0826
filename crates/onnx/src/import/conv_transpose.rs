//! `ConvTranspose` (2-D): strides, pads, dilations, `output_padding`, groups 1 and depthwise,
//! `auto_pad` (whose total padding does not depend on the input's extents, so symbolic ones
//! keep working) and `output_shape` over a known input.

use primjit_ir::{ConvTranspose2d, Op, Pads};

use super::{Importer, NodeResult, check_attrs, explicit_pads, int, ints, pair, positive, string};
use crate::proto::NodeProto;

impl Importer {
    pub(super) fn conv_transpose(&mut self, node: &NodeProto) -> NodeResult<()> {
        check_attrs(
            node,
            &[
                "auto_pad",
                "dilations",
                "group",
                "kernel_shape",
                "output_padding",
                "output_shape",
                "pads",
                "strides",
            ],
        )?;
        let x = self.act(node, 0, "X")?;
        let x_shape = self.shape(x);
        if x_shape.len() != 4 {
            return Err(format!(
                "input 0 (X) has rank {}: only 2-D transposed convolutions (NCHW inputs) are supported",
                x_shape.len()
            ));
        }
        let w = self.constant_input(node, 1, "W")?;
        if w.dims.len() != 4 {
            return Err(format!(
                "input 1 (W) has rank {}: only 2-D transposed convolutions (rank-4 weights) are supported",
                w.dims.len()
            ));
        }
        let [c, ocg, kh, kw] = [w.dims[0], w.dims[1], w.dims[2], w.dims[3]];
        if [c, ocg, kh, kw].contains(&0) {
            return Err(format!(
                "input 1 (W) has shape {:?}: every extent must be at least 1",
                w.dims
            ));
        }
        if let Some(ks) = ints(node, "kernel_shape")?
            && ks != [kh as i64, kw as i64]
        {
            return Err(format!(
                "attribute kernel_shape {ks:?} differs from the weight's kernel {:?}",
                [kh, kw]
            ));
        }
        let groups = positive(int(node, "group")?.unwrap_or(1), "group")?;
        if groups != 1 && !(groups == c && ocg == 1) {
            return Err(format!(
                "attribute group {groups} with weights {:?}: only groups 1 and depthwise (a group \
                 per input channel, one output channel each) are supported",
                w.dims
            ));
        }
        let strides = pair(node, "strides")?;
        let dilations = pair(node, "dilations")?;
        let mut output_padding = match ints(node, "output_padding")? {
            None => [0, 0],
            Some(v) if v.len() == 2 && v.iter().all(|&p| p >= 0) => {
                let at = |i: usize| usize::try_from(v[i]).map_err(|_| "output_padding overflows");
                [at(0)?, at(1)?]
            }
            Some(v) => {
                return Err(format!(
                    "attribute output_padding {v:?}: two values (height, width), not negative, are needed"
                ));
            }
        };
        let explicit = explicit_pads(node)?;
        let auto_pad = string(node, "auto_pad")?.unwrap_or_else(|| "NOTSET".into());
        if !matches!(
            auto_pad.as_str(),
            "NOTSET" | "VALID" | "SAME_UPPER" | "SAME_LOWER"
        ) {
            return Err(format!(
                "attribute auto_pad {auto_pad:?} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"
            ));
        }
        if auto_pad != "NOTSET" && explicit.is_some_and(|p| !p.is_zero()) {
            return Err(format!(
                "attributes pads and auto_pad {auto_pad} are both set"
            ));
        }
        let output_shape = match ints(node, "output_shape")? {
            None => None,
            Some(v) if v.len() == 2 || v.len() == 4 => {
                let hw = &v[v.len() - 2..];
                Some([
                    positive(hw[0], "output_shape")?,
                    positive(hw[1], "output_shape")?,
                ])
            }
            Some(v) => {
                return Err(format!(
                    "attribute output_shape {v:?}: two values (height, width) or four (N, C, H, W) are needed"
                ));
            }
        };
        let kernel = [kh, kw];
        // The padding of `output_shape`, or of `auto_pad` SAME (whose output is the input times
        // the stride): the total is `stride * (input - 1) + output_padding + extent - output`,
        // split as the ONNX operator says; a negative end (an output one longer) becomes more
        // output padding, a negative start is refused.
        let given_padding = output_padding;
        let total_for = |axis: usize, output: Option<u128>| -> NodeResult<i128> {
            let extent = kernel[axis]
                .checked_sub(1)
                .and_then(|k| k.checked_mul(dilations[axis]))
                .and_then(|k| k.checked_add(1))
                .ok_or("the kernel extent overflows")? as i128;
            let (stride, op) = (strides[axis] as i128, given_padding[axis] as i128);
            Ok(match output {
                // `stride * (input - 1) + ... - input * stride`: the input cancels out.
                None => op + extent - stride,
                Some(out) => {
                    let input = x_shape[2 + axis].known().ok_or_else(|| {
                        format!(
                            "attribute output_shape needs a known input {}, found `{}`",
                            ["height", "width"][axis],
                            x_shape[2 + axis]
                        )
                    })? as i128;
                    stride * (input - 1) + op + extent - out as i128
                }
            })
        };
        let pads = if output_shape.is_some() || auto_pad.starts_with("SAME") {
            let mut p = [(0usize, 0usize); 2];
            for axis in 0..2 {
                let total = total_for(axis, output_shape.map(|o| o[axis] as u128))?;
                let half = total.div_euclid(2);
                let (begin, end) = if auto_pad == "SAME_UPPER" {
                    (half, total - half)
                } else {
                    (total - half, half)
                };
                if begin < 0 {
                    return Err(format!(
                        "the {} padding would be negative ({begin}): the output is too large for \
                         the input, kernel and strides",
                        ["top", "left"][axis]
                    ));
                }
                let end = if end < 0 {
                    output_padding[axis] += end.unsigned_abs() as usize;
                    0
                } else {
                    end
                };
                let too_large = |_| "the padding overflows".to_string();
                p[axis] = (
                    usize::try_from(begin).map_err(too_large)?,
                    usize::try_from(end).map_err(too_large)?,
                );
            }
            Pads {
                top: p[0].0,
                left: p[1].0,
                bottom: p[0].1,
                right: p[1].1,
            }
        } else if auto_pad == "VALID" {
            Pads::default()
        } else {
            explicit.unwrap_or_default()
        };
        let weight = self.param_exact(&w, 1, "W", &w.dims.clone())?;
        let bias = match self.optional_constant(node, 2, "B")? {
            Some(b) => {
                let oc = ocg
                    .checked_mul(groups)
                    .ok_or("the output channels overflow")?;
                Some(self.param_exact(&b, 2, "B", &[oc])?)
            }
            None => None,
        };
        let ct = ConvTranspose2d {
            input: x,
            weight,
            bias,
            strides,
            dilations,
            pads,
            output_padding,
            groups,
            post_ops: Vec::new(),
        };
        // With `output_shape`, the pads and output padding above give exactly its extents.
        self.push(node, Op::ConvTranspose(ct), false)
    }
}
