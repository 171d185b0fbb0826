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

use anyhow::{Context, Result, bail};
use primjit::ir::{Pads, PoolKind, PoolWindow};
use primjit::{ConvDesc, Layout, PoolDesc, RuntimeDims};

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
                .with_context(|| format!("descriptor `{text}`: unterminated name"))?;
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
            bail!("descriptor `{text}`: expected an entry such as `ic64` at `{rest}`");
        }
        let r = match r.strip_prefix('*') {
            Some(r) => {
                match key {
                    "ih" => d.runtime.h = true,
                    "iw" => d.runtime.w = true,
                    _ => bail!(
                        "descriptor `{text}`: only `ih` and `iw` can be runtime extents (`*`), not `{key}`"
                    ),
                }
                r
            }
            None => r,
        };
        if !KNOWN.contains(&key) {
            bail!("descriptor `{text}`: unknown entry `{key}`");
        }
        if matches!(key, "id" | "od" | "kd" | "sd") {
            bail!("descriptor `{text}`: 3-D problems (`{key}`) are not supported");
        }
        let value: usize = num
            .parse()
            .with_context(|| format!("descriptor `{text}`: `{num}` is too large"))?;
        if d.entries.insert(key.to_string(), value).is_some() {
            bail!("descriptor `{text}`: `{key}` is given twice");
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
            .with_context(|| format!("the descriptor needs `{key}`"))
    }

    /// One spatial axis: input, begin padding, kernel, stride, dilation (ONNX: 1 = dense), end
    /// padding.
    fn axis(&self, a: &str, b: &str) -> Result<(usize, usize, usize, usize, usize, usize)> {
        let input = self
            .get(&format!("i{a}"))
            .or(self.get(&format!("i{b}")))
            .with_context(|| format!("the descriptor needs `i{a}`"))?;
        let kernel = self
            .get(&format!("k{a}"))
            .or(self.get(&format!("k{b}")))
            .with_context(|| format!("the descriptor needs `k{a}`"))?;
        let stride = self
            .get(&format!("s{a}"))
            .or(self.get(&format!("s{b}")))
            .unwrap_or(1);
        let dilation = self
            .get(&format!("d{a}"))
            .or(self.get(&format!("d{b}")))
            .unwrap_or(0)
            + 1;
        if stride == 0 || kernel == 0 || input == 0 {
            bail!("the descriptor's extents, kernel and strides must be at least 1");
        }
        let extent = dilation * (kernel - 1) + 1;
        let pad = self.get(&format!("p{a}")).or(self.get(&format!("p{b}")));
        let out = self.get(&format!("o{a}"));
        let (pad_begin, output) = match (pad, out) {
            (Some(p), Some(o)) => (p, o),
            (Some(p), None) => (
                p,
                (input + 2 * p)
                    .checked_sub(extent)
                    .map_or(0, |s| s / stride + 1),
            ),
            (None, Some(o)) => (((o - 1) * stride + extent).saturating_sub(input) / 2, o),
            (None, None) => (0, input.checked_sub(extent).map_or(0, |s| s / stride + 1)),
        };
        if output == 0 {
            bail!("the descriptor's output along `{a}` would be empty");
        }
        let pad_end = ((output - 1) * stride + extent).saturating_sub(input + pad_begin);
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
        })
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
        assert_eq!(
            d.pads,
            Pads {
                top: 1,
                left: 1,
                bottom: 1,
                right: 1
            }
        );
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
