//! Telemetry: `tracing` to stderr with an `EnvFilter` from `RUST_LOG` (default `info`),
//! pretty or JSON. teloxide's `log` records are bridged in by `try_init` (tracing-log).
//! Stdout stays free for command output (`daylog sql`, `daylog chat`).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// The filter from `RUST_LOG`, or `default` when it is unset or invalid.
pub fn env_filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// Installs the global subscriber. A second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter("info"))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
