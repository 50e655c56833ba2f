//! One `daylog run` among others on one database (docs/operations.md, Several
//! instances): what keeps a second daemon off a SQLite file, the one polling instance
//! of a PostgreSQL database, the instance's row in `instances` and its heartbeat.
//!
//! - **SQLite**: one daemon per file. [`lock_database`] takes an exclusive lock on
//!   `<database>.lock` beside it for the process's life (the kernel lets go when the
//!   process ends, however it ends); a second `daylog run` is refused with a sentence.
//!   `daylog chat`, `sql`, `backup` and `migrate` never take it.
//! - **PostgreSQL**: any number of webhook instances; at most one polling instance,
//!   which holds a session advisory lock (`Store::try_polling_lock`) — the others are
//!   refused at start-up, before they ask Telegram anything.
//! - **Both**: [`Member::join`] records the process in `instances`; [`Member::beat`]
//!   renews its `last_seen` and every chat lease it holds each third of
//!   `cluster.lease_ms`, and counts the instances alive for `/metrics`;
//!   [`Member::leave`] marks a clean stop and gives its chats up at once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{Settings, TelegramMode};
use crate::store::{Fence, InstanceId, NewInstance, PollingLock, Store, StoreError};

/// Why this process may not run as a daemon on its database.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "another `daylog run` is already using the database {database} (it holds {lock}); only one may run on a SQLite file — stop it first (`daylog chat`, `sql`, `backup` and `migrate` work beside it), or move to PostgreSQL to run several"
    )]
    SqliteInUse { database: String, lock: String },
    #[error("cannot take the lock file {lock} beside the database: {source}")]
    LockFile {
        lock: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another daylog instance is already polling Telegram for this database, and only one may: run the others with telegram.mode = \"webhook\" behind one load balancer, or stop the one that polls"
    )]
    PollingTaken,
    #[error(
        "another daylog instance took over polling Telegram for this database while this one had lost its connection to it; this one stops"
    )]
    PollingLost,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The lock on `<database>.lock`, held while this lives (and released by the kernel
/// when the process ends).
#[derive(Debug)]
pub struct LockFile {
    _file: std::fs::File,
}

/// SQLite: takes the lock beside the database file, or refuses while another process
/// holds it. `None` on PostgreSQL (its instances share the database by design).
pub fn lock_database(url: &str) -> Result<Option<LockFile>, ClusterError> {
    if crate::config::is_postgres_url(url) {
        return Ok(None);
    }
    let database = crate::config::database_path(url).map_err(StoreError::from)?;
    let database = std::path::absolute(&database).unwrap_or(database);
    // Links resolved (the file's own, else its folder's): two paths to one database
    // file name one lock.
    let database = std::fs::canonicalize(&database).unwrap_or_else(|_| {
        match (database.parent(), database.file_name()) {
            (Some(dir), Some(name)) => {
                std::fs::canonicalize(dir).map_or_else(|_| database.clone(), |dir| dir.join(name))
            }
            _ => database.clone(),
        }
    });
    let mut lock = database.clone().into_os_string();
    lock.push(".lock");
    let lock = PathBuf::from(lock);
    let shown = lock.display().to_string();
    let io_error = |source| ClusterError::LockFile {
        lock: shown.clone(),
        source,
    };
    if let Some(dir) = lock.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_error)?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock)
        .map_err(io_error)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(LockFile { _file: file })),
        Err(std::fs::TryLockError::WouldBlock) => Err(ClusterError::SqliteInUse {
            database: database.display().to_string(),
            lock: shown,
        }),
        Err(std::fs::TryLockError::Error(source)) => Err(io_error(source)),
    }
}

/// This process as one instance of its database.
pub struct Member {
    store: Store,
    id: InstanceId,
    lease: Duration,
    /// The polling singleton, held for the process's life (PostgreSQL, polling mode).
    polling: Option<PollingLock>,
    /// The chat leases this instance holds.
    leases: Leases,
}

impl Member {
    /// Records this process in `instances`; in polling mode on PostgreSQL first takes
    /// the polling lock, refusing ([`ClusterError::PollingTaken`]) while another
    /// instance polls.
    pub async fn join(store: &Store, settings: &Settings) -> Result<Self, ClusterError> {
        let mode = settings.telegram.mode();
        let polling = match mode {
            TelegramMode::Polling if store.is_postgres() => Some(
                store
                    .try_polling_lock()
                    .await?
                    .ok_or(ClusterError::PollingTaken)?,
            ),
            _ => None,
        };
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let id = store
            .register_instance(&NewInstance {
                version: env!("CARGO_PKG_VERSION"),
                host: host.trim(),
                pid: i64::from(std::process::id()),
                mode: match mode {
                    TelegramMode::Polling => "polling",
                    TelegramMode::Webhook => "webhook",
                },
            })
            .await?;
        if !store.is_postgres() {
            // The lock file is ours: whoever held leases before is gone.
            store.release_others(id).await?;
        }
        if let Err(error) = store.forget_chatless_leases().await {
            tracing::debug!(%error, "could not delete the leases of updates without a chat");
        }
        tracing::info!(instance = id.0, "joined the database's instances");
        let lease = settings.cluster.lease();
        Ok(Self {
            store: store.clone(),
            id,
            lease,
            polling,
            leases: Leases::new(store.clone(), id, lease),
        })
    }

    /// This instance's id: the holder of its leases.
    pub fn id(&self) -> InstanceId {
        self.id
    }

    /// `cluster.lease_ms`.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The chat leases of this instance (a shared handle).
    pub fn leases(&self) -> Leases {
        self.leases.clone()
    }

    /// The heartbeat, every third of the lease until `until` (after the daemon's work in
    /// hand is done: its leases hold while it finishes): `last_seen`, every held lease
    /// renewed, the instances alive counted. While the database does not answer
    /// it keeps trying (said once per outage). When the polling lock was lost (the
    /// server restarted) it is taken again; if another instance took it meanwhile,
    /// this one stops (`stop` is cancelled) and the error says why.
    pub async fn beat(
        mut self,
        until: CancellationToken,
        stop: CancellationToken,
    ) -> (Self, Option<ClusterError>) {
        let every = self.lease / 3;
        let mut failing = false;
        loop {
            match self.beat_once().await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("the database answers the heartbeat again");
                }
                Ok(()) => {}
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(%error, "the heartbeat cannot reach the database; trying again");
                }
                Err(_) => {}
            }
            if let Err(error) = self.keep_polling_lock().await {
                tracing::error!(%error, "stopping");
                stop.cancel();
                return (self, Some(error));
            }
            tokio::select! {
                () = until.cancelled() => return (self, None),
                () = tokio::time::sleep(every) => {}
            }
        }
    }

    async fn beat_once(&self) -> Result<(), StoreError> {
        let beat_at = tokio::time::Instant::now();
        let chats = self.leases.in_hand();
        let held = self.store.heartbeat(self.id, self.lease, &chats).await?;
        let count = self.leases.renewed(held, beat_at);
        self.leases.release_idle().await;
        let alive = self.store.alive_instances(self.lease).await?;
        crate::observe::cluster_seen(alive, count);
        Ok(())
    }

    /// Takes the polling lock again when its connection was lost; an error when another
    /// instance holds it now.
    async fn keep_polling_lock(&mut self) -> Result<(), ClusterError> {
        let Some(lock) = self.polling.as_mut() else {
            return Ok(());
        };
        if lock.still_held().await {
            return Ok(());
        }
        match self.store.try_polling_lock().await {
            Ok(Some(lock)) => {
                tracing::info!("took the polling lock again after losing its connection");
                self.polling = Some(lock);
                Ok(())
            }
            Ok(None) => Err(ClusterError::PollingLost),
            // The database is away: the lock is taken again once it answers.
            Err(_) => Ok(()),
        }
    }

    /// A clean stop: `stopped_at` set, every lease given up for the others to take.
    pub async fn leave(self) {
        if let Err(error) = self.store.instance_stopped(self.id).await {
            tracing::warn!(%error, "could not record this instance's stop; its leases expire on their own");
        }
    }
}

/// The chat leases this instance holds, shared by what works on chats (the inbox's
/// handling, the worker): a chat's lease is taken once and kept while it is in use and
/// for a while after (renewed by the heartbeat, one statement for all), so working on
/// a chat costs no statement of its own while the lease is held. A chat idle for two
/// leases is given up, for whichever instance receives its next update.
#[derive(Clone)]
pub struct Leases {
    store: Store,
    holder: InstanceId,
    lease: Duration,
    held: Arc<std::sync::Mutex<HashMap<i64, Held>>>,
    /// Held while idle leases are given up ([`Leases::release_idle`]): a `hold` of a
    /// chat being given up waits for it, then takes the chat from the database again.
    releasing: Arc<tokio::sync::Mutex<()>>,
    /// Chats another instance holds, and until when its lease runs (as the database
    /// said, on this process's clock): not asked for again before then, unless an
    /// update of the chat arrived here ([`Leases::hold_arrived`]).
    elsewhere: Arc<std::sync::Mutex<HashMap<i64, tokio::time::Instant>>>,
    /// Other instances may share the database (PostgreSQL); a test may say so of a
    /// SQLite store, to run work under leases that can be lost.
    shared: bool,
}

/// A lease in hand: its fence, how many [`ChatLease`]s use it, when it was last let go.
struct Held {
    fence: Fence,
    /// Until when this instance may count on it without asking the database: the
    /// moment before the statement that took or last renewed it, plus the lease, less
    /// a margin. After it (the heartbeat stalled: the database did not answer) the
    /// lease may have run out and been taken: [`ChatLease::held`] is false and
    /// [`Leases::hold`] asks the database again.
    valid_until: tokio::time::Instant,
    users: usize,
    idle_since: tokio::time::Instant,
    /// When it was taken: a heartbeat that started before cannot have renewed it.
    taken_at: tokio::time::Instant,
    /// Being given up ([`Leases::release_idle`]): nobody starts using it any more.
    releasing: bool,
}

/// Working on one chat under its lease; the lease stays this instance's after it is
/// dropped until it has been idle for two leases.
pub struct ChatLease {
    leases: Leases,
    fence: Fence,
    /// Taken from the database just now, not in hand before: what this instance
    /// remembers of the chat may be stale (another instance may have worked on it).
    fresh: bool,
}

impl ChatLease {
    /// What a write under this lease checks.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// Taken just now rather than in hand (see the field).
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// Whether another instance may take this lease over (PostgreSQL): only then must
    /// work under it check it before it sends and fence its writes (on SQLite the lock
    /// file keeps every other daemon out).
    pub fn shared(&self) -> bool {
        self.leases.shared()
    }

    /// Another use of the same lease (work handed to a task of its own keeps the chat
    /// with this instance until it ends); `None` when it was taken over.
    pub fn share(&self) -> Option<Self> {
        let mut map = self.leases.map();
        let held = map
            .get_mut(&self.fence.chat_id)
            .filter(|held| held.fence == self.fence)?;
        held.users += 1;
        Some(Self {
            leases: self.leases.clone(),
            fence: self.fence,
            fresh: false,
        })
    }

    /// Whether the lease is still this instance's, as the last heartbeat found it, and
    /// the heartbeat renewed it recently enough that it cannot have run out.
    pub fn held(&self) -> bool {
        let now = tokio::time::Instant::now();
        self.leases
            .map()
            .get(&self.fence.chat_id)
            .is_some_and(|held| held.fence == self.fence && held.valid_until > now)
    }
}

impl ChatLease {
    /// Resolves once [`ChatLease::held`] is false: the lease's deadline here passed
    /// without a renewal (before another instance can take it over), or the heartbeat
    /// found it taken over. Wakes only at the deadlines.
    pub async fn lost(&self) {
        loop {
            let until = self
                .leases
                .map()
                .get(&self.fence.chat_id)
                .filter(|held| held.fence == self.fence)
                .map(|held| held.valid_until);
            match until {
                Some(until) if until > tokio::time::Instant::now() => {
                    tokio::time::sleep_until(until).await;
                }
                _ => return,
            }
        }
    }

    /// [`ChatLease::held`], or — when only its deadline here passed (the heartbeat was
    /// late: a stalled process, a slow database) — whether the database still names
    /// this instance and generation as the chat's holder, renewing the lease if so (one
    /// statement, only then). `false` once another instance took the chat over, or when
    /// the database cannot say: what is about to be done under the lease is not.
    pub async fn confirm(&self) -> bool {
        if self.held() {
            return true;
        }
        let in_hand = self
            .leases
            .map()
            .get(&self.fence.chat_id)
            .is_some_and(|held| held.fence == self.fence);
        if !in_hand {
            return false; // the heartbeat found it taken over
        }
        let asked_at = tokio::time::Instant::now();
        match self
            .leases
            .store
            .renew_chat_lease(&self.fence, self.leases.lease)
            .await
        {
            Ok(true) => {
                let valid_until = self.leases.valid_until(asked_at);
                if let Some(held) = self.leases.map().get_mut(&self.fence.chat_id)
                    && held.fence == self.fence
                {
                    held.valid_until = held.valid_until.max(valid_until);
                }
                true
            }
            Ok(false) => false,
            Err(error) => {
                tracing::warn!(%error, chat_id = self.fence.chat_id, "cannot ask the database whether a chat's lease is still this instance's");
                false
            }
        }
    }
}

impl Drop for ChatLease {
    fn drop(&mut self) {
        if let Some(held) = self.leases.map().get_mut(&self.fence.chat_id)
            && held.fence == self.fence
        {
            held.users = held.users.saturating_sub(1);
            held.idle_since = tokio::time::Instant::now();
        }
    }
}

impl Leases {
    fn new(store: Store, holder: InstanceId, lease: Duration) -> Self {
        Self {
            holder,
            lease,
            held: Arc::default(),
            releasing: Arc::default(),
            elsewhere: Arc::default(),
            shared: store.is_postgres(),
            store,
        }
    }

    /// The leases of `holder` on `store`, without a heartbeat: for tests of what works
    /// under them.
    #[cfg(test)]
    pub(crate) fn for_test(store: Store, holder: InstanceId, lease: Duration) -> Self {
        Self::new(store, holder, lease)
    }

    /// The same, counted as shared with other instances even on SQLite: what works
    /// under them checks them as it would on PostgreSQL.
    #[cfg(test)]
    pub(crate) fn shared_for_test(store: Store, holder: InstanceId, lease: Duration) -> Self {
        Self {
            shared: true,
            ..Self::new(store, holder, lease)
        }
    }

    /// Gives up at once every lease not in use (the heartbeat waits two leases).
    #[cfg(test)]
    pub(crate) async fn release_unused(&self) {
        self.release_idle_for(Duration::ZERO).await;
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Held>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Works on `chat_id` under its lease: the one in hand, or one taken now; `None`
    /// while another live instance holds it (that one works on the chat). A chat
    /// another instance was found to hold is not asked for again until its lease ran
    /// out there (see [`Leases::hold_arrived`]).
    pub async fn hold(&self, chat_id: i64) -> Result<Option<ChatLease>, StoreError> {
        if self.held_elsewhere(chat_id) {
            return Ok(None);
        }
        self.take(chat_id).await
    }

    /// [`Leases::hold`] for a chat with an update that arrived at this instance: the
    /// database is asked even when another instance held the chat a moment ago (it may
    /// have given it up since; its next update must not wait for the lease to run out).
    pub async fn hold_arrived(&self, chat_id: i64) -> Result<Option<ChatLease>, StoreError> {
        self.take(chat_id).await
    }

    /// Whether another instance was found holding `chat_id` and its lease has not run
    /// out since.
    fn held_elsewhere(&self, chat_id: i64) -> bool {
        let mut elsewhere = self.elsewhere();
        let now = tokio::time::Instant::now();
        match elsewhere.get(&chat_id) {
            Some(until) if *until > now => true,
            Some(_) => {
                elsewhere.remove(&chat_id);
                false
            }
            None => false,
        }
    }

    fn elsewhere(&self) -> std::sync::MutexGuard<'_, HashMap<i64, tokio::time::Instant>> {
        self.elsewhere
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn take(&self, chat_id: i64) -> Result<Option<ChatLease>, StoreError> {
        let asked_at = tokio::time::Instant::now();
        // The lease in hand: used at once while its deadline holds; past it, counted as
        // in use while the database is asked, so that it is not given up meanwhile. One
        // being given up: that ends first, then the database is asked.
        let pending = loop {
            let being_released = {
                let mut map = self.map();
                match map.get_mut(&chat_id) {
                    Some(held) if held.releasing => true,
                    Some(held) => {
                        held.users += 1;
                        if held.valid_until > asked_at {
                            return Ok(Some(ChatLease {
                                leases: self.clone(),
                                fence: held.fence,
                                fresh: false,
                            }));
                        }
                        break Some(held.taken_at);
                    }
                    None => break None,
                }
            };
            if being_released {
                let _released = self.releasing.lock().await;
                // The release is over (or was cut off): what it marked is not in hand.
                let mut map = self.map();
                if map.get(&chat_id).is_some_and(|held| held.releasing) {
                    map.remove(&chat_id);
                }
            }
        };
        let taken = self
            .store
            .take_chat_lease(chat_id, self.holder, self.lease)
            .await;
        let now = tokio::time::Instant::now();
        let fence = match taken {
            Ok(Some(fence)) => fence,
            other => {
                if let Some(held) = self
                    .map()
                    .get_mut(&chat_id)
                    .filter(|held| Some(held.taken_at) == pending)
                {
                    held.users = held.users.saturating_sub(1);
                    held.idle_since = now;
                }
                if let Ok(None) = other {
                    self.note_elsewhere(chat_id).await;
                }
                return other.map(|_| None);
            }
        };
        let mut map = self.map();
        // The use counted above, if its entry is still the one counted.
        let counted = map
            .get(&chat_id)
            .is_some_and(|held| Some(held.taken_at) == pending);
        let valid_until = self.valid_until(asked_at);
        let held = map.entry(chat_id).or_insert(Held {
            fence,
            valid_until,
            users: 0,
            idle_since: now,
            taken_at: now,
            releasing: false,
        });
        // In hand before with the same generation (its deadline had passed, nobody took
        // it meanwhile): no other instance worked on the chat, nothing is stale.
        let fresh = held.fence != fence || held.taken_at == now;
        held.fence = fence; // the same holder's take keeps the generation
        held.valid_until = held.valid_until.max(valid_until);
        if !counted {
            held.users += 1;
        }
        drop(map);
        self.elsewhere().remove(&chat_id);
        Ok(Some(ChatLease {
            leases: self.clone(),
            fence,
            fresh,
        }))
    }

    /// Another instance holds `chat_id`: remembered until its lease runs out there (as
    /// the database says; at most one lease when it cannot say).
    async fn note_elsewhere(&self, chat_id: i64) {
        let left = match self.store.chat_lease_left(chat_id).await {
            Ok(Some(left)) => left.min(self.lease),
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%error, "cannot read how long another instance holds a chat");
                return;
            }
        };
        let until = tokio::time::Instant::now() + left;
        self.elsewhere().insert(chat_id, until);
    }

    /// How long a lease taken or renewed by a statement that started at `asked_at` can
    /// be counted on here: the lease less a fifth (the database's clock and this
    /// process's need not tick alike).
    fn valid_until(&self, asked_at: tokio::time::Instant) -> tokio::time::Instant {
        asked_at + self.lease - self.lease / 5
    }

    /// The chats whose leases are in hand: what the heartbeat renews.
    fn in_hand(&self) -> Vec<i64> {
        self.map().keys().copied().collect()
    }

    /// Whether this instance has chat `chat_id`'s lease in hand.
    pub fn holds(&self, chat_id: i64) -> bool {
        self.map().contains_key(&chat_id)
    }

    /// Whether these leases are on PostgreSQL, where other instances may share the
    /// database (on SQLite the lock file keeps them out).
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// What the heartbeat renewed: a lease not among them was taken over, and is
    /// dropped (its users see [`ChatLease::held`] false; their writes are fenced).
    /// Returns how many are held.
    fn renewed(&self, held: Vec<Fence>, beat_at: tokio::time::Instant) -> usize {
        let renewed_until = self.valid_until(beat_at);
        let mut map = self.map();
        map.retain(|chat, in_hand| {
            let renewed = held.iter().any(|fence| fence == &in_hand.fence);
            if renewed {
                in_hand.valid_until = in_hand.valid_until.max(renewed_until);
            }
            let kept = in_hand.taken_at >= beat_at || renewed;
            if !kept {
                tracing::warn!(chat_id = chat, "a chat's lease was taken over by another instance; this one stops working on it");
            }
            kept
        });
        map.len()
    }

    /// Gives up the leases idle for two leases.
    async fn release_idle(&self) {
        self.release_idle_for(self.lease * 2).await;
    }

    /// Gives up the leases unused for `idle_for`: each is marked as being given up (no
    /// `hold` starts using it from then on: one waits for the release, then asks the
    /// database), given up in the database, and only then dropped from the hand. A
    /// lease in use (a `hold` asking the database counts) is never given up, so a
    /// release never lands after a take of the same chat by this instance.
    async fn release_idle_for(&self, idle_for: Duration) {
        let _releasing = self.releasing.lock().await;
        let idle: Vec<Fence> = {
            let mut map = self.map();
            let now = tokio::time::Instant::now();
            map.values_mut()
                .filter(|held| held.users == 0 && now - held.idle_since >= idle_for)
                .map(|held| {
                    held.releasing = true;
                    held.fence
                })
                .collect()
        };
        for fence in &idle {
            if let Err(error) = self.store.release_chat_lease(fence).await {
                tracing::debug!(%error, "could not give up an idle lease; it expires on its own");
            }
        }
        self.map().retain(|_, held| !held.releasing);
        let now = tokio::time::Instant::now();
        self.elsewhere().retain(|_, until| *until > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a heartbeat (the database stalled it) a lease in hand stops counting once
    /// its own deadline passed: `held` turns false, and `hold` asks the database again,
    /// which answers that another instance took the chat meanwhile.
    #[tokio::test]
    async fn a_lease_not_renewed_in_time_is_no_longer_held_here() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("daylog.db").display());
        let store = Store::open_and_migrate(&url, Duration::from_secs(5))
            .await
            .expect("store");
        let new = |mode| NewInstance {
            version: "test",
            host: "here",
            pid: 1,
            mode,
        };
        let a = store.register_instance(&new("webhook")).await.expect("a");
        let b = store.register_instance(&new("webhook")).await.expect("b");
        let lease = Duration::from_millis(300);
        let leases = Leases::new(store.clone(), a, lease);
        let chat = leases.hold(5).await.expect("take").expect("free");
        assert!(chat.held());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while chat.held() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "held forever without a heartbeat"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        while store
            .take_chat_lease(5, b, lease * 100)
            .await
            .expect("take")
            .is_none()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lease never ran out"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            leases.hold(5).await.expect("asked").is_none(),
            "the database says b holds the chat now"
        );
    }

    async fn sqlite_store(dir: &tempfile::TempDir) -> Store {
        let url = format!("sqlite://{}", dir.path().join("daylog.db").display());
        Store::open_and_migrate(&url, Duration::from_secs(5))
            .await
            .expect("store")
    }

    async fn member(store: &Store) -> InstanceId {
        store
            .register_instance(&NewInstance {
                version: "test",
                host: "here",
                pid: 1,
                mode: "webhook",
            })
            .await
            .expect("registered")
    }

    /// A `hold` of a chat whose idle lease is being given up (the release has marked it
    /// and not yet given it up in the database) waits for the release to end, counts no
    /// use of the lease being given up, and then takes the chat from the database
    /// again: the lease it gets is not given up under it (another instance could take
    /// the chat then, under this one's feet). The release's steps are taken by hand, so
    /// the hold meets the release in the middle every time.
    #[tokio::test]
    async fn a_lease_asked_for_while_idle_leases_are_given_up_stays_held() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = sqlite_store(&dir).await;
        let (a, b) = (member(&store).await, member(&store).await);
        let lease = Duration::from_secs(60);
        let leases = Leases::new(store.clone(), a, lease);
        let first = leases.hold(5).await.expect("take").expect("free");
        let fence = first.fence();
        drop(first);
        // A release under way: it holds the releasing lock and has marked the lease.
        let releasing = leases.releasing.lock().await;
        leases.map().get_mut(&5).expect("in hand").releasing = true;
        let mut asking = Box::pin(leases.hold(5));
        assert!(
            futures::poll!(&mut asking).is_pending(),
            "waits for the release"
        );
        assert_eq!(
            leases.map().get(&5).map(|held| held.users),
            Some(0),
            "no use counted of the lease being given up"
        );
        // The release ends: given up in the database, then dropped from the hand.
        store.release_chat_lease(&fence).await.expect("given up");
        leases.map().retain(|_, held| !held.releasing);
        drop(releasing);
        let chat = asking.await.expect("take").expect("ours");
        assert!(chat.held());
        assert!(chat.fresh(), "taken from the database again");
        leases.release_idle().await;
        assert!(
            store
                .take_chat_lease(5, b, lease)
                .await
                .expect("asked")
                .is_none(),
            "the chat in use is not given up"
        );
    }

    /// A task working under a lease stops once the lease can no longer be counted on
    /// here: `lost` waits while it holds, and ends when its deadline passed.
    #[tokio::test]
    async fn a_lease_is_lost_here_once_its_deadline_passed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = sqlite_store(&dir).await;
        let a = member(&store).await;
        let leases = Leases::new(store.clone(), a, Duration::from_secs(60));
        let chat = leases.hold(5).await.expect("take").expect("free");
        assert!(futures::poll!(Box::pin(chat.lost())).is_pending(), "held");
        if let Some(held) = leases.map().get_mut(&5) {
            held.valid_until = tokio::time::Instant::now();
        }
        chat.lost().await;
        assert!(!chat.held());
    }

    /// A chat another instance holds is not asked for again until that lease runs out
    /// (the database is not asked: here it is closed), unless an update of it arrived.
    #[tokio::test]
    async fn a_chat_held_elsewhere_is_not_asked_for_again_until_its_lease_runs_out() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (one, other) = (sqlite_store(&dir).await, sqlite_store(&dir).await);
        let (a, b) = (member(&one).await, member(&one).await);
        let lease = Duration::from_secs(60);
        let here = Leases::new(one.clone(), a, lease);
        let there = Leases::new(other.clone(), b, lease);
        let _chat = here.hold(5).await.expect("take").expect("free");
        assert!(there.hold(5).await.expect("asked").is_none(), "a holds it");
        other.close().await;
        assert!(
            there.hold(5).await.expect("not asked again").is_none(),
            "held elsewhere"
        );
        assert!(
            there.hold_arrived(5).await.is_err(),
            "an update that arrived asks the database"
        );
    }

    /// A lease whose deadline here passed without a heartbeat is confirmed by the
    /// database while nobody took the chat over (and counts again), and no longer once
    /// another instance did.
    #[tokio::test]
    async fn a_lease_past_its_deadline_here_is_confirmed_until_it_is_taken_over() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = sqlite_store(&dir).await;
        let (a, b) = (member(&store).await, member(&store).await);
        let lease = Duration::from_millis(300);
        let leases = Leases::new(store.clone(), a, lease);
        let chat = leases.hold(5).await.expect("take").expect("free");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while chat.held() {
            assert!(tokio::time::Instant::now() < deadline, "held forever");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(chat.confirm().await, "nobody took it: still a's");
        assert!(chat.held(), "renewed by the asking");
        while store
            .take_chat_lease(5, b, lease * 100)
            .await
            .expect("take")
            .is_none()
        {
            assert!(tokio::time::Instant::now() < deadline, "never ran out");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!chat.confirm().await, "b holds the chat now");
    }

    #[test]
    fn a_second_lock_on_one_database_is_refused_until_the_first_goes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("sub/daylog.db").display());
        let first = lock_database(&url).expect("free").expect("a file");
        assert!(dir.path().join("sub/daylog.db.lock").exists());
        let refused = lock_database(&url).expect_err("held");
        assert!(
            refused.to_string().contains("already using the database"),
            "{refused}"
        );
        std::fs::write(dir.path().join("sub/daylog.db"), b"").expect("database file");
        let alias = dir.path().join("alias.db");
        std::os::unix::fs::symlink(dir.path().join("sub/daylog.db"), &alias).expect("link");
        let through_link = format!("sqlite://{}", alias.display());
        assert!(
            lock_database(&through_link).is_err(),
            "a link to the database file names the same lock"
        );
        drop(first);
        assert!(lock_database(&url).expect("free again").is_some());
        assert!(
            lock_database("postgres://u@db/daylog")
                .expect("none")
                .is_none()
        );
    }
}
