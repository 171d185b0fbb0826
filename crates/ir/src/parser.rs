//! The parser of the text format: a lexer, a generic call syntax, and per-op interpretation.
//!
//! Ops and derived parameters share one syntax, `name(operands..., key=value...)`, parsed
//! first into a [`Call`] and then checked against what each op accepts, so that every error
//! points at the token at fault.

use std::num::IntErrorKind;

use crate::auto_pad::AutoPad;
use crate::conv_transpose::ConvTranspose2d;
use crate::dim::{Dim, is_symbol};
use crate::error::{ParseError, SourceLoc};
use crate::graph::{
    Activation, BatchNorm, BinaryKind, Conv2d, DerivedParam, Graph, NodeData, Op, Pads, Param,
    ParamData, Pool2d, PoolKind, PoolWindow, PostOp, Value,
};
use crate::resize::{CoordMode, NearestMode, Resize, ResizeMode, ResizeSize, ScaleFactor};

/// Parses IR text into a graph. Names are resolved; shapes and attributes are not yet checked
/// against each other (see [`crate::infer_shapes`]).
pub fn parse(source: &str) -> Result<Graph, ParseError> {
    let tokens = lex(source)?;
    Parser {
        tokens,
        pos: 0,
        graph: Graph::new(""),
        depth: 0,
    }
    .file()
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    ValueRef(String),
    ParamRef(String),
    Number(String),
    Punct(char),
    Eof,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::ValueRef(s) => format!("`%{s}`"),
            Tok::ParamRef(s) => format!("`@{s}`"),
            Tok::Number(s) => format!("`{s}`"),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Eof => "end of file".to_string(),
        }
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

fn lex(source: &str) -> Result<Vec<(Tok, SourceLoc)>, ParseError> {
    let mut out = Vec::new();
    for (line_idx, line) in source.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        let loc = |i: usize| SourceLoc {
            line: line_idx as u32 + 1,
            col: i as u32 + 1,
        };
        while i < chars.len() {
            let c = chars[i];
            let start = i;
            if c == '#' {
                break;
            } else if c.is_whitespace() {
                i += 1;
            } else if c == '%' || c == '@' {
                i += 1;
                while i < chars.len() && is_name_char(chars[i]) {
                    i += 1;
                }
                let name: String = chars[start + 1..i].iter().collect();
                if name.is_empty() {
                    let what = if c == '%' { "value" } else { "parameter" };
                    return Err(ParseError {
                        loc: loc(start),
                        message: format!("expected a {what} name after `{c}`"),
                    });
                }
                out.push((
                    if c == '%' {
                        Tok::ValueRef(name)
                    } else {
                        Tok::ParamRef(name)
                    },
                    loc(start),
                ));
            } else if c.is_ascii_alphabetic() || c == '_' {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                out.push((Tok::Ident(chars[start..i].iter().collect()), loc(start)));
            } else if c.is_ascii_digit()
                || ((c == '-' || c == '+')
                    && chars
                        .get(i + 1)
                        .is_some_and(|d| d.is_ascii_digit() || *d == '.'))
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
            {
                i += 1;
                while i < chars.len() {
                    let d = chars[i];
                    let exp_sign = (d == '-' || d == '+') && matches!(chars[i - 1], 'e' | 'E');
                    if d.is_ascii_alphanumeric() || d == '.' || exp_sign {
                        i += 1;
                    } else {
                        break;
                    }
                }
                out.push((Tok::Number(chars[start..i].iter().collect()), loc(start)));
            } else if "{}()[],:=".contains(c) {
                i += 1;
                out.push((Tok::Punct(c), loc(start)));
            } else {
                return Err(ParseError {
                    loc: loc(start),
                    message: format!("unexpected character `{c}`"),
                });
            }
        }
    }
    let lines = source.lines().count();
    let last_len = source.lines().last().map_or(0, |l| l.chars().count());
    out.push((
        Tok::Eof,
        SourceLoc {
            line: lines.max(1) as u32,
            col: last_len as u32 + 1,
        },
    ));
    Ok(out)
}

/// A parsed `name(args)` before it is interpreted as an op, post-op or derived parameter.
#[derive(Debug)]
struct Call {
    name: String,
    loc: SourceLoc,
    positional: Vec<(Arg, SourceLoc)>,
    attrs: Vec<(String, SourceLoc, Arg, SourceLoc)>,
}

#[derive(Debug)]
enum Arg {
    Value(String),
    Param(String),
    Number(String),
    Ident(String),
    List(Vec<(Arg, SourceLoc)>),
    Call(Call),
}

struct Parser {
    tokens: Vec<(Tok, SourceLoc)>,
    pos: usize,
    graph: Graph,
    /// How many operands enclose the one being parsed, bounded by [`MAX_NESTING`].
    depth: usize,
}

/// The deepest nesting of lists and calls in operands; the format needs 4
/// (`post=[maxpool(kernel=[3, 3])]`), and the bound keeps the recursive parser's stack small
/// on hostile input.
const MAX_NESTING: usize = 32;

fn err<T>(loc: SourceLoc, message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError {
        loc,
        message: message.into(),
    })
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.tokens[self.pos].0
    }

    fn loc(&self) -> SourceLoc {
        self.tokens[self.pos].1
    }

    fn next(&mut self) -> (Tok, SourceLoc) {
        let t = self.tokens[self.pos].clone();
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn expect_punct(&mut self, c: char) -> Result<SourceLoc, ParseError> {
        let (t, loc) = self.next();
        if t == Tok::Punct(c) {
            Ok(loc)
        } else {
            err(loc, format!("expected `{c}`, found {}", t.describe()))
        }
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }

    fn expect_ident(&mut self, what: &str) -> Result<(String, SourceLoc), ParseError> {
        match self.next() {
            (Tok::Ident(s), loc) => Ok((s, loc)),
            (t, loc) => err(loc, format!("expected {what}, found {}", t.describe())),
        }
    }

    fn expect_keyword(&mut self, kw: &str) -> Result<SourceLoc, ParseError> {
        match self.next() {
            (Tok::Ident(s), loc) if s == kw => Ok(loc),
            (t, loc) => err(loc, format!("expected `{kw}`, found {}", t.describe())),
        }
    }

    fn file(mut self) -> Result<Graph, ParseError> {
        self.expect_keyword("graph")?;
        let (name, _) = self.expect_ident("a graph name")?;
        self.graph.name = name;
        self.expect_punct('{')?;
        loop {
            let (tok, loc) = self.next();
            match tok {
                Tok::Punct('}') => break,
                Tok::Ident(kw) if kw == "input" => self.input()?,
                Tok::Ident(kw) if kw == "param" => self.param()?,
                Tok::Ident(kw) if kw == "output" => self.output()?,
                Tok::ValueRef(name) => self.node(name, loc)?,
                t => {
                    return err(
                        loc,
                        format!(
                            "expected `input`, `param`, `output`, a `%value` definition or `}}`, found {}",
                            t.describe()
                        ),
                    );
                }
            }
        }
        match self.next() {
            (Tok::Eof, _) => Ok(self.graph),
            (t, loc) => err(
                loc,
                format!(
                    "expected end of file after the graph, found {}",
                    t.describe()
                ),
            ),
        }
    }

    fn shape(&mut self, allow_symbols: bool) -> Result<Vec<Dim>, ParseError> {
        match self.next() {
            (Tok::Ident(t), _) if t == "f32" => {}
            (t, loc) => {
                return err(
                    loc,
                    format!(
                        "expected a tensor type such as `f32[1, 3, 320, W]`, found {}",
                        t.describe()
                    ),
                );
            }
        }
        self.expect_punct('[')?;
        let mut dims = Vec::new();
        if !self.eat_punct(']') {
            loop {
                match self.next() {
                    (Tok::Number(n), loc) => match n.parse::<u64>() {
                        Ok(v) if v > 0 => dims.push(Dim::Known(v)),
                        Err(e) if *e.kind() == IntErrorKind::PosOverflow => {
                            return err(
                                loc,
                                format!("the dimension `{n}` is too large: at most {}", u64::MAX),
                            );
                        }
                        _ => {
                            return err(
                                loc,
                                format!("a dimension must be a positive integer, found `{n}`"),
                            );
                        }
                    },
                    (Tok::Ident(s), loc) => {
                        if !allow_symbols {
                            return err(
                                loc,
                                format!("parameter shapes must be numbers, found symbol `{s}`"),
                            );
                        }
                        if !is_symbol(&s) {
                            return err(loc, format!("`{s}` is not a valid symbol"));
                        }
                        dims.push(Dim::Sym(s));
                    }
                    (t, loc) => {
                        return err(loc, format!("expected a dimension, found {}", t.describe()));
                    }
                }
                if self.eat_punct(']') {
                    break;
                }
                self.expect_punct(',')?;
            }
        }
        Ok(dims)
    }

    fn input(&mut self) -> Result<(), ParseError> {
        let (tok, loc) = self.next();
        let Tok::ValueRef(name) = tok else {
            return err(
                loc,
                format!(
                    "expected an input name such as `%x`, found {}",
                    tok.describe()
                ),
            );
        };
        self.expect_punct(':')?;
        let shape = self.shape(true)?;
        let Some(value) = self.graph.add_input(&name, shape) else {
            return err(loc, format!("value `%{name}` is defined twice"));
        };
        let input = self.graph.inputs.last_mut().expect("just added");
        debug_assert_eq!(input.value, value);
        input.loc = Some(loc);
        Ok(())
    }

    fn param(&mut self) -> Result<(), ParseError> {
        let (tok, loc) = self.next();
        let Tok::ParamRef(name) = tok else {
            return err(
                loc,
                format!(
                    "expected a parameter name such as `@conv1.weight`, found {}",
                    tok.describe()
                ),
            );
        };
        self.expect_punct(':')?;
        let dims = self.shape(false)?;
        let shape = dims
            .iter()
            .map(|d| d.known().expect("numbers only") as usize)
            .collect();
        let derived = if self.eat_punct('=') {
            let call = self.call()?;
            Some(self.derived(call)?)
        } else {
            None
        };
        if self
            .graph
            .add_param(ParamData {
                name: name.clone(),
                shape,
                derived,
                loc: Some(loc),
            })
            .is_none()
        {
            return err(loc, format!("parameter `@{name}` is declared twice"));
        }
        Ok(())
    }

    fn output(&mut self) -> Result<(), ParseError> {
        let (name, loc) = self.expect_ident("an output name")?;
        self.expect_punct('=')?;
        let value = match self.next() {
            (Tok::ValueRef(v), vloc) => self.resolve_value(&v, vloc)?,
            (t, loc) => {
                return err(
                    loc,
                    format!("expected a value such as `%y`, found {}", t.describe()),
                );
            }
        };
        if !self.graph.add_output(&name, value) {
            return err(loc, format!("output `{name}` is declared twice"));
        }
        Ok(())
    }

    fn call(&mut self) -> Result<Call, ParseError> {
        let (name, loc) = self.expect_ident("an op name")?;
        self.call_args(name, loc)
    }

    fn call_args(&mut self, name: String, loc: SourceLoc) -> Result<Call, ParseError> {
        let mut call = Call {
            name,
            loc,
            positional: Vec::new(),
            attrs: Vec::new(),
        };
        self.expect_punct('(')?;
        if self.eat_punct(')') {
            return Ok(call);
        }
        loop {
            let arg_loc = self.loc();
            let is_attr = matches!(self.peek(), Tok::Ident(_))
                && self.tokens.get(self.pos + 1).map(|t| &t.0) == Some(&Tok::Punct('='));
            if is_attr {
                let (key, key_loc) = self.expect_ident("an attribute name")?;
                self.expect_punct('=')?;
                let value_loc = self.loc();
                let value = self.arg()?;
                if call.attrs.iter().any(|(k, ..)| *k == key) {
                    return err(key_loc, format!("attribute `{key}` is given twice"));
                }
                call.attrs.push((key, key_loc, value, value_loc));
            } else {
                if !call.attrs.is_empty() {
                    return err(arg_loc, "operands must come before attributes");
                }
                let value = self.arg()?;
                call.positional.push((value, arg_loc));
            }
            if self.eat_punct(')') {
                return Ok(call);
            }
            self.expect_punct(',')?;
        }
    }

    fn arg(&mut self) -> Result<Arg, ParseError> {
        if self.depth >= MAX_NESTING {
            return err(self.loc(), "operands are nested too deeply");
        }
        self.depth += 1;
        let arg = self.arg_unbounded();
        self.depth -= 1;
        arg
    }

    fn arg_unbounded(&mut self) -> Result<Arg, ParseError> {
        let (tok, loc) = self.next();
        Ok(match tok {
            Tok::ValueRef(v) => Arg::Value(v),
            Tok::ParamRef(p) => Arg::Param(p),
            Tok::Number(n) => Arg::Number(n),
            Tok::Ident(name) => {
                if *self.peek() == Tok::Punct('(') {
                    Arg::Call(self.call_args(name, loc)?)
                } else {
                    Arg::Ident(name)
                }
            }
            Tok::Punct('[') => {
                let mut items = Vec::new();
                if !self.eat_punct(']') {
                    loop {
                        let item_loc = self.loc();
                        items.push((self.arg()?, item_loc));
                        if self.eat_punct(']') {
                            break;
                        }
                        self.expect_punct(',')?;
                    }
                }
                Arg::List(items)
            }
            t => {
                return err(
                    loc,
                    format!(
                        "expected an operand or attribute value, found {}",
                        t.describe()
                    ),
                );
            }
        })
    }

    fn resolve_value(&self, name: &str, loc: SourceLoc) -> Result<Value, ParseError> {
        // Only values defined so far are visible: definitions come before uses.
        match self.graph.value_by_name(name) {
            Some(v) => Ok(v),
            None => err(loc, format!("unknown value `%{name}`")),
        }
    }

    fn resolve_param(&self, name: &str, loc: SourceLoc) -> Result<Param, ParseError> {
        match self.graph.param_by_name(name) {
            Some(p) => Ok(p),
            None => err(loc, format!("unknown parameter `@{name}`")),
        }
    }

    fn node(&mut self, name: String, loc: SourceLoc) -> Result<(), ParseError> {
        self.expect_punct('=')?;
        let call = self.call()?;
        let op = self.op(call)?;
        let Some(result) = self.graph.add_value(&name) else {
            return err(loc, format!("value `%{name}` is defined twice"));
        };
        self.graph.nodes.push(NodeData {
            op,
            result,
            loc: Some(loc),
        });
        Ok(())
    }

    fn op(&self, call: Call) -> Result<Op, ParseError> {
        let mut a = Attrs::new(self, call);
        let op = match a.call.name.as_str() {
            "conv2d" => {
                a.arity(2, 2)?;
                let input = a.value(0)?;
                let weight = a.param(1)?;
                let bias = a.opt_param("bias")?;
                let strides = a.pair("strides", [1, 1])?;
                let dilations = a.pair("dilations", [1, 1])?;
                let pads = a.pads()?;
                let auto_pad = a.auto_pad()?;
                let groups = a.uint("groups", 1)?;
                let post_ops = a.post_ops()?;
                Op::Conv2d(Conv2d {
                    input,
                    weight,
                    bias,
                    strides,
                    dilations,
                    pads,
                    auto_pad,
                    groups,
                    post_ops,
                })
            }
            "maxpool2d" | "avgpool2d" => {
                let kind = if a.call.name == "maxpool2d" {
                    PoolKind::Max
                } else {
                    PoolKind::Avg
                };
                a.arity(1, 1)?;
                let input = a.value(0)?;
                let window = a.pool_window()?;
                let auto_pad = a.auto_pad()?;
                let count_include_pad = if kind == PoolKind::Avg {
                    a.bool("count_include_pad", false)?
                } else {
                    false
                };
                Op::Pool2d(Pool2d {
                    kind,
                    input,
                    window,
                    auto_pad,
                    count_include_pad,
                })
            }
            "global_avgpool" | "global_maxpool" => {
                let kind = if a.call.name == "global_maxpool" {
                    PoolKind::Max
                } else {
                    PoolKind::Avg
                };
                a.arity(1, 1)?;
                Op::GlobalPool {
                    kind,
                    input: a.value(0)?,
                }
            }
            "relu" => {
                a.arity(1, 1)?;
                Op::Relu { input: a.value(0)? }
            }
            "add" => {
                a.arity(2, 2)?;
                Op::Add {
                    lhs: a.value(0)?,
                    rhs: a.value(1)?,
                }
            }
            "batchnorm" => {
                a.arity(5, 5)?;
                Op::BatchNorm(BatchNorm {
                    input: a.value(0)?,
                    scale: a.param(1)?,
                    bias: a.param(2)?,
                    mean: a.param(3)?,
                    var: a.param(4)?,
                    epsilon: a.float("epsilon", 1e-5)?,
                })
            }
            "prelu" => {
                a.arity(2, 2)?;
                Op::PRelu {
                    input: a.value(0)?,
                    slope: a.param(1)?,
                }
            }
            "add_bcast" | "sub" | "mul" | "div" => {
                let kind = match a.call.name.as_str() {
                    "add_bcast" => BinaryKind::Add,
                    "sub" => BinaryKind::Sub,
                    "mul" => BinaryKind::Mul,
                    _ => BinaryKind::Div,
                };
                a.arity(2, 2)?;
                Op::Binary {
                    kind,
                    lhs: a.value(0)?,
                    rhs: a.value(1)?,
                }
            }
            "concat" => {
                let n = a.call.positional.len();
                a.arity(1, n.max(1))?;
                Op::Concat {
                    inputs: (0..n).map(|i| a.value(i)).collect::<Result<_, _>>()?,
                }
            }
            "select_channels" => {
                a.arity(1, 1)?;
                let input = a.value(0)?;
                let loc = a.call.loc;
                let select = match a.take("select") {
                    Some((Arg::List(items), _)) if !items.is_empty() => items
                        .iter()
                        .map(|(x, l)| uint_arg(x, *l, "select"))
                        .collect::<Result<Vec<_>, _>>()?,
                    Some((_, l)) => {
                        return err(l, "`select` must be a non-empty list of channel indices");
                    }
                    None => return err(loc, "`select_channels` needs the attribute `select`"),
                };
                Op::SelectChannels { input, select }
            }
            "conv_transpose" => {
                a.arity(2, 2)?;
                let input = a.value(0)?;
                let weight = a.param(1)?;
                let bias = a.opt_param("bias")?;
                let strides = a.pair("strides", [1, 1])?;
                let dilations = a.pair("dilations", [1, 1])?;
                let pads = a.pads()?;
                let output_padding = a.pair("output_padding", [0, 0])?;
                let groups = a.uint("groups", 1)?;
                let post_ops = a.post_ops()?;
                if post_ops
                    .iter()
                    .any(|p| matches!(p, PostOp::Add(_) | PostOp::MaxPool(_) | PostOp::PRelu(_)))
                {
                    return err(
                        a.call.loc,
                        "the post-ops of `conv_transpose` are relu, clip and activations",
                    );
                }
                Op::ConvTranspose(ConvTranspose2d {
                    input,
                    weight,
                    bias,
                    strides,
                    dilations,
                    pads,
                    output_padding,
                    groups,
                    post_ops,
                })
            }
            "resize" => {
                a.arity(1, 2)?;
                let input = a.value(0)?;
                let loc = a.call.loc;
                let like = if a.call.positional.len() == 2 {
                    Some(a.value(1)?)
                } else {
                    None
                };
                let linear = match a.take("mode") {
                    None => false,
                    Some((Arg::Ident(m), _)) if m == "nearest" => false,
                    Some((Arg::Ident(m), _)) if m == "linear" => true,
                    Some((_, l)) => return err(l, "`mode` must be `nearest` or `linear`"),
                };
                let nearest = match a.take("nearest") {
                    None => NearestMode::RoundPreferFloor,
                    Some((_, l)) if linear => {
                        return err(l, "`nearest` applies to `mode=nearest` only");
                    }
                    Some((Arg::Ident(m), l)) => NearestMode::by_name(&m).map_or_else(
                        || {
                            err(
                                l,
                                format!(
                                    "unknown nearest mode `{m}` (known: {})",
                                    NearestMode::ALL.map(|m| m.name()).join(", ")
                                ),
                            )
                        },
                        Ok,
                    )?,
                    Some((_, l)) => {
                        return err(l, "`nearest` must be a nearest mode such as `floor`");
                    }
                };
                let coord = match a.take("coord") {
                    None => CoordMode::HalfPixel,
                    Some((Arg::Ident(m), l)) => CoordMode::by_name(&m).map_or_else(
                        || {
                            err(
                                l,
                                format!(
                                    "unknown coordinate mode `{m}` (known: {})",
                                    CoordMode::ALL.map(|m| m.name()).join(", ")
                                ),
                            )
                        },
                        Ok,
                    )?,
                    Some((_, l)) => {
                        return err(l, "`coord` must be a coordinate mode such as `half_pixel`");
                    }
                };
                let scale = a.scale_factors("scale")?;
                let sizes = a.list("size", 2)?;
                let pair = |v: Vec<usize>| [v[0] as u64, v[1] as u64];
                let size = match (like, scale, sizes) {
                    (Some(v), None, None) => ResizeSize::Like(v),
                    (None, Some(s), None) => ResizeSize::Scale(s),
                    (None, None, Some(s)) => ResizeSize::Sizes(pair(s)),
                    _ => {
                        return err(
                            loc,
                            "`resize` takes exactly one of `scale=[h, w]`, `size=[h, w]` or a \
                             second operand whose height and width the output takes",
                        );
                    }
                };
                Op::Resize(Resize {
                    input,
                    mode: if linear {
                        ResizeMode::Linear
                    } else {
                        ResizeMode::Nearest(nearest)
                    },
                    coord,
                    size,
                })
            }
            name if Activation::by_name(name).is_some() => {
                a.arity(1, 1)?;
                let input = a.value(0)?;
                let act = a.activation_attrs(Activation::by_name(name).expect("checked"))?;
                Op::Act { act, input }
            }
            other => {
                let known = crate::OpKind::ALL.map(|k| k.name()).join(", ");
                return err(
                    a.call.loc,
                    format!("unknown op `{other}` (known ops: {known})"),
                );
            }
        };
        a.finish()?;
        Ok(op)
    }

    fn derived(&self, call: Call) -> Result<DerivedParam, ParseError> {
        let mut a = Attrs::new(self, call);
        let d = match a.call.name.as_str() {
            "bnfold_weight" => {
                a.arity(3, 3)?;
                DerivedParam::BnFoldWeight {
                    weight: a.param(0)?,
                    scale: a.param(1)?,
                    var: a.param(2)?,
                    epsilon: a.float("epsilon", 1e-5)?,
                }
            }
            "bn_scale" => {
                a.arity(2, 2)?;
                DerivedParam::BnScale {
                    scale: a.param(0)?,
                    var: a.param(1)?,
                    epsilon: a.float("epsilon", 1e-5)?,
                }
            }
            "bnfold_bias" => {
                a.arity(4, 4)?;
                DerivedParam::BnFoldBias {
                    scale: a.param(0)?,
                    bias: a.param(1)?,
                    mean: a.param(2)?,
                    var: a.param(3)?,
                    epsilon: a.float("epsilon", 1e-5)?,
                    conv_bias: a.opt_param("conv_bias")?,
                }
            }
            other => {
                return err(
                    a.call.loc,
                    format!(
                        "unknown parameter derivation `{other}` (known: bnfold_weight, bn_scale, bnfold_bias)"
                    ),
                );
            }
        };
        a.finish()?;
        Ok(d)
    }
}

/// Takes operands and attributes out of a [`Call`], so that [`Attrs::finish`] can report any
/// attribute the op does not accept.
struct Attrs<'p> {
    parser: &'p Parser,
    call: Call,
}

impl<'p> Attrs<'p> {
    fn new(parser: &'p Parser, call: Call) -> Self {
        Attrs { parser, call }
    }

    fn arity(&self, min: usize, max: usize) -> Result<(), ParseError> {
        let n = self.call.positional.len();
        if n < min || n > max {
            let expected = if min == max {
                format!("{min}")
            } else {
                format!("{min} to {max}")
            };
            let loc = self
                .call
                .positional
                .get(max)
                .map_or(self.call.loc, |(_, l)| *l);
            return err(
                loc,
                format!("`{}` takes {expected} operands, found {n}", self.call.name),
            );
        }
        Ok(())
    }

    fn value(&self, i: usize) -> Result<Value, ParseError> {
        match &self.call.positional[i] {
            (Arg::Value(v), loc) => self.parser.resolve_value(v, *loc),
            (_, loc) => err(
                *loc,
                format!(
                    "operand {} of `{}` must be a value such as `%x`",
                    i + 1,
                    self.call.name
                ),
            ),
        }
    }

    fn param(&self, i: usize) -> Result<Param, ParseError> {
        match &self.call.positional[i] {
            (Arg::Param(p), loc) => self.parser.resolve_param(p, *loc),
            (_, loc) => err(
                *loc,
                format!(
                    "operand {} of `{}` must be a parameter such as `@w`",
                    i + 1,
                    self.call.name
                ),
            ),
        }
    }

    fn take(&mut self, key: &str) -> Option<(Arg, SourceLoc)> {
        let i = self.call.attrs.iter().position(|(k, ..)| k == key)?;
        let (_, _, arg, loc) = self.call.attrs.remove(i);
        Some((arg, loc))
    }

    fn finish(self) -> Result<(), ParseError> {
        match self.call.attrs.first() {
            None => Ok(()),
            Some((k, loc, ..)) => err(*loc, format!("`{}` has no attribute `{k}`", self.call.name)),
        }
    }

    fn opt_param(&mut self, key: &str) -> Result<Option<Param>, ParseError> {
        match self.take(key) {
            None => Ok(None),
            Some((Arg::Param(p), loc)) => self.parser.resolve_param(&p, loc).map(Some),
            Some((_, loc)) => err(loc, format!("`{key}` must be a parameter such as `@b`")),
        }
    }

    fn uint(&mut self, key: &str, default: usize) -> Result<usize, ParseError> {
        match self.take(key) {
            None => Ok(default),
            Some((arg, loc)) => uint_arg(&arg, loc, key),
        }
    }

    fn float(&mut self, key: &str, default: f32) -> Result<f32, ParseError> {
        match self.take(key) {
            None => Ok(default),
            Some((arg, loc)) => float_arg(&arg, loc, key),
        }
    }

    fn bool(&mut self, key: &str, default: bool) -> Result<bool, ParseError> {
        match self.take(key) {
            None => Ok(default),
            Some((Arg::Ident(s), _)) if s == "true" => Ok(true),
            Some((Arg::Ident(s), _)) if s == "false" => Ok(false),
            Some((_, loc)) => err(loc, format!("`{key}` must be `true` or `false`")),
        }
    }

    fn list(&mut self, key: &str, len: usize) -> Result<Option<Vec<usize>>, ParseError> {
        match self.take(key) {
            None => Ok(None),
            Some((Arg::List(items), loc)) => {
                if items.len() != len {
                    return err(
                        loc,
                        format!("`{key}` takes {len} integers, found {}", items.len()),
                    );
                }
                items
                    .iter()
                    .map(|(a, l)| uint_arg(a, *l, key))
                    .collect::<Result<_, _>>()
                    .map(Some)
            }
            Some((_, loc)) => err(
                loc,
                format!(
                    "`{key}` must be a list of {len} integers such as `[{}]`",
                    vec!["1"; len].join(", ")
                ),
            ),
        }
    }

    /// `resize`'s two scale factors: whole numbers, or fractions `n / 2^k` as decimals
    /// (`[1.5, 0.5]`, see [`ScaleFactor`]).
    fn scale_factors(&mut self, key: &str) -> Result<Option<[ScaleFactor; 2]>, ParseError> {
        let items = match self.take(key) {
            None => return Ok(None),
            Some((Arg::List(items), _)) if items.len() == 2 => items,
            Some((_, loc)) => {
                return err(
                    loc,
                    format!("`{key}` must be a list of two factors such as `[2, 2]`"),
                );
            }
        };
        let factor = |(arg, l): &(Arg, SourceLoc)| {
            let Arg::Number(n) = arg else {
                return err(*l, format!("`{key}` takes numbers"));
            };
            let supported = n.parse::<f64>().ok().and_then(ScaleFactor::from_f64);
            supported.map_or_else(
                || {
                    let most = ScaleFactor::MAX_FRACTION_NUM;
                    let message = format!(
                        "`{key}` takes whole factors or fractions n / 2^k (n odd, at most {most}; \
                         k at most 16) such as 1.5 or 0.25, found `{n}`"
                    );
                    err(*l, message)
                },
                Ok,
            )
        };
        Ok(Some([factor(&items[0])?, factor(&items[1])?]))
    }

    fn pair(&mut self, key: &str, default: [usize; 2]) -> Result<[usize; 2], ParseError> {
        Ok(self.list(key, 2)?.map_or(default, |v| [v[0], v[1]]))
    }

    fn required_pair(&mut self, key: &str) -> Result<[usize; 2], ParseError> {
        let loc = self.call.loc;
        match self.list(key, 2)? {
            Some(v) => Ok([v[0], v[1]]),
            None => err(
                loc,
                format!("`{}` needs the attribute `{key}`", self.call.name),
            ),
        }
    }

    fn pads(&mut self) -> Result<Pads, ParseError> {
        Ok(self.list("pads", 4)?.map_or_else(Pads::default, |v| Pads {
            top: v[0],
            left: v[1],
            bottom: v[2],
            right: v[3],
        }))
    }

    /// `auto_pad=same_upper` or `auto_pad=same_lower`, if given.
    fn auto_pad(&mut self) -> Result<Option<AutoPad>, ParseError> {
        match self.take("auto_pad") {
            None => Ok(None),
            Some((Arg::Ident(m), l)) => match AutoPad::by_name(&m) {
                Some(a) => Ok(Some(a)),
                None => err(
                    l,
                    format!(
                        "unknown auto_pad `{m}` (known: {})",
                        AutoPad::ALL.map(|a| a.name()).join(", ")
                    ),
                ),
            },
            Some((_, l)) => err(l, "`auto_pad` must be `same_upper` or `same_lower`"),
        }
    }

    /// The window attributes of a pooling op or of the `maxpool` post-op: `kernel` is required,
    /// the rest default as in ONNX.
    fn pool_window(&mut self) -> Result<PoolWindow, ParseError> {
        Ok(PoolWindow {
            kernel: self.required_pair("kernel")?,
            strides: self.pair("strides", [1, 1])?,
            pads: self.pads()?,
            dilations: self.pair("dilations", [1, 1])?,
            ceil_mode: self.bool("ceil_mode", false)?,
        })
    }

    /// `act` with the attributes the call gives (each a finite number), the others at their
    /// defaults.
    fn activation_attrs(&mut self, mut act: Activation) -> Result<Activation, ParseError> {
        for (key, default) in act.attrs() {
            let v = self.float(key, default)?;
            act = act
                .with_attr(key, v)
                .expect("an attribute of this activation");
        }
        Ok(act)
    }

    fn post_ops(&mut self) -> Result<Vec<PostOp>, ParseError> {
        let Some((arg, loc)) = self.take("post") else {
            return Ok(Vec::new());
        };
        let Arg::List(items) = arg else {
            return err(
                loc,
                "`post` must be a list such as `[relu, add(%r), clip(0, 6), maxpool(kernel=[2, 2])]`",
            );
        };
        let mut out = Vec::new();
        for (item, loc) in items {
            out.push(match item {
                Arg::Ident(name) if name == "relu" => PostOp::Relu,
                Arg::Ident(name) if Activation::by_name(&name).is_some() => {
                    PostOp::Act(Activation::by_name(&name).expect("checked"))
                }
                Arg::Call(call) if Activation::by_name(&call.name).is_some() => {
                    let act = Activation::by_name(&call.name).expect("checked");
                    let mut a = Attrs::new(self.parser, call);
                    a.arity(0, 0)?;
                    let act = a.activation_attrs(act)?;
                    a.finish()?;
                    PostOp::Act(act)
                }
                Arg::Call(call) if call.name == "add" => {
                    let a = Attrs::new(self.parser, call);
                    a.arity(1, 1)?;
                    let v = a.value(0)?;
                    a.finish()?;
                    PostOp::Add(v)
                }
                Arg::Call(call) if call.name == "prelu" => {
                    let a = Attrs::new(self.parser, call);
                    a.arity(1, 1)?;
                    let slope = a.param(0)?;
                    a.finish()?;
                    PostOp::PRelu(slope)
                }
                Arg::Call(call) if call.name == "clip" => {
                    let a = Attrs::new(self.parser, call);
                    a.arity(2, 2)?;
                    let [(lo, lo_loc), (hi, hi_loc)] =
                        [&a.call.positional[0], &a.call.positional[1]];
                    let lo = float_arg(lo, *lo_loc, "clip")?;
                    let hi = float_arg(hi, *hi_loc, "clip")?;
                    a.finish()?;
                    PostOp::Clip { lo, hi }
                }
                Arg::Call(call) if call.name == "maxpool" => {
                    let mut a = Attrs::new(self.parser, call);
                    a.arity(0, 0)?;
                    let window = a.pool_window()?;
                    a.finish()?;
                    PostOp::MaxPool(window)
                }
                _ => {
                    return err(
                        loc,
                        "unknown post-op (known: relu, add(%value), clip(lo, hi), prelu(@slope), maxpool(kernel=[kh, kw], ...), sigmoid, hardsigmoid(alpha=a, beta=b), hardswish, tanh, leakyrelu(alpha=a), elu(alpha=a), silu, exp)",
                    );
                }
            });
        }
        Ok(out)
    }
}

fn uint_arg(arg: &Arg, loc: SourceLoc, key: &str) -> Result<usize, ParseError> {
    match arg {
        Arg::Number(n) => n.parse::<usize>().or_else(|e| {
            let message = if *e.kind() == IntErrorKind::PosOverflow {
                format!("`{key}` value `{n}` is too large: at most {}", usize::MAX)
            } else {
                format!("`{key}` takes non-negative integers, found `{n}`")
            };
            err(loc, message)
        }),
        _ => err(loc, format!("`{key}` takes integers")),
    }
}

fn float_arg(arg: &Arg, loc: SourceLoc, key: &str) -> Result<f32, ParseError> {
    match arg {
        Arg::Number(n) => match n.parse::<f32>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => err(loc, format!("`{key}` takes a finite number, found `{n}`")),
        },
        _ => err(loc, format!("`{key}` takes a number")),
    }
}
