//! Winograd's transforms at a wide tier: `Bᵀ d B` and `Aᵀ m A` of `lanes / 4` tiles side by
//! side, one tile's four channels in each 128-bit lane group, with the operations of the
//! 128-bit Cranelift transforms (`conv::winograd::input_1d`, `output_1d` and their stride-2
//! forms) in the same order, so that `V` and the outputs have the same bits at every tier.

use iced_x86::code_asm::{
    AsmMemoryOperand, AsmRegister64, byte_ptr, ptr, qword_ptr, r8, r9, r10, r11, rax, rcx, rdi,
    rdx, rsi, rsp, xmmword_ptr,
};

use super::{Asm, BLOCK_PIXEL_BYTES, Chain, Src, TileCode, YMM, ZMM, disp, i32_of, ok};
use crate::key::PostOpDesc;
use crate::target::Isa;

/// The transform of `lanes / 4` consecutive tiles of one tile row, for one block of four
/// channels: from the input where their windows lie inside it, else from a zeroed copy of
/// their union window.
///
/// The tile is called as `fn(src, row_bytes, v, v_point, tmp, ahead)`: the first tile's window
/// starts at `src` (rows `row_bytes` apart, pixels 16 bytes apart), each next tile's
/// `tile_step` bytes further; point `k` of the tiles goes to `v + k * v_point`, tile `t` 16
/// bytes after tile `t - 1` (`V[point][block][tile][4]`); `tmp` is `patch²` vectors of the
/// tier of scratch for the columns' transforms. The windows `ahead` bytes further (the same
/// tiles' in the next channel block, or 0) are prefetched into L1 first: a block's rows are
/// a few hundred bytes each in a different plane, too short a stream for the hardware
/// prefetchers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InputTransformTile {
    pub isa: Isa,
    /// The window's side: 6 for F(4x4, 3x3), 9 for its stride-2 polyphase form.
    pub patch: usize,
    /// Bytes from one tile's window to the next tile's: four (stride 1) or eight (stride 2)
    /// pixels.
    pub tile_step: i64,
}

impl InputTransformTile {
    /// Tiles per call: one per block of four lanes of the tier's vector.
    pub fn tiles(&self) -> usize {
        self.isa.target().lanes / 4
    }

    /// Bytes of the scratch `tmp` the call needs.
    pub fn tmp_bytes(&self) -> usize {
        self.patch * self.patch * self.isa.target().vector_bytes()
    }

    /// Whether the tier has the registers and the offsets fit 32-bit displacements.
    pub fn fits(&self) -> bool {
        let reach = (self.tiles() as i64 - 1)
            .checked_mul(self.tile_step)
            .and_then(|x| x.checked_add(self.patch as i64 * BLOCK_PIXEL_BYTES));
        self.isa != Isa::X128
            && matches!(self.patch, 6 | 9)
            && self.tile_step > 0
            && reach.is_some_and(|r| i32::try_from(r).is_ok())
            && i32::try_from(self.tmp_bytes()).is_ok()
    }

    /// The tile's machine code, for any address.
    ///
    /// # Panics
    ///
    /// If the tile does not [`fit`](Self::fits): the lowering's to rule out.
    pub fn assemble(&self) -> TileCode {
        assert!(
            self.fits(),
            "a wide input transform that does not fit its tier: {self:?}"
        );
        let mut a = Asm::new(self.isa);
        let vb = self.isa.target().vector_bytes() as i64;
        let p = self.patch;
        // Row r of the window is at `bases[r / 3] + (r % 3) * row_bytes`; `ahead` moves to
        // r11, its register (r9) being one of the bases.
        ok(a.a.mov(r11, r9));
        ok(a.a.lea(rax, ptr(rsi + rsi * 2)));
        ok(a.a.lea(r9, ptr(rdi + rax)));
        ok(a.a.lea(r10, ptr(r9 + rax)));
        let bases: [AsmRegister64; 3] = [rdi, r9, r10];
        let row = |r: usize| -> AsmMemoryOperand {
            let base = bases[r / 3];
            match r % 3 {
                0 => base + 0,
                1 => base + rsi,
                _ => base + rsi * 2,
            }
        };
        // Every line of the windows' rows ahead: one prefetch per line's bytes and one at the
        // last byte (the rows need not start on a line). `rax` is free once the bases are set.
        let span =
            self.patch as i64 * BLOCK_PIXEL_BYTES + (self.tiles() as i64 - 1) * self.tile_step;
        for r in 0..p {
            let base = bases[r / 3];
            let ahead = match r % 3 {
                0 => base + r11,
                1 => {
                    ok(a.a.lea(rax, ptr(base + rsi)));
                    rax + r11
                }
                _ => {
                    ok(a.a.lea(rax, ptr(base + rsi * 2)));
                    rax + r11
                }
            };
            let lines = (0..span).step_by(LINE_BYTES as usize).chain([span - 1]);
            for at in lines {
                ok(a.a.prefetcht0(byte_ptr(ahead + disp(at))));
            }
        }
        // Columns first, into `tmp`: point (k, c) at `tmp + (k p + c) vb`.
        for c in 0..p {
            for r in 0..p {
                let at = row(r) + disp(c as i64 * BLOCK_PIXEL_BYTES);
                a.gather_blocks_at(r, at, self.tile_step, self.isa.target().lanes / 4);
            }
            for (k, out) in self.one_d(&mut a).into_iter().enumerate() {
                a.store(r8 + disp((k * p + c) as i64 * vb), out);
            }
        }
        // Then rows, into `V`'s points in order.
        for k in 0..p {
            for c in 0..p {
                a.load(c, r8 + disp((k * p + c) as i64 * vb));
            }
            for (m, out) in self.one_d(&mut a).into_iter().enumerate() {
                if k + m > 0 {
                    ok(a.a.add(rdx, rcx));
                }
                a.store(rdx + 0, out);
            }
        }
        ok(a.a.vzeroupper());
        ok(a.a.ret());
        a.finish()
    }

    /// The form's 1-D transform of registers `0..patch`: the registers of its outputs.
    fn one_d(&self, a: &mut Asm) -> Vec<usize> {
        match self.patch {
            6 => input_1d(a).to_vec(),
            _ => input_1d_s2(a).to_vec(),
        }
    }
}

/// The output transform of `lanes / 4` consecutive whole tiles (4x4 outputs inside the image)
/// of one tile row, for one block of four output channels: `Aᵀ m A`, then the bias and the
/// post-ops in `conv::winograd::output_transform`'s order, each output pixel stored once.
///
/// The tile is called as `fn(m, m_point, dst, row_bytes, bias, tmp, residuals...)`: point `k`
/// of the tiles is at `m + k * m_point`, tile `t` 16 bytes after tile `t - 1`; the first
/// tile's pixel `(y, x)` goes to `dst + y * row_bytes + x * 16`, each next tile's 64 bytes
/// further, and its residuals are read at the same offsets from theirs (pointers after the
/// return address on the stack); `bias` holds the block's four floats (unread without a
/// bias), and `slopes_disp` bytes on a PReLU post-op's; `tmp` is `4 * patch` vectors of the
/// tier of scratch for the columns' transforms.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OutputTransformTile {
    pub isa: Isa,
    /// The window's side: 6 for F(4x4, 3x3), 9 for its stride-2 polyphase form.
    pub patch: usize,
    pub bias: bool,
    pub slopes_disp: i64,
    pub posts: Vec<PostOpDesc>,
}

/// A cache line's bytes: the unit of the input transform's prefetches.
const LINE_BYTES: i64 = 64;

/// Output pixels per tile side.
const TILE: usize = 4;
/// Bytes from one tile's outputs to the next tile's in a row: four pixels.
const TILE_BYTES: i64 = TILE as i64 * BLOCK_PIXEL_BYTES;

impl OutputTransformTile {
    /// The register the bias stays in; the transforms use 4 to 14, the post-ops 0 to 3.
    const BIAS: usize = 15;

    /// Tiles per call: one per block of four lanes of the tier's vector.
    pub fn tiles(&self) -> usize {
        self.isa.target().lanes / 4
    }

    /// Bytes of the scratch `tmp` the call needs.
    pub fn tmp_bytes(&self) -> usize {
        TILE * self.patch * self.isa.target().vector_bytes()
    }

    /// Whether the tier has the registers and the offsets fit 32-bit displacements.
    pub fn fits(&self) -> bool {
        self.isa != Isa::X128
            && matches!(self.patch, 6 | 9)
            && i32::try_from(self.tmp_bytes()).is_ok()
    }

    /// The tile's machine code, for any address.
    ///
    /// # Panics
    ///
    /// If the tile does not [`fit`](Self::fits): the lowering's to rule out.
    pub fn assemble(&self) -> TileCode {
        assert!(
            self.fits(),
            "a wide output transform that does not fit its tier: {self:?}"
        );
        let mut a = Asm::new(self.isa);
        let vb = self.isa.target().vector_bytes() as i64;
        let p = self.patch;
        // Columns first, into `tmp`: output row k of column j at `tmp + (k p + j) vb`. Point
        // `i p + j` of column j is `i` rows of `m_point * p` bytes (r11) below the column's.
        ok(a.a.imul_3(r11, rsi, i32_of(p as i64)));
        ok(a.a.mov(rax, rdi));
        for j in 0..p {
            ok(a.a.mov(r10, rax));
            for i in 0..p {
                if i > 0 {
                    ok(a.a.add(r10, r11));
                }
                a.load(4 + i, r10 + 0);
            }
            for (k, out) in self.one_d(&mut a).into_iter().enumerate() {
                a.store(r9 + disp((k * p + j) as i64 * vb), out);
            }
            ok(a.a.add(rax, rsi));
        }
        // Then rows: output row k at `dst + k * row_bytes`, row 3 through r10 = 3 row_bytes.
        ok(a.a.lea(r10, ptr(rcx + rcx * 2)));
        let row = |base: AsmRegister64, k: usize| -> AsmMemoryOperand {
            match k {
                0 => base + 0,
                1 => base + rcx,
                2 => base + rcx * 2,
                _ => base + r10,
            }
        };
        if self.bias {
            a.broadcast_block(Self::BIAS, r8 + 0);
        }
        // The transforms use registers 4 to 15: a relu's zero and a clip's bounds stay in
        // registers 0 to 2 for every value.
        let hoisted = (a.hoisted_zero(&self.posts), a.hoisted_clip(&self.posts));
        for k in 0..TILE {
            for j in 0..p {
                a.load(4 + j, r9 + disp((k * p + j) as i64 * vb));
            }
            for (col, x) in self.one_d(&mut a).into_iter().enumerate() {
                let px = disp(col as i64 * BLOCK_PIXEL_BYTES);
                if self.bias {
                    a.add(x, x, Self::BIAS);
                }
                a.post_ops(
                    &[Chain::single(x)],
                    &self.posts,
                    hoisted,
                    |a, _, r| a.broadcast_block(r, r8 + disp(self.slopes_disp)),
                    |a, _, adds, r| {
                        ok(a.a.mov(rax, qword_ptr(rsp + 8 * (adds as i32 + 1))));
                        let blocks = self.isa.target().lanes / 4;
                        a.gather_blocks_at(r, row(rax, k) + px, TILE_BYTES, blocks);
                    },
                );
                a.scatter_blocks_at(x, row(rdx, k) + px, TILE_BYTES);
            }
        }
        ok(a.a.vzeroupper());
        ok(a.a.ret());
        a.finish()
    }

    /// The form's 1-D transform of registers `4..4 + patch`: the registers of its four
    /// outputs.
    fn one_d(&self, a: &mut Asm) -> [usize; TILE] {
        match self.patch {
            6 => output_1d(a),
            _ => output_1d_s2(a),
        }
    }
}

/// `[m0 + (m1 + m2) + c, (m1 - m2) + 2 d, (m1 + m2) + 4 c, (m1 - m2) + 8 d + last]`
/// (`conv::winograd::output_rows`) with `m0` in register 4, the sum and difference of `m1`
/// and `m2` in registers `sum` and `diff` (overwritten by `o2` and `o3`), and `o1` built in
/// register `o1`: the outputs' registers.
fn output_rows(
    a: &mut Asm,
    [sum, diff]: [usize; 2],
    [c, d]: [usize; 2],
    last: usize,
    o1: usize,
) -> [usize; TILE] {
    let (c2, c4, c8) = (a.f32(2.0), a.f32(4.0), a.f32(8.0));
    let o0 = 4;
    three!(a, vaddps, o0, o0, Src::Reg(sum));
    three!(a, vaddps, o0, o0, Src::Reg(c));
    a.copy(o1, diff);
    three!(a, vfmadd231ps, o1, d, c2);
    let o2 = sum;
    three!(a, vfmadd231ps, o2, c, c4);
    let o3 = diff;
    three!(a, vfmadd231ps, o3, d, c8);
    three!(a, vaddps, o3, o3, Src::Reg(last));
    [o0, o1, o2, o3]
}

/// `Aᵀ m` of registers 4 to 9 (`conv::winograd::output_1d`).
fn output_1d(a: &mut Asm) -> [usize; TILE] {
    let [m1, m2, m3, m4, m5] = [5, 6, 7, 8, 9];
    let (c, d, sum, diff) = (10, 11, 12, 13);
    three!(a, vaddps, c, m3, Src::Reg(m4));
    three!(a, vsubps, d, m3, Src::Reg(m4));
    three!(a, vaddps, sum, m1, Src::Reg(m2));
    three!(a, vsubps, diff, m1, Src::Reg(m2));
    output_rows(a, [sum, diff], [c, d], m5, 14)
}

/// The stride-2 form's `A₂ᵀ` of registers 4 to 8 plus registers 9 to 12
/// (`conv::winograd::output_1d_s2`), the two phases' outputs summed.
fn output_1d_s2(a: &mut Asm) -> [usize; TILE] {
    let [m1, m2, m3, m4] = [5, 6, 7, 8];
    let (sum, diff) = (13, 14);
    three!(a, vaddps, sum, m1, Src::Reg(m2));
    three!(a, vsubps, diff, m1, Src::Reg(m2));
    // `o1` in m1's register, free once the sum and difference hold it.
    let out = output_rows(a, [sum, diff], [m3, m3], m4, m1);
    for (i, &o) in out.iter().enumerate() {
        three!(a, vaddps, o, o, Src::Reg(9 + i));
    }
    out
}

impl Asm {
    /// Register `r`'s lanes to the blocks of four floats at `at`, `at + step`, ...
    fn scatter_blocks_at(&mut self, r: usize, at: AsmMemoryOperand, step: i64) {
        let blocks = self.isa.target().lanes / 4;
        for j in 0..blocks {
            let m = xmmword_ptr(at + disp(j as i64 * step));
            let res = if j == 0 {
                self.a.vmovups(m, super::XMM[r])
            } else if self.isa == Isa::Avx512 {
                self.a.vextractf32x4(m, ZMM[r], j as u32)
            } else {
                self.a.vextractf128(m, YMM[r], j as u32)
            };
            ok(res);
        }
    }
}

/// `Bᵀ x` of registers 0 to 5 (`conv::winograd::input_1d`, whose `fma(c, n, s)` of a negated
/// `n` is `vfnmadd`'s `-(c n) + s`, the same bits): the outputs' registers.
fn input_1d(a: &mut Asm) -> [usize; 6] {
    let [d0, d1, d2, d3, d4, d5] = [0, 1, 2, 3, 4, 5];
    let (c4, c5, c2) = (a.f32(4.0), a.f32(-5.0), a.f32(2.0));
    // r0 = 4 d0 + (-5 d2 + d4)
    let r0 = 6;
    a.copy(r0, d4);
    three!(a, vfmadd231ps, r0, d2, c5);
    three!(a, vfmadd231ps, r0, d0, c4);
    // r1 = -4 (d1 + d2) + (d3 + d4)
    let (s, r1) = (8, 7);
    three!(a, vaddps, s, d1, Src::Reg(d2));
    three!(a, vaddps, r1, d3, Src::Reg(d4));
    three!(a, vfnmadd231ps, r1, s, c4);
    // r2 = 4 (d1 - d2) + (d4 - d3)
    let r2 = 9;
    three!(a, vsubps, s, d1, Src::Reg(d2));
    three!(a, vsubps, r2, d4, Src::Reg(d3));
    three!(a, vfmadd231ps, r2, s, c4);
    // r3 = -2 (d1 - d3) + (d4 - d2); r4 = 2 (d1 - d3) + (d4 - d2)
    let (r4, r3) = (10, 11);
    three!(a, vsubps, s, d1, Src::Reg(d3));
    three!(a, vsubps, r4, d4, Src::Reg(d2));
    a.copy(r3, r4);
    three!(a, vfnmadd231ps, r3, s, c2);
    three!(a, vfmadd231ps, r4, s, c2);
    // r5 = 4 d1 + (-5 d3 + d5), in d5's register: its last use.
    let r5 = d5;
    three!(a, vfmadd231ps, r5, d3, c5);
    three!(a, vfmadd231ps, r5, d1, c4);
    [r0, r1, r2, r3, r4, r5]
}

/// The stride-2 form's 1-D transform of registers 0 to 8 (`conv::winograd::input_1d_s2`):
/// F(4, 2)'s `B₂ᵀ` of the even positions, then the odd ones as they are.
fn input_1d_s2(a: &mut Asm) -> [usize; 9] {
    let [d0, d1, d2, d3, d4] = [0, 2, 4, 6, 8];
    let (c2, cm2, cm3) = (a.f32(2.0), a.f32(-2.0), a.f32(-3.0));
    // r3 = d3 - d1
    let r3 = 9;
    three!(a, vsubps, r3, d3, Src::Reg(d1));
    // r0 = 2 (d0 - d2) + (d3 - d1)
    let (m02, r0) = (10, 11);
    three!(a, vsubps, m02, d0, Src::Reg(d2));
    a.copy(r0, r3);
    three!(a, vfmadd231ps, r0, m02, c2);
    // r1 = -2 d1 + (d3 - d2)
    let r1 = 12;
    three!(a, vsubps, r1, d3, Src::Reg(d2));
    three!(a, vfmadd231ps, r1, d1, cm2);
    // r2 = 2 d1 + (-3 d2 + d3)
    let r2 = 13;
    a.copy(r2, d3);
    three!(a, vfmadd231ps, r2, d2, cm3);
    three!(a, vfmadd231ps, r2, d1, c2);
    // r4 = 2 (d1 - d3) + (d4 - d2)
    let (m13, r4) = (14, 15);
    three!(a, vsubps, m13, d1, Src::Reg(d3));
    three!(a, vsubps, r4, d4, Src::Reg(d2));
    three!(a, vfmadd231ps, r4, m13, c2);
    [r0, r1, r2, r3, r4, 1, 3, 5, 7]
}
