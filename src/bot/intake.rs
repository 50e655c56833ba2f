//! Long polling that confirms an update to Telegram only once the bot has taken it.
//!
//! Telegram forgets an update for good as soon as `getUpdates` is called with an offset
//! above it. teloxide's own polling asks for the next batch as soon as the last one is
//! handed to the dispatcher — before its handlers have stored its entries — so a crash
//! in those milliseconds lost them (the kill -9 fault tests found it). This listener
//! sends the request that confirms a batch only when every update of it is *taken*: its
//! [`Ticket`] dropped (its handler ended) or [`Ticket::taken`] called (an entry once it
//! is stored; any other at its start).
//!
//! A chat's update can also wait behind that chat's own handler (a Telegram send held
//! by a 429). Such an update must not hold back every other chat, nor be confirmed
//! while it is only in memory: after [`CONFIRM_WAIT`] the listener *holds* — it asks
//! Telegram for the updates from the lowest one not taken on, so nothing from there is
//! confirmed, hands on only the updates it has not handed before, and polls again
//! every [`HOLD_POLL`]. Only an update still not taken after [`HOLD_MAX`] (a handler
//! that hangs), or the lowest one held when a whole batch of updates handed before
//! comes back, is confirmed anyway, with a warning; the others stay held. The slow
//! handlers (an analysis, `/week`, an import) hand their work to tasks, so none of this
//! happens in their shadow.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use teloxide::RequestError;
use teloxide::payloads::GetUpdatesSetters as _;
use teloxide::requests::Request as _;
use teloxide::stop::{StopFlag, StopToken, mk_stop_token};
use teloxide::types::{AllowedUpdate, Update, UpdateKind};
use teloxide::update_listeners::{AsUpdateStream, UpdateListener};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::TgBot;

/// How long a batch's confirmation waits for its updates to be taken.
pub const CONFIRM_WAIT: Duration = Duration::from_secs(2);

/// How often the listener asks for new updates while it holds one not taken: every
/// poll then answers at once (with the held update), so it is paced by hand.
pub const HOLD_POLL: Duration = Duration::from_millis(500);

/// How long an update not taken is held before it is confirmed anyway.
pub const HOLD_MAX: Duration = Duration::from_secs(60);

/// Telegram's most updates in one `getUpdates` (its default `limit`).
const BATCH_MAX: usize = 100;

/// The longest pause after failed polls (1 s, doubling).
const MAX_BACKOFF: Duration = Duration::from_secs(32);

/// The updates handed to the dispatcher and not yet taken.
#[derive(Clone, Default)]
pub struct Intake(Arc<Shared>);

#[derive(Default)]
struct Shared {
    /// Update id → when it was handed out.
    open: Mutex<HashMap<u32, Instant>>,
    changed: Notify,
}

impl Intake {
    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Instant>> {
        self.0.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn handed(&self, update: &Update) {
        // teloxide drops what it cannot parse before any handler, so no ticket comes.
        if !matches!(update.kind, UpdateKind::Error(_)) {
            self.open().insert(update.id.0, Instant::now());
        }
    }

    /// The ticket of an update the dispatcher is handling.
    pub fn ticket(&self, update: &Update) -> Ticket {
        Ticket(Arc::new(Held {
            id: update.id.0,
            intake: self.clone(),
        }))
    }

    fn take(&self, id: u32) {
        if self.open().remove(&id).is_some() {
            self.0.changed.notify_waiters();
        }
    }

    /// Forgets the updates not taken that `gone` picks: they are being confirmed
    /// anyway, and must not hold back the polls after them too. The others stay held.
    fn give_up(&self, gone: impl Fn(u32, Instant) -> bool) {
        self.open().retain(|id, at| !gone(*id, *at));
    }

    /// The lowest update handed out and not taken, and when it was handed out.
    fn lowest_open(&self) -> Option<(u32, Instant)> {
        self.open()
            .iter()
            .min_by_key(|(id, _)| **id)
            .map(|(id, at)| (*id, *at))
    }

    /// Waits until every update handed out has been taken — `true` — or has waited
    /// `within` since it was handed out (`false`: the rest are held).
    async fn settled(&self, within: Duration) -> bool {
        loop {
            let changed = self.0.changed.notified();
            let Some(newest) = self.open().values().max().copied() else {
                return true;
            };
            if tokio::time::timeout_at(newest + within, changed)
                .await
                .is_err()
            {
                return self.open().is_empty();
            }
        }
    }

    /// Resolves at the next update taken.
    async fn next_taken(&self) {
        self.0.changed.notified().await;
    }

    /// Updates handed out and not taken.
    fn pending(&self) -> usize {
        self.open().len()
    }
}

/// An update's hold on its batch's confirmation, released when the last clone drops
/// (the dispatcher drops its handler's dependencies when the handler ends) or by
/// [`Ticket::taken`].
#[derive(Clone)]
pub struct Ticket(Arc<Held>);

struct Held {
    id: u32,
    intake: Intake,
}

impl Ticket {
    /// The update is safe with the bot (stored, or nothing to store): Telegram may
    /// forget it.
    pub fn taken(&self) {
        self.0.intake.take(self.0.id);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.intake.take(self.id);
    }
}

/// The long-polling listener; `poll_timeout` is `getUpdates`' own (whole seconds).
pub struct Listener<B> {
    bot: B,
    intake: Intake,
    poll_timeout: Duration,
    allowed: Option<Vec<AllowedUpdate>>,
    token: StopToken,
    flag: StopFlag,
}

impl<B: TgBot> Listener<B> {
    pub fn new(bot: B, intake: Intake, poll_timeout: Duration) -> Self {
        let (token, flag) = mk_stop_token();
        Self {
            bot,
            intake,
            poll_timeout,
            allowed: None,
            token,
            flag,
        }
    }
}

impl<B: TgBot> UpdateListener for Listener<B> {
    type Err = RequestError;

    fn stop_token(&mut self) -> StopToken {
        self.token.clone()
    }

    fn hint_allowed_updates(&mut self, hint: &mut dyn Iterator<Item = AllowedUpdate>) {
        self.allowed = Some(hint.collect());
    }
}

impl<'a, B: TgBot> AsUpdateStream<'a> for Listener<B> {
    type StreamErr = RequestError;
    type Stream = BoxStream<'a, Result<Update, RequestError>>;

    fn as_stream(&'a mut self) -> Self::Stream {
        let polling = Polling {
            bot: self.bot.clone(),
            intake: self.intake.clone(),
            poll_timeout: u32::try_from(self.poll_timeout.as_secs()).unwrap_or(u32::MAX),
            allowed: self.allowed.clone(),
            flag: self.flag.clone(),
            offset: None,
            idle_hold: false,
            failures: 0,
            ended: false,
        };
        futures::stream::unfold(polling, Polling::next_batch)
            .flat_map(futures::stream::iter)
            .boxed()
    }
}

struct Polling<B> {
    bot: B,
    intake: Intake,
    poll_timeout: u32,
    allowed: Option<Vec<AllowedUpdate>>,
    flag: StopFlag,
    /// The offset that confirms the last batch — the update after the last one
    /// handed out; `None` before the first.
    offset: Option<i32>,
    /// The last poll held an update not taken and brought nothing new.
    idle_hold: bool,
    failures: u32,
    ended: bool,
}

type Batch = Vec<Result<Update, RequestError>>;

impl<B: TgBot> Polling<B> {
    async fn next_batch(mut self) -> Option<(Batch, Self)> {
        if self.ended {
            return None;
        }
        // The request below confirms the last batch: its updates must be taken first.
        let stopping = tokio::select! {
            biased;
            () = self.flag.clone() => true,
            () = self.pace() => false,
        };
        if stopping {
            self.confirm_and_end().await;
            return None;
        }
        let held = self.held_offset();
        let mut request = self.bot.get_updates().timeout(self.poll_timeout);
        if let Some(offset) = held.or(self.offset) {
            request = request.offset(offset);
        }
        if let Some(allowed) = self.allowed.clone() {
            request = request.allowed_updates(allowed);
        }
        let answer = tokio::select! {
            biased;
            () = self.flag.clone() => {
                self.confirm_and_end().await;
                return None;
            }
            answer = request.send() => answer,
        };
        match answer {
            Ok(mut updates) => {
                self.failures = 0;
                if held.is_some() {
                    self.drop_handed(&mut updates);
                } else {
                    self.idle_hold = false;
                }
                if let Some(last) = updates.last() {
                    self.offset = Some(last.id.as_offset());
                }
                for update in &updates {
                    self.intake.handed(update);
                }
                Some((updates.into_iter().map(Ok).collect(), self))
            }
            Err(error) => {
                let pause = match &error {
                    RequestError::RetryAfter(seconds) => seconds.duration(),
                    _ => Duration::from_secs(1 << self.failures.min(5)).min(MAX_BACKOFF),
                };
                self.failures = self.failures.saturating_add(1);
                tokio::select! {
                    () = self.flag.clone() => self.confirm_and_end().await,
                    () = tokio::time::sleep(pause) => {}
                }
                Some((vec![Err(error)], self))
            }
        }
    }

    /// Waits until the next poll may go: the updates handed out are taken or have
    /// waited [`CONFIRM_WAIT`]; while one is held and the last poll brought nothing
    /// new, also [`HOLD_POLL`] (or until an update is taken).
    async fn pace(&self) {
        if self.idle_hold {
            tokio::select! {
                () = tokio::time::sleep(HOLD_POLL) => {}
                () = self.intake.next_taken() => {}
            }
        }
        self.intake.settled(CONFIRM_WAIT).await;
    }

    /// The offset that confirms only the updates below the lowest one not taken, while
    /// one is held; `None` when everything handed out is taken (or given up on).
    fn held_offset(&mut self) -> Option<i32> {
        let (_, handed_at) = self.intake.lowest_open()?;
        if handed_at.elapsed() >= HOLD_MAX {
            self.intake.give_up(|_, at| at.elapsed() >= HOLD_MAX);
            tracing::warn!(
                still_held = self.intake.pending(),
                held_s = HOLD_MAX.as_secs(),
                "updates not taken for too long are confirmed to Telegram anyway"
            );
            self.idle_hold = false;
        }
        let (lowest, _) = self.intake.lowest_open()?;
        if !self.idle_hold {
            tracing::debug!(
                untaken = self.intake.pending(),
                "updates not taken yet: holding them, asking for the rest"
            );
        }
        i32::try_from(lowest).ok()
    }

    /// Leaves out of a held poll's answer the updates handed out before. A hold whose
    /// whole answer is such updates could never see a new one: it gives up instead.
    fn drop_handed(&mut self, updates: &mut Vec<Update>) {
        let Some(next) = self.offset else {
            return;
        };
        let full = updates.len() >= BATCH_MAX;
        updates.retain(|update| update.id.as_offset() > next);
        self.idle_hold = updates.is_empty();
        if self.idle_hold
            && full
            && let Some((lowest, _)) = self.intake.lowest_open()
        {
            // Only the lowest: the next poll holds from the one after it.
            self.intake.give_up(|id, _| id == lowest);
            tracing::warn!(
                update_id = lowest,
                still_held = self.intake.pending(),
                "a full batch behind an update not taken: it is confirmed to Telegram anyway"
            );
            self.idle_hold = false;
        }
    }

    /// At a stop: once what was handed out is taken (or the wait is over), tells
    /// Telegram so, so that the next start is not given it again — except what is still
    /// not taken, from the lowest such update on: the next start gets it again (a
    /// stored entry again is a no-op; a command may run twice).
    async fn confirm_and_end(&mut self) {
        self.ended = true;
        let Some(mut offset) = self.offset else {
            return;
        };
        if !self.intake.settled(CONFIRM_WAIT).await
            && let Some((lowest, _)) = self.intake.lowest_open()
        {
            tracing::warn!(
                untaken = self.intake.pending(),
                "stopping with updates not taken; the next start is given them again"
            );
            offset = i32::try_from(lowest).unwrap_or(offset);
        }
        let confirm = self
            .bot
            .get_updates()
            .offset(offset)
            .limit(1)
            .timeout(0)
            .send();
        match tokio::time::timeout(CONFIRM_WAIT, confirm).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(%error, "the last updates could not be confirmed at the stop");
            }
            Err(_) => tracing::debug!("confirming the last updates at the stop timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(id: u32) -> Update {
        let json = serde_json::json!({"update_id": id, "message": {
            "message_id": 1, "date": 1_764_460_800_i64, "chat": {"id": 1, "type": "private", "first_name": "a"},
            "from": {"id": 1, "is_bot": false, "first_name": "a"}, "text": "hi"}});
        let update: Update = serde_json::from_str(&json.to_string()).expect("an update");
        assert!(
            !matches!(update.kind, UpdateKind::Error(_)),
            "{:?}",
            update.kind
        );
        update
    }

    #[tokio::test]
    async fn a_batch_is_settled_when_every_ticket_is_taken_or_dropped() {
        let intake = Intake::default();
        let (first, second) = (update(1), update(2));
        intake.handed(&first);
        intake.handed(&second);
        let stored = intake.ticket(&first);
        let handled = intake.ticket(&second);
        let clone = handled.clone();
        assert!(!intake.settled(Duration::from_millis(10)).await);

        stored.taken();
        drop(handled);
        assert!(
            !intake.settled(Duration::from_millis(10)).await,
            "a clone still holds it"
        );
        drop(clone);
        assert!(intake.settled(Duration::from_millis(10)).await);
        drop(stored);
        assert_eq!(intake.pending(), 0);
    }

    #[tokio::test]
    async fn what_a_timed_out_wait_confirms_holds_back_no_later_batch() {
        let intake = Intake::default();
        let (stuck, later) = (update(3), update(5));
        intake.handed(&stuck);
        intake.handed(&later);
        let _stuck = intake.ticket(&stuck); // behind its chat's slow handler
        assert_eq!(
            intake.lowest_open().map(|(id, _)| id),
            Some(3),
            "a stop confirms below it only"
        );
        assert!(!intake.settled(Duration::from_millis(10)).await);
        intake.give_up(|id, _| id == 3);
        assert_eq!(
            intake.lowest_open().map(|(id, _)| id),
            Some(5),
            "only the one given up on is let go"
        );
        intake.give_up(|_, _| true);
        assert!(intake.settled(Duration::from_millis(10)).await);
    }

    #[tokio::test]
    async fn a_wait_ends_as_soon_as_the_last_is_taken() {
        let intake = Intake::default();
        let first = update(7);
        intake.handed(&first);
        let ticket = intake.ticket(&first);
        let waiting = tokio::spawn({
            let intake = intake.clone();
            async move { intake.settled(Duration::from_secs(30)).await }
        });
        tokio::task::yield_now().await;
        ticket.taken();
        assert!(waiting.await.expect("the wait"));
    }
}
