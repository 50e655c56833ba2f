//! The subcommands of SPEC §2. Each returns an exit code: 0 ok, 2 bad usage or bad
//! config (with a message that names the key), 1 any other failure. Errors are printed
//! as one human sentence.

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{ConfigError, Settings};
use crate::llm::Llm;
use crate::sqlcmd::{self, Format, QueryError};
use crate::store::{self, Store, StoreError};

#[derive(Debug, Parser)]
#[command(
    name = "daylog",
    version,
    about = "A Telegram journaling bot that never loses an entry"
)]
pub struct Cli {
    /// Without a subcommand: `run` when TELOXIDE_TOKEN is set, else `chat`.
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the Telegram bot (long polling). Applies migrations first.
    Run,
    /// The same pipeline in a terminal: each line you type is a day log.
    Chat {
        /// The local user id the logs belong to.
        #[arg(long, default_value_t = 1)]
        user: i64,
    },
    /// Run one read-only SQL query on the store and print the rows.
    Sql {
        /// The query, e.g. "SELECT * FROM daily_metrics".
        query: String,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Apply database migrations and exit.
    Migrate,
    /// Check configuration, keys (never printed), the database and, with --ping, each provider.
    Doctor {
        /// Send one tiny request to each provider that has a key.
        #[arg(long)]
        ping: bool,
    },
}

/// A failure of a command, sorted by exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Usage(_) => 2,
            Self::Store(StoreError::NotSqlite) => 2,
            Self::Store(_) | Self::Other(_) => 1,
        }
    }
}

/// Runs a parsed command line to completion.
pub fn main(cli: Cli) -> ExitCode {
    let settings = match Settings::load() {
        Ok(settings) => settings,
        Err(error) => return fail(&CliError::Config(error)),
    };
    crate::telemetry::init(settings.log.format);
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&CliError::Other(error.into())),
    };
    let command = cli
        .command
        .unwrap_or(if settings.secrets.telegram_token.is_some() {
            Command::Run
        } else {
            Command::Chat { user: 1 }
        });
    let result = runtime.block_on(execute(command, settings));
    // Work still in flight after the grace period (a Bot API call that hangs) is
    // abandoned, not waited for: it must not hold the exit past Docker's stop timeout.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(code) => code,
        Err(error) => fail(&error),
    }
}

fn fail(error: &CliError) -> ExitCode {
    let mut text = error.to_string();
    if let CliError::Other(e) = error {
        // anyhow's chain, on one line.
        text = e
            .chain()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(": ");
    }
    let _ = writeln!(std::io::stderr(), "daylog: {text}");
    ExitCode::from(error.exit_code())
}

async fn execute(command: Command, settings: Settings) -> Result<ExitCode, CliError> {
    match command {
        Command::Migrate => {
            let store = open_store(&settings).await?;
            store.close().await;
            tracing::info!("database is up to date");
            Ok(ExitCode::SUCCESS)
        }
        Command::Sql { query, format } => sql(&settings, &query, format).await,
        Command::Doctor { ping } => Ok(doctor(&settings, ping).await),
        Command::Run => {
            if settings.secrets.telegram_token.is_none() {
                return Err(CliError::Config(ConfigError::Invalid {
                    key: "TELOXIDE_TOKEN".to_owned(),
                    message: "is not set; put the token from @BotFather in .env, or try `daylog chat`, which needs none".to_owned(),
                }));
            }
            crate::bot::run(settings).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Chat { user } => {
            let store = open_store(&settings).await?;
            crate::chat::run(settings, store, user).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Opens the store and applies migrations.
pub async fn open_store(settings: &Settings) -> Result<Store, StoreError> {
    Store::open_and_migrate(&settings.database_url, settings.store.busy_timeout()).await
}

async fn sql(settings: &Settings, query: &str, format: Format) -> Result<ExitCode, CliError> {
    // Refuse before touching the file, so a refused query changes nothing at all.
    sqlcmd::check(query).map_err(|r| CliError::Usage(r.to_string()))?;
    let pool = store::open_read_only(&settings.database_url, settings.store.busy_timeout()).await?;
    let result = sqlcmd::query(&pool, query).await;
    pool.close().await;
    let result = result.map_err(|e| match e {
        QueryError::Refused(r) => CliError::Usage(r.to_string()),
        QueryError::Sql(m) => CliError::Usage(format!("the query failed: {m}")),
    })?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(sqlcmd::render(&result, format).as_bytes())
        .map_err(|e| CliError::Other(e.into()))?;
    Ok(ExitCode::SUCCESS)
}

/// Prints one line per check; exit 1 when any check fails.
async fn doctor(settings: &Settings, ping: bool) -> ExitCode {
    let mut lines: Vec<(bool, String)> = vec![(true, "settings are valid".to_owned())];
    let used: std::collections::BTreeSet<&str> = settings
        .analysis
        .steps
        .iter()
        .chain(&settings.metrics.steps)
        .map(|s| s.provider.as_str())
        .collect();
    let mut any_analysis = false;
    for name in &used {
        let keys = settings.keys(name).len();
        let usable = settings.provider_usable(name);
        if usable && settings.analysis.steps.iter().any(|s| s.provider == *name) {
            any_analysis = true;
        }
        let text = match (keys, usable) {
            (0, true) => format!("provider {name}: no key needed"),
            (0, false) => format!(
                "provider {name}: no key ({} not set), its steps are skipped",
                settings.providers[*name].key_env(name)
            ),
            (n, _) => format!("provider {name}: {n} key{}", if n == 1 { "" } else { "s" }),
        };
        lines.push((usable, text));
    }
    lines.push((
        any_analysis,
        if any_analysis {
            "the analysis cascade has at least one usable step".to_owned()
        } else {
            "no analysis step has a key: entries are saved but never analysed".to_owned()
        },
    ));
    let missing = store::database_path(&settings.database_url)
        .ok()
        .flatten()
        .filter(|path| !path.exists());
    if let Some(path) = missing {
        // Checking must not create the file as a side effect.
        lines.push((
            false,
            format!(
                "database {} does not exist yet (`daylog migrate` or `daylog run` creates it)",
                path.display()
            ),
        ));
    } else {
        match Store::open(&settings.database_url, settings.store.busy_timeout()).await {
            Ok(store) => {
                let migrated = store.ensure_migrated().await;
                let ok = migrated.is_ok();
                lines.push(match migrated {
                    Ok(()) => (true, "database reachable and migrated".to_owned()),
                    Err(e) => (false, format!("database: {e}")),
                });
                if ok {
                    lines.extend(budget_lines(settings, &store).await);
                }
                store.close().await;
            }
            Err(e) => lines.push((false, format!("database: {e}"))),
        }
    }
    lines.push(match settings.secrets.telegram_token {
        Some(_) => (true, "TELOXIDE_TOKEN is set".to_owned()),
        None => (
            false,
            "TELOXIDE_TOKEN is not set (needed by `daylog run`; `daylog chat` works without it)"
                .to_owned(),
        ),
    });
    if ping {
        lines.extend(ping_providers(settings, &used).await);
    }
    let mut stdout = std::io::stdout().lock();
    for (ok, text) in &lines {
        let _ = writeln!(stdout, "{} {text}", if *ok { "ok  " } else { "FAIL" });
    }
    // Only the essentials fail the health check: a provider without a key is skipped by
    // design, so it is reported, not fatal, while another analysis step can work.
    let essential_failed = lines
        .iter()
        .enumerate()
        .any(|(i, (ok, text))| !ok && (i == 0 || !text.starts_with("provider ")));
    if essential_failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Each key's daily budget as stored (SPEC §5): by key index, never the key.
async fn budget_lines(settings: &Settings, store: &Store) -> Vec<(bool, String)> {
    let spent = match store.spent_budgets().await {
        Ok(spent) => spent,
        Err(e) => return vec![(false, format!("budgets: {e}"))],
    };
    let mut lines = Vec::new();
    let mut names: Vec<&String> = settings.providers.keys().collect();
    names.sort();
    for name in names {
        for index in 0..settings.keys(name).len() {
            let mine: Vec<&crate::llm::SpentBudget> = spent
                .iter()
                .filter(|s| s.provider == *name && s.key_index == Some(index))
                .collect();
            if mine.is_empty() {
                lines.push((true, format!("budget {name} key #{index}: available")));
            }
            for s in mine {
                let left = s
                    .until
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default();
                let scope = if s.scope.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", s.scope)
                };
                // Reported, not a failure: the cascade goes around it until the reset.
                lines.push((
                    true,
                    format!(
                        "budget {name} key #{index}{scope}: daily quota spent, resets in {} min",
                        left.as_secs().div_ceil(60)
                    ),
                ));
            }
        }
    }
    lines
}

/// One tiny request per provider that can be called (`doctor --ping`).
async fn ping_providers(
    settings: &Settings,
    used: &std::collections::BTreeSet<&str>,
) -> Vec<(bool, String)> {
    let llm = match crate::http_client()
        .map_err(|e| e.to_string())
        .and_then(|client| Llm::with_client(settings, client).map_err(|e| e.to_string()))
    {
        Ok(llm) => llm,
        Err(error) => return vec![(false, format!("ping: cannot set up the providers: {error}"))],
    };
    let mut lines = Vec::new();
    for name in used.iter().filter(|name| settings.provider_usable(name)) {
        lines.push(match llm.ping(name).await {
            Ok(()) => (true, format!("ping {name}: answered")),
            Err(error) => (false, format!("ping {name}: {error}")),
        });
    }
    lines
}
