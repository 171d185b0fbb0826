//! primjit's tensor IR: a small typed graph of CNN inference ops in f32, NCHW at the interface.
//!
//! The crate knows nothing of code generation: it parses and prints the text format
//! ([`parse`], `Display` for [`Graph`]), verifies graphs and infers their shapes
//! ([`infer_shapes`]), rewrites them ([`passes`]), holds parameter values ([`Params`]), and opens the files it is given only when they
//! are regular ([`mod@file`]).
//!
//! # The text format
//!
//! ```text
//! # a comment runs to the end of the line
//! graph tiny {
//!   input %x: f32[1, 3, H, W]
//!   param @w: f32[8, 3, 3, 3]
//!   param @b: f32[8]
//!   %c = conv2d(%x, @w, bias=@b, pads=[1, 1, 1, 1], post=[relu])
//!   %p = maxpool2d(%c, kernel=[2, 2], strides=[2, 2])
//!   output y = %p
//! }
//! ```
//!
//! Values are `%name`, parameters `@name`, symbolic dimensions bare identifiers. Every
//! value is defined once, before it is used. Attributes are `key=value`; those left out take
//! the ONNX defaults, and the printer leaves out exactly those, so printing is canonical.
//!
//! `conv2d`, `maxpool2d` and `avgpool2d` take `auto_pad=same_upper` or `auto_pad=same_lower`
//! in place of `pads`: ONNX's SAME padding of a strided window over an extent known only at run
//! time, whose split depends on the extent modulo the stride. Shape inference gives the output
//! `ceil(in / stride)` (printed `(W - 1) / 2 + 1` at stride 2) and resolves the padding at each
//! bound shape ([`AutoPad`], [`Conv2d::pads_at`], [`Pool2d::window_at`]).
#![forbid(unsafe_code)]

mod auto_pad;
mod conv_transpose;
mod dim;
mod error;
pub mod file;
mod graph;
mod params;
mod parser;
pub mod passes;
mod resize;
mod shape;
mod write;

pub use auto_pad::AutoPad;
pub use conv_transpose::{ConvTranspose2d, conv_transpose_output_extent};
pub use dim::WindowError;
pub use dim::{Bindings, Dim, parse_bindings};
pub use error::{IrError, ParseError, SourceLoc, VerifyError};
pub use graph::InputData;
pub use graph::{Activation, BinaryKind};
pub use graph::{
    BatchNorm, Conv2d, DerivedParam, Graph, Node, NodeData, Op, OpKind, Pads, Param, ParamData,
    Pool2d, PoolKind, PoolWindow, PostOp, SourceShape, Value,
};
pub use params::{GraphParams, ParamError, Params, Tensor, random_tensor};
pub use parser::parse;
pub use resize::{
    CoordMode, NearestMode, Resize, ResizeMode, ResizeSize, ScaleFactor, linear_taps, nearest_index,
};
pub use shape::{
    MAX_STEP, MAX_TENSOR_ELEMENTS, Shapes, conv_output_extent, infer_shapes, pool_output_extent,
};
