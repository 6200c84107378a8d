//! Errors while reading a workload: a position in the TOML file and a message, turned into the
//! crate's [`Error::Input`] (`FILE: line L column C: MESSAGE`) once the file's path is known.

use std::path::Path;

use super::ast::Span;
use crate::error::Error;

/// What is wrong, and where (the lexer and parser know positions but not the path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub span: Span,
    pub message: String,
}

impl SyntaxError {
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        SyntaxError {
            span,
            message: message.into(),
        }
    }

    pub fn into_error(self, path: &Path) -> Error {
        Error::input(path, self.span.location(), self.message)
    }
}

pub(crate) type PResult<T> = std::result::Result<T, SyntaxError>;
