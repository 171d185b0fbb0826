//! Streamed segments: a run's leading convolutions in column bands, their values in windows
//! that move along the image (`Window`), planned by [`crate::stream`]; and what `dump` shows
//! of them (the plan, the band kernels).

use std::collections::HashMap;
use std::sync::Arc;

use primjit_codegen::{ConvAlgoChoice, ConvDesc, Isa, Layout, PrimitiveKey};
use primjit_ir::{Bindings, Graph, Shapes, Value, infer_shapes};

use super::keys::{keys_at, layout_of, node_keys_in};
use super::run::{RunInputs, honoured_overwrites, last_uses, residual_overwrites};
use super::{CompiledGraph, GraphError, NodeRun, Prepared, RunStats, ShapeMode};
use crate::exec::ExecArgs;
use crate::primitive::Primitive;
use crate::stream::{self, Call, Schedule, Segment, SegmentRun, Streaming};
use crate::workspace::{Buffer, REUSE_SLACK, Workspace};

impl CompiledGraph {
    /// The segment a run at `bindings` streams, with its schedule, if any.
    pub fn stream_plan(
        &self,
        bindings: &Bindings,
    ) -> Result<Option<(Segment, stream::Schedule)>, GraphError> {
        if self.streaming().band().is_none() {
            return Ok(None);
        }
        let shapes = infer_shapes(&self.graph, bindings)?;
        let keys = keys_at(&self.graph, &shapes, self.runtime_dims(), &self.algos())?;
        Ok(self.streamed_segment(&shapes, &keys).map(|(s, band)| {
            let schedule = s.schedule(band);
            (s, schedule)
        }))
    }

    /// The segment a run with these shapes and node keys streams, and its band.
    fn streamed_segment(
        &self,
        shapes: &Shapes,
        keys: &[(String, PrimitiveKey)],
    ) -> Option<(Segment, usize)> {
        let overwrites = match self.in_place {
            true => honoured_overwrites(&self.overwrites, keys),
            false => vec![None; self.overwrites.len()],
        };
        stream::streamed_segment(
            &self.graph,
            shapes,
            keys,
            &self.last_use,
            &overwrites,
            self.streaming(),
        )
    }

    /// The streamed segment of a run at `shapes` with node keys `keys`, if the run streams:
    /// its schedule, and its calls' distinct kernel keys.
    pub(super) fn banded_run(
        &self,
        shapes: &primjit_ir::Shapes,
        keys: &[(String, PrimitiveKey)],
    ) -> Option<BandedRun> {
        let (segment, band) = self.streamed_segment(shapes, keys)?;
        let schedule = segment.schedule(band);
        let mut kernels: Vec<PrimitiveKey> = Vec::new();
        let mut index: HashMap<PrimitiveKey, usize> = HashMap::new();
        let call_kernels = schedule
            .calls
            .iter()
            .map(|call| {
                let s = &segment.nodes[call.node];
                let input = shapes.concrete(s.input).expect("bound");
                let (ih, iw) = (input[2], input[3]);
                let key = segment.call_key(&schedule, call, &keys[s.node].1, [ih, iw]);
                *index.entry(key).or_insert_with_key(|key| {
                    kernels.push(key.clone());
                    kernels.len() - 1
                })
            })
            .collect();
        Some(BandedRun {
            segment,
            band,
            schedule,
            kernels,
            call_kernels,
        })
    }

    /// Runs the streamed segment of `banded` at the run's shapes (`run`): its whole outputs
    /// land in `blocked`, its nodes' runs in `stats.nodes`. `live_bytes` is what the run holds
    /// besides.
    pub(super) fn execute_segment(
        &self,
        banded: &BandedRun,
        run_inputs: RunInputs<'_>,
        workspace: &mut Workspace,
        blocked: &mut [Option<Buffer>],
        live_bytes: usize,
        stats: &mut RunStats,
    ) -> Result<SegmentRun, GraphError> {
        let RunInputs { engine, keys, .. } = run_inputs;
        let BandedRun {
            segment,
            band,
            schedule,
            kernels,
            call_kernels,
        } = banded;
        let mut run = SegmentRun {
            first: keys[segment.nodes[0].node].0.clone(),
            last: keys[segment.nodes.last().expect("non-empty").node]
                .0
                .clone(),
            band: *band,
            sweeps: schedule.sweeps,
            calls: schedule.calls.len(),
            ..SegmentRun::default()
        };
        let mut state = SegmentState {
            segment,
            schedule,
            run: run_inputs,
            windows: Vec::with_capacity(segment.nodes.len()),
        };
        for (s, &whole) in segment.nodes.iter().zip(&segment.whole) {
            if whole {
                let len = Layout::Nchw4c.buffer_len(state.run.shape4(s.output));
                blocked[s.output.index()] = Some(take_buffer(workspace, len)?);
                run.whole_bytes += len * 4;
            }
        }
        let mut result = Ok(());
        for (i, s) in segment.nodes.iter().enumerate() {
            let pitch = schedule.window_pitch[i];
            // A value written over its residual lies in its home's window.
            if segment.whole[i] || schedule.home(i) != i {
                state.windows.push(None);
                continue;
            }
            let (rows, _) = stream::rows_and_elem(Layout::Nchw4c, state.run.shape4(s.output));
            match take_buffer(workspace, Window::len(rows, pitch, s.out_width())) {
                Ok(buf) => {
                    run.window_bytes += buf.len() * 4;
                    state.windows.push(Some(Window { buf, pitch }));
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut node_runs: Vec<Option<NodeRun>> = vec![None; segment.nodes.len()];
        let held = live_bytes + run.whole_bytes + run.window_bytes;
        run.peak_bytes = held;
        // Each kernel is looked up once for the segment, which makes hundreds of calls of a
        // few dozen kernels: looked up call by call, a cache with no room for them (budget 0)
        // compiled one for every call (567 compiles for one W=7680 call of the trunk).
        let mut primitives: Vec<Option<Arc<Primitive>>> = vec![None; kernels.len()];
        if result.is_ok() {
            for (call, &k) in schedule.calls.iter().zip(call_kernels) {
                let primitive = match &primitives[k] {
                    Some(p) => Ok(p.clone()),
                    None => engine
                        .compile(&kernels[k])
                        .inspect(|p| primitives[k] = Some(p.clone()))
                        .map_err(GraphError::from),
                };
                let ran = primitive.and_then(|primitive| {
                    self.execute_band(&mut state, call, &kernels[k], primitive, workspace, blocked)
                });
                match ran {
                    Ok((temp_bytes, node_run)) => {
                        run.peak_bytes = run.peak_bytes.max(held + temp_bytes);
                        match &mut node_runs[call.node] {
                            Some(r) => r.seconds += node_run.seconds,
                            slot => *slot = Some(node_run),
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        for window in state.windows.into_iter().flatten() {
            workspace.give(window.buf);
        }
        result?;
        stats.nodes.extend(node_runs.into_iter().flatten());
        stats.peak_activation_bytes = stats.peak_activation_bytes.max(run.peak_bytes);
        Ok(run)
    }

    /// One call of a streamed node, with its kernel's `key` (`Segment::call_key`) and
    /// `primitive`. The kernel reads its input columns and residuals where they are, in the
    /// windows of their producers, at their row pitch, and writes its output columns into its
    /// own window; only values outside the windows (graph inputs, whole tensors) are copied
    /// in, and a whole output is copied out. Returns the bytes of the copies, scratch and
    /// destination it took, and the node's run.
    fn execute_band(
        &self,
        state: &mut SegmentState<'_>,
        call: &Call,
        key: &PrimitiveKey,
        primitive: Arc<Primitive>,
        workspace: &mut Workspace,
        blocked: &mut [Option<Buffer>],
    ) -> Result<(usize, NodeRun), GraphError> {
        let RunInputs { engine, keys, .. } = state.run;
        let segment = state.segment;
        let s = &segment.nodes[call.node];
        let name = &keys[s.node].0;
        let ih = state.run.shape4(s.input)[2];
        let band_iw = call.input.end - call.input.begin;
        let out_shape = state.run.shape4(s.output);
        let (out_rows, _) = stream::rows_and_elem(Layout::Nchw4c, out_shape);
        let cols = call.x1 - call.x0;
        let schedule = state.schedule;
        let home = schedule.home(call.node);
        let call_key = key.at([ih, band_iw]);
        let specs = call_key.buffers();
        let PrimitiveKey::Conv(call_desc) = &call_key else {
            unreachable!("segments hold convolutions")
        };
        let dst_pitch = call_desc.pitches.dst;
        let band = BandCall {
            node: s,
            call,
            key,
            call_desc,
            specs: &specs,
            primitive: &primitive,
            input_window: schedule.window_of(segment, s.input),
            over_residual: schedule.overwritten(segment, call.node),
            extents: [ih, band_iw],
        };

        // The call's columns overwrite only columns no consumer reads any more (see `Window`).
        let mut out = state.windows[home].take();
        if let Some(w) = &out {
            debug_assert!(
                call.keep_from <= call.x0 && call.x1 - call.keep_from <= w.pitch,
                "the window of %{} holds the call's columns and those still read",
                self.graph.value_name(s.output)
            );
        }

        // Buffers of the call's own: copies in, a destination where the output is not written
        // in place, the scratch. All go back after the call, also when it fails.
        let mut temps: Vec<Buffer> = Vec::new();
        let result = self.run_band(state, &band, out.as_mut(), &mut temps, workspace, blocked);
        let copied_out = result.as_ref().map(|(_, _, dst_copy)| *dst_copy);
        // A destination of its own holds columns of a whole output (a window is written in
        // place): they go to the whole tensor.
        if let Ok(Some(i)) = copied_out {
            let whole = blocked[s.output.index()]
                .as_deref_mut()
                .expect("whole outputs are taken first");
            stream::copy_columns(
                stream::Columns {
                    data: &temps[i],
                    pitch: dst_pitch.unwrap_or(cols),
                    col: 0,
                },
                stream::Columns {
                    data: whole,
                    pitch: out_shape[3],
                    col: call.x0,
                },
                cols,
                out_rows,
                4,
                engine,
            );
        }
        for t in temps {
            workspace.give(t);
        }
        state.windows[home] = out;
        let (temp_bytes, seconds, _) = result?;
        Ok((
            temp_bytes,
            NodeRun {
                name: name.clone(),
                call_key,
                primitive,
                seconds,
            },
        ))
    }

    /// The kernel call of `band`, writing into `out` (the window of its output's home, if it
    /// has one): takes the buffers it needs into `temps`, copies in what lies outside the
    /// windows, and runs. Returns the bytes of `temps`, the call's seconds, and which of
    /// `temps` holds the output where it is not written into a window.
    fn run_band(
        &self,
        state: &SegmentState<'_>,
        band: &BandCall<'_>,
        mut out: Option<&mut Window>,
        temps: &mut Vec<Buffer>,
        workspace: &mut Workspace,
        blocked: &[Option<Buffer>],
    ) -> Result<(usize, f64, Option<usize>), GraphError> {
        let BandCall {
            node: s,
            call,
            key,
            call_desc,
            specs,
            primitive,
            input_window,
            over_residual,
            extents: [ih, band_iw],
        } = *band;
        let RunInputs { engine, .. } = state.run;
        let (segment, schedule) = (state.segment, state.schedule);
        let dst_len = specs[2].len;
        let windows = &state.windows;
        let mut take = |temps: &mut Vec<Buffer>, len: usize| -> Result<usize, GraphError> {
            temps.push(take_buffer(workspace, len)?);
            Ok(temps.len() - 1)
        };
        let src_copy = match input_window {
            Some(_) => None,
            None => Some(take(temps, specs[0].len)?),
        };
        // Residuals in windows of the destination's pitch are read in place; the one it
        // writes over is the destination itself.
        let res_pitch = call_desc.dst_pitch();
        let res_window = |r: Value| {
            schedule
                .window_of(segment, r)
                .and_then(|j| windows[j].as_ref())
                .filter(|w| w.pitch == res_pitch)
        };
        let residuals: Vec<Value> = s
            .residuals
            .iter()
            .copied()
            .filter(|&r| Some(r) != over_residual)
            .collect();
        // The kernel takes the residuals it reads from buffers of their own, in order.
        let res_specs = &specs[3..][..residuals.len()];
        let res_copies = residuals
            .iter()
            .zip(res_specs)
            .map(|(&r, spec)| match res_window(r) {
                Some(_) => Ok(None),
                None => take(temps, spec.len).map(Some),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let dst_copy = match &out {
            Some(_) => None,
            None => Some(take(temps, dst_len)?),
        };
        let scratch = match call_desc.scratch_len() {
            0 => None,
            n => Some(take(temps, n * engine.threads())?),
        };
        if let Some(i) = src_copy {
            self.gather(
                state,
                s.input,
                call.input.begin..call.input.end,
                &mut temps[i],
                band_iw,
                blocked,
            );
        }
        for (&r, copy) in residuals.iter().zip(&res_copies) {
            if let Some(i) = *copy {
                self.gather(
                    state,
                    r,
                    call.x0..call.x1,
                    &mut temps[i],
                    res_pitch,
                    blocked,
                );
            }
        }
        let temp_bytes = temps.iter().map(|b| b.len() * 4).sum::<usize>();

        let mut own: Vec<Option<&mut Buffer>> = temps.iter_mut().map(Some).collect();
        let mut own = |i: usize| own[i].take().expect("each buffer serves once");
        let src: &[f32] = match (input_window, src_copy) {
            (Some(j), _) => windows[j]
                .as_ref()
                .expect("a window")
                .columns(call.input.begin, specs[0].len),
            (None, Some(i)) => own(i),
            (None, None) => unreachable!("copied above"),
        };
        let extra: Vec<&[f32]> = residuals
            .iter()
            .zip(res_specs)
            .zip(&res_copies)
            .map(|((&r, spec), copy)| match copy {
                Some(i) => &own(*i)[..],
                None => res_window(r)
                    .expect("in a window")
                    .columns(call.x0, spec.len),
            })
            .collect();
        let dst: &mut [f32] = match (dst_copy, out.as_mut()) {
            (Some(i), _) => own(i),
            (None, Some(w)) => w.columns_mut(call.x0, dst_len),
            (None, None) => unreachable!("a destination is taken above"),
        };
        let Prepared::Conv { packed, .. } = &self.prepared[s.node] else {
            unreachable!("convs are prepared")
        };
        let args = ExecArgs {
            src,
            weights: Some(packed.as_slice()),
            dst,
            extra: &extra,
            scratch: scratch.map(|i| &mut own(i)[..]),
        };
        let extents = key.runtime_dims().any().then_some([ih, band_iw]);
        let start = std::time::Instant::now();
        match (over_residual, extents) {
            (Some(_), e) => engine.execute_over_residual(primitive, args, e)?,
            (None, Some(e)) => engine.execute_at(primitive, args, e)?,
            (None, None) => engine.execute(primitive, args)?,
        }
        Ok((temp_bytes, start.elapsed().as_secs_f64(), dst_copy))
    }

    /// Copies the columns `columns` of value `v` into `dst`, in rows `pitch` columns apart,
    /// from its window, its whole blocked tensor, or the caller's NCHW input; the rows are
    /// shared among the engine's threads.
    fn gather(
        &self,
        state: &SegmentState<'_>,
        v: Value,
        columns: std::ops::Range<usize>,
        dst: &mut [f32],
        pitch: usize,
        blocked: &[Option<Buffer>],
    ) {
        let RunInputs { engine, inputs, .. } = state.run;
        let (begin, cols) = (columns.start, columns.len());
        let shape = state.run.shape4(v);
        let layout = layout_of(&self.graph, v);
        let (rows, elem) = stream::rows_and_elem(layout, shape);
        // The source as (the column its data starts at, its data, row width).
        let home = state.schedule.window_of(state.segment, v);
        let (x0, data, width): (usize, &[f32], usize) =
            match home.and_then(|i| state.windows[i].as_ref()) {
                Some(w) => (begin, w.rows_from(begin), w.pitch),
                None => {
                    let data: &[f32] = match (&blocked[v.index()], layout) {
                        (Some(b), Layout::Nchw4c) => b,
                        _ => {
                            let name = self.graph.value_name(v);
                            inputs
                                .iter()
                                .find(|(n, _)| *n == name)
                                .map(|(_, t)| t.data)
                                .expect("bound inputs are present")
                        }
                    };
                    (0, data, shape[3])
                }
            };
        stream::copy_columns(
            stream::Columns {
                data,
                pitch: width,
                col: begin - x0,
            },
            stream::Columns {
                data: dst,
                pitch,
                col: 0,
            },
            cols,
            rows,
            elem,
            engine,
        );
    }
}

/// The streamed segment of an optimized graph at `bindings` with `streaming` and `conv_algo`'s
/// algorithms, as a run would execute it (`dump --stage plan`): its nodes, their calls, windows
/// and halos, and the bytes it holds. `None` when nothing streams (streaming is off, no
/// convolution leads the graph, or the run is too narrow or small to stream:
/// `Segment::pays_at`).
pub fn describe_stream_plan(
    graph: &Graph,
    bindings: &Bindings,
    conv_algo: ConvAlgoChoice,
    isa: Isa,
    streaming: Streaming,
) -> Result<Option<String>, GraphError> {
    let Some(StreamedRun {
        shapes,
        segment,
        band,
        schedule,
    }) = streamed_run(
        graph,
        bindings,
        &node_keys_in(graph, bindings, ShapeMode::Exact, conv_algo, isa)?,
        streaming,
    )?
    else {
        return Ok(None);
    };
    let name = |v: Value| graph.value_name(v);
    let first = segment.nodes[0].output;
    let last = segment.nodes.last().expect("non-empty").output;
    let mut text = format!(
        "streamed segment %{}..%{}: bands of {band} columns of %{}, {} sweeps, {} calls\n",
        name(first),
        name(last),
        name(first),
        schedule.sweeps,
        schedule.calls.len()
    );
    if let Some((node, reads)) = segment.ends_before {
        let next = graph
            .nodes()
            .nth(node)
            .expect("a node of the graph")
            .1
            .result;
        text.push_str(&format!(
            "  ends before %{}: its band calls would read its weights from memory {reads:.2} \
             times as often per flop as a whole call (more than {})\n",
            name(next),
            stream::MAX_BAND_WEIGHT_READS
        ));
    }
    let (mut window_bytes, mut whole_bytes) = (0, 0);
    for (i, (node, &whole)) in segment.nodes.iter().zip(&segment.whole).enumerate() {
        let s = shapes.concrete(node.output).expect("bound");
        let column_bytes = Layout::Nchw4c.buffer_len([s[0], s[1], s[2], 1]) * 4;
        let widest = schedule
            .calls
            .iter()
            .filter(|c| c.node == i)
            .map(|c| c.x1 - c.x0)
            .max()
            .unwrap_or(0);
        let calls = schedule.calls.iter().filter(|c| c.node == i).count();
        let held = if whole {
            whole_bytes += column_bytes * node.out_width();
            format!("whole tensor ({} bytes)", column_bytes * node.out_width())
        } else if let Some(r) = schedule.overwritten(&segment, i) {
            let home = segment.nodes[schedule.home(i)].output;
            format!("written over %{} in the window of %{}", name(r), name(home))
        } else {
            let (cols, pitch) = (schedule.window_columns[i], schedule.window_pitch[i]);
            let (rows, _) = stream::rows_and_elem(Layout::Nchw4c, [s[0], s[1], s[2], s[3]]);
            let bytes = Window::len(rows, pitch, node.out_width()) * 4;
            window_bytes += bytes;
            format!(
                "window of {cols} columns in rows of {pitch}: bands of up to {widest} and {} of \
                 halo ({bytes} bytes)",
                cols - widest.min(cols),
            )
        };
        text.push_str(&format!(
            "  %{}: {} columns in {calls} calls, {held}\n",
            name(node.output),
            node.out_width()
        ));
    }
    text.push_str(&format!(
        "  holds {window_bytes} bytes of windows and {whole_bytes} bytes of whole tensors; \
         kernels read and write the windows in place, and copy in only graph inputs and whole \
         tensors\n"
    ));
    Ok(Some(text))
}

/// What a run of an optimized graph at some bindings streams: the shapes, the segment, its
/// band and its calls.
struct StreamedRun {
    shapes: primjit_ir::Shapes,
    segment: Segment,
    band: usize,
    schedule: Schedule,
}

/// The streamed segment of a run of an optimized `graph` at `bindings` with `streaming`, whose
/// nodes have `keys` (in any shape mode: whether a kernel writes over its residual does not
/// depend on it), as the run plans it; `None` when nothing streams.
fn streamed_run(
    graph: &Graph,
    bindings: &Bindings,
    keys: &[(String, PrimitiveKey)],
    streaming: Streaming,
) -> Result<Option<StreamedRun>, GraphError> {
    if streaming.band().is_none() {
        return Ok(None);
    }
    let shapes = infer_shapes(graph, bindings)?;
    let last_use = last_uses(graph);
    let overwrites = honoured_overwrites(&residual_overwrites(graph, &last_use), keys);
    let streamed =
        stream::streamed_segment(graph, &shapes, keys, &last_use, &overwrites, streaming);
    Ok(streamed.map(|(segment, band)| StreamedRun {
        schedule: segment.schedule(band),
        shapes,
        segment,
        band,
    }))
}

/// A kernel that a streamed run calls for one node of its segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BandKernel {
    /// The node (its value's name, without `%`).
    pub node: String,
    /// The key: the node's with a band's width and padding and its windows' row pitches.
    pub key: PrimitiveKey,
    /// How many of the node's calls use it.
    pub calls: usize,
    /// The output columns `[begin, end)` of the first of them.
    pub first_columns: [usize; 2],
}

/// The kernels a run of an optimized `graph` at `bindings` calls for the nodes of its
/// streamed segment (`dump --bands`): each node's distinct keys once (nodes of one shape share
/// their primitives in the engine's cache, but each lists its own), in the order of first call,
/// made in `mode` with `conv_algo`'s algorithms as [`node_keys_in`] makes the nodes' own.
/// `None` when nothing streams (see [`describe_stream_plan`]).
pub fn stream_band_kernels(
    graph: &Graph,
    bindings: &Bindings,
    mode: ShapeMode,
    conv_algo: ConvAlgoChoice,
    isa: Isa,
    streaming: Streaming,
) -> Result<Option<Vec<BandKernel>>, GraphError> {
    let keys = node_keys_in(graph, bindings, mode, conv_algo, isa)?;
    let Some(run) = streamed_run(graph, bindings, &keys, streaming)? else {
        return Ok(None);
    };
    let mut kernels: Vec<BandKernel> = Vec::new();
    for call in &run.schedule.calls {
        let s = &run.segment.nodes[call.node];
        let input = run.shapes.concrete(s.input).expect("bound");
        let (name, whole) = &keys[s.node];
        let key = run
            .segment
            .call_key(&run.schedule, call, whole, [input[2], input[3]]);
        match kernels.iter_mut().find(|k| k.node == *name && k.key == key) {
            Some(k) => k.calls += 1,
            None => kernels.push(BandKernel {
                node: name.clone(),
                key,
                calls: 1,
                first_columns: [call.x0, call.x1],
            }),
        }
    }
    Ok(Some(kernels))
}

/// A run's streamed segment with its band, its calls, and their kernels.
pub(super) struct BandedRun {
    pub(super) segment: Segment,
    band: usize,
    schedule: Schedule,
    /// The calls' distinct kernel keys ([`Segment::call_key`]), in order of first use.
    pub(super) kernels: Vec<PrimitiveKey>,
    /// Per call of `schedule`: the index of its kernel in `kernels`.
    call_kernels: Vec<usize>,
}

/// One call of a streamed node, at its band's extents: what `execute_band` hands its kernel
/// call (`run_band`).
#[derive(Clone, Copy)]
struct BandCall<'a> {
    node: &'a stream::SegmentNode,
    call: &'a Call,
    /// The kernel's key (`Segment::call_key`).
    key: &'a PrimitiveKey,
    /// The kernel's key at the band's extents, and its buffers.
    call_desc: &'a ConvDesc,
    specs: &'a [primjit_codegen::BufferSpec],
    primitive: &'a Primitive,
    /// The window that holds the call's input, read in place.
    input_window: Option<usize>,
    /// The residual the call writes its output over, in the window of its destination.
    over_residual: Option<Value>,
    /// The band's input extents `[ih, iw]`.
    extents: [usize; 2],
}

/// What a streamed segment holds between its calls: each windowed value's window.
struct SegmentState<'a> {
    segment: &'a Segment,
    schedule: &'a Schedule,
    run: RunInputs<'a>,
    /// Per node of the segment: the window of the values it is the home of
    /// (`Schedule::home`; `None` for a whole output or a value in another node's window).
    windows: Vec<Option<Window>>,
}

/// The columns of a value read only inside its segment that its consumers still read, in
/// `nChw4c` rows `pitch` columns apart: its producer's calls write there, its consumers' read
/// there.
///
/// Column `x` of row `r` lies at float `4 (x + r pitch)` of the buffer, wherever the image
/// has got to: a row's columns past the pitch are the next row's first ones. So the window
/// holds any `pitch` consecutive columns of every row at once, and moves along the image
/// with no copy (the rows start further into the buffer as the columns advance, which is why
/// the buffer is longer than its rows by the value's width). Writing column `x` of a row
/// overwrites column `x - pitch` of the next, which no consumer reads any more: the schedule
/// keeps the columns still read and those a call writes within a pitch (`Call::keep_from`,
/// `Schedule::window_pitch`). A window used to keep its columns at its rows' starts and, before
/// a band passed its end, moved the halo there: 8 of every 64 columns of every row of the
/// trunk's layer1, copied in 128-byte pieces (13-17 ms of a W=7680 call on 2 threads).
struct Window {
    buf: Buffer,
    pitch: usize,
}

impl Window {
    /// Floats of the window of a value of `rows` rows of `width` columns, `pitch` apart.
    fn len(rows: usize, pitch: usize, width: usize) -> usize {
        (rows * pitch + width) * 4
    }

    /// The kernel's view of `len` floats from column `x` of the first row.
    fn columns(&self, x: usize, len: usize) -> &[f32] {
        &self.rows_from(x)[..len]
    }

    fn columns_mut(&mut self, x: usize, len: usize) -> &mut [f32] {
        &mut self.buf[x * 4..][..len]
    }

    /// The buffer from column `x` of the first row on: its rows, `pitch` columns apart.
    fn rows_from(&self, x: usize) -> &[f32] {
        &self.buf[x * 4..]
    }
}

/// A workspace buffer of `len` floats for a streamed segment (see [`REUSE_SLACK`]), its
/// failure as a graph error.
fn take_buffer(workspace: &mut Workspace, len: usize) -> Result<Buffer, GraphError> {
    workspace
        .take_within(len, REUSE_SLACK)
        .map_err(|e| GraphError::Workspace {
            bytes: len * 4,
            message: e.to_string(),
        })
}
