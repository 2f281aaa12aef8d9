//! Parsing: text -> pest pairs (`grammar/lmx.pest`) -> [`ast::Model`].

use pest::iterators::{Pair, Pairs};
use pest::pratt_parser::{Assoc, Op, PrattParser};
use pest::Parser as _;

use crate::ast::*;
use crate::diag::Diagnostic;
use crate::span::Span;

/// The pest parser generated from `grammar/lmx.pest`.
#[derive(pest_derive::Parser)]
#[grammar = "lmx.pest"]
pub struct LmxParser;

/// Brackets may nest at most this deep (keeps the recursive-descent parser's stack bounded).
pub const MAX_NESTING: usize = 48;

/// An expression may have at most this many infix operators at one level.
pub const MAX_OPERATORS: usize = 256;

/// The syntax tree may nest at most this deep, counting every operator, postfix, `else if` and
/// statement: every later stage (checker, report, code generator) walks it recursively, and this
/// keeps each of them within a thread's default stack.
pub const MAX_DEPTH: usize = 128;

type Result<T> = std::result::Result<T, Diagnostic>;

/// Parses a `.lmx` source text into its syntax tree.
pub fn parse(source: &str) -> Result<Model> {
    check_nesting(source)?;
    let mut pairs = LmxParser::parse(Rule::file, source).map_err(syntax_error)?;
    let file = pairs
        .next()
        .ok_or_else(|| malformed(Span::new(0, source.len())))?;
    let model = kids(file)
        .find(|p| p.as_rule() == Rule::model)
        .ok_or_else(|| malformed(Span::new(0, source.len())))?;
    build_model(model, Depth::ROOT)
}

/// How deep a syntax-tree node sits, in the levels the later stages recurse through.
#[derive(Clone, Copy)]
struct Depth(usize);

impl Depth {
    const ROOT: Depth = Depth(0);

    /// `levels` deeper, or the diagnostic that the tree at `span` nests too deep.
    fn deeper(self, levels: usize, span: Span) -> Result<Depth> {
        let depth = self.0.saturating_add(levels);
        if depth <= MAX_DEPTH {
            return Ok(Depth(depth));
        }
        Err(Diagnostic::new(
            "lmx::syntax::depth",
            format!("this nests more than {MAX_DEPTH} levels deep"),
            span,
            "too many operators, postfixes or `else if`s inside one another",
        )
        .with_help("split it into steps with `let`"))
    }
}

/// Rejects brackets nested deeper than [`MAX_NESTING`] before pest's recursive descent meets
/// them; brackets inside comments and string literals (as the grammar reads them) do not count.
fn check_nesting(source: &str) -> Result<()> {
    let mut depth = 0usize;
    let mut chars = source.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '/' if chars.peek().is_some_and(|&(_, next)| next == '/') => {
                while chars.next_if(|&(_, c)| c != '\n').is_some() {}
            }
            '"' => {
                while chars
                    .next_if(|&(_, c)| c != '\n')
                    .is_some_and(|(_, c)| c != '"')
                {}
            }
            '(' | '[' | '{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(Diagnostic::new(
                        "lmx::syntax::nesting",
                        format!("brackets nest more than {MAX_NESTING} deep"),
                        Span::new(i, i + 1),
                        "this bracket is too deep",
                    )
                    .with_help("split the expression with `let`"));
                }
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn syntax_error(e: pest::error::Error<Rule>) -> Diagnostic {
    let (start, end) = match e.location {
        pest::error::InputLocation::Pos(p) => (p, p),
        pest::error::InputLocation::Span((s, e)) => (s, e),
    };
    let expected = match &e.variant {
        pest::error::ErrorVariant::ParsingError { positives, .. } => {
            let mut words: Vec<&str> = positives.iter().map(|r| describe(*r)).collect();
            words.sort_unstable();
            words.dedup();
            if words.len() > 1 {
                words.retain(|w| *w != "a token");
            }
            words.join(", ")
        }
        pest::error::ErrorVariant::CustomError { message } => message.clone(),
    };
    let label = if expected.is_empty() {
        "unexpected text".to_string()
    } else {
        format!("expected {expected}")
    };
    Diagnostic::new(
        "lmx::syntax",
        "syntax error",
        Span::new(start, end.max(start)),
        label,
    )
}

/// A reader's word for what a rule matches.
fn describe(rule: Rule) -> &'static str {
    match rule {
        Rule::EOI => "end of file",
        Rule::model | Rule::MODEL => "`model`",
        Rule::name | Rule::names | Rule::path => "a name",
        Rule::expression
        | Rule::condition
        | Rule::operand
        | Rule::cond_operand
        | Rule::range
        | Rule::neg
        | Rule::not
        | Rule::conditional
        | Rule::list
        | Rule::parenthesized
        | Rule::float
        | Rule::int
        | Rule::string
        | Rule::boolean => "an expression",
        Rule::setting | Rule::derived => "a config entry",
        Rule::static_type | Rule::INT | Rule::FLOAT | Rule::BOOL | Rule::STR | Rule::ENUM => {
            "a type"
        }
        // A parameter may begin with a mark: where one was expected, a parameter was.
        Rule::param | Rule::param_group | Rule::param_mark | Rule::NO_DECAY => "a parameter",
        Rule::block_list | Rule::tied | Rule::raw_tensor | Rule::module => "a parameter kind",
        Rule::shape | Rule::tensor_type => "a shape",
        Rule::body => "`{`",
        Rule::arguments | Rule::argument => "arguments",
        Rule::infix
        | Rule::or
        | Rule::and
        | Rule::eq
        | Rule::ne
        | Rule::le
        | Rule::ge
        | Rule::lt
        | Rule::gt
        | Rule::add
        | Rule::sub
        | Rule::pow
        | Rule::mul
        | Rule::div
        | Rule::rem
        | Rule::matmul => "an operator",
        Rule::member | Rule::index => "a postfix",
        Rule::config
        | Rule::preset
        | Rule::block
        | Rule::params
        | Rule::forward
        | Rule::step
        | Rule::CONFIG
        | Rule::PRESET
        | Rule::BLOCK
        | Rule::PARAMS
        | Rule::FORWARD
        | Rule::STEP => "a section",
        Rule::let_statement
        | Rule::for_statement
        | Rule::while_statement
        | Rule::assignment
        | Rule::optimizer_statement
        | Rule::accumulate_statement
        | Rule::update_statement
        | Rule::metrics_statement
        | Rule::frozen_statement
        | Rule::next_statement
        | Rule::expression_statement => "a statement",
        Rule::preset_name => "a preset name",
        Rule::guard | Rule::IF => "`if`",
        Rule::ELSE => "`else`",
        Rule::IN => "`in`",
        Rule::repeat | Rule::comprehension => "`;` or `for`",
        Rule::dtype => "a dtype",
        Rule::subscript | Rule::slice_tail | Rule::ellipsis => "a subscript",
        _ => "a token",
    }
}

fn malformed(span: Span) -> Diagnostic {
    Diagnostic::new(
        "lmx::internal",
        "the parser produced an unexpected tree",
        span,
        "while reading this",
    )
}

fn is_keyword(rule: Rule) -> bool {
    matches!(
        rule,
        Rule::MODEL
            | Rule::CONFIG
            | Rule::PRESET
            | Rule::PARAMS
            | Rule::BLOCK
            | Rule::FORWARD
            | Rule::STEP
            | Rule::TIED
            | Rule::TENSOR
            | Rule::BUFFER
            | Rule::NO_DECAY
            | Rule::ENUM
            | Rule::LET
            | Rule::FOR
            | Rule::IN
            | Rule::IF
            | Rule::ELSE
            | Rule::WHILE
            | Rule::OPTIMIZER
            | Rule::ACCUMULATE
            | Rule::UPDATE
            | Rule::METRICS
            | Rule::FROZEN
            | Rule::NEXT
            | Rule::EOI
    )
}

/// The meaningful children of a pair (keywords dropped).
fn kids(pair: Pair<'_, Rule>) -> impl Iterator<Item = Pair<'_, Rule>> {
    pair.into_inner().filter(|p| !is_keyword(p.as_rule()))
}

/// Takes the next child, or reports a malformed tree at `span`.
fn take<'a>(it: &mut impl Iterator<Item = Pair<'a, Rule>>, span: Span) -> Result<Pair<'a, Rule>> {
    it.next().ok_or_else(|| malformed(span))
}

fn ident(pair: Pair<'_, Rule>) -> Ident {
    Ident {
        name: pair.as_str().to_string(),
        span: pair.as_span().into(),
    }
}

fn build_model(pair: Pair<'_, Rule>, depth: Depth) -> Result<Model> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let name = ident(take(&mut it, span)?);
    let mut model = Model {
        header: Span::new(span.start, name.span.end),
        name,
        config: Vec::new(),
        presets: Vec::new(),
        blocks: Vec::new(),
        params: None,
        forward: None,
        steps: Vec::new(),
    };
    for section in it {
        match section.as_rule() {
            Rule::config => {
                for entry in kids(section) {
                    model.config.push(build_config_entry(entry, depth)?);
                }
            }
            Rule::preset => model.presets.push(build_preset(section, depth)?),
            Rule::block => model.blocks.push(build_block(section, depth)?),
            Rule::params => {
                let s: Span = section.as_span().into();
                let group = take(&mut kids(section), s)?;
                model.params = Some(build_group(group, depth)?);
            }
            Rule::forward => model.forward = Some(build_forward(section, depth)?),
            Rule::step => model.steps.push(build_step(section, depth)?),
            _ => return Err(malformed(section.as_span().into())),
        }
    }
    Ok(model)
}

fn build_config_entry(pair: Pair<'_, Rule>, depth: Depth) -> Result<ConfigEntry> {
    let span: Span = pair.as_span().into();
    let rule = pair.as_rule();
    let mut it = kids(pair);
    let name = ident(take(&mut it, span)?);
    match rule {
        Rule::setting => {
            let ty = build_static_type(take(&mut it, span)?)?;
            let default = build_expr(take(&mut it, span)?, depth)?;
            Ok(ConfigEntry::Setting { name, ty, default })
        }
        _ => Ok(ConfigEntry::Derived {
            name,
            value: build_expr(take(&mut it, span)?, depth)?,
        }),
    }
}

fn build_static_type(pair: Pair<'_, Rule>) -> Result<StaticType> {
    let span: Span = pair.as_span().into();
    let inner = take(&mut pair.into_inner(), span)?;
    Ok(match inner.as_rule() {
        Rule::INT => StaticType::Int,
        Rule::FLOAT => StaticType::Float,
        Rule::BOOL => StaticType::Bool,
        Rule::STR => StaticType::Str,
        _ => StaticType::Enum(kids(inner).map(ident).collect()),
    })
}

fn build_preset(pair: Pair<'_, Rule>, depth: Depth) -> Result<Preset> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let name = ident(take(&mut it, span)?);
    let mut overrides = Vec::new();
    for o in it {
        let s: Span = o.as_span().into();
        let mut parts = kids(o);
        let key = ident(take(&mut parts, s)?);
        overrides.push((key, build_expr(take(&mut parts, s)?, depth)?));
    }
    Ok(Preset { name, overrides })
}

fn build_block(pair: Pair<'_, Rule>, depth: Depth) -> Result<Block> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let name = ident(take(&mut it, span)?);
    let mut args = Vec::new();
    let mut params = None;
    let mut forward = None;
    for part in it {
        match part.as_rule() {
            Rule::block_arguments => {
                for a in kids(part) {
                    let s: Span = a.as_span().into();
                    let mut p = kids(a);
                    let name = ident(take(&mut p, s)?);
                    let ty = build_static_type(take(&mut p, s)?)?;
                    let default = p.next().map(|p| build_expr(p, depth)).transpose()?;
                    args.push(BlockArg { name, ty, default });
                }
            }
            Rule::params => {
                let s: Span = part.as_span().into();
                params = Some(build_group(take(&mut kids(part), s)?, depth)?);
            }
            _ => forward = Some(build_forward(part, depth)?),
        }
    }
    Ok(Block {
        name,
        args,
        params,
        forward: forward.ok_or_else(|| malformed(span))?,
    })
}

fn build_group(pair: Pair<'_, Rule>, depth: Depth) -> Result<ParamGroup> {
    let span: Span = pair.as_span().into();
    let entries = kids(pair)
        .map(|p| build_param(p, depth))
        .collect::<Result<_>>()?;
    Ok(ParamGroup { entries, span })
}

fn build_param(pair: Pair<'_, Rule>, depth: Depth) -> Result<Param> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair).peekable();
    let mut marks = Vec::new();
    while let Some(mark) = it.next_if(|p| p.as_rule() == Rule::param_mark) {
        let keyword = take(&mut mark.into_inner(), span)?;
        let kind = match keyword.as_rule() {
            Rule::FROZEN => MarkKind::Frozen,
            _ => MarkKind::NoDecay,
        };
        marks.push(Mark {
            kind,
            span: keyword.as_span().into(),
        });
    }
    let name = ident(take(&mut it, span)?);
    let kind_pair = take(&mut it, span)?;
    let kind_span: Span = kind_pair.as_span().into();
    let kind = match kind_pair.as_rule() {
        Rule::param_group => ParamKind::Group(build_group(kind_pair, depth)?),
        Rule::block_list => {
            let mut parts = kids(kind_pair);
            let module = build_module(take(&mut parts, kind_span)?, depth)?;
            let count_pair = take(&mut parts, kind_span)?;
            let count = match count_pair.as_rule() {
                Rule::repeat => {
                    ListCount::Repeat(build_expr(take(&mut kids(count_pair), kind_span)?, depth)?)
                }
                _ => {
                    let mut c = kids(count_pair);
                    let var = ident(take(&mut c, kind_span)?);
                    let range = build_range(take(&mut c, kind_span)?, depth)?;
                    ListCount::Comprehension { var, range }
                }
            };
            ParamKind::List {
                module,
                count: Box::new(count),
            }
        }
        Rule::tied => {
            let path = take(&mut kids(kind_pair), kind_span)?;
            ParamKind::Tied(kids(path).map(ident).collect())
        }
        Rule::raw_tensor => {
            let buffer = kind_pair
                .clone()
                .into_inner()
                .next()
                .is_some_and(|keyword| keyword.as_rule() == Rule::BUFFER);
            let mut parts = kids(kind_pair);
            let shape = build_shape(take(&mut parts, kind_span)?, depth)?;
            let init = parts.next().map(|p| build_call(p, depth)).transpose()?;
            ParamKind::Tensor {
                shape,
                init,
                span: kind_span,
                buffer,
            }
        }
        _ => ParamKind::Module(build_module(kind_pair, depth)?),
    };
    let guard = it
        .next()
        .map(|g| {
            let s: Span = g.as_span().into();
            build_expr(take(&mut kids(g), s)?, depth)
        })
        .transpose()?;
    Ok(Param {
        marks,
        name,
        kind,
        guard,
        span,
    })
}

fn build_module(pair: Pair<'_, Rule>, depth: Depth) -> Result<ModuleRef> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let name = ident(take(&mut it, span)?);
    let args = it
        .next()
        .map(|p| build_args(p, depth))
        .transpose()?
        .unwrap_or_default();
    Ok(ModuleRef { name, args, span })
}

fn build_call(pair: Pair<'_, Rule>, depth: Depth) -> Result<Call> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let name = ident(take(&mut it, span)?);
    let args = build_args(take(&mut it, span)?, depth)?;
    Ok(Call { name, args, span })
}

fn build_args(pair: Pair<'_, Rule>, depth: Depth) -> Result<Vec<Arg>> {
    kids(pair)
        .map(|a| {
            let s: Span = a.as_span().into();
            let mut parts: Vec<_> = kids(a).collect();
            let value = build_expr(parts.pop().ok_or_else(|| malformed(s))?, depth)?;
            let name = parts.pop().map(ident);
            Ok(Arg { name, value })
        })
        .collect()
}

fn build_shape(pair: Pair<'_, Rule>, depth: Depth) -> Result<Vec<Expr>> {
    kids(pair).map(|p| build_expr(p, depth)).collect()
}

fn build_forward(pair: Pair<'_, Rule>, depth: Depth) -> Result<Forward> {
    let span: Span = pair.as_span().into();
    let keyword = Span::new(span.start, span.start + "forward".len());
    let mut it = kids(pair);
    let inputs = build_inputs(take(&mut it, span)?, depth)?;
    let mut output = None;
    let mut body = None;
    for part in it {
        match part.as_rule() {
            Rule::tensor_type => output = Some(build_tensor_type(part, depth)?),
            _ => body = Some(build_body(part, depth)?),
        }
    }
    Ok(Forward {
        inputs,
        output,
        body: body.ok_or_else(|| malformed(span))?,
        span: keyword,
    })
}

fn build_step(pair: Pair<'_, Rule>, depth: Depth) -> Result<Step> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let name = ident(take(&mut it, span)?);
    let inputs = build_inputs(take(&mut it, span)?, depth)?;
    let body = build_body(take(&mut it, span)?, depth)?;
    Ok(Step { name, inputs, body })
}

fn build_inputs(pair: Pair<'_, Rule>, depth: Depth) -> Result<Vec<Input>> {
    kids(pair)
        .map(|i| {
            let s: Span = i.as_span().into();
            let mut parts = kids(i);
            let name = ident(take(&mut parts, s)?);
            let ty = build_tensor_type(take(&mut parts, s)?, depth)?;
            Ok(Input { name, ty })
        })
        .collect()
}

fn build_tensor_type(pair: Pair<'_, Rule>, depth: Depth) -> Result<TensorType> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let shape = build_shape(take(&mut it, span)?, depth)?;
    let dtype = match it
        .next()
        .and_then(|d| d.into_inner().next())
        .map(|d| d.as_rule())
    {
        Some(Rule::INT) => Dtype::Int,
        Some(Rule::BOOL) => Dtype::Bool,
        _ => Dtype::Float,
    };
    Ok(TensorType { shape, dtype, span })
}

fn build_body(pair: Pair<'_, Rule>, depth: Depth) -> Result<Body> {
    let span: Span = pair.as_span().into();
    let stmts = kids(pair)
        .map(|p| build_stmt(p, depth))
        .collect::<Result<_>>()?;
    Ok(Body { stmts, span })
}

fn build_names(pair: Pair<'_, Rule>) -> Vec<Ident> {
    kids(pair).map(ident).collect()
}

/// A pair's span without the whitespace and comments that pest's implicit skipping leaves at
/// its end when its rule ends with an optional or repeated part (an `if` with no `else`, the
/// names of `metrics`), so that a diagnostic underlines the construct and not the lines after it.
fn tight_span(pair: &Pair<'_, Rule>) -> Span {
    let input = pair.get_input();
    let start = pair.as_span().start();
    let mut end = pair.as_span().end();
    let mut last = pair.clone().into_inner().last();
    while let Some(inner) = last {
        let rest = &input[inner.as_span().end()..end];
        if !only_skipped(rest) {
            // A token of the rule itself follows its last part (a closing brace).
            end = inner.as_span().end() + rest.trim_end().len();
            break;
        }
        end = inner.as_span().end();
        last = inner.into_inner().last();
    }
    Span::new(start, start + input[start..end].trim_end().len())
}

/// Whether `text` is only what the grammar skips: whitespace and `//` comments.
fn only_skipped(mut text: &str) -> bool {
    loop {
        text = text.trim_start();
        match text.strip_prefix("//") {
            Some(comment) => text = comment.split_once('\n').map_or("", |(_, after)| after),
            None => return text.is_empty(),
        }
    }
}

fn build_stmt(pair: Pair<'_, Rule>, depth: Depth) -> Result<Stmt> {
    let span = tight_span(&pair);
    let depth = depth.deeper(1, span)?;
    let rule = pair.as_rule();
    let mut it = kids(pair);
    let kind = match rule {
        Rule::let_statement => {
            let names = build_names(take(&mut it, span)?);
            StmtKind::Let(names, build_expr(take(&mut it, span)?, depth)?)
        }
        Rule::assignment => {
            let name = ident(take(&mut it, span)?);
            StmtKind::Assign(name, build_expr(take(&mut it, span)?, depth)?)
        }
        Rule::for_statement => {
            let names = build_names(take(&mut it, span)?);
            let range = build_range(take(&mut it, span)?, depth)?;
            StmtKind::For(names, range, build_body(take(&mut it, span)?, depth)?)
        }
        Rule::while_statement => {
            let cond = build_expr(take(&mut it, span)?, depth)?;
            StmtKind::While(cond, build_body(take(&mut it, span)?, depth)?)
        }
        Rule::optimizer_statement => {
            let name = ident(take(&mut it, span)?);
            let args = build_args(take(&mut it, span)?, depth)?;
            StmtKind::Optimizer(Call {
                span: name.span.join(span),
                name,
                args,
            })
        }
        Rule::accumulate_statement => {
            StmtKind::Accumulate(build_expr(take(&mut it, span)?, depth)?)
        }
        Rule::update_statement => StmtKind::Update(build_expr(take(&mut it, span)?, depth)?),
        Rule::metrics_statement => StmtKind::Metrics(it.map(ident).collect()),
        Rule::frozen_statement => {
            let name = ident(take(&mut it, span)?);
            StmtKind::Frozen(name, ident(take(&mut it, span)?))
        }
        Rule::next_statement => {
            // The buffer's path as the member expression that reads it (`gate.bias`).
            let mut names = kids(take(&mut it, span)?).map(ident);
            let first = names.next().ok_or_else(|| malformed(span))?;
            let mut target = Expr {
                span: first.span,
                kind: ExprKind::Name(first.name),
            };
            for name in names {
                target = Expr {
                    span: target.span.join(name.span),
                    kind: ExprKind::Member(Box::new(target), name),
                };
            }
            StmtKind::Next(target, build_expr(take(&mut it, span)?, depth)?)
        }
        _ => StmtKind::Expr(build_expr(take(&mut it, span)?, depth)?),
    };
    Ok(Stmt { kind, span })
}

fn build_range(pair: Pair<'_, Rule>, depth: Depth) -> Result<Range> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let start = build_expr(take(&mut it, span)?, depth)?;
    let end = it.next().map(|p| build_expr(p, depth)).transpose()?;
    Ok(Range { start, end, span })
}

/// The operators' precedence, built once.
fn pratt() -> &'static PrattParser<Rule> {
    static PRATT: std::sync::OnceLock<PrattParser<Rule>> = std::sync::OnceLock::new();
    PRATT.get_or_init(|| {
        PrattParser::new()
            .op(Op::infix(Rule::or, Assoc::Left))
            .op(Op::infix(Rule::and, Assoc::Left))
            .op(Op::prefix(Rule::not))
            .op(Op::infix(Rule::eq, Assoc::Left)
                | Op::infix(Rule::ne, Assoc::Left)
                | Op::infix(Rule::lt, Assoc::Left)
                | Op::infix(Rule::le, Assoc::Left)
                | Op::infix(Rule::gt, Assoc::Left)
                | Op::infix(Rule::ge, Assoc::Left))
            .op(Op::infix(Rule::add, Assoc::Left) | Op::infix(Rule::sub, Assoc::Left))
            .op(Op::infix(Rule::mul, Assoc::Left)
                | Op::infix(Rule::div, Assoc::Left)
                | Op::infix(Rule::rem, Assoc::Left)
                | Op::infix(Rule::matmul, Assoc::Left))
            .op(Op::prefix(Rule::neg))
            .op(Op::infix(Rule::pow, Assoc::Right))
    })
}

fn build_expr(pair: Pair<'_, Rule>, depth: Depth) -> Result<Expr> {
    let span: Span = pair.as_span().into();
    let inner: Pairs<'_, Rule> = pair.into_inner();
    let mut operators = 0;
    let (mut prefixes, mut longest_prefix) = (0, 0);
    for part in inner.clone() {
        match part.as_rule() {
            Rule::neg | Rule::not => {
                prefixes += 1;
                longest_prefix = longest_prefix.max(prefixes);
            }
            Rule::operand | Rule::cond_operand => prefixes = 0,
            _ => operators += 1,
        }
    }
    if operators > MAX_OPERATORS {
        return Err(Diagnostic::new(
            "lmx::syntax::too_long",
            format!("expression has more than {MAX_OPERATORS} operators"),
            span,
            "this expression is too long",
        )
        .with_help("split the expression with `let`"));
    }
    // Pratt parsing nests one level per operator and per prefix, at most.
    let depth = depth.deeper(1 + operators + longest_prefix, span)?;
    pratt()
        .map_primary(|operand| build_operand(operand, depth))
        .map_prefix(|op, rhs| {
            let rhs = rhs?;
            let op_span: Span = op.as_span().into();
            let op = if op.as_rule() == Rule::neg {
                UnaryOp::Neg
            } else {
                UnaryOp::Not
            };
            Ok(Expr {
                span: op_span.join(rhs.span),
                kind: ExprKind::Unary(op, Box::new(rhs)),
            })
        })
        .map_infix(|lhs, op, rhs| {
            let (lhs, rhs) = (lhs?, rhs?);
            let op_span: Span = op.as_span().into();
            let op = match op.as_rule() {
                Rule::or => BinaryOp::Or,
                Rule::and => BinaryOp::And,
                Rule::eq => BinaryOp::Eq,
                Rule::ne => BinaryOp::Ne,
                Rule::lt => BinaryOp::Lt,
                Rule::le => BinaryOp::Le,
                Rule::gt => BinaryOp::Gt,
                Rule::ge => BinaryOp::Ge,
                Rule::add => BinaryOp::Add,
                Rule::sub => BinaryOp::Sub,
                Rule::mul => BinaryOp::Mul,
                Rule::div => BinaryOp::Div,
                Rule::rem => BinaryOp::Rem,
                Rule::pow => BinaryOp::Pow,
                _ => BinaryOp::MatMul,
            };
            Ok(Expr {
                span: lhs.span.join(rhs.span),
                kind: ExprKind::Binary(op, op_span, Box::new(lhs), Box::new(rhs)),
            })
        })
        .parse(inner)
}

fn build_operand(pair: Pair<'_, Rule>, depth: Depth) -> Result<Expr> {
    let span: Span = pair.as_span().into();
    let mut it = kids(pair);
    let primary = take(&mut it, span)?;
    let postfixes: Vec<_> = it.collect();
    let depth = depth.deeper(postfixes.len(), span)?;
    let mut expr = build_primary(primary, depth)?;
    for post in postfixes {
        let post_span: Span = post.as_span().into();
        let whole = expr.span.join(post_span);
        let kind = match post.as_rule() {
            Rule::arguments => ExprKind::Call(Box::new(expr), build_args(post, depth)?),
            Rule::member => {
                let name = ident(take(&mut kids(post), post_span)?);
                ExprKind::Member(Box::new(expr), name)
            }
            _ => {
                let subs = kids(post)
                    .map(|p| build_subscript(p, depth))
                    .collect::<Result<_>>()?;
                ExprKind::Index(Box::new(expr), subs)
            }
        };
        expr = Expr { kind, span: whole };
    }
    Ok(expr)
}

fn build_subscript(pair: Pair<'_, Rule>, depth: Depth) -> Result<Subscript> {
    let span: Span = pair.as_span().into();
    let parts: Vec<_> = kids(pair).collect();
    let mut lower = None;
    let mut tail = None;
    for p in parts {
        match p.as_rule() {
            Rule::ellipsis => return Ok(Subscript::Ellipsis(span)),
            Rule::slice_tail => {
                let upper = kids(p).next().map(|p| build_expr(p, depth)).transpose()?;
                tail = Some(upper);
            }
            _ => lower = Some(build_expr(p, depth)?),
        }
    }
    Ok(match (lower, tail) {
        (Some(e), None) => Subscript::Index(e),
        (lower, Some(upper)) => Subscript::Slice(lower, upper, span),
        (None, None) => return Err(malformed(span)),
    })
}

fn parse_int(text: &str, span: Span) -> Result<i64> {
    text.replace('_', "").parse::<i64>().map_err(|_| {
        Diagnostic::new(
            "lmx::syntax::int_range",
            "integer literal out of range",
            span,
            "does not fit in 64 bits",
        )
    })
}

fn build_primary(pair: Pair<'_, Rule>, depth: Depth) -> Result<Expr> {
    let span: Span = pair.as_span().into();
    let kind = match pair.as_rule() {
        Rule::int => ExprKind::Int(parse_int(pair.as_str(), span)?),
        Rule::float => ExprKind::Float(pair.as_str().replace('_', "").parse().map_err(|_| {
            Diagnostic::new(
                "lmx::syntax::float",
                "malformed float literal",
                span,
                "not a number",
            )
        })?),
        Rule::string => {
            let s = pair.as_str();
            ExprKind::Str(
                s.get(1..s.len().saturating_sub(1))
                    .unwrap_or("")
                    .to_string(),
            )
        }
        Rule::boolean => ExprKind::Bool(pair.as_str() == "true"),
        Rule::name => ExprKind::Name(pair.as_str().to_string()),
        Rule::list => {
            let depth = depth.deeper(1, span)?;
            ExprKind::List(
                kids(pair)
                    .map(|p| build_expr(p, depth))
                    .collect::<Result<_>>()?,
            )
        }
        Rule::parenthesized => return build_expr(take(&mut kids(pair), span)?, depth),
        Rule::conditional => return build_conditional(pair, depth),
        _ => return Err(malformed(span)),
    };
    Ok(Expr { kind, span })
}

/// `if c1 { .. } else if c2 { .. } else { .. }`, read flat by the grammar (so that a long chain
/// does not recurse in the parser), as nested `If`s: each `else if` one level deeper.
fn build_conditional(pair: Pair<'_, Rule>, depth: Depth) -> Result<Expr> {
    let span = tight_span(&pair);
    // Each arm: where its `if` starts, its condition and its body; then the `else` body.
    let mut arms = Vec::new();
    let mut otherwise = None;
    let mut start = span.start;
    let mut cond = None;
    for part in pair.into_inner() {
        match part.as_rule() {
            Rule::IF => start = part.as_span().start(),
            Rule::condition => cond = Some(part),
            Rule::body => match cond.take() {
                Some(c) => arms.push((start, c, part)),
                None => otherwise = Some(part),
            },
            _ => {}
        }
    }
    let inner = depth.deeper(arms.len() + 1, span)?;
    let mut otherwise = otherwise.map(|b| build_body(b, inner)).transpose()?;
    let mut built: Option<Expr> = None;
    for (start, cond, then) in arms.into_iter().rev() {
        if let Some(expr) = built.take() {
            otherwise = Some(Body {
                span: expr.span,
                stmts: vec![Stmt {
                    span: expr.span,
                    kind: StmtKind::Expr(expr),
                }],
            });
        }
        built = Some(Expr {
            kind: ExprKind::If(
                Box::new(build_expr(cond, inner)?),
                build_body(then, inner)?,
                otherwise.take(),
            ),
            span: Span::new(start, span.end),
        });
    }
    built.ok_or_else(|| malformed(span))
}
