//! Telemetry: `tracing` to stderr with an `EnvFilter` from `RUST_LOG` (default `info`;
//! `error` for `daylog chat`, see [`default_filter`]), pretty or JSON. teloxide's `log`
//! records are bridged in by `try_init` (tracing-log). Stdout stays free for command
//! output (`daylog sql`, `daylog chat`).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// The filter from `RUST_LOG`, or `default` when it is unset or invalid.
pub fn env_filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// The log level when `RUST_LOG` does not set one. `daylog chat` shares its terminal
/// with a conversation: what its user must know is said there in a sentence (a missing
/// key, an entry not saved), so only errors are logged unless `RUST_LOG` asks for more.
/// Every other command is a daemon or a one-shot tool whose stderr is its log.
pub fn default_filter(chat: bool) -> &'static str {
    if chat { "error" } else { "info" }
}

/// Installs the global subscriber, with `default` as the filter unless `RUST_LOG` sets
/// one. A second call (tests) is a no-op.
pub fn init(format: LogFormat, default: &str) {
    // Colours only for a person at a terminal: a log file, journald or `docker logs`
    // would keep the escape codes as text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter(default))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
