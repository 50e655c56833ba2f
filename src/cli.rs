//! The subcommands (docs/operations.md, The commands). Each returns an exit code: 0 ok, 2 bad usage or bad
//! config (with a message that names the key), 1 any other failure. Errors are printed
//! as one human sentence.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::app::{App, StartError};
use crate::config::{ConfigError, Settings, StepSettings, TelegramMode};
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
        /// table escapes control characters; csv and json are exact, with BLOBs as
        /// lowercase hex and, in json, repeated column names suffixed (x, x_2, …).
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Apply database migrations and exit.
    Migrate,
    /// Write a consistent copy of the database to a new file (safe while the bot runs).
    Backup {
        /// The file to write, e.g. backups/daylog-2026-12-03.db; it must not exist yet.
        path: std::path::PathBuf,
    },
    /// Check configuration, keys (never printed), the database and, with --ping, each provider.
    Doctor {
        /// Send one tiny request to each provider that has a key.
        #[arg(long)]
        ping: bool,
        /// Only ask the running daemon's /readyz (on http.listen) and exit 0 when it is
        /// ready, 1 when not: the Docker healthcheck.
        #[arg(long, conflicts_with = "ping")]
        ready: bool,
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

impl From<StartError> for CliError {
    fn from(error: StartError) -> Self {
        match error {
            StartError::Store(error) => Self::Store(error),
            other => Self::Other(other.into()),
        }
    }
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Usage(_) => 2,
            Self::Store(StoreError::Url(_)) => 2,
            Self::Store(_) | Self::Other(_) => 1,
        }
    }
}

/// Runs a parsed command line to completion (after loading `.env` from the working
/// directory).
pub fn main(cli: Cli) -> ExitCode {
    let DotEnv {
        warnings: dotenv_warnings,
        refused,
    } = load_dotenv(std::path::Path::new(".env"));
    if let Some(refused) = refused {
        for warning in &dotenv_warnings {
            let _ = writeln!(std::io::stderr(), "daylog: {warning}");
        }
        return fail(&CliError::Usage(refused));
    }
    let settings = match Settings::load() {
        Ok(settings) => settings,
        Err(error) => {
            for warning in &dotenv_warnings {
                let _ = writeln!(std::io::stderr(), "daylog: {warning}");
            }
            return fail(&CliError::Config(error));
        }
    };
    let command = cli
        .command
        .unwrap_or(if settings.secrets.telegram_token.is_some() {
            Command::Run
        } else {
            Command::Chat { user: 1 }
        });
    let chat = matches!(command, Command::Chat { .. });
    crate::telemetry::init(
        settings.log.format(),
        crate::telemetry::default_filter(chat),
    );
    for warning in dotenv_warnings.iter().chain(&settings.warnings) {
        // `daylog chat` logs only errors unless asked: what is wrong with its `.env`
        // (the likely reason it has no key) is said on its terminal instead.
        if chat {
            let _ = writeln!(std::io::stderr(), "daylog: {warning}");
        } else {
            tracing::warn!("{warning}");
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&CliError::Other(error.into())),
    };
    let result = runtime.block_on(execute(command, settings));
    // Work still in flight after the grace period (a Bot API call that hangs) is
    // abandoned, not waited for: it must not hold the exit past Docker's stop timeout.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(code) => code,
        Err(error) => fail(&error),
    }
}

/// What loading `.env` had to say: warnings, and a refusal when a line that sets one of
/// daylog's own variables could not be read.
#[derive(Debug, Default)]
pub struct DotEnv {
    pub warnings: Vec<String>,
    /// A malformed line setting a variable daylog reads (`DAYLOG__…`, a key, the token,
    /// the database): daylog does not start without it, since running without it can
    /// be worse than not running (`DAYLOG__TELEGRAM__ALLOWED_USERS=[1, 2]`, unquoted,
    /// would open a private bot to everyone).
    pub refused: Option<String>,
}

/// Loads a `.env` file into the environment, never overriding a variable that is really
/// set (dotenvy's rule). A malformed line is skipped instead of ending the load (dotenvy
/// alone stops there, silently dropping every line after it); what is said about it
/// names its line number and the variable it sets, never its value, which may be a key.
pub fn load_dotenv(path: &std::path::Path) -> DotEnv {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return DotEnv::default(); // no .env: nothing to load
        }
        Err(error) => {
            // It is there and holds daylog's settings (an allow-list, keys): running
            // without them could be worse than not running.
            return DotEnv {
                warnings: Vec::new(),
                refused: Some(format!("cannot read {}: {error}", path.display())),
            };
        }
    };
    let mut loaded = DotEnv::default();
    let text = String::from_utf8_lossy(&bytes);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let mut malformed: Vec<(usize, usize)> = Vec::new();
    let mut next_line = 0;
    for item in dotenvy::from_read_iter(text.as_bytes()) {
        match item {
            Ok((name, value)) => {
                // dotenvy never overrides a variable that is set, even to nothing: an
                // empty `MISTRAL_API_KEY=` in the shell or a compose file silently hides
                // the key written in `.env`.
                let empty_outside = std::env::var_os(&name).is_some_and(|v| v.is_empty());
                if empty_outside && !value.trim().is_empty() {
                    loaded.warnings.push(format!(
                        "{name} is set but empty in the environment, which wins over its value in {}; unset it to use that value",
                        path.display()
                    ));
                }
            }
            Err(dotenvy::Error::LineParse(line, _)) => {
                // dotenvy hands back the logical line (a quoted value may span several);
                // find where it starts to name its number and cut it out.
                let found = (next_line..line_starts.len())
                    .find(|&i| text[line_starts[i]..].starts_with(line.as_str()));
                // Not found as a line of its own: the line-by-line load below finds
                // and names it.
                if let Some(i) = found {
                    // Only its first physical line goes: an unterminated quote makes
                    // dotenvy take the rest of the file as its value, and those lines
                    // must still load. The newline stays, so line numbers keep.
                    let line_end = line_starts.get(i + 1).map_or(text.len(), |next| next - 1);
                    malformed.push((line_starts[i], (line_starts[i] + line.len()).min(line_end)));
                    next_line = i + 1;
                    let physical = &text[line_starts[i]..line_end.max(line_starts[i])];
                    loaded.skipped(path, i + 1, physical);
                }
            }
            Err(error) => {
                loaded
                    .warnings
                    .push(format!("cannot read {}: {error}", path.display()));
                return loaded;
            }
        }
    }
    let mut cleaned = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in malformed {
        cleaned.push_str(&text[at..start]);
        at = end;
    }
    cleaned.push_str(&text[at..]);
    if dotenvy::from_read(cleaned.as_bytes()).is_err() {
        // dotenvy stopped at a line it could not read (an unclosed `${`, …): load the
        // rest line by line, skipping and naming each unreadable one. Not the error's
        // text: it would quote the line.
        for (n, line) in cleaned.split('\n').enumerate() {
            if dotenvy::from_read(line.as_bytes()).is_err() {
                loaded.skipped(path, n + 1, line);
            }
        }
    }
    loaded
}

impl DotEnv {
    /// Line `n` of `path` (`line`) could not be read and was skipped.
    fn skipped(&mut self, path: &std::path::Path, n: usize, line: &str) {
        let Some(name) = variable_name(line) else {
            self.warnings.push(format!(
                "{}: line {n} is not NAME=value and was skipped; the other lines were loaded",
                path.display()
            ));
            return;
        };
        let sentence = format!(
            "{}: line {n} ({name}) could not be read: a value with spaces must be in quotes, as {name}=\"…\", and a quote must be closed",
            path.display()
        );
        if read_by_daylog(name) {
            self.refused.get_or_insert(sentence);
        } else {
            self.warnings.push(format!(
                "{sentence}; it was skipped and the other lines were loaded"
            ));
        }
    }
}

/// The variable a `.env` line sets (`NAME=…`, `export NAME=…`), if it names one; not
/// secret, unlike what follows the `=`.
fn variable_name(line: &str) -> Option<&str> {
    let line = line.trim_start();
    let line = line.strip_prefix("export ").unwrap_or(line);
    let (name, _) = line.split_once('=')?;
    let name = name.trim();
    let mut chars = name.chars();
    let first = chars.next()?;
    ((first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'))
    .then_some(name)
}

/// Whether daylog reads the variable `name` (its settings, keys, token, database, log
/// filter): a line that sets it and cannot be read stops daylog.
fn read_by_daylog(name: &str) -> bool {
    let numbered = name
        .rsplit_once('_')
        .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .map_or(name, |(stem, _)| stem);
    name.starts_with("DAYLOG")
        || numbered.ends_with("_API_KEY")
        || [
            "TELOXIDE_TOKEN",
            "TELOXIDE_API_URL",
            "DATABASE_URL",
            "RUST_LOG",
        ]
        .contains(&name)
}

fn fail(error: &CliError) -> ExitCode {
    let mut text = error.to_string();
    if let CliError::Other(e) = error {
        // anyhow's chain, on one line; a cause that its error already quotes is not
        // said twice.
        text.clear();
        for cause in e.chain().map(ToString::to_string) {
            if !text.contains(&cause) {
                if !text.is_empty() {
                    text.push_str(": ");
                }
                text.push_str(&cause);
            }
        }
    }
    let _ = writeln!(std::io::stderr(), "daylog: {text}");
    ExitCode::from(error.exit_code())
}

async fn execute(command: Command, settings: Settings) -> Result<ExitCode, CliError> {
    match command {
        Command::Migrate => {
            let store = Store::open_and_migrate_with(
                settings.database_url.expose(),
                (&settings.store).into(),
            )
            .await?;
            store.close().await;
            tracing::info!("database is up to date");
            Ok(ExitCode::SUCCESS)
        }
        Command::Sql { query, format } => sql(&settings, &query, format).await,
        Command::Backup { path } => backup(&settings, &path).await,
        Command::Doctor { ready: true, .. } => Ok(ready(&settings).await),
        Command::Doctor { ping, .. } => Ok(doctor(&settings, ping).await),
        Command::Run => {
            if settings.secrets.telegram_token.is_none() {
                return Err(CliError::Config(ConfigError::Invalid {
                    key: "TELOXIDE_TOKEN".to_owned(),
                    message: format!(
                        "is not set; put the token from @BotFather in {} (daylog reads the .env of the folder it runs in), or try `daylog chat`, which needs none",
                        std::path::absolute(".env")
                            .unwrap_or_else(|_| ".env".into())
                            .display()
                    ),
                }));
            }
            // The daemon's future is large (every front end's state); one box, once.
            Box::pin(crate::app::run_daemon(settings)).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Chat { user } => {
            let app = App::build(settings).await?;
            // As large as the daemon's (every front end's state): one box, once.
            Box::pin(app.chat(user)).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn sql(settings: &Settings, query: &str, format: Format) -> Result<ExitCode, CliError> {
    if store::is_postgres_url(settings.database_url.expose()) {
        return sql_postgres(settings, query, format).await;
    }
    // Refuse before touching the file, so a refused query changes nothing at all.
    sqlcmd::check(query).map_err(|r| CliError::Usage(r.to_string()))?;
    let pool =
        store::open_read_only(settings.database_url.expose(), (&settings.store).into()).await?;
    let result = sqlcmd::query(&pool, query, &(&settings.sql).into()).await;
    // A "no such table" on a file without daylog's tables is the wrong file (or one never
    // migrated), not a wrong query.
    let foreign = match &result {
        Err(QueryError::Sql(m)) if m.starts_with("no such table") => sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'day_logs'",
        )
        .fetch_one(&pool)
        .await
        .is_ok_and(|n| n == 0),
        _ => false,
    };
    pool.close().await;
    let result = result.map_err(|e| match e {
        QueryError::Refused(r) => CliError::Usage(r.to_string()),
        QueryError::Sql(m) if foreign => CliError::Usage(format!(
            "the query failed: {m}; this database has none of daylog's tables: check DATABASE_URL (`daylog migrate` creates them)"
        )),
        QueryError::Sql(m) => CliError::Usage(format!("the query failed: {m}")),
        failed @ (QueryError::Failed(_) | QueryError::TimedOut(_) | QueryError::TooManyRows(_)) => {
            CliError::Other(anyhow::anyhow!(failed.to_string()))
        }
    })?;
    print_result(&result, format)
}

fn print_result(result: &sqlcmd::ResultSet, format: Format) -> Result<ExitCode, CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(sqlcmd::render(result, format).as_bytes())
        .map_err(|e| CliError::Other(e.into()))?;
    Ok(ExitCode::SUCCESS)
}

/// `daylog sql` on PostgreSQL: the statement check first, then one connection, through
/// `DAYLOG_SQL_DATABASE_URL` (a SELECT-only role) when set, else `DATABASE_URL`, and
/// the server's fences (`sqlcmd::postgres`: READ ONLY, rolled back, statement_timeout).
async fn sql_postgres(
    settings: &Settings,
    query: &str,
    format: Format,
) -> Result<ExitCode, CliError> {
    sqlcmd::postgres::check(query).map_err(|r| CliError::Usage(r.to_string()))?;
    let url = settings
        .sql_database_url
        .as_ref()
        .unwrap_or(&settings.database_url);
    let pool = store::open_postgres_for_sql(url.expose(), (&settings.store).into()).await?;
    let result = sqlcmd::postgres::query(&pool, query, &(&settings.sql).into()).await;
    pool.close().await;
    let result = result.map_err(|e| match e {
        QueryError::Refused(r) => CliError::Usage(r.to_string()),
        QueryError::Sql(m) => CliError::Usage(format!("the query failed: {m}")),
        failed @ (QueryError::Failed(_) | QueryError::TimedOut(_) | QueryError::TooManyRows(_)) => {
            CliError::Other(anyhow::anyhow!(failed.to_string()))
        }
    })?;
    print_result(&result, format)
}

async fn backup(settings: &Settings, path: &std::path::Path) -> Result<ExitCode, CliError> {
    let shown = path.display();
    let Some(name) = path.to_str() else {
        return Err(CliError::Usage(format!(
            "{shown}: the backup's file name must be valid UTF-8"
        )));
    };
    if path.exists() {
        return Err(CliError::Usage(format!(
            "{shown} already exists; daylog backup writes a new file and never overwrites one"
        )));
    }
    // SQLite would read `file:…` as a URI, not as a file of that name.
    if name.starts_with("file:") {
        return Err(CliError::Usage(format!(
            "{shown}: a name that begins with file: is read as a SQLite URI; write ./{shown}"
        )));
    }
    let folder = path.parent().filter(|dir| !dir.as_os_str().is_empty());
    if let Some(folder) = folder.filter(|dir| !dir.is_dir()) {
        return Err(CliError::Usage(format!(
            "the folder {} does not exist; create it first",
            folder.display()
        )));
    }
    let written = store::backup(
        settings.database_url.expose(),
        (&settings.store).into(),
        path,
    )
    .await?;
    let _ = writeln!(
        std::io::stdout(),
        "backed up {} {} to {shown} ({} KiB)",
        written.entries,
        if written.entries == 1 {
            "entry"
        } else {
            "entries"
        },
        written.bytes.div_ceil(1024)
    );
    Ok(ExitCode::SUCCESS)
}

/// How one line of `daylog doctor` reads: `ok`, `warn` (worth knowing, nothing stops
/// working: a provider without a key is skipped by design, a key whose budget is spent
/// for now) or `FAIL` (something the bot needs; the check exits 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    fn of(ok: bool) -> Self {
        if ok { Self::Ok } else { Self::Fail }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok  ",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// How long `doctor --ready` waits for `/readyz` (Docker's healthcheck gives 30 s).
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `doctor --ready`: the local `/readyz` (on `http.listen`, an unspecified address asked
/// on loopback); one line, exit 0 when it answers 200, else 1.
async fn ready(settings: &Settings) -> ExitCode {
    let (level, text) = match settings.http.listen() {
        None => (
            Level::Fail,
            "http.listen is not set, so nothing serves /readyz".to_owned(),
        ),
        Some(addr) => ask_ready(loopback_if_unspecified(addr)).await,
    };
    let _ = writeln!(std::io::stdout(), "{} {text}", level.label());
    match level {
        Level::Fail => ExitCode::from(1),
        Level::Ok | Level::Warn => ExitCode::SUCCESS,
    }
}

/// Where a local client reaches a listener bound to `addr`.
fn loopback_if_unspecified(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

async fn ask_ready(addr: std::net::SocketAddr) -> (Level, String) {
    let client = match crate::http_client() {
        Ok(client) => client,
        Err(error) => {
            return (
                Level::Fail,
                format!("cannot build the HTTP client: {error}"),
            );
        }
    };
    let answer = client
        .get(format!("http://{addr}/readyz"))
        .timeout(READY_TIMEOUT)
        .send()
        .await;
    match answer {
        Ok(response) => {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            let reason = body.lines().next().unwrap_or("").trim().to_owned();
            if status.is_success() {
                (Level::Ok, format!("ready ({addr})"))
            } else {
                (
                    Level::Fail,
                    format!("not ready ({addr}, {status}): {reason}"),
                )
            }
        }
        Err(error) => (
            Level::Fail,
            format!("/readyz on {addr} did not answer: {}", error.without_url()),
        ),
    }
}

/// Prints one line per check; exit 1 when any check fails.
async fn doctor(settings: &Settings, ping: bool) -> ExitCode {
    let mut lines: Vec<(Level, String)> = vec![(Level::Ok, "settings are valid".to_owned())];
    let used: BTreeSet<&str> = settings
        .analysis
        .steps()
        .iter()
        .chain(settings.metrics.steps())
        .map(StepSettings::provider)
        .collect();
    lines.extend(provider_lines(settings, &used));
    lines.extend(database_lines(settings).await);
    lines.push(match settings.secrets.telegram_token {
        Some(_) => (Level::Ok, "TELOXIDE_TOKEN is set".to_owned()),
        None => (
            Level::Fail,
            "TELOXIDE_TOKEN is not set (needed by `daylog run`; `daylog chat` works without it)"
                .to_owned(),
        ),
    });
    lines.extend(webhook_lines(settings));
    if ping {
        lines.extend(ping_providers(settings, &used).await);
        if settings.secrets.telegram_token.is_some() {
            lines.push(match crate::bot::ping_telegram(settings).await {
                Ok(answer) => (Level::Ok, format!("ping telegram: {answer}")),
                Err(why) => (Level::Fail, format!("ping telegram: {why}")),
            });
            if settings.telegram.mode() == TelegramMode::Webhook {
                // Worth knowing, not a failure: a run registers the URL itself, and
                // Telegram's last error may be an old one.
                lines.push(match crate::bot::webhook::doctor_line(settings).await {
                    Ok(line) => (Level::Ok, line),
                    Err(line) => (Level::Warn, line),
                });
            }
        }
    }
    let mut stdout = std::io::stdout().lock();
    for (level, text) in &lines {
        let _ = writeln!(stdout, "{} {text}", level.label());
    }
    if lines.iter().any(|(level, _)| *level == Level::Fail) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Webhook mode: where Telegram will post (the URL's host and path; the secret is only
/// said to be set), and a warning for a port Telegram does not post to.
fn webhook_lines(settings: &Settings) -> Vec<(Level, String)> {
    if settings.telegram.mode() != TelegramMode::Webhook {
        return Vec::new();
    }
    let mut lines = Vec::new();
    if let Some(url) = settings.telegram.webhook_url() {
        lines.push((
            Level::Ok,
            format!(
                "telegram.mode is webhook: {} served on http.listen, TELEGRAM_WEBHOOK_SECRET is set",
                url.path()
            ),
        ));
    }
    if let Some(warning) = settings.telegram.webhook_port_warning() {
        lines.push((Level::Warn, warning));
    }
    lines
}

/// One line per provider the cascades use (its keys, never shown), and whether the
/// analysis cascade has a usable step.
fn provider_lines(settings: &Settings, used: &BTreeSet<&str>) -> Vec<(Level, String)> {
    let mut lines = Vec::new();
    let mut any_analysis = false;
    for name in used {
        let keys = settings.keys(name).len();
        let usable = settings.provider_usable(name);
        if usable
            && settings
                .analysis
                .steps()
                .iter()
                .any(|s| s.provider() == *name)
        {
            any_analysis = true;
        }
        lines.push(match (keys, usable) {
            (0, true) => (Level::Ok, format!("provider {name}: no key needed")),
            (0, false) => (
                Level::Warn,
                format!(
                    "provider {name}: no key ({} not set), its steps are skipped",
                    settings.providers[*name].key_env(name)
                ),
            ),
            (n, _) => (
                Level::Ok,
                format!("provider {name}: {n} key{}", if n == 1 { "" } else { "s" }),
            ),
        });
    }
    lines.push((
        Level::of(any_analysis),
        if any_analysis {
            "the analysis cascade has at least one usable step".to_owned()
        } else {
            "no analysis step has a key: entries are saved, and analysed once a key is set and daylog is started again".to_owned()
        },
    ));
    lines
}

/// Whether the database is there, reachable, migrated and sound, and each key's
/// stored daily budget. Checking never creates the file.
async fn database_lines(settings: &Settings) -> Vec<(Level, String)> {
    let mut lines = Vec::new();
    let missing = crate::config::database_path(settings.database_url.expose())
        .ok()
        .filter(|path| !path.exists());
    if let Some(path) = missing {
        // Checking must not create the file as a side effect.
        lines.push((
            Level::Fail,
            format!(
                "database {} does not exist yet (`daylog migrate` or `daylog run` creates it)",
                path.display()
            ),
        ));
    } else {
        match Store::open_with(settings.database_url.expose(), (&settings.store).into()).await {
            Ok(store) => {
                let migrated = store.ensure_migrated().await;
                let ok = migrated.is_ok();
                lines.push(match migrated {
                    Ok(()) => match store.damage().await {
                        None => (Level::Ok, "database reachable and migrated".to_owned()),
                        Some(found) => (
                            Level::Fail,
                            format!("database file is damaged ({found}); restore it from a backup"),
                        ),
                    },
                    Err(e) => (Level::Fail, format!("database: {e}")),
                });
                if ok {
                    lines.extend(budget_lines(settings, &store).await);
                }
                store.close().await;
            }
            Err(e) => lines.push((Level::Fail, format!("database: {e}"))),
        }
    }
    lines
}

/// A key as `doctor` names it: its index (as `llm_calls.key_index` and
/// `llm_budgets.key_index` have it) and where it was read from, never the key.
fn key_label(index: usize, origin: &str) -> String {
    if origin.is_empty() {
        format!("key #{index}")
    } else {
        format!("key #{index} ({origin})")
    }
}

/// Each key's daily budget as stored (docs/behaviour.md, The cascade): by key index, never the key.
async fn budget_lines(settings: &Settings, store: &Store) -> Vec<(Level, String)> {
    let spent = match store.spent_budgets().await {
        Ok(spent) => spent,
        Err(e) => return vec![(Level::Fail, format!("budgets: {e}"))],
    };
    let mut lines = Vec::new();
    let mut names: Vec<&String> = settings.providers.keys().collect();
    names.sort();
    for name in names {
        for (index, key) in settings.keys(name).iter().enumerate() {
            let label = key_label(index, key.origin());
            let mine: Vec<&crate::llm::SpentBudget> = spent
                .iter()
                .filter(|s| s.provider == *name && s.key_index == Some(index))
                .collect();
            if mine.is_empty() {
                lines.push((Level::Ok, format!("budget {name} {label}: available")));
            }
            for s in mine {
                let left = s
                    .until
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default();
                let scope = if s.scope.is_empty() {
                    String::new()
                } else {
                    format!(" for {}", s.scope)
                };
                // Reported, not a failure: the cascade goes around it until the reset.
                lines.push((
                    Level::Warn,
                    format!(
                        "budget {name} {label}{scope}: daily quota spent, resets in {} min",
                        left.as_secs().div_ceil(60)
                    ),
                ));
            }
        }
    }
    lines
}

/// One tiny request per key of each provider that can be called (`doctor --ping`).
async fn ping_providers(
    settings: &Settings,
    used: &std::collections::BTreeSet<&str>,
) -> Vec<(Level, String)> {
    let llm = match crate::http_client()
        .map_err(|e| e.to_string())
        .and_then(|client| Llm::with_client(settings, client).map_err(|e| e.to_string()))
    {
        Ok(llm) => llm,
        Err(error) => {
            return vec![(
                Level::Fail,
                format!("ping: cannot set up the providers: {error}"),
            )];
        }
    };
    let mut lines = Vec::new();
    for name in used.iter().filter(|name| settings.provider_usable(name)) {
        for ping in llm.ping(name).await {
            let who = match &ping.key {
                Some((index, origin)) => format!("ping {name} {}", key_label(*index, origin)),
                None => format!("ping {name}"),
            };
            lines.push(match ping.answer {
                Ok(()) => (Level::Ok, format!("{who}: answered")),
                // The key was taken; only its budget is spent for now.
                Err(error @ crate::llm::LlmError::RateLimited { .. }) => (
                    Level::Warn,
                    format!("{who}: {error}; the key was accepted, its budget is spent for now"),
                ),
                Err(error) if error.is_not_the_api() => (
                    Level::Fail,
                    format!(
                        "{who}: {error}; this is not the provider's API: check providers.{name}.base_url"
                    ),
                ),
                Err(error) => (Level::Fail, format!("{who}: {error}")),
            });
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::loopback_if_unspecified;

    #[test]
    fn doctor_ready_asks_an_unspecified_address_on_loopback() {
        let asked = |bound: &str| {
            loopback_if_unspecified(bound.parse().unwrap_or_else(|_| panic!("{bound}"))).to_string()
        };
        assert_eq!(asked("0.0.0.0:8080"), "127.0.0.1:8080");
        assert_eq!(asked("[::]:8080"), "[::1]:8080");
        assert_eq!(asked("10.1.2.3:8080"), "10.1.2.3:8080");
    }
}
