//! benchdnn problem descriptors (`mb1ic64ih80iw80oc64oh80ow80kh3kw3sh1sw1ph1pw1`) as keys.
//!
//! Entries are a name and a number (`g2`, `ic64`, ...) in any order, `_` ignored, and
//! `n"label"` for a label. Omitted entries take benchdnn's defaults: `mb2`, `g1`, unit strides,
//! no dilation (benchdnn's `dh0`); a missing width, kernel width, stride or padding copies the
//! height's; a missing output extent follows from the padding (0 when omitted), and a given
//! output extent with omitted padding gets the symmetric padding that produces it. The bottom
//! and right padding are whatever makes the output extent come out.
//!
//! primjit's one extension: a `*` after `ih` or `iw` (`iw1031*`) makes that extent a runtime
//! value of the key (one kernel for every extent, see `RuntimeDims`); the number is the extent
//! the problem runs at.

use std::collections::BTreeMap;

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{ConvAlgoChoice, ConvDesc, Isa, KeyError, Layout, PoolDesc, PrimitiveKey};
use primjit_ir::{Pads, PoolKind, PoolWindow};

/// Why a descriptor does not describe a primitive ([`parse`], [`Descriptor::conv`],
/// [`Descriptor::pool`], [`Descriptor::keys`]). Fix the descriptor as the message says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// The text is not a list of entries such as `ic64`: an unknown or repeated entry, a
    /// number that does not fit, a `*` after an entry other than `ih` or `iw`, a 3-D entry, an
    /// unterminated `n"label"`.
    #[error("descriptor `{text}`: {reason}")]
    Syntax { text: String, reason: String },
    /// An entry the problem needs (`ic`, `oc`, `ih`, `kh`) is missing.
    #[error("the descriptor needs `{0}`")]
    Missing(String),
    /// The entries do not make a problem: a zero extent, kernel or stride, or an empty output.
    #[error("{0}")]
    Problem(String),
    /// The entries make a key that does not validate (a window larger than the padded input,
    /// groups that do not divide the channels, ...); see [`KeyError`].
    #[error(transparent)]
    Key(#[from] KeyError),
}

type Result<T> = std::result::Result<T, DescriptorError>;

fn syntax(text: &str, reason: impl Into<String>) -> DescriptorError {
    DescriptorError::Syntax {
        text: text.to_string(),
        reason: reason.into(),
    }
}

/// What a descriptor is compiled as: benchdnn's conv driver with a choice of convolution
/// algorithm, or its pool driver with a pooling algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescriptorOp {
    Conv(ConvAlgoChoice),
    Pool {
        kind: PoolKind,
        /// benchdnn's `avg_p` (true) against `avg_np` (false); ignored for max pooling.
        count_include_pad: bool,
    },
}

impl DescriptorOp {
    /// benchdnn's pooling algorithm names: `max`, `avg_np` (padding excluded from the
    /// average) and `avg_p` (padding counted).
    pub fn pool(alg: &str) -> Option<Self> {
        let (kind, count_include_pad) = match alg {
            "max" => (PoolKind::Max, false),
            "avg_np" => (PoolKind::Avg, false),
            "avg_p" => (PoolKind::Avg, true),
            _ => return None,
        };
        Some(DescriptorOp::Pool {
            kind,
            count_include_pad,
        })
    }
}

/// A parsed descriptor: its entries and its label.
#[derive(Debug, Default)]
pub struct Descriptor {
    entries: BTreeMap<String, usize>,
    pub name: Option<String>,
    /// The extents marked `*`.
    pub runtime: RuntimeDims,
}

const KNOWN: [&str; 20] = [
    "g", "mb", "ic", "ih", "iw", "oc", "oh", "ow", "kh", "kw", "sh", "sw", "ph", "pw", "dh", "dw",
    "id", "od", "kd", "sd",
];

/// Parses a descriptor's entries; [`Descriptor::conv`], [`Descriptor::pool`] and
/// [`Descriptor::keys`] make a problem of them.
pub fn parse(text: &str) -> Result<Descriptor> {
    let mut d = Descriptor::default();
    let mut rest = text.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('_') {
            rest = r;
            continue;
        }
        if let Some(r) = rest.strip_prefix("n\"") {
            let end = r
                .find('"')
                .ok_or_else(|| syntax(text, "unterminated name"))?;
            d.name = Some(r[..end].to_string());
            rest = &r[end + 1..];
            continue;
        }
        let key_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let (key, r) = rest.split_at(key_len);
        let num_len = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        let (num, r) = r.split_at(num_len);
        if key.is_empty() || num.is_empty() {
            return Err(syntax(
                text,
                format!("expected an entry such as `ic64` at `{rest}`"),
            ));
        }
        let r = match r.strip_prefix('*') {
            Some(r) => {
                match key {
                    "ih" => d.runtime.h = true,
                    "iw" => d.runtime.w = true,
                    _ => {
                        return Err(syntax(
                            text,
                            format!("only `ih` and `iw` can be runtime extents (`*`), not `{key}`"),
                        ));
                    }
                }
                r
            }
            None => r,
        };
        if !KNOWN.contains(&key) {
            return Err(syntax(text, format!("unknown entry `{key}`")));
        }
        if matches!(key, "id" | "od" | "kd" | "sd") {
            return Err(syntax(
                text,
                format!("3-D problems (`{key}`) are not supported"),
            ));
        }
        let value: usize = num
            .parse()
            .map_err(|_| syntax(text, format!("`{num}` is too large")))?;
        if d.entries.insert(key.to_string(), value).is_some() {
            return Err(syntax(text, format!("`{key}` is given twice")));
        }
        rest = r;
    }
    Ok(d)
}

impl Descriptor {
    fn get(&self, key: &str) -> Option<usize> {
        self.entries.get(key).copied()
    }

    fn required(&self, key: &str) -> Result<usize> {
        self.get(key)
            .ok_or_else(|| DescriptorError::Missing(key.to_string()))
    }

    /// One spatial axis: input, begin padding, kernel, stride, dilation (ONNX: 1 = dense), end
    /// padding.
    fn axis(&self, a: &str, b: &str) -> Result<(usize, usize, usize, usize, usize, usize)> {
        let input = self
            .get(&format!("i{a}"))
            .or(self.get(&format!("i{b}")))
            .ok_or_else(|| DescriptorError::Missing(format!("i{a}")))?;
        let kernel = self
            .get(&format!("k{a}"))
            .or(self.get(&format!("k{b}")))
            .ok_or_else(|| DescriptorError::Missing(format!("k{a}")))?;
        let stride = self
            .get(&format!("s{a}"))
            .or(self.get(&format!("s{b}")))
            .unwrap_or(1);
        // Checked throughout: the numbers come from the user, and a wrapped extent would
        // describe another problem.
        let too_large = || {
            DescriptorError::Problem(format!(
                "the descriptor's extents along `{a}` are too large"
            ))
        };
        let dilation = self
            .get(&format!("d{a}"))
            .or(self.get(&format!("d{b}")))
            .unwrap_or(0)
            .checked_add(1)
            .ok_or_else(too_large)?;
        if stride == 0 || kernel == 0 || input == 0 {
            return Err(DescriptorError::Problem(
                "the descriptor's extents, kernel and strides must be at least 1".into(),
            ));
        }
        let extent = dilation
            .checked_mul(kernel - 1)
            .and_then(|e| e.checked_add(1))
            .ok_or_else(too_large)?;
        // The padded input `output` windows span.
        let spanned = |output: usize| {
            output
                .checked_sub(1)
                .and_then(|o| o.checked_mul(stride))
                .and_then(|o| o.checked_add(extent))
                .ok_or_else(too_large)
        };
        let pad = self.get(&format!("p{a}")).or(self.get(&format!("p{b}")));
        let out = self.get(&format!("o{a}"));
        let (pad_begin, output) = match (pad, out) {
            (Some(p), Some(o)) => (p, o),
            (Some(p), None) => {
                let padded = p
                    .checked_mul(2)
                    .and_then(|p| p.checked_add(input))
                    .ok_or_else(too_large)?;
                (p, padded.checked_sub(extent).map_or(0, |s| s / stride + 1))
            }
            (None, Some(0)) => (0, 0),
            (None, Some(o)) => (spanned(o)?.saturating_sub(input) / 2, o),
            (None, None) => (0, input.checked_sub(extent).map_or(0, |s| s / stride + 1)),
        };
        if output == 0 {
            return Err(DescriptorError::Problem(format!(
                "the descriptor's output along `{a}` would be empty"
            )));
        }
        let begin = input.checked_add(pad_begin).ok_or_else(too_large)?;
        let pad_end = spanned(output)?.saturating_sub(begin);
        // A given output that no padding reaches (fewer windows than the input holds without
        // any) is refused, not replaced by the extent the input gives.
        let padded = begin.checked_add(pad_end).ok_or_else(too_large)?;
        let computed = padded.checked_sub(extent).map_or(0, |s| s / stride + 1);
        if computed != output {
            return Err(DescriptorError::Problem(format!(
                "the descriptor's output along `{a}` is {output}, but its input and padding give {computed}"
            )));
        }
        Ok((input, pad_begin, kernel, stride, dilation, pad_end))
    }

    /// The convolution this descriptor describes, with bias, in the given layouts.
    pub fn conv(&self, layout: Layout) -> Result<ConvDesc> {
        let (ih, pt, kh, sh, dh, pb) = self.axis("h", "w")?;
        let (iw, pl, kw, sw, dw, pr) = self.axis("w", "h")?;
        let mut d = ConvDesc::new(
            self.get("mb").unwrap_or(2),
            self.required("ic")?,
            [ih, iw],
            self.required("oc")?,
            [kh, kw],
        );
        d.groups = self.get("g").unwrap_or(1);
        d.strides = [sh, sw];
        d.dilations = [dh, dw];
        d.pads = Pads {
            top: pt,
            left: pl,
            bottom: pb,
            right: pr,
        };
        d.bias = true;
        d.src_layout = layout;
        d.dst_layout = layout;
        Ok(d)
    }

    /// The pooling this descriptor describes (`ic` channels; `oc` ignored).
    pub fn pool(
        &self,
        kind: PoolKind,
        count_include_pad: bool,
        layout: Layout,
    ) -> Result<PoolDesc> {
        let (ih, pt, kh, sh, dh, pb) = self.axis("h", "w")?;
        let (iw, pl, kw, sw, dw, pr) = self.axis("w", "h")?;
        Ok(PoolDesc {
            kind,
            mb: self.get("mb").unwrap_or(2),
            c: self.required("ic")?,
            ih,
            iw,
            window: PoolWindow {
                kernel: [kh, kw],
                strides: [sh, sw],
                pads: Pads {
                    top: pt,
                    left: pl,
                    bottom: pb,
                    right: pr,
                },
                dilations: [dh, dw],
                ceil_mode: false,
            },
            count_include_pad,
            src_layout: layout,
            dst_layout: layout,
            runtime: RuntimeDims::NONE,
            isa: Isa::X128,
        })
    }

    /// The problem's key at the descriptor's extents and the key to compile, which leaves the
    /// extents marked `*` to run time (the same key when none is); both are validated.
    pub fn keys(&self, op: DescriptorOp, layout: Layout) -> Result<(PrimitiveKey, PrimitiveKey)> {
        let key = match op {
            DescriptorOp::Conv(choice) => {
                let mut conv = self.conv(layout)?;
                // A descriptor's extents are fixed unless `*` leaves them to run time.
                let output = (self.runtime == RuntimeDims::NONE).then(|| [conv.oh(), conv.ow()]);
                conv.algo = choice.pick(&conv, output);
                PrimitiveKey::Conv(conv)
            }
            DescriptorOp::Pool {
                kind,
                count_include_pad,
            } => PrimitiveKey::Pool(self.pool(kind, count_include_pad, layout)?),
        };
        key.validate()?;
        let compiled = match &key {
            PrimitiveKey::Conv(d) => PrimitiveKey::Conv(d.clone().with_runtime(self.runtime)),
            PrimitiveKey::Pool(d) => PrimitiveKey::Pool(d.clone().with_runtime(self.runtime)),
            _ => key.clone(),
        };
        compiled.validate()?;
        Ok((key, compiled))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_descriptor_round_trips_through_the_key() {
        let d = parse("mb1ic64ih80iw80oc64oh80ow80kh3kw3sh1sw1ph1pw1")
            .unwrap()
            .conv(Layout::Nchw)
            .unwrap();
        assert_eq!((d.mb, d.ic, d.oc, d.oh(), d.ow()), (1, 64, 64, 80, 80));
        assert_eq!(d.pads, Pads::uniform(1));
    }

    #[test]
    fn defaults_follow_benchdnn() {
        let p = parse("ic3ih227oc96oh55kh11sh4n\"alexnet:conv1\"").unwrap();
        assert_eq!(p.name.as_deref(), Some("alexnet:conv1"));
        let d = p.conv(Layout::Nchw).unwrap();
        assert_eq!(
            (d.mb, d.iw, d.kw, d.strides, d.ow()),
            (2, 227, 11, [4, 4], 55)
        );
        assert_eq!(d.pads.top, 0);
        // Output from padding: 3x3 pad 1 keeps the size; dilation entries are benchdnn's gaps.
        let d = parse("mb1_ic8oc8_ih10kh3ph1_dh1")
            .unwrap()
            .conv(Layout::Nchw)
            .unwrap();
        assert_eq!((d.dilations, d.oh(), d.ow()), ([2, 2], 8, 8));
    }

    #[test]
    fn a_star_marks_a_runtime_extent() {
        let p = parse("mb1ic64ih80iw1031*oc64kh3ph1").unwrap();
        assert_eq!(p.runtime, RuntimeDims { h: false, w: true });
        let d = p.conv(Layout::Nchw4c).unwrap();
        assert_eq!((d.iw, d.ow()), (1031, 1031));
        assert!(
            parse("mb1ic64*ih8oc8kh3")
                .unwrap_err()
                .to_string()
                .contains("only `ih` and `iw`")
        );
    }

    #[test]
    fn keys_leave_starred_extents_to_run_time_and_validate() {
        let d = parse("mb1ic8ih10iw37*oc8kh3ph1").unwrap();
        let (key, compiled) = d
            .keys(DescriptorOp::Conv(ConvAlgoChoice::Direct), Layout::Nchw)
            .unwrap();
        assert_eq!(key.runtime_dims(), RuntimeDims::NONE);
        assert_eq!(compiled.runtime_dims(), RuntimeDims { h: false, w: true });
        assert_eq!(compiled.at(key.input_extents()), key);
        let pool = DescriptorOp::pool("avg_p").unwrap();
        let (key, _) = parse("mb1ic8ih10kh3sh2")
            .unwrap()
            .keys(pool, Layout::Nchw4c)
            .unwrap();
        assert!(matches!(key, PrimitiveKey::Pool(p) if p.count_include_pad));
        assert_eq!(DescriptorOp::pool("min"), None);
        // Parses, but 3 groups do not divide 8 channels: the key's own error.
        let err = parse("mb1g3ic8ih10oc8kh3")
            .unwrap()
            .keys(DescriptorOp::Conv(ConvAlgoChoice::Auto), Layout::Nchw)
            .unwrap_err();
        assert!(matches!(err, DescriptorError::Key(_)), "{err}");
    }

    #[test]
    fn bad_descriptors_are_errors() {
        assert!(
            parse("ic64x3")
                .unwrap_err()
                .to_string()
                .contains("unknown entry `x`")
        );
        assert!(parse("ic64ic3").unwrap_err().to_string().contains("twice"));
        assert!(parse("ic4id3").unwrap_err().to_string().contains("3-D"));
        assert!(
            parse("ic4oc4kh3")
                .unwrap()
                .conv(Layout::Nchw)
                .unwrap_err()
                .to_string()
                .contains("needs `ih`")
        );
        assert!(
            parse("ic4oc4ih2kh3")
                .unwrap()
                .conv(Layout::Nchw)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
    }
}
