//! The update inbox: every update Telegram hands the bot is committed to the store's
//! `updates` table before it is acknowledged — the webhook's 2xx, or the offset long
//! polling confirms — and handled from there (see [`handling`]).
//!
//! [`Inbox::receive`] reads only what it needs of the raw body (the update's id, its
//! chat and sender) and commits the row: a new update, a duplicate (already there: it is
//! acknowledged and not handled again), or a dead letter (not JSON, no numeric
//! `update_id`, a shape teloxide cannot read), kept with `dead = 1` and never handled.
//! An error means the commit failed: nothing is acknowledged, Telegram gives the update
//! again, and the user is told once that it is not saved yet.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use teloxide::types::{Update, UpdateKind};
use tokio::sync::Notify;

use crate::store::{NewUpdate, Store, StoreError};

pub(super) mod handling;
pub use handling::{Deferred, LeaseLost, Taking, UnderLease};

/// What became of a body given to [`Inbox::receive`]; every one is answered as a
/// success to Telegram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A new update, committed; the handling loop takes it.
    Stored,
    /// An update already in the inbox: not handled again.
    Duplicate,
    /// Not an update: kept with `dead = 1` (and an `error` event), never handled.
    DeadLetter,
}

/// The inbox could not commit the update: it must not be acknowledged (webhook: answer
/// 5xx; polling: leave the offset unconfirmed).
#[derive(Debug, thiserror::Error)]
#[error("the update could not be stored: {0}")]
pub struct ReceiveError(#[from] pub StoreError);

/// Who to tell that their message is not saved yet (a commit failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSaved {
    pub update_id: i64,
    pub chat_id: i64,
    pub user_id: i64,
    pub message_id: i32,
    pub language_code: Option<String>,
}

/// Sends a notice about an update not stored: `NotSavedYet` (it is taken
/// automatically), or `GivenUp` (it failed every try: send it again); `true` once
/// delivered.
pub type Notice = Arc<dyn Fn(NotSaved, NoticeKind) -> BoxFuture<'static, bool> + Send + Sync>;

/// Which notice [`Notice`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeKind {
    NotSavedYet,
    GivenUp,
}

/// The inbox of one bot. Cheap to clone.
#[derive(Clone)]
pub struct Inbox(Arc<Shared>);

struct Shared {
    store: Store,
    bot_id: i64,
    wake: Notify,
    notice: Notice,
    /// Updates whose sender was told that they are not saved yet (once each).
    told: Mutex<HashSet<i64>>,
    /// The handling loop's state (see [`handling`]).
    lanes: Mutex<handling::Lanes>,
    /// This instance's chat leases (the daemon), under which each chat is handled.
    leases: Option<crate::cluster::Leases>,
    /// What runs when a chat is taken over from another instance, before its updates.
    take_over: Option<TakeOver>,
}

/// Claims what a chat (its id) taken over from another instance left unfinished (see
/// [`crate::worker::take_over`]).
pub type TakeOver = Arc<dyn Fn(i64) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// What [`Inbox::receive`] read of a body.
#[derive(Debug, Clone, PartialEq)]
enum Parsed {
    Update {
        id: i64,
        chat_id: Option<i64>,
        user_id: Option<i64>,
        kind: &'static str,
        notice: Option<NotSaved>,
        /// Handed to the handling loop once committed: it is not read again.
        update: Box<Update>,
    },
    Dead {
        own_id: Option<i64>,
        why: &'static str,
        /// Read from the raw JSON where it has them, so that `/delete` finds the row.
        chat_id: Option<i64>,
        user_id: Option<i64>,
    },
}

/// The most "not saved yet" notices remembered (then the set starts over).
const TOLD_MAX: usize = 100_000;

impl Inbox {
    /// The inbox of the bot `bot_id` (the token's bot, from `getMe`); `notice` tells a
    /// user that an update could not be stored yet.
    pub fn new(store: Store, bot_id: i64, notice: Notice) -> Self {
        Self::with_leases(store, bot_id, notice, None, None)
    }

    /// An inbox whose chats are handled under this instance's chat `leases` (the
    /// daemon: one instance among others on the database).
    pub fn with_leases(
        store: Store,
        bot_id: i64,
        notice: Notice,
        leases: Option<crate::cluster::Leases>,
        take_over: Option<TakeOver>,
    ) -> Self {
        Self(Arc::new(Shared {
            store,
            bot_id,
            wake: Notify::new(),
            notice,
            told: Mutex::default(),
            lanes: Mutex::default(),
            leases,
            take_over,
        }))
    }

    /// The chat leases the loop works under, if any.
    pub(super) fn leases(&self) -> Option<&crate::cluster::Leases> {
        self.0.leases.as_ref()
    }

    /// What runs when a chat is taken over, if anything.
    pub(super) fn take_over(&self) -> Option<&TakeOver> {
        self.0.take_over.as_ref()
    }

    pub fn bot_id(&self) -> i64 {
        self.0.bot_id
    }

    pub fn store(&self) -> &Store {
        &self.0.store
    }

    /// Commits one update's raw JSON body (a webhook request's) to the inbox and wakes
    /// the handling loop. `Ok` in every case Telegram is to be answered with a success;
    /// `Err` when the commit failed (the user is told once, in the background).
    pub async fn receive(&self, body: &[u8]) -> Result<Received, ReceiveError> {
        let received = self.receive_batch(&[body]).await?;
        Ok(received.into_iter().next().unwrap_or(Received::Duplicate))
    }

    /// [`Inbox::receive`] for a batch (long polling's), committed in one transaction
    /// for the updates and one per dead letter: all of it stored, or an error.
    pub async fn receive_batch(&self, bodies: &[&[u8]]) -> Result<Vec<Received>, ReceiveError> {
        let parsed: Vec<Parsed> = bodies.iter().map(|body| parse(body)).collect();
        let texts: Vec<String> = bodies
            .iter()
            .map(|body| String::from_utf8_lossy(body).into_owned())
            .collect();
        let updates: Vec<NewUpdate<'_>> = parsed
            .iter()
            .zip(&texts)
            .filter_map(|(parsed, text)| match parsed {
                Parsed::Update {
                    id,
                    chat_id,
                    user_id,
                    ..
                } => Some(NewUpdate {
                    update_id: *id,
                    chat_id: *chat_id,
                    user_id: *user_id,
                    payload: text,
                }),
                Parsed::Dead { .. } => None,
            })
            .collect();
        let fresh = match self.0.store.insert_updates(self.0.bot_id, &updates).await {
            Ok(fresh) => fresh,
            Err(error) => {
                self.not_stored(&parsed, &error);
                return Err(error.into());
            }
        };
        let mut fresh = fresh.into_iter();
        let mut received = Vec::with_capacity(parsed.len());
        let mut arrived = Vec::new();
        for (parsed, text) in parsed.iter().zip(&texts) {
            let outcome = match parsed {
                Parsed::Update { kind, .. } => {
                    let outcome = if fresh.next().unwrap_or(false) {
                        Received::Stored
                    } else {
                        Received::Duplicate
                    };
                    crate::observe::update_received(kind, outcome_label(outcome));
                    outcome
                }
                Parsed::Dead {
                    own_id,
                    why,
                    chat_id,
                    user_id,
                } => {
                    self.dead_letter(*own_id, why, (*chat_id, *user_id), text)
                        .await?
                }
            };
            received.push(outcome);
        }
        for (parsed, outcome) in parsed.into_iter().zip(&received) {
            if let (
                Parsed::Update {
                    id,
                    chat_id,
                    update,
                    ..
                },
                Received::Stored,
            ) = (parsed, outcome)
            {
                arrived.push(handling::Arrived {
                    update_id: id,
                    chat_id,
                    update,
                });
            }
        }
        if !arrived.is_empty() {
            self.hand_over(arrived);
            self.wake();
        }
        Ok(received)
    }

    async fn dead_letter(
        &self,
        own_id: Option<i64>,
        why: &'static str,
        (chat_id, user_id): (Option<i64>, Option<i64>),
        text: &str,
    ) -> Result<Received, ReceiveError> {
        let letter = crate::store::DeadLetter {
            own_id,
            chat_id,
            user_id,
            payload: text,
            error: why,
        };
        match self
            .0
            .store
            .insert_dead_letter(self.0.bot_id, &letter)
            .await
        {
            Ok(Some(kept_as)) => {
                tracing::error!(
                    update_id = kept_as,
                    why,
                    bytes = text.len(),
                    "a body that is no update was kept as a dead letter"
                );
                crate::observe::update_received("invalid", "dead_letter");
                Ok(Received::DeadLetter)
            }
            Ok(None) => {
                crate::observe::update_received("invalid", "duplicate");
                Ok(Received::Duplicate)
            }
            Err(error) => {
                crate::observe::update_received("invalid", "not_stored");
                tracing::error!(%error, "a dead letter could not be stored");
                Err(error.into())
            }
        }
    }

    /// A commit failed: counted, and each sender told once (in the background).
    fn not_stored(&self, parsed: &[Parsed], error: &StoreError) {
        tracing::error!(%error, updates = parsed.len(), "updates could not be stored; they are not confirmed to Telegram and are taken when it gives them again");
        for parsed in parsed {
            let Parsed::Update { kind, notice, .. } = parsed else {
                continue;
            };
            crate::observe::update_received(kind, "not_stored");
            if let Some(notice) = notice.clone() {
                self.tell_once(notice);
            }
        }
    }

    /// Tells the sender of an update, once, that it is not saved yet (in the background).
    fn tell_once(&self, notice: NotSaved) {
        if !self.first_notice(notice.update_id) {
            return;
        }
        let send = (self.0.notice)(notice.clone(), NoticeKind::NotSavedYet);
        let inbox = self.clone();
        tokio::spawn(async move {
            if !send.await {
                inbox.told().remove(&notice.update_id);
            }
        });
    }

    fn told(&self) -> std::sync::MutexGuard<'_, HashSet<i64>> {
        self.0.told.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn first_notice(&self, update_id: i64) -> bool {
        let mut told = self.told();
        if told.len() >= TOLD_MAX {
            told.clear();
        }
        told.insert(update_id)
    }

    /// Wakes the handling loop (an update stored, a chat's handler done).
    pub fn wake(&self) {
        self.0.wake.notify_one();
    }

    /// Resolves at the next [`Inbox::wake`] (or at once if one came meanwhile).
    pub(super) async fn woken(&self) {
        self.0.wake.notified().await;
    }
}

fn outcome_label(received: Received) -> &'static str {
    match received {
        Received::Stored => "stored",
        Received::Duplicate => "duplicate",
        Received::DeadLetter => "dead_letter",
    }
}

/// Reads what the inbox keeps of a body: an update (its id, chat, sender, kind), or
/// why it is a dead letter. An update is parsed once, here; a body teloxide cannot read
/// is read again as plain JSON, for what its dead letter keeps.
fn parse(body: &[u8]) -> Parsed {
    match serde_json::from_slice::<Update>(body) {
        Ok(update) if !matches!(update.kind, UpdateKind::Error(_)) => Parsed::Update {
            // Telegram's ids are unsigned 32-bit numbers (teloxide's `UpdateId`).
            id: i64::from(update.id.0),
            chat_id: update.chat().map(|chat| chat.id.0),
            user_id: update.from().and_then(|user| i64::try_from(user.id.0).ok()),
            kind: kind_label(&update.kind),
            notice: not_saved(&update),
            update: Box::new(update),
        },
        _ => dead_letter(body),
    }
}

/// Why a body teloxide cannot read as an update is a dead letter, and the chat and
/// sender its raw JSON names.
fn dead_letter(body: &[u8]) -> Parsed {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Parsed::Dead {
            own_id: None,
            why: "not_json",
            chat_id: None,
            user_id: None,
        };
    };
    let (chat_id, user_id) = raw_chat_and_sender(&value);
    // Telegram's ids are unsigned 32-bit numbers (teloxide's `UpdateId`).
    let id = value
        .get("update_id")
        .and_then(serde_json::Value::as_u64)
        .and_then(|id| u32::try_from(id).ok());
    let Some(id) = id else {
        return Parsed::Dead {
            own_id: None,
            why: "no_update_id",
            chat_id,
            user_id,
        };
    };
    // Its id is readable, its shape is not teloxide's (or a kind it does not know).
    Parsed::Dead {
        own_id: Some(i64::from(id)),
        why: "unknown_shape",
        chat_id,
        user_id,
    }
}

/// The chat and the sender of a body teloxide may not read, from its raw JSON: the
/// `chat.id` and `from.id` of a `message` or `edited_message`, or a `callback_query`'s
/// `from.id` and its message's `chat.id`.
fn raw_chat_and_sender(value: &serde_json::Value) -> (Option<i64>, Option<i64>) {
    let id = |value: Option<&serde_json::Value>| value.and_then(serde_json::Value::as_i64);
    for key in ["message", "edited_message"] {
        if let Some(msg) = value.get(key) {
            return (id(msg.pointer("/chat/id")), id(msg.pointer("/from/id")));
        }
    }
    if let Some(query) = value.get("callback_query") {
        return (
            id(query.pointer("/message/chat/id")),
            id(query.pointer("/from/id")),
        );
    }
    (None, None)
}

/// Whom to tell when `update` cannot be stored or handled: the sender of a message
/// (new or edited); nobody for anything else.
fn not_saved(update: &Update) -> Option<NotSaved> {
    match &update.kind {
        UpdateKind::Message(msg) | UpdateKind::EditedMessage(msg) => {
            let from = msg.from.as_ref()?;
            Some(NotSaved {
                update_id: i64::from(update.id.0),
                chat_id: msg.chat.id.0,
                user_id: i64::try_from(from.id.0).ok()?,
                message_id: msg.id.0,
                language_code: from.language_code.clone(),
            })
        }
        _ => None,
    }
}

/// The `kind` label of an update (a fixed word).
pub(super) fn kind_label(kind: &UpdateKind) -> &'static str {
    match kind {
        UpdateKind::Message(_) => "message",
        UpdateKind::EditedMessage(_) => "edited_message",
        UpdateKind::CallbackQuery(_) => "callback_query",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: u64) -> String {
        serde_json::json!({"update_id": id, "message": {
            "message_id": 7, "date": 1_764_460_800_i64,
            "chat": {"id": 42, "type": "private", "first_name": "a"},
            "from": {"id": 43, "is_bot": false, "first_name": "a", "language_code": "ru"},
            "text": "hi"}})
        .to_string()
    }

    #[test]
    fn a_message_is_read_for_its_id_chat_and_sender() {
        let Parsed::Update {
            id,
            chat_id,
            user_id,
            kind,
            notice,
            ..
        } = parse(message(9).as_bytes())
        else {
            panic!("an update");
        };
        assert_eq!(
            (id, chat_id, user_id, kind),
            (9, Some(42), Some(43), "message")
        );
        assert_eq!(notice.map(|n| (n.chat_id, n.message_id)), Some((42, 7)));
    }

    #[test]
    fn what_is_no_update_is_a_dead_letter_with_or_without_its_own_id() {
        let rows: [(&[u8], Option<i64>, &str); 7] = [
            (b"not json", None, "not_json"),
            (b"\xff\xfe", None, "not_json"),
            (br#"{"message": {}}"#, None, "no_update_id"),
            (br#"{"update_id": "5"}"#, None, "no_update_id"),
            (br#"{"update_id": -5}"#, None, "no_update_id"),
            (br#"{"update_id": 5}"#, Some(5), "unknown_shape"),
            (
                br#"{"update_id": 5, "message": {"text": 1}}"#,
                Some(5),
                "unknown_shape",
            ),
        ];
        for (body, own, reason) in rows {
            assert_eq!(
                parse(body),
                Parsed::Dead {
                    own_id: own,
                    why: reason,
                    chat_id: None,
                    user_id: None,
                },
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_dead_letter_keeps_the_chat_and_sender_its_raw_json_names() {
        let rows: [(&str, Option<i64>, Option<i64>); 4] = [
            (
                r#"{"update_id": 5, "message": {"text": 1, "chat": {"id": -42}, "from": {"id": 43}}}"#,
                Some(-42),
                Some(43),
            ),
            (
                r#"{"update_id": 5, "edited_message": {"chat": {"id": 42}, "from": {"id": 42}}}"#,
                Some(42),
                Some(42),
            ),
            (
                r#"{"update_id": 5, "callback_query": {"from": {"id": 43}, "message": {"chat": {"id": 44}}}}"#,
                Some(44),
                Some(43),
            ),
            (
                r#"{"message": {"chat": {"id": 42}, "from": {"id": "x"}}}"#,
                Some(42),
                None,
            ),
        ];
        for (body, chat, user) in rows {
            let Parsed::Dead {
                chat_id, user_id, ..
            } = parse(body.as_bytes())
            else {
                panic!("a dead letter: {body}");
            };
            assert_eq!((chat_id, user_id), (chat, user), "{body}");
        }
    }
}
