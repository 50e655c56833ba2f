//! The Mini App's reads (docs/behaviour.md, The Mini App): a page of the journal, the
//! entries of one local day, and one entry — each only ever the asking user's. The
//! other things the page shows go through the same reads as the commands (`search`,
//! `daily_metrics`, `year_moods`, …).

use super::{DayLog, LOG_COLUMNS, LogId, Store, StoreError, UserId, on_db};

/// A page of the journal after the first ([`Store::history`]'s): the user's entries
/// older than entry `$2` (one of their own; an id that is not the user's finds nothing,
/// so it says nothing about another user's journal), newest first. A text of its own
/// rather than `$2 IS NULL OR …` in `/history`'s: the order `(created_at, id)` is where
/// `day_logs_user_created` starts reading, which one plan for both pages (PostgreSQL's,
/// for all values) could not use, and read every newer entry first. Public for query
/// plans.
pub const NEXT_PAGE_SQL: &str = concat!(
    "SELECT ",
    log_columns!(),
    " FROM day_logs
     WHERE user_id = $1
       AND (created_at, id) < (SELECT created_at, id FROM day_logs WHERE id = $2 AND user_id = $1)
     ORDER BY created_at DESC, id DESC LIMIT $3"
);

impl Store {
    /// Up to `limit` of the user's entries older than `before` (none: the newest),
    /// newest first.
    pub async fn entries_page(
        &self,
        user_id: UserId,
        before: Option<LogId>,
        limit: i64,
    ) -> Result<Vec<DayLog>, StoreError> {
        let Some(before) = before else {
            return self.history(user_id, limit).await;
        };
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayLog>(NEXT_PAGE_SQL)
                .bind(user_id)
                .bind(before)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }))
    }

    /// The user's entries of local day `day`, in the order they were written.
    pub async fn entries_on(
        &self,
        user_id: UserId,
        day: jiff::civil::Date,
    ) -> Result<Vec<DayLog>, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayLog>(&format!(
                "SELECT {LOG_COLUMNS} FROM day_logs WHERE user_id = $1 AND local_day = $2
                 ORDER BY created_at, id"
            ))
            .bind(user_id)
            .bind(day.to_string())
            .fetch_all(pool)
            .await?
        }))
    }

    /// Entry `id` when it is the user's; `None` for a missing one and another user's alike.
    pub async fn entry_of(&self, user_id: UserId, id: LogId) -> Result<Option<DayLog>, StoreError> {
        Ok(on_db!(self, read, |pool| {
            sqlx::query_as::<_, DayLog>(&format!(
                "SELECT {LOG_COLUMNS} FROM day_logs WHERE id = $1 AND user_id = $2"
            ))
            .bind(id)
            .bind(user_id)
            .fetch_optional(pool)
            .await?
        }))
    }
}
