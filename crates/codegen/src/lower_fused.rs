//! Lowers a convolution with a fused max pool: for each pooled row, the conv computes the rows
//! of its output that the row's windows read into a scratch band, and the pool reads them
//! there, so the full-resolution output never exists.
//!
//! Both stages are the ordinary lowerings ([`direct::lower`], [`lower_pool::lower_pool`])
//! emitted inside the loop over pooled rows with arguments of their own ([`Emit::with_args`]):
//! the conv's work items are the band's output rows and its destination is the band, the
//! pool's source is the band and its work item the pooled row. The band holds the
//! [`ConvDesc::pool_band_rows`] rows of one window in `nChw4c`, row `top + i` in slot `i`
//! (`top` the window's first row, which may lie in the padding): both stages address rows by
//! their index in the whole output from a band pointer moved back by `top` rows. Rows that a
//! window shares with the next are copied down rather than computed again, so every output row
//! is computed once per call, except the shared rows at the start of a thread's range.

use crate::backend::cranelift::{Emit, ExtentArg, F32_BYTES, IntCC, Scalar, row_pixels};
use crate::conv::direct;
use crate::key::{ConvDesc, Layout, Pitches, PoolDesc};
use crate::lower_pool;
use crate::plan::{ConvPlan, PoolPlan};
use crate::tile::LANES;

/// Buffer indices in the argument list.
const SRC: usize = 0;
const WEIGHTS: usize = 1;
const DST: usize = 2;
const SCRATCH: usize = 3;

/// The two stages of a fused kernel, each planned as an op of its own on one image.
pub(crate) struct FusedPlan {
    pub(crate) conv: ConvPlan,
    pub(crate) pool: PoolPlan,
}

impl FusedPlan {
    pub(crate) fn new(d: &ConvDesc) -> Self {
        let pool = d.pool_desc().expect("a conv with a fused pool");
        let band = d.pool_band_rows();
        let conv_stage = ConvDesc {
            mb: 1,
            pool: None,
            dst_layout: Layout::Nchw4c,
            // The band in scratch is dense; the source keeps the call's pitch.
            pitches: Pitches {
                dst: None,
                ..d.pitches
            },
            ..d.clone()
        };
        let mut conv = ConvPlan::unjoined(&conv_stage);
        conv.dst_rows = Some(band);
        // A band is a few rows: the tiles' weights, not a row's input, are what to keep in
        // cache across them.
        conv.rows_outer = false;
        conv.chunks_outer = false;
        // The pool takes the conv's tier where its tile covers it (an `nChw4c` destination).
        let mut pool = PoolPlan::new(&PoolDesc { mb: 1, ..pool }.at_tier(d.isa));
        pool.src_rows = Some(band);
        // The pooled rows go where the call's destination has them: a window of a wider
        // buffer when streamed.
        pool.dst_pitch = d.pitches.dst;
        FusedPlan { conv, pool }
    }
}

pub fn lower(e: &mut Emit<'_>, d: &ConvDesc) {
    let plan = FusedPlan::new(d);
    let pool = &plan.pool.desc;
    let band = d.pool_band_rows();
    let stride = pool.window.strides[0];
    // Rows that a window shares with the next one's.
    let shared = band.saturating_sub(stride);
    let rt = d.runtime;
    let [_, _, ph, pw] = d.dst_shape();
    let (first, end) = (e.begin, e.end);
    let zero = e.iconst(0);
    let images = e.iconst(d.mb as i64);
    e.for_range(zero, images, &[], |e, n, _| {
        e.for_range(first, end, &[], |e, p, _| {
            // Strides and pointers from fresh loads: only the image and row indices and the
            // call's range stay live across the stages' loops.
            let ih = e.extent_or(rt.h, ExtentArg::InputH, d.ih);
            let iw = e.extent_or(rt.w, ExtentArg::InputW, d.iw);
            let oh = e.extent_or(rt.h, ExtentArg::OutputH, d.oh());
            let ow = e.extent_or(rt.w, ExtentArg::OutputW, d.ow());
            let out_h = e.extent_or(rt.h, ExtentArg::PooledH, ph);
            let out_w = e.extent_or(rt.w, ExtentArg::PooledW, pw);
            let src_image = e
                .act_strides(d.src_layout, d.ic, ih, row_pixels(d.pitches.src, iw))
                .image;
            let dst_image = e
                .act_strides(d.dst_layout, d.oc, out_h, row_pixels(d.pitches.dst, out_w))
                .image;
            let row_bytes = e.mul(ow, LANES as i64 * F32_BYTES);

            let src = e.buffer(SRC);
            let src_n = e.scaled_by(src, n, src_image, F32_BYTES, 0);
            let weights = e.buffer(WEIGHTS);
            let dst = e.buffer(DST);
            let dst_n = e.scaled_by(dst, n, dst_image, F32_BYTES, 0);
            let scratch = e.buffer(SCRATCH);

            // The window's first row, and the band pointer at which row `top` is slot 0.
            let top = e.imul_imm(p, stride as i64);
            let top = e.offset(top, -(pool.window.pads.top as i64));
            let neg_top = e.ineg(top);
            let band_ptr = e.scaled_by(scratch, neg_top, row_bytes, 1, 0);

            // The rows to compute: the window's, less those the previous pooled row left in
            // the band (none at the start of the call's range), clipped to the output.
            let is_first = e.icmp(IntCC::Equal, p, first);
            let after_shared = e.offset(top, shared as i64);
            let from = e.select(is_first, top, after_shared);
            let conv_begin = e.imax(from, zero);
            let window_end = e.offset(top, band as i64);
            let oh_value = e.value(oh);
            let conv_end = e.imin(window_end, oh_value);
            e.with_args(
                &[src_n, weights, band_ptr],
                [conv_begin, conv_end],
                0,
                |e| direct::lower(e, &plan.conv),
            );

            let null = e.iconst(0);
            let next = e.offset(p, 1);
            // The pool reads `[oh, ow, ph, pw]` as its `[ih, iw, oh, ow]`.
            e.with_args(&[band_ptr, null, dst_n], [p, next], 2, |e| {
                lower_pool::lower_pool(e, &plan.pool)
            });

            if shared > 0 {
                shift_band(e, d, band, stride, shared);
            }
            vec![]
        });
        vec![]
    });
}

/// Copies slots `[stride, stride + shared)` of the band to `[0, shared)` in every block of
/// channels: the rows the next pooled row's window starts with. Slots copied in ascending
/// order never overwrite one still to be read. A slot that holds no computed row (a window
/// reaching into the padding) is copied too and never read.
fn shift_band(e: &mut Emit<'_>, d: &ConvDesc, band: usize, stride: usize, shared: usize) {
    let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
    let row_bytes = e.mul(ow, LANES as i64 * F32_BYTES);
    let block_bytes = e.mul(row_bytes, band as i64);
    let scratch = e.buffer(SCRATCH);
    let vector = LANES as i64 * F32_BYTES;
    e.for_ptrs(
        Scalar::Const(d.oc.div_ceil(LANES) as i64),
        &[scratch],
        &[block_bytes],
        |e, b| {
            for slot in 0..shared {
                let to = e.offset_by(b[0], row_bytes, slot as i64);
                let from = e.offset_by(b[0], row_bytes, (stride + slot) as i64);
                let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
                e.for_ptrs(ow, &[from, to], &[Scalar::Const(vector); 2], |e, q| {
                    let v = e.load_vec(q[0], 0);
                    e.store_vec(v, q[1], 0);
                });
            }
        },
    );
}
