//! The register tile the wide tiers' convolution kernels share: rows by vectors of
//! accumulators, fed per reduction step by weight vectors and one broadcast per row.
//!
//! A direct convolution's tile ([`super::DirectTile`]: rows are output pixels), the Winograd
//! GEMM's ([`super::GemmTile`]: rows are transformed tiles) and `primjit peak`'s tile patterns
//! ([`super::peak_kernel`]) emit their reduction steps here and nowhere else, so the peak
//! measures the very instruction pattern the kernels run, and a change to the pattern
//! (another register assignment, another tier) is one change.

use iced_x86::code_asm::AsmMemoryOperand;

use super::{Asm, Lanes};

/// A tile of `rows` x `vectors` accumulators of the tier's width, row-major from register
/// `first`; register [`Self::BROADCAST`] takes a row's input float and registers
/// [`Self::weight`]`(0..vectors)` a step's weight vectors. The registers between those and
/// `first` are the tile's own (a direct tile's epilogue temporaries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MicroKernel {
    pub rows: usize,
    pub vectors: usize,
    pub first: usize,
}

impl MicroKernel {
    pub const BROADCAST: usize = 0;

    /// The tile with nothing of its own below the accumulators.
    pub fn packed(rows: usize, vectors: usize) -> Self {
        MicroKernel {
            rows,
            vectors,
            first: Self::weight(vectors),
        }
    }

    /// The register of weight vector `u` where a step holds them in registers.
    pub const fn weight(u: usize) -> usize {
        1 + u
    }

    /// The accumulator of row `p`, vector `u`.
    pub fn acc(&self, p: usize, u: usize) -> usize {
        self.first + p * self.vectors + u
    }

    /// Vector registers the tile takes, from register 0 to its last accumulator.
    pub fn registers(&self) -> usize {
        self.first + self.rows * self.vectors
    }

    /// Every accumulator, row-major.
    pub fn accumulators(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.rows).flat_map(move |p| (0..self.vectors).map(move |u| self.acc(p, u)))
    }

    /// Sets every accumulator to zero.
    pub fn zero(&self, a: &mut Asm) {
        for r in self.accumulators() {
            a.zero(r);
        }
    }

    /// One reduction step with its weight vectors in registers: vector `u`'s from
    /// `weights(u)` (a tail's lanes only), then per row `p` a broadcast of the float at
    /// `input(p)` multiplied into each of the row's accumulators; a row whose input is `None`
    /// (a border pixel without this tap) is left as it is. Per step, `vectors + rows` loads
    /// for `rows * vectors` FMAs.
    pub fn step(
        &self,
        a: &mut Asm,
        weights: impl Fn(usize) -> (AsmMemoryOperand, Lanes),
        input: impl Fn(usize) -> Option<AsmMemoryOperand>,
    ) {
        for u in 0..self.vectors {
            let (m, lanes) = weights(u);
            a.load_lanes(Self::weight(u), m, lanes);
        }
        for p in 0..self.rows {
            let Some(x) = input(p) else { continue };
            a.broadcast(Self::BROADCAST, x);
            for u in 0..self.vectors {
                a.fma_reg(self.acc(p, u), Self::weight(u), Self::BROADCAST);
            }
        }
    }

    /// [`Self::step`] with each FMA reading its weight vector from memory, for tiles whose
    /// accumulators leave no registers for the weights (a one-pixel tile of many vectors).
    pub fn step_weights_in_memory(
        &self,
        a: &mut Asm,
        weights: impl Fn(usize) -> (AsmMemoryOperand, Lanes),
        input: impl Fn(usize) -> Option<AsmMemoryOperand>,
    ) {
        for p in 0..self.rows {
            let Some(x) = input(p) else { continue };
            a.broadcast(Self::BROADCAST, x);
            for u in 0..self.vectors {
                let (m, lanes) = weights(u);
                a.fma_mem(self.acc(p, u), Self::BROADCAST, m, lanes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use iced_x86::code_asm::{rdi, rsi};
    use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

    use super::*;
    use crate::backend::x64::disp;
    use crate::target::Isa;

    fn step_code(isa: Isa, kernel: MicroKernel, weights_in_registers: bool) -> Vec<Instruction> {
        let mut a = Asm::new(isa);
        let weights = |u: usize| (rsi + disp(32 * u as i64), Lanes::Full);
        let input = |p: usize| Some(rdi + disp(16 * p as i64));
        if weights_in_registers {
            kernel.step(&mut a, weights, input);
        } else {
            kernel.step_weights_in_memory(&mut a, weights, input);
        }
        let code = a.finish().bytes;
        Decoder::with_ip(64, &code, 0, DecoderOptions::NONE)
            .into_iter()
            .collect()
    }

    /// The tier's vector register `r`.
    fn vector(isa: Isa, r: usize) -> Register {
        let base = match isa {
            Isa::Avx512 => Register::ZMM0,
            _ => Register::YMM0,
        };
        base + r as u32
    }

    #[test]
    fn a_step_loads_each_weight_once_and_broadcasts_once_per_row() {
        for isa in [Isa::Avx2, Isa::Avx512] {
            let kernel = MicroKernel {
                rows: 3,
                vectors: 2,
                first: 4,
            };
            let code = step_code(isa, kernel, true);
            assert_eq!(code.len(), 2 + 3 * (1 + 2), "{isa}: {code:?}");
            for (u, ins) in code[..2].iter().enumerate() {
                assert_eq!(ins.mnemonic(), Mnemonic::Vmovups);
                assert_eq!(ins.op0_register(), vector(isa, MicroKernel::weight(u)));
                assert_eq!(ins.memory_displacement64(), 32 * u as u64);
            }
            for p in 0..3 {
                let row = &code[2 + 3 * p..][..3];
                assert_eq!(row[0].mnemonic(), Mnemonic::Vbroadcastss);
                assert_eq!(row[0].op0_register(), vector(isa, MicroKernel::BROADCAST));
                assert_eq!(row[0].memory_displacement64(), 16 * p as u64);
                for (u, fma) in row[1..].iter().enumerate() {
                    assert_eq!(fma.mnemonic(), Mnemonic::Vfmadd231ps);
                    assert_eq!(fma.op0_register(), vector(isa, kernel.acc(p, u)));
                    assert_eq!(fma.op1_register(), vector(isa, MicroKernel::weight(u)));
                    assert_eq!(fma.op2_register(), vector(isa, MicroKernel::BROADCAST));
                }
            }
        }
    }

    #[test]
    fn weights_in_memory_fold_into_each_fma() {
        let kernel = MicroKernel {
            rows: 1,
            vectors: 6,
            first: 4,
        };
        let code = step_code(Isa::Avx2, kernel, false);
        assert_eq!(code.len(), 1 + 6);
        for (u, fma) in code[1..].iter().enumerate() {
            assert_eq!(fma.mnemonic(), Mnemonic::Vfmadd231ps);
            assert_eq!(fma.op0_register(), vector(Isa::Avx2, kernel.acc(0, u)));
            assert_eq!(fma.op2_kind(), OpKind::Memory);
            assert_eq!(fma.memory_displacement64(), 32 * u as u64);
        }
    }

    #[test]
    fn accumulators_are_row_major_above_the_staged_registers() {
        let kernel = MicroKernel::packed(5, 2);
        assert_eq!(kernel.first, 3, "the broadcast and two weight vectors");
        let accs: Vec<usize> = kernel.accumulators().collect();
        assert_eq!(accs, (3..13).collect::<Vec<_>>());
        assert_eq!(kernel.acc(4, 1), 12);
        assert_eq!(kernel.registers(), 13);
    }
}
