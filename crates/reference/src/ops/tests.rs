//! Hand-computed cases for every op, and properties that tie the loops to each other.

use primjit_ir::{Pads, PoolKind, PoolWindow, Tensor};
use proptest::prelude::*;

use super::*;

fn t(shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::new(shape.to_vec(), data.to_vec()).unwrap()
}

/// `1, 2, 3, ...` in row-major order.
fn seq(shape: &[usize]) -> Tensor {
    let n = shape.iter().product::<usize>();
    t(shape, &(1..=n).map(|v| v as f32).collect::<Vec<_>>())
}

fn pads(top: usize, left: usize, bottom: usize, right: usize) -> Pads {
    Pads {
        top,
        left,
        bottom,
        right,
    }
}

fn conv(x: &Tensor, w: &Tensor, attrs: ConvAttrs) -> Tensor {
    conv2d(x, w, None, &attrs, &[])
}

#[test]
fn conv_asymmetric_padding_and_bias() {
    // x = [[1 2 3] [4 5 6] [7 8 9]], w = [[1 2] [3 4]], one row of padding on top and one
    // column on the right: row 0 of the output sees only the kernel's bottom row.
    let (x, w) = (seq(&[1, 1, 3, 3]), seq(&[1, 1, 2, 2]));
    let attrs = ConvAttrs {
        pads: pads(1, 0, 0, 1),
        ..ConvAttrs::default()
    };
    let y = conv(&x, &w, attrs);
    assert_eq!(y.shape, [1, 1, 3, 3]);
    assert_eq!(y.data, [11., 18., 9., 37., 47., 21., 67., 77., 33.]);
    let y = conv2d(&x, &w, Some(&t(&[1], &[0.5])), &attrs, &[]);
    assert_eq!(
        y.data,
        [11.5, 18.5, 9.5, 37.5, 47.5, 21.5, 67.5, 77.5, 33.5]
    );
}

#[test]
fn conv_dilation_2_stride_2() {
    // Taps at (0, 0), (0, 2), (2, 0), (2, 2), weighted 1, 10, 100, 1000, so each decimal
    // digit group of the result names one input cell: x[r][c] = 5r + c + 1.
    let x = seq(&[1, 1, 5, 5]);
    let w = t(&[1, 1, 2, 2], &[1., 10., 100., 1000.]);
    let attrs = ConvAttrs {
        strides: [2, 2],
        dilations: [2, 2],
        ..ConvAttrs::default()
    };
    let y = conv(&x, &w, attrs);
    assert_eq!(y.shape, [1, 1, 2, 2]);
    assert_eq!(y.data, [14131., 16353., 25241., 27463.]);
}

#[test]
fn conv_stride_2_with_padding() {
    // A 3x3 box filter, stride 2, padding 1 on a 4x4 input: windows start at -1 and 1.
    let y = conv(
        &seq(&[1, 1, 4, 4]),
        &t(&[1, 1, 3, 3], &[1.; 9]),
        ConvAttrs {
            strides: [2, 2],
            pads: pads(1, 1, 1, 1),
            ..ConvAttrs::default()
        },
    );
    assert_eq!(y.shape, [1, 1, 2, 2]);
    assert_eq!(y.data, [14., 30., 57., 99.]);
}

#[test]
fn conv_two_groups_two_batches() {
    // 4 input channels, 4 outputs in 2 groups: outputs 0 and 1 read channels 0 and 1,
    // outputs 2 and 3 read channels 2 and 3.
    let x = seq(&[2, 4, 1, 1]);
    let w = t(&[4, 2, 1, 1], &[1., 10., 2., 20., 100., 1000., 3., 30.]);
    let y = conv(
        &x,
        &w,
        ConvAttrs {
            groups: 2,
            ..ConvAttrs::default()
        },
    );
    assert_eq!(y.shape, [2, 4, 1, 1]);
    assert_eq!(y.data, [21., 42., 4300., 129., 65., 130., 8700., 261.]);
}

#[test]
fn conv_depthwise() {
    // Channel 0 (1..9) through a 2x2 box, channel 1 (10..18) through [[1 0] [0 -1]].
    let x = seq(&[1, 2, 3, 3]);
    let w = t(&[2, 1, 2, 2], &[1., 1., 1., 1., 1., 0., 0., -1.]);
    let y = conv(
        &x,
        &w,
        ConvAttrs {
            groups: 2,
            ..ConvAttrs::default()
        },
    );
    assert_eq!(y.shape, [1, 2, 2, 2]);
    assert_eq!(y.data, [12., 16., 24., 28., -4., -4., -4., -4.]);
}

#[test]
fn conv_post_ops_apply_in_order() {
    // An identity 1x1 conv, so the post-ops act on x itself.
    let x = t(&[1, 1, 1, 4], &[-2., -0.5, 0.5, 3.]);
    let w = t(&[1, 1, 1, 1], &[1.]);
    let r = t(&[1, 1, 1, 4], &[1., 1., -1., -1.]);
    let run = |bias: Option<f32>, post: &[Post<'_>]| {
        let bias = bias.map(|b| t(&[1], &[b]));
        conv2d(&x, &w, bias.as_ref(), &ConvAttrs::default(), post).data
    };
    assert_eq!(run(None, &[]), [-2., -0.5, 0.5, 3.]);
    assert_eq!(run(None, &[Post::Relu]), [0., 0., 0.5, 3.]);
    assert_eq!(run(None, &[Post::Add(&r)]), [-1., 0.5, -0.5, 2.]);
    assert_eq!(run(None, &[Post::Add(&r), Post::Relu]), [0., 0.5, 0., 2.]);
    assert_eq!(run(None, &[Post::Relu, Post::Add(&r)]), [1., 1., -0.5, 2.]);
    assert_eq!(
        run(None, &[Post::Clip { lo: -1., hi: 1. }]),
        [-1., -0.5, 0.5, 1.]
    );
    assert_eq!(
        run(None, &[Post::Relu, Post::Clip { lo: 0.25, hi: 2. }]),
        [0.25, 0.25, 0.5, 2.]
    );
    // The bias comes before every post-op.
    assert_eq!(run(Some(-1.), &[Post::Relu]), [0., 0., 0., 2.]);
}

#[test]
fn conv_accumulates_in_f64_and_rounds_once() {
    // In f32, 1e8 + 1 rounds back to 1e8, so any intermediate rounding loses the 1.
    let w = t(&[1, 1, 1, 3], &[1.; 3]);
    let y = conv(
        &t(&[1, 1, 1, 3], &[1e8, 1., -1e8]),
        &w,
        ConvAttrs::default(),
    );
    assert_eq!(y.data, [1.]);
    // The bias and a residual add too: 1e8 + 1 - 1e8 with one rounding at the end.
    let r = t(&[1, 1, 1, 1], &[-1e8]);
    let y = conv2d(
        &t(&[1, 1, 1, 1], &[1e8]),
        &t(&[1, 1, 1, 1], &[1.]),
        Some(&t(&[1], &[1.])),
        &ConvAttrs::default(),
        &[Post::Add(&r)],
    );
    assert_eq!(y.data, [1.]);
}

#[test]
fn conv_fused_maxpool_by_hand() {
    // An identity 1x1 conv with bias -8.5 and relu over x = 1..16 (4x4) leaves rows 0 and 1 at
    // zero and row r >= 2 at 4r + c - 7.5; the 3x3 pool, stride 2, padding 1, then takes the
    // maximum of rows/columns -1..=1 and 1..=3.
    let conv = conv2d(
        &seq(&[1, 1, 4, 4]),
        &t(&[1, 1, 1, 1], &[1.]),
        Some(&t(&[1], &[-8.5])),
        &ConvAttrs::default(),
        &[Post::Relu],
    );
    let window = PoolWindow {
        kernel: [3, 3],
        strides: [2, 2],
        pads: pads(1, 1, 1, 1),
        dilations: [1, 1],
        ceil_mode: false,
    };
    let y = pool2d(&conv, &PoolAttrs::max(&window));
    assert_eq!(y.shape, [1, 1, 2, 2]);
    assert_eq!(y.data, [0., 0., 5.5, 7.5]);
}

/// A conv, a max-pool window on its output (a fused `maxpool` post-op's), and the pooled shape.
struct FusedPoolCase {
    x: [usize; 4],
    weight: [usize; 4],
    conv: ConvAttrs,
    window: PoolWindow,
    pooled: [usize; 4],
}

#[test]
fn maxpool_post_op_windows_give_the_pooled_shape() {
    let cases = [
        // ResNet's stem, small: 7x7 stride 2 padding 3, then 3x3 stride 2 padding 1; the conv
        // output is 6x7, an odd width.
        FusedPoolCase {
            x: [1, 3, 11, 13],
            weight: [4, 3, 7, 7],
            conv: ConvAttrs {
                strides: [2, 2],
                pads: pads(3, 3, 3, 3),
                ..ConvAttrs::default()
            },
            window: PoolWindow {
                kernel: [3, 3],
                strides: [2, 2],
                pads: pads(1, 1, 1, 1),
                dilations: [1, 1],
                ceil_mode: false,
            },
            pooled: [1, 4, 3, 4],
        },
        // ceil_mode over an odd 9x7 output keeps a last window that hangs past it; two images.
        FusedPoolCase {
            x: [2, 2, 9, 7],
            weight: [3, 2, 3, 3],
            conv: ConvAttrs {
                pads: pads(1, 1, 1, 1),
                ..ConvAttrs::default()
            },
            window: PoolWindow {
                kernel: [2, 2],
                strides: [2, 2],
                pads: Pads::default(),
                dilations: [1, 1],
                ceil_mode: true,
            },
            pooled: [2, 3, 5, 4],
        },
        // A grouped, strided conv to 5x5, then a dilated pool with asymmetric padding and
        // ceil_mode.
        FusedPoolCase {
            x: [1, 4, 10, 9],
            weight: [4, 2, 3, 3],
            conv: ConvAttrs {
                strides: [2, 2],
                pads: pads(1, 1, 0, 1),
                groups: 2,
                ..ConvAttrs::default()
            },
            window: PoolWindow {
                kernel: [2, 3],
                strides: [2, 1],
                pads: pads(1, 0, 0, 1),
                dilations: [2, 1],
                ceil_mode: true,
            },
            pooled: [1, 4, 3, 4],
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let seed = i as u64;
        let x = primjit_ir::random_tensor(seed, "x", case.x.to_vec(), -1., 1.);
        let w = primjit_ir::random_tensor(seed, "w", case.weight.to_vec(), -1., 1.);
        let conv = conv2d(&x, &w, None, &case.conv, &[Post::Relu]);
        let pooled = pool2d(&conv, &PoolAttrs::max(&case.window));
        assert_eq!(pooled.shape, case.pooled, "case {i}");
    }
}

fn pool(kind: PoolKind, kernel: [usize; 2], strides: [usize; 2], pads: Pads) -> PoolAttrs {
    PoolAttrs {
        kind,
        window: PoolWindow {
            strides,
            pads,
            ..PoolWindow::new(kernel)
        },
        count_include_pad: false,
    }
}

#[test]
fn maxpool_ignores_padding() {
    let x = seq(&[1, 1, 4, 4]);
    let y = pool2d(&x, &pool(PoolKind::Max, [2, 2], [2, 2], Pads::default()));
    assert_eq!(y.data, [6., 8., 14., 16.]);
    // All inputs negative: a padded cell read as 0 would win every window.
    let neg = Tensor {
        data: x.data.iter().map(|v| -v).collect(),
        ..x
    };
    let y = pool2d(&neg, &pool(PoolKind::Max, [3, 3], [2, 2], pads(1, 1, 1, 1)));
    assert_eq!(y.shape, [1, 1, 2, 2]);
    assert_eq!(y.data, [-1., -2., -5., -6.]);
}

#[test]
fn maxpool_ceil_mode_keeps_the_hanging_window() {
    // 5x5, 2x2 windows, stride 2: floor gives 2 windows per axis, ceil a third one over the
    // last row or column alone.
    let x = seq(&[1, 1, 5, 5]);
    let mut attrs = pool(PoolKind::Max, [2, 2], [2, 2], Pads::default());
    assert_eq!(pool2d(&x, &attrs).data, [7., 9., 17., 19.]);
    attrs.window.ceil_mode = true;
    let y = pool2d(&x, &attrs);
    assert_eq!(y.shape, [1, 1, 3, 3]);
    assert_eq!(y.data, [7., 9., 10., 17., 19., 20., 22., 24., 25.]);
}

#[test]
fn maxpool_dilated() {
    // 2x2 taps at distance 2; a plain 3x3 window would find the 16 every time.
    let x = t(
        &[1, 1, 4, 4],
        &[
            5., 1., 7., 2., 3., 16., 4., 15., 8., 0., 6., 9., 14., 11., 13., 10.,
        ],
    );
    let mut attrs = pool(PoolKind::Max, [2, 2], [1, 1], Pads::default());
    attrs.window.dilations = [2, 2];
    let y = pool2d(&x, &attrs);
    assert_eq!(y.shape, [1, 1, 2, 2]);
    assert_eq!(y.data, [8., 9., 14., 16.]);
}

#[test]
fn maxpool_propagates_nan() {
    let x = t(&[1, 1, 1, 3], &[1., f32::NAN, 2.]);
    let y = pool2d(&x, &pool(PoolKind::Max, [1, 2], [1, 1], Pads::default()));
    assert!(y.data.iter().all(|v| v.is_nan()), "{:?}", y.data);
    assert!(global_pool(&x, PoolKind::Max).data[0].is_nan());
}

#[test]
fn avgpool_count_include_pad_both_ways() {
    // x = [[1 2] [3 4]], 2x2 windows, padding only on top and left.
    let x = seq(&[1, 1, 2, 2]);
    let mut attrs = pool(PoolKind::Avg, [2, 2], [1, 1], pads(1, 1, 0, 0));
    assert_eq!(pool2d(&x, &attrs).data, [1., 1.5, 2., 2.5]);
    attrs.count_include_pad = true;
    assert_eq!(pool2d(&x, &attrs).data, [0.25, 0.75, 1., 2.5]);
}

#[test]
fn avgpool_ceil_mode_never_counts_taps_past_the_padding() {
    // Without padding, a ceil-mode window hanging off the end averages what it covers,
    // whether or not padding counts.
    let x = seq(&[1, 1, 5, 5]);
    let mut attrs = pool(PoolKind::Avg, [2, 2], [2, 2], Pads::default());
    attrs.window.ceil_mode = true;
    let expected = [4., 6., 7.5, 14., 16., 17.5, 21.5, 23.5, 25.];
    assert_eq!(pool2d(&x, &attrs).data, expected);
    attrs.count_include_pad = true;
    assert_eq!(pool2d(&x, &attrs).data, expected);

    // x = [1 2 3 4 5], kernel 3, stride 2, padding 1 on the left, ceil mode: windows over
    // [-1, 1], [1, 3], [3, 5]. The padded row is [-1, 5), so the last window has 2 counted
    // taps either way; the first has 3 with count_include_pad and 2 without.
    let x = seq(&[1, 1, 1, 5]);
    let mut attrs = pool(PoolKind::Avg, [1, 3], [1, 2], pads(0, 1, 0, 0));
    attrs.window.ceil_mode = true;
    assert_eq!(pool2d(&x, &attrs).data, [1.5, 3., 4.5]);
    attrs.count_include_pad = true;
    assert_eq!(pool2d(&x, &attrs).data, [1., 3., 4.5]);
    // With one column of end padding, cell 5 is padding and counts: 9 / 3.
    attrs.window.pads.right = 1;
    assert_eq!(pool2d(&x, &attrs).data, [1., 3., 3.]);
    attrs.count_include_pad = false;
    assert_eq!(pool2d(&x, &attrs).data, [1.5, 3., 4.5]);
}

#[test]
fn global_pools() {
    let x = t(&[1, 2, 2, 2], &[1., 2., 3., 4., -1., -5., -3., -2.]);
    let y = global_pool(&x, PoolKind::Max);
    assert_eq!(y.shape, [1, 2, 1, 1]);
    assert_eq!(y.data, [4., -1.]);
    let y = global_pool(&x, PoolKind::Avg);
    assert_eq!(y.shape, [1, 2, 1, 1]);
    assert_eq!(y.data, [2.5, -2.75]);
}

#[test]
fn batchnorm_per_channel() {
    // epsilon 1 and variance 3 give 1 / sqrt(4) = 0.5 on both channels.
    let x = t(&[2, 2, 1, 2], &[1., 3., 10., 20., 3., 1., 20., 10.]);
    let scale = t(&[2], &[2., 0.5]);
    let bias = t(&[2], &[1., -1.]);
    let mean = t(&[2], &[1., 10.]);
    let var = t(&[2], &[3., 3.]);
    let y = batchnorm(&x, &scale, &bias, &mean, &var, 1.0);
    assert_eq!(y.shape, x.shape);
    assert_eq!(y.data, [1., 3., -1., 1.5, 3., 1., 1.5, -1.]);
}

#[test]
fn add_and_relu() {
    let a = t(&[1, 1, 1, 3], &[1.5, -2., 0.1]);
    let b = t(&[1, 1, 1, 3], &[0.25, 2., 0.2]);
    assert_eq!(add(&a, &b).data, [1.75, 0., 0.1f32 + 0.2f32]);
    let y = relu(&t(&[1, 1, 1, 4], &[-1., 0., 2., f32::NAN]));
    assert_eq!(y.data[..3], [0., 0., 2.]);
    assert!(y.data[3].is_nan());
}

proptest! {
    /// A grouped conv is the channel-wise concatenation of one conv per group.
    #[test]
    fn grouped_conv_is_per_group_convs(
        groups in 1usize..4, cpg in 1usize..3, opg in 1usize..3,
        h in 3usize..7, w in 3usize..7, k in 1usize..4, stride in 1usize..3, dilation in 1usize..3,
        pad in 0usize..2, seed in any::<u64>(),
    ) {
        prop_assume!(dilation * (k - 1) < h && dilation * (k - 1) < w);
        let (c, o) = (groups * cpg, groups * opg);
        let x = primjit_ir::random_tensor(seed, "x", vec![1, c, h, w], -1., 1.);
        let wt = primjit_ir::random_tensor(seed, "w", vec![o, cpg, k, k], -1., 1.);
        let attrs = ConvAttrs { strides: [stride; 2], dilations: [dilation; 2], pads: pads(pad, 0, 0, pad), groups };
        let y = conv2d(&x, &wt, None, &attrs, &[]);
        let plane = x.data.len() / c;
        let mut expected = Vec::new();
        for g in 0..groups {
            let xg = t(&[1, cpg, h, w], &x.data[g * cpg * plane..(g + 1) * cpg * plane]);
            let per_out = wt.data.len() / o;
            let wg = t(&[opg, cpg, k, k], &wt.data[g * opg * per_out..(g + 1) * opg * per_out]);
            expected.extend(conv2d(&xg, &wg, None, &ConvAttrs { groups: 1, ..attrs }, &[]).data);
        }
        prop_assert_eq!(y.data, expected);
    }
}

/// The expected outputs of ONNX's backend node tests `resize_upsample_scales_linear`,
/// `resize_upsample_scales_linear_align_corners`, `resize_upsample_scales_nearest` and
/// `resize_downsample_sizes_nearest`, and asymmetric nearest upsampling (PyTorch's
/// `nearest`), which repeats each pixel.
/// Given scale factors map coordinates by the factor, not by `output / input`, which differ
/// where `input * factor` is not whole: 5 pixels by 0.5 are 2, whose half-pixel sources are
/// `2x + 0.5` (by the extents they would be `2.5x + 0.75`); by 1.5, 7, from `x / 1.5`.
#[test]
fn resize_by_a_fraction_maps_by_the_factor() {
    use primjit_ir::{CoordMode, NearestMode, ResizeMode, ScaleFactor};
    let x = seq(&[1, 1, 1, 5]);
    let factors = |w: ScaleFactor| Some([ScaleFactor::whole(1), w]);
    let half = ScaleFactor::new(1, 2).unwrap();
    let y = resize(
        &x,
        ResizeMode::Linear,
        CoordMode::HalfPixel,
        [1, 2],
        factors(half),
    );
    assert_eq!(y.data, [1.5, 3.5]);
    let by_extents = resize(&x, ResizeMode::Linear, CoordMode::HalfPixel, [1, 2], None);
    assert_eq!(by_extents.data, [1.75, 4.25]);
    let floor = ResizeMode::Nearest(NearestMode::Floor);
    let three_halves = ScaleFactor::new(3, 2).unwrap();
    let y = resize(
        &x,
        floor,
        CoordMode::Asymmetric,
        [1, 7],
        factors(three_halves),
    );
    assert_eq!(y.data, [1.0, 1.0, 2.0, 3.0, 3.0, 4.0, 5.0]);
}

#[test]
fn resize_matches_the_onnx_node_tests() {
    use primjit_ir::{CoordMode, NearestMode, ResizeMode};
    let x = seq(&[1, 1, 2, 2]);
    let close = |y: &Tensor, want: &[f32]| {
        assert_eq!(y.data.len(), want.len());
        for (a, b) in y.data.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{:?} != {want:?}", y.data);
        }
    };
    let y = resize(&x, ResizeMode::Linear, CoordMode::HalfPixel, [4, 4], None);
    close(
        &y,
        &[
            1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0,
        ],
    );
    let y = resize(
        &x,
        ResizeMode::Linear,
        CoordMode::AlignCorners,
        [4, 4],
        None,
    );
    let third = 1.0 / 3.0;
    let want: Vec<f32> = (0..4)
        .flat_map(|r| (0..4).map(move |c| (1.0 + 2.0 * r as f64 * third + c as f64 * third) as f32))
        .collect();
    close(&y, &want);
    let nearest = ResizeMode::Nearest(NearestMode::RoundPreferFloor);
    let y = resize(&x, nearest, CoordMode::HalfPixel, [4, 6], None);
    let row = |a: f32, b: f32| [a, a, a, b, b, b];
    let want: Vec<f32> = [row(1.0, 2.0), row(1.0, 2.0), row(3.0, 4.0), row(3.0, 4.0)].concat();
    assert_eq!(y.data, want);
    let y = resize(
        &seq(&[1, 1, 2, 4]),
        nearest,
        CoordMode::HalfPixel,
        [1, 2],
        None,
    );
    assert_eq!(y.data, [1.0, 3.0]);
    let floor = ResizeMode::Nearest(NearestMode::Floor);
    let y = resize(
        &seq(&[2, 1, 1, 3]),
        floor,
        CoordMode::Asymmetric,
        [2, 6],
        None,
    );
    assert_eq!(y.shape, [2, 1, 2, 6]);
    let row = |a: f32, b: f32, c: f32| [a, a, b, b, c, c];
    assert_eq!(
        y.data,
        [
            row(1.0, 2.0, 3.0),
            row(1.0, 2.0, 3.0),
            row(4.0, 5.0, 6.0),
            row(4.0, 5.0, 6.0)
        ]
        .concat()
    );
}

proptest! {
    /// Resizing to the same extents is the identity in every mode whose source coordinate is
    /// then the output coordinate (all but `tf_half_pixel_for_nearest`, the last), and a
    /// linear blend never leaves the range of its input.
    #[test]
    fn resize_to_the_same_extents_is_the_identity(
        h in 1usize..6, w in 1usize..6, values in prop::collection::vec(-4.0f32..4.0, 36),
        coord in 0usize..4, nearest in 0usize..4,
    ) {
        use primjit_ir::{CoordMode, NearestMode, ResizeMode};
        let x = t(&[1, 1, h, w], &values[..h * w]);
        let coord = CoordMode::ALL[coord];
        for mode in [ResizeMode::Linear, ResizeMode::Nearest(NearestMode::ALL[nearest])] {
            let y = resize(&x, mode, coord, [h, w], None);
            prop_assert_eq!(&y.data, &x.data);
        }
        let (lo, hi) = values[..h * w].iter().fold((f32::MAX, f32::MIN), |(l, u), &v| (l.min(v), u.max(v)));
        let y = resize(&x, ResizeMode::Linear, coord, [2 * h + 1, w + 3], None);
        prop_assert!(y.data.iter().all(|&v| v >= lo - 1e-6 && v <= hi + 1e-6));
    }
}
