//! The variable-width workload: the shipped widths, shape policies, deterministic inputs, and
//! the process's resident memory.

use std::num::IntErrorKind;
use std::path::Path;

use anyhow::{Context, Result, bail};
use primjit_ir::{Tensor, random_tensor};

/// The benchmark widths, copied unchanged from the workload that the peers were measured on.
pub const SHIPPED_WIDTHS: &str = include_str!("../../../benches/data/widths.txt");
/// The default model: the ResNet34 trunk of the original report.
pub const TRUNK_IR: &str = include_str!("../../../ir/resnet34_trunk.ir");

/// A count given on the command line (`--threads`, `--capacity`, `--entries`, a sweep's
/// capacity): a non-negative integer, and one past `usize` is too large, not malformed.
pub fn parse_count(text: &str) -> Result<usize, String> {
    text.parse::<usize>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => format!("`{text}` is too large: at most {}", usize::MAX),
        _ => format!("`{text}` is not a non-negative integer"),
    })
}

/// `--n`: a count of calls, whose limit is the workload's length (checked once it is read).
pub fn parse_calls(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => Err(format!(
            "`{text}` is too large: at most the number of widths (the `--widths` file's, else the shipped workload's 1000)"
        )),
        _ => parse_count(text),
    }
}

/// Reads widths, one per line (blank lines and `#` comments ignored).
pub fn parse_widths(text: &str, origin: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        match line.parse::<usize>() {
            Ok(w) if w > 0 => out.push(w),
            Err(e) if *e.kind() == IntErrorKind::PosOverflow => bail!(
                "{origin}:{}: the width `{line}` is too large: at most {}",
                i + 1,
                usize::MAX
            ),
            _ => bail!(
                "{origin}:{}: expected a positive width, found `{line}`",
                i + 1
            ),
        }
    }
    if out.is_empty() {
        bail!("{origin}: no widths");
    }
    Ok(out)
}

pub fn load_widths(path: Option<&Path>) -> Result<Vec<usize>> {
    match path {
        None => parse_widths(SHIPPED_WIDTHS, "benches/data/widths.txt"),
        Some(p) => {
            let text = primjit::file::read_regular_to_string(p)
                .with_context(|| format!("cannot read `{}`", p.display()))?;
            parse_widths(&text, &p.display().to_string())
        }
    }
}

/// How a call's width becomes the width the model runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Specialize on every width (the report's "no binning")
    Exact,
    /// Pad the width with zeros up to a multiple of 320
    Bucket320,
    /// Pad to a multiple of 40 below 640, 80 below 1280, 160 below 2560, else 320 (the report's
    /// "flexible binning")
    Bucketflex,
    /// Run every width exactly with one primitive per node configuration: convolutions and
    /// pooling take the width at run time
    Dynamic,
}

impl Policy {
    pub fn padded_width(self, w: usize) -> usize {
        let step = match self {
            Policy::Exact | Policy::Dynamic => return w,
            Policy::Bucket320 => 320,
            Policy::Bucketflex if w < 640 => 40,
            Policy::Bucketflex if w < 1280 => 80,
            Policy::Bucketflex if w < 2560 => 160,
            Policy::Bucketflex => 320,
        };
        // Saturating: a width this large is refused when the call's shapes are bound.
        w.div_ceil(step).saturating_mul(step)
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Exact => "exact",
            Policy::Bucket320 => "bucket320",
            Policy::Bucketflex => "bucketflex",
            Policy::Dynamic => "dynamic",
        }
    }
}

/// The benchmark's inputs, allocated once: one `[n, c, h, widest]` tensor uniform in [-1, 1)
/// from the seed, whose first `n * c * h * w` floats, viewed as `[n, c, h, w]`, are the input
/// of a call of width `w` (as the peers' harness does), and one buffer at the widest padded
/// width that a bucket policy's padded inputs are written into. So the harness allocates
/// nothing per call, and the growth that `bench` reports is the library's own.
pub struct Inputs {
    source: Vec<f32>,
    padded: Vec<f32>,
    dims: [usize; 3],
}

impl Inputs {
    /// Inputs for widths up to `widest`, padded up to `widest_padded` where `pads` says that
    /// some call is padded (the widest one need not be: 7680 is its own 320-column bucket).
    pub fn new(
        seed: u64,
        [n, c, h]: [usize; 3],
        widest: usize,
        widest_padded: usize,
        pads: bool,
    ) -> Self {
        let source = random_tensor(
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            "x",
            vec![n, c, h, widest],
            -1.0,
            1.0,
        )
        .data;
        let padded = if pads {
            touched_zeros(n * c * h * widest_padded)
        } else {
            Vec::new()
        };
        Inputs {
            source,
            padded,
            dims: [n, c, h],
        }
    }

    /// The input of width `w`, zero-padded to `run_width`: its shape and data.
    pub fn view(&mut self, w: usize, run_width: usize) -> ([usize; 4], &[f32]) {
        let [n, c, h] = self.dims;
        let rows = n * c * h;
        let x = &self.source[..rows * w];
        if run_width == w {
            return ([n, c, h, w], x);
        }
        let y = &mut self.padded[..rows * run_width];
        for (dst, src) in y.chunks_exact_mut(run_width).zip(x.chunks_exact(w)) {
            dst[..w].copy_from_slice(src);
            dst[w..].fill(0.0);
        }
        ([n, c, h, run_width], y)
    }
}

/// `len` zeros whose pages are all written now. A buffer the harness allocates once at the
/// widest width counts in the RSS from the start, as the source buffer (written when drawn)
/// does, instead of growing the RSS as ever wider calls first touch its pages; a plain
/// `vec![0.0; len]` comes from `calloc`, whose large blocks are untouched fresh pages.
pub fn touched_zeros(len: usize) -> Vec<f32> {
    let mut v = vec![0.0; len];
    // The optimizer may not assume the contents, so the fill below is not elided.
    std::hint::black_box(&mut v);
    v.fill(0.0);
    v
}

/// Keeps the first `width` columns of the last dimension.
pub fn crop_width(t: &Tensor, width: usize) -> Tensor {
    let w = *t.shape.last().expect("rank 4");
    let rows = t.data.len() / w;
    let mut data = Vec::with_capacity(rows * width);
    for r in 0..rows {
        data.extend_from_slice(&t.data[r * w..r * w + width]);
    }
    let mut shape = t.shape.clone();
    *shape.last_mut().expect("rank 4") = width;
    Tensor { shape, data }
}

/// The process's resident set size in kB (`VmRSS` of `/proc/self/status`).
pub fn rss_kb() -> Result<u64> {
    status_kb("VmRSS")
}

/// The process's peak resident set size so far in kB (`VmHWM` of `/proc/self/status`).
pub fn hwm_kb() -> Result<u64> {
    status_kb("VmHWM")
}

/// A field of `/proc/self/status` in kB.
fn status_kb(field: &str) -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/self/status"))
}

/// The `p`-th percentile (0..=100) of sorted values, by the nearest-rank method.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `1234567` as `1,234,567`, as the original report prints kilobytes.
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_pad_as_the_report() {
        assert_eq!(Policy::Exact.padded_width(285), 285);
        assert_eq!(Policy::Bucket320.padded_width(285), 320);
        assert_eq!(Policy::Bucket320.padded_width(321), 640);
        assert_eq!(Policy::Bucketflex.padded_width(285), 320);
        assert_eq!(Policy::Bucketflex.padded_width(601), 640);
        assert_eq!(Policy::Bucketflex.padded_width(641), 720);
        assert_eq!(Policy::Bucketflex.padded_width(1281), 1440);
        assert_eq!(Policy::Bucketflex.padded_width(2561), 2880);
    }

    #[test]
    fn shipped_widths_match_their_readme() {
        let w = parse_widths(SHIPPED_WIDTHS, "shipped").unwrap();
        assert_eq!(w.len(), 1000);
        assert_eq!(*w.iter().min().unwrap(), 200);
        assert_eq!(*w.iter().max().unwrap(), 7680);
        let mean = w.iter().sum::<usize>() as f64 / 1000.0;
        assert!((mean - 1031.0).abs() < 1.0, "{mean}");
    }

    #[test]
    fn padded_views_crop_back_to_the_unpadded_ones() {
        let mut inputs = Inputs::new(1, [1, 2, 3], 6, 8, true);
        let (shape, x) = inputs.view(5, 5);
        assert_eq!(shape, [1, 2, 3, 5]);
        let x = Tensor {
            shape: shape.to_vec(),
            data: x.to_vec(),
        };
        // A wider input first, so that padding overwrites what was there.
        inputs.view(6, 8);
        let (shape, p) = inputs.view(5, 8);
        assert_eq!(shape, [1, 2, 3, 8]);
        assert_eq!(p[5..8], [0.0; 3]);
        let p = Tensor {
            shape: shape.to_vec(),
            data: p.to_vec(),
        };
        assert_eq!(crop_width(&p, 5), x);
    }

    #[test]
    fn formats_like_the_report() {
        assert_eq!(thousands(2336028), "2,336,028");
        assert_eq!(thousands(-1000), "-1,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 95.0), 4.0);
        assert!(
            parse_widths("12\nx\n", "f")
                .unwrap_err()
                .to_string()
                .contains("f:2: expected a positive width")
        );
    }
}
