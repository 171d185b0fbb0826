//! The conversion: ONNX nodes, in their topological order, to primjit IR nodes.
//!
//! Each ONNX value name is bound to what it is at import time: an activation (an IR value),
//! a constant (an initializer or a `Constant` node's value), or nothing usable (a node that
//! failed). A node that fails is recorded as a [`Problem`] and the import goes on, so that
//! every unsupported node of a model is listed at once; nodes that read a failed value are
//! only reported when their own op is unsupported, so one fault is not reported again
//! downstream. After each node the partial IR graph is verified and its shapes inferred, so
//! that a shape the IR rejects is reported at the ONNX node that made it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;

use primjit_ir::{
    Activation, AutoPad, BatchNorm, BinaryKind, Bindings, Conv2d, Dim, Graph, Op, Pads, Param,
    ParamData, Params, Pool2d, PoolKind, PoolWindow, PostOp, Shapes, Tensor, Value, infer_shapes,
};

use crate::error::{OnnxError, Problem, Subject};
use crate::names::{NameKind, Namespace, Rename, sanitize_ident, sanitize_value};
use crate::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, attribute_type, data_type};
use crate::tensor::{self, Const, ConstData, ExternalFiles};

mod conv_transpose;
mod resize;

/// An imported model: the IR graph, its parameters from the model's initializers, and where
/// every IR name came from.
#[derive(Clone, Debug)]
pub struct Imported {
    pub graph: Graph,
    pub params: Params,
    /// Every IR name with the ONNX name it was made from, in the order they were made.
    pub names: Vec<Rename>,
    /// The outputs whose ONNX value is `[N, K]` (a classifier head after `Flatten`), which the
    /// IR computes as `[N, K, 1, 1]`.
    pub flattened_outputs: Vec<String>,
    /// The version of the default (`ai.onnx`) opset the model imports.
    pub opset: i64,
    /// What the model says about itself.
    pub metadata: Metadata,
}

/// What a model says about itself: its producer, name, domain, description, version and
/// free-form properties (onnxruntime's `ModelMetadata`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    pub producer_name: String,
    pub producer_version: String,
    /// The graph's name, as the model gives it (not the IR name made from it).
    pub graph_name: String,
    pub domain: String,
    /// The model's `doc_string`.
    pub description: String,
    /// The graph's `doc_string`.
    pub graph_description: String,
    /// The model's `model_version`.
    pub version: i64,
    /// The model's `metadata_props`, in the file's order.
    pub custom: Vec<(String, String)>,
}

impl Metadata {
    fn of(model: &ModelProto) -> Self {
        let graph = model.graph.as_ref();
        Metadata {
            producer_name: model.producer_name.clone(),
            producer_version: model.producer_version.clone(),
            graph_name: graph.map(|g| g.name.clone()).unwrap_or_default(),
            domain: model.domain.clone(),
            description: model.doc_string.clone(),
            graph_description: graph.map(|g| g.doc_string.clone()).unwrap_or_default(),
            version: model.model_version,
            custom: model
                .metadata_props
                .iter()
                .map(|p| (p.key.clone(), p.value.clone()))
                .collect(),
        }
    }
}

impl Imported {
    /// The IR name made from the ONNX name `onnx` of the given kind, if any.
    pub fn ir_name(&self, kind: NameKind, onnx: &str) -> Option<&str> {
        self.names
            .iter()
            .find(|r| r.kind == kind && r.onnx == onnx)
            .map(|r| r.ir.as_str())
    }

    /// The renames that changed a name: what a reader of the IR text needs to trace it back.
    pub fn changed_names(&self) -> impl Iterator<Item = &Rename> {
        self.names.iter().filter(|r| r.ir != r.onnx)
    }
}

/// What an ONNX value name stands for during the import.
#[derive(Clone, Debug)]
enum Bound {
    /// An activation. `flat`: the ONNX value is `[N, C]` (after `Flatten`), the IR value
    /// `[N, C, 1, 1]`.
    Act {
        value: Value,
        flat: bool,
    },
    Const(Rc<Const>),
    /// An NCHW activation padded with zeros on its height and width by a `Pad`, which only a
    /// `Conv` reads: the padding adds to the conv's own.
    Padded {
        value: Value,
        pads: Pads,
    },
    /// An NCHW activation's channels viewed as `[N, groups, C / groups, H, W]` by a `Reshape`,
    /// transposed to `[N, C / groups, groups, H, W]` by a `Transpose` (`transposed`): the
    /// steps of a channel shuffle, which a `Reshape` back to `[N, C, H, W]` completes.
    Grouped {
        value: Value,
        groups: usize,
        transposed: bool,
    },
    /// An integer vector (or, `scalar`, a 0-D integer) computed from activations' shapes by
    /// `Shape`, `Gather`, `Slice`, `Unsqueeze`, `Concat` and `Cast`, which only a `Resize`'s
    /// sizes and more of that arithmetic read.
    Shape {
        elems: Rc<Vec<ShapeElem>>,
        scalar: bool,
        /// Cast to a floating-point type: arithmetic on it would not be integer arithmetic
        /// (its `Div` does not truncate), so none is folded.
        float: bool,
    },
    /// Made by a node that failed: nothing downstream of it is checked again.
    Failed,
}

/// One element of a [`Bound::Shape`]: a number, or a symbolic dimension of the IR value `of`.
#[derive(Clone, Debug)]
enum ShapeElem {
    Int(i64),
    Dim { dim: Dim, of: Value },
}

/// A node's failure: the message that names the attribute or input at fault.
type NodeResult<T> = Result<T, String>;

pub(crate) fn import_model(
    model: &ModelProto,
    file: &str,
    base_dir: Option<PathBuf>,
) -> Result<Imported, OnnxError> {
    let fail = |problems| OnnxError::Problems {
        file: file.to_string(),
        problems,
    };
    let model_problem = |message: String| {
        fail(vec![Problem {
            subject: Subject::Model,
            message,
        }])
    };
    let opset = model
        .opset_import
        .iter()
        .filter(|o| is_default_domain(&o.domain))
        .map(|o| o.version)
        .max();
    let Some(opset) = opset else {
        return Err(model_problem(
            "the model imports no version of the default (ai.onnx) opset".into(),
        ));
    };
    if !(MIN_OPSET..=MAX_OPSET).contains(&opset) {
        return Err(model_problem(format!(
            "the model imports ai.onnx opset {opset}, but primjit imports opsets {MIN_OPSET} to {MAX_OPSET}"
        )));
    }
    let mut domains: HashMap<String, i64> = HashMap::new();
    for o in &model.opset_import {
        if !is_default_domain(&o.domain) {
            let v = domains.entry(o.domain.clone()).or_insert(o.version);
            *v = (*v).max(o.version);
        }
    }
    let Some(graph) = &model.graph else {
        return Err(model_problem("the model has no graph".into()));
    };
    let mut importer = Importer::new(graph, opset, domains, base_dir);
    importer.run(graph);
    if !importer.problems.is_empty() {
        return Err(fail(importer.problems));
    }
    let Importer {
        graph,
        params,
        names,
        flattened_outputs,
        ..
    } = importer;
    Ok(Imported {
        graph,
        params,
        names,
        flattened_outputs,
        opset,
        metadata: Metadata::of(model),
    })
}

/// What a parameter made from a constant is: the constant's name, the role that shaped it, its
/// shape and the scale applied to its values (an f32's bits).
type ParamOrigin = (String, &'static str, Vec<usize>, u32);

struct Importer {
    opset: i64,
    /// The version the model imports of each other domain than the default one.
    domains: HashMap<String, i64>,
    /// The index and op type of the first node of each (non-empty) node name.
    node_names: HashMap<String, (usize, String)>,
    graph: Graph,
    shapes: Option<Shapes>,
    params: Params,
    bound: HashMap<String, Bound>,
    /// How many node inputs and graph outputs read each ONNX name.
    uses: HashMap<String, usize>,
    /// How many reads are still to come of each IR value, over every ONNX name bound to it.
    pending_reads: HashMap<Value, usize>,
    /// Parameters made from constants, by constant name, the role that shaped them, their
    /// shape and the scale applied to the values (bits of an f32).
    param_of: HashMap<ParamOrigin, Param>,
    external: ExternalFiles,
    values: Namespace,
    param_names: Namespace,
    symbols: Namespace,
    outputs: Namespace,
    names: Vec<Rename>,
    problems: Vec<Problem>,
    flattened_outputs: Vec<String>,
    /// Parameters whose values are a constant's as they are (a conv's weight, a batch norm's
    /// scale): their tensors move out of the constant when the import ends, instead of being
    /// copied while it holds its own, so that the weights are never held twice.
    shared: Vec<(String, Rc<Const>)>,
}

/// A parameter's values: computed (scaled, transposed, made up) or a constant's as they are.
enum ParamValues {
    Owned(Vec<f32>),
    Shared(Rc<Const>),
}

impl Importer {
    fn new(
        g: &GraphProto,
        opset: i64,
        domains: HashMap<String, i64>,
        base_dir: Option<PathBuf>,
    ) -> Self {
        let mut uses: HashMap<String, usize> = HashMap::new();
        for node in &g.node {
            for i in node.input.iter().filter(|i| !i.is_empty()) {
                *uses.entry(i.clone()).or_default() += 1;
            }
        }
        for o in &g.output {
            *uses.entry(o.name.clone()).or_default() += 1;
        }
        let mut names = Vec::new();
        let graph_name = sanitize_ident(if g.name.is_empty() { "model" } else { &g.name });
        names.push(Rename {
            kind: NameKind::Graph,
            ir: graph_name.clone(),
            onnx: g.name.clone(),
        });
        Importer {
            opset,
            domains,
            node_names: HashMap::new(),
            graph: Graph::new(graph_name),
            shapes: None,
            params: Params::new(),
            bound: HashMap::new(),
            uses,
            pending_reads: HashMap::new(),
            param_of: HashMap::new(),
            external: ExternalFiles::new(base_dir),
            values: Namespace::default(),
            param_names: Namespace::default(),
            symbols: Namespace::default(),
            outputs: Namespace::default(),
            names,
            problems: Vec::new(),
            flattened_outputs: Vec::new(),
            shared: Vec::new(),
        }
    }

    fn problem(&mut self, subject: Subject, message: impl Into<String>) {
        self.problems.push(Problem {
            subject,
            message: message.into(),
        });
    }

    fn run(&mut self, g: &GraphProto) {
        for t in &g.initializer {
            // A second initializer of a name would silently replace the first.
            if self.bound.contains_key(&t.name) {
                self.problem(
                    Subject::Initializer(t.name.clone()),
                    "is given twice: an initializer's name must be unique",
                );
                self.bound.insert(t.name.clone(), Bound::Failed);
                continue;
            }
            match tensor::decode(t, &mut self.external) {
                Ok(c) => {
                    self.bound.insert(t.name.clone(), Bound::Const(Rc::new(c)));
                }
                Err(m) => {
                    self.problem(Subject::Initializer(t.name.clone()), m);
                    self.bound.insert(t.name.clone(), Bound::Failed);
                }
            }
        }
        for input in &g.input {
            // Before IR version 4, initializers were listed among the inputs too.
            if self.bound.contains_key(&input.name) {
                continue;
            }
            if let Err(m) = self.graph_input(input) {
                self.problem(Subject::Input(input.name.clone()), m);
                self.bound.insert(input.name.clone(), Bound::Failed);
            }
        }
        for (index, node) in g.node.iter().enumerate() {
            self.node(index, node);
        }
        for output in &g.output {
            let subject = Subject::Output(output.name.clone());
            match self.bound.get(&output.name).cloned() {
                Some(Bound::Act { value, flat }) => {
                    let name = self.outputs.fresh(sanitize_ident(&output.name));
                    self.names.push(Rename {
                        kind: NameKind::Output,
                        ir: name.clone(),
                        onnx: output.name.clone(),
                    });
                    if flat {
                        self.flattened_outputs.push(name.clone());
                    }
                    self.graph.add_output(name, value);
                }
                Some(Bound::Const(_)) => self.problem(
                    subject,
                    "is a constant: only computed outputs are supported",
                ),
                Some(Bound::Grouped { .. }) => self.problem(
                    subject,
                    "is a 5-D view of channels: only a channel shuffle (Reshape, Transpose, Reshape) is supported",
                ),
                Some(Bound::Padded { .. }) => self.problem(
                    subject,
                    "is made by a Pad: a zero Pad is only supported before a Conv, whose pads it joins",
                ),
                Some(Bound::Shape { .. }) => self.problem(
                    subject,
                    "is computed from shapes: only a Resize's sizes and a channel Slice's bounds may be",
                ),
                Some(Bound::Failed) => {}
                None => self.problem(subject, "is not defined by any node or input"),
            }
        }
        if self.graph.outputs().is_empty() && self.problems.is_empty() {
            self.problem(Subject::Model, "the graph has no outputs");
        }
        if self.problems.is_empty() {
            self.graph = compact(&self.graph);
            if let Err(e) = self.graph.verify() {
                self.problem(Subject::Model, e.to_string());
                return;
            }
            self.settle_shared();
            if let Err(e) = self.params.materialize(&self.graph) {
                // Derived (batch-norm folded) parameters get their values here.
                self.problem(Subject::Model, e.to_string());
            }
        }
    }

    /// The values of parameter `name`, whether they are its own already or still its
    /// constant's ([`ParamValues::Shared`], moved in by [`Self::settle_shared`]).
    fn param_values(&self, name: &str) -> Option<Vec<f32>> {
        match self.params.get(name) {
            Some(t) => Some(t.data.clone()),
            None => self
                .shared
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, c)| c.floats().ok().map(|v| v.to_vec())),
        }
    }

    /// Moves the values of the parameters that share a constant's into their tensors, once
    /// the bindings are no longer needed: each constant is then held by its parameters alone,
    /// and the first (usually only) one takes its values without a copy.
    fn settle_shared(&mut self) {
        self.bound.clear();
        for (name, c) in std::mem::take(&mut self.shared) {
            let shape = c.dims.clone();
            let data = match Rc::try_unwrap(c) {
                Ok(Const {
                    data: ConstData::F32(v),
                    ..
                }) => v,
                Ok(c) => c.floats().expect("shared constants are float").to_vec(),
                Err(c) => c.floats().expect("shared constants are float").to_vec(),
            };
            self.params.insert(
                name,
                Tensor::new(shape, data).expect("the data fills the shape"),
            );
        }
    }

    fn graph_input(&mut self, input: &crate::proto::ValueInfoProto) -> Result<(), String> {
        use crate::proto::tensor_shape_proto::dimension::Value as D;
        use crate::proto::type_proto::Value as T;
        let Some(T::TensorType(tt)) = input.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
            return Err("is not a tensor".into());
        };
        if tt.elem_type != data_type::FLOAT {
            return Err(format!(
                "has element type {}: only float inputs are supported",
                data_type::name(tt.elem_type)
            ));
        }
        let Some(shape) = &tt.shape else {
            return Err("has no shape: the importer needs the input's rank".into());
        };
        if shape.dim.len() != 4 {
            return Err(format!(
                "has rank {}: only rank-4 (NCHW) inputs are supported",
                shape.dim.len()
            ));
        }
        let mut dims = Vec::new();
        let mut elements: u64 = 1;
        for (axis, d) in shape.dim.iter().enumerate() {
            if let Some(D::DimValue(n)) = &d.value {
                elements = elements.saturating_mul((*n).max(1) as u64);
            }
            dims.push(match &d.value {
                Some(D::DimValue(n)) if *n >= 1 => Dim::Known(*n as u64),
                Some(D::DimValue(n)) => {
                    return Err(format!("dimension {axis} is {n}: it must be at least 1"));
                }
                Some(D::DimParam(p)) if !p.is_empty() => Dim::Sym(self.symbol(p)),
                _ => {
                    // An unnamed dimension: a symbol of its own, named after the input.
                    let made = format!("{}_dim{axis}", input.name);
                    Dim::Sym(self.symbol(&made))
                }
            });
        }
        if elements > primjit_ir::MAX_TENSOR_ELEMENTS {
            return Err(format!(
                "has more than {} elements",
                primjit_ir::MAX_TENSOR_ELEMENTS
            ));
        }
        let name = self.values.fresh(sanitize_value(&input.name));
        let value = self
            .graph
            .add_input(name.clone(), dims)
            .ok_or("its name is taken")?;
        self.names.push(Rename {
            kind: NameKind::Value,
            ir: name,
            onnx: input.name.clone(),
        });
        self.bind_act(&input.name, value, false);
        Ok(())
    }

    /// The IR symbol for an ONNX `dim_param`: the same for every use of one name.
    fn symbol(&mut self, onnx: &str) -> String {
        if let Some(r) = self
            .names
            .iter()
            .find(|r| r.kind == NameKind::Symbol && r.onnx == onnx)
        {
            return r.ir.clone();
        }
        let ir = self.symbols.fresh(sanitize_ident(onnx));
        self.names.push(Rename {
            kind: NameKind::Symbol,
            ir: ir.clone(),
            onnx: onnx.to_string(),
        });
        ir
    }

    fn bind_act(&mut self, onnx: &str, value: Value, flat: bool) {
        *self.pending_reads.entry(value).or_default() += self.uses.get(onnx).copied().unwrap_or(0);
        self.bound
            .insert(onnx.to_string(), Bound::Act { value, flat });
    }

    fn node(&mut self, index: usize, node: &NodeProto) {
        let default_domain = is_default_domain(&node.domain);
        let domain_opset = if default_domain {
            Some(self.opset)
        } else {
            self.domains.get(&node.domain).copied()
        };
        let subject = Subject::Node {
            name: if node.name.is_empty() {
                format!("#{index}")
            } else {
                node.name.clone()
            },
            op_type: node.op_type.clone(),
            domain: node.domain.clone(),
            opset: domain_opset,
        };
        let supported = default_domain && SUPPORTED.contains(&node.op_type.as_str());
        // A node's name is unique when it has one (onnxruntime refuses a model otherwise); the
        // second node of a name is the one at fault.
        let first_of_name = if node.name.is_empty() {
            None
        } else {
            match self.node_names.get(&node.name) {
                Some(first) => Some(first.clone()),
                None => {
                    self.node_names
                        .insert(node.name.clone(), (index, node.op_type.clone()));
                    None
                }
            }
        };
        let inputs_failed = node
            .input
            .iter()
            .any(|i| matches!(self.bound.get(i), Some(Bound::Failed)));
        // A value is defined once (ONNX graphs are in SSA form): a second definition would
        // replace the first for every later reader.
        let redefined = node
            .output
            .iter()
            .find(|o| !o.is_empty() && self.bound.contains_key(*o));
        let result = if let Some((first, first_op)) = first_of_name {
            Err(format!(
                "node #{index} has the name of node #{first} ({first_op}): node names must be unique"
            ))
        } else if !supported {
            Err(match domain_opset {
                _ if default_domain => "unsupported op".to_string(),
                Some(_) => "unsupported op: only ops of the default (ai.onnx) domain are supported"
                    .to_string(),
                None => format!(
                    "unsupported op of the domain {}, which the model does not import: only ops of the default (ai.onnx) domain are supported",
                    node.domain
                ),
            })
        } else if let Some(o) = redefined {
            Err(format!(
                "output {o:?} is already defined: a value is defined once"
            ))
        } else if inputs_failed {
            // Reported where it failed; this node cannot be checked further.
            self.fail_outputs(node);
            return;
        } else {
            self.convert(node)
        };
        // Every read of the node's inputs has now happened.
        for i in node.input.iter().filter(|i| !i.is_empty()) {
            if let Some(
                Bound::Act { value, .. }
                | Bound::Padded { value, .. }
                | Bound::Grouped { value, .. },
            ) = self.bound.get(i)
                && let Some(n) = self.pending_reads.get_mut(value)
            {
                *n = n.saturating_sub(1);
            }
        }
        if let Err(message) = result {
            self.problem(subject, message);
            self.fail_outputs(node);
        }
    }

    fn fail_outputs(&mut self, node: &NodeProto) {
        for o in node.output.iter().filter(|o| !o.is_empty()) {
            self.bound.insert(o.clone(), Bound::Failed);
        }
    }

    fn convert(&mut self, node: &NodeProto) -> NodeResult<()> {
        // An input past the op's last is an invalid model, and ignoring it would compute
        // something else than the file asks (an `Add` of three inputs as one of two).
        let (most, more_from) = max_inputs(&node.op_type, self.opset);
        if node.input.len() > most {
            return Err(format!(
                "{} inputs, but {} takes at most {most}{}",
                node.input.len(),
                node.op_type,
                more_from.map_or(String::new(), |v| format!(" before opset {v}"))
            ));
        }
        check_attr_opsets(node, self.opset)?;
        match node.op_type.as_str() {
            "Conv" => self.conv(node),
            "ConvTranspose" => self.conv_transpose(node),
            "MaxPool" => self.pool(node, PoolKind::Max),
            "AveragePool" => self.pool(node, PoolKind::Avg),
            "GlobalAveragePool" => self.global_pool(node, PoolKind::Avg),
            "GlobalMaxPool" => self.global_pool(node, PoolKind::Max),
            "Relu" => {
                check_attrs(node, &[])?;
                let (x, flat) = self.act_any(node, 0, "X")?;
                self.push(node, Op::Relu { input: x }, flat)
            }
            "Add" | "Sub" | "Mul" | "Div" if (0..2).any(|i| self.is_shape(node, i)) => {
                self.shape_arith(node)
            }
            "Add" => self.add(node),
            "Sigmoid" | "HardSigmoid" | "HardSwish" | "Tanh" | "LeakyRelu" | "Elu" | "Exp" => {
                self.activation(node)
            }
            "PRelu" => self.prelu(node),
            "Mul" | "Sub" | "Div" => self.binary(node),
            "ReduceMean" | "ReduceMax" => self.reduce(node),
            "Concat" if (0..node.input.len()).any(|i| self.is_shape(node, i)) => {
                self.shape_concat(node)
            }
            "Concat" => self.concat(node),
            "Pad" => self.pad(node),
            "Split" => self.split(node),
            "Slice" if self.opset >= 10 && self.is_shape(node, 0) => self.shape_slice(node),
            "Slice" => self.slice(node),
            "Shape" => self.shape_op(node),
            "Gather" => self.gather(node),
            "Unsqueeze" => self.unsqueeze(node),
            "Cast" => self.cast(node),
            "Resize" | "Upsample" => self.resize(node),
            "Clip" => self.clip(node),
            "BatchNormalization" => self.batchnorm(node),
            "Identity" | "Dropout" => self.identity(node),
            "Flatten" => self.flatten(node),
            "Reshape" | "Squeeze" if self.is_shape(node, 0) => self.reshape_shape(node),
            "Reshape" | "Squeeze" | "Transpose" => self.reshape_flat(node),
            "Gemm" | "MatMul" => self.dense(node),
            "Constant" => self.constant(node),
            _ => unreachable!("SUPPORTED lists every op converted here"),
        }
    }

    // ---- operands -------------------------------------------------------------------------

    fn input_name(node: &NodeProto, i: usize) -> Option<&str> {
        node.input
            .get(i)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    fn bound_input(&self, node: &NodeProto, i: usize, role: &str) -> NodeResult<Bound> {
        let Some(name) = Self::input_name(node, i) else {
            return Err(format!("input {i} ({role}) is missing"));
        };
        self.bound
            .get(name)
            .cloned()
            .ok_or_else(|| format!("input {i} ({role}) {name:?} is not defined before its use"))
    }

    /// An activation input, flattened or not.
    fn act_any(&self, node: &NodeProto, i: usize, role: &str) -> NodeResult<(Value, bool)> {
        match self.bound_input(node, i, role)? {
            Bound::Act { value, flat } => Ok((value, flat)),
            Bound::Const(_) => Err(format!(
                "input {i} ({role}) is a constant: only computed tensors are supported there"
            )),
            Bound::Grouped { .. } => Err(format!(
                "input {i} ({role}) is a 5-D view of channels: only a channel shuffle (Reshape, Transpose, Reshape) is supported"
            )),
            Bound::Padded { .. } => Err(format!(
                "input {i} ({role}) is made by a Pad: a zero Pad is only supported before a Conv, whose pads it joins"
            )),
            Bound::Shape { .. } => Err(format!(
                "input {i} ({role}) is computed from shapes: only a Resize's sizes and a channel Slice's bounds may be"
            )),
            Bound::Failed => unreachable!("nodes reading failed values are skipped"),
        }
    }

    /// An NCHW activation input.
    fn act(&self, node: &NodeProto, i: usize, role: &str) -> NodeResult<Value> {
        match self.act_any(node, i, role)? {
            (v, false) => Ok(v),
            (_, true) => Err(format!(
                "input {i} ({role}) is a flattened [N, C] tensor: only NCHW tensors are supported there"
            )),
        }
    }

    fn constant_input(&self, node: &NodeProto, i: usize, role: &str) -> NodeResult<Rc<Const>> {
        match self.bound_input(node, i, role)? {
            Bound::Const(c) => Ok(c),
            Bound::Act { .. }
            | Bound::Padded { .. }
            | Bound::Grouped { .. }
            | Bound::Shape { .. } => Err(format!(
                "input {i} ({role}) is computed: it must be a constant (an initializer or a Constant node)"
            )),
            Bound::Failed => unreachable!("nodes reading failed values are skipped"),
        }
    }

    fn optional_constant(
        &self,
        node: &NodeProto,
        i: usize,
        role: &str,
    ) -> NodeResult<Option<Rc<Const>>> {
        match Self::input_name(node, i) {
            None => Ok(None),
            Some(_) => self.constant_input(node, i, role).map(Some),
        }
    }

    fn shape(&self, v: Value) -> Vec<Dim> {
        self.shapes
            .as_ref()
            .and_then(|s| s.get(v))
            .map(<[Dim]>::to_vec)
            .unwrap_or_else(|| {
                // Graph inputs are known before any node is verified.
                self.graph
                    .inputs()
                    .iter()
                    .find(|i| i.value == v)
                    .map(|i| i.shape.clone())
                    .unwrap_or_default()
            })
    }

    /// A parameter holding `data` with `shape`, named after the constant `c`, whose values
    /// `scale` multiplied; one parameter per constant, `role`, shape and scale (the same
    /// weights used twice are one parameter, and a Gemm's `B` shared with another `alpha` is
    /// another).
    fn param(
        &mut self,
        c: &Const,
        role: &'static str,
        scale: f32,
        shape: Vec<usize>,
        data: Vec<f32>,
    ) -> Param {
        self.param_with(c, role, scale, shape, ParamValues::Owned(data))
    }

    /// [`Self::param`] with values that may be the constant's own ([`ParamValues::Shared`]).
    fn param_with(
        &mut self,
        c: &Const,
        role: &'static str,
        scale: f32,
        shape: Vec<usize>,
        data: ParamValues,
    ) -> Param {
        let origin = (c.name.clone(), role, shape.clone(), scale.to_bits());
        if let Some(&p) = self.param_of.get(&origin) {
            return p;
        }
        let name = self.param_names.fresh(sanitize_value(&c.name));
        let p = self
            .graph
            .add_param(ParamData {
                name: name.clone(),
                shape: shape.clone(),
                derived: None,
                loc: None,
            })
            .expect("fresh parameter names are unique");
        match data {
            ParamValues::Owned(data) => self.params.insert(
                name.clone(),
                Tensor::new(shape, data).expect("the data fills the shape"),
            ),
            ParamValues::Shared(c) => self.shared.push((name.clone(), c)),
        }
        self.names.push(Rename {
            kind: NameKind::Param,
            ir: name,
            onnx: c.name.clone(),
        });
        self.param_of.insert(origin, p);
        p
    }

    /// A float constant of exactly `shape` as a parameter.
    fn param_exact(
        &mut self,
        c: &Rc<Const>,
        i: usize,
        role: &'static str,
        shape: &[usize],
    ) -> NodeResult<Param> {
        c.floats().map_err(|m| format!("input {i} ({role}) {m}"))?;
        if c.dims != shape {
            return Err(format!(
                "input {i} ({role}) has shape {:?}, expected {shape:?}",
                c.dims
            ));
        }
        let values = ParamValues::Shared(c.clone());
        Ok(self.param_with(c, role, 1.0, shape.to_vec(), values))
    }

    // ---- emitting --------------------------------------------------------------------------

    /// Appends `op` as the node defining the node's first output, verified with the nodes
    /// before it.
    fn push(&mut self, node: &NodeProto, op: Op, flat: bool) -> NodeResult<()> {
        let onnx = node.output.first().map(String::as_str).unwrap_or("");
        if onnx.is_empty() {
            return Err("output 0 is missing".into());
        }
        self.push_as(onnx, op, flat)
    }

    /// [`Self::push`] defining the ONNX value `onnx` (one output of a node with several).
    fn push_as(&mut self, onnx: &str, op: Op, flat: bool) -> NodeResult<()> {
        let name = self.values.fresh(sanitize_value(onnx));
        let mut trial = self.graph.clone();
        let value = trial
            .add_node(name.clone(), op)
            .expect("fresh value names are unique");
        let shapes = infer_shapes(&trial, &Bindings::new()).map_err(|e| e.message)?;
        self.graph = trial;
        self.shapes = Some(shapes);
        self.names.push(Rename {
            kind: NameKind::Value,
            ir: name,
            onnx: onnx.to_string(),
        });
        self.bind_act(onnx, value, flat);
        Ok(())
    }

    /// Replaces the op of the node defining `value` (its post-ops grew), keeping every value.
    fn replace_op(&mut self, value: Value, op: Op) -> NodeResult<()> {
        self.rebuild(&[(value, Some(op))])
    }

    /// Rebuilds the graph with the ops of the nodes defining the given values replaced, or
    /// removed for `None` (the value stays, defined by nothing, until [`compact`]), keeping
    /// every value's number.
    fn rebuild(&mut self, edits: &[(Value, Option<Op>)]) -> NodeResult<()> {
        let old = &self.graph;
        let mut g = Graph::new(old.name());
        for input in old.inputs() {
            g.add_input(old.value_name(input.value), input.shape.clone())
                .expect("names were unique");
        }
        for (_, p) in old.params() {
            g.add_param(p.clone()).expect("names were unique");
        }
        let mut defined: Vec<Value> = old.inputs().iter().map(|i| i.value).collect();
        defined.extend(old.nodes().map(|(_, n)| n.result));
        for v in old.values() {
            let name = old.value_name(v);
            let node = old.nodes().find(|(_, n)| n.result == v).map(|(_, n)| n);
            let new = match (node, edits.iter().find(|(e, _)| *e == v)) {
                // An input, added above.
                (None, _) if old.inputs().iter().any(|i| i.value == v) => continue,
                (None, _) | (Some(_), Some((_, None))) => g.add_value(name),
                (Some(_), Some((_, Some(op)))) => g.add_node(name, op.clone()),
                (Some(n), None) => g.add_node(name, n.op.clone()),
            };
            debug_assert_eq!(new, Some(v), "values are numbered in the same order");
        }
        for (name, v) in old.outputs() {
            g.add_output(name.clone(), *v);
        }
        let shapes = infer_shapes(&g, &Bindings::new()).map_err(|e| e.message)?;
        self.graph = g;
        self.shapes = Some(shapes);
        Ok(())
    }

    /// The batch-norm defining `v` and the post-op-free conv it normalizes, when `v` has no
    /// reader left but the current node and the conv's result none but the batch-norm.
    fn sole_conv_batchnorm(&self, v: Value) -> Option<(Value, Conv2d, BatchNorm)> {
        if self.pending_reads.get(&v) != Some(&1) {
            return None;
        }
        let bn = self.graph.nodes().find_map(|(_, n)| match &n.op {
            Op::BatchNorm(b) if n.result == v => Some(b.clone()),
            _ => None,
        })?;
        if self.pending_reads.get(&bn.input).copied().unwrap_or(0) != 0 {
            return None;
        }
        let conv = self.graph.nodes().find_map(|(_, n)| match &n.op {
            Op::Conv2d(c) if n.result == bn.input && c.post_ops.is_empty() => Some(c.clone()),
            _ => None,
        })?;
        Some((bn.input, conv, bn))
    }

    /// `conv` with `bn` folded into it through derived parameters (`bnfold_weight`,
    /// `bnfold_bias`), as `passes::fold_batchnorm` folds them.
    fn fold_batchnorm(&mut self, conv: Conv2d, bn: &BatchNorm) -> Conv2d {
        let w = self.graph.param(conv.weight).name.clone();
        let names = [
            self.param_names.fresh(format!("{w}.bnfold")),
            self.param_names.fresh(format!("{w}.bnfold_bias")),
        ];
        primjit_ir::passes::fold_batchnorm_params(&mut self.graph, conv, bn, names)
    }

    /// The conv defining `v`, when its result has no reader left but the current node.
    fn sole_conv(&self, v: Value) -> Option<Conv2d> {
        if self.pending_reads.get(&v) != Some(&1) {
            return None;
        }
        self.graph.nodes().find_map(|(_, n)| match &n.op {
            Op::Conv2d(c) if n.result == v => Some(c.clone()),
            _ => None,
        })
    }

    fn alias(&mut self, node: &NodeProto, b: Bound) -> NodeResult<()> {
        let Some(out) = node.output.first().filter(|o| !o.is_empty()) else {
            return Err("output 0 is missing".into());
        };
        match b {
            Bound::Act { value, flat } => self.bind_act(out, value, flat),
            Bound::Padded { value, .. } | Bound::Grouped { value, .. } => {
                *self.pending_reads.entry(value).or_default() +=
                    self.uses.get(out.as_str()).copied().unwrap_or(0);
                self.bound.insert(out.clone(), b);
            }
            other => {
                self.bound.insert(out.clone(), other);
            }
        }
        Ok(())
    }

    // ---- ops -------------------------------------------------------------------------------

    fn conv(&mut self, node: &NodeProto) -> NodeResult<()> {
        check_attrs(
            node,
            &[
                "auto_pad",
                "dilations",
                "group",
                "kernel_shape",
                "pads",
                "strides",
            ],
        )?;
        // A zero Pad before the conv joins its pads.
        let (x, extra) = match self.bound_input(node, 0, "X")? {
            Bound::Padded { value, pads } => (value, pads),
            _ => (self.act(node, 0, "X")?, Pads::default()),
        };
        let w = self.constant_input(node, 1, "W")?;
        if w.dims.len() != 4 {
            return Err(format!(
                "input 1 (W) has rank {}: only 2-D convolutions (rank-4 weights) are supported",
                w.dims.len()
            ));
        }
        let kernel = [w.dims[2], w.dims[3]];
        if kernel.contains(&0) {
            return Err(format!(
                "input 1 (W) has shape {:?}: the kernel must be at least 1x1",
                w.dims
            ));
        }
        if let Some(ks) = ints(node, "kernel_shape")?
            && ks != [kernel[0] as i64, kernel[1] as i64]
        {
            return Err(format!(
                "attribute kernel_shape {ks:?} differs from the weight's kernel {kernel:?}"
            ));
        }
        let groups = positive(int(node, "group")?.unwrap_or(1), "group")?;
        let mut x_shape = self.shape(x);
        if !extra.is_zero() && x_shape.len() == 4 {
            // auto_pad sees the padded extents.
            let grow = |d: &Dim, n: usize| match d.known() {
                Some(k) => Dim::Known(k + n as u64),
                None => d.clone(),
            };
            x_shape[2] = grow(&x_shape[2], extra.top + extra.bottom);
            x_shape[3] = grow(&x_shape[3], extra.left + extra.right);
        }
        let (mut win, auto_pad) = window(node, &x_shape, kernel, false)?;
        if let Some(mode) = auto_pad
            && !extra.is_zero()
        {
            // The IR's auto_pad takes no explicit pads beside it.
            return Err(format!(
                "attribute auto_pad {} with strides {:?} after a Pad needs a known input height and width",
                mode.name().to_uppercase(),
                win.strides
            ));
        }
        let add = |a: usize, b: usize| a.checked_add(b).ok_or("the padding overflows");
        win.pads = Pads {
            top: add(win.pads.top, extra.top)?,
            left: add(win.pads.left, extra.left)?,
            bottom: add(win.pads.bottom, extra.bottom)?,
            right: add(win.pads.right, extra.right)?,
        };
        let weight = self.param_exact(&w, 1, "W", &w.dims.clone())?;
        let bias = match self.optional_constant(node, 2, "B")? {
            Some(b) => Some(self.param_exact(&b, 2, "B", &[w.dims[0]])?),
            None => None,
        };
        self.push(
            node,
            Op::Conv2d(Conv2d {
                input: x,
                weight,
                bias,
                strides: win.strides,
                dilations: win.dilations,
                pads: win.pads,
                auto_pad,
                groups,
                post_ops: Vec::new(),
            }),
            false,
        )
    }

    fn pool(&mut self, node: &NodeProto, kind: PoolKind) -> NodeResult<()> {
        let mut allowed = vec![
            "auto_pad",
            "ceil_mode",
            "dilations",
            "kernel_shape",
            "pads",
            "strides",
        ];
        match kind {
            PoolKind::Max => allowed.push("storage_order"),
            PoolKind::Avg => allowed.push("count_include_pad"),
        }
        check_attrs(node, &allowed)?;
        if kind == PoolKind::Max {
            if node.output.get(1).is_some_and(|o| !o.is_empty()) {
                return Err("output 1 (Indices) is not supported".into());
            }
            if int(node, "storage_order")?.unwrap_or(0) != 0 {
                return Err("attribute storage_order=1 is not supported".into());
            }
        }
        let x = self.act(node, 0, "X")?;
        let Some(ks) = ints(node, "kernel_shape")? else {
            return Err("attribute kernel_shape is missing".into());
        };
        if ks.len() != 2 {
            return Err(format!(
                "attribute kernel_shape {ks:?}: only 2-D pooling is supported"
            ));
        }
        let kernel = [
            positive(ks[0], "kernel_shape")?,
            positive(ks[1], "kernel_shape")?,
        ];
        let ceil_mode = match int(node, "ceil_mode")?.unwrap_or(0) {
            0 => false,
            1 => true,
            v => return Err(format!("attribute ceil_mode is {v}: it must be 0 or 1")),
        };
        let count_include_pad = match int(node, "count_include_pad")?.unwrap_or(0) {
            0 => false,
            1 => true,
            v => {
                return Err(format!(
                    "attribute count_include_pad is {v}: it must be 0 or 1"
                ));
            }
        };
        let x_shape = self.shape(x);
        let (window, auto_pad) = window(node, &x_shape, kernel, ceil_mode)?;
        self.push(
            node,
            Op::Pool2d(Pool2d {
                kind,
                input: x,
                window,
                auto_pad,
                count_include_pad,
            }),
            false,
        )
    }

    fn global_pool(&mut self, node: &NodeProto, kind: PoolKind) -> NodeResult<()> {
        check_attrs(node, &[])?;
        let x = self.act(node, 0, "X")?;
        self.push(node, Op::GlobalPool { kind, input: x }, false)
    }

    fn add(&mut self, node: &NodeProto) -> NodeResult<()> {
        check_attrs(node, &[])?;
        let a = self.bound_input(node, 0, "A")?;
        let b = self.bound_input(node, 1, "B")?;
        match (a, b) {
            (Bound::Act { value: x, flat: fx }, Bound::Act { value: y, flat: fy })
                if fx == fy && self.broadcasts(x, y).or(self.broadcasts(y, x)).is_some() =>
            {
                self.binary(node)
            }
            (Bound::Act { value, flat: true }, Bound::Const(_))
            | (Bound::Const(_), Bound::Act { value, flat: true })
                if self.sole_conv(value).is_none_or(|c| c.bias.is_some()) =>
            {
                self.binary(node)
            }
            (Bound::Act { flat: false, .. }, Bound::Const(_))
            | (Bound::Const(_), Bound::Act { flat: false, .. }) => self.binary(node),
            (Bound::Act { value: x, flat: fx }, Bound::Act { value: y, flat: fy }) => {
                let (sx, sy) = (self.shape(x), self.shape(y));
                if fx != fy
                    || sx.len() != sy.len()
                    || sx.iter().zip(&sy).any(|(p, q)| p.provably_differs(q))
                {
                    return Err(format!(
                        "the operands have shapes {} and {}: only equal shapes are supported (no broadcasting)",
                        describe(&sx, fx),
                        describe(&sy, fy)
                    ));
                }
                self.push(node, Op::Add { lhs: x, rhs: y }, fx)
            }
            (Bound::Act { value, flat: true }, Bound::Const(c))
            | (Bound::Const(c), Bound::Act { value, flat: true }) => {
                // `MatMul` then `Add` of a bias: the bias of the dense layer's conv.
                let Some(conv) = self.sole_conv(value).filter(|c| c.bias.is_none()) else {
                    return Err(
                        "adding a constant is only supported as the bias of a MatMul read by nothing else"
                            .into(),
                    );
                };
                let k = self.graph.param(conv.weight).shape[0];
                let data = c.floats().map_err(|m| format!("the constant operand {m}"))?;
                if c.len() != k || c.dims.iter().rev().skip(1).any(|&d| d != 1) {
                    return Err(format!(
                        "the constant operand has shape {:?}: a bias of the {k} outputs is needed",
                        c.dims
                    ));
                }
                let data = data.to_vec();
                let bias = self.param(&c, "dense bias", 1.0, vec![k], data);
                self.replace_op(
                    value,
                    Op::Conv2d(Conv2d {
                        bias: Some(bias),
                        ..conv
                    }),
                )?;
                self.alias(node, Bound::Act { value, flat: true })
            }
            _ => Err("adding a constant to an NCHW tensor is not supported: only the sum of two computed tensors of equal shapes".into()),
        }
    }

    /// Whether `y` is `x` broadcast: `[N, C, 1, 1]` or `[1, C, 1, 1]` beside `x`'s
    /// `[N, C, H, W]`, and not of `x`'s own shape.
    fn broadcasts(&self, x: Value, y: Value) -> Option<()> {
        let (sx, sy) = (self.shape(x), self.shape(y));
        let one = Dim::Known(1);
        let same = sx.len() == sy.len() && sx.iter().zip(&sy).all(|(a, b)| a == b);
        (sx.len() == 4
            && sy.len() == 4
            && !same
            && sy[2] == one
            && sy[3] == one
            && sy[1] == sx[1]
            && sx[1].known().is_some()
            && (sy[0] == one || sy[0] == sx[0]))
            .then_some(())
    }

    fn activation(&mut self, node: &NodeProto) -> NodeResult<()> {
        let finite = |v: f32, name: &str| -> NodeResult<f32> {
            if v.is_finite() {
                Ok(v)
            } else {
                Err(format!(
                    "attribute {name} is {v}: it must be a finite number"
                ))
            }
        };
        let attr = |name: &str, default: f32| -> NodeResult<f32> {
            finite(float(node, name)?.unwrap_or(default), name)
        };
        let act = match node.op_type.as_str() {
            "HardSigmoid" => {
                check_attrs(node, &["alpha", "beta"])?;
                Activation::HardSigmoid {
                    alpha: attr("alpha", 0.2)?,
                    beta: attr("beta", 0.5)?,
                }
            }
            "LeakyRelu" => {
                check_attrs(node, &["alpha"])?;
                Activation::LeakyRelu {
                    alpha: attr("alpha", 0.01)?,
                }
            }
            "Elu" => {
                check_attrs(node, &["alpha"])?;
                Activation::Elu {
                    alpha: attr("alpha", 1.0)?,
                }
            }
            other => {
                check_attrs(node, &[])?;
                if other == "HardSwish" && self.opset < 14 {
                    return Err("HardSwish is only defined from opset 14 on".into());
                }
                match other {
                    "Sigmoid" => Activation::Sigmoid,
                    "HardSwish" => Activation::HardSwish,
                    "Tanh" => Activation::Tanh,
                    _ => Activation::Exp,
                }
            }
        };
        let (x, flat) = self.act_any(node, 0, "X")?;
        self.push(node, Op::Act { act, input: x }, flat)
    }

    /// `c`'s values as one per channel of an activation with `channels` channels (`flat`: an
    /// `[N, C]` tensor, else `[N, C, H, W]`), when `c` broadcasts to it along the channels
    /// only: a scalar, or `C` values on the channel axis (`[C]` beside `[N, C]`, `[C, 1, 1]` or
    /// `[1, C, 1, 1]` beside `[N, C, H, W]`).
    fn channel_constant(c: &Const, channels: usize, flat: bool) -> Option<Vec<f32>> {
        let v = c.floats().ok()?;
        let rank = if flat { 2 } else { 4 };
        if c.dims.len() > rank {
            return None;
        }
        if v.len() == 1 {
            return Some(vec![v[0]; channels]);
        }
        let offset = rank - c.dims.len();
        let per_channel = v.len() == channels
            && c.dims
                .iter()
                .enumerate()
                .all(|(i, &d)| d == 1 || (i + offset == 1 && d == channels));
        per_channel.then(|| v.to_vec())
    }

    fn prelu(&mut self, node: &NodeProto) -> NodeResult<()> {
        check_attrs(node, &[])?;
        let (x, flat) = self.act_any(node, 0, "X")?;
        let slope = self.constant_input(node, 1, "slope")?;
        let channels = self
            .shape(x)
            .get(1)
            .and_then(Dim::known)
            .ok_or("the input's channel count must be known")? as usize;
        let Some(values) = Self::channel_constant(&slope, channels, flat) else {
            return Err(format!(
                "input 1 (slope) has shape {:?}: one slope, or one per channel, is supported",
                slope.dims
            ));
        };
        if values.iter().all(|&v| v.to_bits() == values[0].to_bits()) && values[0].is_finite() {
            let act = Activation::LeakyRelu { alpha: values[0] };
            return self.push(node, Op::Act { act, input: x }, flat);
        }
        if values.iter().any(|v| !v.is_finite()) {
            return Err("input 1 (slope) holds a value that is not finite".into());
        }
        let param = self.param(&slope, "slope", 1.0, vec![channels], values);
        self.push(
            node,
            Op::PRelu {
                input: x,
                slope: param,
            },
            flat,
        )
    }

    /// `Mul(x, Sigmoid(x))` as SiLU and `Mul(x, HardSigmoid(x, 1/6, 1/2))` as HardSwish, when
    /// nothing else reads the gate: the gate's node becomes the fused activation.
    fn gated(&mut self, node: &NodeProto, x: Value, gate: Value, flat: bool) -> NodeResult<bool> {
        if self.pending_reads.get(&gate) != Some(&1) {
            return Ok(false);
        }
        let fused = self.graph.nodes().find_map(|(_, n)| match n.op {
            Op::Act { act, input } if n.result == gate && input == x => match act {
                Activation::Sigmoid => Some(Activation::Silu),
                Activation::HardSigmoid { alpha, beta } if alpha == 1.0 / 6.0 && beta == 0.5 => {
                    Some(Activation::HardSwish)
                }
                _ => None,
            },
            _ => None,
        });
        let Some(act) = fused else {
            return Ok(false);
        };
        self.replace_op(gate, Op::Act { act, input: x })?;
        self.alias(node, Bound::Act { value: gate, flat })?;
        Ok(true)
    }

    /// `Add`, `Sub`, `Mul` and `Div`: of two activations of one shape, or with the right
    /// one (either, for `Add` and `Mul`) broadcast from `[N, C, 1, 1]` or `[1, C, 1, 1]`; or
    /// of an activation and a constant that broadcasts along channels, which becomes a
    /// per-channel affine map (folded into the conv before it when that conv has no post-op,
    /// else a depthwise 1x1 conv).
    fn binary(&mut self, node: &NodeProto) -> NodeResult<()> {
        check_attrs(node, &[])?;
        let kind = match node.op_type.as_str() {
            "Add" => BinaryKind::Add,
            "Sub" => BinaryKind::Sub,
            "Mul" => BinaryKind::Mul,
            _ => BinaryKind::Div,
        };
        let a = self.bound_input(node, 0, "A")?;
        let b = self.bound_input(node, 1, "B")?;
        match (a, b) {
            (Bound::Act { value: x, flat: fx }, Bound::Act { value: y, flat: fy }) => {
                let (sx, sy) = (self.shape(x), self.shape(y));
                if fx != fy {
                    return Err(format!(
                        "the operands have shapes {} and {}: a flattened tensor only meets one of its own shape",
                        describe(&sx, fx),
                        describe(&sy, fy)
                    ));
                }
                if kind == BinaryKind::Mul
                    && (self.gated(node, x, y, fx)? || self.gated(node, y, x, fx)?)
                {
                    return Ok(());
                }
                // Symbolic extents may turn out equal at run time, but one of 1 against a
                // symbol is a broadcast (squeeze-excitation's `scale * x` at symbolic H, W),
                // never an equal shape: broadcasts are recognized first.
                let one = Dim::Known(1);
                let compatible =
                    |p: &Dim, q: &Dim| p == q || (!p.provably_differs(q) && *p != one && *q != one);
                let same = sx.len() == sy.len() && sx.iter().zip(&sy).all(|(p, q)| compatible(p, q));
                let commutes = matches!(kind, BinaryKind::Add | BinaryKind::Mul);
                let (lhs, rhs) = if self.broadcasts(x, y).is_some() {
                    (x, y)
                } else if commutes && self.broadcasts(y, x).is_some() {
                    (y, x)
                } else if same {
                    (x, y)
                } else {
                    return Err(format!(
                        "the operands have shapes {} and {}: only equal shapes, or a right operand of [N, C, 1, 1] or [1, C, 1, 1]{}, are supported",
                        describe(&sx, fx),
                        describe(&sy, fy),
                        if commutes { " (or a left one)" } else { "" }
                    ));
                };
                let op = match kind {
                    BinaryKind::Add if same => Op::Add { lhs, rhs },
                    _ => Op::Binary { kind, lhs, rhs },
                };
                self.push(node, op, fx)
            }
            (Bound::Act { value: x, flat }, Bound::Const(c)) => {
                self.affine(node, kind, x, flat, &c, true)
            }
            (Bound::Const(c), Bound::Act { value: x, flat }) => {
                self.affine(node, kind, x, flat, &c, false)
            }
            (Bound::Const(_), Bound::Const(_)) => {
                Err("both operands are constants: constant folding is not supported".into())
            }
            (Bound::Grouped { .. }, _) | (_, Bound::Grouped { .. }) => Err(
                "an operand is a 5-D view of channels: only a channel shuffle is supported".into(),
            ),
            (Bound::Padded { .. }, _) | (_, Bound::Padded { .. }) => Err(
                "an operand is made by a Pad: a zero Pad is only supported before a Conv, whose pads it joins"
                    .into(),
            ),
            (Bound::Shape { .. }, _) | (_, Bound::Shape { .. }) => Err(
                "an operand is computed from shapes: arithmetic on shapes is not supported (only Gather, Slice, Unsqueeze, Concat and Cast into a Resize's sizes)"
                    .into(),
            ),
            (Bound::Failed, _) | (_, Bound::Failed) => {
                unreachable!("nodes reading failed values are skipped")
            }
        }
    }

    /// `x kind c` (`c_right`) or `c kind x` for a constant `c` along channels, as `x * a + b`
    /// per channel.
    fn affine(
        &mut self,
        node: &NodeProto,
        kind: BinaryKind,
        x: Value,
        flat: bool,
        c: &Const,
        c_right: bool,
    ) -> NodeResult<()> {
        let channels = self
            .shape(x)
            .get(1)
            .and_then(Dim::known)
            .ok_or("the input's channel count must be known")? as usize;
        let side = if c_right { 1 } else { 0 };
        let Some(v) = Self::channel_constant(c, channels, flat) else {
            return Err(format!(
                "input {side} is a constant of shape {:?}: only a scalar or one value per channel is supported",
                c.dims
            ));
        };
        let (scale, shift): (Vec<f32>, Vec<f32>) = match (kind, c_right) {
            (BinaryKind::Add, _) => (vec![1.0; channels], v),
            (BinaryKind::Mul, _) => (v, vec![0.0; channels]),
            (BinaryKind::Sub, true) => (vec![1.0; channels], v.iter().map(|x| -x).collect()),
            (BinaryKind::Sub, false) => (vec![-1.0; channels], v),
            (BinaryKind::Div, true) => (v.iter().map(|x| 1.0 / x).collect(), vec![0.0; channels]),
            (BinaryKind::Div, false) => {
                return Err("dividing a constant by a computed tensor is not supported".into());
            }
        };
        if scale.iter().chain(&shift).any(|v| !v.is_finite()) {
            return Err(format!(
                "input {side} holds a constant that makes the scale or shift not finite"
            ));
        }
        let out = node.output.first().cloned().unwrap_or_default();
        // Into the conv before, when nothing else reads it and its parameters are values.
        if let Some(mut conv) = self.sole_conv(x).filter(|c| {
            c.post_ops.is_empty()
                && self.graph.param(c.weight).derived.is_none()
                && c.bias.is_none_or(|b| self.graph.param(b).derived.is_none())
        }) {
            let w = self.graph.param(conv.weight);
            let (wname, wshape) = (w.name.clone(), w.shape.clone());
            let weights = self.param_values(&wname).expect("imported weights");
            let per_out = weights.len() / channels.max(1);
            let data: Vec<f32> = weights
                .iter()
                .enumerate()
                .map(|(i, &w)| w * scale[i / per_out])
                .collect();
            let bias: Vec<f32> = (0..channels)
                .map(|o| {
                    let b = conv.bias.map_or(0.0, |b| {
                        let name = &self.graph.param(b).name;
                        self.param_values(name).expect("imported bias")[o]
                    });
                    b * scale[o] + shift[o]
                })
                .collect();
            let made = |name: String, dims: Vec<usize>, data: Vec<f32>| Const {
                name,
                dims,
                data: ConstData::F32(data),
            };
            let wc = made(format!("{wname}.{out}"), wshape.clone(), data.clone());
            conv.weight = self.param(&wc, "folded affine weight", 1.0, wshape, data);
            let bc = made(format!("{out}.bias"), vec![channels], bias.clone());
            conv.bias = Some(self.param(&bc, "folded affine bias", 1.0, vec![channels], bias));
            self.replace_op(x, Op::Conv2d(conv))?;
            return self.alias(node, Bound::Act { value: x, flat });
        }
        // A depthwise 1x1 conv: x * scale + shift per channel.
        let wc = Const {
            name: format!("{out}.scale"),
            dims: vec![channels, 1, 1, 1],
            data: ConstData::F32(scale.clone()),
        };
        let weight = self.param(&wc, "affine scale", 1.0, vec![channels, 1, 1, 1], scale);
        let bc = Const {
            name: format!("{out}.shift"),
            dims: vec![channels],
            data: ConstData::F32(shift.clone()),
        };
        let bias = self.param(&bc, "affine shift", 1.0, vec![channels], shift);
        self.push(
            node,
            Op::Conv2d(Conv2d::per_channel(x, weight, bias, channels)),
            flat,
        )
    }

    /// `ReduceMean` and `ReduceMax` over the height and width: a global pool, `[N, C]`
    /// (flattened) without `keepdims`.
    fn reduce(&mut self, node: &NodeProto) -> NodeResult<()> {
        let kind = if node.op_type == "ReduceMax" {
            PoolKind::Max
        } else {
            PoolKind::Avg
        };
        let axes = if self.opset < 18 {
            check_attrs(node, &["axes", "keepdims"])?;
            ints(node, "axes")?
        } else {
            check_attrs(node, &["keepdims", "noop_with_empty_axes"])?;
            match self.optional_constant(node, 1, "axes")? {
                Some(c) => match &c.data {
                    ConstData::I64(v) => Some(v.clone()),
                    _ => return Err("input 1 (axes) is not an integer tensor".into()),
                },
                None => None,
            }
        };
        let keepdims = match int(node, "keepdims")?.unwrap_or(1) {
            0 => false,
            1 => true,
            v => return Err(format!("attribute keepdims is {v}: it must be 0 or 1")),
        };
        let (x, flat) = self.act_any(node, 0, "data")?;
        let axes = axes.unwrap_or_default();
        if axes.is_empty() {
            if int(node, "noop_with_empty_axes")?.unwrap_or(0) == 1 {
                return self.alias(node, Bound::Act { value: x, flat });
            }
            return Err(
                "without axes, the reduction is over every dimension: only reducing the height and width (axes 2 and 3) is supported"
                    .into(),
            );
        }
        if flat {
            return Err(
                "the input is flat: only reducing an image's height and width is supported".into(),
            );
        }
        let mut norm: Vec<i64> = axes
            .iter()
            .map(|&a| if a < 0 { a + 4 } else { a })
            .collect();
        norm.sort_unstable();
        if norm != [2, 3] {
            return Err(format!(
                "axes {axes:?}: only reducing the height and width (axes 2 and 3) is supported"
            ));
        }
        self.push(node, Op::GlobalPool { kind, input: x }, !keepdims)
    }

    /// `Concat` along channels (axis 1) of activations of one batch, height and width, or of
    /// flattened `[N, C]` tensors along their features.
    fn concat(&mut self, node: &NodeProto) -> NodeResult<()> {
        check_attrs(node, &["axis"])?;
        let Some(axis) = int(node, "axis")? else {
            return Err("attribute axis is missing".into());
        };
        if node.input.is_empty() {
            return Err("there are no inputs".into());
        }
        let mut inputs = Vec::new();
        let mut flats = Vec::new();
        for i in 0..node.input.len() {
            let (v, flat) = self.act_any(node, i, "inputs")?;
            inputs.push(v);
            flats.push(flat);
        }
        let flat = flats[0];
        if flats.iter().any(|&f| f != flat) {
            return Err("the inputs mix flattened [N, C] tensors and images".into());
        }
        if axis < 0 && self.opset < 11 {
            return Err(format!(
                "attribute axis is {axis}: negative axes are only defined from opset 11 on"
            ));
        }
        let channel_axis = if flat { [1, -1] } else { [1, -3] };
        if !channel_axis.contains(&axis) {
            return Err(format!(
                "attribute axis is {axis}: only concatenating channels (axis 1) is supported"
            ));
        }
        self.push(node, Op::Concat { inputs }, flat)
    }

    /// `Pad` with zeros on the height and width, which a `Conv` reading it takes into its own
    /// pads; other modes and values, and pads of the batch or channels, are refused.
    fn pad(&mut self, node: &NodeProto) -> NodeResult<()> {
        let (pads, value) = if self.opset < 11 {
            check_attrs(node, &["mode", "pads", "value"])?;
            (
                ints(node, "pads")?.ok_or("attribute pads is missing")?,
                float(node, "value")?.unwrap_or(0.0),
            )
        } else {
            check_attrs(node, &["mode"])?;
            if Self::input_name(node, 3).is_some() {
                return Err("input 3 (axes) is not supported: give pads for every axis".into());
            }
            let p = self.constant_input(node, 1, "pads")?;
            let ConstData::I64(p) = &p.data else {
                return Err("input 1 (pads) is not an integer tensor".into());
            };
            let value = match self.optional_constant(node, 2, "constant_value")? {
                None => 0.0,
                Some(c) => match c.floats() {
                    Ok([v]) => *v,
                    _ => {
                        return Err("input 2 (constant_value) is not a float scalar".into());
                    }
                },
            };
            (p.clone(), value)
        };
        let mode = string(node, "mode")?.unwrap_or_else(|| "constant".into());
        if mode != "constant" {
            return Err(format!(
                "attribute mode is {mode}: only constant (zero) padding before a Conv is supported"
            ));
        }
        if value != 0.0 {
            return Err(format!(
                "the constant value is {value}: only zero padding before a Conv is supported"
            ));
        }
        let x = self.act(node, 0, "data")?;
        let [n0, c0, top, left, n1, c1, bottom, right] = pads.as_slice() else {
            return Err(format!(
                "pads {pads:?}: eight values (begin and end of each axis of an NCHW tensor) are needed"
            ));
        };
        if [n0, c0, n1, c1].iter().any(|&&p| p != 0) {
            return Err(format!(
                "pads {pads:?}: only the height and width may be padded"
            ));
        }
        let side = |p: i64| {
            usize::try_from(p)
                .map_err(|_| format!("pads {pads:?}: negative pads (cropping) are not supported"))
        };
        let pads = Pads {
            top: side(*top)?,
            left: side(*left)?,
            bottom: side(*bottom)?,
            right: side(*right)?,
        };
        self.alias(node, Bound::Padded { value: x, pads })
    }

    /// The input's channel count, for ops that split channels.
    fn channel_count(&self, x: Value) -> NodeResult<usize> {
        self.shape(x)
            .get(1)
            .and_then(Dim::known)
            .map(|c| c as usize)
            .ok_or_else(|| "the input's channel count must be known".to_string())
    }

    /// `Split` along channels: each output is a `select_channels` of its range.
    fn split(&mut self, node: &NodeProto) -> NodeResult<()> {
        let allowed: &[&str] = if self.opset >= 18 {
            &["axis", "num_outputs"]
        } else if self.opset >= 13 {
            &["axis"]
        } else {
            &["axis", "split"]
        };
        check_attrs(node, allowed)?;
        let (x, flat) = self.act_any(node, 0, "input")?;
        let axis = int(node, "axis")?.unwrap_or(0);
        let channel_axis = if flat { [1, -1] } else { [1, -3] };
        if !channel_axis.contains(&axis) {
            return Err(format!(
                "attribute axis is {axis}: only splitting channels (axis 1) is supported"
            ));
        }
        let c = self.channel_count(x)?;
        let outputs = node.output.len();
        let sizes: Vec<i64> = if self.opset >= 13 {
            match self.optional_constant(node, 1, "split")? {
                Some(k) => match &k.data {
                    ConstData::I64(v) => v.clone(),
                    _ => return Err("input 1 (split) is not an integer tensor".into()),
                },
                None => Vec::new(),
            }
        } else {
            ints(node, "split")?.unwrap_or_default()
        };
        let sizes: Vec<usize> = if sizes.is_empty() {
            let parts = int(node, "num_outputs")?.map_or(outputs, |n| n.max(0) as usize);
            if parts == 0 || parts != outputs {
                return Err(format!("{outputs} outputs for {parts} parts"));
            }
            // Equal parts, the last smaller when they do not divide (opset 18's rule).
            let part = c.div_ceil(parts);
            (0..parts)
                .map(|i| part.min(c.saturating_sub(i * part)))
                .collect()
        } else {
            sizes
                .iter()
                .map(|&s| {
                    usize::try_from(s)
                        .map_err(|_| format!("split sizes {sizes:?} must not be negative"))
                })
                .collect::<Result<_, _>>()?
        };
        if sizes.len() != outputs || sizes.iter().sum::<usize>() != c || sizes.contains(&0) {
            return Err(format!(
                "split sizes {sizes:?} for {outputs} outputs: they must be positive and add up to the {c} channels"
            ));
        }
        let mut start = 0;
        for (o, &size) in node.output.iter().zip(&sizes) {
            if !o.is_empty() {
                let select = (start..start + size).collect();
                self.push_as(o, Op::SelectChannels { input: x, select }, flat)?;
            }
            start += size;
        }
        Ok(())
    }

    /// `Slice` of channels with step 1: a `select_channels` of the range.
    fn slice(&mut self, node: &NodeProto) -> NodeResult<()> {
        let ints_of = |this: &Self, i: usize, role: &str| -> NodeResult<Option<Vec<i64>>> {
            if this.is_shape(node, i) {
                // Bounds computed from known extents (`torch.chunk`'s).
                return this.known_shape_ints(node, i, role).map(Some);
            }
            match this.optional_constant(node, i, role)? {
                None => Ok(None),
                Some(k) => match &k.data {
                    ConstData::I64(v) => Ok(Some(v.clone())),
                    _ => Err(format!("input {i} ({role}) is not an integer tensor")),
                },
            }
        };
        let (starts, ends, axes, steps) = if self.opset < 10 {
            check_attrs(node, &["starts", "ends", "axes"])?;
            (
                ints(node, "starts")?,
                ints(node, "ends")?,
                ints(node, "axes")?,
                None,
            )
        } else {
            check_attrs(node, &[])?;
            (
                ints_of(self, 1, "starts")?,
                ints_of(self, 2, "ends")?,
                ints_of(self, 3, "axes")?,
                ints_of(self, 4, "steps")?,
            )
        };
        let (Some(starts), Some(ends)) = (starts, ends) else {
            return Err("the starts and ends are missing".into());
        };
        let (x, flat) = self.act_any(node, 0, "data")?;
        let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let channel_axis = if flat { [1, -1] } else { [1, -3] };
        let ([start], [end], [axis]) = (starts.as_slice(), ends.as_slice(), axes.as_slice()) else {
            return Err(format!(
                "axes {axes:?}: only slicing the channels (axis 1) alone is supported"
            ));
        };
        if !channel_axis.contains(axis) {
            return Err(format!(
                "axes {axes:?}: only slicing the channels (axis 1) alone is supported"
            ));
        }
        if steps.is_some_and(|s| s != [1]) {
            return Err("only a step of 1 is supported".into());
        }
        let c = self.channel_count(x)? as i64;
        let clamp = |v: i64| if v < 0 { (v + c).max(0) } else { v.min(c) };
        let (start, end) = (clamp(*start), clamp(*end));
        if start >= end {
            return Err(format!(
                "the slice [{start}, {end}) of {c} channels is empty"
            ));
        }
        let select = (start as usize..end as usize).collect();
        self.push(node, Op::SelectChannels { input: x, select }, flat)
    }

    fn clip(&mut self, node: &NodeProto) -> NodeResult<()> {
        let (lo, hi) = if self.opset < 11 {
            check_attrs(node, &["min", "max"])?;
            (
                float(node, "min")?.unwrap_or(f32::MIN),
                float(node, "max")?.unwrap_or(f32::MAX),
            )
        } else {
            check_attrs(node, &[])?;
            let bound = |this: &Self, i: usize, role: &str, default: f32| -> NodeResult<f32> {
                match this.optional_constant(node, i, role)? {
                    None => Ok(default),
                    Some(c) => {
                        let v = c.floats().map_err(|m| format!("input {i} ({role}) {m}"))?;
                        match v {
                            [v] => Ok(*v),
                            _ => Err(format!(
                                "input {i} ({role}) has shape {:?}: a scalar is needed",
                                c.dims
                            )),
                        }
                    }
                }
            };
            (
                bound(self, 1, "min", f32::MIN)?,
                bound(self, 2, "max", f32::MAX)?,
            )
        };
        if lo.is_nan() || hi.is_nan() {
            return Err("min and max must be numbers, found NaN".into());
        }
        if lo == 0.0 && hi >= f32::MAX {
            // `Clip(min=0)` is relu, which passes +Inf on; clipped at the largest finite bound
            // below, it came out 3.4e38.
            let (x, flat) = self.act_any(node, 0, "input")?;
            return self.push(node, Op::Relu { input: x }, flat);
        }
        // The IR's text has no infinities; the largest finite bounds clip alike for finite
        // inputs.
        let (lo, hi) = (lo.max(f32::MIN), hi.min(f32::MAX));
        if lo > hi {
            return Err(format!("min ({lo}) is greater than max ({hi})"));
        }
        let (x, flat) = self.act_any(node, 0, "input")?;
        if let Some(mut conv) = self.sole_conv(x) {
            // The clip becomes the conv's post-op: the conv's value now holds the clipped
            // tensor.
            conv.post_ops.push(PostOp::Clip { lo, hi });
            self.replace_op(x, Op::Conv2d(conv))?;
            return self.alias(node, Bound::Act { value: x, flat });
        }
        if let Some((c, conv, bn)) = self.sole_conv_batchnorm(x) {
            // conv, batch-norm, clip (MobileNet's unfolded Conv-BN-ReLU6): the batch-norm is
            // folded into the conv here, so that the clip can be its post-op.
            let mut conv = self.fold_batchnorm(conv, &bn);
            conv.post_ops.push(PostOp::Clip { lo, hi });
            self.rebuild(&[(c, Some(Op::Conv2d(conv))), (x, None)])?;
            return self.alias(node, Bound::Act { value: c, flat });
        }
        // The IR has clip only as a conv post-op: a depthwise 1x1 conv with unit weights
        // copies its input exactly (x * 1 + 0) and clips it.
        let shape = self.shape(x);
        let Some(c) = shape.get(1).and_then(Dim::known).map(|c| c as usize) else {
            return Err("the input's channel count must be known".into());
        };
        let ones = Const {
            name: format!(
                "{}.identity",
                node.output.first().cloned().unwrap_or_default()
            ),
            dims: vec![c, 1, 1, 1],
            data: ConstData::F32(vec![1.0; c]),
        };
        let weight = self.param(&ones, "clip identity", 1.0, vec![c, 1, 1, 1], vec![1.0; c]);
        self.push(
            node,
            Op::Conv2d(Conv2d {
                input: x,
                weight,
                bias: None,
                strides: [1, 1],
                dilations: [1, 1],
                pads: Pads::default(),
                auto_pad: None,
                groups: c,
                post_ops: vec![PostOp::Clip { lo, hi }],
            }),
            flat,
        )
    }

    fn batchnorm(&mut self, node: &NodeProto) -> NodeResult<()> {
        check_attrs(
            node,
            &[
                "epsilon",
                "momentum",
                "spatial",
                "training_mode",
                "is_test",
                "consumed_inputs",
            ],
        )?;
        if int(node, "training_mode")?.unwrap_or(0) != 0 {
            return Err("attribute training_mode=1 is not supported: inference only".into());
        }
        if int(node, "spatial")?.unwrap_or(1) != 1 {
            return Err("attribute spatial=0 is not supported".into());
        }
        if let Some(i) = node.output.iter().skip(1).position(|o| !o.is_empty()) {
            return Err(format!(
                "output {} is only computed in training mode: not supported",
                i + 1
            ));
        }
        let (x, flat) = self.act_any(node, 0, "X")?;
        let c = match self.shape(x).get(1).and_then(Dim::known) {
            Some(c) => c as usize,
            None => return Err("the input's channel count must be known".into()),
        };
        let mut p = Vec::new();
        for (i, role) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
            let k = self.constant_input(node, i, role)?;
            p.push(self.param_exact(&k, i, role, &[c])?);
        }
        let epsilon = float(node, "epsilon")?.unwrap_or(1e-5);
        self.push(
            node,
            Op::BatchNorm(BatchNorm {
                input: x,
                scale: p[0],
                bias: p[1],
                mean: p[2],
                var: p[3],
                epsilon,
            }),
            flat,
        )
    }

    fn identity(&mut self, node: &NodeProto) -> NodeResult<()> {
        if node.op_type == "Dropout" {
            check_attrs(node, &["ratio", "seed", "is_test"])?;
            if let Some(t) = self.optional_constant(node, 2, "training_mode")?
                && matches!(&t.data, ConstData::I64(v) if v.iter().any(|&b| b != 0))
            {
                return Err("input 2 (training_mode) is true: inference only".into());
            }
            if node.output.get(1).is_some_and(|o| !o.is_empty()) {
                return Err("output 1 (mask) is not supported".into());
            }
        } else {
            check_attrs(node, &[])?;
        }
        let b = self.bound_input(node, 0, "input")?;
        self.alias(node, b)
    }

    fn flatten(&mut self, node: &NodeProto) -> NodeResult<()> {
        check_attrs(node, &["axis"])?;
        let axis = int(node, "axis")?.unwrap_or(1);
        if axis < 0 && self.opset < 11 {
            return Err(format!(
                "attribute axis is {axis}: negative axes are only defined from opset 11 on"
            ));
        }
        let (x, flat) = self.act_any(node, 0, "input")?;
        if flat {
            return Err("the input is already flat".into());
        }
        if axis != 1 && axis != -3 {
            return Err(format!(
                "attribute axis is {axis}: only axis 1 (flattening C, H and W) is supported"
            ));
        }
        let shape = self.shape(x);
        if shape.len() == 4 && (shape[2].known().is_none() || shape[3].known().is_none()) {
            return Err(format!(
                "the input has shape {}: flattening needs a known height and width",
                describe(&shape, false)
            ));
        }
        // Any known H x W: the dense layer after it becomes a conv whose kernel covers it.
        self.alias(
            node,
            Bound::Act {
                value: x,
                flat: true,
            },
        )
    }

    /// Binds the node's output to `x`, a 1x1 image, as its flattened `[N, C]` form.
    fn flat_alias(&mut self, node: &NodeProto, x: Value) -> NodeResult<()> {
        let shape = self.shape(x);
        if shape.len() != 4 || shape[2] != Dim::Known(1) || shape[3] != Dim::Known(1) {
            return Err(format!(
                "the input has shape {}: only a 1x1 image (after a global pool) can be flattened",
                describe(&shape, false)
            ));
        }
        self.alias(
            node,
            Bound::Act {
                value: x,
                flat: true,
            },
        )
    }

    /// `Reshape` to `[N, C]` (a constant shape `[N or 0, C or -1]`) and `Squeeze` of axes 2
    /// and 3, as exporters other than PyTorch's write a classifier's flattening: both only
    /// of a 1x1 image, like `Flatten`. A `Squeeze` without axes is [`Self::squeeze_all`].
    /// The steps of a channel shuffle: `Reshape` of `[N, C, H, W]` to `[N, g, C / g, H, W]`,
    /// `Transpose` with `perm = [0, 2, 1, 3, 4]`, `Reshape` back to `[N, C, H, W]`, which is
    /// a `select_channels` of output channel `j` from input channel `(j % g) (C / g) + j / g`.
    /// `Ok(false)` when the node is not one of them.
    fn shuffle_step(&mut self, node: &NodeProto) -> NodeResult<bool> {
        let input = self.bound_input(node, 0, "data")?;
        if node.op_type == "Transpose" {
            check_attrs(node, &["perm"])?;
            let Bound::Grouped {
                value,
                groups,
                transposed: false,
            } = input
            else {
                return Err("only the Transpose of a channel shuffle ([N, g, C / g, H, W] with perm [0, 2, 1, 3, 4]) is supported".into());
            };
            if ints(node, "perm")?.as_deref() != Some(&[0, 2, 1, 3, 4]) {
                return Err(
                    "attribute perm: only [0, 2, 1, 3, 4] (a channel shuffle) is supported".into(),
                );
            }
            self.alias(
                node,
                Bound::Grouped {
                    value,
                    groups,
                    transposed: true,
                },
            )?;
            return Ok(true);
        }
        // The target shape: constant, or computed from shapes (torch's `x.view(n, g, c / g,
        // h, w)` of `x.size()` at symbolic extents), whose dimensions must be the input's own.
        let Some((elems, false)) = self.shape_vec(node, 1) else {
            return Ok(false);
        };
        let dims: Vec<Option<Dim>> = elems
            .iter()
            .map(|e| match e {
                ShapeElem::Dim { dim, .. } => Some(dim.clone()),
                ShapeElem::Int(_) => None,
            })
            .collect();
        // A dimension from a shape stands as -2, none of the special values: it must be the
        // input's own dimension at that place, compared by its `Dim` (`dims`).
        let target: Vec<i64> = elems
            .iter()
            .map(|e| match *e {
                ShapeElem::Int(n) => n,
                ShapeElem::Dim { .. } => -2,
            })
            .collect();
        match input {
            Bound::Act { value, flat: false } if target.len() == 5 => {
                check_attrs(node, &["allowzero"])?;
                let shape = self.shape(value);
                let c = self.channel_count(value)?;
                let is_dim =
                    |k: usize, i: usize| dims[k].as_ref().is_some_and(|d| shape.get(i) == Some(d));
                let same = |i: usize, t: i64| {
                    t == 0
                        || is_dim(i, i)
                        || shape
                            .get(i)
                            .and_then(Dim::known)
                            .is_some_and(|d| d as i64 == t)
                };
                let (g, per) = (target[1], target[2]);
                // A 0 copies the input's dimension at its own index, which past the channels
                // is not the one below it: H and W must be their values (or the input's own
                // from a shape), or one of them -1.
                let known = |i: usize, t: i64| {
                    t == -1
                        || is_dim(i + 1, i)
                        || shape
                            .get(i)
                            .and_then(Dim::known)
                            .is_some_and(|d| d as i64 == t)
                };
                let ok = same(0, target[0])
                    && known(2, target[3])
                    && known(3, target[4])
                    && target.iter().filter(|&&t| t == -1).count() <= 1
                    && g > 0
                    && (per == -1 || per > 0)
                    && c as i64 % g == 0
                    && (per == -1 || g.checked_mul(per) == Some(c as i64));
                if !ok {
                    return Err(format!(
                        "input 1 (shape) is {target:?}: only [N, g, C / g, H, W] of a channel shuffle is supported"
                    ));
                }
                self.alias(
                    node,
                    Bound::Grouped {
                        value,
                        groups: g as usize,
                        transposed: false,
                    },
                )?;
                Ok(true)
            }
            Bound::Grouped {
                value,
                groups,
                transposed: true,
            } => {
                check_attrs(node, &["allowzero"])?;
                let c = self.channel_count(value)?;
                let shape = self.shape(value);
                let same = |i: usize, t: i64| {
                    t == 0
                        || dims[i].as_ref().is_some_and(|d| shape.get(i) == Some(d))
                        || shape
                            .get(i)
                            .and_then(Dim::known)
                            .is_some_and(|d| d as i64 == t)
                };
                let loose = |i: usize, t: i64| t == -1 || same(i, t);
                let ok = target.len() == 4
                    && same(0, target[0])
                    && (target[1] == -1 || target[1] == c as i64)
                    && loose(2, target[2])
                    && loose(3, target[3])
                    && target.iter().filter(|&&t| t == -1).count() <= 1;
                if !ok {
                    return Err(format!(
                        "input 1 (shape) is {target:?}: only [N, C, H, W], completing a channel shuffle, is supported"
                    ));
                }
                let per = c / groups;
                let select = (0..c).map(|j| (j % groups) * per + j / groups).collect();
                self.push(
                    node,
                    Op::SelectChannels {
                        input: value,
                        select,
                    },
                    false,
                )?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn reshape_flat(&mut self, node: &NodeProto) -> NodeResult<()> {
        if matches!(node.op_type.as_str(), "Reshape" | "Transpose") && self.shuffle_step(node)? {
            return Ok(());
        }
        let (x, flat) = self.act_any(node, 0, "data")?;
        // A squeeze's axes; `None` for a reshape.
        let squeeze_axes = if node.op_type == "Squeeze" {
            check_attrs(node, &["axes"])?;
            match self.squeeze_axes(node)? {
                Some(axes) => Some(axes),
                None => return self.squeeze_all(node, x, flat),
            }
        } else {
            None
        };
        if flat {
            return Err("the input is already flat".into());
        }
        let shape = self.shape(x);
        if let Some(axes) = squeeze_axes {
            if self.opset < 11
                && let Some(a) = axes.iter().find(|&&a| a < 0)
            {
                return Err(format!(
                    "attribute axes has {a}: negative axes are only defined from opset 11 on"
                ));
            }
            let mut axes: Vec<i64> = axes
                .iter()
                .map(|&a| if a < 0 { a + 4 } else { a })
                .collect();
            axes.sort_unstable();
            if axes != [2, 3] {
                return Err(format!(
                    "axes {axes:?}: only squeezing the height and width (axes 2 and 3) is supported"
                ));
            }
        } else {
            check_attrs(node, &["allowzero"])?;
            let target = self.constant_input(node, 1, "shape")?;
            let ConstData::I64(target) = &target.data else {
                return Err("input 1 (shape) is not an integer tensor".into());
            };
            let [n, c] = target.as_slice() else {
                return Err(format!(
                    "input 1 (shape) is {target:?}: only a reshape to [N, C] is supported"
                ));
            };
            let known = |d: &Dim, v: i64| d.known().is_some_and(|k| k as i64 == v);
            let n_ok = (*n == 0 && int(node, "allowzero")?.unwrap_or(0) == 0)
                || shape.first().is_some_and(|d| known(d, *n));
            let c_ok = *c == -1 || shape.get(1).is_some_and(|d| known(d, *c));
            if !n_ok || !c_ok {
                return Err(format!(
                    "input 1 (shape) is {target:?}: only a reshape to [N, C] of an [N, C, 1, 1] image is supported, the input is {}",
                    describe(&shape, false)
                ));
            }
        }
        self.flat_alias(node, x)
    }

    /// The axes a `Squeeze` names: its attribute before opset 13, its input from 13; `None`
    /// when it names none.
    fn squeeze_axes(&self, node: &NodeProto) -> NodeResult<Option<Vec<i64>>> {
        if self.opset < 13 {
            return ints(node, "axes");
        }
        match self.optional_constant(node, 1, "axes")? {
            Some(c) => match &c.data {
                ConstData::I64(v) => Ok(Some(v.clone())),
                _ => Err("input 1 (axes) is not an integer tensor".into()),
            },
            None => Ok(None),
        }
    }

    /// `Squeeze` without axes, which removes every dimension of size 1: the importer can
    /// represent it when that leaves an `[N, C, 1, 1]` image as `[N, C]` (N and C not 1) or
    /// removes nothing. Every dimension must be known, since a symbol may be 1 when the model
    /// runs, and which dimensions go would then depend on the input.
    fn squeeze_all(&mut self, node: &NodeProto, x: Value, flat: bool) -> NodeResult<()> {
        let shape = self.shape(x);
        let rank = if flat {
            shape.len().min(2)
        } else {
            shape.len()
        };
        let dims = &shape[..rank];
        let what = describe(&shape, flat);
        if let Some((i, d)) = dims.iter().enumerate().find(|(_, d)| d.known().is_none()) {
            return Err(format!(
                "without axes, Squeeze removes every dimension of size 1, but dimension {i} of the input {what} is `{d}`, which may be 1 when the model runs: give the axes to squeeze"
            ));
        }
        let ones: Vec<usize> = (0..rank).filter(|&i| dims[i] == Dim::Known(1)).collect();
        match (flat, ones.as_slice()) {
            (_, []) => self.alias(node, Bound::Act { value: x, flat }),
            (false, [2, 3]) => self.flat_alias(node, x),
            _ => {
                let kept: Vec<Dim> = (0..rank)
                    .filter(|i| !ones.contains(i))
                    .map(|i| dims[i].clone())
                    .collect();
                Err(format!(
                    "without axes, Squeeze removes every dimension of size 1: the input {what} would become {}, but only an [N, C, 1, 1] image squeezed to [N, C] (N and C not 1) is supported",
                    describe(&kept, false)
                ))
            }
        }
    }

    /// `Gemm` or `MatMul` of a flattened `[N, C]` tensor with a constant matrix: a 1x1
    /// convolution of the `[N, C, 1, 1]` image.
    fn dense(&mut self, node: &NodeProto) -> NodeResult<()> {
        let gemm = node.op_type == "Gemm";
        if gemm {
            check_attrs(node, &["alpha", "beta", "transA", "transB", "broadcast"])?;
            if int(node, "transA")?.unwrap_or(0) != 0 {
                return Err("attribute transA=1 is not supported".into());
            }
        } else {
            check_attrs(node, &[])?;
        }
        let x = match self.act_any(node, 0, "A")? {
            (x, true) => x,
            (_, false) => {
                return Err(
                    "input 0 (A) is not a flattened tensor: only Flatten after a global pool feeds a dense layer"
                        .into(),
                );
            }
        };
        let shape = self.shape(x);
        let known = |i: usize| shape.get(i).and_then(Dim::known).unwrap_or(0) as usize;
        // The features of a flattened [N, C, H, W]: C H W, in the order of an OIHW kernel.
        let (channels, kernel) = (known(1), [known(2), known(3)]);
        let c = channels * kernel[0] * kernel[1];
        let b = self.constant_input(node, 1, "B")?;
        let data = b.floats().map_err(|m| format!("input 1 (B) {m}"))?;
        let trans_b = gemm && int(node, "transB")?.unwrap_or(0) != 0;
        let alpha = if gemm {
            float(node, "alpha")?.unwrap_or(1.0)
        } else {
            1.0
        };
        if b.dims.len() != 2 {
            return Err(format!(
                "input 1 (B) has shape {:?}: a matrix is needed",
                b.dims
            ));
        }
        let (rows, cols) = (b.dims[0], b.dims[1]);
        let (inner, k) = if trans_b { (cols, rows) } else { (rows, cols) };
        if inner != c {
            return Err(format!(
                "input 1 (B) has shape {:?}, but the input has {c} features",
                b.dims
            ));
        }
        // The conv weight is [K, C, 1, 1]: B itself when transposed, else its transpose.
        let weight: Vec<f32> = (0..k)
            .flat_map(|o| (0..c).map(move |i| (o, i)))
            .map(|(o, i)| {
                let v = if trans_b {
                    data[o * c + i]
                } else {
                    data[i * k + o]
                };
                v * alpha
            })
            .collect();
        let role = if trans_b {
            "dense weight"
        } else {
            "dense weight transposed"
        };
        let weight = self.param(
            &b,
            role,
            alpha,
            vec![k, channels, kernel[0], kernel[1]],
            weight,
        );
        let bias = match (gemm, self.optional_constant(node, 2, "C")?) {
            (true, Some(cb)) => {
                let beta = float(node, "beta")?.unwrap_or(1.0);
                let v = cb.floats().map_err(|m| format!("input 2 (C) {m}"))?;
                let data: Vec<f32> = match v.len() {
                    1 => vec![v[0] * beta; k],
                    n if n == k && cb.dims.iter().rev().skip(1).all(|&d| d == 1) => {
                        v.iter().map(|&x| x * beta).collect()
                    }
                    _ => {
                        return Err(format!(
                            "input 2 (C) has shape {:?}: a bias of the {k} outputs is needed",
                            cb.dims
                        ));
                    }
                };
                Some(self.param(&cb, "dense bias", beta, vec![k], data))
            }
            _ => None,
        };
        self.push(
            node,
            Op::Conv2d(Conv2d {
                input: x,
                weight,
                bias,
                strides: [1, 1],
                dilations: [1, 1],
                pads: Pads::default(),
                auto_pad: None,
                groups: 1,
                post_ops: Vec::new(),
            }),
            true,
        )
    }

    fn constant(&mut self, node: &NodeProto) -> NodeResult<()> {
        let Some(out) = node.output.first().filter(|o| !o.is_empty()) else {
            return Err("output 0 is missing".into());
        };
        let [attr] = node.attribute.as_slice() else {
            return Err(format!(
                "has {} attributes: exactly one value is needed",
                node.attribute.len()
            ));
        };
        let (dims, data) = match attr.name.as_str() {
            "value" => {
                let Some(t) = &attr.t else {
                    return Err("attribute value holds no tensor".into());
                };
                let c = tensor::decode(t, &mut self.external)
                    .map_err(|m| format!("attribute value: {m}"))?;
                (c.dims, c.data)
            }
            "value_float" => (vec![], ConstData::F32(vec![attr.f])),
            "value_floats" => (vec![attr.floats.len()], ConstData::F32(attr.floats.clone())),
            "value_int" => (vec![], ConstData::I64(vec![attr.i])),
            "value_ints" => (vec![attr.ints.len()], ConstData::I64(attr.ints.clone())),
            other => return Err(format!("attribute {other} is not supported")),
        };
        self.bound.insert(
            out.clone(),
            Bound::Const(Rc::new(Const {
                name: out.clone(),
                dims,
                data,
            })),
        );
        Ok(())
    }
}

/// `graph` without the values no node defines (left by folding a batch-norm away), its
/// values renumbered in order.
fn compact(graph: &Graph) -> Graph {
    let mut g = Graph::new(graph.name());
    let mut map: HashMap<Value, Value> = HashMap::new();
    for input in graph.inputs() {
        let v = g
            .add_input(graph.value_name(input.value), input.shape.clone())
            .expect("names were unique");
        map.insert(input.value, v);
    }
    for (_, p) in graph.params() {
        g.add_param(p.clone()).expect("names were unique");
    }
    for (_, n) in graph.nodes() {
        let mut op = n.op.clone();
        op.for_each_value_mut(|v| *v = map[v]);
        let v = g
            .add_node(graph.value_name(n.result), op)
            .expect("names were unique");
        map.insert(n.result, v);
    }
    for (name, v) in graph.outputs() {
        g.add_output(name.clone(), map[v]);
    }
    g
}

/// Every op the importer converts (in the default domain).
pub const SUPPORTED: &[&str] = &[
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Relu",
    "Add",
    "Clip",
    "BatchNormalization",
    "Identity",
    "Dropout",
    "Flatten",
    "Reshape",
    "Squeeze",
    "Gemm",
    "MatMul",
    "Constant",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Tanh",
    "LeakyRelu",
    "PRelu",
    "Elu",
    "Exp",
    "Mul",
    "Sub",
    "Div",
    "ReduceMean",
    "ReduceMax",
    "Concat",
    "Pad",
    "Split",
    "Slice",
    "Transpose",
    "Shape",
    "Gather",
    "Unsqueeze",
    "Cast",
    "Resize",
    "Upsample",
];

/// The oldest default-domain (`ai.onnx`) opset the importer reads. Opset 7 (ONNX 1.2) gave
/// the supported ops the attributes they still have: older ones carry `is_test`,
/// `consumed_inputs` or Add's and Gemm's `broadcast`, which mean something else.
pub const MIN_OPSET: i64 = 7;

/// The newest default-domain opset the importer reads, that of ONNX 1.22: from opset 22 on,
/// the supported ops only widened the element types they take (the conformance cases of
/// `tests/onnx/node` are at opsets 13 to 25).
pub const MAX_OPSET: i64 = 27;

/// Whether `domain` names the default operator set (`""` or `"ai.onnx"`).
fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// The most inputs (optional ones included) that a [`SUPPORTED`] op takes in the ONNX
/// operator set at `opset`, and the opset from which it takes more, if a later one does.
fn max_inputs(op: &str, opset: i64) -> (usize, Option<i64>) {
    let most = match op {
        // Their inputs past the first were attributes before (min and max; ratio; axes).
        "Clip" if opset < 11 => return (1, Some(11)),
        "Dropout" if opset < 12 => return (1, Some(12)),
        "Squeeze" if opset < 13 => return (1, Some(13)),
        "ReduceMean" | "ReduceMax" if opset < 18 => return (1, Some(18)),
        "Concat" => usize::MAX,
        "Pad" if opset < 11 => return (1, Some(11)),
        "Split" if opset < 13 => return (1, Some(13)),
        "Slice" if opset < 10 => return (1, Some(10)),
        "Unsqueeze" if opset < 13 => return (1, Some(13)),
        "Upsample" if opset < 9 => return (1, Some(9)),
        "Resize" if opset < 11 => return (2, Some(11)),
        "Resize" => 4,
        "Gather" | "Unsqueeze" | "Upsample" => 2,
        "Split" => 2,
        "Slice" => 5,
        "Pad" if opset < 18 => 3,
        "Pad" => 4,
        "PRelu" | "Mul" | "Sub" | "Div" | "ReduceMean" | "ReduceMax" => 2,
        "Constant" => 0,
        "Add" | "MatMul" | "Reshape" | "Squeeze" => 2,
        "Conv" | "ConvTranspose" | "Clip" | "Dropout" | "Gemm" => 3,
        "BatchNormalization" => 5,
        _ => 1,
    };
    (most, None)
}

/// The attributes of [`SUPPORTED`] ops that exist in some opsets only: the op, the attribute,
/// the first opset that defines it and the first that no longer does (onnxruntime refuses
/// them outside that range, and the importer would read a value the model cannot mean).
const VERSIONED_ATTRIBUTES: &[(&str, &str, i64, Option<i64>)] = &[
    ("AveragePool", "ceil_mode", 10, None),
    ("AveragePool", "dilations", 19, None),
    ("MaxPool", "storage_order", 8, None),
    ("MaxPool", "ceil_mode", 10, None),
    ("MaxPool", "dilations", 10, None),
    ("BatchNormalization", "consumed_inputs", 1, Some(6)),
    ("BatchNormalization", "is_test", 1, Some(7)),
    ("BatchNormalization", "spatial", 1, Some(9)),
    ("BatchNormalization", "training_mode", 14, None),
    ("Dropout", "is_test", 1, Some(7)),
    ("Dropout", "ratio", 1, Some(12)),
    ("Dropout", "seed", 12, None),
    ("Gemm", "broadcast", 1, Some(7)),
    ("Clip", "min", 1, Some(11)),
    ("Clip", "max", 1, Some(11)),
    ("Squeeze", "axes", 1, Some(13)),
    ("Reshape", "allowzero", 14, None),
    ("Pad", "pads", 1, Some(11)),
    ("Split", "split", 1, Some(13)),
    ("Split", "num_outputs", 18, None),
    ("Slice", "starts", 1, Some(10)),
    ("Slice", "ends", 1, Some(10)),
    ("Slice", "axes", 1, Some(10)),
    ("Pad", "value", 1, Some(11)),
    ("ReduceMean", "axes", 1, Some(18)),
    ("ReduceMax", "axes", 1, Some(18)),
    ("ReduceMean", "noop_with_empty_axes", 18, None),
    ("ReduceMax", "noop_with_empty_axes", 18, None),
    ("Constant", "sparse_value", 11, None),
    ("Upsample", "scales", 7, Some(9)),
    ("Resize", "coordinate_transformation_mode", 11, None),
    ("Resize", "cubic_coeff_a", 11, None),
    ("Resize", "exclude_outside", 11, None),
    ("Resize", "extrapolation_value", 11, None),
    ("Resize", "nearest_mode", 11, None),
    ("Resize", "antialias", 18, None),
    ("Resize", "axes", 18, None),
    ("Resize", "keep_aspect_ratio_policy", 18, None),
    ("Shape", "start", 15, None),
    ("Shape", "end", 15, None),
    ("Unsqueeze", "axes", 1, Some(13)),
    ("Cast", "saturate", 19, None),
    ("Constant", "value_float", 12, None),
    ("Constant", "value_floats", 12, None),
    ("Constant", "value_int", 12, None),
    ("Constant", "value_ints", 12, None),
    ("Constant", "value_string", 12, None),
    ("Constant", "value_strings", 12, None),
];

/// Fails at the first attribute of `node` that the model's `opset` does not define.
fn check_attr_opsets(node: &NodeProto, opset: i64) -> NodeResult<()> {
    for a in &node.attribute {
        let Some(&(_, _, first, removed)) = VERSIONED_ATTRIBUTES
            .iter()
            .find(|(op, name, ..)| *op == node.op_type && *name == a.name)
        else {
            continue;
        };
        if opset < first {
            return Err(format!(
                "attribute {} is only defined from opset {first} on",
                a.name
            ));
        }
        if let Some(removed) = removed.filter(|&r| opset >= r) {
            return Err(format!(
                "attribute {} was removed in opset {removed}",
                a.name
            ));
        }
    }
    Ok(())
}

fn describe(shape: &[Dim], flat: bool) -> String {
    let dims: Vec<String> = if flat {
        shape.iter().take(2).map(|d| d.to_string()).collect()
    } else {
        shape.iter().map(|d| d.to_string()).collect()
    };
    format!("[{}]", dims.join(", "))
}

// ---- attributes ----------------------------------------------------------------------------

fn check_attrs(node: &NodeProto, allowed: &[&str]) -> NodeResult<()> {
    let mut seen: Vec<&str> = Vec::new();
    for a in &node.attribute {
        if !allowed.contains(&a.name.as_str()) {
            return Err(format!("attribute {} is not supported", a.name));
        }
        if seen.contains(&a.name.as_str()) {
            return Err(format!("attribute {} is given twice", a.name));
        }
        seen.push(&a.name);
    }
    Ok(())
}

fn attr<'n>(node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

fn expect_type(a: &AttributeProto, t: i32, what: &str) -> NodeResult<()> {
    if a.r#type != t && a.r#type != attribute_type::UNDEFINED {
        return Err(format!("attribute {} must be {what}", a.name));
    }
    Ok(())
}

fn int(node: &NodeProto, name: &str) -> NodeResult<Option<i64>> {
    attr(node, name)
        .map(|a| expect_type(a, attribute_type::INT, "an integer").map(|()| a.i))
        .transpose()
}

fn float(node: &NodeProto, name: &str) -> NodeResult<Option<f32>> {
    attr(node, name)
        .map(|a| expect_type(a, attribute_type::FLOAT, "a float").map(|()| a.f))
        .transpose()
}

fn floats(node: &NodeProto, name: &str) -> NodeResult<Option<Vec<f32>>> {
    attr(node, name)
        .map(|a| {
            expect_type(a, attribute_type::FLOATS, "a list of floats").map(|()| a.floats.clone())
        })
        .transpose()
}

fn ints(node: &NodeProto, name: &str) -> NodeResult<Option<Vec<i64>>> {
    attr(node, name)
        .map(|a| {
            expect_type(a, attribute_type::INTS, "a list of integers").map(|()| a.ints.clone())
        })
        .transpose()
}

fn string(node: &NodeProto, name: &str) -> NodeResult<Option<String>> {
    attr(node, name)
        .map(|a| {
            expect_type(a, attribute_type::STRING, "a string")
                .map(|()| String::from_utf8_lossy(&a.s).into_owned())
        })
        .transpose()
}

fn positive(v: i64, what: &str) -> NodeResult<usize> {
    if v < 1 {
        return Err(format!("attribute {what} must be at least 1, found {v}"));
    }
    usize::try_from(v).map_err(|_| format!("attribute {what} is too large: {v}"))
}

/// A 2-D node's `pads` attribute, `[top, left, bottom, right]`, if it has one.
fn explicit_pads(node: &NodeProto) -> NodeResult<Option<Pads>> {
    let Some(v) = ints(node, "pads")? else {
        return Ok(None);
    };
    let [top, left, bottom, right] = v[..] else {
        return Err(format!(
            "attribute pads {v:?}: four values (top, left, bottom, right) are needed"
        ));
    };
    let side = |x: i64| {
        usize::try_from(x).map_err(|_| format!("attribute pads {v:?} must not be negative"))
    };
    Ok(Some(Pads {
        top: side(top)?,
        left: side(left)?,
        bottom: side(bottom)?,
        right: side(right)?,
    }))
}

fn pair(node: &NodeProto, name: &str) -> NodeResult<[usize; 2]> {
    match ints(node, name)? {
        None => Ok([1, 1]),
        Some(v) if v.len() == 2 => Ok([positive(v[0], name)?, positive(v[1], name)?]),
        Some(v) => Err(format!(
            "attribute {name} {v:?}: two values (height, width) are needed"
        )),
    }
}

/// The window attributes of `Conv`, `MaxPool` and `AveragePool` over an input of `shape`,
/// with `auto_pad` resolved to explicit pads where it can be: SAME_UPPER and SAME_LOWER over a
/// known extent, or at stride 1 (whose padding does not depend on the extent). Where a stride
/// above 1 meets a symbolic extent, the window keeps no pads and the mode is returned, for
/// the IR to resolve at each bound shape.
fn window(
    node: &NodeProto,
    shape: &[Dim],
    kernel: [usize; 2],
    ceil_mode: bool,
) -> NodeResult<(PoolWindow, Option<AutoPad>)> {
    let strides = pair(node, "strides")?;
    let dilations = pair(node, "dilations")?;
    let explicit = explicit_pads(node)?;
    let auto_pad = string(node, "auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let mut symbolic = None;
    let pads = match auto_pad.as_str() {
        "NOTSET" => explicit.unwrap_or_default(),
        "VALID" => Pads::default(),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mode = if auto_pad == "SAME_UPPER" {
                AutoPad::SameUpper
            } else {
                AutoPad::SameLower
            };
            let mut p = [(0usize, 0usize); 2];
            for axis in 0..2 {
                // A stride of 1 pads `extent - 1` over any input; a symbolic input's extent is
                // then never read.
                let input = match shape.get(2 + axis).and_then(Dim::known) {
                    Some(n) => usize::try_from(n).map_err(|_| "the input extent overflows")?,
                    None if strides[axis] == 1 => 1,
                    None => {
                        symbolic = Some(mode);
                        continue;
                    }
                };
                p[axis] = mode
                    .axis_pads(input, kernel[axis], strides[axis], dilations[axis])
                    .ok_or("the padding overflows")?;
            }
            Pads {
                top: p[0].0,
                left: p[1].0,
                bottom: p[0].1,
                right: p[1].1,
            }
        }
        other => {
            return Err(format!(
                "attribute auto_pad {other:?} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"
            ));
        }
    };
    if auto_pad != "NOTSET" && explicit.is_some_and(|p| !p.is_zero()) {
        return Err(format!(
            "attributes pads and auto_pad {auto_pad} are both set"
        ));
    }
    // The IR resolves both axes of an auto_pad node at each bound shape.
    let pads = if symbolic.is_some() {
        Pads::default()
    } else {
        pads
    };
    Ok((
        PoolWindow {
            kernel,
            strides,
            pads,
            dilations,
            ceil_mode,
        },
        symbolic,
    ))
}
