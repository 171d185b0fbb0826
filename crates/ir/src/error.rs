//! Errors of the IR crate, each carrying the source location it refers to when there is one.

use std::fmt;

/// A 1-based line and column in IR text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceLoc {
    pub line: u32,
    pub col: u32,
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A syntax or name-resolution error in IR text: an unexpected character or token, an unknown
/// op, attribute, post-op or derivation, an attribute given twice or of the wrong kind, a name
/// defined twice or used before its definition, a wrong number of operands.
///
/// Returned by [`crate::parse`]; `loc` is where the offending token starts. Fix the text at
/// that location; [`IrError::render`] prints it as `file:line:col: error: message` with the
/// line and a caret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{loc}: {message}")]
pub struct ParseError {
    pub loc: SourceLoc,
    pub message: String,
}

/// A graph that is well-formed text but not a valid graph: wrong ranks, channels, shapes or
/// attributes. `subject` names what is at fault (`%value` or `@param`).
///
/// Returned by [`crate::Graph::verify`], [`crate::infer_shapes`] and
/// [`crate::Graph::bind_inputs`] (an unknown or missing input, or a given shape that
/// contradicts the declared one or an earlier binding of the same symbol), and wrapped by the runtime's
/// and the reference's errors. `loc` is the node's or declaration's location when the graph
/// came from text. Fix the named value, parameter or input shape.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{subject}: {message}")]
pub struct VerifyError {
    pub loc: Option<SourceLoc>,
    pub subject: String,
    pub message: String,
}

/// Any error the IR crate reports about a graph's text: what the CLI's `check` and `dump`
/// render with the file name and location ([`IrError::render`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IrError {
    /// The text does not parse; see [`ParseError`].
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The text parses but the graph is invalid; see [`VerifyError`].
    #[error(transparent)]
    Verify(#[from] VerifyError),
}

impl IrError {
    pub fn loc(&self) -> Option<SourceLoc> {
        match self {
            IrError::Parse(e) => Some(e.loc),
            IrError::Verify(e) => e.loc,
        }
    }

    /// Renders the error as `file:line:col: error: message`, followed by the source line and a
    /// caret under the column when the location is known.
    pub fn render(&self, file: &str, source: &str) -> String {
        let message = match self {
            IrError::Parse(e) => e.message.clone(),
            IrError::Verify(e) => format!("{}: {}", e.subject, e.message),
        };
        match self.loc() {
            None => format!("{file}: error: {message}"),
            Some(loc) => {
                let line = source.lines().nth(loc.line as usize - 1).unwrap_or("");
                let caret_pad: String = line
                    .chars()
                    .take(loc.col as usize - 1)
                    .map(|c| if c == '\t' { '\t' } else { ' ' })
                    .collect();
                format!("{file}:{loc}: error: {message}\n{line}\n{caret_pad}^")
            }
        }
    }
}
