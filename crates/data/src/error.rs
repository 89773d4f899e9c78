//! Errors of the data crate.

use std::fmt;
use std::path::PathBuf;

use ftrec_core::CoreError;

/// What is wrong with one TSV line. Every case names the field and the text it found, so that a
/// user can open the file at the reported line and see it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LineError {
    /// The bytes are not UTF-8; `column` is the 1-based byte column of the first bad byte.
    InvalidUtf8 { column: usize },
    /// 39 fields: the Kaggle `test.txt` layout, which has no label column.
    UnlabelledTestLine,
    /// Neither 40 fields (labelled) nor 39 (test layout).
    FieldCount { found: usize },
    /// The label is not `0` or `1`.
    Label { value: String },
    /// Integer feature `I{feature}` (1-based, as Criteo names them) is not a decimal integer.
    Dense { feature: usize, value: String },
    /// Categorical feature `C{feature}` (1-based) is neither empty nor 8 hex digits.
    Categorical { feature: usize, value: String },
    /// The line is longer than the reader accepts ([`crate::MAX_LINE_BYTES`]).
    TooLong { limit: usize },
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::InvalidUtf8 { column } => {
                write!(f, "invalid UTF-8 at byte column {column}")
            }
            LineError::UnlabelledTestLine => write!(
                f,
                "39 tab-separated fields: this looks like a Kaggle test.txt line, which has no \
                 label; only labelled data (label, I1..I13, C1..C26) can be trained on"
            ),
            LineError::FieldCount { found } => write!(
                f,
                "expected 40 tab-separated fields (label, I1..I13, C1..C26), found {found}"
            ),
            LineError::Label { value } => write!(f, "label {value:?} is neither 0 nor 1"),
            LineError::Dense { feature, value } => {
                write!(f, "I{feature} = {value:?} is not an integer")
            }
            LineError::Categorical { feature, value } => write!(
                f,
                "C{feature} = {value:?} is neither empty nor 8 hexadecimal digits"
            ),
            LineError::TooLong { limit } => write!(f, "line is longer than {limit} bytes"),
        }
    }
}

/// A malformed line with its place: file and 1-based line number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineFault {
    pub file: PathBuf,
    pub line: u64,
    pub kind: LineError,
}

impl fmt::Display for LineFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.kind)
    }
}

/// What can go wrong reading or generating data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A line of a data file is malformed (and `skip_malformed` is off).
    #[error("malformed line {fault}")]
    Malformed { fault: LineFault },
    /// A file or directory could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A data directory holds no file this layout reads.
    #[error("no data files in {dir}: {expected}")]
    NoFiles { dir: PathBuf, expected: String },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid data configuration: {0}")]
    InvalidConfig(String),
    /// A resume position does not belong to this source (other kind, other files, out of range).
    #[error("cannot resume from this position: {0}")]
    BadPosition(String),
    /// A whole pass over the data produced no training sample (empty files, everything held
    /// out or skipped): wrapping around again would loop forever.
    #[error("a whole epoch over {what} produced no training sample")]
    NoSamples { what: String },
    /// Evaluation was asked for but no held-out split is configured.
    #[error("no held-out split: holdout_every is 0")]
    NoHoldout,
    #[error(transparent)]
    Core(#[from] CoreError),
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }

    /// The line fault if this is a malformed-line error.
    pub fn line_fault(&self) -> Option<&LineFault> {
        match self {
            DataError::Malformed { fault } => Some(fault),
            _ => None,
        }
    }
}
