//! `resize`'s attributes and the exact coordinate arithmetic that the reference interpreter
//! and the kernels share.
//!
//! ONNX maps output coordinate `x` to the input coordinate `x_original` by its
//! `coordinate_transformation_mode`, with the given scale factor, or `scale = output / input`
//! for sizes. For every mode primjit supports that is a rational `(a * x + b) / d` with
//! integers, so nearest neighbours are chosen by exact integer arithmetic (no float rounding
//! decides a tie), and a linear blend's weight is the remainder over `d`.

use std::fmt;

use crate::graph::Value;

/// How `resize` maps output pixels to input pixels ([`ResizeMode::Nearest`] picks one,
/// [`ResizeMode::Linear`] blends the 2x2 around the source coordinate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResizeMode {
    Nearest(NearestMode),
    Linear,
}

/// ONNX's `nearest_mode`: how a fractional source coordinate becomes an index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NearestMode {
    /// Round, halves down (the ONNX default).
    RoundPreferFloor,
    /// Round, halves up.
    RoundPreferCeil,
    Floor,
    Ceil,
}

impl NearestMode {
    pub const ALL: [NearestMode; 4] = [
        NearestMode::RoundPreferFloor,
        NearestMode::RoundPreferCeil,
        NearestMode::Floor,
        NearestMode::Ceil,
    ];

    /// The ONNX attribute value, also the text format's.
    pub fn name(self) -> &'static str {
        match self {
            NearestMode::RoundPreferFloor => "round_prefer_floor",
            NearestMode::RoundPreferCeil => "round_prefer_ceil",
            NearestMode::Floor => "floor",
            NearestMode::Ceil => "ceil",
        }
    }

    pub fn by_name(name: &str) -> Option<NearestMode> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// ONNX's `coordinate_transformation_mode`, the ones PyTorch exports and
/// `tf_half_pixel_for_nearest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoordMode {
    /// `(x + 0.5) / scale - 0.5` (the ONNX default).
    HalfPixel,
    /// As `HalfPixel`, but 0 when the output has extent 1.
    PytorchHalfPixel,
    /// `x * (input - 1) / (output - 1)`, 0 when the output has extent 1.
    AlignCorners,
    /// `x / scale`.
    Asymmetric,
    /// `(x + 0.5) / scale`.
    TfHalfPixelForNearest,
}

impl CoordMode {
    pub const ALL: [CoordMode; 5] = [
        CoordMode::HalfPixel,
        CoordMode::PytorchHalfPixel,
        CoordMode::AlignCorners,
        CoordMode::Asymmetric,
        CoordMode::TfHalfPixelForNearest,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CoordMode::HalfPixel => "half_pixel",
            CoordMode::PytorchHalfPixel => "pytorch_half_pixel",
            CoordMode::AlignCorners => "align_corners",
            CoordMode::Asymmetric => "asymmetric",
            CoordMode::TfHalfPixelForNearest => "tf_half_pixel_for_nearest",
        }
    }

    pub fn by_name(name: &str) -> Option<CoordMode> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The source coordinate of output coordinate `x` as `(a, b, d)`: `x_original =
    /// (a * x + b) / d` with `d > 0`, for an axis resized from `input` to `output` pixels
    /// (both at least 1). Exact: `scale` is the ratio `output / input`.
    pub fn source_affine(self, input: u64, output: u64) -> (i128, i128, i128) {
        self.source_affine_by(input, output, None)
    }

    /// [`Self::source_affine`] for an axis resized by `scale` where one is given: as in ONNX,
    /// every mode but `align_corners` then maps coordinates by the factor itself, not by
    /// `output / input` (which differ where `input * scale` is not whole); the modes that map
    /// everything to 0 at an output extent of 1 still look at the extent.
    pub fn source_affine_by(
        self,
        input: u64,
        output: u64,
        scale: Option<ScaleFactor>,
    ) -> (i128, i128, i128) {
        let (i, o) = match scale {
            Some(s) if self != CoordMode::AlignCorners => (s.den as i128, s.num as i128),
            _ => (input as i128, output as i128),
        };
        match self {
            CoordMode::Asymmetric => (i, 0, o),
            // ((2x + 1) * i - o) / (2o)
            CoordMode::HalfPixel => (2 * i, i - o, 2 * o),
            CoordMode::PytorchHalfPixel if output == 1 => (0, 0, 1),
            CoordMode::PytorchHalfPixel => (2 * i, i - o, 2 * o),
            CoordMode::AlignCorners if output == 1 => (0, 0, 1),
            CoordMode::AlignCorners => (i - 1, 0, o - 1),
            CoordMode::TfHalfPixelForNearest => (2 * i, i, 2 * o),
        }
    }
}

impl fmt::Display for CoordMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for NearestMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `floor(n / d)` for `d > 0`.
fn floor_div(n: i128, d: i128) -> i128 {
    n.div_euclid(d)
}

/// The input index that nearest mode `mode` picks for the rational source coordinate
/// `n / d` (`d > 0`), clamped to `0..input` as onnxruntime does.
pub fn nearest_index(mode: NearestMode, n: i128, d: i128, input: u64) -> u64 {
    let i = match mode {
        NearestMode::Floor => floor_div(n, d),
        NearestMode::Ceil => floor_div(n + d - 1, d),
        // ceil(n / d - 1/2) = floor((2n + d - 1) / 2d)
        NearestMode::RoundPreferFloor => floor_div(2 * n + d - 1, 2 * d),
        // floor(n / d + 1/2) = floor((2n + d) / 2d)
        NearestMode::RoundPreferCeil => floor_div(2 * n + d, 2 * d),
    };
    i.clamp(0, input as i128 - 1) as u64
}

/// The two input indices and the weight of the second that a linear blend takes for the
/// rational source coordinate `n / d` (`d > 0`): the coordinate clamped to `[0, input - 1]`,
/// `i0` its floor, `i1 = min(i0 + 1, input - 1)`, and `(num, d)` the fraction `num / d`
/// of the way from `i0` to `i1`. As ONNX's edge padding and onnxruntime's clamping.
pub fn linear_taps(n: i128, d: i128, input: u64) -> (u64, u64, i128) {
    let last = input as i128 - 1;
    let n = n.clamp(0, last * d);
    let i0 = n / d;
    let frac = n - i0 * d;
    let i1 = (i0 + 1).min(last);
    (i0 as u64, i1 as u64, frac)
}

/// A resize scale factor `num / den`: a whole factor (`den` 1), or a fraction whose
/// denominator is a power of two up to [`ScaleFactor::MAX_DEN`] and whose odd numerator is at
/// most [`ScaleFactor::MAX_FRACTION_NUM`] (0.5, 0.75, 1.5, 2.5, ...). An output extent is
/// `floor(input * num / den)`, which onnxruntime computes in f32: for these factors its
/// product is exact up to inputs of 2^24 / 255 = 65793 pixels, so both agree, and so do their
/// source coordinates (a tie of a nearest mode is exactly representable on both sides).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScaleFactor {
    num: u64,
    den: u64,
}

impl ScaleFactor {
    /// The largest denominator of a fractional factor: 2^16.
    pub const MAX_DEN: u64 = 1 << 16;
    /// The largest numerator of a fractional factor.
    pub const MAX_FRACTION_NUM: u64 = 255;

    /// The whole factor `n`.
    pub fn whole(n: u64) -> ScaleFactor {
        ScaleFactor { num: n, den: 1 }
    }

    /// The factor `num / den` in lowest terms, if it is a whole factor or a fraction of the
    /// supported form.
    pub fn new(num: u64, den: u64) -> Option<ScaleFactor> {
        if num == 0 || den == 0 {
            return None;
        }
        let shift = num.trailing_zeros().min(den.trailing_zeros());
        let (num, den) = (num >> shift, den >> shift);
        let fraction = den > 1;
        (!fraction
            || (den.is_power_of_two() && den <= Self::MAX_DEN && num <= Self::MAX_FRACTION_NUM))
            .then_some(ScaleFactor { num, den })
    }

    /// A scale (an ONNX `f32`, or the text format's decimal) exactly, if it is a whole factor
    /// or a fraction of the supported form.
    pub fn from_f64(scale: f64) -> Option<ScaleFactor> {
        if !(scale.is_finite() && scale > 0.0) {
            return None;
        }
        if scale.fract() == 0.0 {
            return (scale <= u32::MAX as f64).then(|| ScaleFactor::whole(scale as u64));
        }
        // Scaled by 2^16 (exactly: a power of two), a supported fraction is a whole number.
        let scaled = scale * Self::MAX_DEN as f64;
        (scaled.fract() == 0.0 && scaled <= u32::MAX as f64)
            .then(|| ScaleFactor::new(scaled as u64, Self::MAX_DEN))
            .flatten()
    }

    pub fn num(self) -> u64 {
        self.num
    }

    pub fn den(self) -> u64 {
        self.den
    }

    pub fn is_whole(self) -> bool {
        self.den == 1
    }

    /// `floor(extent * num / den)`, or `None` where it overflows.
    pub fn apply(self, extent: u64) -> Option<u64> {
        Some(extent.checked_mul(self.num)? / self.den)
    }
}

impl fmt::Display for ScaleFactor {
    /// A whole factor as an integer, a fraction as its exact decimal (`1.5`, `0.25`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_whole() {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}", self.num as f64 / self.den as f64)
        }
    }
}

/// How `resize` gets its output's height and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResizeSize {
    /// The input's extents times these factors, rounded down (each output extent must be at
    /// least 1); coordinates map by the factors.
    Scale([ScaleFactor; 2]),
    /// Fixed extents.
    Sizes([u64; 2]),
    /// The height and width of another value, as ONNX's sizes computed by `Shape` of a tensor.
    Like(Value),
}

/// Spatial resizing of an `[N, C, H, W]` value with ONNX `Resize` semantics: nearest or
/// (bi)linear, under one coordinate transformation mode.
#[derive(Clone, Debug, PartialEq)]
pub struct Resize {
    pub input: Value,
    pub mode: ResizeMode,
    pub coord: CoordMode,
    pub size: ResizeSize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// x_original in f64 per the ONNX spec's formulas.
    fn spec(coord: CoordMode, x: u64, input: u64, output: u64) -> f64 {
        let (x, i, o) = (x as f64, input as f64, output as f64);
        let scale = o / i;
        match coord {
            CoordMode::HalfPixel => (x + 0.5) / scale - 0.5,
            CoordMode::PytorchHalfPixel if output > 1 => (x + 0.5) / scale - 0.5,
            CoordMode::PytorchHalfPixel => 0.0,
            CoordMode::AlignCorners if output == 1 => 0.0,
            CoordMode::AlignCorners => x * (i - 1.0) / (o - 1.0),
            CoordMode::Asymmetric => x / scale,
            CoordMode::TfHalfPixelForNearest => (x + 0.5) / scale,
        }
    }

    #[test]
    fn affine_maps_match_the_spec_formulas() {
        for coord in CoordMode::ALL {
            for input in 1..9 {
                for output in 1..13 {
                    let (a, b, d) = coord.source_affine(input, output);
                    for x in 0..output {
                        let exact = (a * x as i128 + b) as f64 / d as f64;
                        let want = spec(coord, x, input, output);
                        assert!(
                            (exact - want).abs() < 1e-9,
                            "{coord} {input}->{output} x={x}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn nearest_modes_round_ties_their_way_and_clamp() {
        // 2.5: floor/ceil/halves down/halves up.
        let pick = |m| nearest_index(m, 5, 2, 10);
        assert_eq!(pick(NearestMode::Floor), 2);
        assert_eq!(pick(NearestMode::Ceil), 3);
        assert_eq!(pick(NearestMode::RoundPreferFloor), 2);
        assert_eq!(pick(NearestMode::RoundPreferCeil), 3);
        // 2.7 and 2.3 round to nearest in both round modes.
        for m in [NearestMode::RoundPreferFloor, NearestMode::RoundPreferCeil] {
            assert_eq!(nearest_index(m, 27, 10, 10), 3);
            assert_eq!(nearest_index(m, 23, 10, 10), 2);
        }
        // Negative coordinates clamp to 0, past the end to the last pixel.
        for m in NearestMode::ALL {
            assert_eq!(nearest_index(m, -1, 4, 10), 0);
            assert_eq!(nearest_index(m, 95, 10, 10), 9);
        }
    }

    #[test]
    fn linear_taps_clamp_to_the_edges() {
        assert_eq!(linear_taps(-1, 4, 5), (0, 1, 0));
        assert_eq!(linear_taps(9, 4, 5), (2, 3, 1));
        assert_eq!(linear_taps(17, 4, 5), (4, 4, 0));
        assert_eq!(linear_taps(3, 1, 1), (0, 0, 0));
    }
}
