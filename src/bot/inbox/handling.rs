//! The handling loop: hands each update of the inbox not handled and not dead to the
//! handler tree — a chat's updates one after another in `update_id` order, different
//! chats at once (at most [`MAX_LANES`]).
//!
//! The rows to handle are kept in memory ([`Lanes::waiting`]): the intake hands each
//! update over, parsed, once its row is committed ([`Inbox::hand_over`]), and the loop
//! reads the table ([`Inbox::read_table`], the one place rows are fetched) only while it
//! may hold rows the memory lacks — at the start (what a crash left), after the intake
//! could not hand rows over (the memory full), after a failed try (the row's count and
//! retry time are read back), and until a read saw every waiting row. A row read from
//! the table, or handed over while the memory was complete, is *vouched*: no older row
//! of its chat can be hiding in the table, so it may run. The memory is complete only
//! for the rows this process committed; another process writing the same inbox would
//! have to make the loop read the table again ([`Inbox::reread`]).
//!
//! An update is *handled* once its handler returned `Ok` (the loop sets `handled_at`),
//! unless the handler set it itself earlier (an entry: in the transaction that stores
//! it) or handed it to a task of its own with [`Taking::defer`] (`/week`, an import:
//! handled once that task is done; the chat's next updates go on meanwhile). A handler
//! that fails (an error, a panic) has its update tried again on the worker's backoff,
//! its chat waiting; after [`UPDATE_MAX_FAILURES`] failures the update is dead and the
//! chat moves on. Nothing here is in memory only: a crash leaves unhandled rows, which
//! the next start handles.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
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
use crate::cluster::ChatLease;
use crate::store::{Fence, InboxUpdate, NextTry, UPDATE_MAX_FAILURES, UpdateFailure, UpdateKey};

/// Chats handled at the same time.
pub const MAX_LANES: usize = 64;

/// Rows read per read of the table: at most [`FETCH_PER_CHAT`] of each chat. A lane
/// handles at most [`FETCH_PER_CHAT`] rows before it lets other chats go first.
const FETCH_MAX: i64 = 5000;
const FETCH_PER_CHAT: i64 = 8;

/// The most rows kept in memory; past it the intake leaves its rows to the table, and
/// the loop reads them from there.
const HELD_MAX: usize = 5000;

/// The most `done` rows whose mark is tried again per pass of the loop.
const REMARK_MAX: usize = 64;

/// The longest the loop sleeps without being woken (a retry falls due, a lost wake-up).
const IDLE: Duration = Duration::from_secs(5);

/// Reads of the table the loop may make at once, and how soon it may make another once
/// they are spent ([`ReadPace`]).
const READ_BURST: u32 = 2;
const READ_SPACING: Duration = Duration::from_millis(20);

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
    /// The rows known to wait, per lane in `update_id` order (a row stays while it
    /// runs, so that a read of the table does not add it again).
    waiting: HashMap<Lane, BTreeMap<i64, Waiting>>,
    /// How many rows `waiting` holds.
    held: usize,
    /// Counts the moments the table may have come to hold a row to handle that
    /// `waiting` lacks; `seen` is the count at the start of the last read that saw
    /// every waiting row. While they differ (and at the start: `None`), the loop reads
    /// the table on each pass.
    missed: u64,
    seen: Option<u64>,
    /// A read of the table is under way: rows that end meanwhile go to `gone`, so that
    /// what the read saw of them before they ended does not bring them back.
    reading: bool,
    gone: HashSet<i64>,
    /// Lanes whose rows left the memory while a read was under way ([`Lanes::drop_lane`]):
    /// that read brings none of their rows back. It may have seen them before they
    /// left, but not the ones committed since, so it would put back an older row
    /// without a newer one, or — a row that left being skipped as `gone` — a newer
    /// row without the older: the next read brings the lane back whole.
    dropped: HashSet<Lane>,
    /// Among instances: the lease under which each lane's memory was last brought in
    /// step with the table (see [`Inbox::lane_lease`]). A lease in hand under another
    /// fence, or none, was taken by someone else here (the worker) or anew: what the
    /// memory holds of the chat may be stale.
    in_step: HashMap<Lane, Fence>,
    /// How often the table is read.
    pace: ReadPace,
}

/// How often the loop reads the table. Among instances every batch of updates that
/// arrives asks for a read, and so does a chat's new lease when the chat's own rows
/// differ from the memory's: under a burst that was a read of every waiting row for
/// every few chats. Reads come [`READ_BURST`] at once (a chat's update and its lease's
/// read need not wait), then one per [`READ_SPACING`]: every lane that asked meanwhile
/// is served by the same read.
#[derive(Debug, Default)]
struct ReadPace {
    /// The time banked toward reads, at most [`READ_BURST`] spacings (a read spends
    /// one), and when it was counted (`None`: never read: the whole burst).
    banked: Duration,
    counted: Option<tokio::time::Instant>,
}

impl ReadPace {
    /// `None`: read now (counted); `Some`: not before then.
    fn take(&mut self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let full = READ_SPACING * READ_BURST;
        let banked = match self.counted {
            None => full,
            Some(at) => (self.banked + now.saturating_duration_since(at)).min(full),
        };
        self.banked = banked;
        self.counted = Some(now);
        match banked.checked_sub(READ_SPACING) {
            Some(left) => {
                self.banked = left;
                None
            }
            None => Some(now + (READ_SPACING - banked)),
        }
    }
}

impl Lanes {
    fn in_sync(&self) -> bool {
        self.seen == Some(self.missed)
    }

    /// A row ended (handled, dead, taken over by a task): out of the memory.
    fn forget(&mut self, lane: Lane, update_id: i64) {
        if let Some(queue) = self.waiting.get_mut(&lane) {
            if queue.remove(&update_id).is_some() {
                self.held = self.held.saturating_sub(1);
            }
            if queue.is_empty() {
                self.waiting.remove(&lane);
            }
        }
        self.ended(update_id);
    }

    /// A row ended: a read under way, which may have seen it still waiting, must not
    /// bring it back.
    fn ended(&mut self, update_id: i64) {
        if self.reading {
            self.gone.insert(update_id);
        }
    }

    /// The lane's rows leave the memory, not handled (another instance handles them, or
    /// they are read from the table again); `true` when one of them came to this
    /// instance itself (not read from the table).
    fn drop_lane(&mut self, lane: Lane) -> bool {
        if self.reading {
            self.dropped.insert(lane);
        }
        let Some(queue) = self.waiting.remove(&lane) else {
            return false;
        };
        self.held = self.held.saturating_sub(queue.len());
        queue.values().any(|row| row.arrived)
    }
}

/// A row the loop knows to wait.
struct Waiting {
    failures: i64,
    next_try_at: NextTry,
    body: Body,
    /// No older row of its chat can be in the table unseen: it may run.
    vouched: bool,
    /// It came to this instance (a webhook's post, a poll), handed over by the intake,
    /// rather than found in the table: its chat's lease is asked for even while another
    /// instance was found holding it ([`Leases::hold_arrived`]), and that instance is
    /// told when it still does. Kept when its body is read again after a failed try.
    ///
    /// [`Leases::hold_arrived`]: crate::cluster::Leases::hold_arrived
    arrived: bool,
}

impl Waiting {
    /// A read made under the chat's lease found the row waiting with these failures and
    /// retry time: they are the row's now, and no older row of its chat is left unseen.
    /// `false` (nothing changed) while the row runs: its task records what comes of it.
    fn seen(&mut self, failures: i64, next_try_at: NextTry) -> bool {
        if matches!(self.body, Body::Running) {
            return false;
        }
        self.failures = failures;
        self.next_try_at = next_try_at;
        self.vouched = true;
        true
    }
}

/// What the memory holds of a row's update.
enum Body {
    /// Handed over by the intake, parsed.
    Parsed(Box<Update>),
    /// Read from the table (`None`: its payload is gone; the row is marked dead).
    Stored(Option<String>),
    /// Being handled.
    Running,
    /// Its try failed: its count and retry time are read from the table again before
    /// it runs (its chat waits for it).
    Unread,
}

/// An update the intake committed, handed to the loop in memory.
pub(in crate::bot) struct Arrived {
    pub update_id: i64,
    pub chat_id: Option<i64>,
    pub update: Box<Update>,
}

/// A row a lane takes from the memory.
struct Row {
    update_id: i64,
    failures: i64,
    body: Body,
}

/// What goes in order: a chat's updates; an update with no chat goes alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Lane {
    Chat(i64),
    Alone(i64),
}

impl Lane {
    fn of(chat_id: Option<i64>, update_id: i64) -> Self {
        chat_id.map_or(Self::Alone(update_id), Self::Chat)
    }
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
    /// The chat's lease the update is handled under (the daemon's).
    lease: Option<Arc<ChatLease>>,
}

impl Taking {
    /// The chat's lease the update is handled under, for work handed to a task of its
    /// own (an entry's answer): the chat stays with this instance until it ends.
    pub fn lease(&self) -> Option<Arc<ChatLease>> {
        self.lease.clone()
    }

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
    /// The task keeps the chat's lease (renewed by the heartbeat) until it ends.
    pub fn defer(&self) -> Deferred {
        self.deferred.store(true, Ordering::SeqCst);
        self.inbox.lanes().deferred.insert(self.key.update_id);
        Deferred {
            key: self.key,
            inbox: self.inbox.clone(),
            done: false,
            failures: self.failures,
            backoff: self.backoff,
            lease: self.lease.clone(),
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
            lease: None,
        }
    }

    /// The same, handled under `lease`.
    #[cfg(test)]
    pub(in crate::bot) fn with_lease(mut self, lease: ChatLease) -> Self {
        self.lease = Some(Arc::new(lease));
        self
    }
}

/// The chat's lease a task handed an update works under, as the task checks it at its
/// safe points: before it writes or sends, never in the middle of either (a send whose
/// record is cut off would go out again from whoever handles the update next).
#[derive(Clone)]
pub struct UnderLease(Option<Arc<ChatLease>>);

impl UnderLease {
    /// Whether the chat is still this instance's: always without a lease, and on
    /// SQLite (whose lock file keeps other daemons out); among instances by the
    /// lease's own deadline, and past it by asking the database
    /// ([`ChatLease::confirm`]).
    pub async fn holds(&self) -> bool {
        match &self.0 {
            Some(lease) => lease.confirm().await,
            None => true,
        }
    }

    /// [`UnderLease::holds`], as the task's error when not: the task stops there, and
    /// its update is left to whoever holds the chat now ([`Deferred::let_go`]).
    pub async fn go_on(&self) -> Result<(), LeaseLost> {
        if self.holds().await {
            Ok(())
        } else {
            Err(LeaseLost)
        }
    }
}

/// A task stopped at a safe point: its chat's lease is no longer this instance's.
#[derive(Debug, thiserror::Error)]
#[error("the chat's lease is no longer this instance's")]
pub struct LeaseLost;

/// An update a task took over (see [`Taking::defer`]).
pub struct Deferred {
    key: UpdateKey,
    inbox: Inbox,
    done: bool,
    failures: i64,
    backoff: Backoff,
    /// The chat's lease, kept in use (so renewed, never given up) while the task works.
    lease: Option<Arc<ChatLease>>,
}

impl Deferred {
    /// The task's work committed (or it told the user why not): the update is handled.
    /// Under a lease the mark checks it in its statement: after a take-over it writes
    /// nothing (the chat's new holder has the update).
    pub async fn handled(mut self) {
        self.done = true;
        let store = self.inbox.store();
        let marked = match &self.lease {
            Some(lease) => {
                store
                    .mark_update_handled_fenced(self.key, &lease.fence())
                    .await
            }
            None => store.mark_update_handled(self.key).await.map(|()| true),
        };
        self.inbox.lanes().ended(self.key.update_id);
        match marked {
            Ok(true) => {}
            Ok(false) => {
                // The work is done (its answer sent), and the chat's new holder has the
                // update: it may carry it out a second time.
                crate::observe::update_mark_fenced();
                tracing::error!(
                    update_id = self.key.update_id,
                    chat_id = self.lease.as_ref().map(|lease| lease.fence().chat_id),
                    "a task's work was done but its chat was taken over by another instance before its update was marked handled; that instance may carry it out again"
                );
            }
            Err(error) => {
                // Its work is done (its reply sent): kept out of the loop's hands, or the
                // release below would hand it over again at once.
                tracing::error!(%error, update_id = self.key.update_id, "an update could not be marked handled; it is not handled again by this process");
                self.inbox.lanes().done.insert(self.key.update_id);
            }
        }
        self.release();
    }

    /// What the task checks at its safe points: whether the chat is still this
    /// instance's to work in.
    pub fn under(&self) -> UnderLease {
        UnderLease(self.lease.clone().filter(|lease| lease.shared()))
    }

    /// The task stopped because the chat's lease was lost ([`LeaseLost`]): its
    /// update is not marked; it is read from the table again, and handled by whichever
    /// instance holds the chat now.
    pub fn let_go(mut self) {
        self.done = true;
        tracing::warn!(
            update_id = self.key.update_id,
            "a task stopped: its chat's lease was lost; whoever holds the chat now handles its update"
        );
        self.inbox.lanes().ended(self.key.update_id);
        self.inbox.reread();
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
        let recorded = self
            .inbox
            .store()
            .record_update_failure(self.key, why, next_try_at)
            .await;
        // Tried again from the table (or gone from it, dead).
        self.inbox.reread();
        match recorded {
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
            self.inbox.reread();
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

    /// Hands the updates the intake just committed to the loop (in memory; the loop
    /// is woken by the caller). Past [`HELD_MAX`] rows they are left to the table.
    pub(in crate::bot) fn hand_over(&self, arrived: Vec<Arrived>) {
        if arrived.is_empty() {
            return;
        }
        // Among instances sharing the database, another one may have committed an
        // older row of the same chat: a row handed over waits for a read.
        let shared = self.leases().is_some_and(crate::cluster::Leases::shared);
        let mut guard = self.lanes();
        let lanes = &mut *guard;
        if lanes.held.saturating_add(arrived.len()) > HELD_MAX || shared {
            lanes.missed = lanes.missed.wrapping_add(1);
        }
        if lanes.held.saturating_add(arrived.len()) > HELD_MAX {
            return;
        }
        // While the table may hold older rows unseen, a row handed over waits for a
        // read to vouch for it.
        let vouched = lanes.in_sync();
        for row in arrived {
            let lane = Lane::of(row.chat_id, row.update_id);
            if let Entry::Vacant(slot) = lanes.waiting.entry(lane).or_default().entry(row.update_id)
            {
                slot.insert(Waiting {
                    failures: 0,
                    next_try_at: NextTry::default(),
                    body: Body::Parsed(row.update),
                    vouched,
                    arrived: true,
                });
                lanes.held += 1;
            }
        }
    }

    /// The table may hold rows to handle that the memory lacks: the loop reads it on
    /// its next passes (until a read sees every waiting row), and is woken.
    pub fn reread(&self) {
        {
            let mut lanes = self.lanes();
            lanes.missed = lanes.missed.wrapping_add(1);
        }
        self.wake();
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
            let read_again = self.read_table().await;
            let mut wake_at = self.start_lanes(&handle, backoff, &permits, &tasks, &stop);
            if let Some(at) = read_again {
                wake_at = wake_at.min(at);
            }
            if counted.elapsed() >= IDLE {
                counted = tokio::time::Instant::now();
                self.count_rows().await;
                // Among instances, rows another instance committed and could not hand
                // over (its holder gone, a lost notice) are found here.
                if let Some(leases) = self.leases().filter(|l| l.shared()) {
                    self.reread();
                    // The lanes whose leases went are read afresh when taken again.
                    self.lanes().in_step.retain(|lane, _| match lane {
                        Lane::Chat(chat) => leases.holds(*chat),
                        Lane::Alone(_) => false,
                    });
                }
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = self.woken() => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// Reads the table's waiting rows into the memory, when it may hold some the memory
    /// lacks (the one place rows are fetched). `Some`: read again then (the read failed,
    /// or reads are spent for now: [`ReadPace`]).
    async fn read_table(&self) -> Option<tokio::time::Instant> {
        let (from, held) = {
            let mut lanes = self.lanes();
            if lanes.in_sync() {
                return None;
            }
            if let Some(at) = lanes.pace.take(tokio::time::Instant::now()) {
                return Some(at);
            }
            lanes.reading = true;
            lanes.gone.clear();
            lanes.dropped.clear();
            // The rows whose update the memory holds: the read leaves their payloads
            // out. A row that leaves the memory meanwhile goes to `gone` or its lane to
            // `dropped`, so the read brings none of them back without a payload.
            let held: Vec<i64> = lanes
                .waiting
                .values()
                .flat_map(|queue| queue.iter())
                .filter(|(_, row)| !matches!(row.body, Body::Unread))
                .map(|(&update_id, _)| update_id)
                .collect();
            (lanes.missed, held)
        };
        let shared = self.leases().is_some_and(crate::cluster::Leases::shared);
        let read = self
            .store()
            .unhandled_updates_holding(self.bot_id(), FETCH_PER_CHAT, FETCH_MAX, &held)
            .await;
        let mut lanes = self.lanes();
        lanes.reading = false;
        match read {
            Ok(rows) => {
                merge(&mut lanes, rows, from, shared);
                lanes.gone.clear();
                lanes.dropped.clear();
                None
            }
            Err(error) => {
                drop(lanes);
                tracing::warn!(%error, "cannot read the update inbox; trying again");
                Some(tokio::time::Instant::now() + Duration::from_secs(1))
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

    /// Starts a task for each lane with a due update and none running, the lanes whose
    /// next update is oldest first; returns when the loop should look again (the
    /// earliest retry that falls due).
    fn start_lanes(
        &self,
        handle: &Handle,
        backoff: Backoff,
        permits: &Arc<Semaphore>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let mut wake_at = now + IDLE;
        let mut ready: Vec<(i64, Lane)> = Vec::new();
        {
            let lanes = self.lanes();
            for (lane, queue) in &lanes.waiting {
                if lanes.busy.contains(lane) {
                    continue;
                }
                let Some((&update_id, head)) = queue.first_key_value() else {
                    continue;
                };
                if !runnable(head) {
                    continue;
                }
                match due_at(&lanes, update_id, head.next_try_at) {
                    Some(at) if at > now => wake_at = wake_at.min(at),
                    _ => ready.push((update_id, *lane)),
                }
            }
        }
        ready.sort_unstable_by_key(|(update_id, _)| *update_id);
        for (_, lane) in ready {
            let Ok(permit) = Arc::clone(permits).try_acquire_owned() else {
                break; // every lane busy: a lane that ends wakes the loop
            };
            self.lanes().busy.insert(lane);
            let (inbox, handle, stop) = (self.clone(), Arc::clone(handle), stop.clone());
            tasks.spawn(async move {
                inbox.run_lane(lane, &handle, backoff, &stop).await;
                inbox.lanes().busy.remove(&lane);
                drop(permit);
                inbox.wake();
            });
        }
        wake_at
    }

    /// Handles a lane's rows in order (at most [`FETCH_PER_CHAT`], then other chats go
    /// first), until one fails (it is retried later: the lane waits for it), none is
    /// ready, or the loop stops.
    async fn run_lane(
        &self,
        lane: Lane,
        handle: &Handle,
        backoff: Backoff,
        stop: &CancellationToken,
    ) {
        let Some(lease) = self.lane_lease(lane).await else {
            return;
        };
        for _ in 0..FETCH_PER_CHAT {
            if stop.is_cancelled() {
                return;
            }
            let Some(row) = self.next_row(lane) else {
                return;
            };
            if !self.take(lane, row, lease.as_ref(), handle, backoff).await {
                return;
            }
        }
    }

    /// The lane's lease, when the loop works under leases (`Some(None)`: it does not).
    /// `None` when the lane may not run now: another instance holds the chat (its rows
    /// leave the memory; that instance is told and handles them from the table), the
    /// lease is new to the loop — just taken, or taken by the worker, or under another
    /// fence than the one the memory was last read under — and the chat's rows in the
    /// table are not the memory's ([`Inbox::chat_in_step`]): what the memory holds of the
    /// chat is stale or incomplete, so it is read from the table again first — or the
    /// lease could not be asked for.
    async fn lane_lease(&self, lane: Lane) -> Option<Option<ChatLease>> {
        let Some(leases) = self.leases() else {
            return Some(None);
        };
        // An update with no chat has no order to keep, and so no lease.
        let Lane::Chat(key) = lane else {
            return Some(None);
        };
        // A chat another instance was found holding is asked for again before its lease
        // ran out there only when one of its updates arrived here (the periodic read of
        // the table finds the others' backlog: that is not asked for on every read).
        let arrived = self
            .lanes()
            .waiting
            .get(&lane)
            .is_some_and(|queue| queue.values().any(|row| row.arrived));
        let held = if arrived {
            leases.hold_arrived(key).await
        } else {
            leases.hold(key).await
        };
        match held {
            // On SQLite the lock file keeps other daemons out: nothing can be stale.
            Ok(Some(lease)) if leases.shared() && !self.in_step(lane, &lease) => {
                // Generation 1 is only ever one holder's (another holder's take raises
                // it): under the chat's first lease no instance died holding it. Under a
                // later one, what an instance that died left of the chat goes first:
                // claimed, each with its turn in the chat, before its next update.
                if lease.fence().generation > 1
                    && let Some(take_over) = self.take_over()
                {
                    take_over(key).await;
                }
                self.lanes().in_step.insert(lane, lease.fence());
                // The chat's own rows read now, under the lease: when they are the
                // memory's, nothing it holds is stale (a row another instance handled
                // or let die is gone from them) or missing (an older update another
                // instance committed since the last read), and the lane goes on.
                if self.chat_in_step(lane, key).await {
                    return Some(Some(lease));
                }
                self.drop_lane(lane);
                self.reread();
                None
            }
            Ok(Some(lease)) => Some(Some(lease)),
            Ok(None) => {
                if self.drop_lane(lane)
                    && let Err(error) = self.store().notify_inbox(key).await
                {
                    tracing::debug!(%error, "cannot tell the chat's holder about its updates");
                }
                None
            }
            Err(error) => {
                tracing::warn!(%error, "cannot take a chat's lease; its updates wait");
                let head = self
                    .lanes()
                    .waiting
                    .get(&lane)
                    .and_then(|queue| queue.keys().next().copied());
                if let Some(update_id) = head {
                    self.retry_later(update_id, Duration::from_secs(1));
                }
                None
            }
        }
    }

    /// Whether the memory of `lane` (the chat `chat`) holds the chat's waiting rows as
    /// the table has them now — the same ids, none missing, none the table no longer
    /// has, fewer than [`FETCH_PER_CHAT`]; then they are brought up to date (failures
    /// and retry times another instance may have recorded) and vouched for (no older
    /// row of the chat is left in the table). `false` when the table cannot be read.
    async fn chat_in_step(&self, lane: Lane, chat: i64) -> bool {
        let Ok(table) = self
            .store()
            .unhandled_updates_of_chat(self.bot_id(), chat, FETCH_PER_CHAT)
            .await
        else {
            return false;
        };
        // As many as asked for: the chat may have more, a read of the table decides.
        if table.len() >= usize::try_from(FETCH_PER_CHAT).unwrap_or(usize::MAX) {
            return false;
        }
        let mut guard = self.lanes();
        let lanes = &mut *guard;
        let Some(queue) = lanes.waiting.get_mut(&lane) else {
            return table.is_empty();
        };
        if !queue
            .keys()
            .copied()
            .eq(table.iter().map(|row| row.update_id))
        {
            return false;
        }
        // A read of the table under way began before these rows were read: what it saw
        // of the chat (a row another instance has handled since, an older failure
        // count) must not come back over them.
        if lanes.reading {
            lanes.dropped.insert(lane);
        }
        for (known, row) in queue.values_mut().zip(&table) {
            known.seen(row.failures, row.next_try_at);
        }
        true
    }

    /// Whether the memory of `lane` was read under `lease` (see [`Lanes::in_step`]).
    fn in_step(&self, lane: Lane, lease: &ChatLease) -> bool {
        !lease.fresh() && self.lanes().in_step.get(&lane) == Some(&lease.fence())
    }

    /// See [`Lanes::drop_lane`].
    fn drop_lane(&self, lane: Lane) -> bool {
        self.lanes().drop_lane(lane)
    }

    /// The lane's next row, when it may run now (marked running).
    fn next_row(&self, lane: Lane) -> Option<Row> {
        let mut guard = self.lanes();
        let lanes = &mut *guard;
        let (&update_id, head) = lanes.waiting.get(&lane)?.first_key_value()?;
        if !runnable(head)
            || due_at(lanes, update_id, head.next_try_at)
                .is_some_and(|at| at > tokio::time::Instant::now())
        {
            return None;
        }
        let head = lanes.waiting.get_mut(&lane)?.get_mut(&update_id)?;
        Some(Row {
            update_id,
            failures: head.failures,
            body: std::mem::replace(&mut head.body, Body::Running),
        })
    }

    /// A row's try failed: it is read from the table again before it runs (its lane
    /// waits for it meanwhile).
    fn unread(&self, lane: Lane, update_id: i64) {
        {
            let mut lanes = self.lanes();
            if let Some(row) = lanes
                .waiting
                .get_mut(&lane)
                .and_then(|queue| queue.get_mut(&update_id))
            {
                row.body = Body::Unread;
            }
        }
        self.reread();
    }

    /// Handles one row; `false` when it failed and is to be tried again (its lane waits).
    async fn take(
        &self,
        lane: Lane,
        row: Row,
        lease: Option<&ChatLease>,
        handle: &Handle,
        backoff: Backoff,
    ) -> bool {
        let key = UpdateKey {
            bot_id: self.bot_id(),
            update_id: row.update_id,
        };
        let update = match row.body {
            Body::Parsed(update) => Some(*update),
            Body::Stored(Some(text)) => serde_json::from_str::<Update>(&text).ok(),
            Body::Stored(None) | Body::Running | Body::Unread => None,
        };
        let Some(update) = update else {
            if let Err(error) = self.store().mark_update_dead(key, "unreadable").await {
                tracing::warn!(%error, update_id = key.update_id, "cannot mark an unreadable update dead");
                self.retry_later(key.update_id, backoff.after(1));
                self.unread(lane, key.update_id);
                return false;
            }
            self.lanes().forget(lane, key.update_id);
            return true;
        };
        let notice = not_saved(&update);
        let taking = Taking {
            key,
            inbox: self.clone(),
            deferred: Arc::new(AtomicBool::new(false)),
            marked: Arc::new(AtomicBool::new(false)),
            failures: row.failures,
            backoff,
            lease: lease.and_then(ChatLease::share).map(Arc::new),
        };
        let (deferred, marked) = (Arc::clone(&taking.deferred), Arc::clone(&taking.marked));
        // Among instances (PostgreSQL) an entry's write checks the chat's lease too.
        let fence = lease
            .filter(|_| self.leases().is_some_and(crate::cluster::Leases::shared))
            .map(ChatLease::fence);
        if fence.is_some() {
            self.store().fence_update(key, fence);
        }
        let outcome = std::panic::AssertUnwindSafe(handle(update, taking))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the handler panicked")));
        if fence.is_some() {
            self.store().fence_update(key, None);
        }
        if is_fenced(&outcome) {
            tracing::warn!(
                update_id = key.update_id,
                "the chat was taken over by another instance; it handles the update"
            );
            self.drop_lane(lane);
            return false;
        }
        match outcome {
            Ok(()) => {
                self.handled(
                    lane,
                    key,
                    lease,
                    deferred.load(Ordering::SeqCst),
                    marked.load(Ordering::SeqCst),
                )
                .await
            }
            Err(error) => {
                let moves_on = self
                    .failed(key, &error, row.failures, notice, backoff)
                    .await;
                if moves_on {
                    self.lanes().forget(lane, key.update_id);
                } else {
                    self.unread(lane, key.update_id);
                }
                moves_on
            }
        }
    }

    /// A handler returned `Ok`: the row is marked handled unless its store write or a
    /// task of its own does that, and leaves the memory. Under a lease the mark checks
    /// it in its statement: `false` when the chat was taken over (its rows leave the
    /// memory; the lane stops).
    async fn handled(
        &self,
        lane: Lane,
        key: UpdateKey,
        lease: Option<&ChatLease>,
        deferred: bool,
        marked: bool,
    ) -> bool {
        {
            let mut lanes = self.lanes();
            lanes.not_before.remove(&key.update_id);
            lanes.unstored.remove(&key.update_id);
        }
        let mark = match lease {
            _ if deferred || marked => Ok(()),
            Some(lease) => match self
                .store()
                .mark_update_handled_fenced(key, &lease.fence())
                .await
            {
                Ok(true) => Ok(()),
                Ok(false) => {
                    tracing::warn!(
                        update_id = key.update_id,
                        "the chat was taken over by another instance before its update was marked handled"
                    );
                    self.drop_lane(lane);
                    return false;
                }
                Err(error) => Err(error),
            },
            None => self.store().mark_update_handled(key).await,
        };
        let task_ended = {
            let mut lanes = self.lanes();
            lanes.forget(lane, key.update_id);
            if let Err(error) = &mark {
                tracing::error!(%error, update_id = key.update_id, "an update could not be marked handled; it is marked later");
                lanes.done.insert(key.update_id);
            }
            deferred && !lanes.deferred.contains(&key.update_id)
        };
        if task_ended {
            // Its task ended already; had it failed, the row is to be read again.
            self.reread();
        }
        true
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

/// Whether a handler's failure is a write refused under a lease taken over.
fn is_fenced(outcome: &anyhow::Result<()>) -> bool {
    use crate::store::StoreError;
    let Err(error) = outcome else {
        return false;
    };
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<StoreError>(),
            Some(StoreError::Fenced { .. })
        ) || matches!(
            cause.downcast_ref::<crate::journal::EntryError>(),
            Some(
                crate::journal::EntryError::NotSaved(StoreError::Fenced { .. })
                    | crate::journal::EntryError::Later(StoreError::Fenced { .. })
            )
        )
    })
}

/// Whether a row may be taken (as far as its own state goes: its lane decides the rest).
fn runnable(row: &Waiting) -> bool {
    row.vouched && matches!(row.body, Body::Parsed(_) | Body::Stored(_))
}

/// When a row may be tried (`None`: now): its stored retry time, or the one kept in
/// memory when its failure could not be recorded.
fn due_at(lanes: &Lanes, update_id: i64, next_try_at: NextTry) -> Option<tokio::time::Instant> {
    // A stored moment already past says nothing (`None`), rather than "now", which
    // would always be a hair later than the caller's now.
    let stored = next_try_at.0.and_then(|at| {
        let left = Duration::try_from(at.duration_since(jiff::Timestamp::now())).ok()?;
        Some(tokio::time::Instant::now() + left)
    });
    let kept = lanes.not_before.get(&update_id).copied();
    stored.into_iter().chain(kept).max()
}

/// Puts what a read of the table found into the memory (read from `from`, the count of
/// [`Lanes::missed`] when it began). A read that saw every waiting row — fewer rows
/// than its limit, no chat cut at [`FETCH_PER_CHAT`], none whose first row failed
/// before (the read gives only that one while it waits) — vouches for every row in
/// memory, and drops the rows waiting to be read again that it did not find (handled or
/// dead meanwhile). Among instances (`shared`) it vouches only for the rows it saw: a
/// row handed over after the read began may have an older row of its chat that
/// another instance committed after the read's snapshot.
fn merge(lanes: &mut Lanes, rows: Vec<InboxUpdate>, from: u64, shared: bool) {
    let mut whole = rows.len() < usize::try_from(FETCH_MAX).unwrap_or(usize::MAX);
    let mut found: HashSet<i64> = HashSet::with_capacity(rows.len());
    let mut current: Option<(Lane, i64)> = None;
    for row in rows {
        let lane = Lane::of(row.chat_id, row.update_id);
        let nth = match current {
            Some((last, nth)) if last == lane => nth + 1,
            _ => 1,
        };
        current = Some((lane, nth));
        if nth >= FETCH_PER_CHAT || (nth == 1 && row.next_try_at.0.is_some()) {
            whole = false;
        }
        found.insert(row.update_id);
        if lanes.deferred.contains(&row.update_id)
            || lanes.done.contains(&row.update_id)
            || lanes.gone.contains(&row.update_id)
            || lanes.dropped.contains(&lane)
        {
            continue;
        }
        // A row read without its payload (the memory held it when the read began)
        // that the memory now lacks, or waits to read again, is left to the next read.
        if row.held
            && lanes
                .waiting
                .get(&lane)
                .and_then(|queue| queue.get(&row.update_id))
                .is_none_or(|known| matches!(known.body, Body::Unread))
        {
            whole = false;
            continue;
        }
        match lanes.waiting.entry(lane).or_default().entry(row.update_id) {
            Entry::Occupied(mut slot) => {
                let known = slot.get_mut();
                if known.seen(row.failures, row.next_try_at) && matches!(known.body, Body::Unread) {
                    known.body = Body::Stored(row.payload);
                }
            }
            Entry::Vacant(slot) => {
                slot.insert(Waiting {
                    failures: row.failures,
                    next_try_at: row.next_try_at,
                    body: Body::Stored(row.payload),
                    vouched: true,
                    arrived: false,
                });
                lanes.held += 1;
            }
        }
    }
    if !whole {
        return;
    }
    let mut dropped = 0;
    for queue in lanes.waiting.values_mut() {
        queue.retain(|update_id, row| {
            let keep = !matches!(row.body, Body::Unread) || found.contains(update_id);
            dropped += usize::from(!keep);
            row.vouched |= !shared;
            keep
        });
    }
    lanes.waiting.retain(|_, queue| !queue.is_empty());
    lanes.held = lanes.held.saturating_sub(dropped);
    lanes.seen = Some(from);
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

    /// An inbox whose chats are handled under the leases of instance `a`; `b` is another
    /// instance on the same database.
    async fn leased_inbox() -> (
        Inbox,
        crate::cluster::Leases,
        crate::store::InstanceId,
        tempfile::TempDir,
    ) {
        leased_inbox_with(|store, a| crate::cluster::Leases::for_test(store, a, LEASE)).await
    }

    /// An inbox under leases of `lease` that count as shared with other instances (as on
    /// PostgreSQL: work under them checks them, and they can be lost).
    pub(in crate::bot) async fn shared_leased_inbox(
        lease: Duration,
    ) -> (
        Inbox,
        crate::cluster::Leases,
        crate::store::InstanceId,
        tempfile::TempDir,
    ) {
        leased_inbox_with(|store, a| crate::cluster::Leases::shared_for_test(store, a, lease)).await
    }

    async fn leased_inbox_with(
        leases: impl FnOnce(crate::store::Store, crate::store::InstanceId) -> crate::cluster::Leases,
    ) -> (
        Inbox,
        crate::cluster::Leases,
        crate::store::InstanceId,
        tempfile::TempDir,
    ) {
        let (plain, dir) = inbox().await;
        let store = plain.store().clone();
        let new = crate::store::NewInstance {
            version: "test",
            host: "here",
            pid: 1,
            mode: "webhook",
        };
        let a = store.register_instance(&new).await.expect("a");
        let b = store.register_instance(&new).await.expect("b");
        let leases = leases(store.clone(), a);
        let notice: super::super::Notice = Arc::new(|_, _| async { true }.boxed());
        let inbox = Inbox::with_leases(store, 1, notice, Some(leases.clone()), None);
        (inbox, leases, b, dir)
    }

    const LEASE: Duration = Duration::from_secs(60);

    pub(in crate::bot) async fn stored(inbox: &Inbox, update_id: i64, chat_id: Option<i64>) {
        let row = crate::store::NewUpdate {
            update_id,
            chat_id,
            user_id: chat_id,
            payload: "{}",
        };
        inbox
            .store()
            .insert_updates(1, &[row])
            .await
            .expect("stored");
    }

    pub(in crate::bot) async fn is_handled(inbox: &Inbox, update_id: i64) -> bool {
        let waiting = inbox
            .store()
            .unhandled_updates(1, 100, 100)
            .await
            .expect("rows");
        !waiting.iter().any(|row| row.update_id == update_id)
    }

    /// `/import` and `/week` run in a task of their own: it keeps the chat's lease
    /// until it ends (no other instance takes the chat meanwhile and runs it again).
    #[tokio::test]
    async fn a_deferred_update_keeps_its_chats_lease_until_it_is_handled() {
        let (inbox, leases, b, _dir) = leased_inbox().await;
        stored(&inbox, 7, Some(5)).await;
        let lease = leases.hold(5).await.expect("take").expect("free");
        let taking = taking(&inbox, 7).with_lease(lease);
        let done = taking.defer();
        drop(taking); // the lane moves on
        leases.release_unused().await;
        let store = inbox.store();
        assert!(
            store
                .take_chat_lease(5, b, LEASE)
                .await
                .expect("asked")
                .is_none(),
            "kept while the task works"
        );
        done.handled().await;
        assert!(is_handled(&inbox, 7).await);
        leases.release_unused().await;
        assert!(
            store
                .take_chat_lease(5, b, LEASE)
                .await
                .expect("asked")
                .is_some(),
            "given up once idle"
        );
    }

    /// A task's update is marked under the chat's lease: after a take-over the mark
    /// writes nothing, and the new holder handles the update.
    #[tokio::test]
    async fn a_deferred_update_is_not_marked_after_its_chat_was_taken_over() {
        let (inbox, leases, b, _dir) = leased_inbox().await;
        stored(&inbox, 7, Some(5)).await;
        let lease = leases.hold(5).await.expect("take").expect("free");
        let fence = lease.fence();
        let done = taking(&inbox, 7).with_lease(lease).defer();
        let store = inbox.store();
        // Its lease ran out (a stall) and another instance took the chat.
        store.release_chat_lease(&fence).await.expect("expired");
        assert!(
            store
                .take_chat_lease(5, b, LEASE)
                .await
                .expect("asked")
                .is_some()
        );
        let exporter = crate::observe::exporter().expect("the recorder");
        done.handled().await;
        assert!(!is_handled(&inbox, 7).await, "left to the new holder");
        assert!(!inbox.lanes().done.contains(&7), "and not marked later");
        assert!(
            crate::observe::render(exporter).contains(crate::observe::UPDATES_MARK_FENCED),
            "counted"
        );
    }

    /// A task that stopped because its chat's lease was lost leaves its update
    /// unmarked, for the table: read again, by whichever instance holds the chat.
    #[tokio::test]
    async fn a_task_that_lost_its_lease_leaves_its_update_to_the_table() {
        let (inbox, leases, _b, _dir) = leased_inbox().await;
        stored(&inbox, 7, Some(5)).await;
        assert!(inbox.read_table().await.is_none(), "read");
        let lease = leases.hold(5).await.expect("take").expect("free");
        let done = taking(&inbox, 7).with_lease(lease).defer();
        done.let_go();
        assert!(!is_handled(&inbox, 7).await, "not marked");
        let lanes = inbox.lanes();
        assert!(!lanes.deferred.contains(&7), "released");
        assert!(!lanes.done.contains(&7));
        assert!(!lanes.in_sync(), "the table is read again");
    }

    /// An update with no chat keeps no order, and takes no lease (no lease row is
    /// left behind for it).
    #[tokio::test]
    async fn an_update_without_a_chat_takes_no_lease() {
        let (inbox, _leases, _b, dir) = leased_inbox().await;
        stored(&inbox, 9, None).await;
        assert!(matches!(inbox.lane_lease(Lane::Alone(9)).await, Some(None)));
        let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
        let pool = sqlx::SqlitePool::connect(&url).await.expect("pool");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM chat_leases")
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(rows, 0);
    }

    fn message(update_id: i64, chat_id: i64) -> String {
        serde_json::json!({"update_id": update_id, "message": {
            "message_id": update_id, "date": 1_764_460_800_i64,
            "chat": {"id": chat_id, "type": "private", "first_name": "a"},
            "from": {"id": chat_id, "is_bot": false, "first_name": "a"},
            "text": "hi"}})
        .to_string()
    }

    #[tokio::test]
    async fn a_chats_rows_run_in_order_across_the_table_and_the_hand_over() {
        let (inbox, _dir) = inbox().await;
        let (one, two) = (message(1, 5), message(2, 5));
        let row = |update_id, payload| crate::store::NewUpdate {
            update_id,
            chat_id: Some(5),
            user_id: Some(5),
            payload,
        };
        // Row 1 is what a crash left in the table; row 2 is committed and handed over.
        inbox
            .store()
            .insert_updates(1, &[row(1, &one), row(2, &two)])
            .await
            .expect("stored");
        inbox.hand_over(vec![Arrived {
            update_id: 2,
            chat_id: Some(5),
            update: Box::new(serde_json::from_str(&two).expect("an update")),
        }]);
        let lane = Lane::Chat(5);
        assert!(
            inbox.next_row(lane).is_none(),
            "not before the table is read"
        );
        assert!(inbox.read_table().await.is_none(), "read");
        assert!(inbox.lanes().in_sync());
        let first = inbox.next_row(lane).expect("the older row first");
        assert_eq!(first.update_id, 1);
        assert!(matches!(first.body, Body::Stored(Some(_))));
        assert!(inbox.next_row(lane).is_none(), "one at a time");
        // Handled: marked in the table, then out of the memory.
        inbox
            .store()
            .mark_update_handled(UpdateKey {
                bot_id: 1,
                update_id: 1,
            })
            .await
            .expect("marked");
        inbox.lanes().forget(lane, 1);
        let second = inbox.next_row(lane).expect("then the one handed over");
        assert_eq!(second.update_id, 2);
        assert!(matches!(second.body, Body::Parsed(_)), "not read again");
        // Its try fails: it is read from the table again before it runs.
        inbox.unread(lane, 2);
        assert!(!inbox.lanes().in_sync());
        assert!(
            inbox.next_row(lane).is_none(),
            "not before the table is read"
        );
        assert!(inbox.read_table().await.is_none(), "read");
        let again = inbox.next_row(lane).expect("read again");
        assert_eq!(again.update_id, 2);
        assert!(matches!(again.body, Body::Stored(Some(_))));
        assert_eq!(inbox.lanes().held, 1);
    }

    #[tokio::test]
    async fn past_its_bound_the_memory_leaves_new_rows_to_the_table() {
        let (inbox, _dir) = inbox().await;
        assert!(inbox.read_table().await.is_none(), "the first read");
        inbox.lanes().held = HELD_MAX;
        let one = message(1, 5);
        inbox.hand_over(vec![Arrived {
            update_id: 1,
            chat_id: Some(5),
            update: Box::new(serde_json::from_str(&one).expect("an update")),
        }]);
        let lanes = inbox.lanes();
        assert!(lanes.waiting.is_empty(), "not kept");
        assert!(!lanes.in_sync(), "the table is read on the next pass");
    }

    /// A row as the table gives it.
    fn table_row(update_id: i64, chat: i64) -> InboxUpdate {
        InboxUpdate {
            update_id,
            chat_id: Some(chat),
            user_id: Some(chat),
            payload: Some("{}".to_owned()),
            held: false,
            failures: 0,
            next_try_at: NextTry::default(),
        }
    }

    /// A row as the table gives it when the read was told the memory holds it.
    fn held_row(update_id: i64, chat: i64) -> InboxUpdate {
        InboxUpdate {
            payload: None,
            held: true,
            ..table_row(update_id, chat)
        }
    }

    fn waiting_row(vouched: bool) -> Waiting {
        Waiting {
            failures: 0,
            next_try_at: NextTry::default(),
            body: Body::Stored(Some("{}".to_owned())),
            vouched,
            arrived: false,
        }
    }

    /// An update that came to this instance counts as arrived by its tag, not by the
    /// shape of what the memory holds of it: after a failed try its body is read back
    /// from the table, and its chat — found held by another instance a moment ago, and
    /// given up there since — is still asked for at once rather than left until that
    /// lease would have run out.
    #[tokio::test]
    async fn an_update_that_arrived_here_still_asks_for_its_chat_after_a_failed_try() {
        let (inbox, leases, b, _dir) = leased_inbox().await;
        let payload = message(2, 5);
        inbox
            .store()
            .insert_updates(
                1,
                &[crate::store::NewUpdate {
                    update_id: 2,
                    chat_id: Some(5),
                    user_id: Some(5),
                    payload: &payload,
                }],
            )
            .await
            .expect("stored");
        inbox.hand_over(vec![Arrived {
            update_id: 2,
            chat_id: Some(5),
            update: Box::new(serde_json::from_str(&payload).expect("an update")),
        }]);
        assert!(inbox.read_table().await.is_none(), "read");
        let lane = Lane::Chat(5);
        assert_eq!(inbox.next_row(lane).expect("runs").update_id, 2);
        inbox.unread(lane, 2); // its try failed
        // Meanwhile another instance held the chat (this one found so), then gave it up.
        let store = inbox.store();
        let theirs = store
            .take_chat_lease(5, b, LEASE)
            .await
            .expect("take")
            .expect("free");
        assert!(leases.hold(5).await.expect("asked").is_none(), "b's");
        store.release_chat_lease(&theirs).await.expect("given up");
        assert!(inbox.read_table().await.is_none(), "read back");
        assert!(matches!(
            inbox
                .lanes()
                .waiting
                .get(&lane)
                .and_then(|q| q.get(&2))
                .map(|row| &row.body),
            Some(Body::Stored(Some(_)))
        ));
        assert!(
            matches!(inbox.lane_lease(lane).await, Some(Some(_))),
            "the chat is asked for at once: its update arrived here"
        );
    }

    /// A lane that leaves the memory while a read is under way (another instance holds
    /// the chat, or the lease was just taken) is not brought back by that read, which
    /// may have seen its older row before it left and a newer one since: the newer one
    /// alone would be handled first. The next read brings both, in order.
    #[test]
    fn a_lane_dropped_during_a_read_is_not_brought_back_in_part_by_it() {
        let lane = Lane::Chat(7);
        let mut lanes = Lanes::default();
        lanes
            .waiting
            .entry(lane)
            .or_default()
            .insert(1, waiting_row(true));
        lanes.held = 1;
        lanes.reading = true;
        lanes.drop_lane(lane);
        merge(&mut lanes, vec![table_row(1, 7), table_row(2, 7)], 0, true);
        assert!(!lanes.waiting.contains_key(&lane), "nothing of the lane");
        lanes.dropped.clear();
        merge(&mut lanes, vec![table_row(1, 7), table_row(2, 7)], 1, true);
        let queue = lanes.waiting.get(&lane).expect("the lane, whole");
        assert_eq!(queue.keys().copied().collect::<Vec<_>>(), [1, 2]);
    }

    /// Reads of the table come two at once (a chat's first update, then its new
    /// lease's), then one per spacing however many are asked for; a quiet spell gives
    /// back at most the burst.
    #[test]
    fn reads_of_the_table_come_in_a_burst_of_two_then_spaced() {
        let start = tokio::time::Instant::now();
        let ms = |n: u64| start + Duration::from_millis(n);
        let mut pace = ReadPace::default();
        assert_eq!(pace.take(ms(0)), None);
        assert_eq!(pace.take(ms(1)), None);
        let next = pace.take(ms(2)).expect("spent");
        assert!(next > ms(2) && next <= ms(21), "{:?}", next - start);
        assert_eq!(pace.take(next), None, "one more by then");
        assert!(pace.take(next).is_some());
        // A quiet minute: two at once again, not three thousand.
        let later = ms(60_000);
        assert_eq!(pace.take(later), None);
        assert_eq!(pace.take(later), None);
        assert!(pace.take(later).is_some());
    }

    /// A lease new to the loop goes to work at once when the chat's rows in the table
    /// are the memory's — brought up to date with what another instance recorded of them.
    /// A row another instance handled meanwhile (stale in memory), or an older update it
    /// committed since the last read (missing), sends the lane back for a read of the
    /// table first.
    #[tokio::test]
    async fn a_new_lease_needs_no_read_unless_the_table_differs_from_the_memory() {
        let (inbox, _leases, b, _dir) = shared_leased_inbox(LEASE).await;
        let store = inbox.store().clone();
        for (update_id, chat) in [(3, 7), (2, 5), (4, 6), (9, 8), (10, 8)] {
            stored(&inbox, update_id, Some(chat)).await;
        }
        assert!(inbox.read_table().await.is_none(), "read");
        // Meanwhile another instance held chats 6 and 8, recorded a failed try of 4,
        // handled 9, and gave them up; and it committed an older update of chat 5.
        let later = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
        for chat in [6, 8] {
            let theirs = store
                .take_chat_lease(chat, b, LEASE)
                .await
                .expect("take")
                .expect("free");
            store.release_chat_lease(&theirs).await.expect("given up");
        }
        let key = |update_id| UpdateKey {
            bot_id: 1,
            update_id,
        };
        store
            .record_update_failure(key(4), "handler_failed", later)
            .await
            .expect("failure");
        store.mark_update_handled(key(9)).await.expect("handled");
        stored(&inbox, 1, Some(5)).await;

        let first = inbox.lane_lease(Lane::Chat(7)).await;
        let first = first.expect("runs at once").expect("a lease");
        assert_eq!(first.fence().generation, 1);
        assert!(inbox.lanes().waiting[&Lane::Chat(7)][&3].vouched);
        drop(first);
        // A read under way that began before chat 6's rows were read (it saw 4 with no
        // failure yet, and a row 5 another instance has handled since) brings none of
        // that over them.
        inbox.lanes().reading = true;
        let taken = inbox.lane_lease(Lane::Chat(6)).await;
        let taken = taken.expect("runs at once").expect("a lease");
        assert_eq!(taken.fence().generation, 2, "taken over");
        {
            let mut guard = inbox.lanes();
            let lanes = &mut *guard;
            merge(lanes, vec![table_row(4, 6), table_row(5, 6)], 0, true);
            lanes.reading = false;
            lanes.dropped.clear();
            let queue = &lanes.waiting[&Lane::Chat(6)];
            assert_eq!(queue.keys().copied().collect::<Vec<_>>(), [4]);
            assert_eq!(
                (queue[&4].failures, queue[&4].next_try_at.0.is_some()),
                (1, true)
            );
        }
        drop(taken);
        for (chat, why) in [(5, "an older row is missing"), (8, "a row is stale")] {
            assert!(inbox.lane_lease(Lane::Chat(chat)).await.is_none(), "{why}");
            assert!(
                !inbox.lanes().waiting.contains_key(&Lane::Chat(chat)),
                "{why}"
            );
        }
        assert!(!inbox.lanes().in_sync(), "the table is read again");
        assert!(inbox.read_table().await.is_none(), "read");
        let lanes = inbox.lanes();
        let ids = |chat| {
            lanes.waiting[&Lane::Chat(chat)]
                .keys()
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(5), [1, 2], "both, in order");
        assert_eq!(ids(8), [10], "the handled row is gone");
    }

    /// A read leaves out the payloads of the rows the memory held when it began. Such a
    /// row is not taken for one without an update (which would be marked dead) when, by
    /// the time the read is merged, its try failed and it waits to be read again, or it
    /// left the memory: both are left to the next read, and this one does not count as
    /// having seen every row. One still held is brought up to date as before.
    #[test]
    fn a_row_read_without_its_payload_never_stands_in_for_the_update() {
        let lane = Lane::Chat(7);
        let mut lanes = Lanes::default();
        let queue = lanes.waiting.entry(lane).or_default();
        queue.insert(
            1,
            Waiting {
                body: Body::Unread,
                ..waiting_row(true)
            },
        );
        queue.insert(3, waiting_row(false));
        lanes.held = 2;
        let mut failed_once = held_row(3, 7);
        failed_once.failures = 1;
        merge(
            &mut lanes,
            vec![held_row(1, 7), held_row(2, 7), failed_once],
            0,
            false,
        );
        let queue = &lanes.waiting[&lane];
        assert!(matches!(queue[&1].body, Body::Unread), "still to be read");
        assert!(
            !queue.contains_key(&2),
            "not brought back without its update"
        );
        assert!(matches!(queue[&3].body, Body::Stored(Some(_))), "kept");
        assert_eq!(queue[&3].failures, 1);
        assert!(queue[&3].vouched);
        assert_eq!(lanes.held, 2);
        assert!(!lanes.in_sync(), "the table is read again");
    }

    /// Among instances, a row handed over while a read was under way is not vouched for
    /// by that read: another instance may have committed an older row of its chat after
    /// the read's snapshot. Alone, the process commits every row itself, and it is.
    #[test]
    fn among_instances_a_read_vouches_only_for_the_rows_it_saw() {
        for (shared, vouched) in [(true, false), (false, true)] {
            let mut lanes = Lanes::default();
            lanes
                .waiting
                .entry(Lane::Chat(8))
                .or_default()
                .insert(5, waiting_row(false));
            lanes.held = 1;
            merge(&mut lanes, vec![table_row(1, 9)], 0, shared);
            let row = &lanes.waiting[&Lane::Chat(8)][&5];
            assert_eq!(row.vouched, vouched, "shared: {shared}");
            assert!(lanes.waiting[&Lane::Chat(9)][&1].vouched, "a row it saw");
        }
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
