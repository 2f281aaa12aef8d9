//! A deterministic mutation engine over `.lmx` source text.
//!
//! [`sites`] parses a model and lists every place where a meaning-preserving or rule-respecting
//! change can be made (commuting `+` and `*`, renaming a local, swapping an activation, an
//! identity slice or reshape of an input, `stop_gradient` around a layer call, toggling a bias,
//! tying or untying the head, dropping dropout, one more layer, a larger `tiny` preset), each as
//! edits of the original text at the syntax tree's spans, so that the rest of the file stays
//! byte for byte as written. [`choose`] picks combinations of sites with a seeded generator and
//! [`apply`] writes a mutant. The build script of this crate uses it (shared through `#[path]`);
//! the checker decides which mutants are valid programs.

use std::collections::BTreeSet;

use lmx_grammar::ast::{
    Arg, BinaryOp, Body, Dtype, Expr, ExprKind, ListCount, Model, ModuleRef, Param, ParamGroup,
    ParamKind, StmtKind, Subscript,
};
use lmx_grammar::span::Span;

/// Activations of one tensor argument that keep its shape and dtype, any of which may replace
/// another.
const ACTIVATIONS: [&str; 7] = [
    "gelu",
    "gelu_approx",
    "silu",
    "relu",
    "sigmoid",
    "tanh",
    "softplus",
];

/// Parameters of builtins in positional order (docs/language.md's table), for
/// [`Kind::KeywordToPositional`].
const POSITIONAL: [(&str, &[&str]); 15] = [
    ("softmax", &["x", "axis"]),
    ("log_softmax", &["x", "axis"]),
    ("dropout", &["x", "p"]),
    ("sum", &["x", "axis", "keepdims"]),
    ("mean", &["x", "axis", "keepdims"]),
    ("max", &["x", "axis", "keepdims"]),
    ("min", &["x", "axis", "keepdims"]),
    ("logsumexp", &["x", "axis", "keepdims"]),
    ("split", &["x", "n", "axis"]),
    ("concat", &["xs", "axis"]),
    ("expand_dims", &["x", "axis"]),
    ("squeeze", &["x", "axis"]),
    (
        "attention",
        &["q", "k", "v", "causal", "window", "scale", "bias"],
    ),
    ("rope", &["x", "base"]),
    ("take_along_axis", &["x", "i", "axis"]),
];

/// The optimizers of a step, each valid with its defaults.
const OPTIMIZERS: [&str; 5] = ["sgd", "adam", "adamw", "lion", "adafactor"];

/// Replace the text at `span` by `text` (an insertion where `span` is empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    /// The replaced bytes of the original text.
    pub span: Span,
    /// What they become.
    pub text: String,
}

impl Edit {
    /// Whether applying both edits would touch the same text (an insertion conflicts with any
    /// edit whose range holds its position).
    fn conflicts(&self, other: &Edit) -> bool {
        let (a, b) = (self.span, other.span);
        if a.is_empty() || b.is_empty() {
            a.start.max(b.start) <= a.end.min(b.end)
        } else {
            a.start < b.end && b.start < a.end
        }
    }
}

/// The kinds of mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `a + b` to `b + a`, `a * b` to `b * a`.
    Commute,
    /// A local name (or forward input) renamed everywhere in its body.
    RenameLocal,
    /// One activation replaced by another of the same signature.
    SwapActivation,
    /// An input `x` read as `x[:, 0:T]` (a slice over a whole axis).
    IdentitySlice,
    /// An input `x` read as `reshape(x, [its declared shape])`.
    NoopReshape,
    /// A layer call wrapped in `stop_gradient`.
    StopGradient,
    /// A linear or layer norm's `bias` toggled (or `bias = false` added).
    ToggleBias,
    /// A tied head replaced by its own `linear`.
    UntieHead,
    /// A `linear` head replaced by `tied` to the embedding of the same sizes.
    TieHead,
    /// `dropout(x, p)` replaced by `x`.
    DropDropout,
    /// One more element in a block list or loop range.
    AddLayer,
    /// An integer setting of the `tiny` preset made larger.
    GrowPreset,
    /// A copy of the `tiny` preset under a name that starts with a digit and has a hyphen.
    AddPreset,
    /// Two keyword arguments of a call or layer exchanged.
    ReorderKeywords,
    /// A layer call `e` written `if n > 0 { e } else { e }` over an int setting `n`.
    StaticIf,
    /// A layer call or input `e` written `e * 1.0` (`e * 1` for int ids).
    ScaleOne,
    /// A float input `x` written `x + zeros([its declared shape])`.
    AddZeros,
    /// A layer call moved into a `let` of its own before its statement.
    ExtractLet,
    /// `for layer in list` written `for i, layer in list`.
    IndexedLoop,
    /// `sqrt(n)` of a setting written `n ** 0.5`.
    SqrtAsPow,
    /// A step's optimizer replaced by another.
    SwapOptimizer,
    /// `accumulate 2` added to a step without one.
    AddAccumulate,
    /// A builtin's or layer's first keyword argument written positionally, where it is the next
    /// parameter.
    KeywordToPositional,
}

/// Every kind, for the tests' coverage check.
#[cfg(test)]
pub const KINDS: [Kind; 23] = [
    Kind::Commute,
    Kind::RenameLocal,
    Kind::SwapActivation,
    Kind::IdentitySlice,
    Kind::NoopReshape,
    Kind::StopGradient,
    Kind::ToggleBias,
    Kind::UntieHead,
    Kind::TieHead,
    Kind::DropDropout,
    Kind::AddLayer,
    Kind::GrowPreset,
    Kind::AddPreset,
    Kind::ReorderKeywords,
    Kind::StaticIf,
    Kind::ScaleOne,
    Kind::AddZeros,
    Kind::ExtractLet,
    Kind::IndexedLoop,
    Kind::SqrtAsPow,
    Kind::SwapOptimizer,
    Kind::AddAccumulate,
    Kind::KeywordToPositional,
];

impl Kind {
    /// Whether the mutation leaves the forward pass's logits at the `tiny` preset as they were
    /// (exactly, or within rounding for `sqrt` as `** 0.5`): the parameter tree, its
    /// initialisation and the computed function are the same.
    pub fn preserves_logits(self) -> bool {
        !matches!(
            self,
            Kind::SwapActivation
                | Kind::ToggleBias
                | Kind::UntieHead
                | Kind::TieHead
                | Kind::AddLayer
                | Kind::GrowPreset
        )
    }

    /// The kind's name in mutant descriptions.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Commute => "commute",
            Kind::RenameLocal => "rename-local",
            Kind::SwapActivation => "swap-activation",
            Kind::IdentitySlice => "identity-slice",
            Kind::NoopReshape => "noop-reshape",
            Kind::StopGradient => "stop-gradient",
            Kind::ToggleBias => "toggle-bias",
            Kind::UntieHead => "untie-head",
            Kind::TieHead => "tie-head",
            Kind::DropDropout => "drop-dropout",
            Kind::AddLayer => "add-layer",
            Kind::GrowPreset => "grow-preset",
            Kind::AddPreset => "add-preset",
            Kind::ReorderKeywords => "reorder-keywords",
            Kind::StaticIf => "static-if",
            Kind::ScaleOne => "scale-one",
            Kind::AddZeros => "add-zeros",
            Kind::ExtractLet => "extract-let",
            Kind::IndexedLoop => "indexed-loop",
            Kind::SqrtAsPow => "sqrt-as-pow",
            Kind::SwapOptimizer => "swap-optimizer",
            Kind::AddAccumulate => "add-accumulate",
            Kind::KeywordToPositional => "keyword-to-positional",
        }
    }
}

/// One place to mutate, as edits of the original text.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// What kind of change.
    pub kind: Kind,
    /// The change, with its line and column in the original file.
    pub what: String,
    /// The edits, pairwise free of conflicts.
    pub edits: Vec<Edit>,
}

impl Site {
    fn conflicts(&self, other: &Site) -> bool {
        self.edits
            .iter()
            .any(|a| other.edits.iter().any(|b| a.conflicts(b)))
    }
}

/// SplitMix64 (Steele, Lea and Flood, 2014), written out so that a mutant's identity (its
/// number, which the known-failures list names) never changes with a dependency's version.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Every mutation site of `model`, whose text is `source`, in source order per kind.
pub fn sites(model: &Model, source: &str) -> Vec<Site> {
    let mut c = Collector {
        source,
        model,
        out: Vec::new(),
        params: param_names(model),
        elements: element_names(model),
    };
    c.collect();
    c.out.sort_by_key(|s| (s.kind, s.edits[0].span.start));
    c.out
}

/// `count` distinct combinations of sites (indices into `sites`), drawn from `seed`: mutant `i`
/// takes one site of the `i`-th kind after a drawn first one (cycling through the kinds present,
/// so that each kind is tried) and up to two more sites of any kind that do not touch the same text.
pub fn choose(sites: &[Site], count: usize, seed: u64) -> Vec<Vec<usize>> {
    let kinds: Vec<Kind> = sites
        .iter()
        .map(|s| s.kind)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut rng = Rng::new(seed);
    // Each seed starts the cycle of kinds elsewhere, so that fewer mutants than kinds per model
    // still lead with every kind across models.
    let first = rng.below(kinds.len().max(1));
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut attempt = 0;
    while out.len() < count && attempt < count * 8 && !kinds.is_empty() {
        let kind = kinds[(first + out.len()) % kinds.len()];
        attempt += 1;
        let of_kind: Vec<usize> = (0..sites.len())
            .filter(|&i| sites[i].kind == kind)
            .collect();
        let mut chosen = vec![of_kind[rng.below(of_kind.len())]];
        for _ in 0..rng.below(3) {
            let extra = rng.below(sites.len());
            if chosen
                .iter()
                .all(|&c| c != extra && !sites[c].conflicts(&sites[extra]))
            {
                chosen.push(extra);
            }
        }
        let key: BTreeSet<usize> = chosen.iter().copied().collect();
        if seen.insert(key) {
            out.push(chosen);
        }
    }
    out
}

/// `source` with the edits of `sites` applied (they must not conflict) and the model renamed
/// to `name`.
pub fn apply(model: &Model, source: &str, sites: &[&Site], name: &str) -> String {
    let mut edits: Vec<&Edit> = sites.iter().flat_map(|s| &s.edits).collect();
    let rename = Edit {
        span: model.name.span,
        text: name.to_string(),
    };
    edits.push(&rename);
    edits.sort_by_key(|e| std::cmp::Reverse((e.span.start, e.span.end)));
    let mut text = source.to_string();
    for edit in edits {
        text.replace_range(edit.span.start..edit.span.end, &edit.text);
    }
    text
}

/// `line:column` (1-based, columns in characters) of byte `offset`.
pub fn position(source: &str, offset: usize) -> String {
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("{line}:{column}")
}

struct Collector<'a> {
    source: &'a str,
    model: &'a Model,
    out: Vec<Site>,
    /// Every parameter name, at any depth: calls of these are layer or block calls.
    params: BTreeSet<String>,
    /// The element variables of loops over block lists (`layer` in `for layer in h`): calls
    /// of these are block calls.
    elements: BTreeSet<String>,
}

impl<'a> Collector<'a> {
    fn text(&self, span: Span) -> &'a str {
        &self.source[span.start..span.end]
    }

    /// `span` without trailing white space (a parameter entry's span runs to the next line).
    fn trimmed(&self, span: Span) -> Span {
        Span::new(span.start, span.start + self.text(span).trim_end().len())
    }

    /// The expression's text, in parentheses unless it is a single name, literal or call.
    fn operand(&self, e: &Expr) -> String {
        match e.kind {
            ExprKind::Binary(..) | ExprKind::Unary(..) | ExprKind::If(..) => {
                format!("({})", self.text(e.span))
            }
            _ => self.text(e.span).to_string(),
        }
    }

    /// Whether `at` is the first non-blank of its line: a `(` there would continue the line
    /// before it, as a call.
    fn line_start(&self, at: usize) -> bool {
        self.source[..at]
            .trim_end_matches([' ', '\t'])
            .ends_with('\n')
    }

    /// `text`, which replaces the expression at `at`, in parentheses unless it begins a line.
    fn wrapped(&self, at: usize, text: String) -> String {
        if self.line_start(at) {
            text
        } else {
            format!("({text})")
        }
    }

    /// The white space before `at` on its line, where nothing else precedes it there.
    fn indent(&self, at: usize) -> Option<&'a str> {
        let line = self.source[..at].rfind('\n').map_or(0, |i| i + 1);
        let before = &self.source[line..at];
        before
            .chars()
            .all(|c| c == ' ' || c == '\t')
            .then_some(before)
    }

    /// The first integer setting of the configuration.
    fn int_setting(&self) -> Option<&'a str> {
        self.model.config.iter().find_map(|entry| match entry {
            lmx_grammar::ast::ConfigEntry::Setting {
                name,
                ty: lmx_grammar::ast::StaticType::Int,
                ..
            } => Some(name.name.as_str()),
            _ => None,
        })
    }

    /// Whether `e` calls a layer or a block.
    fn is_layer_call(&self, e: &Expr) -> bool {
        let ExprKind::Call(callee, _) = &e.kind else {
            return false;
        };
        match &callee.kind {
            ExprKind::Name(f) => self.params.contains(f) || self.elements.contains(f),
            ExprKind::Member(..) => true,
            _ => false,
        }
    }

    fn push(&mut self, kind: Kind, at: usize, detail: String, edits: Vec<Edit>) {
        let what = format!("{} at {}: {detail}", kind.name(), position(self.source, at));
        self.out.push(Site { kind, what, edits });
    }

    fn replace(&mut self, kind: Kind, span: Span, text: String) {
        let detail = format!("`{}` -> `{text}`", short(self.text(span)));
        self.push(kind, span.start, detail, vec![Edit { span, text }]);
    }

    fn collect(&mut self) {
        let model = self.model;
        for entry in &model.config {
            if let lmx_grammar::ast::ConfigEntry::Derived { value, .. } = entry {
                self.static_expr(value);
            }
        }
        self.grow_preset();
        for block in &model.blocks {
            if let Some(group) = &block.params {
                self.group(group);
            }
            self.forward(&block.forward);
        }
        if let Some(group) = &model.params {
            self.group(group);
            self.heads(group);
        }
        if let Some(forward) = &model.forward {
            self.forward(forward);
        }
        for step in &model.steps {
            self.body(&step.body, true);
            self.step_statements(&step.body);
            let inputs: Vec<_> = step.inputs.iter().map(|i| &i.name).collect();
            self.renames(&inputs, &step.body);
        }
    }

    fn grow_preset(&mut self) {
        let Some(preset) = self.model.presets.iter().find(|p| p.name.name == "tiny") else {
            return;
        };
        let line = self.source[..preset.name.span.start]
            .rfind('\n')
            .map_or(0, |i| i + 1);
        let before = &self.source[line..preset.name.span.start];
        if before.trim() == "preset" {
            let indent = &before[..before.len() - before.trim_start().len()];
            let overrides = match (preset.overrides.first(), preset.overrides.last()) {
                (Some((first, _)), Some((_, last))) => {
                    self.text(Span::new(first.span.start, last.span.end))
                }
                _ => "",
            };
            let text = format!("{indent}preset 2nd-tiny {{ {overrides} }}\n");
            let edits = vec![Edit {
                span: Span::new(line, line),
                text,
            }];
            let detail = "`preset 2nd-tiny`, a copy of `tiny`".to_string();
            self.push(Kind::AddPreset, line, detail, edits);
        }
        for (name, value) in &preset.overrides {
            if let ExprKind::Int(i) = value.kind {
                // One more layer or vocabulary entry; twice the width elsewhere, which keeps
                // every division of the bundled models exact.
                let grown = match name.name.as_str() {
                    "n_layers" | "vocab" => i + 1,
                    _ => i * 2,
                };
                let detail = format!("preset tiny: {} = {i} -> {grown}", name.name);
                let edits = vec![Edit {
                    span: value.span,
                    text: grown.to_string(),
                }];
                self.push(Kind::GrowPreset, value.span.start, detail, edits);
            }
        }
    }

    fn group(&mut self, group: &ParamGroup) {
        for param in &group.entries {
            match &param.kind {
                ParamKind::Group(g) => self.group(g),
                ParamKind::List { module, count } => {
                    self.module_args(module);
                    match count.as_ref() {
                        ListCount::Repeat(n) => {
                            self.static_expr(n);
                            let text = format!("{} + 1", self.operand(n));
                            self.replace(Kind::AddLayer, n.span, text);
                        }
                        ListCount::Comprehension { range, .. } => {
                            self.static_expr(&range.start);
                            if let Some(end) = &range.end {
                                self.static_expr(end);
                                let text = format!("{} + 1", self.operand(end));
                                self.replace(Kind::AddLayer, end.span, text);
                            }
                        }
                    }
                }
                ParamKind::Module(module) => {
                    self.module_args(module);
                    self.toggle_bias(module);
                }
                ParamKind::Tensor { shape, .. } => shape.iter().for_each(|e| self.static_expr(e)),
                ParamKind::Tied(_) => {}
            }
        }
    }

    fn module_args(&mut self, module: &ModuleRef) {
        for arg in &module.args {
            self.static_expr(&arg.value);
        }
        self.reorder_keywords(&module.args);
        self.keyword_to_positional(&module.name.name, &module.args);
    }

    fn toggle_bias(&mut self, module: &ModuleRef) {
        if !matches!(module.name.name.as_str(), "linear" | "layer_norm") {
            return;
        }
        let bias = module
            .args
            .iter()
            .find(|a| a.name.as_ref().is_some_and(|n| n.name == "bias"));
        match bias.map(|a| &a.value) {
            Some(Expr {
                kind: ExprKind::Bool(b),
                span,
            }) => self.replace(Kind::ToggleBias, *span, (!b).to_string()),
            Some(_) => {}
            None if self.text(module.span).ends_with(')') => {
                let at = module.span.end - 1;
                let detail = format!("`{}` gains `bias = false`", short(self.text(module.span)));
                let edits = vec![Edit {
                    span: Span::new(at, at),
                    text: ", bias = false".to_string(),
                }];
                self.push(Kind::ToggleBias, at, detail, edits);
            }
            None => {}
        }
    }

    /// Tie a `linear` head to the embedding of the same sizes, or untie a tied one.
    fn heads(&mut self, root: &ParamGroup) {
        let mut embeddings = Vec::new();
        embeddings_of(root, &mut Vec::new(), &mut embeddings);
        for param in &root.entries {
            if param.guard.is_some() {
                continue;
            }
            match &param.kind {
                ParamKind::Tied(path) => {
                    let path: Vec<&str> = path.iter().map(|p| p.name.as_str()).collect();
                    let Some((_, module)) = embeddings.iter().find(|(p, _)| *p == path) else {
                        continue;
                    };
                    if let [vocab, width, ..] = module.args.as_slice() {
                        let text = format!(
                            "{}: linear({}, {}, bias = false)",
                            param.name.name,
                            self.text(width.value.span),
                            self.text(vocab.value.span)
                        );
                        self.replace(Kind::UntieHead, self.trimmed(param.span), text);
                    }
                }
                ParamKind::Module(m) if m.name.name == "linear" => {
                    let [input, output, ..] = m.args.as_slice() else {
                        continue;
                    };
                    let found = embeddings.iter().find(|(_, e)| match e.args.as_slice() {
                        [vocab, width, ..] => {
                            same(self.text(vocab.value.span), self.text(output.value.span))
                                && same(self.text(width.value.span), self.text(input.value.span))
                        }
                        _ => false,
                    });
                    if let Some((path, _)) = found {
                        let text = format!("{}: tied({})", param.name.name, path.join("."));
                        self.replace(Kind::TieHead, self.trimmed(param.span), text);
                    }
                }
                _ => {}
            }
        }
    }

    fn forward(&mut self, forward: &lmx_grammar::ast::Forward) {
        self.body(&forward.body, false);
        let inputs: Vec<_> = forward.inputs.iter().map(|i| &i.name).collect();
        self.renames(&inputs, &forward.body);
        for input in &forward.inputs {
            let shape = &input.ty.shape;
            if shape.is_empty() {
                continue;
            }
            let dims: Vec<&str> = shape.iter().map(|d| self.text(d.span)).collect();
            for at in reads_before_rebinding(&forward.body, &input.name.name) {
                let name = &input.name.name;
                let axis = at.start % shape.len();
                let slice = format!(
                    "{name}[{}0:{}]",
                    ":, ".repeat(axis),
                    self.operand(&shape[axis])
                );
                self.replace(Kind::IdentitySlice, at, slice);
                let reshape = format!("reshape({name}, [{}])", dims.join(", "));
                self.replace(Kind::NoopReshape, at, reshape);
                // `zeros` is float, and a float one would make int ids float.
                let one = match input.ty.dtype {
                    Dtype::Float => {
                        let zeros = format!("{name} + zeros([{}])", dims.join(", "));
                        self.replace(Kind::AddZeros, at, self.wrapped(at.start, zeros));
                        "1.0"
                    }
                    Dtype::Int => "1",
                    Dtype::Bool => continue,
                };
                let scaled = self.wrapped(at.start, format!("{name} * {one}"));
                self.replace(Kind::ScaleOne, at, scaled);
            }
        }
        self.extract_lets(&forward.body);
        self.indexed_loops(&forward.body);
    }

    /// Expression sites of a body; `step` bodies have no layer calls or activations to mutate.
    fn body(&mut self, body: &Body, step: bool) {
        let mut exprs = Vec::new();
        body_exprs(body, &mut exprs);
        for range_end in for_range_ends(body) {
            let text = format!("{} + 1", self.operand(range_end));
            self.replace(Kind::AddLayer, range_end.span, text);
        }
        for e in exprs {
            self.commute(e);
            self.sqrt_as_pow(e);
            let ExprKind::Call(callee, args) = &e.kind else {
                continue;
            };
            self.reorder_keywords(args);
            if let ExprKind::Name(f) = &callee.kind {
                self.keyword_to_positional(f, args);
            }
            if step {
                continue;
            }
            match &callee.kind {
                ExprKind::Name(f) if ACTIVATIONS.contains(&f.as_str()) => {
                    let i = ACTIVATIONS.iter().position(|a| a == f).unwrap_or(0);
                    let other = ACTIVATIONS
                        [(i + 1 + callee.span.start % (ACTIVATIONS.len() - 1)) % ACTIVATIONS.len()];
                    self.replace(Kind::SwapActivation, callee.span, other.to_string());
                }
                ExprKind::Name(f) if f == "dropout" => {
                    if let Some(Arg { name: None, value }) = args.first() {
                        let text = if self.line_start(e.span.start) {
                            self.text(value.span).to_string()
                        } else {
                            self.operand(value)
                        };
                        self.replace(Kind::DropDropout, e.span, text);
                    }
                }
                _ => {}
            }
            if self.is_layer_call(e) {
                self.layer_call(e);
            }
        }
    }

    /// `stop_gradient(e)`, `if n > 0 { e } else { e }` and `e * 1.0` of a layer call `e`.
    fn layer_call(&mut self, call: &Expr) {
        let (span, text) = (call.span, self.text(call.span));
        self.replace(Kind::StopGradient, span, format!("stop_gradient({text})"));
        if let Some(n) = self.int_setting() {
            let text = format!("if {n} > 0 {{ {text} }} else {{ {text} }}");
            self.replace(Kind::StaticIf, span, self.wrapped(span.start, text));
        }
        let scaled = self.wrapped(span.start, format!("{text} * 1.0"));
        self.replace(Kind::ScaleOne, span, scaled);
    }

    /// Exchanges the first two keyword arguments of a call.
    fn reorder_keywords(&mut self, args: &[Arg]) {
        let keywords: Vec<Span> = args
            .iter()
            .filter_map(|a| {
                a.name
                    .as_ref()
                    .map(|n| Span::new(n.span.start, a.value.span.end))
            })
            .collect();
        if let [a, b, ..] = keywords.as_slice() {
            let (ta, tb) = (self.text(*a), self.text(*b));
            let detail = format!("`{}` <-> `{}`", short(ta), short(tb));
            let edits = vec![
                Edit {
                    span: *a,
                    text: tb.to_string(),
                },
                Edit {
                    span: *b,
                    text: ta.to_string(),
                },
            ];
            self.push(Kind::ReorderKeywords, a.start, detail, edits);
        }
    }

    /// `f(a, name = b, ...)` as `f(a, b, ...)` where `name` is `f`'s parameter after `a` (a
    /// layer's signature from `lmx_grammar::ir::LayerKind`, a builtin's from [`POSITIONAL`]).
    fn keyword_to_positional(&mut self, f: &str, args: &[Arg]) {
        let params: Vec<&str> = match lmx_grammar::ir::LayerKind::from_name(f) {
            Some(layer) => layer.signature().iter().map(|(name, _, _)| *name).collect(),
            None => match POSITIONAL.iter().find(|(name, _)| *name == f) {
                Some((_, params)) => params.to_vec(),
                None => return,
            },
        };
        let positional = args.iter().take_while(|a| a.name.is_none()).count();
        let Some(Arg {
            name: Some(name),
            value,
        }) = args.get(positional)
        else {
            return;
        };
        if params.get(positional) == Some(&name.name.as_str()) {
            let span = Span::new(name.span.start, value.span.start);
            let detail = format!(
                "`{}` -> `{}`",
                short(self.text(Span::new(span.start, value.span.end))),
                short(self.text(value.span))
            );
            let edits = vec![Edit {
                span,
                text: String::new(),
            }];
            self.push(Kind::KeywordToPositional, span.start, detail, edits);
        }
    }

    /// `sqrt(a)` as `a ** 0.5`.
    fn sqrt_as_pow(&mut self, e: &Expr) {
        if let ExprKind::Call(callee, args) = &e.kind {
            if let (ExprKind::Name(f), [Arg { name: None, value }]) = (&callee.kind, &args[..]) {
                if f == "sqrt" {
                    let text = format!("{} ** 0.5", self.operand(value));
                    let text = self.wrapped(e.span.start, text);
                    self.replace(Kind::SqrtAsPow, e.span, text);
                }
            }
        }
    }

    /// A layer call of a statement moved into a `let` before it, per layer call of each
    /// statement without an `if` (whose branches have scopes of their own).
    fn extract_lets(&mut self, body: &Body) {
        for stmt in &body.stmts {
            let value = match &stmt.kind {
                StmtKind::Let(_, e) | StmtKind::Assign(_, e) | StmtKind::Expr(e) => e,
                StmtKind::For(_, _, inner) => {
                    self.extract_lets(inner);
                    continue;
                }
                _ => continue,
            };
            let Some(indent) = self.indent(stmt.span.start) else {
                continue;
            };
            let mut exprs = Vec::new();
            expr_tree(value, &mut exprs);
            if exprs.iter().any(|e| matches!(e.kind, ExprKind::If(..))) {
                continue;
            }
            exprs.retain(|e| self.is_layer_call(e));
            for e in exprs {
                let text = self.text(e.span);
                let at = stmt.span.start;
                let edits = vec![
                    Edit {
                        span: Span::new(at, at),
                        text: format!("let extracted = {text}\n{indent}"),
                    },
                    Edit {
                        span: e.span,
                        text: "extracted".to_string(),
                    },
                ];
                let detail = format!("`let extracted = {}` before its statement", short(text));
                self.push(Kind::ExtractLet, e.span.start, detail, edits);
            }
        }
    }

    /// `for i, layer in list` for `for layer in list`, at any depth.
    fn indexed_loops(&mut self, body: &Body) {
        for stmt in &body.stmts {
            if let StmtKind::For(vars, range, inner) = &stmt.kind {
                if let ([var], None) = (vars.as_slice(), &range.end) {
                    let at = var.span.start;
                    let edits = vec![Edit {
                        span: Span::new(at, at),
                        text: "i_mutant, ".to_string(),
                    }];
                    let detail =
                        format!("`for {} in` -> `for i_mutant, {} in`", var.name, var.name);
                    self.push(Kind::IndexedLoop, at, detail, edits);
                }
                self.indexed_loops(inner);
            }
        }
    }

    /// Another optimizer, with its defaults, its settings reordered, and `accumulate 2` where a
    /// step has none.
    fn step_statements(&mut self, body: &Body) {
        let accumulates = body
            .stmts
            .iter()
            .any(|s| matches!(s.kind, StmtKind::Accumulate(_)));
        for (i, stmt) in body.stmts.iter().enumerate() {
            let StmtKind::Optimizer(call) = &stmt.kind else {
                continue;
            };
            self.reorder_keywords(&call.args);
            let others: Vec<&str> = OPTIMIZERS
                .iter()
                .copied()
                .filter(|o| *o != call.name.name)
                .collect();
            let other = others[call.span.start % others.len()];
            // The call's span starts at the `optimizer` keyword.
            let span = Span::new(call.name.span.start, call.span.end);
            self.replace(Kind::SwapOptimizer, span, format!("{other}()"));
            let next = body.stmts.get(i + 1).map(|s| s.span.start);
            if let (false, Some(at)) = (accumulates, next) {
                if let Some(indent) = self.indent(at) {
                    let edits = vec![Edit {
                        span: Span::new(at, at),
                        text: format!("accumulate 2\n{indent}"),
                    }];
                    self.push(Kind::AddAccumulate, at, "`accumulate 2`".to_string(), edits);
                }
            }
        }
    }

    fn static_expr(&mut self, e: &Expr) {
        let mut exprs = Vec::new();
        expr_tree(e, &mut exprs);
        for e in exprs {
            self.commute(e);
            self.sqrt_as_pow(e);
        }
    }

    fn commute(&mut self, e: &Expr) {
        if let ExprKind::Binary(op @ (BinaryOp::Add | BinaryOp::Mul), _, a, b) = &e.kind {
            // Not parenthesised as a whole: the span of a parenthesised expression excludes
            // its parentheses, so the operator keeps its place in the tree, and a statement
            // that begins with `(` would continue the line before it as a call.
            let text = format!("{} {} {}", self.operand(b), op.symbol(), self.operand(a));
            self.replace(Kind::Commute, e.span, text);
        }
    }

    /// A rename site per local name of `body` (and per input) that names nothing else.
    fn renames(&mut self, inputs: &[&lmx_grammar::ast::Ident], body: &Body) {
        let mut names = BTreeSet::new();
        bound_names(body, &mut names);
        names.extend(inputs.iter().map(|i| i.name.clone()));
        let globals = self.global_names();
        for name in names {
            if globals.contains(&name) || name.starts_with(|c: char| c.is_uppercase()) {
                continue;
            }
            let mut spans: Vec<Span> = inputs
                .iter()
                .filter(|i| i.name == name)
                .map(|i| i.span)
                .collect();
            occurrences(body, &name, &mut spans);
            spans.sort_by_key(|s| (s.start, s.end));
            spans.dedup();
            if spans.iter().any(|s| self.text(*s) != name) {
                continue;
            }
            let new = format!("{name}_renamed");
            let edits = spans
                .iter()
                .map(|&span| Edit {
                    span,
                    text: new.clone(),
                })
                .collect();
            let at = spans.iter().map(|s| s.start).min().unwrap_or(0);
            self.push(Kind::RenameLocal, at, format!("`{name}` -> `{new}`"), edits);
        }
    }

    fn global_names(&self) -> BTreeSet<String> {
        let mut names = self.params.clone();
        names.extend(self.model.config.iter().map(|c| c.name().name.clone()));
        names.extend(self.model.blocks.iter().map(|b| b.name.name.clone()));
        for block in &self.model.blocks {
            names.extend(block.args.iter().map(|a| a.name.name.clone()));
        }
        names
    }
}

/// Whether two expressions' texts are equal apart from white space.
fn same(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

/// At most 60 characters of `text`, on one line.
fn short(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &flat[..i]),
        None => flat,
    }
}

fn param_names(model: &Model) -> BTreeSet<String> {
    fn walk(group: &ParamGroup, out: &mut BTreeSet<String>) {
        for p in &group.entries {
            out.insert(p.name.name.clone());
            if let ParamKind::Group(g) = &p.kind {
                walk(g, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    let groups = model.blocks.iter().filter_map(|b| b.params.as_ref());
    for group in groups.chain(model.params.as_ref()) {
        walk(group, &mut out);
    }
    out
}

/// The element variables of the loops over block lists in every forward pass.
fn element_names(model: &Model) -> BTreeSet<String> {
    fn walk(body: &Body, out: &mut BTreeSet<String>) {
        for stmt in &body.stmts {
            if let StmtKind::For(vars, range, inner) = &stmt.kind {
                if range.end.is_none() {
                    out.extend(vars.last().map(|v| v.name.clone()));
                }
                walk(inner, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    let forwards = model.blocks.iter().map(|b| &b.forward);
    for forward in forwards.chain(model.forward.as_ref()) {
        walk(&forward.body, &mut out);
    }
    out
}

/// Every `embedding(...)` parameter under `group`, with its dotted path.
fn embeddings_of<'a>(
    group: &'a ParamGroup,
    path: &mut Vec<&'a str>,
    out: &mut Vec<(Vec<&'a str>, &'a ModuleRef)>,
) {
    for Param { name, kind, .. } in &group.entries {
        path.push(&name.name);
        match kind {
            ParamKind::Module(m) if m.name.name == "embedding" => out.push((path.clone(), m)),
            ParamKind::Group(g) => embeddings_of(g, path, out),
            _ => {}
        }
        path.pop();
    }
}

/// Every expression of a body, outermost first, including those of nested bodies.
fn body_exprs<'a>(body: &'a Body, out: &mut Vec<&'a Expr>) {
    for stmt in &body.stmts {
        match &stmt.kind {
            StmtKind::Let(_, e)
            | StmtKind::Assign(_, e)
            | StmtKind::Accumulate(e)
            | StmtKind::Update(e)
            | StmtKind::Next(_, e)
            | StmtKind::Expr(e) => expr_tree(e, out),
            StmtKind::For(_, range, inner) => {
                expr_tree(&range.start, out);
                if let Some(end) = &range.end {
                    expr_tree(end, out);
                }
                body_exprs(inner, out);
            }
            StmtKind::While(e, inner) => {
                expr_tree(e, out);
                body_exprs(inner, out);
            }
            StmtKind::Optimizer(call) => call.args.iter().for_each(|a| expr_tree(&a.value, out)),
            StmtKind::Metrics(_) | StmtKind::Frozen(..) => {}
        }
    }
}

/// The ends of the `a..b` ranges of a body's `for` loops, at any depth.
fn for_range_ends(body: &Body) -> Vec<&Expr> {
    let mut out = Vec::new();
    for stmt in &body.stmts {
        match &stmt.kind {
            StmtKind::For(_, range, inner) => {
                out.extend(range.end.as_ref());
                out.extend(for_range_ends(inner));
            }
            StmtKind::While(_, inner) => out.extend(for_range_ends(inner)),
            _ => {}
        }
    }
    out
}

/// `e` and every expression inside it, outermost first.
fn expr_tree<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    out.push(e);
    match &e.kind {
        ExprKind::List(items) => items.iter().for_each(|i| expr_tree(i, out)),
        ExprKind::Unary(_, a) | ExprKind::Member(a, _) => expr_tree(a, out),
        ExprKind::Binary(_, _, a, b) => {
            expr_tree(a, out);
            expr_tree(b, out);
        }
        ExprKind::Call(f, args) => {
            expr_tree(f, out);
            args.iter().for_each(|a| expr_tree(&a.value, out));
        }
        ExprKind::Index(a, subs) => {
            expr_tree(a, out);
            for s in subs {
                match s {
                    Subscript::Index(i) => expr_tree(i, out),
                    Subscript::Slice(a, b, _) => {
                        a.iter().chain(b.iter()).for_each(|x| expr_tree(x, out))
                    }
                    Subscript::Ellipsis(_) => {}
                }
            }
        }
        ExprKind::If(c, then, otherwise) => {
            expr_tree(c, out);
            body_exprs(then, out);
            if let Some(o) = otherwise {
                body_exprs(o, out);
            }
        }
        ExprKind::Int(_)
        | ExprKind::Float(_)
        | ExprKind::Bool(_)
        | ExprKind::Str(_)
        | ExprKind::Name(_) => {}
    }
}

/// Names bound by `let` or `for` in a body, at any depth.
fn bound_names(body: &Body, out: &mut BTreeSet<String>) {
    for stmt in &body.stmts {
        match &stmt.kind {
            StmtKind::Let(names, _) => out.extend(names.iter().map(|n| n.name.clone())),
            StmtKind::For(names, _, inner) => {
                out.extend(names.iter().map(|n| n.name.clone()));
                bound_names(inner, out);
            }
            StmtKind::While(_, inner) => bound_names(inner, out),
            _ => {}
        }
    }
    let mut exprs = Vec::new();
    body_exprs(body, &mut exprs);
    for e in exprs {
        if let ExprKind::If(_, then, otherwise) = &e.kind {
            bound_names(then, out);
            if let Some(o) = otherwise {
                bound_names(o, out);
            }
        }
    }
}

/// The spans of every occurrence of `name` in a body: uses, bindings, assignments, metrics.
fn occurrences(body: &Body, name: &str, out: &mut Vec<Span>) {
    let idents = |ids: &[lmx_grammar::ast::Ident], out: &mut Vec<Span>| {
        out.extend(ids.iter().filter(|i| i.name == name).map(|i| i.span))
    };
    for stmt in &body.stmts {
        match &stmt.kind {
            StmtKind::Let(ids, _) | StmtKind::Metrics(ids) => idents(ids, out),
            StmtKind::Assign(id, _) => idents(std::slice::from_ref(id), out),
            StmtKind::For(ids, _, inner) => {
                idents(ids, out);
                // The loop body's own bindings; its expressions come with the outer walk.
                let mut nested = Vec::new();
                occurrences_bindings(inner, name, &mut nested);
                out.extend(nested);
            }
            _ => {}
        }
    }
    let mut exprs = Vec::new();
    body_exprs(body, &mut exprs);
    for e in exprs {
        match &e.kind {
            ExprKind::Name(n) if n == name => out.push(e.span),
            ExprKind::If(_, then, otherwise) => {
                occurrences_bindings(then, name, out);
                if let Some(o) = otherwise {
                    occurrences_bindings(o, name, out);
                }
            }
            _ => {}
        }
    }
}

/// The binding occurrences (`let`, assignment, `for`, `metrics`) of `name` in a body, at any
/// depth of `for` loops.
fn occurrences_bindings(body: &Body, name: &str, out: &mut Vec<Span>) {
    for stmt in &body.stmts {
        let ids: Vec<&lmx_grammar::ast::Ident> = match &stmt.kind {
            StmtKind::Let(ids, _) | StmtKind::Metrics(ids) => ids.iter().collect(),
            StmtKind::Assign(id, _) => vec![id],
            StmtKind::For(ids, _, inner) => {
                occurrences_bindings(inner, name, out);
                ids.iter().collect()
            }
            _ => Vec::new(),
        };
        out.extend(ids.iter().filter(|i| i.name == name).map(|i| i.span));
    }
}

/// The spans of the reads of `name` in the leading `let` and expression statements of `body`,
/// up to and including the first statement that binds `name` again: there `name` is still the
/// input, of its declared shape.
fn reads_before_rebinding(body: &Body, name: &str) -> Vec<Span> {
    let mut out = Vec::new();
    for stmt in &body.stmts {
        let (value, rebinds) = match &stmt.kind {
            StmtKind::Let(ids, e) => (e, ids.iter().any(|i| i.name == name)),
            StmtKind::Assign(id, e) => (e, id.name == name),
            StmtKind::Expr(e) => (e, false),
            _ => break,
        };
        let mut exprs = Vec::new();
        expr_tree(value, &mut exprs);
        if exprs.iter().any(|e| matches!(e.kind, ExprKind::If(..))) {
            break;
        }
        out.extend(
            exprs
                .iter()
                .filter(|e| matches!(&e.kind, ExprKind::Name(n) if n == name))
                .map(|e| e.span),
        );
        if rebinds {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = r#"model Small {
    config {
        vocab: int = 64
        d: int = 16
        pdrop: float = 0.0
        d_ff = 4 * d
    }
    preset tiny { d = 8 }
    block Mlp {
        params {
            up: linear(d, d_ff)
            down: linear(d_ff, d, bias = false)
        }
        forward(x: [B, T, d]) -> [B, T, d] {
            let h = gelu(up(x))
            let h = h + softmax(h, axis = -1)
            down(dropout(h, pdrop)) + x
        }
    }
    params {
        wte: embedding(vocab, d)
        blocks: [Mlp; 2]
        head: tied(wte)
    }
    forward(tokens: [B, T] int) -> [B, T, vocab] {
        let x = wte(tokens) * sqrt(d)
        for block in blocks {
            x = block(x)
        }
        head(x)
    }
    step train(tokens: [B, T] int, targets: [B, T] int) {
        optimizer adamw(beta1 = 0.9, weight_decay = 0.1)
        let loss = cross_entropy(forward(tokens), targets)
        let grads = grad(loss)
        update grads
        metrics loss
    }
}
"#;

    fn site_list() -> (Model, Vec<Site>) {
        let model = lmx_grammar::parse(MODEL).expect("the example parses");
        let sites = sites(&model, MODEL);
        (model, sites)
    }

    fn one(kind: Kind) -> String {
        let (model, sites) = site_list();
        let site = sites
            .iter()
            .find(|s| s.kind == kind)
            .unwrap_or_else(|| panic!("a {kind:?} site in {sites:#?}"));
        apply(&model, MODEL, &[site], "Small")
    }

    #[test]
    fn each_kind_edits_the_text_where_expected() {
        assert!(one(Kind::Commute).contains("d_ff = d * 4\n"));
        let swapped = one(Kind::SwapActivation);
        let other = ACTIVATIONS
            .iter()
            .find(|a| swapped.contains(&format!("let h = {a}(up(x))")));
        assert!(other.is_some_and(|a| *a != "gelu"), "{swapped}");
        assert!(one(Kind::DropDropout).contains("down(h) + x"));
        assert!(one(Kind::AddLayer).contains("blocks: [Mlp; 2 + 1]"));
        assert!(one(Kind::GrowPreset).contains("preset tiny { d = 16 }"));
        assert!(one(Kind::UntieHead).contains("head: linear(d, vocab, bias = false)"));
        assert!(one(Kind::ToggleBias).contains("up: linear(d, d_ff, bias = false)"));
        assert!(one(Kind::StopGradient).contains("let h = gelu(stop_gradient(up(x)))"));
        let sliced = one(Kind::IdentitySlice);
        let slices = ["x[0:B]", "x[:, 0:T]", "x[:, :, 0:d]"];
        assert!(
            slices
                .iter()
                .any(|s| sliced.contains(&format!("gelu(up({s}))"))),
            "{sliced}"
        );
        assert!(one(Kind::NoopReshape).contains("gelu(up(reshape(x, [B, T, d])))"));
        assert!(one(Kind::AddPreset).contains("    preset 2nd-tiny { d = 8 }\n    preset tiny"));
        assert!(one(Kind::ReorderKeywords).contains("adamw(weight_decay = 0.1, beta1 = 0.9)"));
        assert!(
            one(Kind::StaticIf).contains("let h = gelu((if vocab > 0 { up(x) } else { up(x) }))")
        );
        assert!(one(Kind::ScaleOne).contains("let h = gelu((up(x) * 1.0))"));
        assert!(one(Kind::AddZeros).contains("let h = gelu(up((x + zeros([B, T, d]))))"));
        assert!(one(Kind::ExtractLet)
            .contains("let extracted = up(x)\n            let h = gelu(extracted)"));
        assert!(one(Kind::IndexedLoop).contains("for i_mutant, block in blocks {"));
        assert!(one(Kind::SqrtAsPow).contains("let x = wte(tokens) * (d ** 0.5)"));
        let swapped = one(Kind::SwapOptimizer);
        assert!(
            ["sgd", "adam", "lion", "adafactor"]
                .iter()
                .any(|o| swapped.contains(&format!("optimizer {o}()\n"))),
            "{swapped}"
        );
        assert!(one(Kind::AddAccumulate).contains("accumulate 2\n        let loss"));
        let (model, sites) = site_list();
        let positional: Vec<String> = sites
            .iter()
            .filter(|s| s.kind == Kind::KeywordToPositional)
            .map(|s| apply(&model, MODEL, &[s], "Small"))
            .collect();
        assert_eq!(positional.len(), 2);
        assert!(positional[0].contains("down: linear(d_ff, d, false)"));
        assert!(positional[1].contains("let h = h + softmax(h, -1)"));
    }

    #[test]
    fn every_kind_is_found_and_every_single_mutation_of_the_example_checks() {
        assert!(lmx_grammar::compile_str(MODEL).is_ok());
        let (model, sites) = site_list();
        let kinds: BTreeSet<Kind> = sites.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            KINDS.into_iter().filter(|k| *k != Kind::TieHead).collect()
        );
        for site in &sites {
            let text = apply(&model, MODEL, &[site], "Small");
            if let Err(d) = lmx_grammar::check_source("small.lmx", &text) {
                panic!("{}:\n{d}\n{text}", site.what);
            }
        }
    }

    #[test]
    fn a_rename_reaches_every_use_and_binding_of_its_body_and_nothing_else() {
        let (model, sites) = site_list();
        let renames: Vec<&Site> = sites
            .iter()
            .filter(|s| s.kind == Kind::RenameLocal && s.what.contains("`x`"))
            .collect();
        assert_eq!(renames.len(), 2, "one per body: {renames:#?}");
        let block = apply(&model, MODEL, &[renames[0]], "Small");
        assert!(block.contains("forward(x_renamed: [B, T, d])"), "{block}");
        assert!(block.contains("let h = gelu(up(x_renamed))"), "{block}");
        assert!(
            block.contains("down(dropout(h, pdrop)) + x_renamed"),
            "{block}"
        );
        assert!(block.contains("let x = wte(tokens) * sqrt(d)"), "{block}");
        let forward = apply(&model, MODEL, &[renames[1]], "Small");
        assert!(
            forward.contains("let x_renamed = wte(tokens) * sqrt(d)"),
            "{forward}"
        );
        assert!(
            forward.contains("x_renamed = block(x_renamed)"),
            "{forward}"
        );
        assert!(forward.contains("head(x_renamed)"), "{forward}");
        assert!(forward.contains("forward(x: [B, T, d])"), "{forward}");
    }

    #[test]
    fn a_tied_head_of_matching_sizes_can_be_tied_back() {
        let untied = one(Kind::UntieHead);
        let model = lmx_grammar::parse(&untied).expect("the mutant parses");
        let sites = sites(&model, &untied);
        let tie = sites
            .iter()
            .find(|s| s.kind == Kind::TieHead)
            .expect("a tie site");
        assert_eq!(apply(&model, &untied, &[tie], "Small"), MODEL);
    }

    #[test]
    fn choices_are_deterministic_distinct_and_free_of_conflicts() {
        let (_, sites) = site_list();
        let a = choose(&sites, 30, 7);
        assert_eq!(a, choose(&sites, 30, 7));
        assert_ne!(a, choose(&sites, 30, 8));
        assert_eq!(a.len(), 30);
        let sets: BTreeSet<BTreeSet<usize>> =
            a.iter().map(|c| c.iter().copied().collect()).collect();
        assert_eq!(sets.len(), a.len());
        for chosen in &a {
            for (i, &x) in chosen.iter().enumerate() {
                for &y in &chosen[i + 1..] {
                    assert!(!sites[x].conflicts(&sites[y]), "{x} and {y}");
                }
            }
        }
        let kinds: BTreeSet<Kind> = a.iter().map(|c| sites[c[0]].kind).collect();
        let all: BTreeSet<Kind> = sites.iter().map(|s| s.kind).collect();
        assert_eq!(kinds, all, "every kind leads some mutant");
    }
}
