//! A whole run of a compiled graph: its inputs checked, its streamed segment first if it has
//! one, then node after node on whole tensors, and its outputs reordered to NCHW; with the
//! liveness it follows (last uses, convs that write over their residuals).

use primjit_codegen::{CallExtents, Layout, PrimitiveKey};
use primjit_ir::{Bindings, Graph, Node, Op, PostOp, Tensor, Value, infer_shapes};

use super::alias::InPlace;
use super::keys::{extents_input, keys_at, layout_of};
use super::{CompiledGraph, GraphError, NodeRun, Prepared, RunStats, TensorView};
use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::exec::ExecArgs;
use crate::layout;
use crate::workspace::{Buffer, Workspace};

impl CompiledGraph {
    /// Runs the graph on `inputs` (by input name, NCHW), returning its outputs in NCHW.
    pub fn run(
        &self,
        engine: &Engine,
        inputs: &[(&str, &Tensor)],
        workspace: &mut Workspace,
    ) -> Result<(Vec<(String, Tensor)>, RunStats), GraphError> {
        let views: Vec<(&str, TensorView<'_>)> = inputs
            .iter()
            .map(|(n, t)| (*n, TensorView::from(*t)))
            .collect();
        let mut outputs: Vec<Tensor> = self
            .graph
            .outputs()
            .iter()
            .map(|_| Tensor {
                shape: Vec::new(),
                data: Vec::new(),
            })
            .collect();
        let stats = self.run_into(engine, &views, &mut outputs, workspace)?;
        let names = self.graph.outputs().iter().map(|(n, _)| n.clone());
        Ok((names.zip(outputs).collect(), stats))
    }

    /// Runs the graph on `inputs` (by input name: NCHW views, such as slices of one buffer the
    /// caller keeps) and writes its outputs, in the order of `graph().outputs()`, into
    /// `outputs`: each is reshaped and its data resized in place, so that tensors kept from
    /// call to call are allocated once, at the largest output.
    ///
    /// After the run, the workspace keeps at most its budget of buffers (its own, else the
    /// engine's) and returns the rest to the operating system.
    pub fn run_into(
        &self,
        engine: &Engine,
        inputs: &[(&str, TensorView<'_>)],
        outputs: &mut [Tensor],
        workspace: &mut Workspace,
    ) -> Result<RunStats, GraphError> {
        engine.check_process().map_err(RuntimeError::from)?;
        if outputs.len() != self.graph.outputs().len() {
            return Err(GraphError::OutputCount {
                expected: self.graph.outputs().len(),
                found: outputs.len(),
            });
        }
        let compiles = engine.cache().stats().compiles;
        let mut blocked: Vec<Option<Buffer>> =
            (0..self.graph.values().count()).map(|_| None).collect();
        // The run drives its kernels from the engine's first thread, which takes a share of
        // every parallel call itself, with the others waiting busily for theirs.
        let result =
            engine.run_hot(|| self.execute(engine, inputs, outputs, workspace, &mut blocked));
        // Every buffer goes back, also after an error, so that the workspace's count stays true.
        for buf in blocked.into_iter().flatten() {
            workspace.give(buf);
        }
        workspace.finish_run(engine.workspace_config().budget);
        // Compiling a kernel allocates and frees megabytes that the C heap would keep: a run
        // that compiled gives those pages back.
        if engine.cache().stats().compiles != compiles {
            crate::exec::return_free_heap();
        }
        let mut stats = result?;
        stats.workspace = workspace.stats();
        Ok(stats)
    }

    /// The body of [`CompiledGraph::run_into`]: values' buffers are left in `blocked`.
    fn execute(
        &self,
        engine: &Engine,
        inputs: &[(&str, TensorView<'_>)],
        outputs: &mut [Tensor],
        workspace: &mut Workspace,
        blocked: &mut [Option<Buffer>],
    ) -> Result<RunStats, GraphError> {
        let given: Vec<(&str, &[usize])> = inputs.iter().map(|(n, t)| (*n, t.shape)).collect();
        let bindings = self.graph.bind_inputs(&given, &Bindings::new())?;
        for (name, t) in inputs {
            // A count that overflows is reported as needing `usize::MAX`, as the reference does.
            let expected = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if expected != Some(t.data.len()) {
                return Err(GraphError::InputData {
                    name: name.to_string(),
                    shape: t.shape.to_vec(),
                    expected: expected.unwrap_or(usize::MAX),
                    found: t.data.len(),
                });
            }
        }
        let shapes = infer_shapes(&self.graph, &bindings)?;
        let keys = keys_at(&self.graph, &shapes, self.runtime_dims(), &self.algos())?;
        // The leading convolutions in bands, when the image is wider than one: their calls'
        // kernels, and the other nodes', are all known before the first runs, so that the
        // missing ones compile at once on the engine's threads.
        let banded = self.banded_run(&shapes, &keys);
        // The segment is the graph's first nodes; the others run on whole tensors.
        let whole_from = banded.as_ref().map_or(0, |b| b.segment.nodes.len());
        let places = self.places_at(&shapes, whole_from);
        let run_inputs = RunInputs {
            engine,
            keys: &keys,
            shapes: &shapes,
            inputs,
            places: &places,
        };

        // Values in nChw4c buffers; graph inputs are read from the caller's tensors, and get a
        // blocked copy only where an op needs one.
        let mut live_bytes = 0usize;
        for input in self.graph.inputs() {
            if self.needs_blocked(input.value) {
                let t = run_inputs.input(&self.graph, input.value);
                let s = run_inputs.shape4(input.value);
                let mut buf = take_whole(workspace, Layout::Nchw4c.buffer_len(s))?;
                // The reorder writes real channels only: the padding lanes must be zeros.
                buf.fill(0.0);
                layout::reorder(t.data, Layout::Nchw, &mut buf, Layout::Nchw4c, s);
                live_bytes += buf.len() * 4;
                blocked[input.value.index()] = Some(buf);
            }
        }
        let mut stats = RunStats {
            peak_activation_bytes: live_bytes,
            ..RunStats::default()
        };

        engine.prefetch(
            banded.iter().flat_map(|b| &b.kernels).chain(
                keys.iter()
                    .enumerate()
                    .skip(whole_from)
                    .filter(|(i, _)| !places.slices.elided(*i))
                    .map(|(_, (_, k))| k),
            ),
        );
        let mut streamed = 0;
        if let Some(banded) = &banded {
            let run = self.execute_segment(
                banded, run_inputs, workspace, blocked, live_bytes, &mut stats,
            )?;
            streamed = banded.segment.nodes.len();
            live_bytes += run.whole_bytes;
            for input in self.graph.inputs() {
                if self.last_use[input.value.index()] < streamed
                    && let Some(buf) = blocked[input.value.index()].take()
                {
                    live_bytes -= buf.len() * 4;
                    workspace.give(buf);
                }
            }
            stats.segments.push(run);
            // The segment's band buffers are too small for the whole tensors that follow:
            // kept free, they stayed under them (at W=7680, 36 MB of bands below 22 MB of
            // whole tensors and scratch: a workspace peak of 58 MB for 32 MB live). They are
            // idle for the rest of the run, so the budget for idle buffers applies to them now
            // rather than after the run; the next streamed call maps what it lost again.
            workspace.trim_to_budget(engine.workspace_config().budget);
        }

        for (n, _) in self.graph.nodes().skip(streamed) {
            self.execute_node(
                n,
                run_inputs,
                workspace,
                blocked,
                &mut live_bytes,
                &mut stats,
            )?;
        }

        for ((_, v), out) in self.graph.outputs().iter().zip(outputs) {
            let s = run_inputs.shape4(*v);
            out.shape.clear();
            out.shape.extend_from_slice(&s);
            out.data.resize(Layout::Nchw.buffer_len(s), 0.0);
            layout::reorder(
                blocked[v.index()].as_deref().expect("outputs are computed"),
                Layout::Nchw4c,
                &mut out.data,
                Layout::Nchw,
                s,
            );
        }
        Ok(stats)
    }

    /// The in-place plan a run follows from node `whole_from` on, and when each buffer goes
    /// back (`InPlace::releases`).
    fn places_at(&self, shapes: &primjit_ir::Shapes, whole_from: usize) -> Places {
        let batch = |v: Value| shapes.concrete(v).expect("bound")[0];
        let slices = match self.slices_in_place {
            true => self.slices.at_run(&self.graph, whole_from, batch),
            false => self.slices.none(),
        };
        let release = slices.releases(&self.last_use);
        Places { slices, release }
    }

    /// Runs node `n` on whole tensors: its destination from the workspace (or its residual's
    /// buffer, when it writes over it, or its slice of the buffer it is placed in), its
    /// scratch for the call, and back to the workspace the buffers read for the last time.
    fn execute_node(
        &self,
        n: Node,
        run: RunInputs<'_>,
        workspace: &mut Workspace,
        blocked: &mut [Option<Buffer>],
        live_bytes: &mut usize,
        stats: &mut RunStats,
    ) -> Result<(), GraphError> {
        let (engine, places) = (run.engine, run.places);
        let (i, node) = (n.index(), self.graph.node(n));
        if places.slices.elided(i) {
            // A concat whose inputs were written in place, or channels read where they lie.
            places.release_operands(node, i, blocked, workspace, live_bytes);
            return Ok(());
        }
        let (name, key) = &run.keys[i];
        let primitive = engine.compile(key)?;
        let out_shape = run.shape4(node.result);
        let out_len = Layout::Nchw4c.buffer_len(out_shape);
        let home = places.slices.home(node.result);
        // A conv writes over its residual when nothing reads the residual after it (planned
        // in `new`), its kernel allows it, and the residual has a buffer of the output's
        // length; the residual's buffer then becomes the output's. An output placed in a
        // concat's buffer is written there instead.
        let over_residual = self.overwrites[i]
            .filter(|_| home.is_none() && self.in_place && primitive.residual_in_place())
            .filter(|r| {
                blocked[r.index()]
                    .as_ref()
                    .is_some_and(|b| b.len() == out_len)
            });
        // A runtime key runs at its input's extents (a resize to sizes at its output's too).
        let extents = key
            .runtime_dims()
            .any()
            .then(|| extents_input(&node.op))
            .flatten()
            .map(|v| {
                let [_, _, h, w] = run.shape4(v);
                let [_, _, oh, ow] = out_shape;
                CallExtents {
                    input: [h, w],
                    output: Some([oh, ow]),
                }
            });
        // Per thread: a fused pool's band of the conv's output, or Winograd's transformed
        // tiles.
        let band = match key {
            PrimitiveKey::Conv(d) => extents
                .map_or_else(|| d.clone(), |e| d.at(e.input))
                .scratch_len(),
            _ => 0,
        };
        let mut scratch = match band {
            0 => None,
            _ => Some(take_whole(workspace, band * engine.threads())?),
        };
        // The buffer the destination lies in, the destination's range there, and the value
        // that owns the buffer.
        let target = match (home, over_residual) {
            (Some(h), _) => match blocked[h.root.index()].take() {
                Some(buf) => Ok(buf),
                None => {
                    // The first of the values placed in this root: its buffer starts here.
                    let len = Layout::Nchw4c.buffer_len(run.shape4(h.root));
                    take_whole(workspace, len).inspect(|_| *live_bytes += len * 4)
                }
            }
            .map(|buf| (buf, InPlace::range(h, out_shape), h.root)),
            (None, Some(r)) => Ok((
                blocked[r.index()].take().expect("checked above"),
                0..out_len,
                node.result,
            )),
            (None, None) => take_whole(workspace, out_len)
                .inspect(|_| *live_bytes += out_len * 4)
                .map(|buf| (buf, 0..out_len, node.result)),
        };
        let (mut buf, range, owner) = match target {
            Ok(t) => t,
            Err(e) => {
                if let Some(s) = scratch {
                    workspace.give(s);
                }
                return Err(e);
            }
        };
        let scratch_bytes = scratch.as_ref().map_or(0, |s| s.len() * 4);
        stats.peak_activation_bytes = stats.peak_activation_bytes.max(*live_bytes + scratch_bytes);
        let execute = |args: ExecArgs<'_>| match (over_residual, extents) {
            (Some(_), e) => engine.execute_over_residual(&primitive, args, e.map(|e| e.input)),
            (None, Some(e)) => engine.execute_at(&primitive, args, e),
            (None, None) => engine.execute(&primitive, args),
        };
        let start = std::time::Instant::now();
        let ran = {
            // The destination's buffer is out of `blocked` while the call writes it: values
            // placed in the same root, before or after the destination, are read from the
            // parts around it.
            let (head, rest) = buf.split_at_mut(range.start);
            let (dst, tail) = rest.split_at_mut(range.len());
            let (head, tail): (&[f32], &[f32]) = (head, tail);
            let blocked: &[Option<Buffer>] = blocked;
            let blocked_of = |v: Value| -> &[f32] {
                let Some(h) = places.slices.home(v) else {
                    return blocked[v.index()].as_deref().expect("blocked before use");
                };
                let r = InPlace::range(h, run.shape4(v));
                if h.root != owner {
                    let root = blocked[h.root.index()].as_deref();
                    &root.expect("a placed value's buffer exists")[r]
                } else if r.end <= range.start {
                    &head[r]
                } else {
                    &tail[r.start - range.end..r.end - range.end]
                }
            };
            let src_of = |v: Value| -> &[f32] {
                match layout_of(&self.graph, v) {
                    Layout::Nchw => run.input(&self.graph, v).data,
                    _ => blocked_of(v),
                }
            };
            let (src, weights, extra) = call_operands(
                &node.op,
                &self.prepared[i],
                over_residual,
                src_of,
                blocked_of,
            );
            execute(ExecArgs {
                src,
                weights,
                dst,
                extra: &extra,
                scratch: scratch.as_deref_mut(),
            })
        };
        if let Some(s) = scratch {
            workspace.give(s);
        }
        // The destination's buffer is its owner's from here on, also when the call failed,
        // so that the caller gives it back.
        blocked[owner.index()] = Some(buf);
        ran?;
        stats.nodes.push(NodeRun {
            name: name.clone(),
            call_key: extents.map_or_else(|| key.clone(), |e| key.at(e)),
            primitive,
            seconds: start.elapsed().as_secs_f64(),
        });
        places.release_operands(node, i, blocked, workspace, live_bytes);
        Ok(())
    }

    /// Whether graph input `input` needs a blocked (`nChw4c`) copy: an op reads it as a
    /// value's buffer (element-wise operands, residuals, concat, resize), or it is an output.
    /// Convolutions and pooling read the caller's NCHW data where it lies.
    fn needs_blocked(&self, input: Value) -> bool {
        let read_blocked = |op: &Op| match op {
            Op::Relu { input: x } => *x == input,
            Op::Add { lhs, rhs } => *lhs == input || *rhs == input,
            Op::Conv2d(c) => c.post_ops.contains(&PostOp::Add(input)),
            Op::Act { .. }
            | Op::PRelu { .. }
            | Op::Binary { .. }
            | Op::Concat { .. }
            | Op::SelectChannels { .. }
            | Op::ConvTranspose(_) => op.value_operands().contains(&input),
            // Only the resized value is read; the one whose extents it takes is not.
            Op::Resize(r) => r.input == input,
            _ => false,
        };
        self.graph.nodes().any(|(_, n)| read_blocked(&n.op))
            || self.graph.outputs().iter().any(|(_, v)| *v == input)
    }

    /// The convs that may write their output over a residual, as (node, residual) names: the
    /// residual has no reader after the conv, is not a graph output and is not the conv's
    /// own input. A run does so when its primitive allows it too
    /// (`Primitive::residual_in_place`).
    pub fn residual_overwrites(&self) -> Vec<(String, String)> {
        self.graph
            .nodes()
            .zip(&self.overwrites)
            .filter_map(|((_, node), r)| {
                r.map(|r| {
                    (
                        self.graph.value_name(node.result).to_string(),
                        self.graph.value_name(r).to_string(),
                    )
                })
            })
            .collect()
    }
}

/// What a node's call reads besides its destination and scratch: its source (`src_of`: a
/// graph input's own NCHW data, or a value's `nChw4c` buffer), its packed weights, and its
/// other operands (`blocked_of`): a conv's residuals but the one it writes over, a binary
/// op's second operand, PReLU's slopes, Concat's other inputs.
fn call_operands<'a>(
    op: &'a Op,
    prepared: &'a Prepared,
    over_residual: Option<Value>,
    src_of: impl Fn(Value) -> &'a [f32],
    blocked_of: impl Fn(Value) -> &'a [f32],
) -> (&'a [f32], Option<&'a [f32]>, Vec<&'a [f32]>) {
    match (op, prepared) {
        (Op::Conv2d(c), Prepared::Conv { packed, .. }) => {
            let residuals = c
                .post_ops
                .iter()
                .filter_map(|p| match p {
                    PostOp::Add(r) if over_residual != Some(*r) => Some(blocked_of(*r)),
                    _ => None,
                })
                .collect();
            (src_of(c.input), Some(packed.as_slice()), residuals)
        }
        (Op::ConvTranspose(c), Prepared::Conv { packed, .. }) => {
            (blocked_of(c.input), Some(packed.as_slice()), Vec::new())
        }
        (Op::Pool2d(p), _) => (src_of(p.input), None, Vec::new()),
        (Op::GlobalPool { input, .. }, _) => (src_of(*input), None, Vec::new()),
        (
            Op::Relu { input }
            | Op::Act { input, .. }
            | Op::SelectChannels { input, .. }
            | Op::Resize(primjit_ir::Resize { input, .. }),
            _,
        ) => (blocked_of(*input), None, Vec::new()),
        (Op::Add { lhs, rhs } | Op::Binary { lhs, rhs, .. }, _) => {
            (blocked_of(*lhs), None, vec![blocked_of(*rhs)])
        }
        (Op::PRelu { input, .. }, Prepared::Slope(slope)) => {
            (blocked_of(*input), None, vec![slope.as_slice()])
        }
        (Op::Concat { inputs }, _) => {
            let rest = inputs[1..].iter().map(|&v| blocked_of(v)).collect();
            (blocked_of(inputs[0]), None, rest)
        }
        (Op::Conv2d(_) | Op::ConvTranspose(_), Prepared::Slope(_) | Prepared::Other)
        | (Op::PRelu { .. }, Prepared::Conv { .. } | Prepared::Other) => {
            unreachable!("convs and prelus are prepared")
        }
        (Op::BatchNorm(_), _) => unreachable!("optimize_graph makes batch-norms convs"),
    }
}

/// What every call of a run reads and none changes: the engine, the nodes' names and keys
/// (in graph order), the run's shapes, the caller's inputs, and where values live.
#[derive(Clone, Copy)]
pub(super) struct RunInputs<'a> {
    pub(super) engine: &'a Engine,
    pub(super) keys: &'a [(String, PrimitiveKey)],
    shapes: &'a primjit_ir::Shapes,
    pub(super) inputs: &'a [(&'a str, TensorView<'a>)],
    places: &'a Places,
}

impl<'a> RunInputs<'a> {
    /// The run's shape of value `v`, which binding the inputs made concrete.
    pub(super) fn shape4(&self, v: Value) -> [usize; 4] {
        let s = self.shapes.concrete(v).expect("bound");
        [s[0], s[1], s[2], s[3]]
    }

    /// The caller's tensor of graph input `v`.
    fn input(&self, graph: &Graph, v: Value) -> TensorView<'a> {
        let name = graph.value_name(v);
        self.inputs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .expect("bound inputs are present")
    }
}

/// The in-place plan of a run and, per value, the node after which its buffer goes back.
pub(super) struct Places {
    pub(super) slices: InPlace,
    release: Vec<usize>,
}

impl Places {
    /// Gives back the buffers that node `i` reads for the last time: a value's own, or the
    /// buffer it is placed in once nothing placed there is read any more.
    fn release_operands(
        &self,
        node: &primjit_ir::NodeData,
        i: usize,
        blocked: &mut [Option<Buffer>],
        workspace: &mut Workspace,
        live_bytes: &mut usize,
    ) {
        for v in node.op.value_operands() {
            let owner = self.slices.owner(v).index();
            if self.release[owner] == i
                && let Some(buf) = blocked[owner].take()
            {
                *live_bytes -= buf.len() * 4;
                workspace.give(buf);
            }
        }
    }
}

/// Per value of `graph`: the index of the last node reading it, `usize::MAX` for outputs.
pub(super) fn last_uses(graph: &Graph) -> Vec<usize> {
    let mut last_use = vec![0; graph.values().count()];
    for (i, (_, node)) in graph.nodes().enumerate() {
        for v in node.op.value_operands() {
            last_use[v.index()] = i;
        }
    }
    for (_, v) in graph.outputs() {
        last_use[v.index()] = usize::MAX;
    }
    last_use
}

/// Per node of an optimized graph: the residual its conv may write its output over. That is a
/// conv's only `add` post-op (and no fused pool) whose value no later node reads
/// (`last_use`, with `usize::MAX` for graph outputs), and which is not the conv's own input:
/// the kernel then reads each residual element only right before it writes the output
/// element at the same place (`primjit_codegen::residual_in_place`), and nothing else reads it.
pub(super) fn residual_overwrites(graph: &Graph, last_use: &[usize]) -> Vec<Option<Value>> {
    graph
        .nodes()
        .enumerate()
        .map(|(i, (_, node))| {
            let Op::Conv2d(c) = &node.op else {
                return None;
            };
            let mut adds = c.post_ops.iter().filter_map(|p| match p {
                PostOp::Add(r) => Some(*r),
                _ => None,
            });
            let pooled = c.post_ops.iter().any(|p| matches!(p, PostOp::MaxPool(_)));
            match (adds.next(), adds.next()) {
                (Some(r), None) if !pooled && r != c.input && last_use[r.index()] == i => Some(r),
                _ => None,
            }
        })
        .collect()
}

/// Of `overwrites` (per node, the residual its conv may write over), those whose node's kernel
/// (`keys`) can (`primjit_codegen::residual_in_place`); the kernel's width, padding and row
/// pitches do not change that, so a streamed node's band kernels can as its whole key can.
pub(super) fn honoured_overwrites(
    overwrites: &[Option<Value>],
    keys: &[(String, PrimitiveKey)],
) -> Vec<Option<Value>> {
    overwrites
        .iter()
        .zip(keys)
        .map(|(r, (_, key))| r.filter(|_| primjit_codegen::residual_in_place(key)))
        .collect()
}

/// A workspace buffer of `len` floats for a whole tensor, its failure as a graph error.
fn take_whole(workspace: &mut Workspace, len: usize) -> Result<Buffer, GraphError> {
    workspace.take(len).map_err(|e| GraphError::Workspace {
        bytes: len * 4,
        message: e.to_string(),
    })
}
