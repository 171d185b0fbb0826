//! The reference interpreter: straightforward loops with f64 accumulation, the oracle for every kernel test.
//!
//! [`conv2d`], [`pool2d`], [`global_pool`], [`relu`], [`add`], [`batchnorm`], [`activation`],
//! [`prelu`], [`binary`], [`concat()`], [`select_channels`], [`resize`] and [`conv_transpose`] compute one op each on NCHW [`Tensor`]s with ONNX
//! semantics; [`run_graph`] validates a whole
//! [`primjit_ir::Graph`] against its inputs and parameters and runs it op by op.
//!
//! # Preconditions
//!
//! The per-op functions are the oracle, so they assume valid operands: shapes as the IR's
//! shape inference accepts them (rank 4, channels divisible by `groups`, windows that fit and
//! touch the input, parameters of the right lengths). They may panic otherwise.
//! [`run_graph`] validates everything first and never panics on bad input.
//!
//! # Rounding
//!
//! Every output element is computed in f64 from the exact f32 inputs and rounded to f32 once,
//! at the end. For a convolution that means the sum of products, the bias and every post-op
//! (the residual add included) are f64 operations. `relu` and `clip` commute with rounding, so
//! a kernel that accumulates in f32 differs from the oracle only by its own accumulation
//! error plus at most one rounding of its residual add. A conv's fused `maxpool` post-op
//! pools the rounded output with [`pool2d`] ([`run_graph`] does it after [`conv2d`]); rounding
//! is monotonic, so that is the rounding of the f64 maximum, and a conv with a fused pool
//! equals the conv followed by `maxpool2d` exactly.
//!
//! NaN propagates through every op, as in PyTorch: a max over a NaN is NaN, and `relu` and
//! `clip` keep it.
#![forbid(unsafe_code)]

mod ops;
mod run;

pub use ops::{
    ConvAttrs, ConvTransposeAttrs, PoolAttrs, Post, activation, add, batchnorm, binary, concat,
    conv_transpose, conv2d, global_pool, pool2d, prelu, relu, resize, select_channels,
};
pub use primjit_ir::{
    Activation, BinaryKind, CoordMode, NearestMode, Pads, PoolKind, PoolWindow, ResizeMode, Tensor,
};
pub use run::{ReferenceError, run_graph};
