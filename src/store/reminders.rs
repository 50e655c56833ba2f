//! Daily reminders (`reminders`).

use sqlx::FromRow;

use crate::language::Language;

use super::{ChatId, Store, StoreError, UserId, retry_busy};

/// A user's daily reminder (`reminders`).
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct Reminder {
    pub user_id: UserId,
    pub local_time: String,
    pub enabled: bool,
    pub last_sent_day: Option<String>,
    pub next_due_at: Option<String>,
}

/// A reminder whose time has come, with what sending it needs to know of its user.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct DueReminder {
    pub user_id: UserId,
    pub chat_id: ChatId,
    #[sqlx(try_from = "String")]
    pub language: Language,
    pub timezone: String,
    pub local_time: String,
    pub last_sent_day: Option<String>,
    pub next_due_at: String,
}

/// The scheduler's query: due reminders, soonest first. Public so that tests and the
/// benchmark can check that it searches the `reminders_due` index.
pub const DUE_REMINDERS_SQL: &str =
    "SELECT r.user_id, u.chat_id, u.language, u.timezone, r.local_time,
            r.last_sent_day, r.next_due_at
     FROM reminders r JOIN users u ON u.user_id = r.user_id
     WHERE r.enabled = 1 AND r.next_due_at <= ?1
     ORDER BY r.next_due_at LIMIT ?2";

impl Store {
    // ---- reminders ----

    pub async fn reminder(&self, user_id: UserId) -> Result<Option<Reminder>, StoreError> {
        Ok(sqlx::query_as::<_, Reminder>(
            "SELECT user_id, local_time, enabled, last_sent_day, next_due_at
             FROM reminders WHERE user_id = ?1",
        )
        .bind(user_id)
        .fetch_optional(&self.read)
        .await?)
    }

    /// `/remind HH:MM`: on, at that time, next due at `next_due_at`. The day of the last
    /// reminder is kept, so a new time cannot bring a second reminder the same day.
    pub async fn set_reminder(
        &self,
        user_id: UserId,
        local_time: &str,
        next_due_at: &str,
    ) -> Result<(), StoreError> {
        retry_busy("set_reminder", || async {
            sqlx::query(
                "INSERT INTO reminders (user_id, local_time, enabled, next_due_at)
                 VALUES (?1, ?2, 1, ?3)
                 ON CONFLICT (user_id) DO UPDATE SET local_time = excluded.local_time,
                     enabled = 1, next_due_at = excluded.next_due_at",
            )
            .bind(user_id)
            .bind(local_time)
            .bind(next_due_at)
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }

    /// `/remind off`, or Telegram said the user blocked the bot.
    pub async fn disable_reminder(&self, user_id: UserId) -> Result<(), StoreError> {
        retry_busy("disable_reminder", || async {
            sqlx::query("UPDATE reminders SET enabled = 0, next_due_at = NULL WHERE user_id = ?1")
                .bind(user_id)
                .execute(&self.write)
                .await?;
            Ok(())
        })
        .await
    }

    /// A new zone: the reminder (if on) is next due at `next_due_at`.
    pub async fn reschedule_reminder(
        &self,
        user_id: UserId,
        next_due_at: &str,
    ) -> Result<(), StoreError> {
        retry_busy("reschedule_reminder", || async {
            sqlx::query("UPDATE reminders SET next_due_at = ?2 WHERE user_id = ?1 AND enabled = 1")
                .bind(user_id)
                .bind(next_due_at)
                .execute(&self.write)
                .await?;
            Ok(())
        })
        .await
    }

    /// Reminders due at `now` (UTC `YYYY-MM-DD HH:MM:SS`), soonest first.
    pub async fn due_reminders(
        &self,
        now: &str,
        limit: i64,
    ) -> Result<Vec<DueReminder>, StoreError> {
        Ok(sqlx::query_as::<_, DueReminder>(DUE_REMINDERS_SQL)
            .bind(now)
            .bind(limit)
            .fetch_all(&self.read)
            .await?)
    }

    /// Moves a due reminder on to `next_due_at`, recording `sent_day` as sent when
    /// given — in one statement, before anything is sent, so that two ticks (or a
    /// restart) can never both send it. `false` when someone else moved it first.
    pub async fn advance_reminder(
        &self,
        user_id: UserId,
        due_at: &str,
        sent_day: Option<&str>,
        next_due_at: &str,
    ) -> Result<bool, StoreError> {
        retry_busy("advance_reminder", || async {
            let done = sqlx::query(
                "UPDATE reminders SET next_due_at = ?4, last_sent_day = coalesce(?3, last_sent_day)
                 WHERE user_id = ?1 AND enabled = 1 AND next_due_at = ?2
                   AND (?3 IS NULL OR coalesce(last_sent_day, '') <> ?3)",
            )
            .bind(user_id)
            .bind(due_at)
            .bind(sent_day)
            .bind(next_due_at)
            .execute(&self.write)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Undoes [`Store::advance_reminder`] after a delivery that failed for a passing
    /// reason, so the next tick tries again (within `reminders.max_late_minutes`).
    pub async fn restore_reminder(
        &self,
        user_id: UserId,
        due_at: &str,
        last_sent_day: Option<&str>,
        advanced_to: &str,
    ) -> Result<(), StoreError> {
        retry_busy("restore_reminder", || async {
            sqlx::query(
                "UPDATE reminders SET next_due_at = ?2, last_sent_day = ?3
                 WHERE user_id = ?1 AND enabled = 1 AND next_due_at = ?4",
            )
            .bind(user_id)
            .bind(due_at)
            .bind(last_sent_day)
            .bind(advanced_to)
            .execute(&self.write)
            .await?;
            Ok(())
        })
        .await
    }
}
