//! The handling loop: reads the inbox's rows not handled and not dead, and hands each
//! update to the handler tree — a chat's updates one after another in `update_id`
//! order, different chats at once (at most [`MAX_LANES`]).
//!
//! An update is *handled* once its handler returned `Ok` (the loop sets `handled_at`),
//! unless the handler set it itself earlier (an entry: in the transaction that stores
//! it) or handed it to a task of its own with [`Taking::defer`] (`/week`, an import:
//! handled once that task is done; the chat's next updates go on meanwhile). A handler
//! that fails (an error, a panic) has its update tried again on the worker's backoff,
//! its chat waiting; after [`UPDATE_MAX_FAILURES`] failures the update is dead and the
//! chat moves on. Nothing here is in memory only: a crash leaves unhandled rows, which
//! the next start handles.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use teloxide::types::Update;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Inbox, NoticeKind, not_saved};
use crate::store::{InboxUpdate, UPDATE_MAX_FAILURES, UpdateFailure, UpdateKey};

/// Chats handled at the same time.
pub const MAX_LANES: usize = 64;

/// Rows read per pass of the loop: at most [`FETCH_PER_CHAT`] of each chat.
const FETCH_MAX: i64 = 5000;
const FETCH_PER_CHAT: i64 = 8;

/// The most `done` rows whose mark is tried again per pass of the loop.
const REMARK_MAX: usize = 64;

/// The longest the loop sleeps without being woken (a retry falls due, a lost wake-up).
const IDLE: Duration = Duration::from_secs(5);

/// How the loop hands an update to the handler tree.
pub type Handle =
    Arc<dyn Fn(Update, Taking) -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// The loop's memory: which lanes run, which updates a task took over, and which must
/// wait before they are tried again (also when their failure could not be recorded).
#[derive(Default)]
pub(in crate::bot) struct Lanes {
    busy: HashSet<Lane>,
    deferred: HashSet<i64>,
    not_before: HashMap<i64, tokio::time::Instant>,
    /// Tries of updates that could not be stored (a full disk), which never count
    /// toward `dead`: the user was told they will be taken.
    unstored: HashMap<i64, i64>,
    /// Updates handled whose `handled_at` could not be written: not handed over again
    /// by this process, and marked on a later pass of the loop (a crash before that:
    /// the next start may handle one again, the window of a reply sent and not
    /// recorded).
    done: HashSet<i64>,
}

/// What goes in order: a chat's updates; an update with no chat goes alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Lane {
    Chat(i64),
    Alone(i64),
}

/// The update a handler is given, and what it may do about when it counts as handled.
#[derive(Clone)]
pub struct Taking {
    key: UpdateKey,
    inbox: Inbox,
    deferred: Arc<AtomicBool>,
    /// The handler's store write set `handled_at` itself (an entry stored).
    marked: Arc<AtomicBool>,
    /// The failures recorded so far, and the backoff after the next one (a deferred
    /// task that fails records its failure itself).
    failures: i64,
    backoff: Backoff,
}

impl Taking {
    /// The update's key in the inbox, for a store write that marks it handled in its
    /// own transaction.
    pub fn key(&self) -> UpdateKey {
        self.key
    }

    /// The store write that took the update marked it handled in its transaction (an
    /// entry stored with [`Taking::key`]): the loop need not mark it again.
    pub fn marked_by_store(&self) {
        self.marked.store(true, Ordering::SeqCst);
    }

    /// Hands the update to a task of its own: it is handled when [`Deferred::handled`]
    /// is called; dropped without, it is tried again. The chat's next updates go on.
    pub fn defer(&self) -> Deferred {
        self.deferred.store(true, Ordering::SeqCst);
        self.inbox.lanes().deferred.insert(self.key.update_id);
        Deferred {
            key: self.key,
            inbox: self.inbox.clone(),
            done: false,
            failures: self.failures,
            backoff: self.backoff,
        }
    }

    #[cfg(test)]
    pub(in crate::bot) fn for_test(inbox: &Inbox, update_id: i64, failures: i64) -> Self {
        Self {
            key: UpdateKey {
                bot_id: inbox.bot_id(),
                update_id,
            },
            inbox: inbox.clone(),
            deferred: Arc::new(AtomicBool::new(false)),
            marked: Arc::new(AtomicBool::new(false)),
            failures,
            backoff: Backoff {
                min: Duration::from_secs(30),
                max: Duration::from_secs(600),
            },
        }
    }
}

/// An update a task took over (see [`Taking::defer`]).
pub struct Deferred {
    key: UpdateKey,
    inbox: Inbox,
    done: bool,
    failures: i64,
    backoff: Backoff,
}

impl Deferred {
    /// The task's work committed (or it told the user why not): the update is handled.
    pub async fn handled(mut self) {
        self.done = true;
        if let Err(error) = self.inbox.store().mark_update_handled(self.key).await {
            // Its work is done (its reply sent): kept out of the loop's hands, or the
            // release below would hand it over again at once.
            tracing::error!(%error, update_id = self.key.update_id, "an update could not be marked handled; it is not handled again by this process");
            self.inbox.lanes().done.insert(self.key.update_id);
        }
        self.release();
    }

    /// The task failed (it panicked): a failure is recorded and the update tried again
    /// on the backoff — dead after [`UPDATE_MAX_FAILURES`], as a handler's failure.
    pub async fn failed(mut self, why: &str) {
        self.done = true;
        let wait = self.backoff.after(self.failures.saturating_add(1));
        self.inbox.retry_later(self.key.update_id, wait);
        let next_try_at = jiff::Timestamp::now()
            + jiff::SignedDuration::try_from(wait).unwrap_or(jiff::SignedDuration::ZERO);
        match self
            .inbox
            .store()
            .record_update_failure(self.key, why, next_try_at)
            .await
        {
            Ok(UpdateFailure::Dead) => {
                self.inbox.lanes().not_before.remove(&self.key.update_id);
            }
            Ok(UpdateFailure::Retry(failures)) => {
                tracing::warn!(
                    update_id = self.key.update_id,
                    failures,
                    retry_in_ms = wait.as_millis() as u64,
                    why,
                    "a task failed; its update is tried again"
                );
            }
            Err(error) => {
                tracing::warn!(%error, update_id = self.key.update_id, "cannot record an update's failure; it is tried again later");
            }
        }
        self.release();
    }

    fn release(&self) {
        self.inbox.lanes().deferred.remove(&self.key.update_id);
        self.inbox.wake();
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if !self.done {
            tracing::warn!(
                update_id = self.key.update_id,
                "a task ended without handling its update; it is tried again"
            );
            // Not at once: whatever ended the task may end the next try too.
            let wait = self.backoff.after(self.failures.saturating_add(1));
            self.inbox.retry_later(self.key.update_id, wait);
            self.release();
        }
    }
}

/// The worker's backoff: `min` after the first failure, doubling, at most `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Backoff {
    fn after(self, failures: i64) -> Duration {
        let doublings = u32::try_from(failures.saturating_sub(1).clamp(0, 20)).unwrap_or(20);
        self.min.saturating_mul(1 << doublings).min(self.max)
    }
}

impl Inbox {
    pub(in crate::bot) fn lanes(&self) -> std::sync::MutexGuard<'_, Lanes> {
        self.0
            .lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Handles the inbox until `stop`: at once what is waiting (what a crash left), then
    /// each update as it is stored. Returns when stopped; lanes still running finish
    /// their current update in `tasks` (the caller waits for them, within its grace).
    pub async fn handle_until(
        self,
        handle: Handle,
        backoff: Backoff,
        tasks: TaskTracker,
        stop: CancellationToken,
    ) {
        let permits = Arc::new(Semaphore::new(MAX_LANES));
        let mut counted = tokio::time::Instant::now();
        loop {
            self.mark_done().await;
            let wake_at = match self
                .store()
                .unhandled_updates(self.bot_id(), FETCH_PER_CHAT, FETCH_MAX)
                .await
            {
                Ok(rows) => self.start_lanes(rows, &handle, backoff, &permits, &tasks, &stop),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the update inbox; trying again");
                    tokio::time::Instant::now() + Duration::from_secs(1)
                }
            };
            if counted.elapsed() >= IDLE {
                counted = tokio::time::Instant::now();
                self.count_rows().await;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = self.woken() => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// Tries again to mark the updates handled whose mark failed (`done`); an id leaves
    /// `done` only once its row is marked.
    async fn mark_done(&self) {
        let ids: Vec<i64> = self.lanes().done.iter().copied().take(REMARK_MAX).collect();
        for update_id in ids {
            let key = UpdateKey {
                bot_id: self.bot_id(),
                update_id,
            };
            if self.store().mark_update_handled(key).await.is_err() {
                return; // still failing: the next pass tries again
            }
            self.lanes().done.remove(&update_id);
        }
    }

    /// Sets the gauges of the rows waiting and dead.
    pub async fn count_rows(&self) {
        match self.store().inbox_counts().await {
            Ok(counts) => crate::observe::inbox_rows(counts.unhandled, counts.dead),
            Err(error) => tracing::debug!(%error, "cannot count the inbox's rows"),
        }
    }

    /// Starts a task for each lane with a due update and none running; returns when the
    /// loop should look again (the earliest retry that falls due).
    fn start_lanes(
        &self,
        rows: Vec<InboxUpdate>,
        handle: &Handle,
        backoff: Backoff,
        permits: &Arc<Semaphore>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let mut wake_at = now + IDLE;
        let mut by_lane: Vec<(Lane, Vec<InboxUpdate>)> = Vec::new();
        {
            let lanes = self.lanes();
            for row in rows {
                if lanes.deferred.contains(&row.update_id) || lanes.done.contains(&row.update_id) {
                    continue;
                }
                let lane = row.chat_id.map_or(Lane::Alone(row.update_id), Lane::Chat);
                if lanes.busy.contains(&lane) {
                    continue;
                }
                match by_lane.last_mut() {
                    Some((last, rows)) if *last == lane => rows.push(row),
                    _ => by_lane.push((lane, vec![row])),
                }
            }
        }
        for (lane, rows) in by_lane {
            let Some(head) = rows.first() else { continue };
            if let Some(at) = self.due_at(head)
                && at > now
            {
                wake_at = wake_at.min(at);
                continue;
            }
            let Ok(permit) = Arc::clone(permits).try_acquire_owned() else {
                break; // every lane busy: a lane that ends wakes the loop
            };
            self.lanes().busy.insert(lane);
            let (inbox, handle, stop) = (self.clone(), Arc::clone(handle), stop.clone());
            tasks.spawn(async move {
                inbox.run_lane(rows, &handle, backoff, &stop).await;
                inbox.lanes().busy.remove(&lane);
                drop(permit);
                inbox.wake();
            });
        }
        wake_at
    }

    /// When a row may be tried (`None`: now): its stored retry time, or the one kept in
    /// memory when its failure could not be recorded.
    fn due_at(&self, row: &InboxUpdate) -> Option<tokio::time::Instant> {
        // A stored moment already past says nothing (`None`), rather than "now", which
        // would always be a hair later than the caller's now.
        let stored = row.next_try_at.0.and_then(|at| {
            let left = Duration::try_from(at.duration_since(jiff::Timestamp::now())).ok()?;
            Some(tokio::time::Instant::now() + left)
        });
        let kept = self.lanes().not_before.get(&row.update_id).copied();
        stored.into_iter().chain(kept).max()
    }

    /// Handles a lane's rows in order, until one fails (it is retried later: the lane
    /// waits for it) or the loop stops.
    async fn run_lane(
        &self,
        rows: Vec<InboxUpdate>,
        handle: &Handle,
        backoff: Backoff,
        stop: &CancellationToken,
    ) {
        for row in rows {
            if stop.is_cancelled() {
                return;
            }
            {
                let lanes = self.lanes();
                if lanes.deferred.contains(&row.update_id) || lanes.done.contains(&row.update_id) {
                    continue;
                }
            }
            if self
                .due_at(&row)
                .is_some_and(|at| at > tokio::time::Instant::now())
            {
                return;
            }
            if !self.take(row, handle, backoff).await {
                return;
            }
        }
    }

    /// Handles one row; `false` when it failed and is to be tried again (its lane waits).
    async fn take(&self, row: InboxUpdate, handle: &Handle, backoff: Backoff) -> bool {
        let key = UpdateKey {
            bot_id: self.bot_id(),
            update_id: row.update_id,
        };
        let update = row.payload.as_deref().map(serde_json::from_str::<Update>);
        let update = match update {
            Some(Ok(update)) => update,
            _ => {
                if let Err(error) = self.store().mark_update_dead(key, "unreadable").await {
                    tracing::warn!(%error, update_id = key.update_id, "cannot mark an unreadable update dead");
                    self.retry_later(key.update_id, backoff.after(1));
                    return false;
                }
                return true;
            }
        };
        let notice = not_saved(&update);
        let taking = Taking {
            key,
            inbox: self.clone(),
            deferred: Arc::new(AtomicBool::new(false)),
            marked: Arc::new(AtomicBool::new(false)),
            failures: row.failures,
            backoff,
        };
        let (deferred, marked) = (Arc::clone(&taking.deferred), Arc::clone(&taking.marked));
        let outcome = std::panic::AssertUnwindSafe(handle(update, taking))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the handler panicked")));
        match outcome {
            Ok(()) => {
                {
                    let mut lanes = self.lanes();
                    lanes.not_before.remove(&key.update_id);
                    lanes.unstored.remove(&key.update_id);
                }
                if !deferred.load(Ordering::SeqCst)
                    && !marked.load(Ordering::SeqCst)
                    && let Err(error) = self.store().mark_update_handled(key).await
                {
                    tracing::error!(%error, update_id = key.update_id, "an update could not be marked handled; it is marked later");
                    self.lanes().done.insert(key.update_id);
                }
                true
            }
            Err(error) => {
                self.failed(key, &error, row.failures, notice, backoff)
                    .await
            }
        }
    }

    /// A failed try: recorded; for an entry not stored, the user told once that it is
    /// not saved yet (and, when it is given up, to send it again). `true` when the lane moves on.
    /// An entry the store could not take for now ([`is_no_room`]: a full disk) is tried
    /// again for as long as that lasts, never given up: the user was told it will be
    /// taken.
    async fn failed(
        &self,
        key: UpdateKey,
        error: &anyhow::Error,
        failures: i64,
        notice: Option<super::NotSaved>,
        backoff: Backoff,
    ) -> bool {
        // "Not saved yet" and "send it again" are about an entry (a message, a voice
        // note, an edit) that could not be stored; a failing command gets neither.
        let notice = notice.filter(|_| is_not_saved(error));
        if is_no_room(error) {
            let tries = {
                let mut lanes = self.lanes();
                let tries = lanes.unstored.entry(key.update_id).or_insert(0);
                *tries = tries.saturating_add(1);
                *tries
            };
            let wait = backoff.after(tries);
            tracing::warn!(%error, update_id = key.update_id, tries, retry_in_ms = wait.as_millis() as u64, "an entry could not be stored yet; trying again");
            self.retry_later(key.update_id, wait);
            if let Some(notice) = notice {
                self.tell_once(notice);
            }
            return false;
        }
        let wait = backoff.after(failures.saturating_add(1));
        tracing::warn!(%error, update_id = key.update_id, failures = failures + 1, retry_in_ms = wait.as_millis() as u64, "handling an update failed");
        let next_try_at = jiff::Timestamp::now()
            + jiff::SignedDuration::try_from(wait).unwrap_or(jiff::SignedDuration::ZERO);
        self.retry_later(key.update_id, wait);
        let recorded = self
            .store()
            .record_update_failure(key, "handler_failed", next_try_at)
            .await;
        match recorded {
            Ok(UpdateFailure::Dead) => {
                self.lanes().not_before.remove(&key.update_id);
                if let Some(notice) = notice {
                    let _ = (self.0.notice)(notice, NoticeKind::GivenUp).await;
                }
                true
            }
            Ok(UpdateFailure::Retry(_)) => {
                if let Some(notice) = notice {
                    self.tell_once(notice);
                }
                false
            }
            Err(record_error) => {
                tracing::warn!(error = %record_error, update_id = key.update_id, "cannot record an update's failure; it is tried again later");
                if failures.saturating_add(1) < UPDATE_MAX_FAILURES
                    && let Some(notice) = notice
                {
                    self.tell_once(notice);
                }
                false
            }
        }
    }

    fn retry_later(&self, update_id: i64, wait: Duration) {
        self.lanes()
            .not_before
            .insert(update_id, tokio::time::Instant::now() + wait);
    }
}

/// Whether `error` is an entry (a message, a voice note, an edit) not stored.
fn is_not_saved(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<crate::journal::EntryError>(),
        Some(crate::journal::EntryError::NotSaved(_))
    )
}

/// Whether `error` is an entry the store could not take for now: the disk full, an
/// I/O error, the database busy, a commit not synced. Any other failure (a constraint,
/// a bug) would fail again the same way, and counts toward `dead`.
fn is_no_room(error: &anyhow::Error) -> bool {
    use crate::store::StoreError;
    let Some(crate::journal::EntryError::NotSaved(store)) =
        error.downcast_ref::<crate::journal::EntryError>()
    else {
        return false;
    };
    match store {
        StoreError::Sync(_) => true,
        StoreError::Sql(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut) => true,
        StoreError::Sql(sqlx::Error::Database(db)) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL (any extended code).
            .is_some_and(|code| matches!(code & 0xff, 5 | 6 | 10 | 13)),
        _ => false,
    }
}

#[cfg(test)]
pub(in crate::bot) mod tests {
    use super::*;

    pub(in crate::bot) async fn inbox() -> (Inbox, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
        let store = crate::store::Store::open_and_migrate(&url, Duration::from_secs(5))
            .await
            .expect("store");
        let notice: super::super::Notice = Arc::new(|_, _| async { true }.boxed());
        (Inbox::new(store, 1, notice), dir)
    }

    fn taking(inbox: &Inbox, update_id: i64) -> Taking {
        Taking::for_test(inbox, update_id, 0)
    }

    #[tokio::test]
    async fn only_an_entry_not_stored_is_told_not_saved_or_given_up() {
        let (inbox, _dir) = inbox().await;
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let notice: super::super::Notice = {
            let told = Arc::clone(&told);
            Arc::new(move |_, kind| {
                told.lock().expect("lock").push(kind);
                async { true }.boxed()
            })
        };
        let inbox = Inbox::new(inbox.store().clone(), 1, notice);
        let who = super::super::NotSaved {
            update_id: 3,
            chat_id: 4,
            user_id: 4,
            message_id: 5,
            language_code: None,
        };
        let backoff = Backoff {
            min: Duration::from_secs(30),
            max: Duration::from_secs(60),
        };
        let key = UpdateKey {
            bot_id: 1,
            update_id: 3,
        };
        // No row: the failure finds nothing to retry, the update is given up.
        let command = anyhow::anyhow!("/tz: the store failed");
        inbox
            .failed(key, &command, 4, Some(who.clone()), backoff)
            .await;
        assert!(told.lock().expect("lock").is_empty(), "a command: nothing");
        let entry = anyhow::Error::from(crate::journal::EntryError::NotSaved(
            crate::store::StoreError::NotMigrated,
        ));
        inbox.failed(key, &entry, 4, Some(who), backoff).await;
        assert_eq!(*told.lock().expect("lock"), [NoticeKind::GivenUp]);
    }

    #[tokio::test]
    async fn an_update_whose_mark_failed_is_marked_on_a_later_pass_and_then_forgotten() {
        let (inbox, _dir) = inbox().await;
        let row = crate::store::NewUpdate {
            update_id: 8,
            chat_id: Some(2),
            user_id: Some(2),
            payload: "{}",
        };
        inbox
            .store()
            .insert_updates(1, &[row])
            .await
            .expect("stored");
        inbox.lanes().done.insert(8);
        inbox.mark_done().await;
        assert!(inbox.lanes().done.is_empty());
        let waiting = inbox
            .store()
            .unhandled_updates(1, 8, 100)
            .await
            .expect("rows");
        assert!(waiting.is_empty(), "marked handled");
    }

    #[tokio::test]
    async fn a_deferred_update_whose_mark_fails_is_not_handed_over_again() {
        let (inbox, _dir) = inbox().await;
        let done = taking(&inbox, 7).defer();
        inbox.store().close().await; // every write fails from here
        done.handled().await;
        let lanes = inbox.lanes();
        assert!(!lanes.deferred.contains(&7), "released");
        assert!(lanes.done.contains(&7), "kept from being handled again");
    }

    #[test]
    fn the_backoff_doubles_from_its_minimum_to_its_cap() {
        let backoff = Backoff {
            min: Duration::from_secs(30),
            max: Duration::from_secs(100),
        };
        let waits: Vec<u64> = (1..=5).map(|n| backoff.after(n).as_secs()).collect();
        assert_eq!(waits, [30, 60, 100, 100, 100]);
    }
}
