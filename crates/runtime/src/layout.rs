//! Reorders between the public NCHW layout and the kernels' blocked `nChw4c` layout.

use primjit_codegen::Layout;

/// Copies an NCHW tensor of `shape` into `nChw4c`, zeroing the padding lanes.
///
/// # Panics
///
/// If `src` is shorter than `Layout::Nchw.buffer_len(shape)`.
pub fn to_blocked(src: &[f32], shape: [usize; 4]) -> Vec<f32> {
    let mut out = vec![0.0; Layout::Nchw4c.buffer_len(shape)];
    reorder(src, Layout::Nchw, &mut out, Layout::Nchw4c, shape);
    out
}

/// Copies an `nChw4c` tensor of `shape` into NCHW, dropping the padding lanes.
///
/// # Panics
///
/// If `src` is shorter than `Layout::Nchw4c.buffer_len(shape)`.
pub fn to_nchw(src: &[f32], shape: [usize; 4]) -> Vec<f32> {
    let mut out = vec![0.0; Layout::Nchw.buffer_len(shape)];
    reorder(src, Layout::Nchw4c, &mut out, Layout::Nchw, shape);
    out
}

/// Copies every element of `shape` from `src` in layout `from` to `dst` in layout `to`.
///
/// # Panics
///
/// If `src` or `dst` is shorter than its layout's `buffer_len(shape)`, as slice indexing does.
pub fn reorder(src: &[f32], from: Layout, dst: &mut [f32], to: Layout, shape: [usize; 4]) {
    let [n, c, h, w] = shape;
    for ni in 0..n {
        for ci in 0..c {
            for hi in 0..h {
                let s = from.offset(shape, [ni, ci, hi, 0]);
                let d = to.offset(shape, [ni, ci, hi, 0]);
                let (sp, dp) = (pixel_stride(from), pixel_stride(to));
                for wi in 0..w {
                    dst[d + wi * dp] = src[s + wi * sp];
                }
            }
        }
    }
}

fn pixel_stride(layout: Layout) -> usize {
    match layout {
        Layout::Nchw => 1,
        Layout::Nchw4c => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_through_blocked() {
        let shape = [2, 5, 3, 2];
        let x: Vec<f32> = (0..60).map(|i| i as f32).collect();
        let b = to_blocked(&x, shape);
        assert_eq!(b.len(), 2 * 8 * 3 * 2);
        // Channel 4 of image 0 starts the second block; its padding lanes are zero.
        assert_eq!(b[3 * 2 * 4], x[4 * 6]);
        assert_eq!(b[3 * 2 * 4 + 1], 0.0);
        assert_eq!(to_nchw(&b, shape), x);
    }
}
