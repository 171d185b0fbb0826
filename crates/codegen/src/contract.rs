//! The kernel contract of each key, as its plan computes it: the tier a convolution or a
//! pooling runs at, the buffers a kernel takes, its scratch, its packed weights and its work
//! items.
//!
//! Methods of the key types, kept out of `key` so that the keys stay data (fields, shapes,
//! one-liners and the checks that need no plan) and the layers run one way: `key` imports
//! neither the plans nor the emitters, and this module imports all three.

use crate::conv::winograd::{Form, WinogradPlan};
use crate::key::{
    BufferSpec, CallExtents, ConvAlgo, ConvDesc, ConvTransposeDesc, EltwiseDesc, EltwiseKind,
    FMA_PEAK_ACCUMULATORS, GlobalPoolDesc, KeyError, Layout, PoolDesc, PrimitiveKey, ResizeDesc,
    ResizeOut, SCRATCH_ROLE,
};
use crate::plan::{ConvPlan, representative_extents};
use crate::target::Isa;
use crate::tile::{LANES, LANEWISE_CALL_PIXELS, LANEWISE_VECTORS, full_tile};
use primjit_ir::Pads;

impl ConvDesc {
    /// The tier this convolution's kernel uses on an engine of tier `engine`: the engine's for
    /// a direct convolution, ungrouped or whose groups' output channels are whole wide
    /// vectors (`backend::x64::DirectTile`), or depthwise at unit stride along rows
    /// (`backend::x64::LanewiseTile`), and for a Winograd convolution whose output-channel
    /// chunks are whole wide vectors (`backend::x64::GemmTile`; its transforms stay 128-bit
    /// Cranelift code); `x128` for the others. Post-ops a wide tile does not compute (the
    /// activations) are applied by Cranelift code to its stored outputs.
    pub fn tier_for(&self, engine: Isa) -> Isa {
        if engine == Isa::X128 {
            return Isa::X128;
        }
        let fits = match self.algo {
            ConvAlgo::Direct => {
                // The tile addresses weights and inputs by 32-bit displacements: keys whose
                // weights or a row's reach do not fit them (kernels of thousands of taps) keep
                // x128 code.
                let weight_bytes = (self.oc.div_ceil(4) * 4) as u128
                    * self.ic as u128
                    * (self.kh * self.kw) as u128
                    * 4;
                // A row's reach covers the widest tile's pixels: 12 of the avx512 direct tile,
                // the most a lane-wise call covers (`ConvPlan::lanewise_row`).
                let tile_pixels = LANEWISE_CALL_PIXELS as u128;
                let reach = ((self.kw.saturating_sub(1)) as u128 * self.dilations[1] as u128
                    + tile_pixels * self.strides[1] as u128
                    + 1)
                    * 16;
                let small = weight_bytes < i32::MAX as u128 && reach < i32::MAX as u128;
                // Grouped convolutions take the wide tile where a group's output channels are
                // whole wide vectors (a tile of one or two of them stays in its group), and
                // its input channels whole blocks of the `nChw4c` input.
                let (icg, ocg) = (self.ic / self.groups, self.oc / self.groups);
                let whole_groups = self.groups == 1
                    || (ocg.is_multiple_of(engine.target().lanes) && icg.is_multiple_of(LANES));
                if self.lanewise() {
                    // The wide lane-wise tile stores consecutive pixels as one vector: an
                    // `nChw4c` destination. It reads them as one vector too at unit stride
                    // along rows, and gathers their blocks at a larger one.
                    self.dst_layout == Layout::Nchw4c && self.pool.is_none() && small
                } else {
                    whole_groups && small
                }
            }
            ConvAlgo::WinogradF4x3 => {
                // A chunk of output channels must be whole wide vectors, and the tile's two
                // weight panels within 32-bit displacements.
                let vector_blocks = engine.target().lanes / 4;
                let panel_bytes = self.ic as u128 * engine.target().vector_bytes() as u128;
                WinogradPlan::new(self)
                    .chunk_blocks()
                    .is_multiple_of(vector_blocks)
                    && 2 * panel_bytes < i32::MAX as u128 / 2
            }
        };
        if fits { engine } else { Isa::X128 }
    }

    /// Floats of scratch one thread needs: for Winograd, the transformed tiles and GEMM
    /// results of one block of tiles ([`WinogradPlan::scratch_len`]);
    /// with a fused pool, a band of [`Self::pool_band_rows`] output rows in `nChw4c`; else 0.
    /// Winograd's depends on the tiles per block: for a fixed-shape key it is the key's own (a
    /// small image's blocks hold fewer tiles), for a key with runtime extents the most any
    /// call takes. A call needs the scratch of its own key ([`Self::at`] its extents); more
    /// is allowed.
    pub fn scratch_len(&self) -> usize {
        if self.algo == ConvAlgo::WinogradF4x3 {
            return WinogradPlan::new(self).scratch_len();
        }
        if self.pool.is_none() {
            return 0;
        }
        self.oc.div_ceil(4) * 4 * self.pool_band_rows() * self.ow()
    }

    /// Bytes of weights a call of this fixed-shape key ([`Self::at`] a call's extents) reads
    /// from memory beyond L2: for a Winograd kernel whose transformed weights stream, all of
    /// them once per block of tiles, so the fewer tiles a call has, the more it reads per
    /// flop; 0 for weights that stay in L2 across blocks, and for direct kernels, which read
    /// their packed weights once per output row whatever the call's width.
    pub fn streamed_weight_bytes(&self) -> u64 {
        match self.algo {
            ConvAlgo::Direct => 0,
            ConvAlgo::WinogradF4x3 => WinogradPlan::new(self).streamed_weight_bytes(),
        }
    }

    /// The packed weights' length in floats, for this key's algorithm.
    ///
    /// # Panics
    ///
    /// If the key is not valid ([`PrimitiveKey::validate`]): its plan divides by the groups.
    pub fn packed_weights_len(&self) -> usize {
        match self.algo {
            ConvAlgo::Direct => ConvPlan::new(self).packed_weights_len(),
            ConvAlgo::WinogradF4x3 => WinogradPlan::new(self).packed_weights_len(),
        }
    }

    /// Packs OIHW `weights`, the optional bias and a PReLU post-op's slopes for this key's
    /// algorithm: the direct kernels' layout ([`crate::ConvPlan::pack_weights`]) or the
    /// Winograd-transformed weights ([`WinogradPlan::pack_weights`]). Depends on channels,
    /// kernel and layouts only, never on the spatial shape.
    ///
    /// # Panics
    ///
    /// If the key is not valid ([`PrimitiveKey::validate`]), `weights` (OIHW,
    /// [`ConvDesc::weight_shape`]), `bias` or `slopes` (`oc` each) have another length, or
    /// `slopes` are given without a PReLU post-op or missing with one: callers check first, as
    /// `CompiledGraph::new` does.
    pub fn pack_weights(
        &self,
        weights: &[f32],
        bias: Option<&[f32]>,
        slopes: Option<&[f32]>,
    ) -> Vec<f32> {
        match self.algo {
            ConvAlgo::Direct => ConvPlan::new(self).pack_weights(weights, bias, slopes),
            ConvAlgo::WinogradF4x3 => WinogradPlan::new(self).pack_weights(weights, bias, slopes),
        }
    }

    /// Multiply-adds times two that the algorithm performs: the direct count for direct
    /// kernels; for Winograd, the GEMMs over the (padded) output tiles, 36 or (stride 2) 81
    /// (the transforms, a few percent of the work, are not counted).
    pub fn algo_flops(&self) -> u64 {
        match self.algo {
            ConvAlgo::Direct => self.flops(),
            ConvAlgo::WinogradF4x3 => {
                let tiles = (self.mb * self.oh().div_ceil(4) * self.ow().div_ceil(4)) as u64;
                let points = Form::of(self).points() as u64;
                2 * points * tiles * (self.ic * self.oc) as u64
            }
        }
    }
}

impl PoolDesc {
    /// The tier this pooling's kernel uses on an engine of tier `engine`: the engine's where
    /// both layouts are `nChw4c` and the window's reach fits the tile's 32-bit displacements
    /// (`backend::x64::PoolTile`: wide vectors of consecutive output pixels of one block,
    /// whose inputs are one load at unit column stride and a load per pixel at a larger one);
    /// `x128` for the others.
    pub fn tier_for(&self, engine: Isa) -> Isa {
        let lanes = engine.target().lanes as u128;
        let reach = (self.window.kernel[1].saturating_sub(1) as u128
            * self.window.dilations[1] as u128
            + LANEWISE_VECTORS as u128 * lanes / LANES as u128 * self.window.strides[1] as u128
            + 1)
            * 16;
        let wide = engine != Isa::X128
            && self.src_layout == Layout::Nchw4c
            && self.dst_layout == Layout::Nchw4c
            && reach < i32::MAX as u128;
        if wide { engine } else { Isa::X128 }
    }

    /// This key at the tier its kernel uses on an engine of tier `engine` ([`Self::tier_for`]).
    pub fn at_tier(self, engine: Isa) -> PoolDesc {
        let isa = self.tier_for(engine);
        PoolDesc { isa, ..self }
    }
}

impl ConvTransposeDesc {
    /// Whether every output pixel takes exactly one tap, `(oy % sh, ox % sw)` of input pixel
    /// `(oy / sh, ox / sw)`: a kernel the size of its stride, no pads, dilation or output
    /// padding, one group. An output row's pixels of one column phase are then a 1x1
    /// convolution of an input row, written every `sw` pixels.
    pub fn one_tap_per_pixel(&self) -> bool {
        [self.kh, self.kw] == self.strides
            && self.dilations == [1, 1]
            && self.pads == Pads::uniform(0)
            && self.output_padding == [0, 0]
            && self.groups == 1
    }

    /// The tier this transposed convolution's kernel uses on an engine of tier `engine`: the
    /// engine's where each output pixel takes one tap ([`Self::one_tap_per_pixel`]) and the
    /// input channels are whole blocks of four (`lower_conv_transpose`: the direct
    /// convolution's wide tile over each column phase), within the tile's 32-bit
    /// displacements; `x128` for the others.
    pub fn tier_for(&self, engine: Isa) -> Isa {
        // A tile's reach into the output row: as many pixels as the tier's full direct tile has
        // accumulators (`lower_conv_transpose::phase_tiles`), `sw` apart.
        let (pixels, vectors) = full_tile(engine);
        let reach = (pixels * vectors) as u128 * self.strides[1] as u128 * 16;
        let wide = engine != Isa::X128
            && self.one_tap_per_pixel()
            && self.ic.is_multiple_of(4)
            && reach < i32::MAX as u128;
        if wide { engine } else { Isa::X128 }
    }

    /// This key at the tier its kernel uses on an engine of tier `engine` ([`Self::tier_for`]).
    pub fn at_tier(self, engine: Isa) -> ConvTransposeDesc {
        let isa = self.tier_for(engine);
        ConvTransposeDesc { isa, ..self }
    }
}

impl GlobalPoolDesc {
    /// The tier this global pooling's kernel uses on an engine of tier `engine`: the engine's
    /// for an `nChw4c` source (`backend::x64::GlobalPoolTile`: each wide vector the partials
    /// of consecutive pixels of one block), `x128` for an NCHW one.
    pub fn tier_for(&self, engine: Isa) -> Isa {
        if self.src_layout == Layout::Nchw4c {
            engine
        } else {
            Isa::X128
        }
    }

    /// This key at the tier its kernel uses on an engine of tier `engine` ([`Self::tier_for`]).
    pub fn at_tier(self, engine: Isa) -> GlobalPoolDesc {
        let isa = self.tier_for(engine);
        GlobalPoolDesc { isa, ..self }
    }
}

impl EltwiseDesc {
    /// The tier this element-wise op's kernel uses on an engine of tier `engine`: the
    /// engine's for the activations, PReLU and the broadcasting binary ops
    /// (`backend::x64::EltwiseTile`: runs of whole wide vectors, the x128 loop after them);
    /// `x128` for `relu` and `add` (which `lower_pool` lowers).
    pub fn tier_for(&self, engine: Isa) -> Isa {
        let wide = match self.kind {
            EltwiseKind::Act(_) | EltwiseKind::PRelu | EltwiseKind::Binary { .. } => true,
            EltwiseKind::Relu | EltwiseKind::Add => false,
        };
        if wide && engine != Isa::X128 {
            engine
        } else {
            Isa::X128
        }
    }

    /// This key at the tier its kernel uses on an engine of tier `engine` ([`Self::tier_for`]).
    pub fn at_tier(self, engine: Isa) -> EltwiseDesc {
        let isa = self.tier_for(engine);
        EltwiseDesc { isa, ..self }
    }
}

impl PrimitiveKey {
    /// Checks that the key describes a kernel that can exist, with checked arithmetic on every
    /// extent, so that code generation may assume in-bounds addressing.
    ///
    /// A key with runtime extents is checked at a representative extent
    /// ([`representative_extents`]) and for canonical form (runtime fields hold 0); each call's
    /// extents are checked by validating [`Self::at`] before the call.
    pub fn validate(&self) -> Result<(), KeyError> {
        let runtime = self.runtime_dims();
        if !runtime.any() {
            self.check_fixed(true)?;
            return self.check_tier();
        }
        let [ih, iw] = self.input_extents();
        let [oh, ow] = match self {
            PrimitiveKey::Resize(ResizeDesc {
                out: ResizeOut::Sizes(s),
                ..
            }) => *s,
            _ => [0, 0],
        };
        if (runtime.h && (ih != 0 || oh != 0)) || (runtime.w && (iw != 0 || ow != 0)) {
            return Err(KeyError {
                key: self.to_string(),
                reason: "a runtime extent must hold 0 in the key".into(),
            });
        }
        // A resize to sizes is checked at the representative extents for its output too.
        let extents = representative_extents(self);
        let fixed = self.at(CallExtents {
            input: extents,
            output: Some(extents),
        });
        fixed
            .check_fixed(false)
            .and_then(|()| fixed.check_tier())
            .map_err(|e| KeyError {
                key: self.to_string(),
                reason: e.reason,
            })
    }

    /// A wide tier's tiles cover only what [`ConvDesc::tier_for`] grants it.
    fn check_tier(&self) -> Result<(), KeyError> {
        let (what, isa, granted) = match self {
            PrimitiveKey::Conv(d) => ("convolution", d.isa, d.tier_for(d.isa)),
            PrimitiveKey::Pool(d) => ("pooling", d.isa, d.tier_for(d.isa)),
            PrimitiveKey::GlobalPool(d) => ("global pooling", d.isa, d.tier_for(d.isa)),
            PrimitiveKey::ConvTranspose(d) => ("transposed convolution", d.isa, d.tier_for(d.isa)),
            PrimitiveKey::Eltwise(d) => ("element-wise op", d.isa, d.tier_for(d.isa)),
            _ => return Ok(()),
        };
        if isa == granted {
            return Ok(());
        }
        Err(KeyError {
            key: self.to_string(),
            reason: format!("the {isa} tier does not cover this {what}: its kernel is x128 code"),
        })
    }

    /// The buffers the kernel takes, in argument order after the fixed source / weights /
    /// destination: for a conv its residuals, for an add its second source.
    pub fn buffers(&self) -> Vec<BufferSpec> {
        let act = |role: &'static str, shape: [usize; 4], layout: Layout| BufferSpec {
            role,
            shape: shape.to_vec(),
            layout: Some(layout),
            len: layout.buffer_len(shape),
        };
        match self {
            PrimitiveKey::Conv(d) => {
                let pitched = |role, shape: [usize; 4], layout: Layout, pitch: usize| BufferSpec {
                    len: layout.pitched_len(shape, pitch),
                    ..act(role, shape, layout)
                };
                let mut v = vec![pitched("src", d.src_shape(), d.src_layout, d.src_pitch())];
                v.push(BufferSpec {
                    role: "weights",
                    shape: d.weight_shape().to_vec(),
                    layout: None,
                    len: d.packed_weights_len(),
                });
                let dst_pitch = d.dst_pitch();
                v.push(pitched("dst", d.dst_shape(), d.dst_layout, dst_pitch));
                for _ in 0..d.residuals() {
                    v.push(pitched("residual", d.dst_shape(), d.dst_layout, dst_pitch));
                }
                if d.scratch_len() > 0 {
                    v.push(BufferSpec {
                        role: SCRATCH_ROLE,
                        shape: vec![d.scratch_len()],
                        layout: None,
                        len: d.scratch_len(),
                    });
                }
                v
            }
            PrimitiveKey::Pool(d) => vec![
                act("src", d.src_shape(), d.src_layout),
                act("dst", d.dst_shape(), d.dst_layout),
            ],
            PrimitiveKey::GlobalPool(d) => {
                vec![
                    act("src", [d.mb, d.c, d.ih, d.iw], d.src_layout),
                    act("dst", [d.mb, d.c, 1, 1], d.dst_layout),
                ]
            }
            PrimitiveKey::Eltwise(d) => {
                let mut v = vec![act("src", d.shape, d.layout), act("dst", d.shape, d.layout)];
                match d.kind {
                    EltwiseKind::Add => v.push(act("src2", d.shape, d.layout)),
                    EltwiseKind::Binary { rhs, .. } => {
                        v.push(act("src2", rhs.shape(d.shape), d.layout))
                    }
                    EltwiseKind::PRelu => {
                        let len = d.shape[1].div_ceil(4) * 4;
                        v.push(BufferSpec {
                            role: "slope",
                            shape: vec![d.shape[1]],
                            layout: None,
                            len,
                        });
                    }
                    EltwiseKind::Relu | EltwiseKind::Act(_) => {}
                }
                v
            }
            PrimitiveKey::Concat(d) => {
                let input = |role, c: usize| act(role, [d.mb, c, d.h, d.w], d.layout);
                let mut v = vec![input("src", d.channels[0])];
                v.push(act("dst", d.dst_shape(), d.layout));
                v.extend(d.channels[1..].iter().map(|&c| input("input", c)));
                v
            }
            PrimitiveKey::SelectChannels(d) => vec![
                act("src", [d.mb, d.c, d.h, d.w], d.layout),
                act("dst", d.dst_shape(), d.layout),
            ],
            PrimitiveKey::Resize(d) => vec![
                act("src", d.src_shape(), Layout::Nchw4c),
                act("dst", d.dst_shape(), Layout::Nchw4c),
            ],
            PrimitiveKey::ConvTranspose(d) => vec![
                act("src", d.src_shape(), Layout::Nchw4c),
                BufferSpec {
                    role: "weights",
                    shape: d.weight_shape().to_vec(),
                    layout: None,
                    len: d.packed_weights_len(),
                },
                act("dst", d.dst_shape(), Layout::Nchw4c),
            ],
            PrimitiveKey::FmaPeak(pattern) => {
                let raw = |role, len: usize| BufferSpec {
                    role,
                    shape: vec![len],
                    layout: None,
                    len,
                };
                vec![
                    raw("src", pattern.source_len()),
                    raw("dst", FMA_PEAK_ACCUMULATORS * 4),
                ]
            }
            PrimitiveKey::WidePeak { isa, pattern } => {
                let (src, dst) = pattern.buffer_lens(*isa);
                let raw = |role, len: usize| BufferSpec {
                    role,
                    shape: vec![len],
                    layout: None,
                    len,
                };
                vec![raw("src", src), raw("dst", dst)]
            }
        }
    }

    /// The bytes of activations one execution reads and writes (not weights).
    pub fn activation_bytes(&self) -> u64 {
        self.buffers()
            .iter()
            .filter(|b| b.role != "weights" && b.role != SCRATCH_ROLE)
            .map(|b| 4 * b.len as u64)
            .sum()
    }

    /// The work items of one call of this key's kernel at `extents` (`None`: the key's own).
    /// A runtime kernel's rows stay rows at any extents: [`ConvPlan::joined_rows`] joins only
    /// fixed ones, though this key at `extents` is fixed.
    pub fn work_items_at(&self, extents: Option<CallExtents>) -> usize {
        match (self, extents) {
            (PrimitiveKey::Conv(d), Some(e)) if d.algo == ConvAlgo::Direct && d.runtime.any() => {
                d.at(e.input).dst_shape()[2]
            }
            (key, Some(e)) if key.runtime_dims().any() => key.at(e).work_items(),
            (key, _) => key.work_items(),
        }
    }

    /// The extent that executions split across threads: output rows (pooled rows with a fused
    /// pool; `ConvPlan::joined_rows` rows for a 1x1 conv on narrow rows, or parts of its
    /// output-channel tiles where it joins the whole image, `ConvPlan::tiles_per_item`; for
    /// Winograd, blocks of tiles times chunks of output channels; for a global pooling,
    /// blocks of four channels).
    pub fn work_items(&self) -> usize {
        match self {
            PrimitiveKey::Conv(d) if d.algo == ConvAlgo::WinogradF4x3 => {
                WinogradPlan::new(d).work_items()
            }
            PrimitiveKey::Conv(d) => ConvPlan::work_items_of(d),
            PrimitiveKey::Pool(d) => d.oh(),
            PrimitiveKey::GlobalPool(d) => d.c.div_ceil(LANES),
            PrimitiveKey::Eltwise(d) => d.shape[2],
            PrimitiveKey::Concat(d) => d.h,
            PrimitiveKey::SelectChannels(d) => d.h,
            PrimitiveKey::Resize(d) => d.oh(),
            PrimitiveKey::ConvTranspose(d) => d.oh(),
            // The caller chooses the trip count through the range of work items.
            PrimitiveKey::FmaPeak(_) | PrimitiveKey::WidePeak { .. } => 1,
        }
    }
}
