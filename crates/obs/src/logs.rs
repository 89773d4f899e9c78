//! The process's log lines, on stderr: `text` (each line as it always read: the message
//! alone) or `json` (one object a line with time, level, target and fields, for a log
//! pipeline). Records with target [`EVENT_TARGET`] (a run's timeline events with their
//! fields) and [`PROGRESS_TARGET`] (the training rate, at the report interval) go to JSON logs
//! only: in text form the run's own report lines tell the same.

use std::str::FromStr;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::ObsError;

/// Target of a run's timeline events (failure detected, server replaced, ...).
pub const EVENT_TARGET: &str = "ftrec::event";
/// Target of a run's progress records (step, samples, samples/s).
pub const PROGRESS_TARGET: &str = "ftrec::progress";

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl FromStr for LogFormat {
    type Err = ObsError;
    fn from_str(s: &str) -> Result<Self, ObsError> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(ObsError::UnknownLogFormat(other.into())),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Send the process's log records to stderr in `format` (info and above). A second call
/// does nothing: the first format stays.
pub fn init_logs(format: LogFormat) {
    let registry = tracing_subscriber::registry();
    let _ = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .without_time()
                    .with_target(false)
                    .with_level(false)
                    .with_ansi(false)
                    .with_filter(text_filter()),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr)
                    .with_current_span(false)
                    .with_span_list(false)
                    .with_filter(LevelFilter::INFO),
            )
            .try_init(),
    };
}

/// Info and above, without the records JSON logs alone carry. A filter on metadata alone
/// (levels and targets), so the decision is cached per call site and the level hint lets
/// every debug and trace record (the gRPC stack has one per frame) stop at the macro.
fn text_filter() -> Targets {
    Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target(EVENT_TARGET, LevelFilter::OFF)
        .with_target(PROGRESS_TARGET, LevelFilter::OFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_an_unknown_one_names_the_flag() {
        assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!("text".parse::<LogFormat>().unwrap(), LogFormat::Text);
        let e = "yaml".parse::<LogFormat>().unwrap_err().to_string();
        assert!(e.contains("--log-format") && e.contains("json"), "{e}");
    }

    #[test]
    fn text_logs_keep_info_and_leave_events_progress_and_debug_to_others() {
        use tracing::Level;
        let f = text_filter();
        assert!(f.would_enable("ftrec_cluster::coordinator", &Level::INFO));
        assert!(f.would_enable("h2::codec", &Level::WARN));
        assert!(!f.would_enable("h2::codec", &Level::DEBUG));
        assert!(!f.would_enable("h2::codec", &Level::TRACE));
        assert!(!f.would_enable(EVENT_TARGET, &Level::INFO));
        assert!(!f.would_enable(PROGRESS_TARGET, &Level::INFO));
        // No record below info can pass, so the macros stop there.
        use tracing_subscriber::layer::Filter;
        assert_eq!(
            Filter::<tracing_subscriber::Registry>::max_level_hint(&f),
            Some(LevelFilter::INFO)
        );
    }
}
