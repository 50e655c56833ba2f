//! Settings: the layered configuration (docs/configuration.md) and the secrets that come only from the
//! environment.
//!
//! Layers, later wins: the compiled-in `config/default.toml`, the TOML file named by
//! `DAYLOG_CONFIG`, then `DAYLOG__SECTION__KEY` variables. The merged tree is parsed once
//! into typed settings, with `deny_unknown_fields` everywhere, so a typo is an error that
//! names the key. Each bound is checked where its type is built: a number by its
//! `Bounded` range or a URL by `BaseUrl` as the deserialiser reads it (the error then
//! carries the key's path), what the fields of a section say together by the section's
//! constructor (`RetrySettings::new`), and a step's provider when its cascade is built
//! (`TaskSettings::new`). Fields are private: a typed method is the only way to a
//! setting (`settings.retry.deadline()`). API keys are read from `NAME_API_KEY` (comma
//! list) plus `NAME_API_KEY_2`, `_3`, … and are held as [`ApiKey`], whose `Debug` never
//! shows them.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use url::Url;

/// The defaults, compiled in so the binary runs from any directory.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Environment variable naming an extra TOML file merged over the defaults.
pub const CONFIG_FILE_VAR: &str = "DAYLOG_CONFIG";
/// Prefix of the per-key environment overrides: `DAYLOG__RETRY__MIN_DELAY_MS=50`.
pub const ENV_PREFIX: &str = "DAYLOG__";
/// Default store location when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://data/daylog.db";

/// A configuration problem, always naming the key or the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the config file {origin} is not valid TOML: {message}")]
    Syntax { origin: String, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

impl ConfigError {
    fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// One API key. It is only ever shown through [`ApiKey::expose`], at the moment a request
/// header is built; `Debug` prints a placeholder. It knows where it was read from
/// ([`ApiKey::origin`]), so that an operator told "this key was refused" knows which
/// line of `.env` to fix.
#[derive(Clone)]
pub struct ApiKey {
    secret: SecretString,
    origin: String,
}

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self::read_from(key, String::new())
    }

    /// A key read from `origin`: the variable's name, and its place when the variable
    /// holds a list (`GEMINI_API_KEY, 2nd of 3`) — never its value.
    pub fn read_from(key: impl Into<String>, origin: String) -> Self {
        Self {
            secret: SecretString::from(key.into()),
            origin,
        }
    }

    /// The key itself, for a request header and nothing else.
    pub fn expose(&self) -> &str {
        self.secret.expose_secret()
    }

    /// Where the key was read from (empty when not from the environment).
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

/// `1st`, `2nd`, `3rd`, `4th`, …, `11th`, `12th`, `13th`, `21st`, …
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// The longest wait or timeout any `*_ms` setting may ask for: a year. Far beyond any
/// sensible value, and well inside what tokio's timers, `Duration` arithmetic and
/// SQLite's date functions accept.
const MAX_DURATION_MS: u64 = 365 * 24 * 3600 * 1000;
/// SQLite takes `busy_timeout` as a C `int` of milliseconds.
const MAX_BUSY_TIMEOUT_MS: u64 = i32::MAX as u64;
/// 16 TiB: beyond it the byte count, and SQLite's page count, stop being meaningful.
const MAX_STORE_SIZE_MB: u64 = 16 * 1024 * 1024;
/// A tokio semaphore holds at most `usize::MAX >> 3` permits; far fewer make sense.
const MAX_CONCURRENCY: u64 = 100_000;
const MAX_AGE_HOURS: u64 = MAX_DURATION_MS / 3_600_000;
const U32_MAX: u64 = u32::MAX as u64;

/// A whole number in `MIN..=MAX`, checked as it is read: a value outside would panic a
/// timer or the SQLite driver, or mean nothing. The message names no key: the
/// deserialiser's path does (`retry.max_attempts`), as for any other wrong value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bounded<const MIN: u64, const MAX: u64>(u64);

/// Milliseconds of a wait or a timeout: at least `MIN`, at most a year.
type Ms<const MIN: u64> = Bounded<MIN, MAX_DURATION_MS>;

impl<const MIN: u64, const MAX: u64> Bounded<MIN, MAX> {
    fn get(self) -> u64 {
        self.0
    }

    fn millis(self) -> Duration {
        Duration::from_millis(self.0)
    }

    /// The value of a setting whose `MAX` fits a `u32`.
    fn get_u32(self) -> u32 {
        u32::try_from(self.0).unwrap_or(u32::MAX)
    }

    fn get_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for Bounded<MIN, MAX> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = u64::deserialize(deserializer)?;
        if (MIN..=MAX).contains(&value) {
            Ok(Self(value))
        } else {
            Err(serde::de::Error::custom(out_of_range(value, MIN, MAX)))
        }
    }
}

/// `5000000000 is out of range: must be from 1 to 1000`.
/// A lower bound that must not exceed its upper bound (`retry.min_delay_ms` and
/// `retry.max_delay_ms`, …): the error names the lower key, with both values.
fn not_above(
    (low_key, low): (&'static str, u64),
    (high_key, high): (&'static str, u64),
) -> Result<(), ConfigError> {
    if low > high {
        return Err(ConfigError::invalid(
            low_key,
            format!("{low} is greater than {high_key} ({high})"),
        ));
    }
    Ok(())
}

fn out_of_range(value: impl fmt::Display, min: u64, max: u64) -> String {
    if max == u64::MAX || max == U32_MAX {
        format!("{value} is out of range: must be at least {min}")
    } else {
        format!("{value} is out of range: must be from {min} to {max}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    format: LogFormat,
}

impl LogSettings {
    pub fn format(&self) -> LogFormat {
        self.format
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    busy_timeout_ms: Bounded<0, MAX_BUSY_TIMEOUT_MS>,
    /// A quota on the database file; 0 = none.
    max_size_mb: Bounded<0, MAX_STORE_SIZE_MB>,
}

impl StoreSettings {
    pub fn busy_timeout(&self) -> Duration {
        self.busy_timeout_ms.millis()
    }

    /// The quota in bytes, `None` when there is none.
    pub fn max_size_bytes(&self) -> Option<u64> {
        let mb = self.max_size_mb.get();
        (mb > 0).then(|| mb.saturating_mul(1024 * 1024))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlSettings {
    timeout_ms: Ms<1>,
    max_rows: Bounded<1, { u64::MAX }>,
}

impl SqlSettings {
    /// How long one `daylog sql` query may run before it is interrupted.
    pub fn timeout(&self) -> Duration {
        self.timeout_ms.millis()
    }

    /// A query returning more rows is refused (they are held in memory).
    pub fn max_rows(&self) -> u64 {
        self.max_rows.get()
    }
}

/// `[retry]` as written; [`RetrySettings::new`] checks what its fields say together.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryFields {
    max_attempts: Bounded<1, 1000>,
    min_delay_ms: Ms<0>,
    max_delay_ms: Ms<0>,
    request_timeout_ms: Ms<1>,
    hedge_after_ms: HedgeAfter,
    deadline_ms: Ms<1>,
}

#[derive(Debug, Clone)]
pub struct RetrySettings(RetryFields);

impl RetrySettings {
    fn new(fields: RetryFields) -> Result<Self, ConfigError> {
        not_above(
            ("retry.min_delay_ms", fields.min_delay_ms.get()),
            ("retry.max_delay_ms", fields.max_delay_ms.get()),
        )?;
        Ok(Self(fields))
    }

    /// Rounds on one step (each key once per round), the first included: at least 1.
    pub fn max_attempts(&self) -> u32 {
        self.0.max_attempts.get_u32()
    }
    pub fn min_delay(&self) -> Duration {
        self.0.min_delay_ms.millis()
    }
    pub fn max_delay(&self) -> Duration {
        self.0.max_delay_ms.millis()
    }
    pub fn request_timeout(&self) -> Duration {
        self.0.request_timeout_ms.millis()
    }
    pub fn hedge_after(&self) -> HedgeAfter {
        self.0.hedge_after_ms
    }
    pub fn deadline(&self) -> Duration {
        self.0.deadline_ms.millis()
    }
}

/// `retry.hedge_after_ms`: when a slow attempt starts the next step in parallel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "HedgeSetting")]
pub enum HedgeAfter {
    /// `"auto"`: from the step's own recent latency (docs/behaviour.md, Hedging).
    Auto,
    /// `0`: never.
    Off,
    /// A number of milliseconds.
    After(Duration),
}

/// `hedge_after_ms` as written: a number or a word.
#[derive(Deserialize)]
#[serde(untagged)]
enum HedgeSetting {
    Ms(i64),
    Word(String),
}

impl TryFrom<HedgeSetting> for HedgeAfter {
    type Error = String;

    fn try_from(raw: HedgeSetting) -> Result<Self, String> {
        match raw {
            HedgeSetting::Ms(0) => Ok(Self::Off),
            HedgeSetting::Ms(ms @ 1..) => match ms.unsigned_abs() {
                ms @ ..=MAX_DURATION_MS => Ok(Self::After(Duration::from_millis(ms))),
                ms => Err(out_of_range(ms, 0, MAX_DURATION_MS)),
            },
            HedgeSetting::Word(w) if w.trim() == "auto" => Ok(Self::Auto),
            HedgeSetting::Ms(ms) => Err(format!(
                "expected \"auto\", a number of milliseconds or 0 (off), not {ms}"
            )),
            HedgeSetting::Word(w) => Err(format!(
                "expected \"auto\", a number of milliseconds or 0 (off), not {w:?}"
            )),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CooldownSettings {
    duration_ms: Ms<0>,
    failures_to_trip: Bounded<1, U32_MAX>,
}

impl CooldownSettings {
    pub fn duration(&self) -> Duration {
        self.duration_ms.millis()
    }

    /// Failed attempts in a row, from any requests, that trip a step: at least 1.
    pub fn failures_to_trip(&self) -> u32 {
        self.failures_to_trip.get_u32()
    }
}

/// `[worker]` as written; [`WorkerSettings::new`] checks what its fields say together.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerFields {
    poll_interval_ms: Ms<1>,
    retry_min_ms: Ms<1>,
    retry_max_ms: Ms<1>,
    max_age_hours: Bounded<0, MAX_AGE_HOURS>,
}

#[derive(Debug, Clone)]
pub struct WorkerSettings(WorkerFields);

impl WorkerSettings {
    fn new(fields: WorkerFields) -> Result<Self, ConfigError> {
        not_above(
            ("worker.retry_min_ms", fields.retry_min_ms.get()),
            ("worker.retry_max_ms", fields.retry_max_ms.get()),
        )?;
        Ok(Self(fields))
    }

    pub fn poll_interval(&self) -> Duration {
        self.0.poll_interval_ms.millis()
    }
    pub fn retry_min(&self) -> Duration {
        self.0.retry_min_ms.millis()
    }
    pub fn retry_max(&self) -> Duration {
        self.0.retry_max_ms.millis()
    }
    pub fn max_age(&self) -> Duration {
        Duration::from_secs(self.0.max_age_hours.get().saturating_mul(3600))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelegramSettings {
    throttle: bool,
    allowed_users: Vec<i64>,
    analyses_per_hour: Bounded<0, U32_MAX>,
    max_text_chars: Bounded<1, { u64::MAX }>,
    shutdown_grace_ms: Ms<0>,
    mode: TelegramMode,
    webhook_url: WebhookUrl,
    set_webhook: bool,
    max_connections: Bounded<1, 100>,
}

/// How updates arrive (docs/operations.md, Webhook mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TelegramMode {
    /// daylog asks Telegram (`getUpdates`): no public address needed.
    Polling,
    /// Telegram posts each update to `telegram.webhook_url`, served on `http.listen`.
    Webhook,
}

/// The ports Telegram posts webhooks to; any other is refused by `setWebhook`.
pub const WEBHOOK_PORTS: [u16; 4] = [443, 80, 88, 8443];

/// `telegram.webhook_url`: `""` = none; else an https URL, or http on a loopback host.
#[derive(Debug, Clone)]
struct WebhookUrl(Option<Url>);

impl<'de> Deserialize<'de> for WebhookUrl {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        let raw = raw.trim();
        if raw.is_empty() {
            return Ok(Self(None));
        }
        https_or_loopback(raw)
            .map(|url| Self(Some(url)))
            .map_err(serde::de::Error::custom)
    }
}

/// A public URL daylog is reached at (`telegram.webhook_url`, the Mini App's): https,
/// or plain http only when its host is a loopback address (a test, a proxy on the same
/// machine), since anything else would carry updates or sign-ins in the clear. No
/// `#fragment` (it never reaches a server) and no user or password.
pub fn https_or_loopback(raw: &str) -> Result<Url, String> {
    let url = Url::parse(raw).map_err(|e| {
        format!("{raw:?} is not a URL ({e}); write the whole URL, starting with https://")
    })?;
    let Some(host) = url.host() else {
        return Err(format!(
            "{raw:?} has no host; write it as https://example.org/path"
        ));
    };
    let loopback = match host {
        url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(format!(
                "{raw:?} is plain http on a host that is not loopback; use https:// (a reverse proxy such as Caddy gets the certificate)"
            ));
        }
        other => return Err(format!("{raw:?} has the scheme {other}; use https://")),
    }
    if url.fragment().is_some() {
        return Err(format!(
            "{raw:?} has a #fragment, which never reaches a server; leave it out"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the URL carries a user name or password; leave them out".to_owned());
    }
    Ok(url)
}

/// `TELEGRAM_WEBHOOK_SECRET`: 1 to 256 characters of `A-Z a-z 0-9 _ -` (what Telegram
/// accepts as `secret_token`). The error names the rule and the length, never a character.
fn webhook_secret(raw: &str) -> Result<ApiKey, ConfigError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let length = raw.chars().count();
    if (1..=256).contains(&length) && raw.chars().all(allowed) {
        return Ok(ApiKey::read_from(raw, "TELEGRAM_WEBHOOK_SECRET".to_owned()));
    }
    let why = if length > 256 {
        format!("it has {length} characters")
    } else {
        "it has a character outside that set (a space, a quote, a non-ASCII letter?)".to_owned()
    };
    Err(ConfigError::invalid(
        "TELEGRAM_WEBHOOK_SECRET",
        format!(
            "must be 1 to 256 characters of A-Z, a-z, 0-9, _ and -, as Telegram accepts it; {why}. Generate one with `openssl rand -hex 32`"
        ),
    ))
}

/// What webhook mode needs of the other settings: an address to serve, a URL to give
/// Telegram, a secret to check. Each missing piece is its own sentence.
fn check_webhook_mode(
    telegram: &TelegramSettings,
    http: &HttpSettings,
    secret: Option<&ApiKey>,
) -> Result<(), ConfigError> {
    if telegram.mode != TelegramMode::Webhook {
        return Ok(());
    }
    if http.listen().is_none() {
        return Err(ConfigError::invalid(
            "telegram.mode",
            "is \"webhook\", which needs `http.listen` (the address the reverse proxy forwards Telegram's posts to, such as \"0.0.0.0:8080\"); set it, or use mode = \"polling\"",
        ));
    }
    if telegram.webhook_url.0.is_none() {
        return Err(ConfigError::invalid(
            "telegram.mode",
            "is \"webhook\", which needs `telegram.webhook_url` (the public https URL Telegram posts to, such as \"https://bot.example.org/telegram\"); set it, or use mode = \"polling\"",
        ));
    }
    if let Some(url) = telegram.webhook_url.0.as_ref() {
        check_webhook_path(url.path())?;
    }
    if secret.is_none() {
        return Err(ConfigError::invalid(
            "telegram.mode",
            "is \"webhook\", which needs TELEGRAM_WEBHOOK_SECRET in the environment (1 to 256 characters of A-Z, a-z, 0-9, _ and -; `openssl rand -hex 32` makes one): without it anyone could post updates",
        ));
    }
    Ok(())
}

/// The webhook's path shares `http.listen` with daylog's own routes, so it may not be one
/// of them (`/healthz`, `/readyz`, the Mini App under `/app`), and no segment may start
/// with `:` or `*`, which the router would read as a parameter instead of a path.
fn check_webhook_path(path: &str) -> Result<(), ConfigError> {
    let taken = matches!(path, "/healthz" | "/readyz" | "/app") || path.starts_with("/app/");
    if taken {
        return Err(ConfigError::invalid(
            "telegram.webhook_url",
            format!(
                "has the path {path}, which daylog already serves on http.listen (/healthz, /readyz, the Mini App under /app); give the webhook a path of its own, such as /telegram"
            ),
        ));
    }
    if path
        .split('/')
        .any(|segment| segment.starts_with(':') || segment.starts_with('*'))
    {
        return Err(ConfigError::invalid(
            "telegram.webhook_url",
            format!(
                "has the path {path}, with a part starting with ':' or '*', which the web server cannot serve as it is; use letters, digits, '-' and '_', such as /telegram"
            ),
        ));
    }
    Ok(())
}

impl TelegramSettings {
    /// Polling or webhook.
    pub fn mode(&self) -> TelegramMode {
        self.mode
    }

    /// The public URL Telegram posts to (webhook mode); its path is served on `http.listen`.
    pub fn webhook_url(&self) -> Option<&Url> {
        self.webhook_url.0.as_ref()
    }

    /// Whether start-up calls `setWebhook` (webhook mode).
    pub fn set_webhook(&self) -> bool {
        self.set_webhook
    }

    /// `setWebhook`'s `max_connections`: 1 to 100.
    pub fn max_connections(&self) -> u8 {
        u8::try_from(self.max_connections.get()).unwrap_or(100)
    }

    /// A warning when the webhook URL's port is one Telegram does not post to.
    pub fn webhook_port_warning(&self) -> Option<String> {
        let url = self.webhook_url()?;
        let port = url.port_or_known_default()?;
        (!WEBHOOK_PORTS.contains(&port)).then(|| {
            format!(
                "telegram.webhook_url uses port {port}; Telegram posts webhooks only to ports 443, 80, 88 and 8443, so setWebhook will be refused"
            )
        })
    }

    /// teloxide's `Throttle` (Telegram's own limits); off only for capacity benchmarks.
    pub fn throttle(&self) -> bool {
        self.throttle
    }

    /// Immediate analyses per user and hour; 0 = no limit.
    pub fn analyses_per_hour(&self) -> u32 {
        self.analyses_per_hour.get_u32()
    }

    /// Longer entries are saved whole and analysed truncated.
    pub fn max_text_chars(&self) -> usize {
        self.max_text_chars.get_usize()
    }

    pub fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace_ms.millis()
    }

    /// Whether this Telegram user may use the bot (an empty list allows everyone).
    pub fn is_allowed(&self, user_id: i64) -> bool {
        self.allowed_users.is_empty() || self.allowed_users.contains(&user_id)
    }
}

/// docs/behaviour.md, Time zones and rhythm: the user's day.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalSettings {
    /// The zone of a user who has not set one (`/tz`).
    default_timezone: DefaultZone,
    /// Entries before this local hour belong to the day before.
    day_starts_hour: Bounded<0, 23>,
}

impl JournalSettings {
    /// The zone of a user who has not set one (`/tz`).
    pub fn default_zone(&self) -> crate::time::UserZone {
        self.default_timezone.0.clone()
    }

    /// Entries before this local hour belong to the day before: 0 to 23.
    pub fn day_starts_hour(&self) -> u8 {
        u8::try_from(self.day_starts_hour.get()).unwrap_or(0)
    }
}

/// `journal.default_timezone`, parsed as it is read.
#[derive(Debug, Clone)]
struct DefaultZone(crate::time::UserZone);

impl<'de> Deserialize<'de> for DefaultZone {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        crate::time::UserZone::parse(&name)
            .map(Self)
            .map_err(|error| {
                serde::de::Error::custom(format!(
                    "{error}; use an IANA name such as Europe/Berlin, or UTC+03:00"
                ))
            })
    }
}

/// The HTTP face (docs/operations.md, Health and metrics): where `/healthz` and `/readyz`
/// are served, and where `/metrics` is; each off when unset.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFields {
    listen: ListenAddr,
    metrics_listen: ListenAddr,
}

/// An address to listen on, `HOST:PORT` with an IP host; `""` = off.
#[derive(Debug, Clone, Copy)]
struct ListenAddr(Option<std::net::SocketAddr>);

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        let raw = raw.trim();
        if raw.is_empty() {
            return Ok(Self(None));
        }
        raw.parse().map(|addr| Self(Some(addr))).map_err(|_| {
            serde::de::Error::custom(format!(
                "{raw:?} is not an address to listen on; write an IP and a port, such as \"0.0.0.0:8080\" or \"127.0.0.1:9464\", or \"\" for off"
            ))
        })
    }
}

/// The HTTP face's addresses, checked together: `/metrics` never shares the public
/// listener.
#[derive(Debug, Clone)]
pub struct HttpSettings(HttpFields);

impl HttpSettings {
    fn new(fields: HttpFields) -> Result<Self, ConfigError> {
        // Port 0 is any free port (tests); an unspecified host takes the port on every
        // address, so it overlaps any other host on the same port.
        if let (Some(listen), Some(metrics)) = (fields.listen.0, fields.metrics_listen.0)
            && listen.port() == metrics.port()
            && listen.port() != 0
            && (listen.ip() == metrics.ip()
                || listen.ip().is_unspecified()
                || metrics.ip().is_unspecified())
        {
            return Err(ConfigError::invalid(
                "http.metrics_listen",
                format!(
                    "is the same address as `http.listen` ({listen}); /metrics is served on its own listener, never the public one: choose another port, or \"\" to turn it off"
                ),
            ));
        }
        Ok(Self(fields))
    }
    /// Where `/healthz` and `/readyz` are served.
    pub fn listen(&self) -> Option<std::net::SocketAddr> {
        self.0.listen.0
    }
    /// Where `/metrics` is served.
    pub fn metrics_listen(&self) -> Option<std::net::SocketAddr> {
        self.0.metrics_listen.0
    }
}

/// The journal as a Telegram Mini App (docs/operations.md, The Mini App): where its page
/// is published and how old Telegram's initData may be.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebappSettings {
    /// The public URL of the page; `None` = the Mini App is off (the menu button is
    /// the default one).
    url: WebappUrl,
    /// How old a Mini App's initData may be, in hours.
    max_age_hours: Bounded<1, 8760>,
}

impl WebappSettings {
    /// The page's public URL, when the Mini App is on.
    pub fn url(&self) -> Option<&Url> {
        self.url.0.as_ref()
    }
    /// How old a Mini App's initData may be.
    pub fn max_age(&self) -> Duration {
        Duration::from_secs(self.max_age_hours.get().saturating_mul(3600))
    }
}

/// `webapp.url`: https, or http on a loopback host (a test, a local proxy); `""` = off.
#[derive(Debug, Clone)]
struct WebappUrl(Option<Url>);

impl<'de> Deserialize<'de> for WebappUrl {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        let raw = raw.trim();
        if raw.is_empty() {
            return Ok(Self(None));
        }
        let url = Url::parse(raw).map_err(|_| {
            serde::de::Error::custom(format!(
                "{raw:?} is not a URL; write the page's public address, such as https://bot.example.com/app, or \"\" for off"
            ))
        })?;
        let loopback = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(name)) => name == "localhost",
            None => false,
        };
        match url.scheme() {
            "https" if url.host().is_some() => Ok(Self(Some(url))),
            "http" if loopback => Ok(Self(Some(url))),
            _ => Err(serde::de::Error::custom(
                "must be an https:// URL (Telegram opens Mini Apps over https only; http:// is accepted on a loopback host for local tests)",
            )),
        }
    }
}

/// docs/behaviour.md, Time zones and rhythm: daily reminders.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReminderSettings {
    /// How often the scheduler looks for due reminders.
    poll_interval_ms: Ms<1>,
    /// A reminder this much past its time (the bot was down) is skipped, not sent late.
    max_late_minutes: u64,
}

impl ReminderSettings {
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval_ms.millis()
    }
    pub fn max_late(&self) -> Duration {
        Duration::from_secs(self.max_late_minutes.saturating_mul(60))
    }
}

/// `[cluster]`: instances sharing one database (docs/operations.md, Several instances).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// How long a chat's lease (and an instance's heartbeat) holds without renewal.
    lease_ms: Bounded<1000, 600_000>,
}

impl ClusterSettings {
    /// How long a lease lasts unrenewed: an instance that died gives its chats up to
    /// others this long after its last renewal.
    pub fn lease(&self) -> Duration {
        self.lease_ms.millis()
    }
}

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI-compatible chat completions: Mistral, Groq, Ollama, …
    Openai,
    Gemini,
    Anthropic,
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    kind: ProviderKind,
    base_url: BaseUrl,
    /// When false the provider is used without a key (a local Ollama).
    #[serde(default = "default_true")]
    require_key: bool,
    /// The environment variable holding the keys; default `<NAME>_API_KEY`.
    #[serde(default)]
    key_env: Option<String>,
    /// An optional safety limit on requests in flight to this provider, across all
    /// tasks; 0 (the default) means none, as budgets pace the requests (docs/behaviour.md, The cascade). When
    /// the limit is full an attempt spills over to the next step instead of queueing.
    #[serde(default)]
    max_concurrency: Bounded<0, MAX_CONCURRENCY>,
    /// The free tier's budget (docs/behaviour.md, Budgets): what is declared here is enforced
    /// before sending; what the provider says is learned on top.
    #[serde(default)]
    budget: BudgetSettings,
}

impl ProviderSettings {
    pub fn kind(&self) -> ProviderKind {
        self.kind
    }

    /// An http(s) URL without a query or a fragment, so endpoint paths can be appended.
    pub fn base_url(&self) -> &Url {
        &self.base_url.0
    }

    /// When false the provider is used without a key (a local Ollama).
    pub fn require_key(&self) -> bool {
        self.require_key
    }

    /// Name of the environment variable with this provider's keys.
    pub fn key_env(&self, provider_name: &str) -> String {
        self.key_env
            .clone()
            .unwrap_or_else(|| format!("{}_API_KEY", provider_name.to_ascii_uppercase()))
    }

    /// The cap on requests in flight; 0 = none.
    pub fn max_concurrency(&self) -> usize {
        self.max_concurrency.get_usize()
    }

    pub fn budget(&self) -> &BudgetSettings {
        &self.budget
    }
}

impl Default for Bounded<0, MAX_CONCURRENCY> {
    fn default() -> Self {
        Self(0)
    }
}

/// `providers.NAME.base_url`: endpoint paths are appended to it, so it must be an
/// http(s) URL, and a query or fragment would end up in front of them and send the
/// requests to the wrong place.
#[derive(Debug, Clone)]
struct BaseUrl(Url);

impl<'de> Deserialize<'de> for BaseUrl {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let url = Url::deserialize(deserializer)?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(serde::de::Error::custom(
                "must be an http:// or https:// URL",
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(serde::de::Error::custom(
                "must not have a ?query or #fragment (endpoint paths are appended to it)",
            ));
        }
        Ok(Self(url))
    }
}

/// What a provider's budget is counted per.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPer {
    /// Each key, for all its models together (Mistral: one workspace, every model).
    #[default]
    Key,
    /// Each key and model (Groq, Gemini).
    Model,
}

/// One provider's declared budget per key (or key and model). Absent limits are not
/// enforced until the provider's answers teach one. Every value is one a budget can
/// hold, so the fields are plain.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSettings {
    #[serde(default)]
    pub per: BudgetPer,
    pub requests_per_second: Option<u32>,
    pub requests_per_minute: Option<u32>,
    pub requests_per_day: Option<u32>,
    pub tokens_per_minute: Option<u32>,
}

/// How the cascade treats spent budgets (docs/behaviour.md, Budgets).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsSettings {
    /// Wait for a better step's budget only when it returns within this; else spill over.
    spill_after_ms: Ms<0>,
    /// Tell the user "saved, the analysis follows in about N minutes" only beyond this.
    notify_after_ms: Ms<0>,
}

impl Default for BudgetsSettings {
    fn default() -> Self {
        Self {
            spill_after_ms: Bounded(1500),
            notify_after_ms: Bounded(15_000),
        }
    }
}

impl BudgetsSettings {
    pub fn spill_after(&self) -> Duration {
        self.spill_after_ms.millis()
    }
    pub fn notify_after(&self) -> Duration {
        self.notify_after_ms.millis()
    }
}

/// One step of a cascade: one model of one provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSettings {
    provider: String,
    model: NonBlank,
    /// Upper bound on generated tokens, passed to the provider when set.
    #[serde(default)]
    max_tokens: Option<Bounded<1, U32_MAX>>,
    #[serde(default)]
    temperature: Option<Temperature>,
}

impl StepSettings {
    /// The name of a configured provider (checked when its cascade is built).
    pub fn provider(&self) -> &str {
        &self.provider
    }
    pub fn model(&self) -> &str {
        &self.model.0
    }
    /// Upper bound on generated tokens, passed to the provider when set.
    pub fn max_tokens(&self) -> Option<u32> {
        self.max_tokens.map(Bounded::get_u32)
    }
    /// 0.0–2.0, passed to the provider when set.
    pub fn temperature(&self) -> Option<f32> {
        self.temperature.map(|t| t.0)
    }
}

/// A model name: not empty.
#[derive(Debug, Clone)]
struct NonBlank(String);

impl<'de> Deserialize<'de> for NonBlank {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.trim().is_empty() {
            return Err(serde::de::Error::custom("must not be empty"));
        }
        Ok(Self(text))
    }
}

/// A sampling temperature, 0 to 2.
#[derive(Debug, Clone, Copy)]
struct Temperature(f32);

impl<'de> Deserialize<'de> for Temperature {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let t = f32::deserialize(deserializer)?;
        if !(0.0..=2.0).contains(&t) {
            return Err(serde::de::Error::custom(format!(
                "{t} is out of range: must be from 0 to 2"
            )));
        }
        Ok(Self(t))
    }
}

/// `[[TASK.steps]]` as written: at least one.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskFields {
    steps: Steps,
}

#[derive(Debug, Clone)]
struct Steps(Vec<StepSettings>);

impl<'de> Deserialize<'de> for Steps {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let steps = Vec::<StepSettings>::deserialize(deserializer)?;
        if steps.is_empty() {
            return Err(serde::de::Error::custom("needs at least one step"));
        }
        Ok(Self(steps))
    }
}

/// One cascade: its steps in order, at least one, each naming a configured provider.
#[derive(Debug, Clone)]
pub struct TaskSettings {
    steps: Vec<StepSettings>,
}

impl TaskSettings {
    /// The cascade `task` (`analysis`, …) over `providers`. Speech to text is a request
    /// shape of the `openai` wire format only (docs/behaviour.md, Voice notes): a transcription step names
    /// an OpenAI-compatible provider.
    fn new(
        task: &str,
        fields: TaskFields,
        providers: &BTreeMap<String, ProviderSettings>,
    ) -> Result<Self, ConfigError> {
        for (i, step) in fields.steps.0.iter().enumerate() {
            let key = format!("{task}.steps[{i}].provider");
            let Some(provider) = providers.get(&step.provider) else {
                let known: Vec<&str> = providers.keys().map(String::as_str).collect();
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "unknown provider `{}` (configured: {})",
                        step.provider,
                        known.join(", ")
                    ),
                ));
            };
            if task == "transcription" && provider.kind != ProviderKind::Openai {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "`{}` is not kind = \"openai\": only OpenAI-compatible providers transcribe",
                        step.provider
                    ),
                ));
            }
        }
        Ok(Self {
            steps: fields.steps.0,
        })
    }

    /// The steps, in the order they are tried; never empty.
    pub fn steps(&self) -> &[StepSettings] {
        &self.steps
    }
}

/// Voice notes (docs/behaviour.md, Voice notes).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoiceSettings {
    /// Longer notes are refused and not stored.
    max_seconds: Bounded<1, U32_MAX>,
    /// Tries of a recording Telegram keeps refusing before the note is given up.
    fetch_max_tries: Bounded<1, 1000>,
}

impl VoiceSettings {
    /// Longer notes are refused and not stored.
    pub fn max_seconds(&self) -> u32 {
        self.max_seconds.get_u32()
    }

    /// How many tries a voice note gets while Telegram's `getFile` keeps answering "wrong
    /// file_id or the file is temporarily unavailable" (on the worker's retry schedule)
    /// before it is given up and the user asked to send it again.
    pub fn fetch_max_tries(&self) -> i64 {
        i64::try_from(self.fetch_max_tries.get()).unwrap_or(i64::MAX)
    }
}

/// Everything from the TOML layers, as written: each value already checked by its type.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    log: LogSettings,
    store: StoreSettings,
    sql: SqlSettings,
    retry: RetryFields,
    cooldown: CooldownSettings,
    worker: WorkerFields,
    telegram: TelegramSettings,
    http: HttpFields,
    webapp: WebappSettings,
    journal: JournalSettings,
    reminders: ReminderSettings,
    cluster: ClusterSettings,
    providers: BTreeMap<String, ProviderSettings>,
    #[serde(default)]
    budgets: BudgetsSettings,
    analysis: TaskFields,
    metrics: TaskFields,
    voice: VoiceSettings,
    transcription: TaskFields,
}

/// Values that only ever come from the environment.
#[derive(Clone)]
pub struct Secrets {
    pub telegram_token: Option<ApiKey>,
    /// `TELEGRAM_WEBHOOK_SECRET`: checked on every webhook post, sent to `setWebhook`.
    pub webhook_secret: Option<ApiKey>,
    /// Keys per provider name, in the order they are tried.
    pub keys: BTreeMap<String, Vec<ApiKey>>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts: BTreeMap<&str, usize> = self
            .keys
            .iter()
            .map(|(k, v)| (k.as_str(), v.len()))
            .collect();
        f.debug_struct("Secrets")
            .field(
                "telegram_token",
                &self.telegram_token.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "webhook_secret",
                &self.webhook_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("key_counts", &counts)
            .finish()
    }
}

/// The complete configuration, typed: each value was checked as its type was built
/// (a bound by the deserialiser, with the key's path; what fields say together by the
/// section's constructor), so reading a setting is a method that cannot fail.
#[derive(Debug, Clone)]
pub struct Settings {
    pub log: LogSettings,
    pub store: StoreSettings,
    pub sql: SqlSettings,
    pub retry: RetrySettings,
    pub cooldown: CooldownSettings,
    pub worker: WorkerSettings,
    pub telegram: TelegramSettings,
    pub http: HttpSettings,
    pub webapp: WebappSettings,
    pub journal: JournalSettings,
    pub reminders: ReminderSettings,
    pub cluster: ClusterSettings,
    pub providers: BTreeMap<String, ProviderSettings>,
    pub budgets: BudgetsSettings,
    pub analysis: TaskSettings,
    pub metrics: TaskSettings,
    pub voice: VoiceSettings,
    pub transcription: TaskSettings,
    pub secrets: Secrets,
    /// `DATABASE_URL`: SQLite or PostgreSQL; a secret (it may hold a password).
    pub database_url: DatabaseUrl,
    /// `DAYLOG_SQL_DATABASE_URL`: the PostgreSQL URL `daylog sql` connects with (a
    /// SELECT-only role), when set; else `daylog sql` uses `DATABASE_URL`.
    pub sql_database_url: Option<DatabaseUrl>,
    /// `TELOXIDE_API_URL`, when a test or a self-hosted Bot API server sets it.
    pub telegram_api_url: Option<Url>,
    /// Things that are allowed but probably a mistake, logged once at start-up.
    pub warnings: Vec<String>,
}

/// Where settings are read from: the process environment, or a map in tests.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
    fn vars(&self) -> Vec<(String, String)>;
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
    /// Variables whose name or value is not Unicode are left out (`std::env::vars`
    /// would panic on them); none of daylog's own can be one and still be read.
    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars_os()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
            .collect()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
    fn vars(&self) -> Vec<(String, String)> {
        self.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl Settings {
    /// Loads every layer from the process environment (after `.env`, which `main` loads).
    pub fn load() -> Result<Self, ConfigError> {
        Self::load_from(&ProcessEnv)
    }

    /// Loads every layer from `env`: the defaults, the file named by `DAYLOG_CONFIG`,
    /// `DAYLOG__…` overrides and the secrets.
    pub fn load_from(env: &dyn Env) -> Result<Self, ConfigError> {
        let mut tree = parse_toml(DEFAULT_TOML, "config/default.toml")?;
        if let Some(path) = env.var(CONFIG_FILE_VAR).filter(|p| !p.trim().is_empty()) {
            let text = read_file(Path::new(&path))?;
            let layer = parse_toml(&text, &path)?;
            merge(&mut tree, layer);
        }
        apply_env_overrides(&mut tree, env)?;
        Self::build(deserialize(tree)?, env)
    }

    /// The settings from the layers' values, each already checked by its type: what
    /// the fields of a section or the sections say together is checked as each is built,
    /// then the values that come only from the environment.
    fn build(file: FileSettings, env: &dyn Env) -> Result<Self, ConfigError> {
        let (mut secrets, mut warnings) = read_secrets(&file.providers, env);
        secrets.webhook_secret = match env.var("TELEGRAM_WEBHOOK_SECRET") {
            // Blank is unset, as for the other secrets; anything else is checked whole.
            Some(raw) if !raw.trim().is_empty() => Some(webhook_secret(&raw)?),
            _ => None,
        };
        if file.webapp.url().is_some() && file.http.listen.0.is_none() {
            warnings.push(
                "webapp.url is set but http.listen is not: nothing serves /app, while the menu button will open it".to_owned(),
            );
        }
        let FileSettings {
            log,
            store,
            sql,
            retry,
            cooldown,
            worker,
            telegram,
            http,
            webapp,
            journal,
            reminders,
            cluster,
            providers,
            budgets,
            analysis,
            metrics,
            voice,
            transcription,
        } = file;
        let http = HttpSettings::new(http)?;
        check_webhook_mode(&telegram, &http, secrets.webhook_secret.as_ref())?;
        let retry = RetrySettings::new(retry)?;
        let worker = WorkerSettings::new(worker)?;
        let analysis = TaskSettings::new("analysis", analysis, &providers)?;
        let metrics = TaskSettings::new("metrics", metrics, &providers)?;
        let transcription = TaskSettings::new("transcription", transcription, &providers)?;
        let database_url = database_url(env)?;
        let sql_database_url = sql_database_url(env)?;
        let telegram_api_url = match env.var("TELOXIDE_API_URL").filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(raw) => Some(bot_api_url(raw.trim())?),
        };
        Ok(Self {
            log,
            store,
            sql,
            retry,
            cooldown,
            worker,
            telegram,
            http,
            webapp,
            journal,
            reminders,
            cluster,
            providers,
            budgets,
            analysis,
            metrics,
            voice,
            transcription,
            secrets,
            database_url,
            sql_database_url,
            telegram_api_url,
            warnings,
        })
    }

    /// The keys of one provider, in order (empty when none are set).
    pub fn keys(&self, provider: &str) -> &[ApiKey] {
        self.secrets
            .keys
            .get(provider)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Whether a provider can be called: it has a key, or needs none.
    pub fn provider_usable(&self, provider: &str) -> bool {
        self.providers
            .get(provider)
            .is_some_and(|p| !p.require_key() || !self.keys(provider).is_empty())
    }
}

/// `DATABASE_URL`, or the default: a SQLite URL naming a file (an empty or in-memory
/// path would be a database that vanishes at exit), or a PostgreSQL URL. A message
/// never repeats it: it may hold a password.
fn database_url(env: &dyn Env) -> Result<DatabaseUrl, ConfigError> {
    let url = env
        .var("DATABASE_URL")
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned());
    if is_postgres_url(&url) {
        return postgres_url("DATABASE_URL", url);
    }
    if !url.starts_with("sqlite:") {
        return Err(ConfigError::invalid(
            "DATABASE_URL",
            "expected a SQLite URL like sqlite://data/daylog.db or a PostgreSQL URL like postgres://daylog@localhost/daylog",
        ));
    }
    database_path(&url).map_err(|e| ConfigError::invalid("DATABASE_URL", e.to_string()))?;
    Ok(DatabaseUrl(url))
}

/// `DAYLOG_SQL_DATABASE_URL`: PostgreSQL only (a SQLite `daylog sql` opens the file
/// read-only by itself, so it has no use for a second URL).
fn sql_database_url(env: &dyn Env) -> Result<Option<DatabaseUrl>, ConfigError> {
    const NAME: &str = "DAYLOG_SQL_DATABASE_URL";
    match env.var(NAME).filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(url) if is_postgres_url(&url) => postgres_url(NAME, url).map(Some),
        Some(_) => Err(ConfigError::invalid(
            NAME,
            "expected a PostgreSQL URL like postgres://daylog_reader@localhost/daylog (a role that may only SELECT)",
        )),
    }
}

/// A PostgreSQL URL that parses, with a database to connect to.
fn postgres_url(name: &str, url: String) -> Result<DatabaseUrl, ConfigError> {
    match url::Url::parse(&url) {
        Ok(parsed) if parsed.path().trim_start_matches('/').is_empty() => {
            Err(ConfigError::invalid(
                name,
                "names no database: add it, as in postgres://daylog@localhost/daylog",
            ))
        }
        Ok(_) => Ok(DatabaseUrl(url)),
        Err(e) => Err(ConfigError::invalid(
            name,
            format!("is not a valid PostgreSQL URL ({e})"),
        )),
    }
}

/// Whether `url` names a PostgreSQL database (`postgres://` or `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// A database URL: a secret, since a PostgreSQL one may hold a password. Shown (Debug,
/// Display) without its password and parameters ([`redacted_url`]); the whole text is
/// [`Self::expose`]'s, for opening the database only.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The URL with its password, to connect with.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseUrl({})", redacted_url(&self.0))
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redacted_url(&self.0))
    }
}

impl PartialEq<&str> for DatabaseUrl {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// A database URL as messages may show it: its password replaced by `***` and its
/// parameters (which may hold one too) left out.
pub fn redacted_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.set_query(None);
            parsed.to_string()
        }
        Err(_) => "(a DATABASE_URL that is no URL)".to_owned(),
    }
}

/// `TELOXIDE_API_URL`: teloxide appends `bot<token>/<method>` to it, so it must be an
/// http(s) URL without a query or a fragment (either would swallow that path, and any
/// other scheme would only fail, again and again, at the first request).
fn bot_api_url(raw: &str) -> Result<Url, ConfigError> {
    const KEY: &str = "TELOXIDE_API_URL";
    let url = Url::parse(raw)
        .map_err(|e| ConfigError::invalid(KEY, in_plain_words(KEY, format!("not a URL: {e}"))))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(ConfigError::invalid(
            KEY,
            "must be an http:// or https:// URL with a host, e.g. https://api.telegram.org",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::invalid(
            KEY,
            "must not have a ?query or #fragment: the Bot API path is appended to it",
        ));
    }
    Ok(url)
}

fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn parse_toml(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>().map_err(|e| {
        let mut message = e.message().trim().to_owned();
        // The line names the key (a number too large for any type has no key otherwise).
        if let Some(span) = e.span() {
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            if let Some(line) = text.lines().nth(line_no - 1) {
                message = format!("{message} (line {line_no}: `{}`)", line.trim());
            }
        }
        ConfigError::Syntax {
            origin: origin.to_owned(),
            message,
        }
    })
}

/// Merges `layer` over `base` key by key: tables merge recursively, anything else
/// (numbers, strings, arrays such as `analysis.steps`) is replaced whole.
fn merge(base: &mut toml::Table, layer: toml::Table) {
    for (key, value) in layer {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(incoming)) => {
                merge(existing, incoming);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Applies `DAYLOG__SECTION__KEY=value`. The value is read as a TOML value when it is
/// one (`50`, `true`, `[1, 2]`), else as a plain string (`http://127.0.0.1:9000/v1`).
fn apply_env_overrides(tree: &mut toml::Table, env: &dyn Env) -> Result<(), ConfigError> {
    let mut overrides: Vec<(String, String)> = env
        .vars()
        .into_iter()
        .filter(|(name, _)| name.starts_with(ENV_PREFIX))
        .collect();
    overrides.sort();
    for (name, raw) in overrides {
        let path: Vec<String> = name[ENV_PREFIX.len()..]
            .split("__")
            .map(str::to_ascii_lowercase)
            .collect();
        if path.iter().any(String::is_empty) {
            return Err(ConfigError::invalid(name, "empty section or key name"));
        }
        let value = parse_env_value(&raw);
        let digits = raw.trim().trim_start_matches(['+', '-']);
        if !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && !matches!(value, toml::Value::Integer(_))
        {
            // A whole number TOML cannot hold: say so, not "expected u64, got a string".
            // TOML refuses a leading zero too (`04`).
            let leading_zero = digits.len() > 1 && digits.starts_with('0');
            let why = if leading_zero {
                "is not a number as written: leave out the leading zero"
            } else {
                "is too large a number"
            };
            return Err(ConfigError::invalid(
                path.join("."),
                format!("{} {why}", raw.trim()),
            ));
        }
        let (last, sections) = path.split_last().unwrap_or((&path[0], &[]));
        let mut table = &mut *tree;
        for section in sections {
            let entry = table
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            table = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::invalid(
                        name.clone(),
                        format!("`{section}` is not a section"),
                    ));
                }
            };
        }
        table.insert(last.clone(), value);
    }
    Ok(())
}

fn parse_env_value(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

fn deserialize(tree: toml::Table) -> Result<FileSettings, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(tree)).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." {
            "(top level)".to_owned()
        } else {
            path
        };
        // The TOML deserialiser appends "in `section`" lines; the key already says where.
        let message = e.into_inner().to_string();
        let first_line = message.lines().next().unwrap_or_default().trim().to_owned();
        let plain = in_plain_words(&key, first_line);
        ConfigError::invalid(key, plain)
    })
}

/// A deserialiser's message with what to write instead, where its words are the
/// parser's own ("expected a sequence", "relative URL without a base").
fn in_plain_words(key: &str, message: String) -> String {
    if message.ends_with("expected a sequence") {
        return format!("{message}: write a list in brackets, such as [111, 222]");
    }
    if message.contains("relative URL without a base") {
        return format!("{message}: write the whole URL, starting with https:// (or http://)");
    }
    // `DAYLOG__PROVIDERS__MISTRL__BASE_URL`: a provider that does not exist, not one
    // that lacks a `kind`.
    let Some(name) = key
        .strip_prefix("providers.")
        .filter(|_| message == "missing field `kind`")
    else {
        return message;
    };
    let shipped = parse_toml(DEFAULT_TOML, "config/default.toml")
        .ok()
        .and_then(|tree| {
            tree.get("providers")
                .and_then(toml::Value::as_table)
                .cloned()
        })
        .unwrap_or_default();
    if shipped.contains_key(name) {
        return message;
    }
    let known: Vec<&str> = shipped.keys().map(String::as_str).collect();
    format!(
        "{message}: there is no provider {name} (the known ones are {}); check the spelling, or give a new one its kind and base_url",
        known.join(", ")
    )
}

/// Keys of each provider: `NAME_API_KEY` (one, or a comma list), then `NAME_API_KEY_2`,
/// `_3`, … until the first missing number. Blank entries and duplicates are dropped. A
/// numbered variable after a gap is never read, and says so in the warnings.
fn read_secrets(
    providers: &BTreeMap<String, ProviderSettings>,
    env: &dyn Env,
) -> (Secrets, Vec<String>) {
    let mut keys = BTreeMap::new();
    let mut warnings = Vec::new();
    for (name, provider) in providers {
        let var = provider.key_env(name);
        // Each key with where it was read from; a key given twice keeps its first place.
        let mut found: Vec<(String, String)> = Vec::new();
        let mut push_all = |raw: String, from: &str| {
            let listed: Vec<&str> = raw
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .collect();
            for (i, k) in listed.iter().enumerate() {
                if !found.iter().any(|(f, _)| f == k) {
                    let origin = if listed.len() == 1 {
                        from.to_owned()
                    } else {
                        format!("{from}, {} of {}", ordinal(i + 1), listed.len())
                    };
                    found.push(((*k).to_owned(), origin));
                }
            }
        };
        if let Some(raw) = env.var(&var) {
            push_all(raw, &var);
        }
        let mut n = 2;
        while let Some(raw) = env.var(&format!("{var}_{n}")) {
            push_all(raw, &format!("{var}_{n}"));
            n += 1;
        }
        if let Some(skipped) = (n + 1..n + 10).find(|m| env.var(&format!("{var}_{m}")).is_some()) {
            warnings.push(format!(
                "{var}_{skipped} is set but {var}_{n} is not: keys after the gap are not used"
            ));
        }
        keys.insert(
            name.clone(),
            found
                .into_iter()
                .map(|(key, origin)| ApiKey::read_from(key, origin))
                .collect(),
        );
    }
    let telegram_token = env
        .var("TELOXIDE_TOKEN")
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .map(ApiKey::new);
    (
        Secrets {
            telegram_token,
            webhook_secret: None,
            keys,
        },
        warnings,
    )
}

/// Why `DATABASE_URL` names no file the store could keep entries in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatabaseUrlError {
    #[error("DATABASE_URL must be a SQLite URL such as sqlite://data/daylog.db")]
    NotSqlite,
    #[error(
        "DATABASE_URL names no database file (empty or in-memory: the data would vanish at exit); use a path such as sqlite://data/daylog.db"
    )]
    NoFile,
    #[error(
        "DATABASE_URL opens the database read-only (mode=ro or immutable): no entry could ever be saved; remove that parameter"
    )]
    ReadOnly,
    #[error(
        "DATABASE_URL starts its path with ~, which only a shell expands: daylog would make a folder named ~ here; write the full path, such as sqlite:///home/you/daylog.db"
    )]
    Tilde,
    #[error("DATABASE_URL is not a valid SQLite URL: {0}")]
    BadUrl(String),
}

/// The file behind a `sqlite:` URL, percent-decoded the way sqlx opens it (so every
/// command finds the same file). An empty path (`sqlite://`, which SQLite turns into a
/// temporary database) and in-memory databases are refused: entries in them would be
/// gone at exit.
pub fn database_path(url: &str) -> Result<PathBuf, DatabaseUrlError> {
    let rest = url
        .strip_prefix("sqlite:")
        .ok_or(DatabaseUrlError::NotSqlite)?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, params) = rest.split_once('?').unwrap_or((rest, ""));
    let in_memory = url::form_urlencoded::parse(params.as_bytes()).any(|(key, value)| {
        (key == "mode" && value == "memory") || (key == "vfs" && value == "memdb")
    });
    if path.trim().is_empty() || path == ":memory:" || in_memory {
        return Err(DatabaseUrlError::NoFile);
    }
    // Every write would fail: each entry refused ("send it again") for ever.
    let read_only = url::form_urlencoded::parse(params.as_bytes()).any(|(key, value)| {
        (key == "mode" && value == "ro")
            || (key == "immutable" && !matches!(&*value, "0" | "false" | "no" | "off"))
    });
    if read_only {
        return Err(DatabaseUrlError::ReadOnly);
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .map_err(|e| DatabaseUrlError::BadUrl(e.to_string()))?;
    // A folder named `~` beside the working one (however the URL spells it), which a
    // later `rm -rf ~` would take for the home folder.
    if options
        .get_filename()
        .components()
        .next()
        .is_some_and(|first| first.as_os_str() == "~")
    {
        return Err(DatabaseUrlError::Tilde);
    }
    // sqlx opens with SQLITE_OPEN_URI: a decoded name such as `file::memory:` or
    // `file:x.db?mode=memory` is an in-memory database too.
    let name = options.get_filename().to_string_lossy();
    if name.starts_with("file:")
        && [":memory:", "mode=memory", "vfs=memdb"]
            .iter()
            .any(|word| name.contains(word))
    {
        return Err(DatabaseUrlError::NoFile);
    }
    Ok(options.get_filename().to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn load(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::load_from(&env(pairs))
    }

    fn error_key(pairs: &[(&str, &str)]) -> String {
        match load(pairs) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected an invalid-key error, got {other:?}"),
        }
    }

    fn write_config(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), text).expect("write config");
        file
    }

    #[test]
    fn the_lease_is_taken_within_its_bounds_only() {
        let lease = |value: &str| load(&[("DAYLOG__CLUSTER__LEASE_MS", value)]);
        assert_eq!(
            lease("1000").expect("the least").cluster.lease(),
            Duration::from_secs(1)
        );
        assert!(lease("600000").is_ok());
        assert_eq!(
            load(&[]).expect("defaults").cluster.lease(),
            Duration::from_secs(30)
        );
        for wrong in ["999", "600001", "0"] {
            assert_eq!(
                error_key(&[("DAYLOG__CLUSTER__LEASE_MS", wrong)]),
                "cluster.lease_ms"
            );
        }
    }

    #[test]
    fn the_mini_app_url_is_https_unless_on_loopback() {
        let url = |value: &str| {
            load(&[("DAYLOG__WEBAPP__URL", value)]).map(|s| s.webapp.url().map(Url::to_string))
        };
        assert_eq!(url("").expect("off"), None);
        for good in [
            "https://bot.example.com/app",
            "http://127.0.0.1:8080/app",
            "http://localhost:8080/app",
            "http://[::1]:8080/app",
        ] {
            assert!(url(good).expect(good).is_some(), "{good}");
        }
        for bad in [
            "http://bot.example.com/app",
            "ftp://x/app",
            "bot.example.com/app",
        ] {
            assert_eq!(
                error_key(&[("DAYLOG__WEBAPP__URL", bad)]),
                "webapp.url",
                "{bad}"
            );
        }
        let defaults = load(&[]).expect("defaults");
        assert_eq!(defaults.webapp.max_age(), Duration::from_secs(24 * 3600));
        let unserved = load(&[("DAYLOG__WEBAPP__URL", "https://bot.example.com/app")])
            .expect("a URL without a listener");
        assert!(unserved.warnings.iter().any(|w| w.contains("http.listen")));
        assert_eq!(
            error_key(&[("DAYLOG__WEBAPP__MAX_AGE_HOURS", "0")]),
            "webapp.max_age_hours"
        );
    }

    #[test]
    fn the_metrics_listener_never_shares_the_public_address() {
        let http = |listen: &str, metrics: &str| {
            load(&[
                ("DAYLOG__HTTP__LISTEN", listen),
                ("DAYLOG__HTTP__METRICS_LISTEN", metrics),
            ])
            .map(|s| (s.http.listen(), s.http.metrics_listen()))
        };
        let off = http("", "").expect("off");
        assert_eq!(off, (None, None));
        let both = http("0.0.0.0:8080", "127.0.0.1:9464").expect("two addresses");
        assert_eq!(both.0.map(|a| a.port()), Some(8080));
        assert_eq!(both.1.map(|a| a.port()), Some(9464));
        // Port 0 is any free port, not one address.
        assert!(http("127.0.0.1:0", "127.0.0.1:0").is_ok());
        for (listen, metrics) in [
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("0.0.0.0:8080", "127.0.0.1:8080"),
            ("[::1]:8080", "[::]:8080"),
        ] {
            assert_eq!(
                error_key(&[
                    ("DAYLOG__HTTP__LISTEN", listen),
                    ("DAYLOG__HTTP__METRICS_LISTEN", metrics),
                ]),
                "http.metrics_listen",
                "{listen} and {metrics}"
            );
        }
        assert!(http("localhost:8080", "").is_err());
        assert!(http("8080", "").is_err());
    }

    #[test]
    fn webhook_mode_needs_a_listener_a_url_and_a_valid_secret() {
        const SECRET: &str = "s3cr3t_Webhook-token";
        let webhook = [
            ("DAYLOG__TELEGRAM__MODE", "webhook"),
            ("DAYLOG__HTTP__LISTEN", "127.0.0.1:8080"),
            (
                "DAYLOG__TELEGRAM__WEBHOOK_URL",
                "https://bot.example.org/tg/hook",
            ),
            ("TELEGRAM_WEBHOOK_SECRET", SECRET),
        ];
        let s = load(&webhook).expect("a whole webhook configuration");
        assert_eq!(s.telegram.mode(), TelegramMode::Webhook);
        assert_eq!(s.telegram.webhook_url().map(Url::path), Some("/tg/hook"));
        assert_eq!(s.telegram.max_connections(), 40);
        assert!(s.telegram.set_webhook());
        assert_eq!(s.telegram.webhook_port_warning(), None);
        assert!(!format!("{s:?}").contains(SECRET));
        let without = |skip: &str| {
            let pairs: Vec<(&str, &str)> = webhook
                .iter()
                .copied()
                .filter(|(k, _)| *k != skip)
                .collect();
            match load(&pairs) {
                Err(ConfigError::Invalid { key, message }) => format!("{key}: {message}"),
                other => panic!("expected a refusal without {skip}, got {other:?}"),
            }
        };
        assert!(without("DAYLOG__HTTP__LISTEN").contains("http.listen"));
        assert!(without("DAYLOG__TELEGRAM__WEBHOOK_URL").contains("telegram.webhook_url"));
        assert!(without("TELEGRAM_WEBHOOK_SECRET").contains("TELEGRAM_WEBHOOK_SECRET"));
        // A path another route of http.listen answers would not start the listener.
        for taken in ["/healthz", "/readyz", "/app", "/app/api/history"] {
            let url = format!("https://bot.example.org{taken}");
            let mut pairs = webhook.to_vec();
            pairs.retain(|(k, _)| *k != "DAYLOG__TELEGRAM__WEBHOOK_URL");
            pairs.push(("DAYLOG__TELEGRAM__WEBHOOK_URL", &url));
            assert!(load(&pairs).is_err(), "{taken}");
        }
        // A secret Telegram would refuse is refused here, without being shown.
        for bad in ["has space", "ключ", &"x".repeat(257), "quote\"d"] {
            let mut pairs = webhook.to_vec();
            pairs.retain(|(k, _)| *k != "TELEGRAM_WEBHOOK_SECRET");
            pairs.push(("TELEGRAM_WEBHOOK_SECRET", bad));
            let error = load(&pairs).expect_err(bad).to_string();
            assert!(error.contains("TELEGRAM_WEBHOOK_SECRET"), "{error}");
            assert!(!error.contains(bad), "{error}");
        }
        // A path the router could not serve, or one daylog serves already, is refused
        // with a sentence instead of a panic when the routes are built.
        for path in [
            "/healthz",
            "/readyz",
            "/app",
            "/app/api/export",
            "/:hook",
            "/tg/*rest",
        ] {
            let url = format!("https://bot.example.org{path}");
            let mut pairs = webhook.to_vec();
            pairs.retain(|(k, _)| *k != "DAYLOG__TELEGRAM__WEBHOOK_URL");
            pairs.push(("DAYLOG__TELEGRAM__WEBHOOK_URL", &url));
            assert_eq!(error_key(&pairs), "telegram.webhook_url", "{path}");
        }
        for path in ["/", "/application", "/tg/a:b"] {
            let url = format!("https://bot.example.org{path}");
            let mut pairs = webhook.to_vec();
            pairs.retain(|(k, _)| *k != "DAYLOG__TELEGRAM__WEBHOOK_URL");
            pairs.push(("DAYLOG__TELEGRAM__WEBHOOK_URL", &url));
            assert!(load(&pairs).is_ok(), "{path}");
        }
        // Polling mode needs none of it.
        assert_eq!(
            load(&[]).expect("defaults").telegram.mode(),
            TelegramMode::Polling
        );
    }

    #[test]
    fn a_webhook_url_is_https_unless_its_host_is_loopback() {
        let url = |raw: &str| {
            load(&[("DAYLOG__TELEGRAM__WEBHOOK_URL", raw)])
                .map(|s| s.telegram.webhook_url().map(Url::to_string))
        };
        assert!(url("https://bot.example.org/hook").is_ok());
        assert!(url("http://127.0.0.1:8080/hook").is_ok());
        assert!(url("http://[::1]:8080/hook").is_ok());
        assert!(url("http://localhost/hook").is_ok());
        assert_eq!(url("").expect("off"), None);
        for bad in [
            "http://bot.example.org/hook",
            "http://10.0.0.1/hook",
            "ftp://bot.example.org/hook",
            "bot.example.org/hook",
            "https://bot.example.org/hook#x",
        ] {
            assert_eq!(
                error_key(&[("DAYLOG__TELEGRAM__WEBHOOK_URL", bad)]),
                "telegram.webhook_url",
                "{bad}"
            );
        }
        assert_eq!(
            error_key(&[("DAYLOG__TELEGRAM__MAX_CONNECTIONS", "101")]),
            "telegram.max_connections"
        );
        assert_eq!(
            error_key(&[("DAYLOG__TELEGRAM__MODE", "websocket")]),
            "telegram.mode"
        );
        let odd_port = load(&[(
            "DAYLOG__TELEGRAM__WEBHOOK_URL",
            "https://bot.example.org:8080/",
        )])
        .expect("allowed");
        assert!(
            odd_port
                .telegram
                .webhook_port_warning()
                .is_some_and(|w| w.contains("8080"))
        );
    }

    #[test]
    fn hedge_after_is_auto_a_number_or_off() {
        let hedge = |raw: &str| {
            load(&[("DAYLOG__RETRY__HEDGE_AFTER_MS", raw)]).map(|s| s.retry.hedge_after())
        };
        assert_eq!(hedge("\"auto\"").ok(), Some(HedgeAfter::Auto));
        assert_eq!(hedge("auto").ok(), Some(HedgeAfter::Auto));
        assert_eq!(
            hedge("300").ok(),
            Some(HedgeAfter::After(Duration::from_millis(300)))
        );
        assert_eq!(hedge("0").ok(), Some(HedgeAfter::Off));
        for bad in ["soon", "-5", "1.5"] {
            assert_eq!(
                error_key(&[("DAYLOG__RETRY__HEDGE_AFTER_MS", bad)]),
                "retry.hedge_after_ms",
                "{bad}"
            );
        }
    }

    /// What a first deployer mistypes, answered with what to write instead; the key is
    /// still named.
    #[test]
    fn common_mistakes_are_answered_in_plain_words() {
        let message = |pairs: &[(&str, &str)]| match load(pairs) {
            Err(ConfigError::Invalid { key, message }) => format!("{key}: {message}"),
            other => panic!("expected an invalid-key error, got {other:?}"),
        };
        let rows: [(&str, &str, &str); 4] = [
            (
                "DAYLOG__TELEGRAM__ALLOWED_USERS",
                "111",
                "telegram.allowed_users: invalid type: integer `111`, expected a sequence: write a list in brackets, such as [111, 222]",
            ),
            (
                "DAYLOG__PROVIDERS__MISTRAL__BASE_URL",
                "api.mistral.ai/v1",
                "starting with https://",
            ),
            (
                "TELOXIDE_API_URL",
                "api.telegram.org",
                "starting with https://",
            ),
            (
                "DAYLOG__PROVIDERS__MISTRL__BASE_URL",
                "http://127.0.0.1:9/v1",
                "there is no provider mistrl (the known ones are anthropic, gemini, groq, mistral)",
            ),
        ];
        for (name, value, expected) in rows {
            let said = message(&[(name, value)]);
            assert!(said.contains(expected), "{name}={value}: {said}");
        }
    }

    #[test]
    fn defaults_match_the_spec() {
        let s = load(&[]).expect("defaults load");
        assert_eq!(s.retry.max_attempts(), 3);
        assert_eq!(s.retry.min_delay(), Duration::from_secs(1));
        assert_eq!(s.retry.hedge_after(), HedgeAfter::Auto);
        assert_eq!(s.cooldown.duration(), Duration::from_secs(60));
        assert_eq!(s.worker.max_age(), Duration::from_secs(48 * 3600));
        assert!(s.telegram.throttle());
        assert_eq!(s.analysis.steps().len(), 3);
        assert_eq!(s.analysis.steps()[0].model(), "mistral-small-2506");
        assert_eq!(s.metrics.steps()[0].provider(), "groq");
        assert_eq!(s.providers["gemini"].kind(), ProviderKind::Gemini);
        assert_eq!(s.database_url, DEFAULT_DATABASE_URL);
    }

    #[test]
    fn time_and_rhythm_settings_are_checked_by_name() {
        let s = load(&[]).expect("defaults load");
        assert_eq!(s.journal.default_zone().name(), "UTC");
        assert_eq!(s.journal.day_starts_hour(), 4);
        assert_eq!(s.reminders.max_late(), Duration::from_secs(90 * 60));
        let s = load(&[("DAYLOG__JOURNAL__DEFAULT_TIMEZONE", "europe/berlin")]).expect("loads");
        assert_eq!(s.journal.default_zone().name(), "Europe/Berlin");
        for (key, value, named) in [
            (
                "DAYLOG__JOURNAL__DEFAULT_TIMEZONE",
                "Mars/Olympus",
                "journal.default_timezone",
            ),
            (
                "DAYLOG__JOURNAL__DAY_STARTS_HOUR",
                "24",
                "journal.day_starts_hour",
            ),
            (
                "DAYLOG__REMINDERS__POLL_INTERVAL_MS",
                "0",
                "reminders.poll_interval_ms",
            ),
        ] {
            let error = load(&[(key, value)]).expect_err(key).to_string();
            assert!(error.contains(named), "{error}");
        }
    }

    #[test]
    fn layers_apply_in_order_file_then_env() {
        let file = write_config("[retry]\nmin_delay_ms = 10\nmax_delay_ms = 20\n");
        let path = file.path().to_str().expect("utf-8 path");
        let s = load(&[
            (CONFIG_FILE_VAR, path),
            ("DAYLOG__RETRY__MAX_DELAY_MS", "50"),
            (
                "DAYLOG__PROVIDERS__MISTRAL__BASE_URL",
                "http://127.0.0.1:9000/v1",
            ),
            ("DAYLOG__TELEGRAM__THROTTLE", "false"),
        ])
        .expect("loads");
        assert_eq!(
            s.retry.min_delay(),
            Duration::from_millis(10),
            "file beats defaults"
        );
        assert_eq!(
            s.retry.max_delay(),
            Duration::from_millis(50),
            "env beats file"
        );
        assert_eq!(
            s.retry.max_attempts(),
            3,
            "untouched keys keep their default"
        );
        assert_eq!(
            s.providers["mistral"].base_url().as_str(),
            "http://127.0.0.1:9000/v1"
        );
        assert_eq!(s.providers["mistral"].kind(), ProviderKind::Openai);
        assert!(!s.telegram.throttle());
    }

    #[test]
    fn a_file_replaces_step_lists_whole() {
        let file = write_config(
            "[[analysis.steps]]\nprovider = \"gemini\"\nmodel = \"gemini-2.5-flash\"\n",
        );
        let s = load(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))]).expect("loads");
        assert_eq!(s.analysis.steps().len(), 1);
        assert_eq!(s.analysis.steps()[0].model(), "gemini-2.5-flash");
    }

    #[test]
    fn keys_come_from_comma_lists_and_numbered_variables() {
        let s = load(&[
            ("GEMINI_API_KEY", "g1, g2,,g1"),
            ("GEMINI_API_KEY_2", "g3"),
            ("GEMINI_API_KEY_3", "g4"),
            ("GEMINI_API_KEY_5", "unreachable-after-a-gap"),
            ("MISTRAL_API_KEY", "m1"),
        ])
        .expect("loads");
        let gemini: Vec<&str> = s.keys("gemini").iter().map(ApiKey::expose).collect();
        assert_eq!(gemini, ["g1", "g2", "g3", "g4"]);
        // Where each came from, as a person finds it in `.env` (a list's place as
        // written, the repeated g1 included).
        let origins: Vec<&str> = s.keys("gemini").iter().map(ApiKey::origin).collect();
        assert_eq!(
            origins,
            [
                "GEMINI_API_KEY, 1st of 3",
                "GEMINI_API_KEY, 2nd of 3",
                "GEMINI_API_KEY_2",
                "GEMINI_API_KEY_3"
            ]
        );
        assert_eq!(s.keys("mistral")[0].origin(), "MISTRAL_API_KEY");
        assert_eq!(s.keys("mistral").len(), 1);
        assert!(s.keys("groq").is_empty());
        assert_eq!(
            s.warnings,
            [
                "GEMINI_API_KEY_5 is set but GEMINI_API_KEY_4 is not: keys after the gap are not used"
            ]
        );
        assert!(s.provider_usable("mistral"));
        assert!(!s.provider_usable("groq"));
    }

    #[test]
    fn a_provider_without_key_requirement_is_usable() {
        let s = load(&[
            ("DAYLOG__PROVIDERS__OLLAMA__KIND", "openai"),
            (
                "DAYLOG__PROVIDERS__OLLAMA__BASE_URL",
                "http://localhost:11434/v1",
            ),
            ("DAYLOG__PROVIDERS__OLLAMA__REQUIRE_KEY", "false"),
        ])
        .expect("loads");
        assert!(s.provider_usable("ollama"));
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let s = load(&[
            ("MISTRAL_API_KEY", "sk-very-secret-mistral"),
            ("TELOXIDE_TOKEN", "123456:telegram-secret"),
        ])
        .expect("loads");
        let debug = format!("{s:?}");
        assert!(!debug.contains("sk-very-secret-mistral"), "{debug}");
        assert!(!debug.contains("telegram-secret"), "{debug}");
        assert!(debug.contains("redacted"));
        assert_eq!(format!("{:?}", ApiKey::new("abc")), "ApiKey(<redacted>)");
    }

    #[test]
    fn voice_defaults_and_transcription_only_on_openai_providers() {
        let s = load(&[]).expect("defaults load");
        assert_eq!(s.voice.max_seconds(), 600);
        assert_eq!(s.voice.fetch_max_tries(), 7);
        let models: Vec<&str> = s
            .transcription
            .steps()
            .iter()
            .map(StepSettings::model)
            .collect();
        assert_eq!(models, ["whisper-large-v3-turbo", "whisper-large-v3"]);
        assert_eq!(s.transcription.steps()[0].provider(), "groq");

        let file = write_config("[[transcription.steps]]\nprovider = \"gemini\"\nmodel = \"x\"\n");
        let key = error_key(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))]);
        assert_eq!(key, "transcription.steps[0].provider");
        assert_eq!(
            error_key(&[("DAYLOG__VOICE__MAX_SECONDS", "0")]),
            "voice.max_seconds"
        );
        assert_eq!(
            error_key(&[("DAYLOG__VOICE__FETCH_MAX_TRIES", "0")]),
            "voice.fetch_max_tries"
        );
    }

    #[test]
    fn unknown_step_provider_is_named() {
        let file = write_config("[[metrics.steps]]\nprovider = \"openrouter\"\nmodel = \"x\"\n");
        let key = error_key(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))]);
        assert_eq!(key, "metrics.steps[0].provider");
    }

    #[test]
    fn bad_base_url_is_named() {
        let key = error_key(&[("DAYLOG__PROVIDERS__GROQ__BASE_URL", "not a url")]);
        assert_eq!(key, "providers.groq.base_url");
    }

    #[test]
    fn zero_attempts_is_refused() {
        assert_eq!(
            error_key(&[("DAYLOG__RETRY__MAX_ATTEMPTS", "0")]),
            "retry.max_attempts"
        );
    }

    /// A bound checked as its type is read still names the key and says what to write.
    #[test]
    fn an_out_of_range_value_says_its_range() {
        let said = |var, value| load(&[(var, value)]).expect_err(var).to_string();
        assert_eq!(
            said("DAYLOG__RETRY__MAX_ATTEMPTS", "0"),
            "config key `retry.max_attempts`: 0 is out of range: must be from 1 to 1000"
        );
        assert_eq!(
            said("DAYLOG__SQL__MAX_ROWS", "0"),
            "config key `sql.max_rows`: 0 is out of range: must be at least 1"
        );
        assert_eq!(
            said("DAYLOG__JOURNAL__DAY_STARTS_HOUR", "24"),
            "config key `journal.day_starts_hour`: 24 is out of range: must be from 0 to 23"
        );
        assert_eq!(
            said("DAYLOG__RETRY__MIN_DELAY_MS", "20000"),
            "config key `retry.min_delay_ms`: 20000 is greater than retry.max_delay_ms (10000)"
        );
    }

    #[test]
    fn min_delay_above_max_delay_is_refused() {
        let key = error_key(&[
            ("DAYLOG__RETRY__MIN_DELAY_MS", "5000"),
            ("DAYLOG__RETRY__MAX_DELAY_MS", "100"),
        ]);
        assert_eq!(key, "retry.min_delay_ms");
    }

    #[test]
    fn unknown_provider_kind_is_named() {
        let key = error_key(&[("DAYLOG__PROVIDERS__MISTRAL__KIND", "cohere")]);
        assert_eq!(key, "providers.mistral.kind");
    }

    #[test]
    fn unknown_keys_in_a_file_are_refused() {
        let file = write_config("[retry]\nmax_atempts = 5\n");
        let err = load(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))])
            .expect_err("typo refused");
        let text = err.to_string();
        assert!(text.contains("max_atempts"), "{text}");
        assert!(text.contains("retry"), "{text}");
    }

    #[test]
    fn unknown_env_override_is_refused() {
        let err = load(&[("DAYLOG__RETRY__MAX_ATEMPTS", "5")]).expect_err("typo refused");
        assert!(err.to_string().contains("max_atempts"), "{err}");
    }

    #[test]
    fn wrong_types_are_named() {
        assert_eq!(
            error_key(&[("DAYLOG__RETRY__MIN_DELAY_MS", "soon")]),
            "retry.min_delay_ms"
        );
    }

    #[test]
    fn malformed_toml_is_one_sentence() {
        let file = write_config("[retry\nmax_attempts = 3\n");
        let err = load(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))])
            .expect_err("syntax error");
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
    }

    #[test]
    fn a_missing_config_file_is_an_error() {
        let err = load(&[(CONFIG_FILE_VAR, "/nonexistent/daylog.toml")]).expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/daylog.toml"));
    }

    #[test]
    fn a_postgres_database_url_is_taken_and_never_shown_with_its_password() {
        for url in [
            "postgres://daylog:hunter2@db/daylog",
            "postgresql://daylog:hunter2@db:5432/daylog?sslmode=require",
        ] {
            let s = load(&[("DATABASE_URL", url)]).expect("a PostgreSQL URL loads");
            assert_eq!(s.database_url.expose(), url);
            let shown = format!("{s:?} {}", s.database_url);
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        assert_eq!(
            error_key(&[("DATABASE_URL", "mysql://localhost/daylog")]),
            "DATABASE_URL"
        );
        assert_eq!(
            error_key(&[("DATABASE_URL", "postgres://localhost")]),
            "DATABASE_URL"
        );
    }

    #[test]
    fn the_sql_database_url_is_postgres_only_and_a_secret() {
        let url = "postgres://daylog_reader:s3cret@db/daylog";
        let s = load(&[("DAYLOG_SQL_DATABASE_URL", url)]).expect("loads");
        assert_eq!(
            s.sql_database_url.as_ref().map(DatabaseUrl::expose),
            Some(url)
        );
        assert!(!format!("{s:?}").contains("s3cret"));
        assert_eq!(
            error_key(&[("DAYLOG_SQL_DATABASE_URL", "sqlite://data/daylog.db")]),
            "DAYLOG_SQL_DATABASE_URL"
        );
    }

    #[test]
    fn store_sql_and_retry_numbers_are_checked_against_their_range() {
        // (variable, value, key named): beyond what the consumer accepts, or zero where
        // zero means nothing (or panics a timer).
        let cases = [
            (
                "DAYLOG__STORE__BUSY_TIMEOUT_MS",
                "3000000000",
                "store.busy_timeout_ms",
            ),
            (
                "DAYLOG__STORE__MAX_SIZE_MB",
                "99999999999",
                "store.max_size_mb",
            ),
            ("DAYLOG__SQL__TIMEOUT_MS", "0", "sql.timeout_ms"),
            ("DAYLOG__SQL__MAX_ROWS", "0", "sql.max_rows"),
            ("DAYLOG__RETRY__MAX_ATTEMPTS", "0", "retry.max_attempts"),
            (
                "DAYLOG__RETRY__MAX_ATTEMPTS",
                "5000000000",
                "retry.max_attempts",
            ),
            (
                "DAYLOG__RETRY__MAX_DELAY_MS",
                "18446744073709551615",
                "retry.max_delay_ms",
            ),
            (
                "DAYLOG__RETRY__REQUEST_TIMEOUT_MS",
                "0",
                "retry.request_timeout_ms",
            ),
            (
                "DAYLOG__RETRY__HEDGE_AFTER_MS",
                "9000000000000",
                "retry.hedge_after_ms",
            ),
            ("DAYLOG__RETRY__DEADLINE_MS", "0", "retry.deadline_ms"),
        ];
        for (var, value, key) in cases {
            assert_eq!(error_key(&[(var, value)]), key, "{var}={value}");
        }
    }

    #[test]
    fn every_other_numeric_setting_is_checked_against_its_range() {
        // (variable, value, key named), as above.
        let cases = [
            (
                "DAYLOG__COOLDOWN__DURATION_MS",
                "9000000000000",
                "cooldown.duration_ms",
            ),
            (
                "DAYLOG__COOLDOWN__FAILURES_TO_TRIP",
                "0",
                "cooldown.failures_to_trip",
            ),
            (
                "DAYLOG__WORKER__POLL_INTERVAL_MS",
                "0",
                "worker.poll_interval_ms",
            ),
            ("DAYLOG__WORKER__RETRY_MIN_MS", "0", "worker.retry_min_ms"),
            (
                "DAYLOG__WORKER__RETRY_MAX_MS",
                "9000000000000",
                "worker.retry_max_ms",
            ),
            (
                "DAYLOG__WORKER__MAX_AGE_HOURS",
                "99999999",
                "worker.max_age_hours",
            ),
            (
                "DAYLOG__TELEGRAM__MAX_TEXT_CHARS",
                "0",
                "telegram.max_text_chars",
            ),
            (
                "DAYLOG__TELEGRAM__SHUTDOWN_GRACE_MS",
                "9000000000000",
                "telegram.shutdown_grace_ms",
            ),
            (
                "DAYLOG__TELEGRAM__ANALYSES_PER_HOUR",
                "-1",
                "telegram.analyses_per_hour",
            ),
            (
                "DAYLOG__PROVIDERS__GROQ__MAX_CONCURRENCY",
                "-1",
                "providers.groq.max_concurrency",
            ),
            (
                "DAYLOG__PROVIDERS__GROQ__MAX_CONCURRENCY",
                "2305843009213693952",
                "providers.groq.max_concurrency",
            ),
            // Too large for any integer type: still named by its key.
            (
                "DAYLOG__STORE__BUSY_TIMEOUT_MS",
                "99999999999999999999",
                "store.busy_timeout_ms",
            ),
            ("DAYLOG__RETRY__MIN_DELAY_MS", "-5", "retry.min_delay_ms"),
            (
                "DAYLOG__REMINDERS__POLL_INTERVAL_MS",
                "99999999999999",
                "reminders.poll_interval_ms",
            ),
            (
                "DAYLOG__BUDGETS__SPILL_AFTER_MS",
                "99999999999999",
                "budgets.spill_after_ms",
            ),
            (
                "DAYLOG__BUDGETS__NOTIFY_AFTER_MS",
                "99999999999999",
                "budgets.notify_after_ms",
            ),
        ];
        for (var, value, key) in cases {
            assert_eq!(error_key(&[(var, value)]), key, "{var}={value}");
        }
        // The edges themselves are accepted.
        for (var, value) in [
            ("DAYLOG__STORE__BUSY_TIMEOUT_MS", "2147483647"),
            ("DAYLOG__STORE__BUSY_TIMEOUT_MS", "0"),
            ("DAYLOG__STORE__MAX_SIZE_MB", "0"),
            ("DAYLOG__RETRY__HEDGE_AFTER_MS", "0"),
            ("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR", "0"),
        ] {
            assert!(load(&[(var, value)]).is_ok(), "{var}={value}");
        }
    }

    #[test]
    fn step_temperature_and_max_tokens_are_checked() {
        let file = write_config(
            "[[analysis.steps]]\nprovider = \"mistral\"\nmodel = \"m\"\ntemperature = 9.5\n",
        );
        let key = error_key(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))]);
        assert_eq!(key, "analysis.steps[0].temperature");
        let file =
            write_config("[[metrics.steps]]\nprovider = \"groq\"\nmodel = \"m\"\nmax_tokens = 0\n");
        let key = error_key(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))]);
        assert_eq!(key, "metrics.steps[0].max_tokens");
        let file = write_config(
            "[[transcription.steps]]\nprovider = \"groq\"\nmodel = \"m\"\ntemperature = -1.0\n",
        );
        let key = error_key(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))]);
        assert_eq!(key, "transcription.steps[0].temperature");
    }

    #[test]
    fn a_number_too_large_in_a_file_names_its_key() {
        let file = write_config("[store]\nbusy_timeout_ms = 99999999999999999999\n");
        let err =
            load(&[(CONFIG_FILE_VAR, file.path().to_str().expect("utf-8"))]).expect_err("refused");
        assert!(err.to_string().contains("busy_timeout_ms"), "{err}");
    }

    #[test]
    fn an_empty_or_in_memory_database_url_is_refused() {
        for url in [
            "sqlite://",
            "sqlite:",
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://data/daylog.db?mode=memory",
            "sqlite://?mode=rwc",
        ] {
            assert_eq!(error_key(&[("DATABASE_URL", url)]), "DATABASE_URL", "{url}");
        }
        let s = load(&[("DATABASE_URL", "sqlite://data/my%20log.db")]).expect("a file");
        assert_eq!(s.database_url, "sqlite://data/my%20log.db");
    }

    #[test]
    fn a_base_url_with_a_query_or_fragment_is_refused() {
        for url in [
            "http://127.0.0.1:9000/v1?key=x",
            "http://127.0.0.1:9000/v1#part",
        ] {
            assert_eq!(
                error_key(&[("DAYLOG__PROVIDERS__MISTRAL__BASE_URL", url)]),
                "providers.mistral.base_url",
                "{url}"
            );
        }
    }

    #[test]
    fn shipped_example_configs_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples");
        for entry in std::fs::read_dir(dir).expect("examples folder") {
            let path = entry.expect("entry").path();
            let s = load(&[(CONFIG_FILE_VAR, path.to_str().expect("utf-8"))]);
            assert!(s.is_ok(), "{}: {:?}", path.display(), s.err());
        }
    }

    #[test]
    fn the_bot_api_url_must_be_http_without_query_or_fragment() {
        for bad in [
            "ftp://api.telegram.org/",
            "file:///tmp/bot",
            "http://127.0.0.1:8081/?x=1",
            "https://api.telegram.org/#top",
            "not a url",
        ] {
            assert_eq!(
                error_key(&[("TELOXIDE_API_URL", bad)]),
                "TELOXIDE_API_URL",
                "{bad}"
            );
        }
        for good in ["http://127.0.0.1:8081/", "https://api.telegram.org"] {
            let s = load(&[("TELOXIDE_API_URL", good)]).expect(good);
            assert!(s.telegram_api_url.is_some(), "{good}");
        }
    }

    #[test]
    fn the_default_grace_ends_before_dockers_stop_timeout() {
        // Docker sends SIGKILL 10 s after SIGTERM; closing the store needs a moment too.
        let s = load(&[]).expect("defaults load");
        assert_eq!(s.telegram.shutdown_grace(), Duration::from_secs(8));
    }
}
