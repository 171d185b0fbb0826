//! The activation, PReLU, broadcasting binary, concat and channel selection kernels against the reference
//! interpreter, on buffers that end at a guard page, and the vector `exp` and `tanh` against
//! f64 over a wide range with infinities and NaN.
//!
//! Every problem runs on one thread and on pools of two and three threads, which must agree
//! to the bit; destinations start as a NaN sentinel, so an element left unwritten fails.
//!
//! # Tolerances
//!
//! PReLU, the binary ops and concat round once or not at all, like the reference: results
//! must be equal. An activation is held to `ulps` units in the last place of the reference's
//! result plus `1e-38` (where the result underflows; `1e-38 |x|` for SiLU, whose sigmoid
//! does), where `ulps` covers the vector `exp` ([`EXP_ULPS`]) and the few roundings after it:
//! 8 for sigmoid, SiLU, ELU and tanh, 2 for the hard ones (an FMA against the reference's
//! exact product), 0 for leaky relu. A NaN input
//! gives a NaN, an infinite result must be the same infinity. A conv with an activation
//! post-op is held to the direct conv's bound of `tests/kernels.rs`, times the activation's
//! largest slope (1.5, hardswish's), plus the activation's own bound. A conv with a PReLU
//! post-op (slopes in [-1, 1]) is held to the same conv bound plus 2 ulps (8 when a sigmoid
//! follows), and at a wide tier to the x128 kernel's bits.

mod common;
use common::{SENTINEL, engine, runtime_dims};

use std::sync::Arc;

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    Activation, BinaryKind, Broadcast, ConcatDesc, ConvAlgo, ConvDesc, EXP_ULPS, EltwiseDesc,
    EltwiseKind, Isa, Layout, PostOpDesc, PrimitiveKey, SelectDesc, TANH_ULPS,
};
use primjit_reference::{ConvAttrs, Pads, Post, Tensor};
use primjit_runtime::exec::GuardedBuffer;
use primjit_runtime::layout::{to_blocked, to_nchw};
use primjit_runtime::{ExecArgs, Primitive};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn compile(key: &PrimitiveKey) -> Arc<Primitive> {
    engine()
        .compile(key)
        .unwrap_or_else(|e| panic!("{key} does not compile: {e}"))
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        common::splitmix64(&mut self.0)
    }

    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// Uniform in `[-1, 1)` or `[-40, 40)`, sometimes a special value: zeros, tiny and huge
    /// magnitudes, the edges of `exp`'s range, infinities, NaN.
    fn value(&mut self) -> f32 {
        const SPECIAL: &[f32] = &[
            0.0,
            -0.0,
            1e-8,
            -1e-8,
            0.625,
            -0.625,
            88.5,
            -88.5,
            100.0,
            -100.0,
            1e30,
            -1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let r = self.next_u64();
        match r % 8 {
            0 => SPECIAL[(r >> 8) as usize % SPECIAL.len()],
            1..=3 => self.unit() * 40.0,
            _ => self.unit(),
        }
    }

    fn tensor(&mut self, shape: &[usize], special: bool) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n)
                .map(|_| if special { self.value() } else { self.unit() })
                .collect(),
        }
    }
}

fn to_layout(t: &Tensor, layout: Layout) -> Vec<f32> {
    let s: [usize; 4] = t.shape.clone().try_into().expect("rank 4");
    match layout {
        Layout::Nchw => t.data.clone(),
        Layout::Nchw4c => to_blocked(&t.data, s),
    }
}

fn guarded(data: &[f32]) -> GuardedBuffer {
    GuardedBuffer::from_slice(data).expect("a guarded buffer")
}

/// Runs `p` on one thread and on pools of two and three, checks the three agree to the bit,
/// and returns the raw destination.
fn run(
    p: &Primitive,
    src: &[f32],
    weights: Option<&[f32]>,
    extra: &[Vec<f32>],
    dst_len: usize,
) -> Result<Vec<f32>, TestCaseError> {
    run_with_scratch(p, src, weights, extra, dst_len, 0, None)
}

/// [`run`] with `scratch_len` floats of scratch per thread (a Winograd conv's), at `extents`
/// for a kernel with runtime extents.
fn run_with_scratch(
    p: &Primitive,
    src: &[f32],
    weights: Option<&[f32]>,
    extra: &[Vec<f32>],
    dst_len: usize,
    scratch_len: usize,
    extents: Option<[usize; 2]>,
) -> Result<Vec<f32>, TestCaseError> {
    let src = guarded(src);
    let weights = weights.map(guarded);
    let extra: Vec<GuardedBuffer> = extra.iter().map(|e| guarded(e)).collect();
    let extra: Vec<&[f32]> = extra.iter().map(|b| b.as_slice()).collect();
    let once = |pool: Option<&rayon::ThreadPool>| -> Result<Vec<f32>, TestCaseError> {
        let mut dst = GuardedBuffer::new(dst_len).expect("a guarded buffer");
        dst.as_mut_slice().fill(f32::from_bits(SENTINEL));
        let threads = pool.map_or(1, |p| p.current_num_threads());
        let mut scratch = (scratch_len > 0).then(|| {
            let mut s = GuardedBuffer::new(scratch_len * threads).expect("a guarded buffer");
            s.as_mut_slice().fill(f32::from_bits(SENTINEL));
            s
        });
        let args = ExecArgs {
            src: src.as_slice(),
            weights: weights.as_ref().map(|w| w.as_slice()),
            dst: dst.as_mut_slice(),
            extra: &extra,
            scratch: scratch.as_mut().map(|s| s.as_mut_slice()),
        };
        match (pool, extents) {
            (Some(pool), e) => p.execute_parallel(args, e.map(Into::into), pool),
            (None, Some(e)) => p.execute_at(args, e),
            (None, None) => p.execute(args),
        }
        .map_err(|e| TestCaseError::fail(format!("{}: {e}", p.key())))?;
        Ok(dst.as_slice().to_vec())
    };
    common::on_every_pool(p, once)
}

fn from_layout(buf: &[f32], layout: Layout, shape: [usize; 4]) -> Vec<f32> {
    match layout {
        Layout::Nchw => buf.to_vec(),
        Layout::Nchw4c => to_nchw(buf, shape),
    }
}

/// The units in the last place of `x` (of the smallest normal for subnormal `x`).
fn ulp(x: f64) -> f64 {
    let x = (x.abs() as f32).max(f32::MIN_POSITIVE);
    let next = f32::from_bits(x.to_bits() + 1);
    (next - x) as f64
}

/// Whether `got` is within `ulps` units in the last place of `want` (plus `abs`), NaN where
/// `want` is NaN, the same infinity where it is infinite.
fn close(got: f32, want: f32, ulps: f64, abs: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() {
        return got == want;
    }
    (got as f64 - want as f64).abs() <= ulps * ulp(want as f64) + abs
}

/// The bound of an activation in units in the last place (see the module documentation).
fn act_ulps(a: Activation) -> f64 {
    match a {
        Activation::Exp => EXP_ULPS as f64,
        Activation::Tanh => TANH_ULPS as f64 * 2.0,
        Activation::Sigmoid | Activation::Silu | Activation::Elu { .. } => 8.0,
        Activation::HardSigmoid { .. } | Activation::HardSwish => 2.0,
        Activation::LeakyRelu { .. } => 0.0,
    }
}

/// Where `alpha x + beta` cancels, a hard activation's error is relative to its terms, not
/// its result: two roundings of `|alpha x| + |beta|` (times `|x|` for hardswish). SiLU is `x`
/// times a sigmoid that underflows below `x = -87` (held to `1e-38` there), so its
/// absolute error there is `|x|` times that.
fn act_abs(a: Activation, x: f32) -> f64 {
    let x = x as f64;
    let terms = |alpha: f64, beta: f64| 2.0 * 2f64.powi(-23) * ((alpha * x).abs() + beta.abs());
    match a {
        Activation::Silu => 1e-38 * x.abs(),
        Activation::HardSigmoid { alpha, beta } => terms(alpha as f64, beta as f64),
        Activation::HardSwish => x.abs() * terms(1.0 / 6.0, 0.5),
        _ => 0.0,
    }
}

fn check_close(
    key: &PrimitiveKey,
    inputs: &[f32],
    got: &[f32],
    want: &[f32],
    ulps: f64,
    abs: impl Fn(f32) -> f64,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for i in 0..got.len() {
        prop_assert!(
            close(got[i], want[i], ulps, 1e-38 + abs(inputs[i])),
            "{}: element {} of input {:?}: jit {:?}, reference {:?} ({} ulps allowed)",
            key,
            i,
            inputs.get(i),
            got[i],
            want[i],
            ulps
        );
    }
    Ok(())
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::Nchw), Just(Layout::Nchw4c)]
}

/// Awkward channel counts and extents: one pixel, one channel, channels that are not a
/// multiple of four, widths that leave an NCHW remainder.
fn shape() -> impl Strategy<Value = [usize; 4]> {
    (
        1..=2usize,
        prop::sample::select(vec![1usize, 3, 4, 5, 7, 8, 13]),
        1..=4usize,
        prop::sample::select(vec![1usize, 2, 3, 4, 5, 9, 17]),
    )
        .prop_map(|(n, c, h, w)| [n, c, h, w])
}

/// The vector tiers this host runs, each as likely.
fn tier() -> impl Strategy<Value = Isa> {
    prop::sample::select(common::host_tiers())
}

/// At a wide tier, the kernel's output `raw` has the bits of the x128 kernel's on the same
/// buffers: the wide runs compute each vector with the x128 loop's operations.
fn check_x128_bits(
    d: &EltwiseDesc,
    raw: &[f32],
    src: &[f32],
    extra: &[Vec<f32>],
) -> Result<(), TestCaseError> {
    if d.isa == Isa::X128 {
        return Ok(());
    }
    let narrow = EltwiseDesc {
        isa: Isa::X128,
        ..d.clone()
    };
    let p = compile(&PrimitiveKey::Eltwise(narrow));
    let want = run(&p, src, None, extra, raw.len())?;
    let same = raw
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    prop_assert!(
        same,
        "{}: differs from its x128 kernel",
        PrimitiveKey::Eltwise(d.clone())
    );
    Ok(())
}

fn activation() -> impl Strategy<Value = Activation> {
    prop_oneof![
        Just(Activation::Sigmoid),
        (0.01f32..1.0, -1.0f32..1.0)
            .prop_map(|(alpha, beta)| Activation::HardSigmoid { alpha, beta }),
        Just(Activation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5
        }),
        Just(Activation::HardSwish),
        Just(Activation::Tanh),
        (0.0f32..1.0).prop_map(|alpha| Activation::LeakyRelu { alpha }),
        (0.1f32..2.0).prop_map(|alpha| Activation::Elu { alpha }),
        Just(Activation::Silu),
        Just(Activation::Exp),
    ]
}

fn binary_kind() -> impl Strategy<Value = BinaryKind> {
    prop_oneof![
        Just(BinaryKind::Add),
        Just(BinaryKind::Sub),
        Just(BinaryKind::Mul),
        Just(BinaryKind::Div)
    ]
}

fn broadcast() -> impl Strategy<Value = Broadcast> {
    prop_oneof![
        Just(Broadcast::Full),
        Just(Broadcast::PerImageChannel),
        Just(Broadcast::PerChannel)
    ]
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An op of a runtime-extent property: an element-wise op, or a concat of these channels.
#[derive(Clone, Debug)]
enum ExtentOp {
    Eltwise(EltwiseKind),
    Concat(Vec<usize>),
}

fn extent_op() -> impl Strategy<Value = ExtentOp> {
    prop_oneof![
        Just(ExtentOp::Eltwise(EltwiseKind::Relu)),
        Just(ExtentOp::Eltwise(EltwiseKind::Add)),
        activation().prop_map(|a| ExtentOp::Eltwise(EltwiseKind::Act(a))),
        Just(ExtentOp::Eltwise(EltwiseKind::PRelu)),
        (binary_kind(), broadcast())
            .prop_map(|(op, rhs)| ExtentOp::Eltwise(EltwiseKind::Binary { op, rhs })),
        prop::collection::vec(1usize..=9, 1..=4).prop_map(ExtentOp::Concat),
    ]
}

/// One call of an [`ExtentOp`]: its exact key and its buffers.
struct ExtentCall {
    key: PrimitiveKey,
    src: Vec<f32>,
    extra: Vec<Vec<f32>>,
    dst_len: usize,
}

impl ExtentOp {
    /// The op over `[n, c, h, w]` (a concat's inputs have their own channels) with inputs
    /// drawn from `seed`, at the tier `isa` grants it.
    fn call(&self, [n, c, h, w]: [usize; 4], layout: Layout, isa: Isa, seed: u64) -> ExtentCall {
        let mut rng = Rng(seed);
        let shape = [n, c, h, w];
        match self {
            ExtentOp::Eltwise(kind) => {
                let d = EltwiseDesc {
                    kind: *kind,
                    shape,
                    layout,
                    isa: Isa::X128,
                    runtime: RuntimeDims::NONE,
                }
                .at_tier(isa);
                let src = to_layout(&rng.tensor(&shape, true), layout);
                let extra = match kind {
                    EltwiseKind::Relu | EltwiseKind::Act(_) => vec![],
                    EltwiseKind::Add => vec![to_layout(&rng.tensor(&shape, true), layout)],
                    EltwiseKind::PRelu => {
                        let mut slope = rng.tensor(&[c], false).data;
                        slope.resize(c.div_ceil(4) * 4, 0.0);
                        vec![slope]
                    }
                    EltwiseKind::Binary { rhs, .. } => {
                        vec![to_layout(&rng.tensor(&rhs.shape(shape), true), layout)]
                    }
                };
                ExtentCall {
                    key: PrimitiveKey::Eltwise(d),
                    src,
                    extra,
                    dst_len: layout.buffer_len(shape),
                }
            }
            ExtentOp::Concat(channels) => {
                let d = ConcatDesc {
                    mb: n,
                    channels: channels.clone(),
                    h,
                    w,
                    layout,
                    runtime: RuntimeDims::NONE,
                };
                let mut inputs: Vec<Vec<f32>> = channels
                    .iter()
                    .map(|&c| to_layout(&rng.tensor(&[n, c, h, w], true), layout))
                    .collect();
                let src = inputs.remove(0);
                ExtentCall {
                    dst_len: layout.buffer_len(d.dst_shape()),
                    key: PrimitiveKey::Concat(d),
                    src,
                    extra: inputs,
                }
            }
        }
    }
}

/// `key` with the extents `rt` names left to run time.
fn with_runtime(key: PrimitiveKey, rt: RuntimeDims) -> PrimitiveKey {
    match key {
        PrimitiveKey::Eltwise(d) => PrimitiveKey::Eltwise(d.with_runtime(rt)),
        PrimitiveKey::Concat(d) => PrimitiveKey::Concat(d.with_runtime(rt)),
        other => panic!("{other} has no runtime extents here"),
    }
}

/// The padding lanes of a last, partial `nChw4c` block must be written as zeros.
fn padding_is_zero(buf: &[f32], layout: Layout, [n, c, h, w]: [usize; 4]) -> bool {
    if layout == Layout::Nchw || c % 4 == 0 {
        return true;
    }
    let blocks = c.div_ceil(4);
    (0..n * h * w).all(|p| {
        let (image, pixel) = (p / (h * w), p % (h * w));
        let base = ((image * blocks + blocks - 1) * h * w + pixel) * 4;
        (c % 4..4).all(|l| buf[base + l] == 0.0)
    })
}

proptest! {
    #![proptest_config(config())]

    /// At every tier the host runs (a wide tier's runs bit-identical to x128).
    #[test]
    fn activations_match_the_reference(
        act in activation(),
        shape in shape(),
        layout in layout(),
        seed in any::<u64>(),
        isa in tier(),
    ) {
        let x = Rng(seed).tensor(&shape, true);
        let d = EltwiseDesc { kind: EltwiseKind::Act(act), shape, layout, isa: Isa::X128, runtime: RuntimeDims::NONE }
            .at_tier(isa);
        let key = PrimitiveKey::Eltwise(d.clone());
        let p = compile(&key);
        let src = to_layout(&x, layout);
        let raw = run(&p, &src, None, &[], layout.buffer_len(shape))?;
        prop_assert!(padding_is_zero(&raw, layout, shape), "{key}: padding lanes");
        check_x128_bits(&d, &raw, &src, &[])?;
        let got = from_layout(&raw, layout, shape);
        let want = primjit_reference::activation(&x, act);
        check_close(&key, &x.data, &got, &want.data, act_ulps(act), |x| act_abs(act, x))?;
    }

    #[test]
    fn prelu_matches_the_reference(
        shape in shape(),
        layout in layout(),
        seed in any::<u64>(),
        isa in tier(),
    ) {
        let mut rng = Rng(seed);
        let x = rng.tensor(&shape, true);
        let slope = rng.tensor(&[shape[1]], false);
        let d = EltwiseDesc { kind: EltwiseKind::PRelu, shape, layout, isa: Isa::X128, runtime: RuntimeDims::NONE }
            .at_tier(isa);
        let key = PrimitiveKey::Eltwise(d.clone());
        let p = compile(&key);
        let mut padded = slope.data.clone();
        padded.resize(shape[1].div_ceil(4) * 4, 0.0);
        let src = to_layout(&x, layout);
        let extra = [padded];
        let raw = run(&p, &src, None, &extra, layout.buffer_len(shape))?;
        prop_assert!(padding_is_zero(&raw, layout, shape), "{key}: padding lanes");
        check_x128_bits(&d, &raw, &src, &extra)?;
        let got = from_layout(&raw, layout, shape);
        let want = primjit_reference::prelu(&x, &slope);
        check_close(&key, &x.data, &got, &want.data, 0.0, |_| 0.0)?;
    }

    #[test]
    fn binary_ops_match_the_reference(
        op in binary_kind(),
        rhs in broadcast(),
        shape in shape(),
        layout in layout(),
        seed in any::<u64>(),
        isa in tier(),
    ) {
        let mut rng = Rng(seed);
        let a = rng.tensor(&shape, true);
        let b = rng.tensor(&rhs.shape(shape), true);
        let d = EltwiseDesc {
            kind: EltwiseKind::Binary { op, rhs },
            shape,
            layout,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        }
        .at_tier(isa);
        let key = PrimitiveKey::Eltwise(d.clone());
        key.validate().unwrap();
        let p = compile(&key);
        let src = to_layout(&a, layout);
        let extra = [to_layout(&b, layout)];
        let raw = run(&p, &src, None, &extra, layout.buffer_len(shape))?;
        prop_assert!(padding_is_zero(&raw, layout, shape), "{key}: padding lanes");
        check_x128_bits(&d, &raw, &src, &extra)?;
        let got = from_layout(&raw, layout, shape);
        let want = primjit_reference::binary(op, &a, &b);
        check_close(&key, &a.data, &got, &want.data, 0.0, |_| 0.0)?;
    }

    #[test]
    fn concat_matches_the_reference(
        channels in prop::collection::vec(1usize..=9, 1..=4),
        (n, h, w) in (1..=2usize, 1..=3usize, prop::sample::select(vec![1usize, 2, 5])),
        layout in layout(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let inputs: Vec<Tensor> = channels.iter().map(|&c| rng.tensor(&[n, c, h, w], true)).collect();
        let d = ConcatDesc { mb: n, channels: channels.clone(), h, w, layout, runtime: RuntimeDims::NONE };
        let shape = d.dst_shape();
        let key = PrimitiveKey::Concat(d);
        key.validate().unwrap();
        let p = compile(&key);
        let bufs: Vec<Vec<f32>> = inputs.iter().map(|t| to_layout(t, layout)).collect();
        let raw = run(&p, &bufs[0], None, &bufs[1..], layout.buffer_len(shape))?;
        prop_assert!(padding_is_zero(&raw, layout, shape), "{key}: padding lanes");
        let got = from_layout(&raw, layout, shape);
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let want = primjit_reference::concat(&refs);
        let same = got.iter().zip(&want.data).all(|(g, w)| g.to_bits() == w.to_bits());
        prop_assert!(same, "{key}: differs from the reference");
    }

    /// One kernel with runtime extents serves every extent: at the problem's and at two
    /// more, on one to three threads, it gives the exact key's bits (which the properties
    /// above hold to the reference), on guard-page buffers.
    #[test]
    fn runtime_extents_match_exact_keys(
        op in extent_op(),
        shape in shape(),
        layout in layout(),
        isa in tier(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=19usize, 1..=19usize), 2),
        seed in any::<u64>(),
    ) {
        let generic = compile(&with_runtime(op.call(shape, layout, isa, seed).key, rt));
        prop_assert!(generic.key().to_string().contains('*'), "{}", generic.key());
        let [n, c, h0, w0] = shape;
        for (h, w) in std::iter::once((h0, w0)).chain(more) {
            let at = [n, c, if rt.h { h } else { h0 }, if rt.w { w } else { w0 }];
            let call = op.call(at, layout, isa, seed);
            let want = run(&compile(&call.key), &call.src, None, &call.extra, call.dst_len)?;
            let got = run_with_scratch(
                &generic,
                &call.src,
                None,
                &call.extra,
                call.dst_len,
                0,
                Some([at[2], at[3]]),
            )?;
            let same = got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits());
            prop_assert!(same, "{} at {:?} differs from {}", generic.key(), at, call.key);
        }
    }

    #[test]
    fn channel_selections_match_the_reference(
        c in 1usize..=11,
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..=10),
        kind in 0..3usize,
        (groups, per_group) in (2..=4usize, 1..=12usize),
        (n, h, w) in (1..=2usize, 1..=3usize, prop::sample::select(vec![1usize, 2, 5])),
        layout in layout(),
        seed in any::<u64>(),
    ) {
        // A slice (a run of channels, aligned or not), any pick with repeats, or ShuffleNet's
        // channel shuffle of `groups` groups (whose blocks interleave two or more source
        // blocks), whole or one half of it (its split).
        let (c, select): (usize, Vec<usize>) = match kind {
            0 => {
                let start = picks[0].index(c);
                (c, (start..c).take(picks.len()).collect())
            }
            1 => (c, picks.iter().map(|i| i.index(c)).collect()),
            _ => {
                let c = groups * per_group;
                let shuffle: Vec<usize> = (0..c).map(|i| (i % groups) * per_group + i / groups).collect();
                let part = match picks[0].index(3) {
                    0 => 0..c,
                    1 => 0..c / 2,
                    _ => c / 2..c,
                };
                (c, shuffle[part].to_vec())
            }
        };
        prop_assume!(!select.is_empty());
        let x = Rng(seed).tensor(&[n, c, h, w], true);
        let d = SelectDesc { mb: n, c, h, w, select: select.clone(), layout };
        let shape = d.dst_shape();
        let key = PrimitiveKey::SelectChannels(d);
        key.validate().unwrap();
        let p = compile(&key);
        let raw = run(&p, &to_layout(&x, layout), None, &[], layout.buffer_len(shape))?;
        prop_assert!(padding_is_zero(&raw, layout, shape), "{key}: padding lanes");
        let got = from_layout(&raw, layout, shape);
        let want = primjit_reference::select_channels(&x, &select);
        let same = got.iter().zip(&want.data).all(|(g, w)| g.to_bits() == w.to_bits());
        prop_assert!(same, "{key}: differs from the reference");
    }

    #[test]
    fn convs_with_an_activation_post_op_match_the_reference(
        act in activation().prop_filter("exp grows the conv's error without bound", |a| *a != Activation::Exp),
        (ic, oc) in (1..=6usize, 1..=9usize),
        (h, w) in (1..=5usize, 1..=7usize),
        k in prop::sample::select(vec![1usize, 3]),
        (src_layout, dst_layout) in (layout(), layout()),
        winograd in any::<bool>(),
        seed in any::<u64>(),
        isa in prop::sample::select(common::host_tiers()),
    ) {
        // Winograd's output transform applies the post-ops too (3x3, nChw4c in and out). At
        // a wide tier the tile stores its sums and Cranelift code applies the activation.
        let winograd = winograd && k == 3;
        let (src_layout, dst_layout) = if winograd {
            (Layout::Nchw4c, Layout::Nchw4c)
        } else {
            (src_layout, dst_layout)
        };
        let mut rng = Rng(seed);
        let x = rng.tensor(&[1, ic, h, w], false);
        let wt = rng.tensor(&[oc, ic, k, k], false);
        let b = rng.tensor(&[oc], false);
        let mut d = ConvDesc::new(1, ic, [h, w], oc, [k, k]);
        d.pads = Pads::uniform(k / 2);
        d.bias = true;
        d.post_ops = vec![PostOpDesc::Act(act)];
        d.src_layout = src_layout;
        d.dst_layout = dst_layout;
        if winograd {
            d.algo = ConvAlgo::WinogradF4x3;
        }
        d.isa = d.tier_for(isa);
        let key = PrimitiveKey::Conv(d.clone());
        key.validate().unwrap();
        let p = compile(&key);
        let packed = d.pack_weights(&wt.data, Some(&b.data), None);
        let shape = d.dst_shape();
        let raw = run_with_scratch(
            &p,
            &to_layout(&x, src_layout),
            Some(&packed),
            &[],
            dst_layout.buffer_len(shape),
            d.scratch_len(),
            None,
        )?;
        let got = from_layout(&raw, dst_layout, shape);
        let attrs = ConvAttrs { pads: d.pads, ..ConvAttrs::default() };
        let want = primjit_reference::conv2d(&x, &wt, Some(&b), &attrs, &[Post::Act(act)]);
        let abs = |t: &Tensor| Tensor { shape: t.shape.clone(), data: t.data.iter().map(|v| v.abs()).collect() };
        let m = primjit_reference::conv2d(&abs(&x), &abs(&wt), Some(&abs(&b)), &attrs, &[]);
        let pre = primjit_reference::conv2d(&x, &wt, Some(&b), &attrs, &[]);
        // Winograd's transforms: coefficients up to 8 on every term (`tests/kernels.rs` has
        // the exact bound), so its magnitude is held 64 times looser here.
        let terms = (ic * k * k + 1) as f64 * if winograd { 64.0 } else { 1.0 };
        for (i, &g) in got.iter().enumerate() {
            let conv = 1.5 * (terms + 4.0) * 2f64.powi(-23) * m.data[i] as f64;
            prop_assert!(
                close(g, want.data[i], act_ulps(act), conv + 1e-30 + act_abs(act, pre.data[i])),
                "{key}: element {i}: jit {:?}, reference {:?}", g, want.data[i]
            );
        }
    }
}

/// The post-op lists a conv with a PReLU post-op is tried with: alone, after and before a
/// residual add, with relu before and after it (the wide tiles' zero register), a clip, and
/// a sigmoid after it (the wide tiles' interleaved chains, several values at once).
fn prelu_posts() -> impl Strategy<Value = Vec<PostOpDesc>> {
    let clip = PostOpDesc::Clip { lo: -0.5, hi: 0.75 };
    let sigmoid = PostOpDesc::Act(Activation::Sigmoid);
    prop::sample::select(vec![
        vec![PostOpDesc::PRelu],
        vec![PostOpDesc::Add, PostOpDesc::PRelu],
        vec![PostOpDesc::PRelu, PostOpDesc::Add],
        vec![PostOpDesc::Relu, PostOpDesc::PRelu, PostOpDesc::Relu],
        vec![PostOpDesc::PRelu, clip],
        vec![PostOpDesc::PRelu, sigmoid],
        vec![PostOpDesc::Add, PostOpDesc::PRelu, sigmoid],
    ])
}

proptest! {
    #![proptest_config(config())]

    /// A PReLU post-op, its slopes packed after the bias: every conv family (direct, grouped,
    /// depthwise, Winograd) at every tier the host runs, against the reference, and a wide
    /// tier's output bit for bit the x128 kernel's.
    #[test]
    fn convs_with_a_prelu_post_op_match_the_reference(
        posts in prelu_posts(),
        (ic, oc) in (1..=9usize, 1..=13usize),
        (h, w) in (1..=6usize, 1..=9usize),
        k in prop::sample::select(vec![1usize, 3]),
        family in prop::sample::select(vec!["direct", "grouped", "depthwise", "winograd"]),
        (src_layout, dst_layout) in (layout(), layout()),
        bias in any::<bool>(),
        seed in any::<u64>(),
        isa in prop::sample::select(common::host_tiers()),
    ) {
        let (ic, oc, groups) = match family {
            "grouped" => (2 * ic.div_ceil(2), 2 * oc.div_ceil(2), 2),
            "depthwise" => (ic, ic, ic),
            _ => (ic, oc, 1),
        };
        let winograd = family == "winograd" && k == 3;
        let (src_layout, dst_layout) = if winograd || family == "depthwise" {
            (Layout::Nchw4c, Layout::Nchw4c)
        } else {
            (src_layout, dst_layout)
        };
        let mut rng = Rng(seed);
        let x = rng.tensor(&[1, ic, h, w], false);
        let wt = rng.tensor(&[oc, ic / groups, k, k], false);
        let b = rng.tensor(&[oc], false);
        let slopes = rng.tensor(&[oc], false);
        let r = rng.tensor(&[1, oc, h, w], false);
        let mut d = ConvDesc::new(1, ic, [h, w], oc, [k, k]);
        d.groups = groups;
        d.pads = Pads::uniform(k / 2);
        d.bias = bias;
        d.post_ops = posts.clone();
        d.src_layout = src_layout;
        d.dst_layout = dst_layout;
        if winograd {
            d.algo = ConvAlgo::WinogradF4x3;
        }
        d.isa = d.tier_for(isa);
        let key = PrimitiveKey::Conv(d.clone());
        key.validate().unwrap();
        let shape = d.dst_shape();
        let residuals: Vec<Vec<f32>> = (0..d.residuals()).map(|_| to_layout(&r, dst_layout)).collect();
        // Each tier packs the weights for its own tiles.
        let run_at = |d: &ConvDesc| {
            let packed = d.pack_weights(&wt.data, bias.then_some(&b.data[..]), Some(&slopes.data));
            run_with_scratch(
                &compile(&PrimitiveKey::Conv(d.clone())),
                &to_layout(&x, src_layout),
                Some(&packed),
                &residuals,
                dst_layout.buffer_len(shape),
                d.scratch_len(),
                None,
            )
        };
        let raw = run_at(&d)?;
        if d.isa != Isa::X128 {
            let narrow = run_at(&ConvDesc { isa: Isa::X128, ..d.clone() })?;
            let same = raw.iter().zip(&narrow).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{key}: differs from its x128 kernel");
        }
        let got = from_layout(&raw, dst_layout, shape);
        let attrs = ConvAttrs { pads: d.pads, groups, ..ConvAttrs::default() };
        let bias_t = bias.then_some(&b);
        let want_posts: Vec<Post> = posts
            .iter()
            .map(|p| match *p {
                PostOpDesc::PRelu => Post::PRelu(&slopes),
                PostOpDesc::Add => Post::Add(&r),
                PostOpDesc::Relu => Post::Relu,
                PostOpDesc::Clip { lo, hi } => Post::Clip { lo, hi },
                PostOpDesc::Act(a) => Post::Act(a),
            })
            .collect();
        let want = primjit_reference::conv2d(&x, &wt, bias_t, &attrs, &want_posts);
        let abs = |t: &Tensor| Tensor { shape: t.shape.clone(), data: t.data.iter().map(|v| v.abs()).collect() };
        let abs_b = abs(&b);
        let m = primjit_reference::conv2d(&abs(&x), &abs(&wt), bias.then_some(&abs_b), &attrs, &[]);
        // Slopes are within [-1, 1]: the post-ops shrink the conv's error, and add a rounding
        // each (a residual add, PReLU's product) or a sigmoid's ulps.
        let terms = (ic / groups * k * k + 1) as f64 * if winograd { 64.0 } else { 1.0 };
        let ulps = if posts.contains(&PostOpDesc::Act(Activation::Sigmoid)) { 8.0 } else { 2.0 };
        for (i, &g) in got.iter().enumerate() {
            let conv = 1.5 * (terms + 4.0) * 2f64.powi(-23) * m.data[i] as f64;
            prop_assert!(
                close(g, want.data[i], ulps, conv + 1e-30),
                "{key}: element {i}: jit {:?}, reference {:?}", g, want.data[i]
            );
        }
    }
}

/// Runs one activation kernel over `xs` (a `[1, 1, 1, len]` NCHW tensor, so the remainder
/// takes the scalar path too) and returns its results.
fn activation_on(act: Activation, xs: &[f32]) -> Vec<f32> {
    activation_at(act, xs, Isa::X128)
}

/// [`activation_on`] at tier `isa`.
fn activation_at(act: Activation, xs: &[f32], isa: Isa) -> Vec<f32> {
    let shape = [1, 1, 1, xs.len()];
    let key = PrimitiveKey::Eltwise(
        EltwiseDesc {
            kind: EltwiseKind::Act(act),
            shape,
            layout: Layout::Nchw,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        }
        .at_tier(isa),
    );
    let p = compile(&key);
    run(&p, xs, None, &[], xs.len()).expect("runs")
}

/// A sweep of `[lo, hi]` in `n` steps plus the special values.
fn sweep(lo: f32, hi: f32, n: usize) -> Vec<f32> {
    let mut xs: Vec<f32> = (0..=n)
        .map(|i| lo + (hi - lo) * i as f32 / n as f32)
        .collect();
    xs.extend([
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        1e-30,
        -1e-30,
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ]);
    xs.push(3.0);
    xs
}

#[test]
fn exp_is_within_its_bound_of_f64_over_its_whole_range() {
    let xs = sweep(-110.0, 100.0, 200_003);
    let got = activation_on(Activation::Exp, &xs);
    let mut worst = 0f64;
    for (&x, &g) in xs.iter().zip(&got) {
        let want = (x as f64).exp();
        if x.is_nan() {
            assert!(g.is_nan(), "exp({x}) = {g}");
            continue;
        }
        let want32 = want as f32;
        if want32.is_infinite() {
            assert_eq!(g, f32::INFINITY, "exp({x})");
            continue;
        }
        if want < f32::MIN_POSITIVE as f64 {
            // Subnormal or zero: absolute.
            assert!(
                (g as f64 - want).abs() <= 2.0 * f32::MIN_POSITIVE as f64 * 2f64.powi(-20),
                "exp({x}) = {g:e}, expected {want:e}"
            );
            continue;
        }
        let err = (g as f64 - want).abs() / ulp(want);
        worst = worst.max(err);
        assert!(
            err <= EXP_ULPS as f64,
            "exp({x}) = {g:e}, expected {want:e}: {err:.2} ulps"
        );
    }
    eprintln!("exp: largest error {worst:.2} ulps (bound {EXP_ULPS})");
    assert_eq!(activation_on(Activation::Exp, &[0.0])[0], 1.0);
}

#[test]
fn tanh_is_within_its_bound_of_f64_over_its_whole_range() {
    let mut xs = sweep(-12.0, 12.0, 100_003);
    xs.extend(sweep(-0.7, 0.7, 20_001));
    let got = activation_on(Activation::Tanh, &xs);
    let mut worst = 0f64;
    for (&x, &g) in xs.iter().zip(&got) {
        if x.is_nan() {
            assert!(g.is_nan(), "tanh({x}) = {g}");
            continue;
        }
        let want = (x as f64).tanh();
        let err = (g as f64 - want).abs() / ulp(want);
        worst = worst.max(err);
        assert!(
            err <= TANH_ULPS as f64,
            "tanh({x}) = {g:e}, expected {want:e}: {err:.2} ulps"
        );
    }
    eprintln!("tanh: largest error {worst:.2} ulps (bound {TANH_ULPS})");
}

/// `acts` on `xs` at every tier the host runs (the wide tiles' interleaved chains included):
/// within [`act_ulps`] of the reference (f64, rounded), plus `1e-38` and [`act_abs`].
fn check_whole_range(acts: &[Activation], xs: &[f32]) {
    for isa in common::host_tiers() {
        for &act in acts {
            let got = activation_at(act, xs, isa);
            let x = Tensor {
                shape: vec![xs.len()],
                data: xs.to_vec(),
            };
            let want = primjit_reference::activation(&x, act).data;
            let mut worst = 0f64;
            for ((&x, &g), &want) in xs.iter().zip(&got).zip(&want) {
                assert!(
                    close(g, want, act_ulps(act), 1e-38 + act_abs(act, x)),
                    "{act:?}({x}) at {isa} = {g:e}, expected {want:e}"
                );
                // Where the absolute bound does not cover it.
                if want.is_finite() && want.abs() > 1e-30 {
                    worst = worst.max((g as f64 - want as f64).abs() / ulp(want as f64));
                }
            }
            eprintln!(
                "{act:?} at {isa}: largest error {worst:.2} ulps (bound {})",
                act_ulps(act)
            );
        }
    }
}

/// Sigmoid and SiLU over `[-110, 100]` (where `exp(-x)` overflows, underflows, and the
/// results go subnormal) and the special values.
#[test]
fn sigmoid_and_silu_are_within_their_bound_of_f64_over_their_whole_range() {
    let mut xs = sweep(-110.0, 100.0, 200_003);
    xs.extend(sweep(-1.0, 1.0, 20_001));
    check_whole_range(&[Activation::Sigmoid, Activation::Silu], &xs);
}

/// ELU over `[-110, 100]` (its `expm1` clamped below -87, where it is -1 in f32 anyway), near
/// 0 (where `expm1` is its reduction's `q`) and around each `n` of the reduction that ELU
/// meets (`x` near `-k ln 2`), and the special values.
#[test]
fn elu_is_within_its_bound_of_f64_over_its_whole_range() {
    let mut xs = sweep(-110.0, 100.0, 200_003);
    xs.extend(sweep(-1e-3, 1e-3, 2_001));
    for k in 1..=30 {
        let at = -(k as f32 - 0.5) * std::f32::consts::LN_2;
        xs.extend(sweep(at - 1e-3, at + 1e-3, 201));
    }
    let acts = [
        Activation::Elu { alpha: 1.0 },
        Activation::Elu { alpha: 0.3 },
    ];
    check_whole_range(&acts, &xs);
}

#[test]
fn sigmoid_and_silu_saturate_and_keep_nan() {
    let xs = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        200.0,
        -200.0,
        f32::NAN,
        0.0,
    ];
    let s = activation_on(Activation::Sigmoid, &xs);
    assert_eq!(&s[..4], &[1.0, 0.0, 1.0, 0.0]);
    assert!(s[4].is_nan());
    assert_eq!(s[5], 0.5);
    let silu = activation_on(Activation::Silu, &xs);
    assert_eq!(silu[0], f32::INFINITY);
    assert_eq!(silu[2], 200.0);
    assert!(silu[3] == 0.0 && silu[4].is_nan());
    let hs = activation_on(Activation::HardSwish, &[-3.0, 3.0, 1.5, f32::NAN]);
    assert_eq!(&hs[..3], &[0.0, 3.0, 1.5 * (1.5 / 6.0 + 0.5)]);
    assert!(hs[3].is_nan());
}

/// `ir/examples/zoo_ops.ir`, every new op and post-op in one graph, through the graph
/// executor (after the passes fuse what they can) against the reference on the unfused
/// graph, with fixed and runtime widths: within 1e-5 of the largest output.
#[test]
fn the_zoo_ops_example_runs_as_the_reference_does() {
    use primjit_runtime::{CompiledGraph, ShapeMode, Workspace};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ir/examples/zoo_ops.ir");
    let graph = primjit_ir::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let params = primjit_ir::Params::random(&graph, 7);
    for (w, mode) in [
        (1, ShapeMode::Exact),
        (6, ShapeMode::Exact),
        (9, ShapeMode::Runtime),
    ] {
        let x = Rng(w as u64).tensor(&[1, 3, 5, w], false);
        let want = primjit_reference::run_graph(&graph, &params, &[("x", &x)]).unwrap();
        let compiled = CompiledGraph::new(&graph, &params).unwrap().with_mode(mode);
        let (got, _) = compiled
            .run(engine(), &[("x", &x)], &mut Workspace::new())
            .unwrap();
        let (want, got) = (&want[0].1, &got[0].1);
        assert_eq!(want.shape, got.shape);
        let scale = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (g, r)) in got.data.iter().zip(&want.data).enumerate() {
            assert!(
                (g - r).abs() <= 1e-5 * scale,
                "W={w} {mode:?}: element {i}: jit {g}, reference {r}"
            );
        }
    }
}
