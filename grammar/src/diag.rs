//! Diagnostics: what went wrong, where, and how to fix it; rendered rustc-style by miette.

use std::fmt;

use miette::{
    Diagnostic as MietteDiagnostic, GraphicalReportHandler, GraphicalTheme, LabeledSpan,
    MietteError, MietteSpanContents, SourceCode, SourceSpan, SpanContents,
};

use crate::span::Span;

/// A located message about a `.lmx` file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Diagnostic {
    /// A stable code naming the rule broken, such as `lmx::branch::tensor_if`.
    pub code: &'static str,
    /// The one-line message.
    pub message: String,
    /// Labelled spans; the first is the primary one (its start is the reported position).
    pub labels: Vec<Label>,
    /// How to fix it.
    pub help: Option<String>,
}

/// A span with a short explanation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Label {
    /// The text it points at.
    pub span: Span,
    /// What to say there.
    pub text: String,
}

impl Diagnostic {
    /// A diagnostic with a code, a message and a primary label.
    pub fn new(
        code: &'static str,
        message: impl Into<String>,
        span: Span,
        label: impl Into<String>,
    ) -> Self {
        Diagnostic {
            code,
            message: message.into(),
            labels: vec![Label {
                span,
                text: label.into(),
            }],
            help: None,
        }
    }

    /// Adds a secondary label.
    pub fn with_label(mut self, span: Span, text: impl Into<String>) -> Self {
        self.labels.push(Label {
            span,
            text: text.into(),
        });
        self
    }

    /// Adds the help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// The primary span.
    pub fn span(&self) -> Span {
        self.labels.first().map(|l| l.span).unwrap_or_default()
    }
}

/// Renders diagnostics as text: `error[code]: message`, then `file:line:col`,
/// the source line with carets under each label, and the help line.
///
/// The output is plain ASCII without colours and wrapped at a fixed width, so
/// it is the same on every terminal and can be compared in tests.
pub fn render(diagnostics: &[Diagnostic], file_name: &str, source: &str) -> String {
    let handler = GraphicalReportHandler::new_themed(GraphicalTheme::none())
        .with_width(100)
        .with_links(false)
        .with_primary_span_start();
    let mut out = String::new();
    let lines = Lines::new(file_name, source);
    for d in diagnostics {
        let report = Located {
            diagnostic: d,
            source: &lines,
            len: source.len(),
        };
        // Writing into a String cannot fail.
        let _ = handler.render_report(&mut out, &report);
    }
    out
}

/// A diagnostic joined with its source, as miette wants it.
struct Located<'a> {
    diagnostic: &'a Diagnostic,
    source: &'a Lines<'a>,
    len: usize,
}

/// A named source with the offset where each of its lines starts.
///
/// miette finds a span's lines by scanning the source from its start, so that rendering one
/// diagnostic per preset of a long file took time quadratic in its length. This finds them by
/// binary search and hands miette only those lines (shifted back to their place in the file).
/// miette counts columns in bytes; this counts them in characters.
struct Lines<'a> {
    name: &'a str,
    text: &'a str,
    /// The offset of every line's first byte, as miette counts lines (`\n`, `\r\n` or `\r`).
    starts: Vec<usize>,
}

impl<'a> Lines<'a> {
    fn new(name: &'a str, text: &'a str) -> Self {
        let bytes = text.as_bytes();
        let mut starts = vec![0];
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n')) {
                starts.push(i + 1);
            }
        }
        Lines { name, text, starts }
    }

    /// The line holding byte `offset`, counted from 0.
    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset) - 1
    }
}

impl SourceCode for Lines<'_> {
    fn read_span<'b>(
        &'b self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'b> + 'b>, MietteError> {
        let first = self
            .line_of(span.offset())
            .saturating_sub(context_lines_before);
        let last = self.line_of(span.offset() + span.len().saturating_sub(1));
        let base = self.starts[first];
        let end = self
            .starts
            .get(last + context_lines_after + 1)
            .map_or(self.text.len(), |&end| end);
        let window = &self.text[base..end];
        let shifted = SourceSpan::new((span.offset() - base).into(), span.len());
        let inner = window.read_span(&shifted, context_lines_before, context_lines_after)?;
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.to_string(),
            inner.data(),
            SourceSpan::new((inner.span().offset() + base).into(), inner.span().len()),
            inner.line() + first,
            match context_lines_before {
                // Where miette reads the position it prints (`file:line:column`).
                0 => {
                    let line_start = self.starts[self.line_of(span.offset())];
                    self.text[line_start..span.offset()].chars().count()
                }
                _ => inner.column(),
            },
            inner.line_count() + first,
        )))
    }
}

impl fmt::Debug for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diagnostic.message)
    }
}

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diagnostic.message)
    }
}

impl std::error::Error for Located<'_> {}

impl MietteDiagnostic for Located<'_> {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.diagnostic.code))
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diagnostic
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let len = self.len;
        let labels = self
            .diagnostic
            .labels
            .iter()
            .enumerate()
            .map(move |(i, l)| {
                let start = l.span.start.min(len);
                let end = l.span.end.clamp(start, len);
                let span = (start, end - start);
                if i == 0 {
                    LabeledSpan::new_primary_with_span(Some(l.text.clone()), span)
                } else {
                    LabeledSpan::new_with_span(Some(l.text.clone()), span)
                }
            });
        Some(Box::new(labels))
    }
}
