//! Values that live in a slice of another value's buffer: a concat's inputs written straight
//! into their place in its output, and an aligned block of channels read where it lies.
//!
//! In `nChw4c` with one image, the channels `c..c + k` of a tensor, `c` a multiple of 4, are
//! one contiguous run of its buffer, `[c / 4 blocks][H][W][4]`: a tensor of `k` channels
//! laid out as if it had its own buffer. So a producer whose output is a concat's input can
//! write it there, and the concat runs nothing; and a `select_channels` of such a run is that
//! run, read in place. The planning is static (`InPlace::plan`, on the optimized graph); a
//! run keeps the groups its batch and its streamed segment allow (`InPlace::at_run`).

use primjit_codegen::Layout;
use primjit_ir::{Graph, Op, Shapes, Value};

/// Where a value lives in another's buffer: its `root` (a value that owns a buffer) and its
/// first channel there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Home {
    pub(super) root: Value,
    pub(super) channel: usize,
}

/// The static plan: per value its home, if any, and per node whether it runs nothing (a
/// concat whose inputs are already in place, a `select_channels` read in place).
#[derive(Clone, Debug)]
pub(super) struct InPlace {
    home: Vec<Option<Home>>,
    elided: Vec<bool>,
    /// Per value: the index of the node computing it, `None` for a graph input.
    producer: Vec<Option<usize>>,
}

impl InPlace {
    /// Plans the homes of `graph`'s values (`shapes`: its symbolic shapes; `overwrites`: per
    /// node, the residual its conv may write over, `run::residual_overwrites`).
    ///
    /// Concats are taken last to first, so that a concat's output that a later concat already
    /// placed passes that place on to its own inputs (a chain of concats, as DenseNet's, then
    /// shares the last one's buffer), and a concat whose inputs already lie side by side in
    /// one buffer becomes that slice. A concat's inputs move only all together, and each input
    /// must be:
    /// - computed by a node, not a graph input, and not a graph output;
    /// - not yet placed, and not another input of the same concat;
    /// - not a residual that a conv writes its output over (that conv would take the buffer);
    /// - whole blocks of 4 channels, but for the last input, whose padding lanes are the
    ///   concat's.
    ///
    /// Then each `select_channels` of consecutive channels starting on a block, and ending on
    /// one or at the input's last channel, is a view of its input, unless it is a graph output
    /// or its input's buffer is one a conv writes over.
    pub(super) fn plan(graph: &Graph, shapes: &Shapes, overwrites: &[Option<Value>]) -> Self {
        let values = graph.values().count();
        let mut home: Vec<Option<Home>> = vec![None; values];
        let mut elided = vec![false; graph.node_count()];
        let channels = |v: Value| -> Option<usize> {
            shapes
                .get(v)?
                .get(1)?
                .known()
                .and_then(|c| usize::try_from(c).ok())
        };
        let mut producer = vec![None; values];
        for (i, (_, node)) in graph.nodes().enumerate() {
            producer[node.result.index()] = Some(i);
        }
        let is_output = |v: Value| graph.outputs().iter().any(|(_, o)| *o == v);
        let overwritten = |v: Value| overwrites.iter().flatten().any(|r| *r == v);
        let nodes: Vec<_> = graph.nodes().map(|(_, n)| n).collect();

        for (i, node) in nodes.iter().enumerate().rev() {
            let Op::Concat { inputs } = &node.op else {
                continue;
            };
            let o = node.result;
            if overwritten(o) {
                continue;
            }
            let Some(widths) = inputs
                .iter()
                .map(|&v| channels(v))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let aligned = widths[..widths.len() - 1].iter().all(|c| c % 4 == 0);
            let offsets: Vec<usize> = widths
                .iter()
                .scan(0, |at, c| {
                    let first = *at;
                    *at += c;
                    Some(first)
                })
                .collect();
            // The inputs already lie side by side in one buffer: the output is that slice.
            let placed: Option<Vec<Home>> = inputs.iter().map(|v| home[v.index()]).collect();
            if let Some(placed) = placed {
                let first = placed[0];
                let side_by_side = placed
                    .iter()
                    .zip(&offsets)
                    .all(|(h, off)| h.root == first.root && h.channel == first.channel + off);
                if side_by_side && home[o.index()].is_none() && !is_output(o) {
                    home[o.index()] = Some(first);
                    elided[i] = true;
                }
                continue;
            }
            let distinct = inputs
                .iter()
                .enumerate()
                .all(|(j, v)| !inputs[..j].contains(v));
            let movable = |v: Value| {
                producer[v.index()].is_some()
                    && home[v.index()].is_none()
                    && !is_output(v)
                    && !overwritten(v)
                    && v != o
            };
            if !(aligned && distinct && inputs.iter().all(|&v| movable(v))) {
                continue;
            }
            let base = home[o.index()].unwrap_or(Home {
                root: o,
                channel: 0,
            });
            for (v, off) in inputs.iter().zip(&offsets) {
                home[v.index()] = Some(Home {
                    root: base.root,
                    channel: base.channel + off,
                });
            }
            elided[i] = true;
        }

        for (i, node) in nodes.iter().enumerate() {
            let Op::SelectChannels { input, select } = &node.op else {
                continue;
            };
            let (Some(first), Some(total)) = (select.first().copied(), channels(*input)) else {
                continue;
            };
            let consecutive = select.iter().enumerate().all(|(j, &c)| c == first + j);
            let end = first + select.len();
            let blocks = first % 4 == 0 && (end % 4 == 0 || end == total);
            let source = home[input.index()].unwrap_or(Home {
                root: *input,
                channel: 0,
            });
            let v = node.result;
            if consecutive
                && blocks
                && producer[input.index()].is_some()
                && home[v.index()].is_none()
                && !is_output(v)
                && !overwritten(source.root)
                && !overwritten(v)
            {
                home[v.index()] = Some(Home {
                    root: source.root,
                    channel: source.channel + first,
                });
                elided[i] = true;
            }
        }
        InPlace {
            home,
            elided,
            producer,
        }
    }

    /// The plan a run follows: the groups (a root and the values placed in it) whose root
    /// holds one image (`batch`) and whose values are all computed at or after node
    /// `whole_from`, the first that runs on whole tensors; the others' values get buffers of
    /// their own and their concats and selections run.
    pub(super) fn at_run(
        &self,
        graph: &Graph,
        whole_from: usize,
        batch: impl Fn(Value) -> usize,
    ) -> InPlace {
        let early = |v: usize| self.producer[v].is_none_or(|p| p < whole_from);
        let mut kept = vec![true; self.home.len()];
        for (v, h) in self.home.iter().enumerate() {
            if let Some(h) = h
                && (early(v) || early(h.root.index()) || batch(h.root) != 1)
            {
                kept[h.root.index()] = false;
            }
        }
        let home: Vec<Option<Home>> = self
            .home
            .iter()
            .map(|h| h.filter(|h| kept[h.root.index()]))
            .collect();
        // A concat runs nothing if its output keeps its place, or is the root its inputs were
        // placed in and keeps them.
        let elided = graph
            .nodes()
            .zip(&self.elided)
            .map(|((_, node), &e)| {
                let o = node.result.index();
                e && match self.home[o] {
                    Some(_) => home[o].is_some(),
                    None => kept[o],
                }
            })
            .collect();
        InPlace {
            home,
            elided,
            producer: self.producer.clone(),
        }
    }

    /// This plan with no value placed in another's buffer: every concat and selection runs.
    pub(super) fn none(&self) -> Self {
        InPlace {
            home: vec![None; self.home.len()],
            elided: vec![false; self.elided.len()],
            producer: self.producer.clone(),
        }
    }

    /// Where `v` lives, if in another value's buffer.
    pub(super) fn home(&self, v: Value) -> Option<Home> {
        self.home[v.index()]
    }

    /// Whether node `i` runs nothing: its output is already in place.
    pub(super) fn elided(&self, i: usize) -> bool {
        self.elided[i]
    }

    /// The value that owns `v`'s buffer: its root, or itself.
    pub(super) fn owner(&self, v: Value) -> Value {
        self.home(v).map_or(v, |h| h.root)
    }

    /// Per value: the index of the last node reading it or anything placed in its buffer
    /// (after which its buffer goes back), from `last_use`; a placed value's own entry is
    /// unused.
    pub(super) fn releases(&self, last_use: &[usize]) -> Vec<usize> {
        let mut release = last_use.to_vec();
        for (v, h) in self.home.iter().enumerate() {
            if let Some(h) = h {
                let r = h.root.index();
                release[r] = release[r].max(last_use[v]);
            }
        }
        release
    }

    /// The float range of placed value `v` (of NCHW shape `shape`, one image) in its root's
    /// buffer.
    pub(super) fn range(home: Home, shape: [usize; 4]) -> std::ops::Range<usize> {
        let start = home.channel * shape[2] * shape[3];
        start..start + Layout::Nchw4c.buffer_len(shape)
    }
}
