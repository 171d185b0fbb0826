//! Convolution lowerings, one module per algorithm: `direct` for every window, and
//! [`winograd`] F(4x4, 3x3) for 3x3 convolutions of stride 1 or (polyphase) 2. Both tile from
//! the key alone ([`crate::plan::ConvPlan`], [`winograd::WinogradPlan`]), so one packed copy of
//! the weights serves every spatial extent.

pub(crate) mod direct;
pub mod winograd;

use std::fmt;
use std::str::FromStr;

use crate::backend::cranelift::{Emit, Value};
use crate::key::{ConvAlgo, ConvDesc, PostOpDesc};

/// `x` through a key's post-ops in their order, in registers: `zero` is a zero vector for
/// relu and PReLU (made here if `None`), `slopes` this output's vector of PReLU slopes (loaded
/// here, right before use), and `residual(e, i)` loads this output's vector of the `i`th
/// residual, right before it is added. NaN goes through every post-op: relu and clip pass
/// the data as the operand that `maxps`/`minps` return on NaN ([`Emit::pmax`]).
pub(crate) fn apply_post_ops(
    e: &mut Emit<'_>,
    posts: &[PostOpDesc],
    mut x: Value,
    zero: Option<Value>,
    mut slopes: impl FnMut(&mut Emit<'_>) -> Value,
    mut residual: impl FnMut(&mut Emit<'_>, usize) -> Value,
) -> Value {
    let mut adds = 0;
    for post in posts {
        x = match post {
            PostOpDesc::Relu => {
                let zero = zero.unwrap_or_else(|| e.splat_const(0.0));
                e.pmax(zero, x)
            }
            PostOpDesc::Clip { lo, hi } => {
                let lo = e.splat_const(*lo);
                let hi = e.splat_const(*hi);
                let x = e.pmax(lo, x);
                e.pmin(hi, x)
            }
            PostOpDesc::Add => {
                let y = residual(e, adds);
                adds += 1;
                e.fadd(x, y)
            }
            PostOpDesc::Act(a) => crate::lower_eltwise::activation(e, *a, x),
            PostOpDesc::PRelu => {
                let zero = zero.unwrap_or_else(|| e.splat_const(0.0));
                let slope = slopes(e);
                crate::lower_eltwise::prelu(e, x, slope, zero)
            }
        };
    }
    x
}

/// Which convolution algorithm a graph's convolutions use: one of them wherever it applies,
/// or the measured rule of [`ConvAlgoChoice::pick`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvAlgoChoice {
    /// Direct convolution everywhere.
    Direct,
    /// Winograd F(4x4, 3x3) wherever it applies (3x3, stride 1 or 2, dilation 1, no groups,
    /// no fused pool, `nChw4c` in and out), direct elsewhere.
    Winograd,
    /// Winograd where it applies and is faster, by the rule of [`ConvAlgoChoice::pick`].
    #[default]
    Auto,
}

/// The smallest input and output channel counts at which `auto` picks Winograd.
///
/// Per tile, the transforms cost a fixed number of vector operations per input and per output
/// channel, while the GEMMs grow with their product, so few channels favour direct
/// convolution: measured on 3x3 layers of 80 x 258 pixels, Winograd is 1.85x faster
/// than direct at 8 channels and only 1.06x at 4, where it also takes 4x the weights (see
/// docs/decisions/005-winograd-f4x4-3x3.md for the table).
pub const WINOGRAD_MIN_CHANNELS: usize = 8;

/// The same at stride 2, where Winograd's polyphase form saves less (81 multiplications per
/// tile and channel pair against 144, not 36): measured on 3x3 stride-2 layers of an 80 x 258
/// input, Winograd is 1.15-1.5x faster than direct from 16 to 32 channels and no faster from
/// 8 to 16 (docs/decisions/006-winograd-stride-2-polyphase.md).
pub const WINOGRAD_S2_MIN_CHANNELS: usize = 16;

/// The fewest output tiles (of 4x4 pixels) per image at which `auto` picks Winograd at stride
/// 1, where the graph fixes the output's extents.
///
/// Winograd's transformed weights take 4x the bytes of the kernel's, and a network's weights
/// come from memory on every call: on a small image too few tiles share each one. Measured in
/// ResNet18 and ResNet50 at 224x224 (`primjit bench-op --model --vs-algo direct`, Zen3, one
/// thread): at 7x7 (4 tiles) direct took 0.86-0.93x Winograd's time, at 14x14 (16 tiles)
/// Winograd took 0.66-0.74x direct's (decision 031). On two threads ResNet18's 7x7 layers
/// took 1.08-1.12x with direct convolution, whose 7 rows split 4 and 3, ResNet50's 0.93-0.95x.
pub const WINOGRAD_MIN_TILES: usize = 16;

/// The same at stride 2, whose polyphase weights are larger still: outputs of 7x7 and 14x14
/// took 0.70-0.78x Winograd's time with direct convolution, 28x28 (49 tiles) 1.18x.
pub const WINOGRAD_S2_MIN_TILES: usize = 49;

/// The smallest channel counts at which `auto` picks Winograd for `desc`'s strides.
fn min_channels(desc: &ConvDesc) -> usize {
    if desc.strides == [2, 2] {
        WINOGRAD_S2_MIN_CHANNELS
    } else {
        WINOGRAD_MIN_CHANNELS
    }
}

/// The fewest output tiles at which `auto` picks Winograd for `desc`'s strides.
fn min_tiles(desc: &ConvDesc) -> usize {
    if desc.strides == [2, 2] {
        WINOGRAD_S2_MIN_TILES
    } else {
        WINOGRAD_MIN_TILES
    }
}

/// Winograd's 4x4 output tiles over an output of `[oh, ow]`.
fn output_tiles([oh, ow]: [usize; 2]) -> usize {
    oh.div_ceil(4) * ow.div_ceil(4)
}

impl ConvAlgoChoice {
    /// The algorithm for `desc` (whose `algo` and extents are ignored), given the extents of
    /// its output where every input the graph takes gives the same (`None` where they follow
    /// a symbol). The choice never depends on a bound size, so that a node keeps one packing
    /// of its weights for every input size: with symbolic extents it follows the channels,
    /// window and layouts alone.
    pub fn pick(self, desc: &ConvDesc, output: Option<[usize; 2]>) -> ConvAlgo {
        let applies = desc.winograd_unsupported().is_none();
        let channels = desc.ic >= min_channels(desc) && desc.oc >= min_channels(desc);
        let tiles = output.is_none_or(|o| output_tiles(o) >= min_tiles(desc));
        match self {
            ConvAlgoChoice::Direct => ConvAlgo::Direct,
            ConvAlgoChoice::Winograd if applies => ConvAlgo::WinogradF4x3,
            ConvAlgoChoice::Auto if applies && channels && tiles => ConvAlgo::WinogradF4x3,
            _ => ConvAlgo::Direct,
        }
    }

    /// The algorithm [`Self::pick`] gives `desc` and `output`, and why, for `dump --stage
    /// plan`.
    pub fn explain(self, desc: &ConvDesc, output: Option<[usize; 2]>) -> String {
        let algo = self.pick(desc, output);
        let few_tiles = output.filter(|&o| output_tiles(o) < min_tiles(desc));
        let few_channels = desc.ic < min_channels(desc) || desc.oc < min_channels(desc);
        let why = match (self, desc.winograd_unsupported()) {
            (ConvAlgoChoice::Direct, _) => "direct requested".to_string(),
            (_, Some(reason)) => reason.to_string(),
            (ConvAlgoChoice::Winograd, None) => "winograd requested, and it applies".to_string(),
            (ConvAlgoChoice::Auto, None) if few_channels => format!(
                "auto: fewer than {} input or output channels, where the transforms outweigh \
                 the saved multiplications",
                min_channels(desc)
            ),
            (ConvAlgoChoice::Auto, None) if let Some([oh, ow]) = few_tiles => format!(
                "auto: a {oh}x{ow} output is {} winograd tiles, fewer than {}, too few to share \
                 each of its transformed weights",
                output_tiles([oh, ow]),
                min_tiles(desc)
            ),
            (ConvAlgoChoice::Auto, None) => format!(
                "auto: winograd applies and both channel counts are at least {}",
                min_channels(desc)
            ),
        };
        format!("{algo} ({why})")
    }

    pub fn name(self) -> &'static str {
        match self {
            ConvAlgoChoice::Direct => "direct",
            ConvAlgoChoice::Winograd => "winograd",
            ConvAlgoChoice::Auto => "auto",
        }
    }
}

impl fmt::Display for ConvAlgoChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not `direct`, `winograd` or `auto`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown convolution algorithm `{0}`: expected direct, winograd or auto")]
pub struct UnknownConvAlgo(pub String);

impl FromStr for ConvAlgoChoice {
    type Err = UnknownConvAlgo;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "direct" => Ok(ConvAlgoChoice::Direct),
            "winograd" => Ok(ConvAlgoChoice::Winograd),
            "auto" => Ok(ConvAlgoChoice::Auto),
            other => Err(UnknownConvAlgo(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv_3x3(channels: usize, stride: usize) -> ConvDesc {
        let mut d = ConvDesc::new(1, channels, [16, 16], 2 * channels, [3, 3]);
        d.strides = [stride, stride];
        d.src_layout = crate::key::Layout::Nchw4c;
        d.dst_layout = crate::key::Layout::Nchw4c;
        d
    }

    /// `auto` takes Winograd from 8 channels at stride 1 and from 16 at stride 2; `winograd`
    /// wherever it applies, and `dump`'s reason names the bound that decided.
    #[test]
    fn auto_takes_winograd_from_the_measured_channel_counts() {
        let winograd = ConvAlgo::WinogradF4x3;
        for (channels, stride, auto) in [
            (4, 1, ConvAlgo::Direct),
            (8, 1, winograd),
            (8, 2, ConvAlgo::Direct),
            (16, 2, winograd),
        ] {
            let d = conv_3x3(channels, stride);
            assert_eq!(
                ConvAlgoChoice::Auto.pick(&d, None),
                auto,
                "{channels} channels, stride {stride}"
            );
            assert_eq!(ConvAlgoChoice::Winograd.pick(&d, None), winograd);
            assert_eq!(ConvAlgoChoice::Direct.pick(&d, None), ConvAlgo::Direct);
            let bound = if stride == 2 { 16 } else { 8 };
            let why = ConvAlgoChoice::Auto.explain(&d, None);
            assert!(
                why.contains(&format!(" {bound} ")) || why.ends_with(&format!(" {bound})")),
                "{why}"
            );
        }
    }

    /// With the output's extents fixed, `auto` keeps direct convolution below the measured
    /// numbers of Winograd tiles: ResNet's 7x7 layers, and its stride-2 layers to 14x14.
    #[test]
    fn auto_keeps_small_fixed_outputs_direct() {
        let winograd = ConvAlgo::WinogradF4x3;
        let c512 = conv_3x3(256, 1);
        for (d, output, auto) in [
            (&c512, [7, 7], ConvAlgo::Direct),
            (&c512, [14, 14], winograd),
            (&c512, [13, 16], winograd),
            (&c512, [12, 13], ConvAlgo::Direct),
            (&conv_3x3(128, 2), [14, 14], ConvAlgo::Direct),
            (&conv_3x3(128, 2), [28, 28], winograd),
            (&conv_3x3(128, 2), [24, 28], ConvAlgo::Direct),
        ] {
            assert_eq!(
                ConvAlgoChoice::Auto.pick(d, Some(output)),
                auto,
                "{output:?}"
            );
            assert_eq!(ConvAlgoChoice::Auto.pick(d, None), winograd);
            assert_eq!(ConvAlgoChoice::Winograd.pick(d, Some(output)), winograd);
            if auto == ConvAlgo::Direct {
                let why = ConvAlgoChoice::Auto.explain(d, Some(output));
                assert!(why.contains("winograd tiles, fewer than"), "{why}");
            }
        }
    }
}
