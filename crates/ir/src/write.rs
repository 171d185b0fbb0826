//! The canonical printer: `Display` for [`Graph`], the inverse of [`crate::parse`].
//!
//! Attributes equal to their defaults are left out and the rest are printed in one fixed
//! order, so that printing a parsed graph and parsing it again gives the same text. Floats use
//! Rust's shortest representation that reads back to the same `f32`.

use std::fmt::{self, Write};

use crate::graph::{Activation, DerivedParam, Graph, Op, Pads, PoolKind, PoolWindow, PostOp};
use crate::resize::{CoordMode, NearestMode, ResizeMode, ResizeSize};

/// A pooling window's attributes in their canonical order, leaving out those at their
/// defaults: shared by `maxpool2d`/`avgpool2d` and the `maxpool(...)` post-op so that the two
/// spell a window identically.
fn window_attrs(w: &PoolWindow) -> Vec<String> {
    let mut args = vec![format!("kernel=[{}, {}]", w.kernel[0], w.kernel[1])];
    if w.strides != [1, 1] {
        args.push(format!("strides=[{}, {}]", w.strides[0], w.strides[1]));
    }
    if !w.pads.is_zero() {
        let Pads {
            top,
            left,
            bottom,
            right,
        } = w.pads;
        args.push(format!("pads=[{top}, {left}, {bottom}, {right}]"));
    }
    if w.dilations != [1, 1] {
        args.push(format!(
            "dilations=[{}, {}]",
            w.dilations[0], w.dilations[1]
        ));
    }
    if w.ceil_mode {
        args.push("ceil_mode=true".to_string());
    }
    args
}

/// An activation's attributes that differ from their defaults, as `key=value`.
fn act_attrs(a: &Activation) -> Vec<String> {
    let defaults = Activation::by_name(a.name())
        .expect("every activation has a name")
        .attrs();
    a.attrs()
        .into_iter()
        .zip(defaults)
        .filter(|((_, v), (_, d))| v.to_bits() != d.to_bits())
        .map(|((k, v), _)| format!("{k}={v:?}"))
        .collect()
}

fn join<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    items.iter().map(f).collect::<Vec<_>>().join(", ")
}

impl Graph {
    fn fmt_op(&self, op: &Op) -> String {
        let v = |v: &crate::Value| format!("%{}", self.value_name(*v));
        let p = |p: &crate::Param| format!("@{}", self.param(*p).name);
        let mut args: Vec<String> = Vec::new();
        let pair = |args: &mut Vec<String>, key: &str, x: [usize; 2], default: [usize; 2]| {
            if x != default {
                args.push(format!("{key}=[{}, {}]", x[0], x[1]));
            }
        };
        let pads = |args: &mut Vec<String>, pads: &Pads| {
            if !pads.is_zero() {
                args.push(format!(
                    "pads=[{}, {}, {}, {}]",
                    pads.top, pads.left, pads.bottom, pads.right
                ));
            }
        };
        match op {
            Op::Conv2d(c) => {
                args.push(v(&c.input));
                args.push(p(&c.weight));
                if let Some(b) = &c.bias {
                    args.push(format!("bias={}", p(b)));
                }
                pair(&mut args, "strides", c.strides, [1, 1]);
                pair(&mut args, "dilations", c.dilations, [1, 1]);
                pads(&mut args, &c.pads);
                if let Some(a) = c.auto_pad {
                    args.push(format!("auto_pad={a}"));
                }
                if c.groups != 1 {
                    args.push(format!("groups={}", c.groups));
                }
                post_ops_arg(&mut args, &c.post_ops, v, p);
            }
            Op::Pool2d(pool) => {
                args.push(v(&pool.input));
                args.extend(window_attrs(&pool.window));
                if let Some(a) = pool.auto_pad {
                    args.push(format!("auto_pad={a}"));
                }
                if pool.kind == PoolKind::Avg && pool.count_include_pad {
                    args.push("count_include_pad=true".to_string());
                }
            }
            Op::GlobalPool { input, .. } | Op::Relu { input } => args.push(v(input)),
            Op::Add { lhs, rhs } => {
                args.push(v(lhs));
                args.push(v(rhs));
            }
            Op::BatchNorm(b) => {
                args.extend([v(&b.input), p(&b.scale), p(&b.bias), p(&b.mean), p(&b.var)]);
                args.push(format!("epsilon={:?}", b.epsilon));
            }
            Op::Act { act, input } => {
                args.push(v(input));
                args.extend(act_attrs(act));
            }
            Op::PRelu { input, slope } => {
                args.push(v(input));
                args.push(p(slope));
            }
            Op::Binary { lhs, rhs, .. } => {
                args.push(v(lhs));
                args.push(v(rhs));
            }
            Op::Concat { inputs } => args.extend(inputs.iter().map(v)),
            Op::SelectChannels { input, select } => {
                args.push(v(input));
                args.push(format!("select=[{}]", join(select, |c| c.to_string())));
            }
            Op::ConvTranspose(c) => {
                args.push(v(&c.input));
                args.push(p(&c.weight));
                if let Some(b) = &c.bias {
                    args.push(format!("bias={}", p(b)));
                }
                pair(&mut args, "strides", c.strides, [1, 1]);
                pair(&mut args, "dilations", c.dilations, [1, 1]);
                pads(&mut args, &c.pads);
                pair(&mut args, "output_padding", c.output_padding, [0, 0]);
                if c.groups != 1 {
                    args.push(format!("groups={}", c.groups));
                }
                post_ops_arg(&mut args, &c.post_ops, v, p);
            }
            Op::Resize(r) => {
                args.push(v(&r.input));
                if let ResizeSize::Like(like) = &r.size {
                    args.push(v(like));
                }
                match r.mode {
                    ResizeMode::Linear => args.push("mode=linear".to_string()),
                    ResizeMode::Nearest(NearestMode::RoundPreferFloor) => {}
                    ResizeMode::Nearest(m) => args.push(format!("nearest={m}")),
                }
                if r.coord != CoordMode::HalfPixel {
                    args.push(format!("coord={}", r.coord));
                }
                match r.size {
                    ResizeSize::Scale([h, w]) => args.push(format!("scale=[{h}, {w}]")),
                    ResizeSize::Sizes([h, w]) => args.push(format!("size=[{h}, {w}]")),
                    ResizeSize::Like(_) => {}
                }
            }
        }
        format!("{}({})", op.kind(), args.join(", "))
    }

    fn fmt_derived(&self, d: &DerivedParam) -> String {
        let p = |p: &crate::Param| format!("@{}", self.param(*p).name);
        match d {
            DerivedParam::BnFoldWeight {
                weight,
                scale,
                var,
                epsilon,
            } => {
                format!(
                    "bnfold_weight({}, {}, {}, epsilon={epsilon:?})",
                    p(weight),
                    p(scale),
                    p(var)
                )
            }
            DerivedParam::BnScale {
                scale,
                var,
                epsilon,
            } => format!("bn_scale({}, {}, epsilon={epsilon:?})", p(scale), p(var)),
            DerivedParam::BnFoldBias {
                conv_bias,
                scale,
                bias,
                mean,
                var,
                epsilon,
            } => {
                let mut s = format!(
                    "bnfold_bias({}, {}, {}, {}, epsilon={epsilon:?}",
                    p(scale),
                    p(bias),
                    p(mean),
                    p(var)
                );
                if let Some(b) = conv_bias {
                    let _ = write!(s, ", conv_bias={}", p(b));
                }
                s.push(')');
                s
            }
        }
    }

    /// Prints the graph with a trailing comment on each node, e.g. the node's output shape.
    pub fn display_annotated<'a>(
        &'a self,
        note: impl Fn(crate::Node) -> Option<String> + 'a,
    ) -> impl fmt::Display + 'a {
        struct Annotated<'a, F>(&'a Graph, F);
        impl<F: Fn(crate::Node) -> Option<String>> fmt::Display for Annotated<'_, F> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write(f, &self.1)
            }
        }
        Annotated(self, note)
    }

    fn write(
        &self,
        f: &mut fmt::Formatter<'_>,
        note: &dyn Fn(crate::Node) -> Option<String>,
    ) -> fmt::Result {
        writeln!(f, "graph {} {{", self.name)?;
        for input in &self.inputs {
            let dims = join(&input.shape, |d| d.to_string());
            writeln!(f, "  input %{}: f32[{dims}]", self.value_name(input.value))?;
        }
        for (_, param) in self.params() {
            let dims = join(&param.shape, |d| d.to_string());
            write!(f, "  param @{}: f32[{dims}]", param.name)?;
            if let Some(d) = &param.derived {
                write!(f, " = {}", self.fmt_derived(d))?;
            }
            writeln!(f)?;
        }
        for (id, node) in self.nodes() {
            write!(
                f,
                "  %{} = {}",
                self.value_name(node.result),
                self.fmt_op(&node.op)
            )?;
            match note(id) {
                Some(n) => writeln!(f, "  # {n}")?,
                None => writeln!(f)?,
            }
        }
        for (name, value) in &self.outputs {
            writeln!(f, "  output {name} = %{}", self.value_name(*value))?;
        }
        writeln!(f, "}}")
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, &|_| None)
    }
}

/// `post=[...]` of a conv's or a transposed conv's post-ops, where it has any.
fn post_ops_arg(
    args: &mut Vec<String>,
    posts: &[PostOp],
    v: impl Fn(&crate::Value) -> String,
    p: impl Fn(&crate::Param) -> String,
) {
    if posts.is_empty() {
        return;
    }
    let posts = join(posts, |po| match po {
        PostOp::Relu => "relu".to_string(),
        PostOp::Add(r) => format!("add({})", v(r)),
        PostOp::Clip { lo, hi } => format!("clip({lo:?}, {hi:?})"),
        PostOp::PRelu(slope) => format!("prelu({})", p(slope)),
        PostOp::MaxPool(w) => format!("maxpool({})", window_attrs(w).join(", ")),
        PostOp::Act(a) => {
            let attrs = act_attrs(a);
            if attrs.is_empty() {
                a.name().to_string()
            } else {
                format!("{}({})", a.name(), attrs.join(", "))
            }
        }
    });
    args.push(format!("post=[{posts}]"));
}
