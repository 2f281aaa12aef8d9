//! Diagnostics: what went wrong, where, and how to fix it; rendered rustc-style by miette.

use std::fmt;

use miette::{
    Diagnostic as MietteDiagnostic, GraphicalReportHandler, GraphicalTheme, LabeledSpan,
    MietteError, MietteSpanContents, SourceCode, SourceSpan, SpanContents,
};

use crate::span::Span;

/// A located message about a `.lmx` file.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq)]
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
    let source = Indexed::new(file_name, source);
    for d in diagnostics {
        let report = Located {
            diagnostic: d,
            source: &source,
        };
        // Writing into a String cannot fail.
        let _ = handler.render_report(&mut out, &report);
    }
    out
}

/// A diagnostic joined with its source, as miette wants it.
struct Located<'a> {
    diagnostic: &'a Diagnostic,
    source: &'a Indexed<'a>,
}

/// A source text with the byte offset of each line's start, computed once per render.
///
/// miette's own `SourceCode` for text scans from the file's start on every read (so rendering
/// N diagnostics of a large file takes N scans) and counts columns in bytes. This one finds the
/// lines around a span by binary search, lets miette lay out only those lines, and reports the
/// column in characters.
struct Indexed<'a> {
    name: &'a str,
    text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> Indexed<'a> {
    fn new(name: &'a str, text: &'a str) -> Self {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Indexed {
            name,
            text,
            line_starts,
        }
    }

    /// The line holding byte `offset`, counted from 0.
    fn line_of(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&start| start <= offset) - 1
    }
}

impl SourceCode for Indexed<'_> {
    fn read_span<'b>(
        &'b self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'b> + 'b>, MietteError> {
        let (start, len) = (span.offset(), span.len());
        if start + len > self.text.len() {
            return Err(MietteError::OutOfBounds);
        }
        // The lines miette will show, and one more after them (it stops past a line's end).
        let first = self.line_of(start).saturating_sub(context_lines_before);
        let last = self.line_of(start + len.saturating_sub(1)) + context_lines_after + 2;
        let from = self.line_starts[first];
        let to = self
            .line_starts
            .get(last)
            .copied()
            .unwrap_or(self.text.len());
        let window = &self.text[from..to];
        let local = SourceSpan::new((start - from).into(), len);
        let contents = window.read_span(&local, context_lines_before, context_lines_after)?;
        let line_start = self.line_starts[self.line_of(start)];
        let column = match context_lines_before {
            0 => self.text[line_start..start].chars().count(),
            _ => 0,
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.to_string(),
            contents.data(),
            SourceSpan::new(
                (contents.span().offset() + from).into(),
                contents.span().len(),
            ),
            contents.line() + first,
            column,
            contents.line_count() + first,
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
        let len = self.source.text.len();
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
