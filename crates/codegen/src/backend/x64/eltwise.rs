//! The element-wise kernels' runs at a wide tier: an activation, PReLU or a broadcasting
//! binary op on whole wide vectors of a contiguous span, each vector with the operations of
//! the 128-bit Cranelift loop of `lower_eltwise` (the same bits), which does what is left.

use iced_x86::code_asm::{ptr, rcx, rdi, rdx, rsi};

use super::activation::{Chain, chains_per_group};
use super::{Asm, Src, TileCode, YMM, ZMM, disp, i32_of, ok};
use crate::key::{Activation, BinaryKind};
use crate::target::Isa;

/// What an [`EltwiseTile`] computes of each vector `x` and its operand `y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EltwiseOp {
    Act(Activation),
    /// `x < 0 ? x y : x`.
    PRelu,
    Binary(BinaryKind),
}

/// Where an [`EltwiseTile`]'s second operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EltwiseOperand {
    None,
    /// Four floats at `src2` (a block's per-channel values), repeated across the vector.
    Block,
    /// One float at `src2` (an NCHW plane's value), in every lane.
    Scalar,
    /// A vector of its own at `src2`, which moves with the source.
    Vector,
}

/// `vectors` whole vectors of the tier from `src` to `dst`, each `op` of the vector and its
/// operand.
///
/// The tile is called as `fn(src, dst, src2, vectors)`; `src2` is unread without an operand.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EltwiseTile {
    pub isa: Isa,
    pub op: EltwiseOp,
    pub operand: EltwiseOperand,
}

impl EltwiseTile {
    /// The operand's register (loaded once for a block or a scalar), then the vectors'.
    const OPERAND: usize = 4;
    const FIRST_VALUE: usize = 5;

    /// Vectors a trip of the main loop takes: a few for the short ops, whose loop counts
    /// otherwise; for an activation, as many chains as the registers hold, interleaved: one
    /// chain's tens of dependent instructions would leave the FMA units waiting.
    fn unroll(&self) -> usize {
        match self.op {
            EltwiseOp::Act(_) => chains_per_group(self.isa.target().vector_registers),
            _ => 4,
        }
    }

    /// Whether the tier is wide and computes the op.
    pub fn fits(&self) -> bool {
        let computed = match self.op {
            EltwiseOp::Act(_) => true,
            EltwiseOp::PRelu => !matches!(self.operand, EltwiseOperand::None),
            EltwiseOp::Binary(_) => !matches!(self.operand, EltwiseOperand::None),
        };
        self.isa != Isa::X128 && computed
    }

    /// The tile's machine code, for any address.
    ///
    /// # Panics
    ///
    /// If the tile does not [`fit`](Self::fits): the lowering's to rule out.
    pub fn assemble(&self) -> TileCode {
        assert!(
            self.fits(),
            "a wide element-wise tile that does not fit its tier: {self:?}"
        );
        let mut a = Asm::new(self.isa);
        match self.operand {
            EltwiseOperand::Block => a.broadcast_block(Self::OPERAND, rdx + 0),
            EltwiseOperand::Scalar => a.broadcast(Self::OPERAND, rdx + 0),
            EltwiseOperand::None | EltwiseOperand::Vector => {}
        }
        let unroll = self.unroll();
        let mut single = a.a.create_label();
        let mut done = a.a.create_label();
        if unroll > 1 {
            let mut top = a.a.create_label();
            ok(a.a.cmp(rcx, i32_of(unroll as i64)));
            ok(a.a.jb(single));
            ok(a.a.set_label(&mut top));
            self.trip(&mut a, unroll);
            ok(a.a.sub(rcx, i32_of(unroll as i64)));
            ok(a.a.cmp(rcx, i32_of(unroll as i64)));
            ok(a.a.jae(top));
        }
        ok(a.a.set_label(&mut single));
        ok(a.a.test(rcx, rcx));
        ok(a.a.jz(done));
        let mut one = a.a.create_label();
        ok(a.a.set_label(&mut one));
        self.trip(&mut a, 1);
        ok(a.a.dec(rcx));
        ok(a.a.jnz(one));
        ok(a.a.set_label(&mut done));
        ok(a.a.vzeroupper());
        ok(a.a.ret());
        a.finish()
    }

    /// `n` vectors: load, compute, store, then the pointers move past them.
    fn trip(&self, a: &mut Asm, n: usize) {
        let vb = self.isa.target().vector_bytes() as i64;
        if let EltwiseOp::Act(act) = self.op {
            let chains: Vec<Chain> = (0..n).map(Chain::owned).collect();
            for (u, c) in chains.iter().enumerate() {
                a.load(c.x, rdi + disp(u as i64 * vb));
            }
            a.activation(&chains, act);
            for (u, c) in chains.iter().enumerate() {
                a.store(rsi + disp(u as i64 * vb), c.x);
            }
        } else {
            for u in 0..n {
                self.binary(a, u);
            }
        }
        let step = i32_of(n as i64 * vb);
        ok(a.a.add(rdi, step));
        ok(a.a.add(rsi, step));
        if self.operand == EltwiseOperand::Vector {
            ok(a.a.add(rdx, step));
        }
    }

    /// Vector `u` of a trip of PReLU or a binary op: its load, the op with its operand, its
    /// store.
    fn binary(&self, a: &mut Asm, u: usize) {
        let vb = self.isa.target().vector_bytes() as i64;
        let x = Self::FIRST_VALUE + u;
        let at = disp(u as i64 * vb);
        a.load(x, rdi + at);
        let y = match self.operand {
            EltwiseOperand::Vector => Src::Mem(rdx + at),
            _ => Src::Reg(Self::OPERAND),
        };
        match self.op {
            EltwiseOp::Act(_) => unreachable!("activations run as chains (`trip`)"),
            EltwiseOp::PRelu => a.prelu(&[Chain::single(x)], |_| y),
            EltwiseOp::Binary(BinaryKind::Add) => three!(a, vaddps, x, x, y),
            EltwiseOp::Binary(BinaryKind::Sub) => three!(a, vsubps, x, x, y),
            EltwiseOp::Binary(BinaryKind::Mul) => three!(a, vmulps, x, x, y),
            EltwiseOp::Binary(BinaryKind::Div) => three!(a, vdivps, x, x, y),
        }
        a.store(rsi + at, x);
    }
}
