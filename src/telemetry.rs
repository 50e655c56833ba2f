//! Telemetry: `tracing` to stderr with an `EnvFilter` from `RUST_LOG` (default `info`;
//! `error` for `daylog chat`, see [`default_filter`]), pretty or JSON. teloxide's `log`
//! records are bridged in by `try_init` (tracing-log). Stdout stays free for command
//! output (`daylog sql`, `daylog chat`).

use std::io::Write as _;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// The filter from `RUST_LOG`, or `default` when it is unset, blank or invalid. A blank
/// value (`RUST_LOG=` in a `.env`, as every other variable there is left) would
/// otherwise be a filter with no rules, which lets nothing through, errors included.
/// A value that is not a filter is said on stderr (the log it would configure is not
/// there yet).
pub fn env_filter(default: &str) -> EnvFilter {
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let (filter, refused) = filter_from(rust_log.as_deref(), default);
    if let Some(value) = refused {
        let _ = writeln!(
            std::io::stderr(),
            "daylog: RUST_LOG={value:?} is not a log filter (a level such as warn or debug, or target=level); using {default:?}"
        );
    }
    filter
}

/// The filter, and the value of `RUST_LOG` when it was refused. A word that is neither
/// a level nor one of this program's targets (`warning`, `debg`) is refused too:
/// `EnvFilter` would read it as a target and let nothing else through, errors included.
fn filter_from<'v>(rust_log: Option<&'v str>, default: &str) -> (EnvFilter, Option<&'v str>) {
    let Some(value) = rust_log.filter(|value| !value.trim().is_empty()) else {
        return (EnvFilter::new(default), None);
    };
    match EnvFilter::try_new(value) {
        Ok(filter) if value.split(',').all(is_plausible_directive) => (filter, None),
        Ok(_) | Err(_) => (EnvFilter::new(default), Some(value)),
    }
}

/// Targets a bare directive may name: this program and the crates that log through it.
const TARGETS: [&str; 10] = [
    "daylog", "teloxide", "sqlx", "reqwest", "hyper", "h2", "tokio", "tower", "rustls", "backon",
];

fn is_plausible_directive(directive: &str) -> bool {
    let directive = directive.trim();
    if directive.is_empty() || directive.contains('=') || directive.contains('[') {
        return true;
    }
    directive
        .parse::<tracing_subscriber::filter::LevelFilter>()
        .is_ok()
        || TARGETS.iter().any(|target| directive.starts_with(target))
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
    std::panic::set_hook(Box::new(log_panic));
}

/// A panic as an event of this log instead of the default hook's line on stderr: where
/// it happened at `error`, what it said only at `debug`, because the message can quote
/// the input that caused it (a slice of a user's text), which is never logged above
/// `debug`.
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let location = info
        .location()
        .map(|at| format!("{}:{}", at.file(), at.line()))
        .unwrap_or_default();
    let payload = info.payload();
    let message = payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(%location, "panicked (the message is logged at debug)");
    tracing::debug!(%location, %message, "panic message");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blank_or_invalid_rust_log_is_the_default() {
        // (RUST_LOG, default, the filter's most verbose level)
        let rows = [
            (None, "info", Some(tracing::Level::INFO)),
            (Some(""), "info", Some(tracing::Level::INFO)),
            (Some("  "), "error", Some(tracing::Level::ERROR)),
            (Some("daylog=loud"), "info", Some(tracing::Level::INFO)),
            (Some("debug"), "info", Some(tracing::Level::DEBUG)),
            // A typo would be a target that lets nothing else through.
            (Some("warning"), "info", Some(tracing::Level::INFO)),
            (Some("info,debg"), "info", Some(tracing::Level::INFO)),
            (Some("WARN"), "info", Some(tracing::Level::WARN)),
            (Some("daylog"), "info", Some(tracing::Level::TRACE)),
            (
                Some("warn,daylog::bot=debug"),
                "info",
                Some(tracing::Level::DEBUG),
            ),
            // A bare target with a known prefix is a filter too.
            (Some("teloxide_core"), "info", Some(tracing::Level::TRACE)),
            (Some("off"), "info", None),
        ];
        for (rust_log, default, level) in rows {
            let (filter, refused) = filter_from(rust_log, default);
            let max = filter.max_level_hint().and_then(|hint| hint.into_level());
            assert_eq!(max, level, "{rust_log:?}");
            let said = matches!(rust_log, Some("daylog=loud" | "warning" | "info,debg"));
            assert_eq!(refused.is_some(), said, "{rust_log:?}");
        }
    }
}
