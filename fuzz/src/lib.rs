//! Shared machinery of the structured fuzz targets: ops built from arbitrary bytes, their data,
//! the reference interpreter's result and the tolerance of the comparison.
//!
//! The tolerances are those of `crates/runtime/tests/kernels.rs` (see its module
//! documentation for the derivation): convolution and average pooling within
//! `(K + 4) * 2^-23 * m + 1e-30` of the reference, where `m` is the same op on magnitudes and
//! `K` the reduction length; max pooling, relu and add exactly.
//!
//! A quarter of the seeds (those with both top bits set, [`carries_specials`]) also put NaN
//! and ±Inf in the data: the kernels must give NaN exactly where the reference does, the same
//! infinities, and the finite values within the tolerance (IEEE semantics, as onnxruntime).

use arbitrary::Arbitrary;
use primjit::ir::{Pads, PoolKind, PoolWindow};
use primjit::reference::{ConvAttrs, PoolAttrs, Post};
use primjit::{
    ConvDesc, ConvPlan, EltwiseDesc, EltwiseKind, GlobalPoolDesc, Isa, Layout, PoolDesc,
    PostOpDesc, PrimitiveKey, Tensor,
};

/// The unit in the last place of 1.0 in f32, `2^-23`.
pub const EPS: f64 = f32::EPSILON as f64;

/// SplitMix64: deterministic data from a fuzzer-chosen seed.
pub struct Rng(pub u64);

/// Whether the data of `seed` carry NaN and ±Inf ([`Rng::special_value`]).
pub fn carries_specials(seed: u64) -> bool {
    seed >> 62 == 3
}

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Mostly uniform in `[-1, 1)`, sometimes an exact zero or a small integer (ties for max).
    pub fn value(&mut self) -> f32 {
        let r = self.next_u64();
        match r % 16 {
            0 => 0.0,
            1 => ((r >> 8) % 5) as f32 - 2.0,
            _ => (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0,
        }
    }

    /// [`Self::value`], or about one time in eight NaN, +Inf or -Inf.
    pub fn special_value(&mut self) -> f32 {
        match self.next_u64() % 24 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            _ => self.value(),
        }
    }

    pub fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n).map(|_| self.value()).collect(),
        }
    }

    /// [`Self::tensor`] with [`Self::special_value`]s.
    pub fn special_tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n).map(|_| self.special_value()).collect(),
        }
    }
}

/// A number in `lo..=hi` from any byte.
fn pick(b: u8, lo: usize, hi: usize) -> usize {
    lo + b as usize % (hi - lo + 1)
}

fn layout(blocked: bool) -> Layout {
    if blocked {
        Layout::Nchw4c
    } else {
        Layout::Nchw
    }
}

/// Which op a [`OpSpec`] builds.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum OpKind {
    Conv,
    MaxPool,
    AvgPool,
    GlobalMax,
    GlobalAvg,
    Relu,
    Add,
}

/// A post-op, with clip bounds in quarter steps.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum PostSpec {
    Relu,
    Add,
    Clip { lo: i8, width: u8 },
}

/// Raw choices for one op; [`OpSpec::key`] maps them into small, mostly valid shapes:
/// batch 1-2, channels 1-12, spatial extents 1-12, kernels 1-5, strides and dilations 1-3,
/// pads 0-3, up to three post-ops.
#[derive(Arbitrary, Clone, Debug)]
pub struct OpSpec {
    pub kind: OpKind,
    pub mb: u8,
    pub ic: u8,
    pub oc: u8,
    pub groups: u8,
    pub ih: u8,
    pub iw: u8,
    pub kernel: [u8; 2],
    pub strides: [u8; 2],
    pub dilations: [u8; 2],
    pub pads: [u8; 4],
    pub bias: bool,
    pub post_ops: Vec<PostSpec>,
    pub ceil_mode: bool,
    pub count_include_pad: bool,
    pub src_blocked: bool,
    pub dst_blocked: bool,
    pub seed: u64,
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl OpSpec {
    /// The key these choices describe. It may still be invalid (a window that does not fit,
    /// a pooling window over padding only): callers check
    /// `validate` and expect an `InvalidKey` error from the engine then.
    pub fn key(&self) -> PrimitiveKey {
        let mb = pick(self.mb, 1, 2);
        let ic = pick(self.ic, 1, 12);
        let [ih, iw] = [pick(self.ih, 1, 12), pick(self.iw, 1, 12)];
        let kernel = self.kernel.map(|k| pick(k, 1, 5));
        let strides = self.strides.map(|s| pick(s, 1, 3));
        let dilations = self.dilations.map(|d| pick(d, 1, 3));
        let p = self.pads.map(|p| pick(p, 0, 3));
        let pads = Pads {
            top: p[0],
            left: p[1],
            bottom: p[2],
            right: p[3],
        };
        let (src_layout, dst_layout) = (layout(self.src_blocked), layout(self.dst_blocked));
        match self.kind {
            OpKind::Conv => {
                let oc = pick(self.oc, 1, 12);
                let g = divisors(gcd(ic, oc));
                let mut d = ConvDesc::new(mb, ic, [ih, iw], oc, kernel);
                d.groups = g[self.groups as usize % g.len()];
                d.strides = strides;
                d.dilations = dilations;
                d.pads = pads;
                d.bias = self.bias;
                d.post_ops = self
                    .post_ops
                    .iter()
                    .take(3)
                    .map(|p| match *p {
                        PostSpec::Relu => PostOpDesc::Relu,
                        PostSpec::Add => PostOpDesc::Add,
                        PostSpec::Clip { lo, width } => {
                            let lo = (lo % 12) as f32 / 4.0;
                            PostOpDesc::Clip {
                                lo,
                                hi: lo + (width % 16) as f32 / 4.0,
                            }
                        }
                    })
                    .collect();
                d.src_layout = src_layout;
                d.dst_layout = dst_layout;
                PrimitiveKey::Conv(d)
            }
            OpKind::MaxPool | OpKind::AvgPool => PrimitiveKey::Pool(PoolDesc {
                kind: if matches!(self.kind, OpKind::MaxPool) {
                    PoolKind::Max
                } else {
                    PoolKind::Avg
                },
                mb,
                c: ic,
                ih,
                iw,
                window: PoolWindow {
                    kernel,
                    strides,
                    pads,
                    dilations,
                    ceil_mode: self.ceil_mode,
                },
                count_include_pad: self.count_include_pad,
                src_layout,
                dst_layout,
                runtime: Default::default(),
                // The ops are x128 keys, as `ConvDesc::new`'s are.
                isa: Isa::X128,
            }),
            OpKind::GlobalMax | OpKind::GlobalAvg => PrimitiveKey::GlobalPool(GlobalPoolDesc {
                kind: if matches!(self.kind, OpKind::GlobalMax) {
                    PoolKind::Max
                } else {
                    PoolKind::Avg
                },
                mb,
                c: ic,
                ih,
                iw,
                src_layout,
                dst_layout,
                runtime: Default::default(),
                isa: Isa::X128,
            }),
            OpKind::Relu | OpKind::Add => PrimitiveKey::Eltwise(EltwiseDesc {
                kind: if matches!(self.kind, OpKind::Relu) {
                    EltwiseKind::Relu
                } else {
                    EltwiseKind::Add
                },
                shape: [mb, ic, ih, iw],
                layout: src_layout,
                isa: Isa::X128,
                runtime: Default::default(),
            }),
        }
    }
}

/// An NCHW tensor in `layout` (nChw4c padding lanes zero).
pub fn to_layout(t: &Tensor, layout: Layout) -> Vec<f32> {
    let shape: [usize; 4] = t.shape.clone().try_into().expect("rank 4");
    match layout {
        Layout::Nchw => t.data.clone(),
        Layout::Nchw4c => primjit::layout::to_blocked(&t.data, shape),
    }
}

/// A buffer of `layout` back in NCHW.
pub fn from_layout(buf: &[f32], layout: Layout, shape: [usize; 4]) -> Vec<f32> {
    match layout {
        Layout::Nchw => buf.to_vec(),
        Layout::Nchw4c => primjit::layout::to_nchw(buf, shape),
    }
}

fn abs(t: &Tensor) -> Tensor {
    Tensor {
        shape: t.shape.clone(),
        data: t.data.iter().map(|v| v.abs()).collect(),
    }
}

/// A valid key with its data: the buffers the kernel takes (in the key's layouts, weights
/// packed), the reference result in NCHW, and the tolerance of each output element (`None`:
/// exact).
pub struct Problem {
    pub key: PrimitiveKey,
    pub src: Vec<f32>,
    pub weights: Option<Vec<f32>>,
    pub extra: Vec<Vec<f32>>,
    pub dst_layout: Layout,
    pub dst_shape: [usize; 4],
    pub want: Vec<f32>,
    pub tolerance: Option<Vec<f64>>,
}

/// `(K + 4) * 2^-23 * m + 1e-30` per element, `m` from the op on magnitudes.
fn tolerance(k: usize, magnitude: &Tensor) -> Vec<f64> {
    magnitude
        .data
        .iter()
        .map(|&m| (k as f64 + 4.0) * EPS * m as f64 + 1e-30)
        .collect()
}

impl Problem {
    /// The data and reference result of a valid key (one that `validate` accepts).
    pub fn new(key: &PrimitiveKey, seed: u64) -> Problem {
        let mut rng = Rng(seed);
        let specials = carries_specials(seed);
        // The activations carry NaN and ±Inf with `specials`; weights and biases stay finite.
        let data = |rng: &mut Rng, shape: &[usize]| {
            if specials {
                rng.special_tensor(shape)
            } else {
                rng.tensor(shape)
            }
        };
        match key {
            PrimitiveKey::Conv(d) => {
                let x = data(&mut rng, &d.src_shape());
                let w = rng.tensor(&d.weight_shape());
                let b = d.bias.then(|| rng.tensor(&[d.oc]));
                let residuals: Vec<Tensor> = (0..d.residuals())
                    .map(|_| data(&mut rng, &d.dst_shape()))
                    .collect();
                let attrs = ConvAttrs {
                    strides: d.strides,
                    dilations: d.dilations,
                    pads: d.pads,
                    groups: d.groups,
                };
                let mut res = residuals.iter();
                let posts: Vec<Post<'_>> = d
                    .post_ops
                    .iter()
                    .map(|p| match *p {
                        PostOpDesc::Relu => Post::Relu,
                        PostOpDesc::Add => Post::Add(res.next().expect("one residual per add")),
                        PostOpDesc::Clip { lo, hi } => Post::Clip { lo, hi },
                        PostOpDesc::Act(a) => Post::Act(a),
                        PostOpDesc::PRelu => unreachable!("the fuzzed keys take no prelu"),
                    })
                    .collect();
                let want = primjit::reference::conv2d(&x, &w, b.as_ref(), &attrs, &posts);
                let abs_res: Vec<Tensor> = residuals.iter().map(abs).collect();
                let abs_posts: Vec<Post<'_>> = abs_res.iter().map(Post::Add).collect();
                let mut m = primjit::reference::conv2d(
                    &abs(&x),
                    &abs(&w),
                    b.as_ref().map(abs).as_ref(),
                    &attrs,
                    &abs_posts,
                );
                let clip = d
                    .post_ops
                    .iter()
                    .map(|p| match *p {
                        PostOpDesc::Clip { lo, hi } => lo.abs().max(hi.abs()),
                        _ => 0.0,
                    })
                    .fold(0.0f32, f32::max);
                m.data.iter_mut().for_each(|v| *v += clip);
                let [_, icg, kh, kw] = d.weight_shape();
                let k = icg * kh * kw + usize::from(d.bias) + d.residuals();
                let packed =
                    ConvPlan::new(d).pack_weights(&w.data, b.as_ref().map(|b| &b.data[..]), None);
                Problem {
                    key: key.clone(),
                    src: to_layout(&x, d.src_layout),
                    weights: Some(packed),
                    extra: residuals
                        .iter()
                        .map(|r| to_layout(r, d.dst_layout))
                        .collect(),
                    dst_layout: d.dst_layout,
                    dst_shape: d.dst_shape(),
                    want: want.data,
                    tolerance: Some(tolerance(k, &m)),
                }
            }
            PrimitiveKey::Pool(d) => {
                let x = data(&mut rng, &d.src_shape());
                let attrs = PoolAttrs {
                    kind: d.kind,
                    window: d.window,
                    count_include_pad: d.count_include_pad,
                };
                let want = primjit::reference::pool2d(&x, &attrs);
                let tolerance = match d.kind {
                    PoolKind::Max => None,
                    PoolKind::Avg => Some(tolerance(
                        d.window.kernel[0] * d.window.kernel[1],
                        &primjit::reference::pool2d(&abs(&x), &attrs),
                    )),
                };
                Problem {
                    key: key.clone(),
                    src: to_layout(&x, d.src_layout),
                    weights: None,
                    extra: Vec::new(),
                    dst_layout: d.dst_layout,
                    dst_shape: d.dst_shape(),
                    want: want.data,
                    tolerance,
                }
            }
            PrimitiveKey::GlobalPool(d) => {
                let x = data(&mut rng, &[d.mb, d.c, d.ih, d.iw]);
                let want = primjit::reference::global_pool(&x, d.kind);
                let tolerance = match d.kind {
                    PoolKind::Max => None,
                    PoolKind::Avg => Some(tolerance(
                        d.ih * d.iw,
                        &primjit::reference::global_pool(&abs(&x), PoolKind::Avg),
                    )),
                };
                Problem {
                    key: key.clone(),
                    src: to_layout(&x, d.src_layout),
                    weights: None,
                    extra: Vec::new(),
                    dst_layout: d.dst_layout,
                    dst_shape: [d.mb, d.c, 1, 1],
                    want: want.data,
                    tolerance,
                }
            }
            PrimitiveKey::Eltwise(d) => {
                let a = data(&mut rng, &d.shape);
                let b = data(&mut rng, &d.shape);
                let (want, extra) = match d.kind {
                    EltwiseKind::Relu => (primjit::reference::relu(&a), Vec::new()),
                    EltwiseKind::Add => (
                        primjit::reference::add(&a, &b),
                        vec![to_layout(&b, d.layout)],
                    ),
                    _ => panic!("the fuzz specs make relus and adds only"),
                };
                Problem {
                    key: key.clone(),
                    src: to_layout(&a, d.layout),
                    weights: None,
                    extra,
                    dst_layout: d.layout,
                    dst_shape: d.shape,
                    want: want.data,
                    tolerance: None,
                }
            }
            PrimitiveKey::Concat(_)
            | PrimitiveKey::SelectChannels(_)
            | PrimitiveKey::Resize(_)
            | PrimitiveKey::ConvTranspose(_) => {
                panic!("the fuzz specs make no concat, channel selection, resize or deconv")
            }
            PrimitiveKey::FmaPeak(_) | PrimitiveKey::WidePeak { .. } => {
                panic!("the FMA peak loops have no reference")
            }
        }
    }

    /// Checks an NCHW result against the reference; describes the first difference. NaN must
    /// be where the reference has NaN and nowhere else, an infinity where it has the same one.
    pub fn check(&self, got: &[f32]) -> Result<(), String> {
        if got.len() != self.want.len() {
            return Err(format!(
                "{}: {} outputs, expected {}",
                self.key,
                got.len(),
                self.want.len()
            ));
        }
        let ok = |i: usize| match (&self.tolerance, self.want[i]) {
            (_, want) if want.is_nan() => got[i].is_nan(),
            (_, want) if want.is_infinite() => got[i] == want,
            (None, want) => got[i] == want,
            (Some(t), want) => (got[i] as f64 - want as f64).abs() <= t[i],
        };
        match (0..got.len()).find(|&i| !ok(i)) {
            None => Ok(()),
            Some(i) => Err(format!(
                "{}: element {i} of {}: jit {:?}, reference {:?}, tolerance {:?}",
                self.key,
                got.len(),
                got[i],
                self.want[i],
                self.tolerance.as_ref().map(|t| t[i])
            )),
        }
    }
}
