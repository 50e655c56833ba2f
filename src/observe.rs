//! What an operator can watch of a running daylog, in Prometheus's terms (docs/operations.md,
//! Health and metrics): the series' names, one function per event that moves them,
//! and the process's recorder, which `/metrics` renders on request.
//!
//! Not to be confused with the entry metrics (`[[metrics.steps]]`, `analysis::metrics`):
//! this module is about the process. It is on the floor, so the places where things
//! happen (the journal, the cascade, the Messenger, the schedulers) call it directly.
//! Until [`exporter`] installs the recorder (`daylog run` with `http.metrics_listen`),
//! every call here is a no-op of the `metrics` facade. Labels carry names from the
//! configuration and fixed words only: never a user, a chat, a key or any text.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::domain::Outcome;

/// `daylog_build_info{version}`: always 1.
pub const BUILD_INFO: &str = "daylog_build_info";
/// Entries stored, by `kind` (`text`, `voice`, `edit`).
pub const ENTRIES_STORED: &str = "daylog_entries_stored_total";
/// Final answers sent, by `outcome` (`analysed`, `blocked`, `failed`).
pub const ENTRIES_ANSWERED: &str = "daylog_entries_answered_total";
/// Entries given up on (their final answer says so).
pub const ENTRIES_FAILED: &str = "daylog_entries_failed_total";
/// Entries not analysed yet, read from the store at each scrape.
pub const ENTRIES_PENDING: &str = "daylog_entries_pending";
/// From an entry's arrival to its final answer.
pub const ANSWER_SECONDS: &str = "daylog_answer_seconds";
/// LLM attempts by `task`, `provider`, `model` and `outcome` (as `llm_calls.outcome`).
pub const LLM_ATTEMPTS: &str = "daylog_llm_attempts_total";
/// Bot API calls by `method` (as the Bot API spells it) and `status` (`ok`, `gone`,
/// `refused`, `transient`).
pub const TELEGRAM_CALLS: &str = "daylog_telegram_calls_total";
/// 1 while a key of a step is cooling down (skipped), else 0; by `provider`, `model`
/// and `key` (its index, `none` for a provider without keys). Read at each scrape.
pub const LLM_COOLDOWN: &str = "daylog_llm_cooldown";
/// `daylog_llm_budget_left_requests{provider,model,key,window}`: requests a key's
/// budget has left now, `window` "minute" or "day" (only the windows declared).
pub const LLM_BUDGET_LEFT: &str = "daylog_llm_budget_left_requests";
/// Updates received by `kind` (`message`, `edited_message`, `callback_query`, `other`,
/// `invalid`: a dead letter) and `outcome` (`stored`, `duplicate`, `dead_letter`,
/// `not_stored`: the commit failed).
pub const UPDATES_RECEIVED: &str = "daylog_updates_received_total";
/// Inbox rows not handled yet (and not dead), read from the store.
pub const UPDATES_UNHANDLED: &str = "daylog_updates_unhandled";
/// Inbox rows dead: dead letters and updates given up.
pub const UPDATES_DEAD: &str = "daylog_updates_dead";
/// Instances of this database alive (not stopped, heartbeat within `cluster.lease_ms`),
/// as this instance's heartbeat last counted them.
pub const INSTANCES_ALIVE: &str = "daylog_instances_alive";
/// Chats whose lease this instance holds, at its last heartbeat.
pub const CHAT_LEASES_HELD: &str = "daylog_chat_leases_held";
/// A task's work done (`/week`, `/import`: its answer sent) whose update could not be
/// marked handled: its chat was taken over meanwhile, and the new holder may carry the
/// update out a second time.
pub const UPDATES_MARK_FENCED: &str = "daylog_updates_mark_fenced_total";
/// Daily reminders sent.
pub const REMINDERS_SENT: &str = "daylog_reminders_sent_total";
/// Weekly digests delivered.
pub const DIGESTS_SENT: &str = "daylog_digests_sent_total";

/// The buckets of [`ANSWER_SECONDS`]: a second or two when a provider answers at once,
/// minutes behind a budget, hours through an outage.
const ANSWER_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
];

/// What was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Text,
    Voice,
    Edit,
}

impl EntryKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Voice => "voice",
            Self::Edit => "edit",
        }
    }
}

/// An entry stored (a new row, or an edit of one).
pub fn entry_stored(kind: EntryKind) {
    metrics::counter!(ENTRIES_STORED, "kind" => kind.as_str()).increment(1);
}

/// An entry's final answer went out, `waited` after the entry arrived.
pub fn entry_answered(outcome: &Outcome, waited: Duration) {
    let label = match outcome {
        Outcome::Analysed { .. } => "analysed",
        Outcome::Blocked { .. } => "blocked",
        Outcome::Failed(_) => "failed",
        // Not a final answer; never called with one.
        Outcome::Waiting { .. } => return,
    };
    metrics::counter!(ENTRIES_ANSWERED, "outcome" => label).increment(1);
    if matches!(outcome, Outcome::Failed(_)) {
        metrics::counter!(ENTRIES_FAILED).increment(1);
    }
    metrics::histogram!(ANSWER_SECONDS).record(waited.as_secs_f64());
}

/// One Bot API call and how it ended.
pub fn telegram_call(method: &'static str, status: &'static str) {
    metrics::counter!(TELEGRAM_CALLS, "method" => method, "status" => status).increment(1);
}

/// One LLM attempt and its outcome (as `llm_calls.outcome` spells it).
pub fn llm_attempt(task: &'static str, provider: &str, model: &str, outcome: &'static str) {
    let labels = [
        ("task", task.to_owned()),
        ("provider", provider.to_owned()),
        ("model", model.to_owned()),
        ("outcome", outcome.to_owned()),
    ];
    metrics::counter!(LLM_ATTEMPTS, &labels).increment(1);
}

/// An update given to the inbox, and what became of it.
pub fn update_received(kind: &'static str, outcome: &'static str) {
    metrics::counter!(UPDATES_RECEIVED, "kind" => kind, "outcome" => outcome).increment(1);
}

/// The inbox's rows waiting and dead (set by the inbox's loop and before each render).
pub fn inbox_rows(unhandled: u64, dead: u64) {
    #[expect(clippy::cast_precision_loss, reason = "counts of rows, far below 2^52")]
    {
        metrics::gauge!(UPDATES_UNHANDLED).set(unhandled as f64);
        metrics::gauge!(UPDATES_DEAD).set(dead as f64);
    }
}

/// What a heartbeat found: instances alive, and chats this one holds.
pub fn cluster_seen(alive: u64, leases_held: usize) {
    #[expect(clippy::cast_precision_loss, reason = "small counts, far below 2^52")]
    {
        metrics::gauge!(INSTANCES_ALIVE).set(alive as f64);
        metrics::gauge!(CHAT_LEASES_HELD).set(leases_held as f64);
    }
}

/// A daily reminder sent.
pub fn reminder_sent() {
    metrics::counter!(REMINDERS_SENT).increment(1);
}

/// A weekly digest delivered.
pub fn digest_sent() {
    metrics::counter!(DIGESTS_SENT).increment(1);
}

/// A task's update not marked handled after its work was done: its chat's lease had
/// been taken over.
pub fn update_mark_fenced() {
    metrics::counter!(UPDATES_MARK_FENCED).increment(1);
}

/// The number of entries not analysed yet (set before each render).
pub fn entries_pending(count: u64) {
    #[expect(
        clippy::cast_precision_loss,
        reason = "a count of rows, far below 2^52"
    )]
    metrics::gauge!(ENTRIES_PENDING).set(count as f64);
}

/// Whether a key of a step cools now (set before each render).
pub fn llm_cooling(provider: &str, model: &str, key: Option<usize>, cooling: bool) {
    let key = key.map_or_else(|| "none".to_owned(), |index| index.to_string());
    let labels = [
        ("provider", provider.to_owned()),
        ("model", model.to_owned()),
        ("key", key),
    ];
    metrics::gauge!(LLM_COOLDOWN, &labels).set(if cooling { 1.0 } else { 0.0 });
}

/// What a key's budget has left now, in requests, per declared window: this minute and
/// today (set before each render).
pub fn llm_budget_left(
    provider: &str,
    model: &str,
    key: Option<usize>,
    minute: Option<u64>,
    day: Option<u64>,
) {
    let key = key.map_or_else(|| "none".to_owned(), |index| index.to_string());
    for (window, left) in [("minute", minute), ("day", day)] {
        let Some(left) = left else { continue };
        let labels = [
            ("provider", provider.to_owned()),
            ("model", model.to_owned()),
            ("key", key.clone()),
            ("window", window.to_owned()),
        ];
        #[expect(
            clippy::cast_precision_loss,
            reason = "a count of requests, far below 2^52"
        )]
        metrics::gauge!(LLM_BUDGET_LEFT, &labels).set(left as f64);
    }
}

/// The process's Prometheus recorder, installed on the first call (the `metrics`
/// recorder is process-global: once per process). `None` when another recorder was
/// installed first, which only an embedding program could do.
pub fn exporter() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(ANSWER_SECONDS.to_owned()), ANSWER_BUCKETS)
                .ok()?;
            let handle = match builder.install_recorder() {
                Ok(handle) => handle,
                Err(error) => {
                    tracing::warn!(%error, "cannot install the Prometheus recorder; /metrics stays empty");
                    return None;
                }
            };
            describe();
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            Some(handle)
        })
        .as_ref()
}

/// The `# HELP` line of each series.
fn describe() {
    metrics::describe_gauge!(BUILD_INFO, "The running build; always 1.");
    metrics::describe_counter!(ENTRIES_STORED, "Entries stored, by kind.");
    metrics::describe_counter!(ENTRIES_ANSWERED, "Final answers sent, by outcome.");
    metrics::describe_counter!(ENTRIES_FAILED, "Entries given up on.");
    metrics::describe_gauge!(ENTRIES_PENDING, "Entries not analysed yet.");
    metrics::describe_histogram!(
        ANSWER_SECONDS,
        metrics::Unit::Seconds,
        "From an entry's arrival to its final answer."
    );
    metrics::describe_counter!(
        LLM_ATTEMPTS,
        "LLM attempts by task, provider, model and outcome."
    );
    metrics::describe_gauge!(
        LLM_COOLDOWN,
        "1 while a key of a step cools down, by provider, model and key index."
    );
    metrics::describe_counter!(TELEGRAM_CALLS, "Bot API calls by method and status.");
    metrics::describe_counter!(
        UPDATES_RECEIVED,
        "Updates given to the inbox, by kind and outcome."
    );
    metrics::describe_gauge!(UPDATES_UNHANDLED, "Inbox rows not handled yet.");
    metrics::describe_gauge!(
        UPDATES_DEAD,
        "Inbox rows dead (dead letters, updates given up)."
    );
    metrics::describe_gauge!(
        INSTANCES_ALIVE,
        "Instances of this database alive (heartbeat within cluster.lease_ms)."
    );
    metrics::describe_gauge!(CHAT_LEASES_HELD, "Chats whose lease this instance holds.");
    metrics::describe_counter!(
        UPDATES_MARK_FENCED,
        "Slow commands done whose update could not be marked: their chat was taken over."
    );
    metrics::describe_counter!(REMINDERS_SENT, "Daily reminders sent.");
    metrics::describe_counter!(DIGESTS_SENT, "Weekly digests delivered.");
}

/// The Prometheus text of every series, after the recorder's upkeep (histograms'
/// buckets drained).
pub fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}
