//! Lowers primitive keys to shape-specialized x86-64 machine code through Cranelift.
//!
//! A [`PrimitiveKey`] fixes one op with every shape; [`plan`] derives its tiling and border
//! runs; the `lower_*` modules emit a Cranelift function from the plan; [`compile`] turns it
//! into relocation-free machine code, with the wide tiers' register tiles from the x64
//! backend ([`backend`]) placed after it. This crate holds no `unsafe` and maps no memory: placing
//! the code in executable pages and calling it is the runtime's job.
#![forbid(unsafe_code)]

mod approx;
pub mod backend;
mod compile;
mod contract;
pub mod conv;
pub mod key;
mod lower_conv_transpose;
mod lower_eltwise;
mod lower_fused;
mod lower_pool;
mod lower_resize;
pub mod plan;
pub mod target;
pub mod tile;

pub use backend::cranelift::HostIsa;
pub use compile::{
    CodegenError, CodegenOptions, CompiledKernel, Dumps, compile, describe_plan, host_isa,
};
pub use conv::{ConvAlgoChoice, UnknownConvAlgo, WINOGRAD_MIN_CHANNELS, WINOGRAD_S2_MIN_CHANNELS};
pub use key::ConvTransposeDesc;
pub use key::{
    Activation, BinaryKind, Broadcast, BufferSpec, CallExtents, ConcatDesc, ConvAlgo, ConvDesc,
    EltwiseDesc, EltwiseKind, FmaPattern, GlobalPoolDesc, KeyError, Layout, MAX_STEP, Pitches,
    PoolDesc, PoolWindow, PostOpDesc, PrimitiveKey, ResizeDesc, ResizeOut, SelectDesc, WidePattern,
};
pub use key::{CoordMode, NearestMode, ResizeMode, ScaleFactor};
pub use lower_conv_transpose::pack_conv_transpose_weights;
pub use lower_eltwise::{EXP_ULPS, TANH_ULPS};
pub use plan::{CHUNK_WEIGHT_BYTES, ConvPlan, PoolPlan, residual_in_place};
pub use target::{Isa, IsaError, Target};
