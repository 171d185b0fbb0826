//! ONNX `auto_pad` SAME_UPPER and SAME_LOWER kept symbolic: the padding of a strided window
//! over an extent known only at run time, resolved to [`Pads`] once the input's shape is bound.
//!
//! With stride `s` the total padding is `max((ceil(in / s) - 1) * s + extent - in, 0)`, and how
//! it splits between the two sides depends on `in mod s`: no fixed `pads` attribute gives it.
//! The output extent does not depend on the split: it is `ceil(in / s)`.

use std::fmt;

use crate::graph::{Conv2d, Pads, Pool2d, PoolWindow};

/// How a window pads an input whose extent is known only at run time, as ONNX's `auto_pad`:
/// the total padding makes the output `ceil(input / stride)` wide, split evenly between the
/// two sides, the odd cell at the end (`SameUpper`) or at the beginning (`SameLower`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AutoPad {
    SameUpper,
    SameLower,
}

impl AutoPad {
    pub const ALL: [AutoPad; 2] = [AutoPad::SameUpper, AutoPad::SameLower];

    /// The name the text format gives it: `same_upper` or `same_lower`.
    pub fn name(self) -> &'static str {
        match self {
            AutoPad::SameUpper => "same_upper",
            AutoPad::SameLower => "same_lower",
        }
    }

    pub fn by_name(name: &str) -> Option<AutoPad> {
        AutoPad::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The padding `(begin, end)` of one axis over an input `input` cells long, for a window
    /// of `kernel` taps `dilation` apart moved by `stride`; `None` when an extent is 0 or the
    /// padding does not fit a `usize`.
    pub fn axis_pads(
        self,
        input: usize,
        kernel: usize,
        stride: usize,
        dilation: usize,
    ) -> Option<(usize, usize)> {
        if input == 0 || kernel == 0 || stride == 0 {
            return None;
        }
        // In u128: no product of two 64-bit values overflows it.
        let extent = (kernel as u128 - 1)
            .checked_mul(dilation as u128)?
            .checked_add(1)?;
        let (input, stride) = (input as u128, stride as u128);
        let last_start = (input.div_ceil(stride) - 1).checked_mul(stride)?;
        let total = last_start.checked_add(extent)?.saturating_sub(input);
        let total = usize::try_from(total).ok()?;
        let (small, large) = (total / 2, total - total / 2);
        Some(match self {
            AutoPad::SameUpper => (small, large),
            AutoPad::SameLower => (large, small),
        })
    }

    /// The padding of a window over an input of height and width `input`; `None` as in
    /// [`AutoPad::axis_pads`].
    pub fn pads(
        self,
        input: [usize; 2],
        kernel: [usize; 2],
        strides: [usize; 2],
        dilations: [usize; 2],
    ) -> Option<Pads> {
        let (top, bottom) = self.axis_pads(input[0], kernel[0], strides[0], dilations[0])?;
        let (left, right) = self.axis_pads(input[1], kernel[1], strides[1], dilations[1])?;
        Some(Pads {
            top,
            left,
            bottom,
            right,
        })
    }
}

impl fmt::Display for AutoPad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Conv2d {
    /// The padding of this conv over an input of height and width `input`, with the weight's
    /// `kernel` (its last two extents): `pads`, or `auto_pad` resolved. `None` only where
    /// shape inference refuses the node at that input.
    pub fn pads_at(&self, kernel: [usize; 2], input: [usize; 2]) -> Option<Pads> {
        match self.auto_pad {
            None => Some(self.pads),
            Some(auto) => auto.pads(input, kernel, self.strides, self.dilations),
        }
    }
}

impl Pool2d {
    /// This pooling's window over an input of height and width `input`: `window`, its pads
    /// resolved from `auto_pad` if it has one. `None` only where shape inference refuses the
    /// node at that input.
    pub fn window_at(&self, input: [usize; 2]) -> Option<PoolWindow> {
        let mut w = self.window;
        if let Some(auto) = self.auto_pad {
            w.pads = auto.pads(input, w.kernel, w.strides, w.dilations)?;
        }
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool_output_extent;

    /// The ONNX rule written out the long way: the smallest total padding whose window count
    /// is `ceil(input / stride)`, found by trying each.
    fn by_search(auto: AutoPad, input: usize, k: usize, s: usize, d: usize) -> (usize, usize) {
        let want = input.div_ceil(s);
        let total = (0..)
            .find(|&t| pool_output_extent(input, 0, t, k, s, d, false).is_some_and(|o| o >= want))
            .unwrap();
        match auto {
            AutoPad::SameUpper => (total / 2, total - total / 2),
            AutoPad::SameLower => (total - total / 2, total / 2),
        }
    }

    #[test]
    fn same_upper_puts_the_odd_cell_at_the_end_and_same_lower_at_the_beginning() {
        // 3 taps, stride 2: an even input needs 1 cell, an odd one 2.
        assert_eq!(AutoPad::SameUpper.axis_pads(8, 3, 2, 1), Some((0, 1)));
        assert_eq!(AutoPad::SameLower.axis_pads(8, 3, 2, 1), Some((1, 0)));
        assert_eq!(AutoPad::SameUpper.axis_pads(7, 3, 2, 1), Some((1, 1)));
        assert_eq!(AutoPad::SameLower.axis_pads(7, 3, 2, 1), Some((1, 1)));
        // 2 taps, stride 2: an even input needs none, an odd one 1.
        assert_eq!(AutoPad::SameUpper.axis_pads(8, 2, 2, 1), Some((0, 0)));
        assert_eq!(AutoPad::SameUpper.axis_pads(9, 2, 2, 1), Some((0, 1)));
        assert_eq!(AutoPad::SameLower.axis_pads(9, 2, 2, 1), Some((1, 0)));
    }

    #[test]
    fn dilation_and_stride_3_and_inputs_smaller_than_the_window() {
        // 3 taps 2 apart span 5 cells; stride 1 keeps the extent: 4 cells of padding.
        assert_eq!(AutoPad::SameUpper.axis_pads(10, 3, 1, 2), Some((2, 2)));
        // Stride 3 over 10 cells: 4 windows, the last at 9, needing 2 cells past the end.
        assert_eq!(AutoPad::SameUpper.axis_pads(10, 3, 3, 1), Some((1, 1)));
        assert_eq!(AutoPad::SameUpper.axis_pads(11, 3, 3, 1), Some((0, 1)));
        assert_eq!(AutoPad::SameLower.axis_pads(11, 3, 3, 1), Some((1, 0)));
        assert_eq!(AutoPad::SameUpper.axis_pads(12, 3, 3, 1), Some((0, 0)));
        // A 1-tap window at stride 3 never pads: the total would be negative.
        assert_eq!(AutoPad::SameLower.axis_pads(8, 1, 3, 1), Some((0, 0)));
        // One cell under a 5x5 window: one output, 4 cells of padding.
        assert_eq!(AutoPad::SameUpper.axis_pads(1, 5, 2, 1), Some((2, 2)));
        assert_eq!(AutoPad::SameLower.axis_pads(2, 5, 2, 1), Some((2, 1)));
        assert_eq!(AutoPad::SameUpper.axis_pads(2, 5, 2, 1), Some((1, 2)));
    }

    #[test]
    fn the_padding_gives_ceil_input_over_stride_and_matches_a_search() {
        for auto in AutoPad::ALL {
            for input in 1..24 {
                for k in 1..6 {
                    for s in 1..5 {
                        for d in 1..4 {
                            let (b, e) = auto.axis_pads(input, k, s, d).unwrap();
                            assert_eq!((b, e), by_search(auto, input, k, s, d));
                            assert_eq!(
                                pool_output_extent(input, b, e, k, s, d, false),
                                Some(input.div_ceil(s)),
                                "{auto} in {input} k {k} s {s} d {d}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn zero_extents_and_overflow_give_none() {
        assert_eq!(AutoPad::SameUpper.axis_pads(0, 3, 2, 1), None);
        assert_eq!(AutoPad::SameUpper.axis_pads(4, 0, 2, 1), None);
        assert_eq!(AutoPad::SameUpper.axis_pads(4, 3, 0, 1), None);
        // A total padding past usize::MAX: 3 taps usize::MAX apart.
        assert_eq!(AutoPad::SameUpper.axis_pads(4, 3, 1, usize::MAX), None);
        // The widest window: its total padding is usize::MAX - 1, split evenly.
        assert_eq!(
            AutoPad::SameLower.axis_pads(4, usize::MAX, 1, 1),
            Some((usize::MAX / 2, usize::MAX / 2))
        );
    }

    #[test]
    fn pads_and_names() {
        let p = AutoPad::SameLower
            .pads([7, 8], [3, 3], [2, 2], [1, 1])
            .unwrap();
        assert_eq!(
            p,
            Pads {
                top: 1,
                left: 1,
                bottom: 1,
                right: 0
            }
        );
        for a in AutoPad::ALL {
            assert_eq!(AutoPad::by_name(a.name()), Some(a));
            assert_eq!(a.to_string(), a.name());
        }
        assert_eq!(AutoPad::by_name("SAME_UPPER"), None);
    }
}
