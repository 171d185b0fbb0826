//! Kernel correctness: every JIT kernel against the reference interpreter, on buffers that end exactly at a guard page.
//!
//! The properties follow tract's `ConvProblem`: a problem is a key plus a seed for its data, a
//! proptest strategy generates valid problems (filtered with `PrimitiveKey::validate`),
//! `reference()` runs `primjit_reference` on NCHW tensors and `run()` runs the JIT kernel.
//!
//! Every buffer a kernel sees (source, packed weights, destination, residuals, second source)
//! is a [`GuardedBuffer`] whose last float ends at a `PROT_NONE` page, so reading or writing
//! one element past any buffer kills the test with SIGSEGV. Destinations start filled with a
//! NaN sentinel, so an element the kernel forgets to write fails the comparison.
//!
//! Every problem runs once on one thread and again with `execute_parallel` on rayon pools of
//! two and three threads; the results must be bit-identical (each output element is computed
//! by exactly one thread, with the same instruction sequence, whatever the split). Since
//! threads writing identical values would hide a kernel that strays outside its rows, the
//! partial-rows properties also run rows `[a, b)` alone (`Primitive::execute_range`) and check
//! that exactly those rows are written, bit-identical to the full run.
//!
//! # Tolerances
//!
//! The reference computes every output in f64 from the exact f32 inputs and rounds once; the
//! kernels accumulate in f32. Let `u = 2^-24` be the unit roundoff of f32.
//!
//! * Convolution: the kernel starts from the bias and adds `K0 = ic / groups * kh * kw`
//!   products one at a time (an FMA rounds once per step; without FMA the product and the sum
//!   round once each). The classic bound for recursive summation gives
//!   `|computed - exact| <= gamma_n * sum |terms|` with `gamma_n = n u / (1 - n u)` and `n` at
//!   most `2 (K0 + 1)`. `relu` and `clip` are 1-Lipschitz, so they never grow an error (and
//!   once clip clamps, its value is exact); each residual `add` rounds once more, by at most
//!   `u` times the magnitude of its result. The reference's final rounding adds `u |ref|`.
//!   All those magnitudes are bounded by
//!   `m = conv2d(|x|, |w|, |b|, [add |r| for each residual]) + max over clips of max(|lo|, |hi|)`
//!   (computed with the reference interpreter itself): before any clip, an intermediate value
//!   is at most the magnitude sum plus the residuals added so far; after a clip it is at most
//!   the clip bound plus the residuals added after it. With `K = K0 + 1 (bias) + adds` the total
//!   error is therefore below `(2 K + 2) u m (1 + small)`, and we allow
//!   `|jit - ref| <= (K + 4) * 2^-23 * m + 1e-30` per element: the bound with a little slack.
//!   The `1e-30` absolute term only matters where `m` is 0 (every tap in padding, no bias).
//! * Winograd F(4x4, 3x3) convolution computes `Aᵀ [Σ_ic U ⊙ V] A + bias` with `U = G g Gᵀ`
//!   (in f64, rounded once) and `V = Bᵀ d B` in f32 (two passes of 1-D transforms whose
//!   outputs take at most two roundings each), a GEMM over `ic` channels, and two passes of
//!   the output transform (at most three roundings each; four at stride 2, whose polyphase
//!   form adds its two phases' sums, with its own `Bᵀ`, `G` and `Aᵀ`). By the same analysis
//!   as above, every rounding is bounded by `u` times the value it rounds, and every value is
//!   bounded by the same computation done with the absolute values of every matrix, weight
//!   and input: `m_w = |Aᵀ| [Σ_ic (|G| |g| |Gᵀ|) ⊙ (|Bᵀ| |d| |B|)] |A|` plus the bias,
//!   residual and clip terms. With the chain length `K_w = 4 + 1 + ic + 6 (stride 2: 8) + 1
//!   (bias) + adds`, we allow `(K_w + 4) * 2^-23 * m_w + 1e-30`. `m_w` is larger than the direct `m` (the transforms'
//!   coefficients reach 5 and 8): that is Winograd's larger f32 error, stated per element
//!   rather than by loosening the direct kernels' tolerance.
//! * Average pooling: the kernel sums the `n <= kh * kw` valid taps in f32 (`(n - 1)` roundings
//!   of partial sums bounded by `sum |x|`) and multiplies by `1 / count` rounded to f32 (two
//!   more roundings): with `m = pool2d(|x|)` (the same average of magnitudes) the error is
//!   below `(n + 2) u m`, and we allow `(K + 4) * 2^-23 * m + 1e-30` with `K = kh * kw`.
//!   Global average pooling is the same with `K = ih * iw`.
//! * Max pooling, global max pooling and relu select one input exactly: results must be
//!   equal. An element-wise add rounds once, like the reference (rounding the exact f64 sum of
//!   two f32s to f32 is correctly rounded): equal as well.

mod common;
use common::{SENTINEL, engine, pools, runtime_dims};

use std::ops::Range;
use std::sync::Arc;

use primjit_codegen::conv::winograd::WinogradPlan;
use primjit_codegen::key::RuntimeDims;
use primjit_codegen::plan::AxisPlan;
use primjit_codegen::{
    Activation, CHUNK_WEIGHT_BYTES, ConvAlgo, ConvDesc, ConvPlan, EltwiseDesc, EltwiseKind,
    FmaPattern, GlobalPoolDesc, Isa, Layout, Pitches, PoolDesc, PoolWindow, PostOpDesc,
    PrimitiveKey,
};
use primjit_reference::{ConvAttrs, Pads, PoolAttrs, PoolKind, Post, Tensor};
use primjit_runtime::exec::GuardedBuffer;
use primjit_runtime::layout::{to_blocked, to_nchw};
use primjit_runtime::stream::rows_and_elem;
use primjit_runtime::{ExecArgs, ExecError, Primitive, RuntimeError};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------------------------
// Shared machinery: engine, thread pools, data, guarded buffers, execution and comparison.
// ---------------------------------------------------------------------------------------------

/// The unit in the last place of 1.0 in f32, `2^-23 = 2u`.
const EPS: f64 = f32::EPSILON as f64;

fn compile(key: &PrimitiveKey) -> Result<Arc<Primitive>, TestCaseError> {
    engine()
        .compile(key)
        .map_err(|e| TestCaseError::fail(format!("{key} does not compile: {e}")))
}

/// SplitMix64: deterministic test data from a proptest-chosen seed.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        common::splitmix64(&mut self.0)
    }

    /// Mostly uniform in `[-1, 1)` with all 24 bits of mantissa random (so that sums really
    /// round), sometimes an exact zero or a small integer (ties for max, exact cancellations).
    fn value(&mut self) -> f32 {
        let r = self.next_u64();
        match r % 16 {
            0 => 0.0,
            1 => ((r >> 8) % 5) as f32 - 2.0,
            _ => (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0,
        }
    }

    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n).map(|_| self.value()).collect(),
        }
    }
}

fn abs(t: &Tensor) -> Tensor {
    Tensor {
        shape: t.shape.clone(),
        data: t.data.iter().map(|v| v.abs()).collect(),
    }
}

fn shape4(t: &Tensor) -> [usize; 4] {
    t.shape.clone().try_into().expect("rank 4")
}

/// An NCHW tensor in `layout` (nChw4c padding lanes zero).
fn to_layout(t: &Tensor, layout: Layout) -> Vec<f32> {
    match layout {
        Layout::Nchw => t.data.clone(),
        Layout::Nchw4c => to_blocked(&t.data, shape4(t)),
    }
}

/// A buffer of `layout` back in NCHW.
fn from_layout(buf: &[f32], layout: Layout, shape: [usize; 4]) -> Vec<f32> {
    match layout {
        Layout::Nchw => buf.to_vec(),
        Layout::Nchw4c => to_nchw(buf, shape),
    }
}

fn guarded(data: &[f32]) -> GuardedBuffer {
    GuardedBuffer::from_slice(data).expect("map a guarded buffer")
}

fn sentinel_dst(len: usize) -> GuardedBuffer {
    let mut dst = GuardedBuffer::new(len).expect("map a guarded buffer");
    dst.as_mut_slice().fill(f32::from_bits(SENTINEL));
    dst
}

/// The inputs of one execution, each in its own guarded buffer.
struct Buffers {
    src: GuardedBuffer,
    weights: Option<GuardedBuffer>,
    extra: Vec<GuardedBuffer>,
    /// The destination's layout and logical shape.
    dst_layout: Layout,
    dst_shape: [usize; 4],
    /// The input extents to pass, for a primitive with runtime extents.
    extents: Option<[usize; 2]>,
    /// Floats of scratch per thread (a fused pool's band), 0 for none.
    scratch_len: usize,
}

impl Buffers {
    fn dst_len(&self) -> usize {
        self.dst_layout.buffer_len(self.dst_shape)
    }

    /// A guarded scratch of one band per thread, filled with the sentinel NaN, so that a
    /// kernel reading a slot of its band before writing it sees no plausible data.
    fn scratch(&self, threads: usize) -> Option<GuardedBuffer> {
        (self.scratch_len > 0).then(|| sentinel_dst(self.scratch_len * threads))
    }

    /// Runs `p` into a fresh sentinel-filled guarded destination (on `pool` if given) and
    /// returns the raw destination.
    fn execute(
        &self,
        p: &Primitive,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<Vec<f32>, TestCaseError> {
        let mut dst = sentinel_dst(self.dst_len());
        let extra: Vec<&[f32]> = self.extra.iter().map(|b| b.as_slice()).collect();
        let threads = pool.map_or(1, |p| p.current_num_threads());
        let mut scratch = self.scratch(threads);
        let args = ExecArgs {
            src: self.src.as_slice(),
            weights: self.weights.as_ref().map(|w| w.as_slice()),
            dst: dst.as_mut_slice(),
            extra: &extra,
            scratch: scratch.as_mut().map(|s| s.as_mut_slice()),
        };
        let result = match pool {
            Some(pool) => p.execute_parallel(args, self.extents.map(Into::into), pool),
            None => match self.extents {
                Some(e) => p.execute_at(args, e),
                None => p.execute(args),
            },
        };
        result.map_err(|e| TestCaseError::fail(format!("execution failed: {e}")))?;
        Ok(dst.as_slice().to_vec())
    }

    /// Runs on one thread, then on pools of two and three threads, requires the three raw
    /// destinations to be bit-identical, and returns the destination in NCHW.
    fn run_all(&self, p: &Primitive) -> Result<Vec<f32>, TestCaseError> {
        let single = self.execute(p, None)?;
        for pool in pools() {
            let parallel = self.execute(p, Some(pool))?;
            assert_bit_identical(
                &single,
                &parallel,
                &format!("{} on {} threads", p.key(), pool.current_num_threads()),
            )?;
        }
        Ok(from_layout(&single, self.dst_layout, self.dst_shape))
    }

    /// Runs `p` for work items `rows` only (`Primitive::execute_range`) into a fresh
    /// sentinel-filled guarded destination and returns it raw.
    fn execute_rows(&self, p: &Primitive, rows: Range<usize>) -> Result<Vec<f32>, TestCaseError> {
        let mut dst = sentinel_dst(self.dst_len());
        let extra: Vec<&[f32]> = self.extra.iter().map(|b| b.as_slice()).collect();
        let mut scratch = self.scratch(1);
        let args = ExecArgs {
            src: self.src.as_slice(),
            weights: self.weights.as_ref().map(|w| w.as_slice()),
            dst: dst.as_mut_slice(),
            extra: &extra,
            scratch: scratch.as_mut().map(|s| s.as_mut_slice()),
        };
        p.execute_range(args, self.extents, rows.clone())
            .map_err(|e| TestCaseError::fail(format!("rows {rows:?} failed: {e}")))?;
        Ok(dst.as_slice().to_vec())
    }

    /// Runs work items `[a, b)` alone and checks that exactly the destination elements they
    /// own are written, bit-identical to `full` (the raw destination of a complete run):
    /// their rows, where a direct conv's item may span several rows
    /// (`ConvPlan::joined_rows`), or, where a direct conv joins its whole image into one row,
    /// their output channels (`ConvPlan::tiles_per_item`).
    fn check_rows(
        &self,
        p: &Primitive,
        full: &[f32],
        items: Range<usize>,
    ) -> Result<(), TestCaseError> {
        let key = p.key();
        let part = self.execute_rows(p, items.clone())?;
        let (rows, channels) = match key {
            PrimitiveKey::Conv(d) if d.algo == ConvAlgo::Direct => {
                ConvPlan::new(d).item_outputs(items.clone())
            }
            _ => (items.clone(), 0..usize::MAX),
        };
        let [_, c, h, w] = self.dst_shape;
        let row_len = match self.dst_layout {
            Layout::Nchw => w,
            Layout::Nchw4c => 4 * w,
        };
        for (i, (&p, &f)) in part.iter().zip(full).enumerate() {
            let row = i / row_len % h;
            let channel = match self.dst_layout {
                Layout::Nchw => i / (h * w) % c,
                Layout::Nchw4c => i / (4 * h * w) % c.div_ceil(4) * 4 + i % 4,
            };
            let expected = if rows.contains(&row) && channels.contains(&channel) {
                f.to_bits()
            } else {
                SENTINEL
            };
            prop_assert!(
                p.to_bits() == expected,
                "{key}, items {items:?} (rows {rows:?}, channels {channels:?}): element {i} \
                 (row {row}, channel {channel}) is {p:?}, expected {:?}",
                f32::from_bits(expected)
            );
        }
        Ok(())
    }
}

fn assert_bit_identical(a: &[f32], b: &[f32], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.len(), b.len());
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        return Err(TestCaseError::fail(format!(
            "{what}: element {i} is {:?}, on one thread {:?}",
            b[i], a[i]
        )));
    }
    Ok(())
}

/// Compares NCHW results element-wise: exactly (value equality) where `tol` is `None`,
/// else `|got - want| <= tol(i)` computed in f64. NaN never passes.
fn compare(
    key: &PrimitiveKey,
    shape: [usize; 4],
    got: &[f32],
    want: &[f32],
    tol: Option<&dyn Fn(usize) -> f64>,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: output length", key);
    let ok = |i: usize| match tol {
        None => got[i] == want[i],
        Some(t) => (got[i] as f64 - want[i] as f64).abs() <= t(i),
    };
    let bad: Vec<usize> = (0..got.len()).filter(|&i| !ok(i)).collect();
    if let Some(&i) = bad.first() {
        let [_, c, h, w] = shape;
        let at = [i / (c * h * w), i / (h * w) % c, i / w % h, i % w];
        return Err(TestCaseError::fail(format!(
            "{key}: {} of {} elements differ; first at [n, c, h, w] = {at:?}: jit {:?}, \
             reference {:?}, tolerance {:?}",
            bad.len(),
            got.len(),
            got[i],
            want[i],
            tol.map(|t| t(i)),
        )));
    }
    Ok(())
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::Nchw), Just(Layout::Nchw4c)]
}

/// Awkward channel counts: 1, odd, one block, a block and one, multiples of 8 (a `ymm` of
/// output channels), 16 (a `zmm`) and 32 (the AVX-512 tile's two).
const CHANNELS: &[usize] = &[1, 3, 4, 5, 8, 16, 17, 24, 32];

/// The vector tiers this host runs, each as likely: a key of each is checked the same way.
/// (Tiers the host lacks are named as skipped, and emitted and decoded in `primjit-codegen`'s
/// tests.)
fn tier() -> impl Strategy<Value = Isa> {
    prop::sample::select(common::host_tiers())
}

/// A key's tier on an engine of tier `isa`, as the runtime sets it: the engine's where its
/// tiles cover the key (`ConvDesc::tier_for`), else x128.
trait AtTier {
    fn at_tier(self, isa: Isa) -> Self;
}

impl AtTier for ConvDesc {
    fn at_tier(mut self, isa: Isa) -> Self {
        self.isa = self.tier_for(isa);
        self
    }
}

fn channels() -> impl Strategy<Value = usize> {
    prop::sample::select(CHANNELS)
}

/// Spatial extents 1..=9, with 1 (a single row or column) drawn often.
fn extent() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(1usize), 4 => 1..=9usize]
}

/// Conv widths: mostly [`extent`], sometimes wide enough for whole register tiles (6 or 12
/// pixels) plus a remainder in one run of columns, which widths up to 9 rarely reach.
fn conv_width() -> impl Strategy<Value = usize> {
    prop_oneof![4 => extent(), 1 => 10..=28usize]
}

fn dilation() -> impl Strategy<Value = usize> {
    prop_oneof![3 => Just(1usize), 1 => 2..=3usize]
}

/// No padding, the same padding on every side, or each side drawn on its own.
fn pads(max: usize) -> impl Strategy<Value = Pads> {
    prop_oneof![
        1 => Just(Pads::default()),
        1 => (1..=max).prop_map(Pads::uniform),
        3 => (0..=max, 0..=max, 0..=max, 0..=max).prop_map(|(top, left, bottom, right)| Pads {
            top,
            left,
            bottom,
            right,
        }),
    ]
}

/// `cases` per property, unless `PROPTEST_CASES` asks for more (or fewer) on a deep run.
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        // Failures become named regression tests below instead of files next to this one.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Convolution.
// ---------------------------------------------------------------------------------------------

/// A convolution key and the seed of its data (input, weights, bias, residuals).
#[derive(Clone, Debug)]
struct ConvProblem {
    desc: ConvDesc,
    seed: u64,
}

struct ConvData {
    x: Tensor,
    w: Tensor,
    b: Option<Tensor>,
    residuals: Vec<Tensor>,
}

impl ConvProblem {
    fn key(&self) -> PrimitiveKey {
        PrimitiveKey::Conv(self.desc.clone())
    }

    fn data(&self) -> ConvData {
        let d = &self.desc;
        let mut rng = Rng(self.seed);
        ConvData {
            x: rng.tensor(&d.src_shape()),
            w: rng.tensor(&d.weight_shape()),
            b: d.bias.then(|| rng.tensor(&[d.oc])),
            residuals: (0..d.residuals())
                .map(|_| rng.tensor(&d.dst_shape()))
                .collect(),
        }
    }

    fn attrs(&self) -> ConvAttrs {
        ConvAttrs {
            strides: self.desc.strides,
            dilations: self.desc.dilations,
            pads: self.desc.pads,
            groups: self.desc.groups,
        }
    }

    /// The reference interpreter's result (NCHW), post-ops in key order.
    fn reference(&self) -> Tensor {
        let data = self.data();
        let mut residuals = data.residuals.iter();
        let posts: Vec<Post<'_>> = self
            .desc
            .post_ops
            .iter()
            .map(|p| match *p {
                PostOpDesc::Relu => Post::Relu,
                PostOpDesc::Add => Post::Add(residuals.next().expect("one residual per add")),
                PostOpDesc::Clip { lo, hi } => Post::Clip { lo, hi },
                // tests/eltwise.rs tests convs with activations and PReLU.
                PostOpDesc::Act(a) => Post::Act(a),
                PostOpDesc::PRelu => unreachable!("this file's keys take no prelu"),
            })
            .collect();
        let y = primjit_reference::conv2d(&data.x, &data.w, data.b.as_ref(), &self.attrs(), &posts);
        self.pooled(y)
    }

    /// `y` max-pooled by the fused pool, if the key has one.
    fn pooled(&self, y: Tensor) -> Tensor {
        match &self.desc.pool {
            Some(w) => primjit_reference::pool2d(&y, &PoolAttrs::max(w)),
            None => y,
        }
    }

    /// The per-element magnitude `m` of the tolerance (see the module documentation).
    fn magnitude(&self) -> Tensor {
        let data = self.data();
        let abs_res: Vec<Tensor> = data.residuals.iter().map(abs).collect();
        let posts: Vec<Post<'_>> = abs_res.iter().map(Post::Add).collect();
        let mut m = primjit_reference::conv2d(
            &abs(&data.x),
            &abs(&data.w),
            data.b.as_ref().map(abs).as_ref(),
            &self.attrs(),
            &posts,
        );
        let clip = self
            .desc
            .post_ops
            .iter()
            .map(|p| match *p {
                PostOpDesc::Clip { lo, hi } => lo.abs().max(hi.abs()),
                _ => 0.0,
            })
            .fold(0.0f32, f32::max);
        m.data.iter_mut().for_each(|v| *v += clip);
        // A max is 1-Lipschitz: its error is at most the largest error in its window, whose
        // bound grows with the magnitude.
        self.pooled(m)
    }

    /// The reduction length `K` of the tolerance: products, bias and residual adds.
    fn reduction_len(&self) -> usize {
        let [_, icg, kh, kw] = self.desc.weight_shape();
        icg * kh * kw + usize::from(self.desc.bias) + self.desc.residuals()
    }

    /// The magnitude `m` of the Winograd tolerance: the whole computation
    /// `Aᵀ [Σ_ic (G g Gᵀ) ⊙ (Bᵀ d B)] A` redone with the absolute value of every matrix,
    /// weight and input, plus the bias, residual and clip terms of [`Self::magnitude`] (see
    /// "Winograd" in the module documentation).
    fn winograd_magnitude(&self) -> Tensor {
        type Matrix = Vec<Vec<f64>>;
        let rows = |m: &[&[f64]]| -> Matrix { m.iter().map(|r| r.to_vec()).collect() };
        // |G|, |Bᵀ| and |Aᵀ| of the key's form: F(4x4, 3x3), or at stride 2 F(4, 2)'s on the
        // even patch positions beside the odd ones taken as they are (`conv::winograd`).
        let (g, bt, at): (Matrix, Matrix, Matrix) = if self.desc.strides == [2, 2] {
            let g2: [[f64; 2]; 5] = [
                [0.5, 0.0],
                [0.5, 0.5],
                [1.0 / 6.0, 1.0 / 6.0],
                [1.0 / 6.0, 1.0 / 3.0],
                [0.0, 1.0],
            ];
            let bt2: [[f64; 5]; 5] = [
                [2.0, 1.0, 2.0, 1.0, 0.0],
                [0.0, 2.0, 1.0, 1.0, 0.0],
                [0.0, 2.0, 3.0, 1.0, 0.0],
                [0.0, 1.0, 0.0, 1.0, 0.0],
                [0.0, 2.0, 1.0, 2.0, 1.0],
            ];
            let at2: [[f64; 5]; 4] = [
                [1.0, 1.0, 1.0, 1.0, 0.0],
                [0.0, 1.0, 1.0, 2.0, 0.0],
                [0.0, 1.0, 1.0, 4.0, 0.0],
                [0.0, 1.0, 1.0, 8.0, 1.0],
            ];
            let mut g: Matrix = g2.iter().map(|&[a, b]| vec![a, 0.0, b]).collect();
            g.extend((0..4).map(|_| vec![0.0, 1.0, 0.0]));
            let mut bt = vec![vec![0.0; 9]; 9];
            for (i, row) in bt2.iter().enumerate() {
                for (k, &x) in row.iter().enumerate() {
                    bt[i][2 * k] = x;
                }
            }
            for k in 0..4 {
                bt[5 + k][2 * k + 1] = 1.0;
            }
            let at = (0..4)
                .map(|i| {
                    let mut row = at2[i].to_vec();
                    row.extend((0..4).map(|k| if k == i { 1.0 } else { 0.0 }));
                    row
                })
                .collect();
            (g, bt, at)
        } else {
            (
                rows(&[
                    &[0.25, 0.0, 0.0],
                    &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0],
                    &[1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0],
                    &[1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
                    &[1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
                    &[0.0, 0.0, 1.0],
                ]),
                rows(&[
                    &[4.0, 0.0, 5.0, 0.0, 1.0, 0.0],
                    &[0.0, 4.0, 4.0, 1.0, 1.0, 0.0],
                    &[0.0, 4.0, 4.0, 1.0, 1.0, 0.0],
                    &[0.0, 2.0, 1.0, 2.0, 1.0, 0.0],
                    &[0.0, 2.0, 1.0, 2.0, 1.0, 0.0],
                    &[0.0, 4.0, 0.0, 5.0, 0.0, 1.0],
                ]),
                rows(&[
                    &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
                    &[0.0, 1.0, 1.0, 2.0, 2.0, 0.0],
                    &[0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
                    &[0.0, 1.0, 1.0, 8.0, 8.0, 1.0],
                ]),
            )
        };
        // `l · x · rᵀ` of small matrices.
        fn sandwich(l: &[Vec<f64>], x: &[Vec<f64>], r: &[Vec<f64>]) -> Vec<Vec<f64>> {
            l.iter()
                .map(|li| {
                    r.iter()
                        .map(|rj| {
                            (0..x.len())
                                .flat_map(|p| (0..x[p].len()).map(move |q| (p, q)))
                                .map(|(p, q)| li[p] * x[p][q] * rj[q])
                                .sum()
                        })
                        .collect()
                })
                .collect()
        }
        let d = &self.desc;
        let data = self.data();
        let (oh, ow) = (d.oh(), d.ow());
        let (n_patch, step) = (bt.len(), 4 * d.strides[0]);
        let u: Vec<Matrix> = (0..d.oc * d.ic)
            .map(|k| {
                let w: Matrix = (0..3)
                    .map(|a| {
                        (0..3)
                            .map(|b| f64::from(data.w.data[k * 9 + a * 3 + b].abs()))
                            .collect()
                    })
                    .collect();
                sandwich(&g, &w, &g)
            })
            .collect();
        let mut m = vec![0.0f64; d.mb * d.oc * oh * ow];
        for n in 0..d.mb {
            for ty in 0..oh.div_ceil(4) {
                for tx in 0..ow.div_ceil(4) {
                    let v: Vec<Matrix> = (0..d.ic)
                        .map(|c| {
                            let patch: Matrix = (0..n_patch)
                                .map(|a| {
                                    (0..n_patch)
                                        .map(|b| {
                                            let y = (ty * step + a) as isize - d.pads.top as isize;
                                            let x = (tx * step + b) as isize - d.pads.left as isize;
                                            if (0..d.ih as isize).contains(&y)
                                                && (0..d.iw as isize).contains(&x)
                                            {
                                                let i = ((n * d.ic + c) * d.ih + y as usize) * d.iw
                                                    + x as usize;
                                                f64::from(data.x.data[i].abs())
                                            } else {
                                                0.0
                                            }
                                        })
                                        .collect()
                                })
                                .collect();
                            sandwich(&bt, &patch, &bt)
                        })
                        .collect();
                    for o in 0..d.oc {
                        let mut prod = vec![vec![0.0f64; n_patch]; n_patch];
                        for (c, v) in v.iter().enumerate() {
                            let u = &u[o * d.ic + c];
                            for a in 0..n_patch {
                                for b in 0..n_patch {
                                    prod[a][b] += u[a][b] * v[a][b];
                                }
                            }
                        }
                        let y = sandwich(&at, &prod, &at);
                        for (i, row) in y.iter().enumerate() {
                            for (j, val) in row.iter().enumerate() {
                                let (py, px) = (ty * 4 + i, tx * 4 + j);
                                if py < oh && px < ow {
                                    m[((n * d.oc + o) * oh + py) * ow + px] = *val;
                                }
                            }
                        }
                    }
                }
            }
        }
        // Bias, residuals and clips as in the direct magnitude: take those from it with the
        // products removed (the conv of |x| with zero weights).
        let zero_w = Tensor {
            shape: data.w.shape.clone(),
            data: vec![0.0; data.w.data.len()],
        };
        let abs_res: Vec<Tensor> = data.residuals.iter().map(abs).collect();
        let posts: Vec<Post<'_>> = abs_res.iter().map(Post::Add).collect();
        let rest = primjit_reference::conv2d(
            &abs(&data.x),
            &zero_w,
            data.b.as_ref().map(abs).as_ref(),
            &self.attrs(),
            &posts,
        );
        let clip = d
            .post_ops
            .iter()
            .map(|p| match *p {
                PostOpDesc::Clip { lo, hi } => lo.abs().max(hi.abs()),
                _ => 0.0,
            })
            .fold(0.0f32, f32::max);
        Tensor {
            shape: rest.shape.clone(),
            data: m
                .iter()
                .zip(&rest.data)
                .map(|(m, r)| (m + f64::from(*r) + f64::from(clip)) as f32)
                .collect(),
        }
    }

    /// The longest chain of roundings of a Winograd output (see the module documentation):
    /// the input transform (2 per pass, 2 passes), the weights' transform (1), the GEMM
    /// (`ic`), the output transform (3 per pass; 4 at stride 2, whose two phases' sums are
    /// added), the bias and each residual add.
    fn winograd_depth(&self) -> usize {
        let output = if self.desc.strides == [2, 2] { 8 } else { 6 };
        4 + 1 + self.desc.ic + output + usize::from(self.desc.bias) + self.desc.residuals()
    }

    fn buffers(&self) -> Buffers {
        let d = &self.desc;
        let data = self.data();
        let packed = d.pack_weights(&data.w.data, data.b.as_ref().map(|b| &b.data[..]), None);
        Buffers {
            src: guarded(&to_layout(&data.x, d.src_layout)),
            weights: Some(guarded(&packed)),
            extra: data
                .residuals
                .iter()
                .map(|r| guarded(&to_layout(r, d.dst_layout)))
                .collect(),
            dst_layout: d.dst_layout,
            dst_shape: d.dst_shape(),
            extents: None,
            scratch_len: d.scratch_len(),
        }
    }

    /// This problem's kernel against the reference.
    fn check(&self) -> Result<(), TestCaseError> {
        self.check_primitive(&*compile(&self.key())?, None)
    }

    /// `p` (this problem's kernel, or a runtime-extent one called at `extents`) against the
    /// reference; its result is checked bit-identical across thread partitionings first.
    fn check_primitive(
        &self,
        p: &Primitive,
        extents: Option<[usize; 2]>,
    ) -> Result<(), TestCaseError> {
        let got = Buffers {
            extents,
            ..self.buffers()
        }
        .run_all(p)?;
        let want = self.reference();
        // Winograd rounds along other paths, with other magnitudes: its own bound.
        let (m, k) = match self.desc.algo {
            ConvAlgo::Direct => (self.magnitude(), self.reduction_len()),
            ConvAlgo::WinogradF4x3 => (self.winograd_magnitude(), self.winograd_depth()),
        };
        let k = k as f64;
        let tol = |i: usize| (k + 4.0) * EPS * m.data[i] as f64 + 1e-30;
        compare(
            &self.key(),
            self.desc.dst_shape(),
            &got,
            &want.data,
            Some(&tol),
        )
    }

    /// Output rows `[a, b)` alone write exactly their rows, as the full run does; where a work
    /// item spans several rows (`ConvPlan::joined_rows`), the items within `[a, b)`; where
    /// the items are parts of the output channels (`ConvPlan::tiles_per_item`), the same
    /// share of them.
    fn check_rows(&self, rows: Range<usize>) -> Result<(), TestCaseError> {
        let items = match self.desc.algo {
            ConvAlgo::Direct => {
                let plan = ConvPlan::new(&self.desc);
                let (k, n) = (plan.joined, plan.work_items());
                match plan.tiles_per_item {
                    Some(_) => rows.start * n / self.desc.oh()..rows.end * n / self.desc.oh(),
                    None => rows.start.div_ceil(k)..(rows.end / k).max(rows.start.div_ceil(k)),
                }
            }
            ConvAlgo::WinogradF4x3 => rows,
        };
        self.check_items(items)
    }

    /// Work items `items` alone write exactly their part of the output, as the full run does.
    fn check_items(&self, items: Range<usize>) -> Result<(), TestCaseError> {
        let p = compile(&self.key())?;
        let bufs = self.buffers();
        let full = bufs.execute(&p, None)?;
        bufs.check_rows(&p, &full, items)
    }
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `(ic, oc, groups)`: any channel pair with a divisor of both, depthwise, a grouping whose
/// groups straddle output-channel tiles (e.g. ic 16, oc 24, groups 8), or ResNeXt's groups of
/// 16 to 48 output channels, which span one or more tiles (and wide tiles).
fn channel_config() -> impl Strategy<Value = (usize, usize, usize)> {
    prop_oneof![
        4 => (channels(), channels(), any::<Index>()).prop_map(|(ic, oc, i)| {
            let g = divisors(gcd(ic, oc));
            (ic, oc, g[i.index(g.len())])
        }),
        1 => channels().prop_map(|c| (c, c, c)),
        1 => (prop::sample::select(&[2usize, 4, 8][..]), 1..=3usize, 1..=3usize)
            .prop_map(|(g, a, b)| (g * a, g * b, g)),
        1 => (
            prop::sample::select(&[2usize, 3][..]),
            prop::sample::select(
                &[(4usize, 16usize), (16, 16), (8, 32), (32, 32), (16, 48), (8, 8), (16, 24), (24, 8)][..]
            ),
        )
            .prop_map(|(g, (icg, ocg))| (g * icg, g * ocg, g)),
    ]
}

fn post_op() -> impl Strategy<Value = PostOpDesc> {
    prop_oneof![
        Just(PostOpDesc::Relu),
        Just(PostOpDesc::Add),
        // Quarter steps; hi - lo from 0 (a constant) to 3.75.
        (-12i32..12, 0i32..16).prop_map(|(lo, w)| PostOpDesc::Clip {
            lo: lo as f32 / 4.0,
            hi: (lo + w) as f32 / 4.0,
        }),
    ]
}

fn conv_problem() -> impl Strategy<Value = ConvProblem> {
    let shape = (
        1..=2usize,
        channel_config(),
        (extent(), conv_width()),
        (1..=5usize, 1..=5usize),
        (1..=3usize, 1..=3usize),
        (dilation(), dilation()),
        pads(3),
    );
    let rest = (
        any::<bool>(),
        prop::collection::vec(post_op(), 0..=3),
        (layout(), layout()),
        any::<u64>(),
        tier(),
    );
    (shape, rest)
        .prop_map(
            |(
                (mb, (ic, oc, groups), (ih, iw), (kh, kw), (sh, sw), (dh, dw), pads),
                (bias, post_ops, (src_layout, dst_layout), seed, isa),
            )| ConvProblem {
                desc: ConvDesc {
                    mb,
                    ic,
                    ih,
                    iw,
                    oc,
                    kh,
                    kw,
                    strides: [sh, sw],
                    dilations: [dh, dw],
                    pads,
                    groups,
                    bias,
                    post_ops,
                    pool: None,
                    src_layout,
                    dst_layout,
                    runtime: RuntimeDims::NONE,
                    algo: ConvAlgo::Direct,
                    pitches: Pitches::DENSE,
                    isa: Isa::X128,
                }
                .at_tier(isa),
                seed,
            },
        )
        .prop_filter("valid conv key", |p| p.key().validate().is_ok())
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn conv_matches_reference(p in conv_problem()) {
        p.check()?;
    }
}

/// Depthwise problems (`ConvPlan::lanewise`): every channel count of [`CHANNELS`] and
/// more, an `nChw4c` source, mostly unit stride along rows and an `nChw4c` destination (what
/// the wide lane-wise tile takes), rows up to 80 pixels (several wide tiles and every
/// remainder; at avx2 from 50 pixels on, a row's calls of the same vectors in a loop,
/// `ConvPlan::lanewise_row`), at every tier the host runs.
fn depthwise_problem() -> impl Strategy<Value = ConvProblem> {
    (
        conv_problem(),
        prop::sample::select(&[1usize, 3, 4, 5, 8, 12, 16, 17, 24, 36][..]),
        prop_oneof![3 => Just(1usize), 1 => 2..=3usize],
        prop_oneof![3 => Just(Layout::Nchw4c), 1 => Just(Layout::Nchw)],
        prop_oneof![3 => extent(), 1 => 16..=40usize, 1 => 41..=80usize],
        tier(),
    )
        .prop_map(|(mut p, c, sw, dst, iw, isa)| {
            let d = &mut p.desc;
            (d.ic, d.oc, d.groups) = (c, c, c);
            d.src_layout = Layout::Nchw4c;
            d.dst_layout = dst;
            d.strides[1] = sw;
            d.iw = iw;
            p.desc = p.desc.at_tier(isa);
            p
        })
        .prop_filter("valid conv key", |p| p.key().validate().is_ok())
}

/// `p`'s output from its own kernel, and from its kernel at x128.
fn outputs_at_tier_and_x128(p: &ConvProblem) -> (Vec<f32>, Vec<f32>) {
    let narrow = ConvProblem {
        desc: ConvDesc {
            isa: Isa::X128,
            ..p.desc.clone()
        },
        seed: p.seed,
    };
    let run = |p: &ConvProblem| {
        let prim = compile(&p.key()).unwrap_or_else(|e| panic!("{e}"));
        p.buffers()
            .execute(&prim, None)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    (run(p), run(&narrow))
}

proptest! {
    #![proptest_config(config(128))]

    /// Depthwise convolutions match the reference, and at a wide tier their x128 kernel bit
    /// for bit: the wide lane-wise tile sums each pixel's taps in the 128-bit tile's order.
    #[test]
    fn depthwise_matches_reference_and_its_x128_kernel(p in depthwise_problem()) {
        p.check()?;
        let (got, narrow) = outputs_at_tier_and_x128(&p);
        let same = got.iter().zip(&narrow).all(|(x, y)| x.to_bits() == y.to_bits());
        prop_assert!(same, "{} differs from its x128 kernel", p.key());
    }

    /// A runtime-extent depthwise kernel at the problem's extents and at two more.
    #[test]
    fn depthwise_runtime_extents_match_exact(
        p in depthwise_problem(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=40usize, 1..=40usize), 2),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        check_runtime_extents(&p, rt, &more, rows)?;
    }
}

/// An activation post-op: every one the x64 backend's tiles compute in their registers, and
/// `elu`, which they leave to the Cranelift code after them.
fn activation_post_op() -> impl Strategy<Value = PostOpDesc> {
    prop_oneof![
        Just(Activation::HardSwish),
        Just(Activation::Sigmoid),
        Just(Activation::Silu),
        Just(Activation::Tanh),
        Just(Activation::Exp),
        (0.0f32..1.0, -1.0f32..1.0)
            .prop_map(|(alpha, beta)| Activation::HardSigmoid { alpha, beta }),
        (0.0f32..1.0).prop_map(|alpha| Activation::LeakyRelu { alpha }),
        (0.0f32..2.0).prop_map(|alpha| Activation::Elu { alpha }),
    ]
    .prop_map(PostOpDesc::Act)
}

proptest! {
    #![proptest_config(config(64))]

    /// At a wide tier, a conv (dense, grouped or depthwise) with activation post-ops gives
    /// the x128 kernel's bits: its tile computes them in its registers with the 128-bit
    /// code's operations in their order, or (`elu`) leaves them and the post-ops after them
    /// to Cranelift code over its stored outputs. The x128 kernel is checked against the
    /// reference in `eltwise.rs`.
    #[test]
    fn activation_post_ops_at_a_wide_tier_match_x128(
        p in prop_oneof![conv_problem(), depthwise_problem()],
        acts in prop::collection::vec((activation_post_op(), any::<Index>()), 1..=2),
        isa in tier(),
    ) {
        let mut p = p;
        let posts = &mut p.desc.post_ops;
        for (act, at) in acts {
            posts.insert(at.index(posts.len() + 1), act);
        }
        p.desc = p.desc.at_tier(isa);
        prop_assume!(p.key().validate().is_ok());
        let (got, narrow) = outputs_at_tier_and_x128(&p);
        let same = got.iter().zip(&narrow).all(|(x, y)| x.to_bits() == y.to_bits());
        prop_assert!(same, "{} differs from its x128 kernel", p.key());
    }
}

/// 1x1 convolutions over narrow, contiguous rows run on joined rows
/// (`ConvPlan::joined_rows`), or on their whole image as one row whose work items are parts
/// of the output-channel tiles (`ConvPlan::tiles_per_item`; 144 channels make narrow
/// remainder tiles span tiles at avx2, 520 input channels chunk the reduction): against the
/// reference on 1, 2 and 3 threads, every range of work items alone, and a runtime-extent
/// kernel, whose rows stay rows, bit for bit; with a residual, at every layout pair and every
/// tier the host runs.
#[test]
fn joined_rows_of_1x1_convs_match_reference_rows_and_runtime_kernels() {
    for ([ih, iw], ic, oc, k) in [
        ([14, 14], 12, 20, 2),
        ([8, 6], 12, 20, 4),
        ([10, 10], 12, 20, 5),
        ([12, 4], 12, 20, 6),
        ([7, 7], 12, 20, 1),
        ([7, 7], 12, 144, 1),
        ([7, 7], 520, 144, 1),
        ([3, 5], 12, 20, 1),
    ] {
        for (src, dst) in [
            (Layout::Nchw4c, Layout::Nchw4c),
            (Layout::Nchw, Layout::Nchw4c),
            (Layout::Nchw4c, Layout::Nchw),
        ] {
            for isa in common::host_tiers() {
                let mut d = ConvDesc::new(2, ic, [ih, iw], oc, [1, 1]);
                d.bias = true;
                d.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
                (d.src_layout, d.dst_layout) = (src, dst);
                let d = d.at_tier(isa);
                let plan = ConvPlan::new(&d);
                let items = PrimitiveKey::Conv(d.clone()).work_items();
                let p = ConvProblem {
                    desc: d.clone(),
                    seed: 3,
                };
                p.check().unwrap_or_else(|e| panic!("{}: {e}", p.key()));
                // Rows no divisor joins: the whole image where its tiles make two parts
                // (144 channels make 6 to 12 tiles at every tier), each part starting at a
                // multiple of the remainder tile's narrow group.
                assert!(oc != 144 || plan.tiles_per_item.is_some(), "{d:?}");
                // 520 channels of three `ymm` of weights (96 bytes each) chunk the
                // reduction at avx2 where the destination is `nChw4c`.
                if ic > 128 && dst == Layout::Nchw4c && isa == Isa::Avx2 {
                    assert!(plan.chunks() > 1, "{d:?}");
                }
                match plan.tiles_per_item {
                    Some(per_item) => {
                        assert_eq!((k, plan.joined), (1, ih), "{d:?}");
                        assert!(items >= 2, "{d:?}: {items} work items");
                        let remainder = ih * iw % plan.pixel_tile;
                        if remainder > 0 {
                            let g = plan.narrow_group(remainder);
                            assert!(per_item.is_multiple_of(g), "{d:?}: {per_item} of {g}");
                        }
                    }
                    None => assert_eq!((plan.joined, items * k), (k, ih), "{d:?}"),
                }
                for a in 0..=items {
                    for b in a..=items {
                        p.check_items(a..b).unwrap();
                    }
                }
                let rt = RuntimeDims { h: true, w: true };
                let generic = compile(&PrimitiveKey::Conv(d.with_runtime(rt))).unwrap();
                check_conv_runtime(&generic, &p, 1..ih - 1).unwrap();
            }
        }
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// 1x1 convolutions whose rows no divisor joins (2, 3, 5 or 7 rows of up to 11 pixels)
    /// run on their whole image as one row, the work items parts of the output-channel tiles
    /// (`ConvPlan::tiles_per_item`): against the reference on 1, 2 and 3 threads, with every
    /// post-op, both layouts, reductions long enough to chunk, and a random range of items
    /// alone writing exactly its output channels.
    #[test]
    fn whole_image_1x1_convs_match_reference_and_their_parts(
        (mb, ih, iw) in (1..=2usize, prop::sample::select(&[2usize, 3, 5, 7][..]), 1..=11usize),
        ic in prop_oneof![channels(), 100..=300usize],
        oc in prop_oneof![3 => 24..=200usize, 1 => channels()],
        bias in any::<bool>(),
        post_ops in prop::collection::vec(post_op(), 0..=2),
        (src_layout, dst_layout) in (layout(), layout()),
        isa in tier(),
        seed in any::<u64>(),
        (a, b) in (any::<Index>(), any::<Index>()),
    ) {
        let mut d = ConvDesc::new(mb, ic, [ih, iw], oc, [1, 1]);
        d.bias = bias;
        d.post_ops = post_ops;
        (d.src_layout, d.dst_layout) = (src_layout, dst_layout);
        let d = d.at_tier(isa);
        let plan = ConvPlan::new(&d);
        prop_assume!(plan.tiles_per_item.is_some());
        let n = PrimitiveKey::Conv(d.clone()).work_items();
        prop_assert_eq!(n, plan.work_items());
        let p = ConvProblem { desc: d, seed };
        p.check()?;
        let (a, b) = (a.index(n + 1), b.index(n + 1));
        p.check_items(a.min(b)..a.max(b))?;
    }
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn conv_partial_rows_write_only_their_rows(
        p in conv_problem(),
        a in any::<Index>(),
        b in any::<Index>(),
    ) {
        let oh = p.desc.oh();
        let (a, b) = (a.index(oh + 1), b.index(oh + 1));
        p.check_rows(a.min(b)..a.max(b))?;
    }
}

// ---------------------------------------------------------------------------------------------
// Winograd F(4x4, 3x3).
// ---------------------------------------------------------------------------------------------

/// Winograd problems: 3x3 kernels with strides 1 and (polyphase) 2, `nChw4c`, channels that
/// are not whole blocks, extents from 1 (one pixel, with padding 1) to 4 tile rows with every
/// remainder, widths sometimes past a block of 10 tiles, pads 0 to 2 on each side, every
/// post-op.
fn winograd_problem() -> impl Strategy<Value = ConvProblem> {
    (
        (
            1..=2usize,
            prop_oneof![2 => Just(1usize), 1 => Just(2usize)],
        ),
        prop_oneof![
            4 => (channels(), channels()),
            // Transformed weights past `STREAMED_WEIGHT_BYTES`: at stride 1 blocks of 50 tiles
            // (two images of the widest problems make two blocks), and two output-channel
            // chunks where the channel vectors split evenly (not 100).
            1 => prop::sample::select(&[(96usize, 96usize), (100, 88), (88, 100)][..]),
        ],
        (
            prop_oneof![1 => Just(1usize), 3 => 1..=17usize],
            conv_width(),
        ),
        prop_oneof![
            1 => Just(Pads::default()),
            2 => Just(Pads::uniform(1)),
            2 => (0..=2usize, 0..=2usize, 0..=2usize, 0..=2usize).prop_map(
                |(top, left, bottom, right)| Pads { top, left, bottom, right }
            ),
        ],
        (
            any::<bool>(),
            prop::collection::vec(post_op(), 0..=3),
            any::<u64>(),
            tier(),
        ),
    )
        .prop_map(
            |((mb, stride), (ic, oc), (ih, iw), pads, (bias, post_ops, seed, isa))| {
                let mut desc = ConvDesc::new(mb, ic, [ih, iw], oc, [3, 3]);
                desc.strides = [stride, stride];
                desc.pads = pads;
                desc.bias = bias;
                desc.post_ops = post_ops;
                desc.src_layout = Layout::Nchw4c;
                desc.dst_layout = Layout::Nchw4c;
                desc.algo = ConvAlgo::WinogradF4x3;
                ConvProblem {
                    desc: desc.at_tier(isa),
                    seed,
                }
            },
        )
        .prop_filter("valid winograd key", |p| p.key().validate().is_ok())
}

impl ConvProblem {
    /// Work items `[a, b)` of a Winograd kernel alone write exactly the pixels and channels
    /// they own (`WinogradPlan::work_item_of`: a block of tiles numbered by image, tile row and
    /// tile column, and a chunk of output channels), bit-identical to the full run.
    fn check_blocks(
        &self,
        p: &Primitive,
        bufs: &Buffers,
        items: Range<usize>,
    ) -> Result<(), TestCaseError> {
        let full = bufs.execute(p, None)?;
        let part = bufs.execute_rows(p, items.clone())?;
        let [_, c, h, w] = self.desc.dst_shape();
        let plan = WinogradPlan::new(&self.desc);
        for (i, (&got, &f)) in part.iter().zip(&full).enumerate() {
            let pixel = i / 4;
            let (x, y) = (pixel % w, pixel / w % h);
            let block = pixel / (w * h) % c.div_ceil(4);
            let n = pixel / (w * h * c.div_ceil(4));
            let tile = (n * h.div_ceil(4) + y / 4) * w.div_ceil(4) + x / 4;
            let item = plan.work_item_of(tile, block * 4 + i % 4);
            let expected = if items.contains(&item) {
                f.to_bits()
            } else {
                SENTINEL
            };
            prop_assert!(
                got.to_bits() == expected,
                "{}, items {items:?}: element {i} (tile {tile}, item {item}) is {got:?}, \
                 expected {:?}",
                self.key(),
                f32::from_bits(expected)
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// Against the reference within the Winograd bound, bit-identical on 1, 2 and 3 threads,
    /// and a partial range of blocks writes exactly its tiles.
    #[test]
    fn winograd_matches_reference(
        p in winograd_problem(),
        blocks in (any::<Index>(), any::<Index>()),
    ) {
        p.check()?;
        let prim = compile(&p.key())?;
        let n = p.key().work_items();
        let (a, b) = (blocks.0.index(n + 1), blocks.1.index(n + 1));
        p.check_blocks(&prim, &p.buffers(), a.min(b)..a.max(b))?;
    }

    /// One runtime-extent Winograd kernel at the problem's extents and at two more, on
    /// guard-page buffers: bit-identical to the exact kernel there (the two compute every tile
    /// alike; only the tile arithmetic reads the call's extents), or a typed error where the
    /// extents give no output.
    #[test]
    fn winograd_runtime_extents_match_exact(
        p in winograd_problem(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=30usize, 1..=30usize), 2),
        blocks in (any::<Index>(), any::<Index>()),
    ) {
        for_runtime_extents(&p, rt, &more, |generic, q| {
            let extents = [q.desc.ih, q.desc.iw];
            let bufs = Buffers {
                extents: Some(extents),
                ..q.buffers()
            };
            let exact = compile(&q.key())?;
            let want = bufs.run_all(&exact)?;
            let got = bufs.run_all(generic)?;
            assert_bit_identical(&want, &got, &format!("{} at {}", generic.key(), exact.key()))?;
            let n = q.key().work_items();
            let (a, b) = (blocks.0.index(n + 1), blocks.1.index(n + 1));
            q.check_blocks(generic, &bufs, a.min(b)..a.max(b))?;
            q.check()
        })?;
    }
}

/// A 3x3 convolution with padding 1 on every side, a bias and `post_ops`, `nChw4c` in and out,
/// by `algo`: the shape of the trunk's 3x3 stride-1 layers.
fn same_padded_3x3(
    ic: usize,
    hw: [usize; 2],
    oc: usize,
    post_ops: Vec<PostOpDesc>,
    algo: ConvAlgo,
) -> ConvDesc {
    let mut desc = ConvDesc::new(1, ic, hw, oc, [3, 3]);
    desc.pads = Pads::uniform(1);
    desc.bias = true;
    desc.post_ops = post_ops;
    desc.src_layout = Layout::Nchw4c;
    desc.dst_layout = Layout::Nchw4c;
    desc.algo = algo;
    desc
}

/// Calls whose last group of 5 tiles is partial (the GEMM computes its missing tiles in vain)
/// or whole, in one block or several: rows of 13 to 19 tiles, two rows of 13 and five of 5,
/// with channels past `STREAMED_WEIGHT_BYTES` (blocks of 50 tiles) and 25 output-channel
/// vectors in one chunk, whose odd last vector runs alone.
#[test]
fn winograd_partial_groups_and_an_odd_last_vector() {
    for (oh, tiles_per_row) in [
        (4, 13),
        (4, 14),
        (4, 16),
        (4, 18),
        (4, 19),
        (8, 13),
        (20, 5),
    ] {
        let hw = [oh, 4 * tiles_per_row - 1];
        let desc = same_padded_3x3(96, hw, 100, vec![PostOpDesc::Relu], ConvAlgo::WinogradF4x3);
        ConvProblem { desc, seed: 3 }
            .check()
            .unwrap_or_else(|e| panic!("{oh} rows, {tiles_per_row} tiles a row: {e}"));
    }
}

/// The trunk's 3x3 layers at small widths, each post-op combination they use.
#[test]
fn winograd_resnet_blocks() {
    for (c, hw, posts) in [
        (64, [20, 23], vec![PostOpDesc::Relu]),
        (64, [9, 13], vec![PostOpDesc::Add, PostOpDesc::Relu]),
        (128, [10, 7], vec![PostOpDesc::Relu]),
        (256, [5, 6], vec![PostOpDesc::Add, PostOpDesc::Relu]),
    ] {
        let desc = same_padded_3x3(c, hw, c, posts, ConvAlgo::WinogradF4x3);
        ConvProblem { desc, seed: 7 }
            .check()
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // The stride-2 convs that open layer2 and layer3, at odd and even extents.
    for (ic, hw) in [(64, [20, 23]), (64, [17, 26]), (128, [10, 13])] {
        let mut desc = same_padded_3x3(
            ic,
            hw,
            2 * ic,
            vec![PostOpDesc::Relu],
            ConvAlgo::WinogradF4x3,
        );
        desc.strides = [2, 2];
        ConvProblem { desc, seed: 7 }
            .check()
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The Winograd GEMM and transforms at each tier the host runs: the trunk's layers at stride 1
/// and 2, weights kept in cache and streamed in two chunks of output channels, 24 output
/// channels (at avx2 a chunk that ends in one `ymm`; at avx512 x128 code), a call with a
/// partial last group of tiles, activations and a clip after the output transform, a masked
/// last block, a residual at stride 2, and a residual then a lone clip. Each matches the reference, and is bit-identical to
/// its x128 kernel: the wide tiles sum the same products in the same order, and the wide
/// transforms apply the same operations.
#[test]
fn winograd_matches_x128_bit_for_bit_at_every_tier() {
    let relu = || vec![PostOpDesc::Relu];
    let add_relu = || vec![PostOpDesc::Add, PostOpDesc::Relu];
    let w = ConvAlgo::WinogradF4x3;
    let mut s2 = same_padded_3x3(64, [17, 26], 128, relu(), w);
    s2.strides = [2, 2];
    let mut odd = same_padded_3x3(8, [5, 9], 24, relu(), w);
    odd.bias = false;
    // Activations and a clip in the wide output transform, a last block of two channels
    // (masked, so its tiles keep the x128 transform) and a residual at stride 2.
    let silu_clip = vec![
        PostOpDesc::Act(Activation::Silu),
        PostOpDesc::Clip { lo: -1.0, hi: 2.5 },
    ];
    let masked = same_padded_3x3(16, [8, 18], 22, silu_clip, w);
    let add_hard_swish = vec![PostOpDesc::Add, PostOpDesc::Act(Activation::HardSwish)];
    let mut s2_residual = same_padded_3x3(32, [19, 34], 32, add_hard_swish, w);
    s2_residual.strides = [2, 2];
    // A residual then a lone clip: the clip's bounds loaded once for all the tile's values.
    let add_clip = vec![PostOpDesc::Add, PostOpDesc::Clip { lo: -0.5, hi: 1.0 }];
    let clipped = same_padded_3x3(32, [7, 22], 32, add_clip, w);
    let cases = [
        same_padded_3x3(64, [9, 13], 64, add_relu(), w),
        same_padded_3x3(128, [10, 7], 128, relu(), w),
        same_padded_3x3(256, [5, 6], 256, add_relu(), w),
        same_padded_3x3(96, [4, 51], 96, relu(), w),
        s2,
        odd,
        masked,
        s2_residual,
        clipped,
    ];
    for isa in [Isa::Avx2, Isa::Avx512] {
        if !runs_tier("winograd_matches_x128_bit_for_bit_at_every_tier", isa) {
            continue;
        }
        for (i, desc) in cases.iter().enumerate() {
            let wide = desc.clone().at_tier(isa);
            // Output channels that do not fill the last zmm pair keep x128 code at avx512.
            let expected = if matches!(desc.oc, 22 | 24) && isa == Isa::Avx512 {
                Isa::X128
            } else {
                isa
            };
            assert_eq!(wide.isa, expected, "{}", PrimitiveKey::Conv(wide.clone()));
            let narrow = ConvProblem {
                desc: desc.clone(),
                seed: i as u64,
            };
            let wide = ConvProblem {
                desc: wide,
                seed: i as u64,
            };
            wide.check().unwrap_or_else(|e| panic!("{e}"));
            let run = |p: &ConvProblem| {
                let prim = compile(&p.key()).unwrap_or_else(|e| panic!("{e}"));
                p.buffers()
                    .execute(&prim, None)
                    .unwrap_or_else(|e| panic!("{e}"))
            };
            let (a, b) = (run(&narrow), run(&wide));
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{} differs from its x128 kernel", wide.key());
        }
    }
}

/// At stride 2 with no padding and an even extent, the floor of the output extent leaves the
/// input's last row and column out of every output's receptive field, yet the partial last
/// tile's 9x9 patch reads them: as an odd position, which only an output past the image
/// reads. A NaN there changes no stored output: the results are bit-identical to the same
/// input without it, and match the reference.
#[test]
fn winograd_stride_2_ignores_the_row_and_column_no_output_reads() {
    let mut desc = ConvDesc::new(1, 8, [12, 12], 8, [3, 3]);
    desc.strides = [2, 2];
    desc.bias = true;
    desc.src_layout = Layout::Nchw4c;
    desc.dst_layout = Layout::Nchw4c;
    desc.algo = ConvAlgo::WinogradF4x3;
    let p = ConvProblem { desc, seed: 5 };
    assert_eq!(
        p.desc.dst_shape(),
        [1, 8, 5, 5],
        "a partial last tile each way"
    );
    p.check().unwrap_or_else(|e| panic!("{e}"));
    let prim = compile(&p.key()).unwrap_or_else(|e| panic!("{e}"));
    let clean = p.buffers().run_all(&prim).unwrap_or_else(|e| panic!("{e}"));
    let mut x = p.data().x;
    for c in 0..8 {
        for i in 0..12 {
            x.data[(c * 12 + i) * 12 + 11] = f32::NAN;
            x.data[(c * 12 + 11) * 12 + i] = f32::NAN;
        }
    }
    let poisoned = Buffers {
        src: guarded(&to_layout(&x, Layout::Nchw4c)),
        ..p.buffers()
    }
    .run_all(&prim)
    .unwrap_or_else(|e| panic!("{e}"));
    assert_bit_identical(&clean, &poisoned, "a NaN in the unread row and column")
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The error of each of the trunk's 3x3 layer shapes (at W=203; stride 1 and the two stride-2
/// ones) relative to the largest magnitude of its output, for both algorithms against the f64
/// reference: the figures docs/decisions/005-winograd-f4x4-3x3.md states (run with
/// `--nocapture` to see them). Winograd's is a few times direct's, both far below the 1e-4 the
/// trunk is held to.
#[test]
fn winograd_and_direct_error_on_the_trunk_layers() {
    for (c, hw, stride) in [
        (64, [80, 51], 1),
        (128, [40, 26], 1),
        (256, [20, 13], 1),
        (64, [80, 51], 2),
        (128, [40, 26], 2),
    ] {
        let mut errors = Vec::new();
        for algo in [ConvAlgo::Direct, ConvAlgo::WinogradF4x3] {
            // The stride-2 layers double the channels and have no residual.
            let (oc, posts) = if stride == 2 {
                (2 * c, vec![PostOpDesc::Relu])
            } else {
                (c, vec![PostOpDesc::Add, PostOpDesc::Relu])
            };
            let mut desc = same_padded_3x3(c, hw, oc, posts, algo);
            desc.strides = [stride, stride];
            let p = ConvProblem { desc, seed: 11 };
            let prim = compile(&p.key()).unwrap_or_else(|e| panic!("{e}"));
            let got = p.buffers().run_all(&prim).unwrap_or_else(|e| panic!("{e}"));
            let want = p.reference();
            let max_ref = want
                .data
                .iter()
                .fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
            let max_err = got.iter().zip(&want.data).fold(0.0f64, |m, (&a, &b)| {
                m.max((f64::from(a) - f64::from(b)).abs())
            });
            errors.push(max_err / max_ref);
        }
        println!(
            "{c} channels, {hw:?}, stride {stride}: max error / max |output|: direct {:.2e}, \
             winograd {:.2e}",
            errors[0], errors[1]
        );
        assert!(
            errors[0] < 5e-6 && errors[1] < 5e-5,
            "{c} channels: {errors:?}"
        );
    }
}

/// Keys Winograd cannot compute are typed errors that say why.
#[test]
fn winograd_rejects_what_it_cannot_compute() {
    let base = {
        let mut d = ConvDesc::new(1, 8, [8, 8], 8, [3, 3]);
        d.src_layout = Layout::Nchw4c;
        d.dst_layout = Layout::Nchw4c;
        d.algo = ConvAlgo::WinogradF4x3;
        d
    };
    let cases: Vec<(ConvDesc, &str)> = vec![
        (
            ConvDesc {
                kh: 5,
                kw: 5,
                ..base.clone()
            },
            "3x3 kernel",
        ),
        (
            ConvDesc {
                strides: [1, 2],
                ..base.clone()
            },
            "strides of 1 and 1 or of 2 and 2",
        ),
        (
            ConvDesc {
                strides: [3, 3],
                ..base.clone()
            },
            "strides of 1 and 1 or of 2 and 2",
        ),
        (
            ConvDesc {
                dilations: [2, 1],
                ..base.clone()
            },
            "unit dilations",
        ),
        (
            ConvDesc {
                groups: 2,
                ..base.clone()
            },
            "groups",
        ),
        (
            ConvDesc {
                src_layout: Layout::Nchw,
                ..base.clone()
            },
            "nChw4c",
        ),
    ];
    for (desc, why) in cases {
        let err = PrimitiveKey::Conv(desc).validate().expect_err("rejected");
        assert!(err.reason.contains(why), "{}: {}", err.key, err.reason);
    }
}

// ---------------------------------------------------------------------------------------------
// Runtime extents: one kernel for every extent, equal to the exact kernels.
// ---------------------------------------------------------------------------------------------

/// Runs the runtime-extent kernel `generic` on a problem whose key is valid at its extents,
/// and requires the result to be bit-identical to the exact kernel's (which the other
/// properties check against the reference) on 1, 2 and 3 threads, and a partial range of rows
/// to write exactly its rows. The kernels share their tiles and reduction order, so a single
/// differing bit means a misplaced run, remainder or border.
fn check_runtime_against_exact(
    generic: &Primitive,
    exact: &PrimitiveKey,
    buffers: Buffers,
    rows: Range<usize>,
) -> Result<(), TestCaseError> {
    let exact = compile(exact)?;
    let want = buffers.run_all(&exact)?;
    let got = buffers.run_all(generic)?;
    assert_bit_identical(
        &want,
        &got,
        &format!("{} at {}", generic.key(), exact.key()),
    )?;
    let full = buffers.execute(generic, None)?;
    buffers.check_rows(generic, &full, rows)
}

/// A runtime-width conv kernel at `q`'s extents. From its column template's smallest width on,
/// it tiles like the exact kernel and must equal it bit for bit; below that width, where it
/// takes one pixel at a time (and a narrow tile splits its reduction differently, see
/// `reduction_sets` in `lower_conv`), it must match the reference within its tolerance.
fn check_conv_runtime(
    generic: &Primitive,
    q: &ConvProblem,
    rows: Range<usize>,
) -> Result<(), TestCaseError> {
    let extents = [q.desc.ih, q.desc.iw];
    let bufs = Buffers {
        extents: Some(extents),
        ..q.buffers()
    };
    let tiles_like_exact = match generic.key() {
        PrimitiveKey::Conv(d) => match ConvPlan::new(d).cols {
            AxisPlan::Template(t) => q.desc.iw >= t.min_input,
            _ => true,
        },
        key => panic!("{key} is not a convolution"),
    };
    if tiles_like_exact {
        return check_runtime_against_exact(generic, &q.key(), bufs, rows);
    }
    q.check_primitive(generic, Some(extents))?;
    let full = bufs.execute(generic, None)?;
    bufs.check_rows(generic, &full, rows)
}

/// Runs `generic` at extents its key rejects: the call must fail with a typed error.
fn check_rejected(
    generic: &Primitive,
    src_len: usize,
    extents: [usize; 2],
) -> Result<(), TestCaseError> {
    let src = vec![0.0; src_len];
    let mut dst = vec![0.0; 4];
    let weights = [0.0; 4];
    let args = ExecArgs {
        src: &src,
        weights: matches!(generic.key(), PrimitiveKey::Conv(_)).then_some(&weights[..]),
        dst: &mut dst,
        extra: &[],
        scratch: None,
    };
    match generic.execute_at(args, extents) {
        Err(ExecError::Extents { .. }) => Ok(()),
        other => Err(TestCaseError::fail(format!(
            "{} at {extents:?}: expected an extents error, got {other:?}",
            generic.key()
        ))),
    }
}

/// One kernel of `p` with the extents `rt` names left to run time, at `p`'s extents and at
/// `more`: rejected with a typed error where the call's key is invalid, else checked by
/// `check(generic, problem at those extents)`.
fn for_runtime_extents(
    p: &ConvProblem,
    rt: RuntimeDims,
    more: &[(usize, usize)],
    mut check: impl FnMut(&Primitive, &ConvProblem) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let generic = compile(&PrimitiveKey::Conv(p.desc.clone().with_runtime(rt)))?;
    for &(h, w) in std::iter::once(&(p.desc.ih, p.desc.iw)).chain(more) {
        let mut q = p.clone();
        if rt.h {
            q.desc.ih = h;
        }
        if rt.w {
            q.desc.iw = w;
        }
        let extents = [q.desc.ih, q.desc.iw];
        if q.key().validate().is_err() {
            check_rejected(&generic, q.desc.src_shape().iter().product(), extents)?;
            continue;
        }
        check(&generic, &q)?;
    }
    Ok(())
}

/// [`for_runtime_extents`] with `check_conv_runtime` (on a partial range of work items picked
/// by `rows`).
fn check_runtime_extents(
    p: &ConvProblem,
    rt: RuntimeDims,
    more: &[(usize, usize)],
    rows: (Index, Index),
) -> Result<(), TestCaseError> {
    for_runtime_extents(p, rt, more, |generic, q| {
        let n = q.key().work_items();
        let (a, b) = (rows.0.index(n + 1), rows.1.index(n + 1));
        check_conv_runtime(generic, q, a.min(b)..a.max(b))
    })
}

proptest! {
    #![proptest_config(config(64))]

    /// One runtime-extent conv kernel at the problem's extents and at two more (1 to 40 in
    /// each runtime dimension: narrower than the kernel, every border overlap, every
    /// remainder of the tile).
    #[test]
    fn conv_runtime_extents_match_exact(
        p in conv_problem(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=40usize, 1..=40usize), 2),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        check_runtime_extents(&p, rt, &more, rows)?;
    }
}

/// Convolutions whose output-channel blocks fill no whole wide vectors, and more than one
/// full tile of them ([`ConvPlan::last_tile_vecs`]): full tiles and a short last one, whose
/// last vector is a tail (the low half of a `ymm`, an opmask at `avx512`). ShuffleNetV2's 58
/// and 116 channels are such. Now and then chunked or with a fused pool.
fn short_tile_problem() -> impl Strategy<Value = ConvProblem> {
    (
        prop_oneof![3 => conv_problem(), 1 => chunked_conv_problem(), 1 => fused_conv_problem()],
        prop::sample::select(&[17usize, 20, 36, 44, 58, 68, 100, 116][..]),
        tier(),
    )
        .prop_map(|(mut p, oc, isa)| {
            let d = &mut p.desc;
            (d.oc, d.groups) = (oc, 1);
            // A fused pool's conv stage writes an nChw4c band whatever the destination; a
            // plain conv's NCHW destination takes the 128-bit tiling.
            if d.pool.is_none() {
                d.dst_layout = Layout::Nchw4c;
            }
            p.desc = p.desc.clone().at_tier(isa);
            p
        })
        .prop_filter("valid conv key", |p| p.key().validate().is_ok())
}

proptest! {
    #![proptest_config(config(48))]

    /// Against the reference, on a partial range of rows, and as a runtime-extent kernel at
    /// the problem's extents and two more.
    #[test]
    fn conv_short_last_tiles_match_reference(
        p in short_tile_problem(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=40usize, 1..=40usize), 2),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        let plan = ConvPlan::new(&p.desc);
        let ratio = p.desc.isa.target().lanes / 4;
        let blocks = p.desc.oc.div_ceil(4);
        if ratio > 1 && !blocks.is_multiple_of(ratio) && blocks > 2 * ratio {
            prop_assert!(plan.last_tile_vecs() < plan.vecs, "{}: {plan}", p.key());
        }
        p.check()?;
        let n = p.key().work_items();
        let (a, b) = (rows.0.index(n + 1), rows.1.index(n + 1));
        p.check_rows(a.min(b)..a.max(b))?;
        check_runtime_extents(&p, rt, &more, rows)?;
    }
}

/// Convolutions whose weights exceed a chunk ([`ConvPlan::chunks`] > 1): the first chunk
/// starts from the bias, the middle ones carry partial sums through the destination, the last
/// applies the post-ops. Checked against the reference, on partial row ranges, and with a
/// runtime width as `check_conv_runtime` does.
fn chunked_conv_problem() -> impl Strategy<Value = ConvProblem> {
    (
        conv_problem(),
        prop::sample::select(&[1usize, 2][..]),
        1..=12usize,
        prop::sample::select(&[1usize, 2, 3][..]),
    )
        .prop_map(|(mut p, oc_blocks, extra_blocks, k)| {
            let d = &mut p.desc;
            (d.ic, d.oc, d.groups) = (4, 4 * oc_blocks, 1);
            (d.kh, d.kw) = (k, k);
            d.dst_layout = Layout::Nchw4c;
            d.mb = 1;
            // The plan's tile width (one vector for these kernels larger than 1x1, two for a
            // 1x1 with two blocks) sets a channel's weight bytes; the input channels then go
            // just past one chunk's weights, up to 12 blocks of four more.
            let vecs = ConvPlan::new(d).vecs;
            let channel_bytes = k * k * vecs * 4 * std::mem::size_of::<f32>();
            d.ic = (CHUNK_WEIGHT_BYTES / channel_bytes / 4 + extra_blocks) * 4;
            p
        })
        .prop_filter("valid conv key", |p| p.key().validate().is_ok())
}

proptest! {
    #![proptest_config(config(24))]

    #[test]
    fn conv_chunked_reduction_matches_reference(
        p in chunked_conv_problem(),
        rows in (any::<Index>(), any::<Index>()),
        w in 1..=30usize,
    ) {
        let chunks = ConvPlan::new(&p.desc).chunks();
        prop_assert!(chunks > 1, "{} has {chunks} chunk", p.key());
        p.check()?;
        let oh = p.desc.oh();
        let (a, b) = (rows.0.index(oh + 1), rows.1.index(oh + 1));
        p.check_rows(a.min(b)..a.max(b))?;
        let rt = RuntimeDims { h: false, w: true };
        let generic = compile(&PrimitiveKey::Conv(p.desc.clone().with_runtime(rt)))?;
        let mut q = p.clone();
        q.desc.iw = w;
        if q.key().validate().is_ok() {
            let oh = q.desc.oh();
            let (a, b) = (rows.0.index(oh + 1), rows.1.index(oh + 1));
            check_conv_runtime(&generic, &q, a.min(b)..a.max(b))?;
        }
    }
}

/// A conv with a fused max pool: a conv of `conv_problem` (or, now and then, one whose
/// reduction is chunked) without residuals, pooled by any valid max-pool window: padding,
/// strides, dilations, ceil mode, windows overlapping (rows copied down the band) or apart
/// (rows skipped).
fn fused_conv_problem() -> impl Strategy<Value = ConvProblem> {
    (
        prop_oneof![4 => conv_problem(), 1 => chunked_conv_problem()],
        (1..=4usize, 1..=4usize),
        (1..=3usize, 1..=3usize),
        (dilation(), dilation()),
        pads(2),
        any::<bool>(),
    )
        .prop_map(|(mut p, (kh, kw), (sh, sw), (dh, dw), pads, ceil_mode)| {
            p.desc.post_ops.retain(|o| *o != PostOpDesc::Add);
            p.desc.pool = Some(PoolWindow {
                kernel: [kh, kw],
                strides: [sh, sw],
                pads,
                dilations: [dh, dw],
                ceil_mode,
            });
            p
        })
        .prop_filter("valid fused key", |p| p.key().validate().is_ok())
}

proptest! {
    #![proptest_config(config(64))]

    /// Against the reference on 1, 2 and 3 threads (each with its own band of the scratch),
    /// and a partial range of pooled rows alone: the conv rows a range starts with are
    /// computed, not taken from a band left by rows before it.
    #[test]
    fn conv_fused_max_pool_matches_reference(
        p in fused_conv_problem(),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        p.check()?;
        let n = p.key().work_items();
        let (a, b) = (rows.0.index(n + 1), rows.1.index(n + 1));
        p.check_rows(a.min(b)..a.max(b))?;
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// One runtime-extent fused kernel at the problem's extents and at two more, as
    /// `conv_runtime_extents_match_exact`.
    #[test]
    fn conv_fused_runtime_extents_match_exact(
        p in fused_conv_problem(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=40usize, 1..=40usize), 2),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        check_runtime_extents(&p, rt, &more, rows)?;
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Whatever a conv's input holds, the padding lanes of its last, partial `nChw4c` block
    /// are +0: zero weights times an infinite or NaN input make NaN there, and the next conv's
    /// zero weights would carry it into real channels (`nan_inf.rs` checks that on graphs).
    /// Dense, grouped, chunked, pooled, depthwise and Winograd kernels, at every tier the host
    /// runs, with every third to seventh input NaN or infinite.
    #[test]
    fn conv_padding_lanes_are_zero_after_non_finite_inputs(
        p in prop_oneof![
            3 => conv_problem(),
            2 => winograd_problem(),
            1 => chunked_conv_problem(),
            1 => fused_conv_problem(),
            1 => depthwise_problem(),
        ],
        oc in prop::sample::select(&[1usize, 2, 3, 5, 7, 9, 14, 17, 30][..]),
        every in 3..=7usize,
        isa in tier(),
    ) {
        let mut d = p.desc;
        if d.groups == d.ic && d.groups == d.oc {
            (d.ic, d.groups) = (oc, oc);
        }
        d.oc = oc;
        d.dst_layout = Layout::Nchw4c;
        let p = ConvProblem { desc: d.at_tier(isa), seed: p.seed };
        prop_assume!(p.key().validate().is_ok());
        let mut x = p.data().x;
        for (i, v) in x.data.iter_mut().enumerate().filter(|(i, _)| i % every == 0) {
            *v = [f32::INFINITY, f32::NAN, f32::NEG_INFINITY][i / every % 3];
        }
        let bufs = Buffers {
            src: guarded(&to_layout(&x, p.desc.src_layout)),
            ..p.buffers()
        };
        let raw = bufs.execute(&*compile(&p.key())?, None)?;
        let [n, c, h, w] = bufs.dst_shape;
        let blocks = c.div_ceil(4);
        for (i, v) in raw.iter().enumerate() {
            let (lane, block) = (i % 4, i / 4 / (h * w) % blocks);
            if block == blocks - 1 && block * 4 + lane >= c {
                prop_assert_eq!(
                    v.to_bits(), 0, "{}: padding lane {} of pixel {} (of {} images)",
                    p.key(), lane, i / 4 % (h * w), n
                );
            }
        }
    }
}

/// A conv at a wide tier whose fixed-width rows have border columns: the borders sit inside
/// the pixel tiles ([`ConvPlan::bordered_tiles`]), their missing kernel columns skipped.
/// Widths up to 26 give every split (a lone remainder, two balanced last tiles, one tile
/// narrower than a full one, spanning output-channel tiles); 24 output channels give tiles of
/// three `ymm` and four pixels, the others two and six.
fn bordered_conv_problem() -> impl Strategy<Value = ConvProblem> {
    (
        conv_problem(),
        prop::sample::select(&[4usize, 8, 12][..]),
        prop::sample::select(&[8usize, 16, 24, 32, 64][..]),
        1..=26usize,
        prop::sample::select(common::host_tiers()),
    )
        .prop_map(|(mut p, ic, oc, iw, isa)| {
            let d = &mut p.desc;
            (d.ic, d.oc, d.groups, d.iw) = (ic, oc, 1, iw);
            d.pads.left = d.pads.left.max(1);
            d.dst_layout = Layout::Nchw4c;
            p.desc = p.desc.at_tier(isa);
            p
        })
        .prop_filter("valid conv key", |p| p.key().validate().is_ok())
}

proptest! {
    #![proptest_config(config(64))]

    /// Against the reference, on a partial range of rows, and as a runtime-width kernel,
    /// whose column template keeps its border columns' own tiles: the same bits as the
    /// exact kernel's tiles, since each pixel sums its products in the same order.
    #[test]
    fn bordered_rows_match_reference_and_runtime_widths(
        p in bordered_conv_problem(),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        let plan = ConvPlan::new(&p.desc);
        let wide = plan.wide_ratio().is_some();
        let borders = matches!(&plan.cols, AxisPlan::Fixed(runs) if runs.len() > 1);
        prop_assert_eq!(plan.bordered_tiles().is_some(), wide && borders, "{}", p.key());
        if let Some(tiles) = plan.bordered_tiles() {
            let covered: usize = tiles.iter().map(|t| t.pixels * t.count).sum();
            prop_assert_eq!(covered, p.desc.ow(), "{}: {}", p.key(), plan);
        }
        p.check()?;
        let oh = p.desc.oh();
        let (a, b) = (rows.0.index(oh + 1), rows.1.index(oh + 1));
        p.check_rows(a.min(b)..a.max(b))?;
        let rt = RuntimeDims { h: false, w: true };
        let generic = compile(&PrimitiveKey::Conv(p.desc.clone().with_runtime(rt)))?;
        check_conv_runtime(&generic, &p, a.min(b)..a.max(b))?;
    }
}

/// A conv whose weights put its tiles outer ([`ROWS_OUTER_WEIGHT_BYTES`]) and whose reduction
/// is chunked, on small images: each tile runs its rows one chunk at a time
/// ([`ConvPlan::chunks_outer`]), partial sums of all its rows in the destination between
/// chunks. 3x3 kernels over 256 channels, and 1x1 over 2064, with any padding, stride, post-op
/// (a residual included) and tier.
fn chunks_outer_problem() -> impl Strategy<Value = ConvProblem> {
    (
        conv_problem(),
        prop::sample::select(&[(256usize, 256usize, 3usize), (2064, 256, 1), (256, 264, 3)][..]),
        (1..=7usize, 1..=9usize),
        (1..=2usize, 1..=2usize),
        prop::sample::select(common::host_tiers()),
    )
        .prop_map(|(mut p, (ic, oc, k), (ih, iw), (sh, sw), isa)| {
            let d = &mut p.desc;
            (d.ic, d.oc, d.groups, d.kh, d.kw) = (ic, oc, 1, k, k);
            (d.ih, d.iw, d.strides, d.dilations) = (ih, iw, [sh, sw], [1, 1]);
            d.mb = 1;
            d.dst_layout = Layout::Nchw4c;
            p.desc = p.desc.at_tier(isa);
            p
        })
        .prop_filter("valid conv key", |p| p.key().validate().is_ok())
}

proptest! {
    #![proptest_config(config(12))]

    #[test]
    fn chunks_outer_tiles_match_reference(
        p in chunks_outer_problem(),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        let plan = ConvPlan::new(&p.desc);
        prop_assert!(plan.chunks_outer && plan.chunks() > 1, "{}: {}", p.key(), plan);
        p.check()?;
        let oh = p.desc.oh();
        let (a, b) = (rows.0.index(oh + 1), rows.1.index(oh + 1));
        p.check_rows(a.min(b)..a.max(b))?;
    }
}

/// A convolution whose weights exceed `ROWS_OUTER_WEIGHT_BYTES` runs its output-channel tiles
/// outer and its rows inner (every smaller one the other way round): against the reference,
/// on partial row ranges, with two images, and with a runtime width.
#[test]
fn tiles_outer_loop_order_matches_reference() {
    let mut desc = ConvDesc::new(2, 256, [4, 7], 256, [3, 3]);
    desc.pads = Pads::uniform(1);
    desc.bias = true;
    desc.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
    desc.src_layout = Layout::Nchw4c;
    desc.dst_layout = Layout::Nchw4c;
    let plan = ConvPlan::new(&desc);
    assert!(!plan.rows_outer, "{desc:?} has rows outer");
    assert_eq!(plan.vecs, 2, "tiles outer take two channel vectors");
    let p = ConvProblem { desc, seed: 7 };
    p.check().unwrap();
    p.check_rows(1..3).unwrap();
    let runtime = p
        .desc
        .clone()
        .with_runtime(RuntimeDims { h: false, w: true });
    let generic = compile(&PrimitiveKey::Conv(runtime)).expect("compile");
    for iw in [1, 7, 13] {
        let mut q = p.clone();
        q.desc.iw = iw;
        check_conv_runtime(&generic, &q, 0..q.desc.oh()).unwrap();
    }
}

/// Every width from 1 to 64 (and a sample of wider ones), for tiles of 12 and 10 pixels
/// (one channel vector), 6 and 5 pixels (two), strided and dilated windows and the trunk's
/// first layer, against the exact kernels.
#[test]
fn conv_runtime_width_covers_every_remainder() {
    let mut configs = Vec::new();
    for (ic, oc, k, s, d, pad, layout) in [
        (4, 4, 3, 1, 1, 1, Layout::Nchw4c),
        (4, 8, 3, 1, 1, 1, Layout::Nchw4c),
        (8, 8, 3, 2, 1, 1, Layout::Nchw4c),
        (4, 8, 3, 1, 2, 2, Layout::Nchw4c),
        (3, 8, 7, 2, 1, 3, Layout::Nchw),
        (5, 6, 1, 2, 1, 0, Layout::Nchw),
        (4, 4, 1, 2, 1, 0, Layout::Nchw4c),
    ] {
        let mut desc = ConvDesc::new(1, ic, [5, 1], oc, [k, k]);
        desc.strides = [s, s];
        desc.dilations = [d, d];
        desc.pads = Pads::uniform(pad);
        desc.bias = true;
        desc.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
        desc.src_layout = layout;
        desc.dst_layout = layout;
        configs.push(desc);
    }
    // Two channel vectors with a 3x3 kernel, grouped here: ungrouped, only above
    // `ROWS_OUTER_WEIGHT_BYTES` (see `tiles_outer_loop_order_matches_reference`).
    let mut grouped = ConvDesc::new(1, 8, [5, 1], 16, [3, 3]);
    grouped.groups = 2;
    grouped.pads = Pads::uniform(1);
    grouped.bias = true;
    grouped.src_layout = Layout::Nchw4c;
    grouped.dst_layout = Layout::Nchw4c;
    configs.push(grouped);
    let tiles: Vec<(usize, usize)> = configs
        .iter()
        .map(|d| {
            let plan = ConvPlan::new(d);
            (plan.pixel_tile, plan.vecs)
        })
        .collect();
    for tile in [(12, 1), (10, 1), (6, 2), (5, 2)] {
        assert!(tiles.contains(&tile), "no {tile:?} tile among {tiles:?}");
    }
    // The trunk's stem: conv1 with its relu and max pool fused.
    let mut stem = ConvDesc::new(1, 3, [5, 1], 8, [7, 7]);
    stem.strides = [2, 2];
    stem.pads = Pads::uniform(3);
    stem.bias = true;
    stem.post_ops = vec![PostOpDesc::Relu];
    stem.pool = Some(PoolWindow {
        kernel: [3, 3],
        strides: [2, 2],
        pads: Pads::uniform(1),
        dilations: [1, 1],
        ceil_mode: false,
    });
    stem.dst_layout = Layout::Nchw4c;
    configs.push(stem);
    for desc in configs {
        let runtime = desc.clone().with_runtime(RuntimeDims { h: false, w: true });
        let generic = compile(&PrimitiveKey::Conv(runtime)).expect("compile");
        for iw in (1..=64).chain([97, 258, 1031]) {
            let mut p = ConvProblem {
                desc: desc.clone(),
                seed: iw as u64,
            };
            p.desc.iw = iw;
            if p.key().validate().is_err() {
                continue;
            }
            let rows = p.key().work_items();
            check_conv_runtime(&generic, &p, 1.min(rows)..rows)
                .unwrap_or_else(|e| panic!("width {iw}: {e}"));
            p.check().unwrap_or_else(|e| panic!("width {iw}: {e}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Windowed pooling.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct PoolProblem {
    desc: PoolDesc,
    seed: u64,
}

impl PoolProblem {
    fn key(&self) -> PrimitiveKey {
        PrimitiveKey::Pool(self.desc.clone())
    }

    fn input(&self) -> Tensor {
        Rng(self.seed).tensor(&self.desc.src_shape())
    }

    fn attrs(&self) -> PoolAttrs {
        let d = &self.desc;
        PoolAttrs {
            kind: d.kind,
            window: d.window,
            count_include_pad: d.count_include_pad,
        }
    }

    fn reference(&self) -> Tensor {
        primjit_reference::pool2d(&self.input(), &self.attrs())
    }

    fn buffers(&self) -> Buffers {
        Buffers {
            src: guarded(&to_layout(&self.input(), self.desc.src_layout)),
            weights: None,
            extra: Vec::new(),
            dst_layout: self.desc.dst_layout,
            dst_shape: self.desc.dst_shape(),
            extents: None,
            scratch_len: 0,
        }
    }

    fn run(&self) -> Result<Vec<f32>, TestCaseError> {
        let p = compile(&self.key())?;
        self.buffers().run_all(&p)
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let got = self.run()?;
        let want = self.reference();
        let shape = self.desc.dst_shape();
        match self.desc.kind {
            PoolKind::Max => compare(&self.key(), shape, &got, &want.data, None),
            PoolKind::Avg => {
                let m = primjit_reference::pool2d(&abs(&self.input()), &self.attrs());
                let k = (self.desc.window.kernel[0] * self.desc.window.kernel[1]) as f64;
                let tol = |i: usize| (k + 4.0) * EPS * m.data[i] as f64 + 1e-30;
                compare(&self.key(), shape, &got, &want.data, Some(&tol))
            }
        }
    }

    fn check_rows(&self, rows: Range<usize>) -> Result<(), TestCaseError> {
        let key = self.key();
        let p = compile(&key)?;
        let bufs = self.buffers();
        let full = bufs.execute(&p, None)?;
        bufs.check_rows(&p, &full, rows)
    }
}

/// `p` against the reference, and at a wide tier against its x128 kernel bit for bit.
fn check_pool_at_tier_and_x128(p: &PoolProblem) -> Result<(), TestCaseError> {
    p.check()?;
    if p.desc.isa != Isa::X128 {
        let narrow = PoolProblem {
            desc: PoolDesc {
                isa: Isa::X128,
                ..p.desc.clone()
            },
            seed: p.seed,
        };
        let run = |p: &PoolProblem| -> Result<Vec<f32>, TestCaseError> {
            let prim = compile(&p.key())?;
            p.buffers().execute(&prim, None)
        };
        let (got, want) = (run(p)?, run(&narrow)?);
        let same = got
            .iter()
            .zip(&want)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        prop_assert!(same, "{} differs from its x128 kernel", p.key());
    }
    Ok(())
}

/// Pooling problems at the tiers this host runs: windows of up to 5 x 5 (taller than 3 rows
/// loop over their rows), widths up to 40 (two wide tiles of 16 pixels at `avx2` and one of
/// 32 at `avx512`, and their leftovers).
fn pool_problem() -> impl Strategy<Value = PoolProblem> {
    let shape = (
        prop_oneof![Just(PoolKind::Max), Just(PoolKind::Avg)],
        1..=2usize,
        channels(),
        (extent(), prop_oneof![3 => extent(), 1 => 10..=40usize]),
        (1..=5usize, 1..=5usize),
        (1..=3usize, 1..=3usize),
        (dilation(), dilation()),
        pads(2),
    );
    let rest = (
        any::<bool>(),
        any::<bool>(),
        (layout(), layout()),
        any::<u64>(),
        tier(),
    );
    (shape, rest)
        .prop_map(
            |(
                (kind, mb, c, (ih, iw), (kh, kw), (sh, sw), (dh, dw), pads),
                (ceil_mode, count_include_pad, (src_layout, dst_layout), seed, isa),
            )| PoolProblem {
                desc: PoolDesc {
                    kind,
                    mb,
                    c,
                    ih,
                    iw,
                    window: PoolWindow {
                        kernel: [kh, kw],
                        strides: [sh, sw],
                        pads,
                        dilations: [dh, dw],
                        ceil_mode,
                    },
                    count_include_pad,
                    src_layout,
                    dst_layout,
                    runtime: RuntimeDims::NONE,
                    isa: primjit_codegen::Isa::X128,
                }
                .at_tier(isa),
                seed,
            },
        )
        .prop_filter("valid pool key", |p| p.key().validate().is_ok())
}

proptest! {
    #![proptest_config(config(128))]

    /// Pooling matches the reference, and at a wide tier its x128 kernel bit for bit: the
    /// wide tile reduces each pixel's taps in the 128-bit tile's order, with its NaN rule.
    #[test]
    fn pool_matches_reference_and_its_x128_kernel(p in pool_problem()) {
        check_pool_at_tier_and_x128(&p)?;
    }
}

/// [`pool_problem`]s that the wide tiles cover where the host has a wide tier: `nChw4c` both
/// ways (any column stride: one load per vector at 1, one per pixel past it), at the host's
/// widest tier (x128 elsewhere).
fn wide_pool_problem() -> impl Strategy<Value = PoolProblem> {
    pool_problem()
        .prop_map(|p| {
            let desc = PoolDesc {
                src_layout: Layout::Nchw4c,
                dst_layout: Layout::Nchw4c,
                ..p.desc
            };
            let host = *common::host_tiers().last().expect("x128 at least");
            PoolProblem {
                desc: desc.at_tier(host),
                seed: p.seed,
            }
        })
        .prop_filter("valid pool key", |p| p.key().validate().is_ok())
}

proptest! {
    #![proptest_config(config(64))]

    /// The wide tiles against the reference and their x128 kernels (as
    /// `pool_matches_reference_and_its_x128_kernel`, every case covered).
    #[test]
    fn wide_pool_matches_reference_and_its_x128_kernel(p in wide_pool_problem()) {
        check_pool_at_tier_and_x128(&p)?;
    }

    /// At a wide tier, pooling an input sprinkled with NaN and ±Inf gives its x128 kernel's
    /// bits, whose IEEE semantics `nan_inf.rs` checks against the reference: a NaN stays NaN
    /// through the wide tile's maximum, as through the 128-bit one's.
    #[test]
    fn wide_pool_keeps_the_x128_kernels_nan_and_inf(
        p in wide_pool_problem(),
        at in prop::collection::vec((any::<Index>(), 0..3usize), 1..4),
    ) {
        if p.desc.isa != Isa::X128 {
            let mut x = p.input();
            for (i, k) in at {
                let len = x.data.len();
                x.data[i.index(len)] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][k];
            }
            let run = |desc: &PoolDesc| -> Result<Vec<f32>, TestCaseError> {
                let prim = compile(&PrimitiveKey::Pool(desc.clone()))?;
                let bufs = Buffers {
                    src: guarded(&to_layout(&x, desc.src_layout)),
                    ..p.buffers()
                };
                bufs.execute(&prim, None)
            };
            let got = run(&p.desc)?;
            let want = run(&PoolDesc { isa: Isa::X128, ..p.desc.clone() })?;
            let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
            prop_assert!(same, "{} differs from its x128 kernel", p.key());
        }
    }
}

proptest! {
    #![proptest_config(config(32))]

    #[test]
    fn pool_partial_rows_write_only_their_rows(
        p in pool_problem(),
        a in any::<Index>(),
        b in any::<Index>(),
    ) {
        let oh = p.desc.oh();
        let (a, b) = (a.index(oh + 1), b.index(oh + 1));
        p.check_rows(a.min(b)..a.max(b))?;
    }
}

/// Every width from 1 to 64 (and a sample of wider ones) for the trunk's max pooling, a
/// ceil-mode average pooling that counts padding and a 2x2 one, against the exact kernels, at
/// every tier the host runs.
#[test]
fn pool_runtime_width_covers_every_remainder() {
    let cases = [
        (PoolKind::Max, 3, 2, 1, false, false, Layout::Nchw4c),
        (PoolKind::Avg, 3, 2, 1, true, true, Layout::Nchw4c),
        (PoolKind::Avg, 2, 2, 0, false, false, Layout::Nchw),
    ];
    let tiers = common::host_tiers();
    for (isa, (kind, k, s, pad, ceil_mode, count_include_pad, layout)) in
        tiers.iter().flat_map(|&isa| cases.map(|c| (isa, c)))
    {
        let desc = PoolDesc {
            kind,
            mb: 1,
            c: 6,
            ih: 5,
            iw: 1,
            window: PoolWindow {
                kernel: [k, k],
                strides: [s, s],
                pads: Pads::uniform(pad),
                dilations: [1, 1],
                ceil_mode,
            },
            count_include_pad,
            src_layout: layout,
            dst_layout: layout,
            runtime: RuntimeDims::NONE,
            isa: primjit_codegen::Isa::X128,
        }
        .at_tier(isa);
        let runtime = desc.clone().with_runtime(RuntimeDims { h: false, w: true });
        let generic = compile(&PrimitiveKey::Pool(runtime)).expect("compile");
        for iw in (1..=64).chain([97, 258, 1031]) {
            let mut p = PoolProblem {
                desc: desc.clone(),
                seed: iw as u64,
            };
            p.desc.iw = iw;
            if p.key().validate().is_err() {
                continue;
            }
            let bufs = Buffers {
                extents: Some([p.desc.ih, iw]),
                ..p.buffers()
            };
            let oh = p.desc.oh();
            check_runtime_against_exact(&generic, &p.key(), bufs, 1.min(oh)..oh)
                .unwrap_or_else(|e| panic!("{isa} width {iw}: {e}"));
            p.check()
                .unwrap_or_else(|e| panic!("{isa} width {iw}: {e}"));
        }
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// As `conv_runtime_extents_match_exact`, for max and average pooling (ceil mode and
    /// padded counts included).
    #[test]
    fn pool_runtime_extents_match_exact(
        p in pool_problem(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=40usize, 1..=40usize), 2),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        let generic = compile(&PrimitiveKey::Pool(p.desc.clone().with_runtime(rt)))?;
        for (h, w) in std::iter::once((p.desc.ih, p.desc.iw)).chain(more) {
            let mut q = p.clone();
            if rt.h {
                q.desc.ih = h;
            }
            if rt.w {
                q.desc.iw = w;
            }
            let extents = [q.desc.ih, q.desc.iw];
            if q.key().validate().is_err() {
                check_rejected(&generic, q.desc.src_shape().iter().product(), extents)?;
                continue;
            }
            let oh = q.desc.oh();
            let (a, b) = (rows.0.index(oh + 1), rows.1.index(oh + 1));
            let bufs = Buffers {
                extents: Some(extents),
                ..q.buffers()
            };
            check_runtime_against_exact(&generic, &q.key(), bufs, a.min(b)..a.max(b))?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Global pooling and standalone element-wise ops.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct GlobalPoolProblem {
    desc: GlobalPoolDesc,
    seed: u64,
}

impl GlobalPoolProblem {
    fn key(&self) -> PrimitiveKey {
        PrimitiveKey::GlobalPool(self.desc.clone())
    }

    fn input(&self) -> Tensor {
        let d = &self.desc;
        Rng(self.seed).tensor(&[d.mb, d.c, d.ih, d.iw])
    }

    fn reference(&self) -> Tensor {
        primjit_reference::global_pool(&self.input(), self.desc.kind)
    }

    fn buffers(&self) -> Buffers {
        let d = &self.desc;
        Buffers {
            src: guarded(&to_layout(&self.input(), d.src_layout)),
            weights: None,
            extra: Vec::new(),
            dst_layout: d.dst_layout,
            dst_shape: [d.mb, d.c, 1, 1],
            extents: None,
            scratch_len: 0,
        }
    }

    fn run(&self) -> Result<Vec<f32>, TestCaseError> {
        let p = compile(&self.key())?;
        self.buffers().run_all(&p)
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let d = &self.desc;
        let got = self.run()?;
        let want = self.reference();
        let shape = [d.mb, d.c, 1, 1];
        match d.kind {
            PoolKind::Max => compare(&self.key(), shape, &got, &want.data, None),
            PoolKind::Avg => {
                let m = primjit_reference::global_pool(&abs(&self.input()), PoolKind::Avg);
                let k = (d.ih * d.iw) as f64;
                let tol = |i: usize| (k + 4.0) * EPS * m.data[i] as f64 + 1e-30;
                compare(&self.key(), shape, &got, &want.data, Some(&tol))
            }
        }
    }
}

/// Global poolings at the tiers this host runs: maps of 1 to 81 pixels (under one trip of
/// eight, and every remainder) and now and then up to 360 (many trips of the wide tile).
fn global_pool_problem() -> impl Strategy<Value = GlobalPoolProblem> {
    (
        prop_oneof![Just(PoolKind::Max), Just(PoolKind::Avg)],
        1..=2usize,
        channels(),
        (extent(), prop_oneof![3 => extent(), 1 => 10..=40usize]),
        (layout(), layout()),
        any::<u64>(),
        tier(),
    )
        .prop_map(
            |(kind, mb, c, (ih, iw), (src_layout, dst_layout), seed, isa)| GlobalPoolProblem {
                desc: GlobalPoolDesc {
                    kind,
                    mb,
                    c,
                    ih,
                    iw,
                    src_layout,
                    dst_layout,
                    runtime: RuntimeDims::NONE,
                    isa: Isa::X128,
                }
                .at_tier(isa),
                seed,
            },
        )
}

#[derive(Clone, Debug)]
struct EltwiseProblem {
    desc: EltwiseDesc,
    seed: u64,
}

impl EltwiseProblem {
    fn key(&self) -> PrimitiveKey {
        PrimitiveKey::Eltwise(self.desc.clone())
    }

    fn inputs(&self) -> (Tensor, Tensor) {
        let mut rng = Rng(self.seed);
        let a = rng.tensor(&self.desc.shape);
        let b = rng.tensor(&self.desc.shape);
        (a, b)
    }

    fn reference(&self) -> Tensor {
        let (a, b) = self.inputs();
        match self.desc.kind {
            EltwiseKind::Relu => primjit_reference::relu(&a),
            EltwiseKind::Add => primjit_reference::add(&a, &b),
            _ => unreachable!("tests/eltwise.rs tests the other kinds"),
        }
    }

    fn buffers(&self) -> Buffers {
        let d = &self.desc;
        let (a, b) = self.inputs();
        Buffers {
            src: guarded(&to_layout(&a, d.layout)),
            weights: None,
            extra: match d.kind {
                EltwiseKind::Relu => Vec::new(),
                EltwiseKind::Add => vec![guarded(&to_layout(&b, d.layout))],
                _ => unreachable!("tests/eltwise.rs tests the other kinds"),
            },
            dst_layout: d.layout,
            dst_shape: d.shape,
            extents: None,
            scratch_len: 0,
        }
    }

    fn run(&self) -> Result<Vec<f32>, TestCaseError> {
        let p = compile(&self.key())?;
        self.buffers().run_all(&p)
    }

    /// Both ops round at most once, exactly like the reference: results must be equal.
    fn check(&self) -> Result<(), TestCaseError> {
        let got = self.run()?;
        let want = self.reference();
        compare(&self.key(), self.desc.shape, &got, &want.data, None)
    }
}

fn eltwise_problem() -> impl Strategy<Value = EltwiseProblem> {
    (
        prop_oneof![Just(EltwiseKind::Relu), Just(EltwiseKind::Add)],
        (1..=2usize, channels(), extent(), extent()),
        layout(),
        any::<u64>(),
    )
        .prop_map(|(kind, (n, c, h, w), layout, seed)| EltwiseProblem {
            desc: EltwiseDesc {
                kind,
                shape: [n, c, h, w],
                layout,
                isa: Isa::X128,
                runtime: RuntimeDims::NONE,
            },
            seed,
        })
}

proptest! {
    #![proptest_config(config(64))]

    /// Against the reference, and at a wide tier against its x128 kernel bit for bit: the
    /// wide tile keeps the 128-bit loop's partials.
    #[test]
    fn global_pool_matches_reference_and_its_x128_kernel(p in global_pool_problem()) {
        p.check()?;
        if p.desc.isa != Isa::X128 {
            let narrow = GlobalPoolProblem {
                desc: GlobalPoolDesc { isa: Isa::X128, ..p.desc.clone() },
                seed: p.seed,
            };
            let (got, want) = (p.run()?, narrow.run()?);
            let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
            prop_assert!(same, "{} differs from its x128 kernel", p.key());
        }
    }

    #[test]
    fn eltwise_matches_reference(p in eltwise_problem()) {
        p.check()?;
    }

    /// One runtime-extent global pooling kernel at the problem's extents and at two more:
    /// the same partials in the same order as the exact kernel, so the same bits (the
    /// remainder of 8 pixels included).
    #[test]
    fn global_pool_runtime_extents_match_exact(
        p in global_pool_problem(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=40usize, 1..=40usize), 2),
    ) {
        let generic = compile(&PrimitiveKey::GlobalPool(p.desc.clone().with_runtime(rt)))?;
        for (h, w) in std::iter::once((p.desc.ih, p.desc.iw)).chain(more) {
            let mut q = p.clone();
            q.desc = q.desc.with_runtime(rt).at([h, w]);
            let bufs = Buffers {
                extents: Some([q.desc.ih, q.desc.iw]),
                ..q.buffers()
            };
            // Its work items are blocks of channels, not rows: all of them.
            let blocks = q.key().work_items();
            check_runtime_against_exact(&generic, &q.key(), bufs, 0..blocks)?;
        }
    }

    /// As `global_pool_runtime_extents_match_exact`, for `relu` and `add`.
    #[test]
    fn eltwise_runtime_extents_match_exact(
        p in eltwise_problem(),
        rt in runtime_dims(),
        more in prop::collection::vec((1..=40usize, 1..=40usize), 2),
        rows in (any::<Index>(), any::<Index>()),
    ) {
        let generic = compile(&PrimitiveKey::Eltwise(p.desc.clone().with_runtime(rt)))?;
        let [_, _, h0, w0] = p.desc.shape;
        for (h, w) in std::iter::once((h0, w0)).chain(more) {
            let mut q = p.clone();
            q.desc = q.desc.with_runtime(rt).at([h, w]);
            let [_, _, h, w] = q.desc.shape;
            let (a, b) = (rows.0.index(h + 1), rows.1.index(h + 1));
            let bufs = Buffers {
                extents: Some([h, w]),
                ..q.buffers()
            };
            check_runtime_against_exact(&generic, &q.key(), bufs, a.min(b)..a.max(b))?;
        }
    }

    #[test]
    fn eltwise_partial_rows_write_only_their_rows(
        p in eltwise_problem(),
        a in any::<Index>(),
        b in any::<Index>(),
    ) {
        let key = p.key();
        let h = p.desc.shape[2];
        let (a, b) = (a.index(h + 1), b.index(h + 1));
        let bufs = p.buffers();
        let p = compile(&key)?;
        let full = bufs.execute(&p, None)?;
        bufs.check_rows(&p, &full, a.min(b)..a.max(b))?;
    }
}

// ---------------------------------------------------------------------------------------------
// Named regression tests.
// ---------------------------------------------------------------------------------------------

/// Checks a conv problem against the reference, plus a few row splits run alone.
fn check_conv(desc: ConvDesc, seed: u64) {
    let p = ConvProblem { desc, seed };
    p.check().unwrap();
    // Output rows, or pooled rows with a fused pool.
    let oh = p.key().work_items();
    for rows in [0..oh / 2, oh / 2..oh, 1.min(oh)..oh] {
        p.check_rows(rows).unwrap();
    }
}

/// Whether this host runs `isa`; if not, says so on stderr, written past the test harness's
/// capture (which takes only `eprintln!`) so that the skip shows in every run.
fn runs_tier(test: &str, isa: Isa) -> bool {
    use std::io::Write;
    let runs = isa <= Isa::host();
    if !runs {
        let tiers: Vec<&str> = Isa::host_tiers().iter().map(|t| t.name()).collect();
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {test} at {isa}: this host runs {} (its code is emitted and decoded in \
             primjit-codegen's tests/tiers.rs)",
            tiers.join(", ")
        );
    }
    runs
}

/// Each direct family at each tier: the trunk's 3x3 and 1x1 layers, a strided 3x3, the 7x7
/// stem with its fused pool, a chunked reduction, output channels of a wide vector and a half,
/// a one-pixel image, a residual written in place, and every post-op.
#[test]
fn direct_families_match_reference_at_every_tier() {
    let mut c3 = ConvDesc::new(1, 64, [7, 19], 64, [3, 3]);
    c3.pads = Pads::uniform(1);
    c3.bias = true;
    c3.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
    let mut c1 = ConvDesc::new(1, 64, [8, 26], 128, [1, 1]);
    c1.strides = [2, 2];
    c1.bias = true;
    let mut strided = ConvDesc::new(1, 32, [9, 31], 64, [3, 3]);
    strided.strides = [2, 2];
    strided.pads = Pads::uniform(1);
    strided.post_ops = vec![PostOpDesc::Clip { lo: -0.5, hi: 0.75 }];
    let mut stem = ConvDesc::new(1, 3, [21, 40], 64, [7, 7]);
    stem.strides = [2, 2];
    stem.pads = Pads::uniform(3);
    stem.bias = true;
    stem.post_ops = vec![PostOpDesc::Relu];
    stem.pool = Some(PoolWindow {
        kernel: [3, 3],
        strides: [2, 2],
        pads: Pads::uniform(1),
        dilations: [1, 1],
        ceil_mode: false,
    });
    let mut chunked = ConvDesc::new(1, 256, [5, 14], 32, [3, 3]);
    chunked.pads = Pads::uniform(1);
    chunked.post_ops = vec![PostOpDesc::Add];
    let mut odd = ConvDesc::new(2, 8, [5, 17], 24, [3, 3]);
    odd.pads = Pads::uniform(1);
    let mut pixel = ConvDesc::new(1, 16, [1, 1], 32, [3, 3]);
    pixel.pads = Pads::uniform(1);
    pixel.bias = true;
    let families = [c3, c1, strided, stem, chunked, odd, pixel];
    for isa in Isa::ALL {
        if !runs_tier("direct_families_match_reference_at_every_tier", isa) {
            continue;
        }
        for (i, mut d) in families.clone().into_iter().enumerate() {
            if d.ic > 3 {
                d.src_layout = Layout::Nchw4c;
            }
            d.dst_layout = Layout::Nchw4c;
            d.isa = isa;
            check_conv(d, i as u64);
        }
    }
}

#[test]
fn resnet34_3x3_pad1_64_channels_nchw4c_add_relu() {
    let mut d = ConvDesc::new(1, 64, [10, 13], 64, [3, 3]);
    d.pads = Pads::uniform(1);
    d.bias = true;
    d.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
    d.src_layout = Layout::Nchw4c;
    d.dst_layout = Layout::Nchw4c;
    check_conv(d, 34);
}

#[test]
fn stem_7x7_stride2_pad3_3_to_64_nchw_to_nchw4c() {
    let mut d = ConvDesc::new(1, 3, [17, 22], 64, [7, 7]);
    d.strides = [2, 2];
    d.pads = Pads::uniform(3);
    d.bias = true;
    d.post_ops = vec![PostOpDesc::Relu];
    d.dst_layout = Layout::Nchw4c;
    check_conv(d, 7);
}

#[test]
fn downsample_1x1_stride2() {
    let mut d = ConvDesc::new(2, 64, [10, 13], 128, [1, 1]);
    d.strides = [2, 2];
    d.bias = true;
    d.src_layout = Layout::Nchw4c;
    d.dst_layout = Layout::Nchw4c;
    check_conv(d.clone(), 1);
    d.src_layout = Layout::Nchw;
    d.dst_layout = Layout::Nchw;
    check_conv(d, 2);
}

#[test]
fn conv_1x1_width_1() {
    let mut d = ConvDesc::new(2, 17, [5, 1], 5, [1, 1]);
    d.bias = true;
    check_conv(d.clone(), 11);
    d.src_layout = Layout::Nchw4c;
    d.dst_layout = Layout::Nchw4c;
    d.post_ops = vec![PostOpDesc::Add, PostOpDesc::Clip { lo: -0.5, hi: 0.5 }];
    check_conv(d, 12);
}

#[test]
fn depthwise_and_straddling_groups() {
    let mut d = ConvDesc::new(1, 24, [6, 5], 24, [3, 3]);
    d.groups = 24;
    d.pads = Pads::uniform(1);
    d.src_layout = Layout::Nchw4c;
    check_conv(d, 3);
    // Tiles of 8 output channels over groups of 3 cross group boundaries irregularly.
    let mut d = ConvDesc::new(1, 16, [5, 5], 24, [3, 1]);
    d.groups = 8;
    d.pads = Pads {
        top: 2,
        left: 0,
        bottom: 0,
        right: 1,
    };
    d.dst_layout = Layout::Nchw4c;
    check_conv(d, 4);
}

#[test]
fn kernel_larger_than_input_with_asymmetric_pads() {
    let mut d = ConvDesc::new(1, 5, [2, 1], 17, [5, 4]);
    d.pads = Pads {
        top: 3,
        left: 2,
        bottom: 1,
        right: 4,
    };
    d.dilations = [1, 2];
    d.bias = true;
    d.post_ops = vec![
        PostOpDesc::Add,
        PostOpDesc::Clip { lo: 0.0, hi: 0.0 },
        PostOpDesc::Add,
    ];
    check_conv(d, 5);
}

#[test]
fn maxpool_3x3_stride2_pad1() {
    for (layouts, seed) in [
        ((Layout::Nchw4c, Layout::Nchw4c), 1),
        ((Layout::Nchw, Layout::Nchw), 2),
    ] {
        let p = PoolProblem {
            desc: PoolDesc {
                kind: PoolKind::Max,
                mb: 1,
                c: 64,
                ih: 20,
                iw: 25,
                window: PoolWindow {
                    kernel: [3, 3],
                    strides: [2, 2],
                    pads: Pads::uniform(1),
                    dilations: [1, 1],
                    ceil_mode: false,
                },
                count_include_pad: false,
                src_layout: layouts.0,
                dst_layout: layouts.1,
                runtime: Default::default(),
                isa: primjit_codegen::Isa::X128,
            },
            seed,
        };
        p.check().unwrap();
        let oh = p.desc.oh();
        p.check_rows(1..oh - 1).unwrap();
    }
}

#[test]
fn avgpool_ceil_mode_window_past_the_end_padding() {
    // 5 wide, kernel 3, stride 2, pad 1/0, ceil: the last window hangs past the input and the
    // end padding; with count_include_pad it still only counts cells inside the padded input.
    for count_include_pad in [false, true] {
        let p = PoolProblem {
            desc: PoolDesc {
                kind: PoolKind::Avg,
                mb: 1,
                c: 5,
                ih: 6,
                iw: 5,
                window: PoolWindow {
                    kernel: [3, 3],
                    strides: [2, 2],
                    pads: Pads {
                        top: 1,
                        left: 1,
                        bottom: 0,
                        right: 0,
                    },
                    dilations: [1, 1],
                    ceil_mode: true,
                },
                count_include_pad,
                src_layout: Layout::Nchw,
                dst_layout: Layout::Nchw4c,
                runtime: Default::default(),
                isa: primjit_codegen::Isa::X128,
            },
            seed: 9,
        };
        p.check().unwrap();
    }
}

#[test]
fn avgpool_dilations_match_reference() {
    // ONNX AveragePool has dilations since opset 19: a 3x2 kernel spread over a 5x4 window,
    // with pads, strides, ceil_mode (a last window past the input) and both divisors, on both
    // source layouts; and the runtime-width kernel against the exact one.
    for count_include_pad in [false, true] {
        for ceil_mode in [false, true] {
            for src_layout in [Layout::Nchw, Layout::Nchw4c] {
                let desc = PoolDesc {
                    kind: PoolKind::Avg,
                    mb: 2,
                    c: 6,
                    ih: 11,
                    iw: 13,
                    window: PoolWindow {
                        kernel: [3, 2],
                        strides: [2, 3],
                        pads: Pads {
                            top: 1,
                            left: 2,
                            bottom: 2,
                            right: 0,
                        },
                        dilations: [2, 3],
                        ceil_mode,
                    },
                    count_include_pad,
                    src_layout,
                    dst_layout: Layout::Nchw4c,
                    runtime: Default::default(),
                    isa: primjit_codegen::Isa::X128,
                };
                let p = PoolProblem { desc, seed: 17 };
                p.check().unwrap();
                p.check_rows(1..p.desc.oh() - 1).unwrap();
            }
        }
    }
}

/// `nChw4c` padding lanes are the kernels' scratch: a kernel reads them only against zero
/// weights (conv) or into padding lanes (pooling), so finite garbage there changes nothing.
#[test]
fn nchw4c_padding_lanes_do_not_leak_into_results() {
    fn garbage(buf: &mut [f32], [_, c, h, w]: [usize; 4]) {
        for (i, v) in buf.iter_mut().enumerate() {
            let channel = i / (4 * h * w) % c.div_ceil(4) * 4 + i % 4;
            if channel >= c {
                *v = 1000.0 + (i % 7) as f32;
            }
        }
    }
    let mut d = ConvDesc::new(2, 5, [4, 6], 6, [3, 3]);
    d.pads = Pads::uniform(1);
    d.src_layout = Layout::Nchw4c;
    d.dst_layout = Layout::Nchw4c;
    let conv = ConvProblem { desc: d, seed: 21 };
    let pool = PoolProblem {
        desc: PoolDesc {
            kind: PoolKind::Avg,
            mb: 2,
            c: 5,
            ih: 4,
            iw: 6,
            window: PoolWindow {
                kernel: [2, 2],
                strides: [1, 2],
                pads: Pads::uniform(0),
                dilations: [1, 1],
                ceil_mode: false,
            },
            count_include_pad: false,
            src_layout: Layout::Nchw4c,
            dst_layout: Layout::Nchw,
            runtime: Default::default(),
            isa: primjit_codegen::Isa::X128,
        },
        seed: 22,
    };
    for (key, mut bufs) in [(conv.key(), conv.buffers()), (pool.key(), pool.buffers())] {
        let p = compile(&key).unwrap();
        let clean = bufs.execute(&p, None).unwrap();
        let mut src = bufs.src.as_slice().to_vec();
        garbage(&mut src, [2, 5, 4, 6]);
        assert_ne!(src, bufs.src.as_slice(), "garbage written");
        bufs.src = guarded(&src);
        let dirty = bufs.execute(&p, None).unwrap();
        let (clean, dirty) = (
            from_layout(&clean, bufs.dst_layout, bufs.dst_shape),
            from_layout(&dirty, bufs.dst_layout, bufs.dst_shape),
        );
        assert_eq!(clean, dirty, "{key}");
    }
}

// ---------------------------------------------------------------------------------------------
// Execution errors: typed, naming the role and shapes, never a panic.
// ---------------------------------------------------------------------------------------------

#[test]
fn wrong_buffers_are_typed_errors() {
    let mut d = ConvDesc::new(1, 5, [6, 7], 6, [3, 3]);
    d.bias = true;
    d.post_ops = vec![PostOpDesc::Add];
    d.dst_layout = Layout::Nchw4c;
    let key = PrimitiveKey::Conv(d.clone());
    let p = compile(&key).unwrap();
    let specs = key.buffers();
    let len = |role: &str| specs.iter().find(|s| s.role == role).unwrap().len;
    let src = vec![0.0; len("src")];
    let weights = vec![0.0; len("weights")];
    let residual = vec![0.0; len("residual")];
    let short = |n: usize| vec![0.0f32; n - 1];

    // Runs with the given buffers and returns the error; the destination must be untouched.
    let run = |src: &[f32], w: Option<&[f32]>, dst_len: usize, extra: &[&[f32]]| -> ExecError {
        let mut dst = sentinel_dst(dst_len);
        let err = p
            .execute(ExecArgs {
                src,
                weights: w,
                dst: dst.as_mut_slice(),
                extra,
                scratch: None,
            })
            .expect_err("must be rejected");
        assert!(
            dst.as_slice().iter().all(|v| v.to_bits() == SENTINEL),
            "a rejected execution wrote its destination"
        );
        err
    };
    let check_length = |err: ExecError, role: &str, shape: Vec<usize>, expected: usize| {
        let msg = err.to_string();
        match err {
            ExecError::BufferLength {
                role: r,
                expected: e,
                found,
                shape: s,
                ..
            } => {
                assert_eq!(
                    (r, e, found, s.clone()),
                    (role, expected, expected - 1, shape)
                );
                assert!(
                    msg.contains(role) && msg.contains(&format!("{s:?}")),
                    "{msg}"
                );
                assert!(msg.contains(&key.to_string()), "{msg}");
            }
            other => panic!("expected a length error for {role}, got {other:?}"),
        }
    };
    let dst_len = len("dst");
    let src_shape = d.src_shape().to_vec();
    let dst_shape = d.dst_shape().to_vec();

    let e = run(&short(len("src")), Some(&weights), dst_len, &[&residual]);
    check_length(e, "src", src_shape, len("src"));
    let e = run(&src, Some(&short(len("weights"))), dst_len, &[&residual]);
    check_length(e, "weights", d.weight_shape().to_vec(), len("weights"));
    let e = run(&src, Some(&weights), dst_len - 1, &[&residual]);
    check_length(e, "dst", dst_shape.clone(), dst_len);
    let e = run(&src, Some(&weights), dst_len, &[&short(len("residual"))]);
    check_length(e, "residual", dst_shape, len("residual"));

    let e = run(&src, None, dst_len, &[&residual]);
    assert!(
        matches!(
            e,
            ExecError::MissingBuffer {
                role: "weights",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("weights"), "{e}");

    for extra in [&[][..], &[&residual[..], &residual[..]][..]] {
        let e = run(&src, Some(&weights), dst_len, extra);
        assert_eq!(
            e,
            ExecError::ExtraCount {
                key: key.to_string(),
                expected: 1,
                found: extra.len()
            }
        );
        assert!(e.to_string().contains("expected 1 extra"), "{e}");
    }

    // A pool takes no weights; an add names its second source.
    let pool = PrimitiveKey::Pool(PoolDesc {
        kind: PoolKind::Max,
        mb: 1,
        c: 3,
        ih: 4,
        iw: 4,
        window: PoolWindow {
            kernel: [2, 2],
            strides: [2, 2],
            pads: Pads::uniform(0),
            dilations: [1, 1],
            ceil_mode: false,
        },
        count_include_pad: false,
        src_layout: Layout::Nchw,
        dst_layout: Layout::Nchw,
        runtime: Default::default(),
        isa: primjit_codegen::Isa::X128,
    });
    let pp = compile(&pool).unwrap();
    let mut dst = vec![0.0; 12];
    let e = pp
        .execute(ExecArgs {
            src: &[0.0; 48],
            weights: Some(&[0.0]),
            dst: &mut dst,
            extra: &[],
            scratch: None,
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::UnexpectedBuffer {
                role: "weights",
                ..
            }
        ),
        "{e:?}"
    );

    let add = PrimitiveKey::Eltwise(EltwiseDesc {
        kind: EltwiseKind::Add,
        shape: [1, 3, 2, 2],
        layout: Layout::Nchw4c,
        isa: Isa::X128,
        runtime: RuntimeDims::NONE,
    });
    let ap = compile(&add).unwrap();
    let mut dst = vec![0.0; 16];
    let e = ap
        .execute(ExecArgs {
            src: &[0.0; 16],
            weights: None,
            dst: &mut dst,
            extra: &[&[0.0; 12]],
            scratch: None,
        })
        .unwrap_err();
    match &e {
        ExecError::BufferLength {
            role,
            expected,
            found,
            shape,
            ..
        } => assert_eq!(
            (*role, *expected, *found, shape.clone()),
            ("src2", 16, 12, vec![1, 3, 2, 2])
        ),
        other => panic!("expected a length error for src2, got {other:?}"),
    }
}

#[test]
fn invalid_keys_are_compile_errors() {
    let mut d = ConvDesc::new(1, 6, [4, 4], 4, [3, 3]);
    d.groups = 4;
    let err = engine().compile(&PrimitiveKey::Conv(d)).unwrap_err();
    assert!(matches!(err, RuntimeError::Codegen(_)), "{err:?}");
    assert!(err.to_string().contains("groups (4) must divide"), "{err}");
}

#[test]
fn work_item_ranges_outside_the_rows_are_typed_errors() {
    let mut d = ConvDesc::new(1, 3, [4, 5], 4, [1, 1]);
    d.bias = true;
    let p = ConvProblem { desc: d, seed: 8 };
    let prim = compile(&p.key()).unwrap();
    let bufs = p.buffers();
    let run = |rows: Range<usize>| {
        let mut dst = sentinel_dst(bufs.dst_len());
        let result = prim.execute_range(
            ExecArgs {
                src: bufs.src.as_slice(),
                weights: bufs.weights.as_ref().map(|w| w.as_slice()),
                dst: dst.as_mut_slice(),
                extra: &[],
                scratch: None,
            },
            None,
            rows,
        );
        let untouched = dst.as_slice().iter().all(|v| v.to_bits() == SENTINEL);
        (result, untouched)
    };
    for (start, end) in [(0, 5), (4, 5), (3, 2)] {
        let (result, untouched) = run(start..end);
        let err = result.expect_err("out-of-range work items must be rejected");
        assert_eq!(
            err,
            ExecError::WorkItems {
                key: p.key().to_string(),
                start,
                end,
                limit: 4
            }
        );
        assert!(
            err.to_string().contains(&format!("{start}..{end}")),
            "{err}"
        );
        assert!(untouched, "a rejected execution wrote its destination");
    }
    // An empty range within the rows is valid and writes nothing.
    let (result, untouched) = run(4..4);
    assert_eq!(result, Ok(()));
    assert!(untouched);
}

/// One `execute` of the FMA peak kernel of `pattern` from zeroed accumulators: their sums.
fn fma_peak_sums(pattern: FmaPattern, src: &[f32]) -> Vec<f32> {
    let p = compile(&PrimitiveKey::FmaPeak(pattern)).expect("compile");
    let mut acc = vec![0.0f32; primjit_codegen::key::FMA_PEAK_ACCUMULATORS * 4];
    p.execute(ExecArgs {
        src,
        weights: None,
        dst: &mut acc,
        extra: &[],
        scratch: None,
    })
    .expect("execute");
    acc
}

/// `execute` runs a key's whole work: for the FMA peak kernel, one loop trip of 8 steps
/// `x <- x * b + a` on each of its 12 chains (not every trip `execute_range` could ask for).
#[test]
fn fma_peak_execute_runs_one_trip() {
    let mut src = [1.0f32; 8];
    src[4..].fill(0.5);
    let acc = fma_peak_sums(FmaPattern::Registers, &src);
    // From 0, eight steps of `x * 0.5 + 1`: 2 - 2^-7.
    assert!(acc.iter().all(|&x| x == 2.0 - 1.0 / 128.0), "{acc:?}");
}

/// The broadcast pattern's trip: per channel, each accumulator adds its own scalar times the
/// channel's weight vector, so that a scalar read for the wrong accumulator or channel, or a
/// weight lane out of place, shows in the sums.
#[test]
fn fma_peak_broadcast_sums_each_accumulators_scalars() {
    use primjit_codegen::key::{FMA_BROADCAST_CHANNELS, FMA_PEAK_ACCUMULATORS};
    let (channels, accs) = (FMA_BROADCAST_CHANNELS, FMA_PEAK_ACCUMULATORS);
    let mut src = vec![0.0f32; FmaPattern::Broadcast.source_len()];
    // Weight vector of channel c: lanes (c + 1) * [1, 2, 3, 4].
    for c in 0..channels {
        for lane in 0..4 {
            src[4 * c + lane] = ((c + 1) * (lane + 1)) as f32;
        }
    }
    // Scalar of channel c and accumulator k: k + 1 on channel 0, 0 on the others but the last,
    // where it is 1.
    for k in 0..accs {
        src[4 * channels + k] = (k + 1) as f32;
        src[4 * channels + (channels - 1) * accs + k] = 1.0;
    }
    let acc = fma_peak_sums(FmaPattern::Broadcast, &src);
    for k in 0..accs {
        for lane in 0..4 {
            let want = ((k + 1) * (lane + 1) + channels * (lane + 1)) as f32;
            assert_eq!(
                acc[4 * k + lane],
                want,
                "accumulator {k}, lane {lane}: {acc:?}"
            );
        }
    }
}

/// The shared-broadcast pattern's trip (the Winograd GEMM's tile): per channel, accumulator
/// `j * 5 + t` (vector `j`, tile `t`) adds tile `t`'s scalar times the channel's weight vector
/// `j`, so that a scalar read for the wrong tile or channel, a weight vector of the wrong pair
/// half, or a lane out of place shows in the sums; the two accumulators the tile leaves alone
/// stay zero.
#[test]
fn fma_peak_shared_broadcast_sums_each_tiles_scalars() {
    use primjit_codegen::key::{FMA_BROADCAST_CHANNELS, FMA_PEAK_ACCUMULATORS};
    use primjit_codegen::tile::{GROUP_TILES, GROUP_VECTORS};
    let (channels, tiles, vectors) = (FMA_BROADCAST_CHANNELS, GROUP_TILES, GROUP_VECTORS);
    let mut src = vec![0.0f32; FmaPattern::SharedBroadcast.source_len()];
    // Weight vector j of channel c: lanes (c + 1) * (j + 1) * [1, 10, 100, 1000].
    for c in 0..channels {
        for j in 0..vectors {
            for lane in 0..4 {
                src[(c * vectors + j) * 4 + lane] =
                    ((c + 1) * (j + 1) * 10usize.pow(lane as u32)) as f32;
            }
        }
    }
    // Scalar of channel c and tile t: t + 1 on channel 0, 0 on the others but the last, where
    // it is 1.
    let scalars = channels * vectors * 4;
    for t in 0..tiles {
        src[scalars + t] = (t + 1) as f32;
        src[scalars + (channels - 1) * tiles + t] = 1.0;
    }
    let acc = fma_peak_sums(FmaPattern::SharedBroadcast, &src);
    for k in 0..FMA_PEAK_ACCUMULATORS {
        for lane in 0..4 {
            let want = if k < tiles * vectors {
                let (j, t) = (k / tiles, k % tiles);
                let unit = (j + 1) * 10usize.pow(lane as u32);
                ((t + 1) * unit + channels * unit) as f32
            } else {
                0.0
            };
            assert_eq!(
                acc[4 * k + lane],
                want,
                "accumulator {k}, lane {lane}: {acc:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row pitches: kernels on windows of wider buffers.
// ---------------------------------------------------------------------------------------------

/// A dense `layout` buffer of `shape` laid out with rows `pitch` pixels apart, the pixels
/// between them `fill`, ending where its last row does ([`Layout::pitched_len`]).
fn to_pitched(
    dense: &[f32],
    layout: Layout,
    shape: [usize; 4],
    pitch: usize,
    fill: f32,
) -> Vec<f32> {
    let (rows, elem) = rows_and_elem(layout, shape);
    let row = shape[3] * elem;
    let mut out = vec![fill; layout.pitched_len(shape, pitch)];
    for r in 0..rows {
        out[r * pitch * elem..][..row].copy_from_slice(&dense[r * row..][..row]);
    }
    out
}

/// The rows of a pitched buffer, dense again; fails where a pixel between the rows is not
/// the sentinel any more (a kernel wrote outside its rows).
fn from_pitched(
    buf: &[f32],
    layout: Layout,
    shape: [usize; 4],
    pitch: usize,
    what: &str,
) -> Result<Vec<f32>, TestCaseError> {
    let (rows, elem) = rows_and_elem(layout, shape);
    let row = shape[3] * elem;
    let mut dense = Vec::with_capacity(rows * row);
    for r in 0..rows {
        dense.extend_from_slice(&buf[r * pitch * elem..][..row]);
        if r + 1 < rows {
            let gap = &buf[r * pitch * elem + row..(r + 1) * pitch * elem];
            if let Some(i) = gap.iter().position(|x| x.to_bits() != SENTINEL) {
                return Err(TestCaseError::fail(format!(
                    "{what}: pixel {} after row {r} was written: {:?}",
                    shape[3] + i / elem,
                    gap[i]
                )));
            }
        }
    }
    Ok(dense)
}

/// A problem of any algorithm with row pitches wider than its rows by `extra` pixels (a fused
/// pool's destination by its pooled rows).
fn pitched_problem() -> impl Strategy<Value = (ConvProblem, [usize; 2])> {
    (
        prop_oneof![
            2 => conv_problem(),
            2 => winograd_problem(),
            1 => fused_conv_problem(),
            1 => depthwise_problem(),
        ],
        (0..=6usize, 0..=6usize),
    )
        .prop_map(|(mut p, (src_extra, dst_extra))| {
            p.desc.pitches = Pitches {
                src: Some(p.desc.iw + src_extra),
                dst: Some(p.desc.dst_shape()[3] + dst_extra),
            };
            (p, [src_extra, dst_extra])
        })
}

impl ConvProblem {
    /// Runs `p` (this problem's kernel with pitches, or its runtime-width twin at this
    /// problem's extents) on pitched guard-page buffers whose pixels between rows are NaN on
    /// the inputs and the sentinel on the destination, on 1, 2 and 3 threads, and returns the
    /// destination's rows dense.
    fn run_pitched(&self, p: &Primitive, runtime: bool) -> Result<Vec<f32>, TestCaseError> {
        let d = &self.desc;
        let dense = self.buffers();
        let dst_shape = d.dst_shape();
        let (src_pitch, dst_pitch) = (d.src_pitch(), d.dst_pitch());
        let src = guarded(&to_pitched(
            dense.src.as_slice(),
            d.src_layout,
            d.src_shape(),
            src_pitch,
            f32::NAN,
        ));
        let extra: Vec<GuardedBuffer> = dense
            .extra
            .iter()
            .map(|r| {
                guarded(&to_pitched(
                    r.as_slice(),
                    d.dst_layout,
                    dst_shape,
                    dst_pitch,
                    f32::NAN,
                ))
            })
            .collect();
        let extra: Vec<&[f32]> = extra.iter().map(|b| b.as_slice()).collect();
        let extents = runtime.then_some([d.ih, d.iw]);
        let mut results = Vec::new();
        for pool in std::iter::once(None).chain(pools().iter().map(Some)) {
            let mut dst = sentinel_dst(d.dst_layout.pitched_len(dst_shape, dst_pitch));
            let threads = pool.map_or(1, |p| p.current_num_threads());
            let mut scratch = dense.scratch(threads);
            let args = ExecArgs {
                src: src.as_slice(),
                weights: dense.weights.as_ref().map(|w| w.as_slice()),
                dst: dst.as_mut_slice(),
                extra: &extra,
                scratch: scratch.as_mut().map(|s| s.as_mut_slice()),
            };
            let ran = match (pool, extents) {
                (Some(pool), e) => p.execute_parallel(args, e.map(Into::into), pool),
                (None, Some(e)) => p.execute_at(args, e),
                (None, None) => p.execute(args),
            };
            ran.map_err(|e| TestCaseError::fail(format!("{}: {e}", p.key())))?;
            results.push(from_pitched(
                dst.as_slice(),
                d.dst_layout,
                dst_shape,
                dst_pitch,
                &p.key().to_string(),
            )?);
        }
        for r in &results[1..] {
            assert_bit_identical(&results[0], r, &format!("{} on more threads", p.key()))?;
        }
        Ok(results.swap_remove(0))
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// A kernel with row pitches (direct, Winograd, with a fused pool, depthwise; fixed and
    /// runtime width) reads and writes only its rows' pixels of guard-page buffers, leaves the pixels
    /// between rows alone (NaN there would reach the result if read), and computes the dense
    /// kernel's result bit for bit.
    #[test]
    fn conv_pitched_rows_match_dense(
        (p, extra) in pitched_problem(),
        runtime in any::<bool>(),
    ) {
        let mut dense = p.clone();
        dense.desc.pitches = Pitches::DENSE;
        let want = dense.buffers().execute(&*compile(&dense.key())?, None)?;
        let key = match runtime {
            true => PrimitiveKey::Conv(p.desc.clone().with_runtime(RuntimeDims { h: false, w: true })),
            false => p.key(),
        };
        let got = p.run_pitched(&*compile(&key)?, runtime)?;
        assert_bit_identical(&want, &got, &format!("{key} (pitches wider by {extra:?})"))?;
    }
}

/// A pitch narrower than its rows is rejected: by the key's validation where the width is
/// fixed, and by the call's where it is a runtime value.
#[test]
fn conv_pitch_narrower_than_rows_is_rejected() {
    let mut d = ConvDesc::new(1, 4, [5, 9], 4, [3, 3]);
    d.src_layout = Layout::Nchw4c;
    d.dst_layout = Layout::Nchw4c;
    d.pitches = Pitches {
        src: Some(8),
        dst: None,
    };
    let err = PrimitiveKey::Conv(d.clone()).validate().unwrap_err();
    assert!(
        err.reason
            .contains("row pitch (8) is narrower than its rows (9)"),
        "{err}"
    );

    d.pitches = Pitches {
        src: Some(12),
        dst: Some(12),
    };
    let generic = PrimitiveKey::Conv(d.with_runtime(RuntimeDims { h: false, w: true }));
    let prim = compile(&generic).expect("a valid runtime key");
    // At width 14 the rows (14 in, 12 out) pass the source's pitch.
    let src = vec![0.0; Layout::Nchw4c.pitched_len([1, 4, 5, 14], 12)];
    let weights = vec![0.0; prim.key().buffers()[1].len];
    let mut dst = vec![0.0; Layout::Nchw4c.pitched_len([1, 4, 3, 12], 12)];
    let args = ExecArgs {
        src: &src,
        weights: Some(&weights),
        dst: &mut dst,
        extra: &[],
        scratch: None,
    };
    match prim.execute_at(args, [5, 14]) {
        Err(ExecError::Extents { reason, .. }) => {
            assert!(reason.contains("source's row pitch (12)"), "{reason}")
        }
        other => panic!("expected an extents error, got {other:?}"),
    }
}

/// The keys of a fuzzing finding (`kernel_vs_reference`, `engine_api`): grouped convolutions
/// whose vectors span groups (`g2ic4oc2`, depthwise on NCHW) match the reference on finite
/// data. (An `Inf` in another group's input gave them NaN until each input was masked by its
/// group, `ConvPlan::group_masks`; `nan_inf.rs` checks that.)
#[test]
fn grouped_conv_of_one_output_channel_per_group_matches_reference() {
    for (mb, ic, oc, [ih, iw], layout) in [
        (1, 4, 2, [4, 8], Layout::Nchw4c),
        (2, 2, 2, [1, 1], Layout::Nchw),
        (1, 6, 3, [3, 5], Layout::Nchw4c),
    ] {
        for isa in common::host_tiers() {
            let mut desc = ConvDesc::new(mb, ic, [ih, iw], oc, [1, 1]);
            desc.groups = oc;
            desc.src_layout = layout;
            desc.dst_layout = layout;
            desc.isa = desc.tier_for(isa);
            let p = ConvProblem { desc, seed: 7 };
            p.check().unwrap_or_else(|e| panic!("{}: {e}", p.key()));
        }
    }
}

/// A global max pooling keeps a NaN wherever it is, in the loop's whole groups of pixels or
/// in the remainder after them, at every tier the host runs; the other channels keep their
/// maximum.
#[test]
fn global_max_pool_keeps_nan_in_groups_and_remainder() {
    for isa in common::host_tiers() {
        global_max_pool_keeps_nan_at(isa);
    }
}

fn global_max_pool_keeps_nan_at(isa: Isa) {
    let (c, ih, iw) = (12, 5, 5);
    let desc = GlobalPoolDesc {
        kind: PoolKind::Max,
        mb: 1,
        c,
        ih,
        iw,
        src_layout: Layout::Nchw4c,
        dst_layout: Layout::Nchw4c,
        runtime: RuntimeDims::NONE,
        isa: Isa::X128,
    }
    .at_tier(isa);
    let p = GlobalPoolProblem { desc, seed: 3 };
    let mut input = p.input();
    // Channel 1 in the first group of pixels, channel 6 in the remainder (pixel 24 of 25).
    input.data[ih * iw + 2] = f32::NAN;
    input.data[6 * ih * iw + 24] = f32::NAN;
    let bufs = Buffers {
        src: guarded(&to_layout(&input, Layout::Nchw4c)),
        ..p.buffers()
    };
    let prim = compile(&p.key()).unwrap_or_else(|e| panic!("{e}"));
    let got = bufs.run_all(&prim).unwrap_or_else(|e| panic!("{e}"));
    let want = primjit_reference::global_pool(&input, PoolKind::Max);
    for (ch, (&g, &w)) in got.iter().zip(&want.data).enumerate().take(c) {
        if ch == 1 || ch == 6 {
            assert!(g.is_nan(), "{} channel {ch}: {g}", p.key());
        } else {
            assert_eq!(g.to_bits(), w.to_bits(), "{} channel {ch}", p.key());
        }
    }
}
