//! Constant tensors: initializers and `Constant` values decoded from a `TensorProto`, with
//! their data inline (typed fields or `raw_data`) or in an external file beside the model.

use std::collections::HashMap;
use std::num::IntErrorKind;
use std::path::{Component, Path, PathBuf};

use crate::proto::{TensorProto, data_location, data_type};
use primjit_ir::file::open_regular;

/// The largest constant the importer accepts, in elements: the IR's tensor limit.
const MAX_ELEMENTS: u64 = primjit_ir::MAX_TENSOR_ELEMENTS;

/// A decoded constant.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Const {
    /// Its ONNX name (an initializer's or a `Constant` node's output).
    pub name: String,
    pub dims: Vec<usize>,
    pub data: ConstData,
}

/// A constant's elements, by the kind the importer can use.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ConstData {
    /// `float`, `double` and `float16`, as f32.
    F32(Vec<f32>),
    /// Integer types, as i64.
    I64(Vec<i64>),
    /// Another data type (strings, bools, ...): usable by no supported op.
    Other(i32),
}

impl Const {
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// The elements as f32, or why not.
    pub fn floats(&self) -> Result<&[f32], String> {
        match &self.data {
            ConstData::F32(v) => Ok(v),
            ConstData::I64(_) => Err("is an integer tensor, a float one is needed".into()),
            ConstData::Other(t) => Err(format!(
                "is a {} tensor, a float one is needed",
                data_type::name(*t)
            )),
        }
    }
}

/// Memory maps of the external data files read so far, by resolved path: a model keeps every
/// tensor in one file, which is mapped once.
#[derive(Default)]
pub(crate) struct ExternalFiles {
    base_dir: Option<PathBuf>,
    maps: HashMap<PathBuf, memmap2::Mmap>,
}

impl ExternalFiles {
    pub fn new(base_dir: Option<PathBuf>) -> Self {
        ExternalFiles {
            base_dir,
            maps: HashMap::new(),
        }
    }

    /// The bytes `t.external_data` points at: `location` relative to the model's folder,
    /// `offset` (default 0) and `length` (default: to the end of the file).
    fn bytes(&mut self, t: &TensorProto) -> Result<&[u8], String> {
        let mut location = None;
        let mut offset = 0u64;
        let mut length = None;
        for e in &t.external_data {
            let number = |v: &str| {
                v.parse::<u64>().map_err(|error| match error.kind() {
                    IntErrorKind::PosOverflow => format!(
                        "external data {}={v:?} is too large: at most {}",
                        e.key,
                        u64::MAX
                    ),
                    _ => format!("external data {}={v:?} is not a number", e.key),
                })
            };
            match e.key.as_str() {
                "location" => location = Some(e.value.clone()),
                "offset" => offset = number(&e.value)?,
                "length" => length = Some(number(&e.value)?),
                _ => {}
            }
        }
        let Some(location) = location else {
            return Err("external data has no location".into());
        };
        let relative = Path::new(&location);
        if relative.as_os_str().is_empty()
            || !relative
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!(
                "external data location {location:?} must be a relative path inside the model's folder"
            ));
        }
        let Some(base) = &self.base_dir else {
            return Err(format!(
                "external data in {location:?}, but the model was not read from a file"
            ));
        };
        let path = base.join(relative);
        let cannot_open =
            |e: std::io::Error| format!("cannot open external data `{}`: {e}", path.display());
        // The location has no `..` and is not absolute, but a symlink on the way can still
        // lead out of the folder: the resolved path must stay under the resolved folder.
        let folder = std::fs::canonicalize(base).map_err(cannot_open)?;
        let target = std::fs::canonicalize(&path).map_err(cannot_open)?;
        if !target.starts_with(&folder) {
            return Err(format!(
                "external data location {location:?} leads to `{}` through a symlink, outside the model's folder `{}`",
                target.display(),
                folder.display()
            ));
        }
        if !self.maps.contains_key(&target) {
            let file = open_regular(&target).map_err(cannot_open)?;
            #[allow(unsafe_code)]
            // SAFETY: the map is read-only and private to this importer, which copies the
            // bytes out before returning. memmap2 requires that the file not be truncated
            // or modified by another process while mapped: an external data file beside a
            // model is not written while the model is imported (as for every ONNX loader).
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| format!("cannot map external data `{}`: {e}", path.display()))?;
            self.maps.insert(target.clone(), map);
        }
        let map = &self.maps[&target];
        let size = map.len() as u64;
        let end = match length {
            Some(len) => offset.checked_add(len),
            None => Some(size),
        };
        match (end, length) {
            (Some(end), _) if offset <= end && end <= size => {
                Ok(&map[offset as usize..end as usize])
            }
            (_, Some(len)) => Err(format!(
                "external data `{}` holds {size} bytes, fewer than offset {offset} plus length {len}",
                path.display()
            )),
            (_, None) => Err(format!(
                "external data `{}` holds {size} bytes, fewer than offset {offset}",
                path.display()
            )),
        }
    }
}

/// IEEE half to single precision.
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalize the fraction.
            let shift = frac.leading_zeros() - 21;
            let frac = (frac << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (frac << 13)
        }
        (0x1f, _) => sign | (0xff << 23) | (frac << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

/// Decodes `t`; `external` resolves data stored outside the model.
pub(crate) fn decode(t: &TensorProto, external: &mut ExternalFiles) -> Result<Const, String> {
    let mut dims = Vec::with_capacity(t.dims.len());
    // `None` once a prefix's count overflows, even if a later dimension is 0: such dims are
    // refused, and every product of a decoded tensor's dims fits (`Const::len`).
    let mut count = Some(1u64);
    for &d in &t.dims {
        if d < 0 {
            return Err(format!("dims {:?} has a negative dimension", t.dims));
        }
        count = count.and_then(|c| c.checked_mul(d as u64));
        dims.push(d as usize);
    }
    let count = count.unwrap_or(u64::MAX);
    if count > MAX_ELEMENTS {
        return Err(format!(
            "dims {:?} has more than {MAX_ELEMENTS} elements",
            t.dims
        ));
    }
    let n = count as usize;
    let raw: Option<&[u8]> = if t.data_location == data_location::EXTERNAL {
        Some(external.bytes(t)?)
    } else if !t.raw_data.is_empty() {
        Some(&t.raw_data[..])
    } else {
        None
    };
    let wrong = |found: usize, unit: &str| {
        Err(format!(
            "dims {:?} need {n} elements but the tensor holds {found} {unit}",
            t.dims
        ))
    };
    let from_raw = |raw, width| raw_elements(raw, n, width, &t.dims);
    let data = match t.data_type {
        data_type::FLOAT => ConstData::F32(match raw {
            Some(raw) => from_raw(raw, 4)?
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            None if t.float_data.len() == n => t.float_data.clone(),
            None => return wrong(t.float_data.len(), "floats"),
        }),
        data_type::DOUBLE => ConstData::F32(match raw {
            Some(raw) => from_raw(raw, 8)?
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
                .collect(),
            None if t.double_data.len() == n => t.double_data.iter().map(|&d| d as f32).collect(),
            None => return wrong(t.double_data.len(), "doubles"),
        }),
        data_type::FLOAT16 => ConstData::F32(match raw {
            Some(raw) => from_raw(raw, 2)?
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            None if t.int32_data.len() == n => {
                t.int32_data.iter().map(|&i| f16_to_f32(i as u16)).collect()
            }
            None => return wrong(t.int32_data.len(), "halves"),
        }),
        data_type::INT64 => ConstData::I64(match raw {
            Some(raw) => from_raw(raw, 8)?
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            None if t.int64_data.len() == n => t.int64_data.clone(),
            None => return wrong(t.int64_data.len(), "int64 values"),
        }),
        data_type::INT32 => ConstData::I64(match raw {
            Some(raw) => from_raw(raw, 4)?
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
                .collect(),
            None if t.int32_data.len() == n => t.int32_data.iter().map(|&i| i as i64).collect(),
            None => return wrong(t.int32_data.len(), "int32 values"),
        }),
        other => ConstData::Other(other),
    };
    Ok(Const {
        name: t.name.clone(),
        dims,
        data,
    })
}

/// The raw bytes, checked to hold `n` elements of `width` bytes, in chunks of one element:
/// converted one at a time, so that no second buffer of the tensor's size is made.
fn raw_elements<'a>(
    raw: &'a [u8],
    n: usize,
    width: usize,
    dims: &[i64],
) -> Result<std::slice::ChunksExact<'a, u8>, String> {
    if raw.len() != n * width {
        return Err(format!(
            "dims {dims:?} need {} bytes of raw data but the tensor holds {}",
            n * width,
            raw.len()
        ));
    }
    Ok(raw.chunks_exact(width))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_convert_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn raw_and_typed_data_decode_and_lengths_are_checked() {
        let mut ext = ExternalFiles::new(None);
        let t = TensorProto {
            dims: vec![2],
            data_type: data_type::FLOAT,
            raw_data: [1.5f32.to_le_bytes(), (-2f32).to_le_bytes()]
                .concat()
                .into(),
            ..Default::default()
        };
        assert_eq!(
            decode(&t, &mut ext).unwrap().data,
            ConstData::F32(vec![1.5, -2.0])
        );
        let short = TensorProto {
            raw_data: vec![0; 7].into(),
            ..t.clone()
        };
        assert!(decode(&short, &mut ext).unwrap_err().contains("8 bytes"));
        let typed = TensorProto {
            dims: vec![3],
            data_type: data_type::FLOAT,
            float_data: vec![1.0, 2.0],
            ..Default::default()
        };
        assert!(
            decode(&typed, &mut ext)
                .unwrap_err()
                .contains("holds 2 floats")
        );
        let negative = TensorProto {
            dims: vec![-1],
            ..typed.clone()
        };
        assert!(
            decode(&negative, &mut ext)
                .unwrap_err()
                .contains("negative")
        );
        let huge = TensorProto {
            dims: vec![1 << 40, 1 << 40],
            ..typed.clone()
        };
        assert!(decode(&huge, &mut ext).unwrap_err().contains("more than"));
        // A count that overflows before a 0: refused too, not decoded as an empty tensor whose
        // dims no later product can take.
        let overflow_then_empty = TensorProto {
            dims: vec![1 << 32, 1 << 32, 0],
            float_data: vec![],
            ..typed
        };
        assert!(
            decode(&overflow_then_empty, &mut ext)
                .unwrap_err()
                .contains("more than")
        );
    }
}
