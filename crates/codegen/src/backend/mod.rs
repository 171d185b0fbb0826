//! Code emitters below the plans: Cranelift for loop nests (`cranelift`) and the x86-64
//! assembler for the wide tiers' register tiles ([`x64`]).
//!
//! The lowerings build a kernel's loop nest through `cranelift::Emit`, whose vocabulary
//! (loops, addressing, loads and stores, one method per instruction) is the only way they
//! reach Cranelift: no module outside `cranelift` names a Cranelift type or builder.
//!
//! A lowering describes a register tile as data ([`x64::DirectTile`]: pixels, vectors, the
//! reduction's taps, post-ops; [`x64::GemmTile`]: Winograd's tiles by output-channel vectors;
//! [`x64::InputTransformTile`] and [`x64::OutputTransformTile`]: its transforms of a run of
//! tiles; the direct tile and the GEMM's emit their FMAs through one register tile, rows by
//! vectors, `x64::micro`) and calls it from its Cranelift loop nest; the tile's code is assembled by iced-x86 and
//! placed after the Cranelift function in the same bytes, and the calls are resolved when the
//! two are joined (`crate::compile`). A new tier or ISA is a new emitter here plus its
//! [`crate::Target`].

pub(crate) mod cranelift;
pub mod x64;
