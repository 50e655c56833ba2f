//! Daily reminders (`reminders`).

use jiff::Timestamp;
use sqlx::FromRow;

use jiff::civil::Date;

use crate::language::Language;
use crate::time::{LocalTime, UserZone, sql_timestamp};

use super::{
    ChatId, DueAt, Store, StoreError, UserId, on_db, retry_busy, stored_date, stored_local_time,
    stored_moment,
};

/// A user's daily reminder (`reminders`), parsed: a stored value that does not parse is
/// `None`, with a warning.
#[derive(Debug, Clone, PartialEq)]
pub struct Reminder {
    pub user_id: UserId,
    pub local_time: Option<LocalTime>,
    pub enabled: bool,
    pub last_sent_day: Option<Date>,
    pub next_due_at: Option<Timestamp>,
}

/// A `reminders` row as SQLite holds it.
#[derive(FromRow)]
struct ReminderRow {
    user_id: UserId,
    local_time: String,
    /// 0/1, as the schema keeps it on both backends.
    enabled: i64,
    last_sent_day: Option<String>,
    next_due_at: Option<String>,
}

impl From<ReminderRow> for Reminder {
    fn from(row: ReminderRow) -> Self {
        let id = row.user_id.get();
        Self {
            local_time: stored_local_time("reminders", id, "local_time", &row.local_time),
            last_sent_day: row
                .last_sent_day
                .and_then(|text| stored_date("reminders", id, "last_sent_day", &text)),
            next_due_at: row
                .next_due_at
                .map(|text| stored_moment("reminders", id, "next_due_at", &text)),
            user_id: row.user_id,
            enabled: row.enabled != 0,
        }
    }
}

/// A reminder whose time has come, with what sending it needs to know of its user.
#[derive(Debug, Clone, PartialEq)]
pub struct DueReminder {
    pub user_id: UserId,
    pub chat_id: ChatId,
    pub language: Language,
    pub timezone: UserZone,
    /// `None` when the stored time is not `HH:MM` (a hand edit; a warning is logged).
    pub local_time: Option<LocalTime>,
    /// `None` also when the stored day is not a date (a warning is logged).
    pub last_sent_day: Option<Date>,
    /// When it was due; also the key that [`Store::advance_reminder`] moves it on by.
    pub next_due_at: DueAt,
}

/// A row of [`DUE_REMINDERS_SQL`], before [`DueReminder`] parses it.
#[derive(FromRow)]
struct DueReminderRow {
    user_id: UserId,
    chat_id: ChatId,
    #[sqlx(try_from = "String")]
    language: Language,
    timezone: String,
    local_time: String,
    last_sent_day: Option<String>,
    next_due_at: String,
}

impl DueReminderRow {
    fn read(self, store: &Store, now: Timestamp) -> DueReminder {
        let id = self.user_id.get();
        DueReminder {
            next_due_at: DueAt::read(self.next_due_at, now, self.user_id, "reminders.next_due_at"),
            timezone: store.stored_zone(self.user_id, &self.timezone),
            local_time: stored_local_time("reminders", id, "local_time", &self.local_time),
            last_sent_day: self
                .last_sent_day
                .and_then(|text| stored_date("reminders", id, "last_sent_day", &text)),
            user_id: self.user_id,
            chat_id: self.chat_id,
            language: self.language,
        }
    }
}

/// The scheduler's query: due reminders, soonest first. Public so that tests and the
/// benchmark can check that it searches the `reminders_due` index.
///
/// The second half takes the rows whose text sorts at or after `$5`, a week and a day
/// from now, beyond any due time the scheduler writes: text that cannot be a moment (a
/// hand edit: `soon`, or digits such as `21:30` that sort after every moment of these
/// years), which no `<=` on text would ever reach; they are due now, so that they are
/// sent and moved on rather than stuck. The third takes today's (UTC) rows
/// spelt with a `T` (`$3` is `YYYY-MM-DDT`, `$4` `YYYY-MM-DDU`): that text sorts after
/// every moment of its day, so the first half would reach it only after midnight, too
/// late to send; read now, it is sent if due, else written at its moment. Every half
/// searches the index, the third only its own narrow band.
pub const DUE_REMINDERS_SQL: &str =
    "SELECT r.user_id, u.chat_id, u.language, u.timezone, r.local_time,
            r.last_sent_day, r.next_due_at
     FROM reminders r JOIN users u ON u.user_id = r.user_id
     WHERE r.enabled = 1 AND r.next_due_at <= $1
     UNION ALL
     SELECT r.user_id, u.chat_id, u.language, u.timezone, r.local_time,
            r.last_sent_day, r.next_due_at
     FROM reminders r JOIN users u ON u.user_id = r.user_id
     WHERE r.enabled = 1 AND r.next_due_at >= $5
     UNION ALL
     SELECT r.user_id, u.chat_id, u.language, u.timezone, r.local_time,
            r.last_sent_day, r.next_due_at
     FROM reminders r JOIN users u ON u.user_id = r.user_id
     WHERE r.enabled = 1 AND r.next_due_at >= $3 AND r.next_due_at < $4
     ORDER BY next_due_at LIMIT $2";

impl Store {
    // ---- reminders ----

    pub async fn reminder(&self, user_id: UserId) -> Result<Option<Reminder>, StoreError> {
        let row = on_db!(self, read, |pool| {
            sqlx::query_as::<_, ReminderRow>(
                "SELECT user_id, local_time, enabled, last_sent_day, next_due_at
                 FROM reminders WHERE user_id = $1",
            )
            .bind(user_id)
            .fetch_optional(pool)
            .await?
        });
        Ok(row.map(Reminder::from))
    }

    /// `/remind HH:MM`: on, at that time, next due at `next_due_at`. The day of the last
    /// reminder is kept, so a new time cannot bring a second reminder the same day; a
    /// reminder already due at `now` is left to the scheduler, which sends it and moves
    /// on with the new time, rather than skipped for the day.
    pub async fn set_reminder(
        &self,
        user_id: UserId,
        local_time: LocalTime,
        next_due_at: Timestamp,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let local_time = local_time.to_string();
        let next_due_at = sql_timestamp(next_due_at);
        let now = sql_timestamp(now);
        self.durably(retry_busy("set_reminder", || async {
            on_db!(self, write, |pool| {
                sqlx::query(
                    "INSERT INTO reminders (user_id, local_time, enabled, next_due_at)
                 VALUES ($1, $2, 1, $3)
                 ON CONFLICT (user_id) DO UPDATE SET local_time = excluded.local_time,
                     enabled = 1,
                     next_due_at = CASE WHEN reminders.enabled = 1
                                         AND reminders.next_due_at <= $4
                                        THEN reminders.next_due_at
                                        ELSE excluded.next_due_at END",
                )
                .bind(user_id)
                .bind(&local_time)
                .bind(&next_due_at)
                .bind(&now)
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(())
        }))
        .await
    }

    /// `/remind off`, or Telegram said the user blocked the bot.
    pub async fn disable_reminder(&self, user_id: UserId) -> Result<(), StoreError> {
        self.durably(retry_busy("disable_reminder", || async {
            on_db!(self, write, |pool| {
                sqlx::query(
                    "UPDATE reminders SET enabled = 0, next_due_at = NULL WHERE user_id = $1",
                )
                .bind(user_id)
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(())
        }))
        .await
    }

    /// A new zone: the reminder (if on) is next due at `next_due_at`. (One due this
    /// moment is not kept, unlike [`Store::set_reminder`]'s: judged in the new zone it
    /// could be another local day's, and skip that day's own.)
    pub async fn reschedule_reminder(
        &self,
        user_id: UserId,
        next_due_at: Timestamp,
    ) -> Result<(), StoreError> {
        let next_due_at = sql_timestamp(next_due_at);
        retry_busy("reschedule_reminder", || async {
            on_db!(self, write, |pool| {
                sqlx::query(
                    "UPDATE reminders SET next_due_at = $2 WHERE user_id = $1 AND enabled = 1",
                )
                .bind(user_id)
                .bind(&next_due_at)
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(())
        })
        .await
    }

    /// Reminders due at `now`, soonest first (see [`DUE_REMINDERS_SQL`]).
    pub async fn due_reminders(
        &self,
        now: Timestamp,
        limit: i64,
    ) -> Result<Vec<DueReminder>, StoreError> {
        let rows: Vec<DueReminderRow> = on_db!(self, read, |pool| {
            super::due_query(DUE_REMINDERS_SQL, now, limit)
                .fetch_all(pool)
                .await?
        });
        Ok(rows.into_iter().map(|row| row.read(self, now)).collect())
    }

    /// Moves a due reminder on to `next_due_at`, recording `sent_day` as sent when
    /// given — in one statement, before anything is sent, so that two ticks (or a
    /// restart) can never both send it. `false` when someone else moved it first (it no
    /// longer holds the text `due_at` was read from).
    pub async fn advance_reminder(
        &self,
        user_id: UserId,
        due_at: &DueAt,
        sent_day: Option<Date>,
        next_due_at: Timestamp,
    ) -> Result<bool, StoreError> {
        let sent_day = sent_day.map(|day| day.to_string());
        let next_due_at = sql_timestamp(next_due_at);
        retry_busy("advance_reminder", || async {
            let done = on_db!(self, write, |pool| {
                sqlx::query(
                "UPDATE reminders SET next_due_at = $4, last_sent_day = coalesce($3, last_sent_day)
                 WHERE user_id = $1 AND enabled = 1 AND next_due_at = $2
                   AND ($3 IS NULL OR coalesce(last_sent_day, '') <> $3)",
            )
            .bind(user_id)
            .bind(due_at.key())
            .bind(&sent_day)
            .bind(&next_due_at)
            .execute(pool)
            .await?
            .rows_affected()
            });
            Ok(done == 1)
        })
        .await
    }

    /// Undoes [`Store::advance_reminder`] after a delivery that failed for a passing
    /// reason, so the next tick tries again (within `reminders.max_late_minutes`). The
    /// reminder goes back to the moment it was due, written as the store writes moments:
    /// one that was stored as no moment (due "now" when read) then grows late like any
    /// other and is moved on, instead of being due now at every tick.
    pub async fn restore_reminder(
        &self,
        user_id: UserId,
        due_at: &DueAt,
        last_sent_day: Option<Date>,
        advanced_to: Timestamp,
    ) -> Result<(), StoreError> {
        let last_sent_day = last_sent_day.map(|day| day.to_string());
        let due_at = sql_timestamp(due_at.at());
        let advanced_to = sql_timestamp(advanced_to);
        retry_busy("restore_reminder", || async {
            on_db!(self, write, |pool| {
                sqlx::query(
                    "UPDATE reminders SET next_due_at = $2, last_sent_day = $3
                 WHERE user_id = $1 AND enabled = 1 AND next_due_at = $4",
                )
                .bind(user_id)
                .bind(&due_at)
                .bind(&last_sent_day)
                .bind(&advanced_to)
                .execute(pool)
                .await?
                .rows_affected()
            });
            Ok(())
        })
        .await
    }
}
