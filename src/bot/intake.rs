//! Long polling into the inbox: a batch of `getUpdates` is committed to the `updates`
//! table first, and only then confirmed to Telegram (the next `getUpdates` asks from
//! the update after the batch's last). Telegram forgets an update for good once an
//! offset above it was sent, so an update is never confirmed while it is only in
//! memory: a crash before the commit gets the batch again at the next start, and a
//! commit that fails (a full disk) is tried again with backoff, asking again from the
//! same offset, while the user is told once that the message is not saved yet (see
//! [`Inbox::receive_batch`]). Handling is the inbox's, not this loop's.
//!
//! `getUpdates` is called here with the Bot API client directly, not through teloxide,
//! because the inbox keeps each update's JSON as Telegram sent it; teloxide's parsed
//! `Update` cannot give back what it could not read.

use std::time::Duration;

use reqwest::Url;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::Inbox;

/// Telegram's own long-polling timeout of `getUpdates` (below the Bot API client's
/// longest silence, 17 s).
pub const POLL_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest pause after failed polls or commits (1 s, doubling).
const MAX_BACKOFF: Duration = Duration::from_secs(32);

/// What polling asks Telegram for: what the handler tree answers.
const ALLOWED_UPDATES: [&str; 3] = ["callback_query", "edited_message", "message"];

/// How long the last confirmation at a stop may take.
const CONFIRM_AT_STOP: Duration = Duration::from_secs(2);

/// Where `getUpdates` goes: `{TELOXIDE_API_URL}/bot<token>/GetUpdates`. Never shown: it
/// carries the token.
#[derive(Clone)]
pub struct Poller {
    client: reqwest::Client,
    url: Url,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Poller { .. }")
    }
}

/// A Bot API answer to `getUpdates`: each update kept as the text Telegram sent, which
/// the inbox stores and parses once.
#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    result: Vec<Box<RawValue>>,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    parameters: Option<Parameters>,
}

#[derive(Deserialize)]
struct Parameters {
    #[serde(default)]
    retry_after: Option<u64>,
}

/// Why a poll failed, as far as pacing goes.
#[derive(Debug)]
enum PollError {
    /// Another program polls with this token (409).
    Conflict,
    /// Telegram asked to wait this long (429).
    RetryAfter(Duration),
    /// Anything else: the network, a 5xx, a body that is not the Bot API's.
    Other(String),
}

impl Poller {
    /// `api_url`: `TELOXIDE_API_URL`, or Telegram's own when `None`.
    pub fn new(
        client: reqwest::Client,
        api_url: Option<&Url>,
        token: &str,
    ) -> anyhow::Result<Self> {
        let base = match api_url {
            Some(url) => url.clone(),
            None => Url::parse("https://api.telegram.org")?,
        };
        // Below the API URL's own path, as teloxide builds it (not `Url::join`, which
        // would read the token's `123:` as a scheme). The method as teloxide spells it.
        let url = Url::parse(&format!(
            "{}/bot{token}/GetUpdates",
            base.as_str().trim_end_matches('/')
        ))
        .map_err(|_| anyhow::anyhow!("TELOXIDE_API_URL cannot take a method path"))?;
        Ok(Self { client, url })
    }

    async fn get_updates(
        &self,
        offset: Option<i64>,
        timeout: Duration,
        limit: Option<u8>,
    ) -> Result<Vec<Box<RawValue>>, PollError> {
        let mut body = serde_json::json!({
            "timeout": timeout.as_secs(),
            "allowed_updates": ALLOWED_UPDATES,
        });
        if let Some(offset) = offset {
            body["offset"] = offset.into();
        }
        if let Some(limit) = limit {
            body["limit"] = limit.into();
        }
        let sent = self.client.post(self.url.clone()).json(&body).send().await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                crate::observe::telegram_call("getUpdates", "network");
                return Err(PollError::Other(error.without_url().to_string()));
            }
        };
        let status = response.status();
        let answer = match response.json::<Answer>().await {
            Ok(answer) => answer,
            Err(error) => {
                crate::observe::telegram_call("getUpdates", "error");
                return Err(PollError::Other(format!(
                    "{status}: {}",
                    error.without_url()
                )));
            }
        };
        if answer.ok {
            crate::observe::telegram_call("getUpdates", "ok");
            return Ok(answer.result);
        }
        let retry_after = answer.parameters.and_then(|p| p.retry_after);
        match (answer.error_code.unwrap_or(status.as_u16()), retry_after) {
            (409, _) => {
                crate::observe::telegram_call("getUpdates", "api_error");
                Err(PollError::Conflict)
            }
            (_, Some(seconds)) => {
                crate::observe::telegram_call("getUpdates", "retry_after");
                Err(PollError::RetryAfter(Duration::from_secs(seconds)))
            }
            (code, None) => {
                crate::observe::telegram_call("getUpdates", "api_error");
                Err(PollError::Other(format!("Telegram answered {code}")))
            }
        }
    }

    /// Polls until `stop`, committing each batch to `inbox` before it is confirmed. At
    /// the stop, what was committed is confirmed with one last short call.
    pub async fn run(&self, inbox: &Inbox, stop: &CancellationToken) {
        let mut offset: Option<i64> = None;
        let mut failures: u32 = 0;
        loop {
            let polled = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                polled = self.get_updates(offset, POLL_TIMEOUT, None) => polled,
            };
            let pause = match polled {
                Ok(batch) if batch.is_empty() => None,
                Ok(batch) => match self.commit(inbox, &batch).await {
                    Some(next) => {
                        offset = Some(next.max(offset.unwrap_or(0)));
                        None
                    }
                    None => Some(backoff(failures)),
                },
                Err(error) => Some(polling_failed(error, failures)),
            };
            match pause {
                None => failures = 0,
                Some(pause) => {
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
        self.confirm_at_stop(offset).await;
    }

    /// Commits a batch; the offset that confirms it, or `None` when the commit failed
    /// (the batch is asked for again, from the same offset).
    async fn commit(&self, inbox: &Inbox, batch: &[Box<RawValue>]) -> Option<i64> {
        let bodies: Vec<&[u8]> = batch.iter().map(|update| update.get().as_bytes()).collect();
        match inbox.receive_batch(&bodies).await {
            Ok(_) => batch
                .iter()
                .filter_map(|update| update_id(update))
                .max()
                .map(|last| last + 1),
            Err(_) => None, // logged and counted by the inbox; the user told once
        }
    }

    /// Confirms what was committed, so that the next start is not given it again (it
    /// would only be a duplicate, but a slower start).
    async fn confirm_at_stop(&self, offset: Option<i64>) {
        let Some(offset) = offset else {
            return;
        };
        let confirm = self.get_updates(Some(offset), Duration::ZERO, Some(1));
        match tokio::time::timeout(CONFIRM_AT_STOP, confirm).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(
                    ?error,
                    "the last updates could not be confirmed at the stop"
                );
            }
            Err(_) => tracing::debug!("confirming the last updates at the stop timed out"),
        }
    }
}

/// An update's `update_id`, if it has a numeric one (the rest of it is skipped, not
/// read into values).
fn update_id(update: &RawValue) -> Option<i64> {
    #[derive(Deserialize)]
    struct Id {
        update_id: Option<i64>,
    }
    serde_json::from_str::<Id>(update.get()).ok()?.update_id
}

fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.min(5)).min(MAX_BACKOFF)
}

/// A failed `getUpdates`, said as a sentence where the operator has something to do,
/// and the pause before the next. Telegram answers 409 while another program polls
/// with the same token — a second daylog left running, the same bot started elsewhere,
/// or a webhook set — and hands each update to one of them only.
fn polling_failed(error: PollError, failures: u32) -> Duration {
    /// The two pollers take turns, so this one fails every second or two for as long
    /// as the other runs: the sentence is said once a minute, the rest at debug.
    static SAID_AT: std::sync::Mutex<Option<tokio::time::Instant>> = std::sync::Mutex::new(None);
    match error {
        PollError::Conflict => {
            let now = tokio::time::Instant::now();
            let mut said_at = SAID_AT
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if said_at.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60)) {
                *said_at = Some(now);
                tracing::error!(
                    "another program is polling Telegram with this TELOXIDE_TOKEN (a second daylog, or the same bot started elsewhere): Telegram gives each update to only one of them; stop the other one"
                );
            } else {
                tracing::debug!("getUpdates: 409, another poller with this token");
            }
            backoff(failures)
        }
        PollError::RetryAfter(wait) => {
            tracing::warn!(wait_s = wait.as_secs(), "Telegram asked to poll later");
            wait
        }
        PollError::Other(reason) => {
            tracing::error!(%reason, "polling Telegram failed; retrying");
            backoff(failures)
        }
    }
}
