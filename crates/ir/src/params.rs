//! Parameter values: dense f32 tensors by name, drawn from a seed or loaded, and derived ones.

use std::borrow::Cow;
use std::collections::BTreeMap;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::graph::{DerivedParam, Graph, Op, Param};

/// A dense row-major f32 tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor of the given shape; fails when `data` has the wrong length.
    /// A shape whose element count overflows `usize` is reported as needing `usize::MAX`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self, ParamError> {
        let expected = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if expected != Some(data.len()) {
            return Err(ParamError::Length {
                shape,
                expected: expected.unwrap_or(usize::MAX),
                found: data.len(),
            });
        }
        Ok(Tensor { shape, data })
    }

    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Tensor {
            shape,
            data: vec![0.0; n],
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Errors about parameter values.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ParamError {
    /// A parameter the graph declares has no value ([`Params::materialize`],
    /// [`Params::for_graph`], and so `CompiledGraph::new` and the reference's `run_graph`). Supply it under its declared name
    /// (without the `@`), e.g. in the `.safetensors` file.
    #[error("parameter @{name} is missing (expected shape {expected:?})")]
    Missing { name: String, expected: Vec<usize> },
    /// A parameter's value has a shape other than the declared one. Fix the value or the
    /// declaration.
    #[error("parameter @{name} has shape {found:?} but the graph declares {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A derived parameter's declared shape disagrees with the parameters it is computed from
    /// ([`Params::materialize`], [`Params::for_graph`]); `Graph::verify` reports the same
    /// fault at its line. Fix the declarations.
    #[error("derived parameter @{name}: {message}")]
    Derived { name: String, message: String },
    /// A tensor's data does not fill its shape ([`Tensor::new`]). Pass exactly the product of
    /// the shape's extents.
    #[error("tensor data has {found} elements but shape {shape:?} needs {expected}")]
    Length {
        shape: Vec<usize>,
        expected: usize,
        found: usize,
    },
}

/// Parameter values by name (without the `@`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    tensors: BTreeMap<String, Tensor>,
}

/// FNV-1a, so that each parameter's random stream depends only on the seed and its name.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `n` values uniform in `[lo, hi)`, from a stream keyed by `seed` and `name`.
///
/// Each value is the top 24 bits of one `u32` of ChaCha8 scaled into the range: exactly
/// representable, stable across platforms, and independent of the `rand` crate's
/// distribution algorithms.
pub fn random_tensor(seed: u64, name: &str, shape: Vec<usize>, lo: f32, hi: f32) -> Tensor {
    use rand::Rng;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ name_hash(name));
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            let unit = (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32;
            lo + (hi - lo) * unit
        })
        .collect();
    Tensor { shape, data }
}

/// How a parameter is used, which decides the range it is drawn from.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Role {
    ConvWeight { fan_in: usize },
    Scale,
    Variance,
    Other,
}

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) {
        self.tensors.insert(name.into(), tensor);
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Draws every non-derived parameter of `graph` from `seed`, then computes the derived ones.
    ///
    /// The distribution keeps activations of deep residual stacks in a sane range:
    /// conv weights uniform in `±sqrt(3 / fan_in)` (unit gain); batch-norm scales in
    /// `[0.5, 1)`, variances in `[0.5, 1.5)`; biases, shifts and means in `[-0.1, 0.1)`.
    pub fn random(graph: &Graph, seed: u64) -> Self {
        let mut roles = vec![Role::Other; graph.params.len()];
        for (_, node) in graph.nodes() {
            match &node.op {
                Op::Conv2d(c) => {
                    let s = &graph.param(c.weight).shape;
                    roles[c.weight.index()] = Role::ConvWeight {
                        fan_in: s.iter().skip(1).product::<usize>().max(1),
                    };
                }
                // Each output pixel sums about `I / groups * KH * KW / (strides)` taps; the
                // weight's own channels times its window is the usual (PyTorch's) fan-in.
                Op::ConvTranspose(c) => {
                    let s = &graph.param(c.weight).shape;
                    roles[c.weight.index()] = Role::ConvWeight {
                        fan_in: s.iter().skip(1).product::<usize>().max(1),
                    };
                }
                Op::BatchNorm(b) => {
                    roles[b.scale.index()] = Role::Scale;
                    roles[b.var.index()] = Role::Variance;
                }
                _ => {}
            }
        }
        for (_, data) in graph.params() {
            match &data.derived {
                Some(DerivedParam::BnFoldWeight { scale, var, .. })
                | Some(DerivedParam::BnScale { scale, var, .. })
                | Some(DerivedParam::BnFoldBias { scale, var, .. }) => {
                    roles[scale.index()] = Role::Scale;
                    roles[var.index()] = Role::Variance;
                }
                None => {}
            }
        }
        let mut params = Params::new();
        for (p, data) in graph.params() {
            if data.derived.is_some() {
                continue;
            }
            let (lo, hi) = match roles[p.index()] {
                Role::ConvWeight { fan_in } => {
                    let b = (3.0 / fan_in as f32).sqrt();
                    (-b, b)
                }
                Role::Scale => (0.5, 1.0),
                Role::Variance => (0.5, 1.5),
                Role::Other => (-0.1, 0.1),
            };
            params.insert(
                data.name.clone(),
                random_tensor(seed, &data.name, data.shape.clone(), lo, hi),
            );
        }
        // Derived parameters that disagree with their sources are left out: `for_graph`,
        // `materialize` and `Graph::verify` report them, and no value could be computed.
        let _ = params.materialize(graph);
        params
    }

    /// Checks every non-derived parameter against the graph's declarations, then computes the
    /// derived parameters (replacing any stale values of theirs).
    pub fn materialize(&mut self, graph: &Graph) -> Result<(), ParamError> {
        self.check(graph)?;
        // A derived parameter's sources come before it (`Graph::add_param` takes only
        // existing ones), so in declaration order every source is present when it is read.
        for (_, data) in graph.params() {
            if let Some(d) = &data.derived {
                let t = derive(d, &data.shape, |p| &self.tensors[&graph.param(p).name].data);
                self.tensors.insert(data.name.clone(), t);
            }
        }
        Ok(())
    }

    /// `graph`'s parameter values as read from these: declared ones borrowed, derived ones
    /// computed when asked for ([`GraphParams::get`]), so that nothing derived is kept. Fails as
    /// [`Params::materialize`] does when a declared parameter is missing or of another shape.
    pub fn for_graph<'a>(&'a self, graph: &'a Graph) -> Result<GraphParams<'a>, ParamError> {
        self.check(graph)?;
        Ok(GraphParams {
            params: self,
            graph,
        })
    }

    /// Checks every non-derived parameter of `graph` against its declaration, and every
    /// derived one's declared shape against its sources' (what [`derive`] relies on).
    fn check(&self, graph: &Graph) -> Result<(), ParamError> {
        for (_, data) in graph.params() {
            if let Some(d) = &data.derived {
                check_derived(graph, d, &data.shape).map_err(|message| ParamError::Derived {
                    name: data.name.clone(),
                    message,
                })?;
                continue;
            }
            match self.tensors.get(&data.name) {
                None => {
                    return Err(ParamError::Missing {
                        name: data.name.clone(),
                        expected: data.shape.clone(),
                    });
                }
                Some(t) if t.shape != data.shape => {
                    return Err(ParamError::Shape {
                        name: data.name.clone(),
                        expected: data.shape.clone(),
                        found: t.shape.clone(),
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// A graph's parameter values, its declared parameters checked ([`Params::for_graph`]).
///
/// A derived parameter is computed each time it is asked for and handed over, bit for bit the
/// value [`Params::materialize`] stores: a caller that needs each value once (packing a
/// convolution's weights) holds one derived tensor at a time instead of all of them.
#[derive(Clone, Copy, Debug)]
pub struct GraphParams<'a> {
    params: &'a Params,
    graph: &'a Graph,
}

impl<'a> GraphParams<'a> {
    /// The value of `p`, a parameter of the graph: borrowed when declared, computed when
    /// derived (with the derived parameters it reads, which are dropped again).
    pub fn get(&self, p: Param) -> Cow<'a, Tensor> {
        let graph = self.graph;
        let declared = |q: Param| -> &'a Tensor { &self.params.tensors[&graph.param(q).name] };
        if graph.param(p).derived.is_none() {
            return Cow::Borrowed(declared(p));
        }
        // Every derived parameter `p` reads, directly or through others. Sources have lower
        // indices than their readers, so ascending order computes each before it is read.
        let mut needed = vec![p];
        let mut pending = vec![p];
        while let Some(q) = pending.pop() {
            for s in graph.param(q).derived.iter().flat_map(|d| d.sources()) {
                if graph.param(s).derived.is_some() && !needed.contains(&s) {
                    needed.push(s);
                    pending.push(s);
                }
            }
        }
        needed.sort_unstable();
        let mut computed: Vec<(Param, Tensor)> = Vec::with_capacity(needed.len());
        for q in needed {
            let data = graph.param(q);
            let d = data
                .derived
                .as_ref()
                .expect("only derived parameters are needed");
            let t = derive(d, &data.shape, |s| {
                match computed.iter().find(|(c, _)| *c == s) {
                    Some((_, t)) => &t.data,
                    None => &declared(s).data,
                }
            });
            computed.push((q, t));
        }
        let (_, value) = computed.pop().expect("`p` itself is needed");
        Cow::Owned(value)
    }
}

/// Whether a derived parameter of `shape` can be computed from its sources' declared shapes
/// ([`DerivedParam::source_shapes`], as verification checks them), else why not.
fn check_derived(graph: &Graph, d: &DerivedParam, shape: &[usize]) -> Result<(), String> {
    for source in d.source_shapes(shape)? {
        let declared = graph.param(source.param);
        if declared.shape != source.shape {
            return Err(format!(
                "{} @{} must have shape {:?}, found {:?}",
                source.role, declared.name, source.shape, declared.shape
            ));
        }
    }
    Ok(())
}

/// The value of a derived parameter of `shape`, its sources read through `data`; `shape`
/// agrees with its sources' (checked by [`check_derived`]).
fn derive<'t>(d: &DerivedParam, shape: &[usize], data: impl Fn(Param) -> &'t [f32]) -> Tensor {
    let inv_std = |var: Param, eps: f32| -> Vec<f64> {
        data(var)
            .iter()
            .map(|&v| 1.0 / (v as f64 + eps as f64).sqrt())
            .collect()
    };
    match d {
        DerivedParam::BnFoldWeight {
            weight,
            scale,
            var,
            epsilon,
        } => {
            let w = data(*weight);
            let s = data(*scale);
            let inv = inv_std(*var, *epsilon);
            // At least 1: a weight with no elements (an extent of 0) maps nothing.
            let per_out = (w.len() / shape[0].max(1)).max(1);
            let values = w
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    let o = i / per_out;
                    (x as f64 * s[o] as f64 * inv[o]) as f32
                })
                .collect();
            Tensor {
                shape: shape.to_vec(),
                data: values,
            }
        }
        DerivedParam::BnScale {
            scale,
            var,
            epsilon,
        } => {
            let inv = inv_std(*var, *epsilon);
            let values = data(*scale)
                .iter()
                .zip(&inv)
                .map(|(&s, inv)| (s as f64 * inv) as f32)
                .collect();
            Tensor {
                shape: shape.to_vec(),
                data: values,
            }
        }
        DerivedParam::BnFoldBias {
            conv_bias,
            scale,
            bias,
            mean,
            var,
            epsilon,
        } => {
            let s = data(*scale);
            let b = data(*bias);
            let m = data(*mean);
            let inv = inv_std(*var, *epsilon);
            let cb = conv_bias.map(&data);
            let values = (0..shape[0])
                .map(|o| {
                    let c = cb.map_or(0.0, |cb| cb[o] as f64);
                    ((c - m[o] as f64) * s[o] as f64 * inv[o] + b[o] as f64) as f32
                })
                .collect();
            Tensor {
                shape: shape.to_vec(),
                data: values,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tensor_is_deterministic_and_in_range() {
        let a = random_tensor(7, "w", vec![1000], -0.5, 0.5);
        let b = random_tensor(7, "w", vec![1000], -0.5, 0.5);
        let c = random_tensor(7, "v", vec![1000], -0.5, 0.5);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.data.iter().all(|&x| (-0.5..0.5).contains(&x)));
        let mean: f32 = a.data.iter().sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.05, "mean {mean}");
    }

    /// A conv followed by two batch-norms: folding both makes the second fold read the
    /// first's derived weight and bias.
    const TWO_BATCHNORMS: &str = "graph g {
  input %x: f32[1, 3, 6, 6]
  param @w: f32[4, 3, 3, 3]
  param @b: f32[4]
  param @s1: f32[4]
  param @t1: f32[4]
  param @m1: f32[4]
  param @v1: f32[4]
  param @s2: f32[4]
  param @t2: f32[4]
  param @m2: f32[4]
  param @v2: f32[4]
  %c = conv2d(%x, @w, bias=@b, pads=[1, 1, 1, 1])
  %n1 = batchnorm(%c, @s1, @t1, @m1, @v1)
  %n2 = batchnorm(%n1, @s2, @t2, @m2, @v2)
  output y = %n2
}
";

    #[test]
    fn graph_params_compute_what_materialize_stores() {
        let mut g = crate::parse(TWO_BATCHNORMS).unwrap();
        let params = Params::random(&g, 5);
        assert_eq!(crate::passes::fold_batchnorm(&mut g), 2);
        let reads_derived = |d: &DerivedParam| {
            d.sources()
                .into_iter()
                .any(|s| g.param(s).derived.is_some())
        };
        assert!(
            g.params()
                .any(|(_, p)| p.derived.as_ref().is_some_and(reads_derived))
        );
        let mut materialized = params.clone();
        materialized.materialize(&g).unwrap();
        let view = params.for_graph(&g).unwrap();
        let mut derived = 0;
        for (p, data) in g.params() {
            let value = view.get(p);
            assert_eq!(
                matches!(value, Cow::Owned(_)),
                data.derived.is_some(),
                "@{}",
                data.name
            );
            if data.derived.is_some() {
                derived += 1;
            }
            // Bit for bit: the same arithmetic in the same order.
            let want = materialized.get(&data.name).unwrap();
            assert_eq!(value.shape, want.shape, "@{}", data.name);
            let bits = |t: &Tensor| t.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&value), bits(want), "@{}", data.name);
        }
        // Two folded weights and biases, the second pair computed from the first.
        assert_eq!(derived, 4);
        // Nothing derived was added to the caller's values.
        assert_eq!(params.iter().count(), 10);
    }

    #[test]
    fn for_graph_checks_declared_parameters() {
        let g = crate::parse(TWO_BATCHNORMS).unwrap();
        let mut params = Params::random(&g, 5);
        params.insert("s2", Tensor::zeros(vec![3]));
        assert!(matches!(
            params.for_graph(&g),
            Err(ParamError::Shape { name, .. }) if name == "s2"
        ));
        let mut missing = Params::new();
        for (name, t) in params.iter().filter(|(n, _)| *n != "v1") {
            missing.insert(name, t.clone());
        }
        assert!(matches!(
            missing.for_graph(&g),
            Err(ParamError::Missing { name, .. }) if name == "v1"
        ));
    }

    #[test]
    fn derived_parameters_that_disagree_with_their_sources_are_errors_not_panics() {
        // Parsed but not verified: the folded weight's scale has 2 channels, not 4; a folded
        // bias of rank 2.
        for (text, bad) in [
            (
                "graph g {
  input %x: f32[1, 3, 6, 6]
  param @w: f32[4, 3, 1, 1]
  param @s: f32[2]
  param @v: f32[4]
  param @w2: f32[4, 3, 1, 1] = bnfold_weight(@w, @s, @v, epsilon=0.001)
  %c = conv2d(%x, @w2)
  output y = %c
}
",
                "the scale @s must have shape [4], found [2]",
            ),
            (
                "graph g {
  input %x: f32[1, 3, 6, 6]
  param @w: f32[4, 3, 1, 1]
  param @s: f32[4]
  param @t: f32[4]
  param @m: f32[4]
  param @v: f32[4]
  param @b2: f32[4, 1] = bnfold_bias(@s, @t, @m, @v, epsilon=0.001)
  %c = conv2d(%x, @w)
  output y = %c
}
",
                "a folded bias must have rank 1, found [4, 1]",
            ),
        ] {
            let g = crate::parse(text).unwrap();
            let mut params = Params::random(&g, 1);
            let name = if text.contains("@w2") { "w2" } else { "b2" };
            assert!(params.get(name).is_none(), "{text}");
            let want = ParamError::Derived {
                name: name.into(),
                message: bad.into(),
            };
            assert_eq!(params.for_graph(&g).err(), Some(want.clone()));
            assert_eq!(params.materialize(&g), Err(want));
        }
    }

    #[test]
    fn tensor_new_checks_length() {
        assert!(Tensor::new(vec![2, 3], vec![0.0; 6]).is_ok());
        assert_eq!(
            Tensor::new(vec![2, 3], vec![0.0; 5]),
            Err(ParamError::Length {
                shape: vec![2, 3],
                expected: 6,
                found: 5
            })
        );
        // The element count overflows: an error, not a wrapped product that matches.
        assert_eq!(
            Tensor::new(vec![1 << 32, 1 << 32], vec![]),
            Err(ParamError::Length {
                shape: vec![1 << 32, 1 << 32],
                expected: usize::MAX,
                found: 0
            })
        );
    }
}
