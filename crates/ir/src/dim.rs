//! Dimensions that are numbers, named symbols, or window arithmetic over a symbol.

use std::collections::BTreeMap;
use std::fmt;

/// Values bound to the symbols of a graph's input shapes, e.g. `W=1031`.
pub type Bindings = BTreeMap<String, u64>;

/// Parses `W=1031,H=320` into bindings; the error says which item is malformed.
pub fn parse_bindings(text: &str) -> Result<Bindings, String> {
    let mut out = Bindings::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| format!("binding `{item}` is not of the form NAME=VALUE"))?;
        let name = name.trim();
        if !is_symbol(name) {
            return Err(format!("`{name}` is not a valid symbol name"));
        }
        let value = value.trim();
        let value: u64 = value.parse().map_err(|e: std::num::ParseIntError| {
            if *e.kind() == std::num::IntErrorKind::PosOverflow {
                format!(
                    "the value of `{name}`, `{value}`, is too large: at most {}",
                    u64::MAX
                )
            } else {
                format!("the value of `{name}` is not a non-negative integer: `{value}`")
            }
        })?;
        if value == 0 {
            return Err(format!("`{name}` must be at least 1"));
        }
        if out.insert(name.to_string(), value).is_some() {
            return Err(format!("`{name}` is bound twice"));
        }
    }
    Ok(out)
}

pub(crate) fn is_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One dimension of a shape.
///
/// Shape inference keeps a dimension symbolic as long as a symbol it depends on is unbound,
/// so `check` without bindings still prints shapes such as `[1, 64, 160, (W - 1) / 2 + 1]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Known(u64),
    Sym(String),
    /// The number of positions of a sliding window over `input`:
    /// `floor((input + offset) / stride) + 1` where `offset` is the total padding less the
    /// window's extent; with `ceil` the ceiling, less one when the last window would start in
    /// the end padding (which is where `pad_begin` matters; it is 0 otherwise). Windows that
    /// differ only in how they split the same offset compare equal, so that a 3x3/2 conv with
    /// padding 1 and a 1x1/2 downsample give the same symbolic width.
    Window {
        input: Box<Dim>,
        offset: i64,
        stride: u64,
        ceil: bool,
        pad_begin: u64,
    },
    /// `floor(input * factor / den)`: a symbolic extent resized by a scale factor, whole
    /// (`den` 1, `factor` at least 2) or a fraction.
    Scaled {
        input: Box<Dim>,
        factor: u64,
        den: u64,
    },
}

impl Dim {
    pub fn known(&self) -> Option<u64> {
        match self {
            Dim::Known(n) => Some(*n),
            _ => None,
        }
    }

    /// The extent of a window over this dimension, folded when the input is known.
    pub fn window(
        &self,
        pad_begin: u64,
        pad_end: u64,
        extent: u64,
        stride: u64,
        ceil: bool,
    ) -> Result<Dim, WindowError> {
        if let Dim::Known(n) = self {
            return window_extent(*n, pad_begin, pad_end, extent, stride, ceil).map(Dim::Known);
        }
        // Clamped rather than overflowing; shape inference rejects such windows first.
        let offset = (pad_begin as i128 + pad_end as i128 - extent as i128)
            .clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        // A floor window over a floor window is one window over the inner's input, since
        // floor((floor((x + o1) / s1) + 1 + o2) / s2) + 1 = floor((x + o1 + s1 (1 + o2)) /
        // (s1 s2)) + 1: a chain of convolutions, or shape arithmetic (`(H + a) / b + c`),
        // compares equal to any other computing the same extent. Where the inner window fits
        // its input, both fail for the same extents (the merged numerator is negative exactly
        // when the outer one is); where it does not, the inner value's own extent is refused.
        if let Dim::Window {
            input,
            offset: inner,
            stride: s1,
            ceil: false,
            ..
        } = self
            && !ceil
        {
            let merged = *inner as i128 + *s1 as i128 * (1 + offset as i128);
            if let (Ok(merged), Some(stride)) = (i64::try_from(merged), s1.checked_mul(stride)) {
                return Ok(if merged == -1 && stride == 1 {
                    (**input).clone()
                } else {
                    Dim::Window {
                        input: input.clone(),
                        offset: merged,
                        stride,
                        ceil: false,
                        pad_begin: 0,
                    }
                });
            }
        }
        if offset == -1 && stride == 1 {
            // "same" windows keep the extent.
            return Ok(self.clone());
        }
        Ok(Dim::Window {
            input: Box::new(self.clone()),
            offset,
            stride,
            ceil,
            pad_begin: if ceil { pad_begin } else { 0 },
        })
    }

    /// This dimension plus `c` (shape arithmetic: `H + c`), as a window of stride 1, so that
    /// it merges with the windows around it; `None` where a known result would be below 1.
    pub fn plus(&self, c: i64) -> Option<Dim> {
        let (pad_end, extent) = if c >= 0 {
            (c.unsigned_abs(), 1)
        } else {
            (0, 1 + c.unsigned_abs())
        };
        self.window(0, pad_end, extent, 1, false).ok()
    }

    /// This dimension divided by `k` (at least 1) and rounded down (shape arithmetic: `H /
    /// k`), as a window of stride `k`; `None` where a known result would be below 1.
    pub fn floor_div(&self, k: u64) -> Option<Dim> {
        if k == 0 {
            return None;
        }
        self.window(0, 0, k, k, false).ok()
    }

    /// This dimension times a whole `factor` (at least 1), folded when known; `None` when a
    /// known product overflows.
    pub fn scaled(&self, factor: u64) -> Option<Dim> {
        self.scaled_ratio(factor, 1)
    }

    /// `floor(self * factor / den)` (both at least 1), folded when known; `None` when a known
    /// product overflows. Whole factors of a whole-scaled extent multiply.
    pub fn scaled_ratio(&self, factor: u64, den: u64) -> Option<Dim> {
        Some(match self {
            Dim::Known(n) => Dim::Known(n.checked_mul(factor)? / den),
            _ if factor == 1 && den == 1 => self.clone(),
            Dim::Scaled {
                input,
                factor: f,
                den: 1,
            } if den == 1 => Dim::Scaled {
                input: input.clone(),
                factor: f.checked_mul(factor)?,
                den: 1,
            },
            _ => Dim::Scaled {
                input: Box::new(self.clone()),
                factor,
                den,
            },
        })
    }

    /// Whether two dimensions are certainly different (both known and unequal).
    pub fn provably_differs(&self, other: &Dim) -> bool {
        matches!((self, other), (Dim::Known(a), Dim::Known(b)) if a != b)
    }

    pub(crate) fn collect_symbols(&self, out: &mut Vec<String>) {
        match self {
            Dim::Known(_) => {}
            Dim::Sym(s) => {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            }
            Dim::Window { input, .. } | Dim::Scaled { input, .. } => input.collect_symbols(out),
        }
    }
}

/// A window that does not fit in its padded input (or has stride 0), from [`Dim::window`]:
/// `extent` (the dilated kernel) is larger than `padded_input`. Not a `std::error::Error`:
/// shape inference turns it into a [`crate::VerifyError`] naming the node, which is what
/// callers see; use a smaller kernel or dilation, more padding, or a larger input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowError {
    pub padded_input: u64,
    pub extent: u64,
}

/// The number of window positions along one axis; see [`Dim::Window`].
pub(crate) fn window_extent(
    input: u64,
    pad_begin: u64,
    pad_end: u64,
    extent: u64,
    stride: u64,
    ceil: bool,
) -> Result<u64, WindowError> {
    let padded = input.saturating_add(pad_begin).saturating_add(pad_end);
    if padded < extent || stride == 0 {
        return Err(WindowError {
            padded_input: padded,
            extent,
        });
    }
    let span = padded - extent;
    let mut out = if ceil {
        span.div_ceil(stride) + 1
    } else {
        span / stride + 1
    };
    // The last window must start inside the input or the begin padding.
    if ceil && (out - 1) as u128 * stride as u128 >= input as u128 + pad_begin as u128 {
        out -= 1;
    }
    Ok(out)
}

/// Evaluates a window over a known input given its normalized offset.
fn eval_window(
    input: u64,
    offset: i64,
    stride: u64,
    ceil: bool,
    pad_begin: u64,
) -> Result<u64, WindowError> {
    let padded = input as i128 + offset as i128;
    if padded < 0 {
        return Err(WindowError {
            padded_input: input,
            extent: offset.unsigned_abs(),
        });
    }
    let span = u64::try_from(padded).unwrap_or(u64::MAX);
    let mut out = if ceil {
        span.div_ceil(stride).saturating_add(1)
    } else {
        (span / stride).saturating_add(1)
    };
    if ceil && (out - 1) as u128 * stride as u128 >= input as u128 + pad_begin as u128 {
        out -= 1;
    }
    Ok(out)
}

impl Dim {
    /// Replaces bound symbols by their values and folds windows over known extents.
    pub fn resolve(&self, bindings: &Bindings) -> Result<Dim, WindowError> {
        Ok(match self {
            Dim::Known(n) => Dim::Known(*n),
            Dim::Sym(s) => match bindings.get(s) {
                Some(v) => Dim::Known(*v),
                None => Dim::Sym(s.clone()),
            },
            Dim::Window {
                input,
                offset,
                stride,
                ceil,
                pad_begin,
            } => match input.resolve(bindings)? {
                Dim::Known(n) => Dim::Known(eval_window(n, *offset, *stride, *ceil, *pad_begin)?),
                input => Dim::Window {
                    input: Box::new(input),
                    offset: *offset,
                    stride: *stride,
                    ceil: *ceil,
                    pad_begin: *pad_begin,
                },
            },
            // Saturating: shape inference's element count rejects such extents.
            Dim::Scaled { input, factor, den } => match input.resolve(bindings)? {
                Dim::Known(n) => Dim::Known(n.saturating_mul(*factor) / den),
                input => Dim::Scaled {
                    input: Box::new(input),
                    factor: *factor,
                    den: *den,
                },
            },
        })
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Scaled { input, factor, den } => {
                let nested = matches!(**input, Dim::Window { .. } | Dim::Scaled { den: 2.., .. });
                match (nested, factor) {
                    (true, 1) => write!(f, "({input})")?,
                    (true, _) => write!(f, "({input}) * {factor}")?,
                    (false, 1) => write!(f, "{input}")?,
                    (false, _) => write!(f, "{input} * {factor}")?,
                }
                match den {
                    1 => Ok(()),
                    d => write!(f, " / {d}"),
                }
            }
            Dim::Window {
                input,
                offset,
                stride,
                ceil,
                ..
            } => {
                let mut expr = match **input {
                    Dim::Window { .. } | Dim::Scaled { .. } => format!("({input})"),
                    _ => input.to_string(),
                };
                if *offset > 0 {
                    expr = format!("{expr} + {offset}");
                } else if *offset < 0 {
                    expr = format!("{expr} - {}", -offset);
                }
                match (*stride, *ceil) {
                    (1, _) => write!(f, "{expr} + 1"),
                    (s, false) => write!(f, "({expr}) / {s} + 1"),
                    (s, true) => write!(f, "ceil(({expr}) / {s}) + 1"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_extent_matches_onnx() {
        // 7x7/2 pad 3 on 320 -> 160; 3x3/2 pad 1 on 160 -> 80.
        assert_eq!(window_extent(320, 3, 3, 7, 2, false), Ok(160));
        assert_eq!(window_extent(160, 1, 1, 3, 2, false), Ok(80));
        // ceil mode: 5 wide, kernel 2, stride 2 -> 3 windows; floor -> 2.
        assert_eq!(window_extent(5, 0, 0, 2, 2, true), Ok(3));
        assert_eq!(window_extent(5, 0, 0, 2, 2, false), Ok(2));
        // ceil mode never starts a window in the end padding: 4 wide, pad 1 each side,
        // kernel 2, stride 2: ceil((6 - 2) / 2) + 1 = 3 windows, starting at -1, 1, 3.
        assert_eq!(window_extent(4, 1, 1, 2, 2, true), Ok(3));
        // 3 wide, pad 0/1, kernel 2, stride 2: ceil(2/2)+1 = 2; the second starts at 2 < 3.
        assert_eq!(window_extent(3, 0, 1, 2, 2, true), Ok(2));
        // 2 wide, pad 0/1, kernel 1, stride 2: ceil(2/2)+1 = 2, but the second starts at 2,
        // in the end padding, so it is dropped.
        assert_eq!(window_extent(2, 0, 1, 1, 2, true), Ok(1));
        assert_eq!(
            window_extent(2, 0, 0, 3, 1, false),
            Err(WindowError {
                padded_input: 2,
                extent: 3
            })
        );
    }

    #[test]
    fn bindings_parse_and_reject() {
        let b = parse_bindings("W=1031, H=320").unwrap();
        assert_eq!(b["W"], 1031);
        assert_eq!(b["H"], 320);
        assert!(parse_bindings("W").unwrap_err().contains("NAME=VALUE"));
        assert!(
            parse_bindings("W=x")
                .unwrap_err()
                .contains("not a non-negative integer")
        );
        assert!(parse_bindings("W=0").unwrap_err().contains("at least 1"));
        assert!(parse_bindings("W=1,W=2").unwrap_err().contains("twice"));
        assert!(
            parse_bindings("1W=3")
                .unwrap_err()
                .contains("not a valid symbol")
        );
    }

    #[test]
    fn symbolic_window_prints_and_resolves() {
        let d = Dim::Sym("W".into()).window(3, 3, 7, 2, false).unwrap();
        assert_eq!(d.to_string(), "(W - 1) / 2 + 1");
        let down = Dim::Sym("W".into()).window(0, 0, 1, 2, false).unwrap();
        assert_eq!(d, down, "3x3/2 pad 1 and 1x1/2 give the same width");
        assert_eq!(
            Dim::Sym("W".into()).window(1, 1, 3, 1, false).unwrap(),
            Dim::Sym("W".into())
        );
        let b = parse_bindings("W=1031").unwrap();
        assert_eq!(d.resolve(&b), Ok(Dim::Known(516)));
    }

    /// A floor window over a floor window is built merged, and resolves as the two in turn
    /// do, failing for the same extents where the inner one fits: every offset from -6 to 4
    /// and stride from 1 to 3 on each side, every input up to 40.
    #[test]
    fn nested_windows_merge_and_resolve_as_nested() {
        let w = Dim::Sym("W".into());
        for (o1, s1, o2, s2) in (-6i64..=4).flat_map(|o1| {
            (1u64..=3).flat_map(move |s1| {
                (-6i64..=4).flat_map(move |o2| (1u64..=3).map(move |s2| (o1, s1, o2, s2)))
            })
        }) {
            let window = |d: &Dim, o: i64, s: u64| {
                // `o` as pads less the extent: pad_end - extent = o.
                let (pad_end, extent) = if o >= 0 {
                    (o as u64 + 1, 1)
                } else {
                    (0, o.unsigned_abs())
                };
                d.window(0, pad_end, extent, s, false).unwrap()
            };
            let inner = window(&w, o1, s1);
            let merged = window(&inner, o2, s2);
            assert!(
                matches!(merged, Dim::Window { ref input, .. } if **input == w) || merged == w,
                "{merged} is one window over W"
            );
            for x in 1..=40u64 {
                let bind = |d: &Dim| d.resolve(&Bindings::from([("W".to_string(), x)]));
                // Where the inner window does not fit, its own value is refused.
                let Ok(Dim::Known(i)) = bind(&inner) else {
                    continue;
                };
                let nested = eval_window(i, o2, s2, false, 0);
                let got = bind(&merged).map(|d| d.known().unwrap());
                assert_eq!(
                    got.is_ok(),
                    nested.is_ok(),
                    "W={x}: {inner} then ({o2}, {s2}): {merged}"
                );
                if let (Ok(a), Ok(b)) = (got, nested) {
                    assert_eq!(a, b, "W={x}: {merged}");
                }
            }
        }
        // Shape arithmetic as torch's dynamo exporter writes it meets the conv's extent.
        let conv = w.window(1, 1, 3, 2, false).unwrap();
        let arith = w.plus(1).unwrap().floor_div(2).unwrap();
        assert_eq!(arith, conv, "(W + 1) / 2 is a 3x3/2 conv's (W - 1) / 2 + 1");
        assert_eq!(conv.to_string(), "(W - 1) / 2 + 1");
        let two = conv.window(1, 1, 3, 2, false).unwrap();
        assert_eq!(two.to_string(), "(W - 1) / 4 + 1");
        assert_eq!(Dim::Known(7).plus(-3), Some(Dim::Known(4)));
        assert_eq!(Dim::Known(3).plus(-3), None, "no extent left");
        assert_eq!(Dim::Known(9).floor_div(2), Some(Dim::Known(4)));
    }

    #[test]
    fn scaled_dims_fold_print_and_resolve() {
        let w = Dim::Sym("W".into());
        assert_eq!(Dim::Known(7).scaled(3), Some(Dim::Known(21)));
        assert_eq!(Dim::Known(u64::MAX).scaled(2), None);
        assert_eq!(w.scaled(1), Some(w.clone()));
        let twice = w.scaled(2).unwrap().scaled(2).unwrap();
        assert_eq!(twice, w.scaled(4).unwrap(), "factors multiply");
        assert_eq!(twice.to_string(), "W * 4");
        let down = w.window(0, 0, 1, 2, false).unwrap().scaled(2).unwrap();
        assert_eq!(down.to_string(), "((W - 1) / 2 + 1) * 2");
        let b = parse_bindings("W=7").unwrap();
        assert_eq!(down.resolve(&b), Ok(Dim::Known(8)));
        assert_eq!(twice.resolve(&b), Ok(Dim::Known(28)));
        // Symbolic dimensions are never provably different, whatever their factors.
        assert!(!twice.provably_differs(&w));
        let mut symbols = Vec::new();
        down.collect_symbols(&mut symbols);
        assert_eq!(symbols, ["W"]);
    }
}
