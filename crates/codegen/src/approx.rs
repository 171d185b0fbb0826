//! The constants of the vector `exp` and `tanh` (Cephes' `expf` and `tanhf`), shared by the
//! Cranelift lowering (`lower_eltwise`) and the wide tiles' emitter (`backend::x64`), so that
//! both compute the same bits.

/// `exp`'s input is clamped to these first: past them `exp` is 0 or infinite in f32 anyway.
pub(crate) const EXP_MIN: f32 = -104.0;
pub(crate) const EXP_MAX: f32 = 89.0;
/// `expm1` (ELU's) takes `2^n` as one factor, a normal number for `n` in `[-126, 127]`: its
/// input is clamped to this range first. Below it `expm1` is -1 in f32 (from about -17.4).
pub(crate) const EXPM1_RANGE: [f32; 2] = [-87.0, 88.0];
/// `1.5 * 2^23`: adding it rounds a float in `±2^22` to an integer, left in the low bits.
pub(crate) const ROUNDING_MAGIC: f32 = 12_582_912.0;
/// The logistic functions (sigmoid, SiLU) build `1 + exp(-x)` as `2 (exp(-x) / 2 + 1 / 2)`,
/// with `2^(n - 1)` in the exponent bits: one factor for every `n` that occurs, no infinite
/// factor where `exp(-x)` is finite, and an infinite one (at `n = 129`) where `exp(-x)`
/// overflows. `-x` is clamped to these first: below, `1 + exp(-x)` is 1 in f32; above, it is
/// infinite.
pub(crate) const LOGISTIC_EXP_MIN: f32 = -87.0;
pub(crate) const LOGISTIC_EXP_MAX: f32 = 89.5;
/// `1.5 * 2^23 + 126`: adding it rounds a float in `±2^22` to an integer `n` and leaves
/// `n + 126`, the biased exponent of `2^(n - 1)`, in the low bits.
pub(crate) const ROUNDING_MAGIC_HALF: f32 = 12_583_038.0;
/// `-ln 2` in two parts (Cody and Waite): `n * LN2_HI` is exact for the `n` that occur.
pub(crate) const LN2_HI: f32 = -0.693_359_4;
pub(crate) const LN2_LO: f32 = 2.121_944_4e-4;
/// `expm1(r) = r + r^2 P(r)` on `|r| <= ln(2) / 2`, highest degree first.
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];
/// `tanh(x) = x + x^3 P(x^2)` below [`TANH_SMALL`], highest degree first.
pub(crate) const TANH_POLY: [f32; 5] = [
    -5.704_988_7e-3,
    2.063_909e-2,
    -5.373_971_6e-2,
    0.133_314_42,
    -0.333_332_8,
];
/// `expm1(r) = r + r^2 P(r)` for the logistic functions, highest degree first: a degree-5
/// fit to `exp` on `|r| <= ln(2) / 2` (relative error under `1.1e-7`, against `EXP_POLY`'s
/// degree 7), two FMAs a vector fewer; sigmoid and SiLU stay within 8 units in the last place.
pub(crate) const LOGISTIC_POLY: [f32; 4] =
    [0.008_312_525, 0.041_890_115, 0.166_671_14, 0.499_992_3];
/// Below it `tanh` is the polynomial, above `1 - 2 / (exp(2|x|) + 1)`.
pub(crate) const TANH_SMALL: f32 = 0.625;
