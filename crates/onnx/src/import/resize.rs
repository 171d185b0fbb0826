//! `Resize` and `Upsample`, and the shape arithmetic that computes their sizes: `Shape` of an
//! activation, then `Gather`, `Slice`, `Unsqueeze`, `Concat` and `Cast` of the integer vector
//! it gives, folded at import into the IR's dimensions, so that a head resized to its input's
//! extents keeps them symbolic; and `Add`, `Sub`, `Mul`, `Div` of such vectors over known
//! extents, folded to numbers (the `Slice` bounds of `torch.chunk`).

use std::rc::Rc;

use primjit_ir::{
    CoordMode, Dim, NearestMode, Op, Resize, ResizeMode, ResizeSize, ScaleFactor, Value,
};

use super::{Bound, Importer, NodeResult, ShapeElem, check_attrs, int, ints, string};
use crate::tensor::ConstData;

/// The float and integer data types a `Cast` of a shape vector may go to: the vector stays
/// what it is (a `Cast` to float is how exporters feed it to `Resize`'s scales arithmetic).
const NUMERIC_TYPES: &[i64] = &[1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 16];

/// The floating-point ones among them: float, float16, double, bfloat16.
const FLOAT_TYPES: &[i64] = &[1, 10, 11, 16];

impl Importer {
    /// Input `i` as an integer vector made from shapes (or an integer constant of rank at most
    /// 1), with whether it is a scalar; `None` for anything else.
    pub(super) fn shape_vec(
        &self,
        node: &crate::proto::NodeProto,
        i: usize,
    ) -> Option<(Vec<ShapeElem>, bool)> {
        match self.bound.get(Self::input_name(node, i)?)? {
            Bound::Shape { elems, scalar, .. } => Some((elems.to_vec(), *scalar)),
            Bound::Const(c) if c.dims.len() <= 1 => match &c.data {
                ConstData::I64(v) => Some((
                    v.iter().map(|&n| ShapeElem::Int(n)).collect(),
                    c.dims.is_empty(),
                )),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether input `i` is a shape vector (not a plain constant), which makes a `Concat` or
    /// a `Slice` shape arithmetic.
    pub(super) fn is_shape(&self, node: &crate::proto::NodeProto, i: usize) -> bool {
        Self::input_name(node, i)
            .and_then(|n| self.bound.get(n))
            .is_some_and(|b| matches!(b, Bound::Shape { .. }))
    }

    /// Whether any input of `node` is a shape vector cast to a floating-point type.
    fn float_shape_input(&self, node: &crate::proto::NodeProto) -> bool {
        node.input.iter().any(|n| {
            matches!(
                self.bound.get(n.as_str()),
                Some(Bound::Shape { float: true, .. })
            )
        })
    }

    /// Binds the output of `node` to a shape vector, floating-point when an input of `node`
    /// is (the ops that pass elements on keep their type; `Cast` and `Shape` set their own).
    fn bind_shape(
        &mut self,
        node: &crate::proto::NodeProto,
        elems: Vec<ShapeElem>,
        scalar: bool,
    ) -> NodeResult<()> {
        let float = self.float_shape_input(node);
        self.bind_shape_typed(node, elems, scalar, float)
    }

    fn bind_shape_typed(
        &mut self,
        node: &crate::proto::NodeProto,
        elems: Vec<ShapeElem>,
        scalar: bool,
        float: bool,
    ) -> NodeResult<()> {
        let Some(out) = node.output.first().filter(|o| !o.is_empty()) else {
            return Err("output 0 is missing".into());
        };
        self.bound.insert(
            out.clone(),
            Bound::Shape {
                elems: Rc::new(elems),
                scalar,
                float,
            },
        );
        Ok(())
    }

    /// `Shape` of an NCHW activation: its four dimensions (from `start` to `end`, opset 15).
    pub(super) fn shape_op(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        check_attrs(node, &["start", "end"])?;
        let x = self.act(node, 0, "data")?;
        let dims = self.shape(x);
        let rank = dims.len() as i64;
        let clamp = |v: i64| {
            if v < 0 {
                (v + rank).max(0)
            } else {
                v.min(rank)
            }
        };
        let start = clamp(int(node, "start")?.unwrap_or(0));
        let end = clamp(int(node, "end")?.unwrap_or(rank));
        let elems = dims
            .iter()
            .take(end.max(start) as usize)
            .skip(start as usize)
            .map(|d| match d {
                Dim::Known(n) => ShapeElem::Int(*n as i64),
                d => ShapeElem::Dim {
                    dim: d.clone(),
                    of: x,
                },
            })
            .collect();
        self.bind_shape(node, elems, false)
    }

    /// `Gather` along axis 0 of a shape vector by constant indices.
    pub(super) fn gather(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        check_attrs(node, &["axis"])?;
        let Some((elems, false)) = self.shape_vec(node, 0) else {
            return Err(
                "input 0 (data) is not a vector of shape dimensions: only gathering from a Shape is supported"
                    .into(),
            );
        };
        if int(node, "axis")?.unwrap_or(0) != 0 {
            return Err("attribute axis must be 0 for a vector".into());
        }
        let k = self.constant_input(node, 1, "indices")?;
        let ConstData::I64(indices) = &k.data else {
            return Err("input 1 (indices) is not an integer tensor".into());
        };
        if k.dims.len() > 1 {
            return Err("input 1 (indices) must be a scalar or a vector".into());
        }
        let n = elems.len() as i64;
        let picked = indices
            .iter()
            .map(|&i| {
                let j = if i < 0 { i + n } else { i };
                (0..n)
                    .contains(&j)
                    .then(|| elems[j as usize].clone())
                    .ok_or_else(|| format!("index {i} is out of range for {n} dimensions"))
            })
            .collect::<NodeResult<Vec<_>>>()?;
        self.bind_shape(node, picked, k.dims.is_empty())
    }

    /// The `axes` of an `Unsqueeze` or a `Squeeze`: an attribute before opset 13, an optional
    /// constant input from 13; `None` where not given.
    fn axes_operand(&mut self, node: &crate::proto::NodeProto) -> NodeResult<Option<Vec<i64>>> {
        if self.opset < 13 {
            check_attrs(node, &["axes"])?;
            return ints(node, "axes");
        }
        check_attrs(node, &[])?;
        match self.optional_constant(node, 1, "axes")? {
            Some(k) => match &k.data {
                ConstData::I64(v) => Ok(Some(v.clone())),
                _ => Err("input 1 (axes) is not an integer tensor".into()),
            },
            None => Ok(None),
        }
    }

    /// `Unsqueeze` of a scalar shape element to a vector of one.
    pub(super) fn unsqueeze(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        let axes = self.axes_operand(node)?;
        let Some((elems, true)) = self.shape_vec(node, 0) else {
            return Err(
                "input 0 is not a scalar shape dimension: only unsqueezing one (as exporters do for a Resize's sizes) is supported"
                    .into(),
            );
        };
        if !matches!(axes.as_deref(), Some([0] | [-1])) {
            return Err(format!(
                "axes {axes:?}: a scalar unsqueezes along axis 0 only"
            ));
        }
        self.bind_shape(node, elems, false)
    }

    /// `Concat` of shape vectors (and integer constants) along their one axis.
    pub(super) fn shape_concat(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        check_attrs(node, &["axis"])?;
        if !matches!(int(node, "axis")?, Some(0 | -1)) {
            return Err("attribute axis must be 0 to join vectors of shape dimensions".into());
        }
        let mut elems = Vec::new();
        for i in 0..node.input.len() {
            match self.shape_vec(node, i) {
                Some((e, false)) => elems.extend(e),
                _ => {
                    return Err(format!(
                        "input {i} is not a vector of shape dimensions or integers, which the other inputs are"
                    ));
                }
            }
        }
        self.bind_shape(node, elems, false)
    }

    /// `Slice` of a shape vector (`x.shape[-2:]`), with constant bounds and step 1.
    pub(super) fn shape_slice(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        check_attrs(node, &[])?;
        let Some((elems, false)) = self.shape_vec(node, 0) else {
            return Err("input 0 (data) is not a vector of shape dimensions".into());
        };
        let ints_of = |this: &Self, i: usize, role: &str| -> NodeResult<Option<Vec<i64>>> {
            match this.optional_constant(node, i, role)? {
                None => Ok(None),
                Some(k) => match &k.data {
                    ConstData::I64(v) => Ok(Some(v.clone())),
                    _ => Err(format!("input {i} ({role}) is not an integer tensor")),
                },
            }
        };
        let (starts, ends) = (ints_of(self, 1, "starts")?, ints_of(self, 2, "ends")?);
        let (Some(&[start]), Some(&[end])) = (starts.as_deref(), ends.as_deref()) else {
            return Err("a vector of shape dimensions is sliced by one start and one end".into());
        };
        if !matches!(
            ints_of(self, 3, "axes")?.as_deref(),
            None | Some([0] | [-1])
        ) {
            return Err("a vector of shape dimensions is sliced along axis 0 only".into());
        }
        if !matches!(ints_of(self, 4, "steps")?.as_deref(), None | Some([1])) {
            return Err("only a step of 1 is supported".into());
        }
        let n = elems.len() as i64;
        let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
        let (start, end) = (clamp(start) as usize, clamp(end) as usize);
        self.bind_shape(node, elems[start..end.max(start)].to_vec(), false)
    }

    /// Input `i`, a shape vector, as numbers: an error naming the first symbolic dimension in
    /// it.
    pub(super) fn known_shape_ints(
        &self,
        node: &crate::proto::NodeProto,
        i: usize,
        role: &str,
    ) -> NodeResult<Vec<i64>> {
        let Some((elems, _)) = self.shape_vec(node, i) else {
            return Err(format!(
                "input {i} ({role}) is not a vector of shape dimensions or integers"
            ));
        };
        elems
            .iter()
            .map(|e| match e {
                ShapeElem::Int(n) => Ok(*n),
                ShapeElem::Dim { dim, .. } => Err(format!(
                    "input {i} ({role}) is computed from the symbolic dimension {dim}: only shape arithmetic over known extents is supported"
                )),
            })
            .collect()
    }

    /// `Add`, `Sub`, `Mul` or `Div` of shape vectors (or integer constants) whose elements are
    /// all known: folded at import. `torch.chunk` exports this way: the chunk size
    /// `(C + 1) / 2` from `Shape`, then the `Slice` bounds `size * 1` and `size * 2`. A symbolic
    /// dimension plus, minus, times or divided by a positive number is a dimension too
    /// ([`Self::symbolic_arith`]): torch's dynamo exporter writes a later layer's extent as
    /// `(H + a) / b + c` of the input's.
    pub(super) fn shape_arith(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        check_attrs(node, &[])?;
        if self.float_shape_input(node) {
            return Err(
                "an operand is a shape cast to a floating-point type: only integer arithmetic on shapes is supported"
                    .into(),
            );
        }
        if let Some(elems) = self.symbolic_arith(node)? {
            let scalar = self.shape_vec(node, 0).is_some_and(|(_, s)| s)
                && self.shape_vec(node, 1).is_some_and(|(_, s)| s);
            return self.bind_shape(node, elems, scalar);
        }
        let (a, b) = (
            self.known_shape_ints(node, 0, "A")?,
            self.known_shape_ints(node, 1, "B")?,
        );
        let scalar = self.shape_vec(node, 0).is_some_and(|(_, s)| s)
            && self.shape_vec(node, 1).is_some_and(|(_, s)| s);
        let n = match (a.len(), b.len()) {
            (p, q) if p == q => p,
            (1, q) => q,
            (p, 1) => p,
            (p, q) => {
                return Err(format!(
                    "the operands have {p} and {q} elements: they must have as many, or one of them one"
                ));
            }
        };
        let at = |v: &[i64], k: usize| if v.len() == 1 { v[0] } else { v[k] };
        type Checked = fn(i64, i64) -> Option<i64>;
        let (symbol, apply): (&str, Checked) = match node.op_type.as_str() {
            "Add" => ("+", i64::checked_add),
            "Sub" => ("-", i64::checked_sub),
            "Mul" => ("*", i64::checked_mul),
            // ONNX's integer Div truncates toward zero, as Rust's does; None for a zero divisor.
            _ => ("/", i64::checked_div),
        };
        let elems = (0..n)
            .map(|k| {
                let (p, q) = (at(&a, k), at(&b, k));
                apply(p, q).map(ShapeElem::Int).ok_or_else(|| {
                    if symbol == "/" && q == 0 {
                        format!("{p} / 0: division by zero")
                    } else {
                        format!("{p} {symbol} {q} overflows")
                    }
                })
            })
            .collect::<NodeResult<Vec<_>>>()?;
        self.bind_shape(node, elems, scalar)
    }

    /// [`Self::shape_arith`] of a single symbolic dimension and a number, `None` when neither
    /// operand is one symbolic dimension: `d + n`, `n + d`, `d - n`, `d * n`, `n * d` (`n` at
    /// least 1) and `d / n` (`n` at least 1, rounded down as ONNX's integer `Div` rounds a
    /// positive quotient), each a [`Dim`] built by [`Dim::plus`], [`Dim::scaled`] and
    /// [`Dim::floor_div`].
    fn symbolic_arith(&self, node: &crate::proto::NodeProto) -> NodeResult<Option<Vec<ShapeElem>>> {
        let (Some((a, _)), Some((b, _))) = (self.shape_vec(node, 0), self.shape_vec(node, 1))
        else {
            return Ok(None);
        };
        let (dim, of, n, dim_first) = match (a.as_slice(), b.as_slice()) {
            ([ShapeElem::Dim { dim, of }], [ShapeElem::Int(n)]) => (dim.clone(), *of, *n, true),
            ([ShapeElem::Int(n)], [ShapeElem::Dim { dim, of }]) => (dim.clone(), *of, *n, false),
            _ => return Ok(None),
        };
        let op = node.op_type.as_str();
        let result = match (op, dim_first) {
            ("Add", _) => dim.plus(n),
            ("Sub", true) => n.checked_neg().and_then(|m| dim.plus(m)),
            ("Mul", _) if n >= 1 => dim.scaled(n as u64),
            ("Div", true) if n >= 1 => dim.floor_div(n as u64),
            _ => {
                let (p, q) = if dim_first {
                    (dim.to_string(), n.to_string())
                } else {
                    (n.to_string(), dim.to_string())
                };
                let symbol = match op {
                    "Add" => "+",
                    "Sub" => "-",
                    "Mul" => "*",
                    _ => "/",
                };
                return Err(format!(
                    "{p} {symbol} {q}: over a symbolic dimension, only adding or subtracting a number, and multiplying or dividing by a positive one, are supported"
                ));
            }
        };
        let result = result.ok_or_else(|| format!("{dim} {op} {n} leaves no extent"))?;
        Ok(Some(vec![match result {
            Dim::Known(k) => ShapeElem::Int(k as i64),
            dim => ShapeElem::Dim { dim, of },
        }]))
    }

    /// `Squeeze` of a shape vector of one element to a scalar (torch's dynamo exporter reads a
    /// dimension as `Shape` from `start` to `end`, then `Squeeze`), or `Reshape` of a scalar or
    /// a vector of one to `[1]` or `[-1]`: the same element.
    pub(super) fn reshape_shape(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        let Some((elems, _)) = self.shape_vec(node, 0).filter(|(e, _)| e.len() == 1) else {
            return Err(format!(
                "input 0 is a shape vector of more than one element: only a {} of one is supported",
                node.op_type
            ));
        };
        if node.op_type == "Squeeze" {
            let axes = self.axes_operand(node)?;
            if !matches!(axes.as_deref(), None | Some([0] | [-1])) {
                return Err(format!(
                    "axes {axes:?}: a vector of one squeezes along axis 0 only"
                ));
            }
            return self.bind_shape(node, elems, true);
        }
        check_attrs(node, &["allowzero"])?;
        let target = self.constant_input(node, 1, "shape")?;
        if !matches!(&target.data, ConstData::I64(v) if matches!(v.as_slice(), [1] | [-1])) {
            return Err("input 1 (shape): a shape element reshapes to [1] or [-1] only".into());
        }
        self.bind_shape(node, elems, false)
    }

    /// `Cast` of a shape vector to a numeric type: the same vector.
    pub(super) fn cast(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        check_attrs(node, &["to", "saturate", "round_mode"])?;
        let Some((elems, scalar)) = self.shape_vec(node, 0).filter(|_| self.is_shape(node, 0))
        else {
            return Err(
                "input 0 is not a vector of shape dimensions: only casting one (as exporters do for a Resize's sizes) is supported"
                    .into(),
            );
        };
        let to = int(node, "to")?.ok_or("attribute to is missing")?;
        if !NUMERIC_TYPES.contains(&to) {
            return Err(format!("attribute to is {to}: a numeric type is needed"));
        }
        self.bind_shape_typed(node, elems, scalar, FLOAT_TYPES.contains(&to))
    }

    /// `Resize` (opsets 10 to 19) and `Upsample` (7 to 9): nearest or linear, over height and
    /// width only, by whole scale factors or to sizes (numbers, or dimensions of the model's
    /// tensors through `Shape`).
    pub(super) fn resize(&mut self, node: &crate::proto::NodeProto) -> NodeResult<()> {
        let upsample = node.op_type == "Upsample";
        let modern = !upsample && self.opset >= 11;
        if modern {
            check_attrs(
                node,
                &[
                    "mode",
                    "coordinate_transformation_mode",
                    "nearest_mode",
                    "cubic_coeff_a",
                    "exclude_outside",
                    "extrapolation_value",
                    "antialias",
                    "axes",
                    "keep_aspect_ratio_policy",
                ],
            )?;
        } else if upsample && self.opset < 9 {
            check_attrs(node, &["mode", "scales"])?;
        } else {
            check_attrs(node, &["mode"])?;
        }
        let x = self.act(node, 0, "X")?;
        let mode = string(node, "mode")?.unwrap_or_else(|| "nearest".into());
        let linear = match mode.as_str() {
            "nearest" => false,
            "linear" | "bilinear" if mode == "linear" || upsample => true,
            other => {
                return Err(format!(
                    "attribute mode is {other:?}: only nearest and linear are supported"
                ));
            }
        };
        let (coord, nearest) = if modern {
            let coord = string(node, "coordinate_transformation_mode")?
                .unwrap_or_else(|| "half_pixel".into());
            let Some(coord) = CoordMode::by_name(&coord) else {
                return Err(format!(
                    "attribute coordinate_transformation_mode is {coord:?}: supported are {}",
                    CoordMode::ALL.map(|m| m.name()).join(", ")
                ));
            };
            let nearest =
                string(node, "nearest_mode")?.unwrap_or_else(|| "round_prefer_floor".into());
            let Some(nearest) = NearestMode::by_name(&nearest) else {
                return Err(format!(
                    "attribute nearest_mode is {nearest:?}: supported are {}",
                    NearestMode::ALL.map(|m| m.name()).join(", ")
                ));
            };
            if int(node, "antialias")?.unwrap_or(0) != 0 && linear {
                return Err(
                    "attribute antialias is 1: antialiased resizing is not supported".into(),
                );
            }
            if let Some(axes) = ints(node, "axes")?
                && !matches!(axes.as_slice(), [2, 3] | [-2, -1])
            {
                return Err(format!(
                    "attribute axes is {axes:?}: only resizing the height and width (axes 2 and 3) is supported"
                ));
            }
            (coord, nearest)
        } else {
            // Before opset 11, coordinates are asymmetric, and onnxruntime rounds nearest ones
            // down when upsampling (by whole factors or not); when downsampling it does not,
            // which `scale_factors` refuses.
            (CoordMode::Asymmetric, NearestMode::Floor)
        };
        let mode = if linear {
            ResizeMode::Linear
        } else {
            ResizeMode::Nearest(nearest)
        };
        let xs = self.shape(x);
        let size = if upsample && self.opset < 9 {
            let scales = super::floats(node, "scales")?.ok_or("attribute scales is missing")?;
            scale_factors(&scales, false, modern)?
        } else {
            let (scales_at, sizes_at) = if modern { (2, Some(3)) } else { (1, None) };
            let scales = match self.optional_constant(node, scales_at, "scales")? {
                Some(k) if k.len() > 0 => Some(
                    k.floats()
                        .map_err(|m| format!("input {scales_at} (scales) {m}"))?
                        .to_vec(),
                ),
                _ => None,
            };
            let has_sizes = sizes_at.and_then(|i| Self::input_name(node, i)).is_some();
            match (scales, has_sizes) {
                (Some(_), true) => {
                    return Err("both scales and sizes are given: only one may be".into());
                }
                (Some(s), false) => scale_factors(&s, ints(node, "axes")?.is_some(), modern)?,
                (None, true) => {
                    let i = sizes_at.expect("modern");
                    if modern
                        && string(node, "keep_aspect_ratio_policy")?.is_some_and(|p| p != "stretch")
                    {
                        return Err(
                            "attribute keep_aspect_ratio_policy: only stretch is supported".into(),
                        );
                    }
                    let Some((elems, false)) = self.shape_vec(node, i) else {
                        return Err(format!(
                            "input {i} (sizes) is neither an integer constant nor computed from Shape by Gather, Slice, Unsqueeze, Concat and Cast"
                        ));
                    };
                    self.sizes(x, &xs, &elems, ints(node, "axes")?.is_some())?
                }
                (None, false) => return Err("neither scales nor sizes are given".into()),
            }
        };
        let op = Op::Resize(Resize {
            input: x,
            mode,
            coord,
            size,
        });
        self.push(node, op, false)
    }

    /// The output extents of sizes `elems` (four, or two with `axes`): the batch and channels
    /// must stay; the height and width are numbers, or a value of the graph with those
    /// dimensions (a graph input where one has them).
    fn sizes(
        &mut self,
        x: Value,
        xs: &[Dim],
        elems: &[ShapeElem],
        axes: bool,
    ) -> NodeResult<ResizeSize> {
        let dim = |e: &ShapeElem| match e {
            ShapeElem::Int(n) if *n >= 1 => Ok(Dim::Known(*n as u64)),
            ShapeElem::Int(n) => Err(format!("size {n} must be at least 1")),
            ShapeElem::Dim { dim, .. } => Ok(dim.clone()),
        };
        let hw = match (elems, axes) {
            ([n, c, h, w], false) => {
                for (e, axis, what) in [(n, 0, "batch"), (c, 1, "channels")] {
                    let d = dim(e)?;
                    if d != xs[axis] {
                        return Err(format!(
                            "sizes change the {what} from {} to {d}: only the height and width are resized",
                            xs[axis]
                        ));
                    }
                }
                [h, w]
            }
            ([h, w], true) => [h, w],
            _ => {
                return Err(format!(
                    "sizes have {} elements: one per dimension of the input is needed",
                    elems.len()
                ));
            }
        };
        let [h, w] = [dim(hw[0])?, dim(hw[1])?];
        if let (Dim::Known(h), Dim::Known(w)) = (&h, &w) {
            return Ok(ResizeSize::Sizes([*h, *w]));
        }
        // The value whose height and width these are: a graph input where one has them, which
        // nothing fuses away; else the tensor the Shape was of; else the latest value computed
        // so far that has them (extents from shape arithmetic, `(H + a) / b + c`, are a
        // feature map's elsewhere in the graph).
        let sources: Vec<Value> = hw
            .iter()
            .filter_map(|e| match e {
                ShapeElem::Dim { of, .. } => Some(*of),
                ShapeElem::Int(_) => None,
            })
            .collect();
        let candidates: Vec<Value> = self
            .graph
            .inputs()
            .iter()
            .map(|i| i.value)
            .chain(sources)
            .chain(std::iter::once(x))
            .chain(
                self.graph
                    .nodes()
                    .map(|(_, n)| n.result)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev(),
            )
            .collect();
        let Some(like) = candidates.into_iter().find(|&v| {
            let s = self.shape(v);
            s.len() == 4 && s[2] == h && s[3] == w
        }) else {
            return Err(format!(
                "sizes [{h}, {w}] are neither numbers nor the height and width of one tensor"
            ));
        };
        // Read for its extents until the end: no later node may fuse it away.
        *self.pending_reads.entry(like).or_default() += 1;
        Ok(ResizeSize::Like(like))
    }
}

/// `[1, 1, sh, sw]` (`[sh, sw]` with `axes`) as the IR's scale factors: whole ones, or
/// fractions `n / 2^k` (odd `n` up to 255, `k` up to 16: 0.5, 0.75, 1.5, ...), for which
/// onnxruntime's f32 extents and coordinates are exact. Factors below 1 only with
/// `downscale` (opset 11 on: before, onnxruntime's nearest rounding differs there).
fn scale_factors(scales: &[f32], axes: bool, downscale: bool) -> NodeResult<ResizeSize> {
    if !downscale && scales.iter().any(|&s| s < 1.0) {
        return Err(format!(
            "scales {scales:?}: before opset 11, only factors of at least 1 are supported"
        ));
    }
    let factor =
        |s: f32| ScaleFactor::from_f64(f64::from(s)).filter(|f| f.num() <= 65536 || !f.is_whole());
    let hw = match (scales, axes) {
        ([n, c, h, w], false) if *n == 1.0 && *c == 1.0 => Some([h, w]),
        ([h, w], true) => Some([h, w]),
        _ => None,
    };
    match hw {
        Some([h, w]) => match (factor(*h), factor(*w)) {
            (Some(h), Some(w)) => Ok(ResizeSize::Scale([h, w])),
            _ => Err(format!(
                "scales {scales:?}: the height's and width's must be whole factors up to 65536 or fractions n / 2^k (n odd, at most {}; k at most 16) such as 0.5 or 1.5 (sizes resize to any extent)",
                ScaleFactor::MAX_FRACTION_NUM
            )),
        },
        None => Err(format!(
            "scales {scales:?}: one per dimension of the input is needed, 1 for the batch and the channels"
        )),
    }
}
