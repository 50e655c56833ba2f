//! Users: who writes, in which language and time zone; deleting one with everything theirs.

use sqlx::FromRow;

use crate::language::Language;

use super::{ChatId, Sql, Store, StoreError, UserId, on_db, retry_busy, returned, stored_moment};

#[derive(Debug, Clone, PartialEq)]
pub struct User {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub username: Option<String>,
    /// `users.language`, read as a [`Language`] (an unknown code is English).
    pub language: Language,
    /// `users.timezone`, read as a zone (one that names none is the default zone).
    pub timezone: crate::time::UserZone,
    /// When the user was first seen (read as [`super::DayLog::created_at`] is).
    pub created_at: jiff::Timestamp,
}

/// A `users` row as SQLite holds it, before [`User`] parses its columns.
#[derive(FromRow)]
struct UserRow {
    user_id: UserId,
    chat_id: ChatId,
    username: Option<String>,
    #[sqlx(try_from = "String")]
    language: Language,
    timezone: String,
    created_at: String,
}

impl UserRow {
    fn read(self, store: &Store) -> User {
        User {
            created_at: stored_moment("users", self.user_id.get(), "created_at", &self.created_at),
            timezone: store.stored_zone(self.user_id, &self.timezone),
            user_id: self.user_id,
            chat_id: self.chat_id,
            username: self.username,
            language: self.language,
        }
    }
}

impl User {
    pub fn language(&self) -> Language {
        self.language
    }
}

/// What a handler knows about the sender of a message. Not the chat it came from: the
/// chat on record ([`User::chat_id`]) is the one reminders and digests go to, the
/// user's private chat, whose id in Telegram (and in `daylog chat`) is the user's id,
/// never a group an entry or a command was written in.
#[derive(Debug, Clone)]
pub struct NewUser<'a> {
    pub user_id: UserId,
    pub username: Option<&'a str>,
    /// Used only when the user is first seen; `/lang` changes it later.
    pub language: Language,
}

impl Store {
    // ---- users ----

    /// Creates the user or refreshes its username (and its chat, the private one);
    /// keeps a chosen language.
    ///
    /// A known user under the same name — nearly every update — is only read: no
    /// write, so no turn of the one writer connection before the entry itself is stored.
    pub async fn upsert_user(&self, user: &NewUser<'_>) -> Result<User, StoreError> {
        let private_chat = ChatId(user.user_id.get());
        // A failed read only costs the write below.
        if let Ok(Some(known)) = self.user(user.user_id).await
            && known.chat_id == private_chat
            && known.username.as_deref() == user.username
        {
            return Ok(known);
        }
        retry_busy("upsert_user", || async {
            let rows = on_db!(self, write, |pool| {
                sqlx::query_as::<_, UserRow>(
                    "INSERT INTO users (user_id, chat_id, username, language, timezone)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (user_id) DO UPDATE SET chat_id = excluded.chat_id,
                         username = excluded.username
                     RETURNING user_id, chat_id, username, language, timezone, created_at",
                )
                .bind(user.user_id)
                .bind(private_chat)
                .bind(user.username)
                .bind(user.language.code())
                .bind(self.default_zone.name())
                .fetch_all(pool)
                .await?
            });
            returned(rows)
                .map(|row| row.read(self))
                .ok_or(StoreError::Sql(sqlx::Error::RowNotFound))
        })
        .await
    }

    pub async fn user(&self, user_id: UserId) -> Result<Option<User>, StoreError> {
        let row = on_db!(self, read, |pool| {
            sqlx::query_as::<_, UserRow>(
                "SELECT user_id, chat_id, username, language, timezone, created_at
                 FROM users WHERE user_id = $1",
            )
            .bind(user_id)
            .fetch_optional(pool)
            .await?
        });
        Ok(row.map(|row| row.read(self)))
    }

    pub async fn set_language(
        &self,
        user_id: UserId,
        language: Language,
    ) -> Result<(), StoreError> {
        self.durably(retry_busy("set_language", || async {
            let done = on_db!(self, write, |pool| {
                sqlx::query("UPDATE users SET language = $2 WHERE user_id = $1")
                    .bind(user_id)
                    .bind(language.code())
                    .execute(pool)
                    .await?
                    .rows_affected()
            });
            if done == 0 {
                // No such user (its insert failed, e.g. on a full disk): nothing was
                // saved, so the caller must not say that the language is set.
                return Err(StoreError::Sql(sqlx::Error::RowNotFound));
            }
            Ok(())
        }))
        .await
    }

    /// `/tz`: the user's zone from now on (entries already stored keep their day).
    pub async fn set_timezone(
        &self,
        user_id: UserId,
        zone: &crate::time::UserZone,
    ) -> Result<(), StoreError> {
        self.durably(retry_busy("set_timezone", || async {
            on_db!(self, write, |pool| {
                sqlx::query(
                    "UPDATE users SET timezone = $2, timezone_chosen = 1 WHERE user_id = $1",
                )
                .bind(user_id)
                .bind(zone.name())
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(())
        }))
        .await
    }

    /// Removes the user and, by cascade, every log and LLM call of theirs. Returns how
    /// many logs went.
    pub async fn delete_user(&self, user_id: UserId) -> Result<u64, StoreError> {
        self.delete_user_pressing(user_id, None).await
    }

    /// [`Store::delete_user`] asked for by the button press `pressed` (an inbox row):
    /// it is erased and marked handled in the same transaction.
    pub async fn delete_user_pressing(
        &self,
        user_id: UserId,
        pressed: Option<super::UpdateKey>,
    ) -> Result<u64, StoreError> {
        const ERASED: Sql = Sql {
            sqlite: "INSERT INTO erasures (user_id, erased_at) VALUES ($1, datetime('now'))
                     ON CONFLICT (user_id) DO UPDATE SET erased_at = excluded.erased_at",
            postgres: "INSERT INTO erasures (user_id, erased_at) VALUES ($1, daylog_utc(now()))
                       ON CONFLICT (user_id) DO UPDATE SET erased_at = excluded.erased_at",
        };
        self.durably(retry_busy("delete_user", || async {
            Ok(on_db!(self, write, |pool| {
                let mut tx = pool.begin().await?;
                let logs = sqlx::query("DELETE FROM day_logs WHERE user_id = $1")
                    .bind(user_id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                sqlx::query(super::updates::ERASE_PAYLOADS.on(pool))
                    .bind(user_id)
                    .execute(&mut *tx)
                    .await?;
                if let Some(key) = pressed {
                    sqlx::query(super::updates::ERASE_PRESS.on(pool))
                        .bind(key.bot_id)
                        .bind(key.update_id)
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query("DELETE FROM users WHERE user_id = $1")
                    .bind(user_id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(ERASED.on(pool))
                    .bind(user_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                logs
            }))
        }))
        .await
    }

    /// Whether the user erased their data (`/delete`) after a message sent at `sent_at`:
    /// an edit of such a message must not bring its entry back.
    pub async fn erased_after(
        &self,
        user_id: UserId,
        sent_at: jiff::Timestamp,
    ) -> Result<bool, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM erasures WHERE user_id = $1 AND erased_at >= $2)",
            )
            .bind(user_id)
            .bind(crate::time::sql_timestamp(sent_at))
            .fetch_one(pool)
            .await?
        }))
    }
}
