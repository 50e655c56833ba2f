//! What several instances share through the database (docs/behaviour.md, Several
//! instances): the LLM budgets, learned limits and cooldowns ([`SharedLimits`], on
//! PostgreSQL; one SQLite instance keeps them in memory), Telegram's 429 holds
//! (PostgreSQL), and what is said once (`said_once`, on both: a restart does not say
//! it again either).

use std::time::Duration;

use futures::future::BoxFuture;
use jiff::Timestamp;

use crate::llm::{Admission, Admitted, Cooled, Learned, SharedLimits, TokensAsk};
use crate::time::{parse_sql_timestamp, sql_timestamp};

use super::{ChatId, Db, Sql, Store, StoreError, UserId, on_db, retry_busy};

/// What is said once is forgotten after this long (strangers can make the table grow).
const SAID_ONCE_KEPT_SECS: i64 = 30 * 24 * 3600;

/// `said_once.what` of a user's `/import`, waiting for its document.
const IMPORT_ASK: &str = "import";

/// A key index as the shared tables store it: -1 for a provider with no key list.
fn key_column(key: Option<usize>) -> i64 {
    key.and_then(|k| i64::try_from(k).ok()).unwrap_or(-1)
}

/// A cooldown's slot: the whole model is -2.
const WHOLE_MODEL: i64 = -2;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn limit(n: Option<u32>) -> Option<i64> {
    n.map(i64::from)
}

/// The first ten arguments every admission function of the shared budgets takes
/// (`daylog_admit`, `daylog_admit_block`, `daylog_admit_tokens`): the budget, the
/// model and key's cooldown slot, whether cooldowns are skipped, and the declared rates.
fn bind_admission<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ask: &Admission<'q>,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    query
        .bind(ask.provider)
        .bind(ask.scope)
        .bind(key_column(ask.key_index))
        .bind(ask.model)
        .bind(key_column(ask.key_index))
        .bind(ask.forced)
        .bind(limit(ask.per_second))
        .bind(limit(ask.per_minute))
        .bind(limit(ask.per_day))
        .bind(i64::try_from(ask.day_reset_secs).unwrap_or(0))
}

impl Store {
    /// Check-and-spend of up to `want` requests in the shared budgets (PostgreSQL's
    /// `daylog_admit_block`: one statement that locks the budget's row and counts as
    /// many requests as every window has room for, or none): the answer and how many
    /// were counted. The first is stamped now, the others `hold` later (they are sent
    /// within it). On SQLite nothing is shared: all admitted.
    async fn admit_shared(
        &self,
        ask: &Admission<'_>,
        want: u32,
        hold: Duration,
    ) -> Result<(Admitted, u32), StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok((Admitted::Yes, want.max(1)));
        };
        let (wait_ms, why, granted): (i64, String, i64) = bind_admission(
            sqlx::query_as(
                "SELECT wait_ms, why, granted
                 FROM daylog_admit_block($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            ),
            ask,
        )
        .bind(i64::from(want.max(1)))
        .bind(millis(hold))
        .fetch_one(pool)
        .await?;
        Ok(granted_answer(wait_ms, &why, granted))
    }

    /// Check-and-spend of up to `want` requests of a budget that counts tokens a
    /// minute, `tokens.tokens` each (PostgreSQL's `daylog_admit_tokens_block`): as many
    /// as the minute's tokens and every request window have room for, counted with
    /// their tokens, or none; the corrections `tokens` carries applied whatever the
    /// answer. Those after the first are stamped `hold` later. On SQLite nothing is
    /// shared (the one instance counts its tokens in memory): all admitted.
    async fn admit_tokens_shared(
        &self,
        ask: &Admission<'_>,
        tokens: TokensAsk,
        want: u32,
        hold: Duration,
    ) -> Result<(Admitted, u32), StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok((Admitted::Yes, want.max(1)));
        };
        let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let (wait_ms, why, granted): (i64, String, i64) = bind_admission(
            sqlx::query_as(
                "SELECT wait_ms, why, granted
                 FROM daylog_admit_tokens_block($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
                                                $13, $14, $15, $16)",
            ),
            ask,
        )
        .bind(i64::from(tokens.per_minute))
        .bind(i64::from(tokens.tokens))
        .bind(big(tokens.add))
        .bind(big(tokens.give_back))
        .bind(i64::from(want.max(1)))
        .bind(millis(hold))
        .fetch_one(pool)
        .await?;
        Ok(granted_answer(wait_ms, &why, granted))
    }

    /// Records what an answer taught about a budget (PostgreSQL): a spend is extended,
    /// never shortened; the rate factor is the latest.
    async fn share_learned(&self, learned: &Learned) -> Result<(), StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok(());
        };
        sqlx::query(
            "INSERT INTO llm_shared_budgets AS b (provider, scope, key_index, spent_until, daily, factor)
             VALUES ($1, $2, $3,
                     CASE WHEN $4::BIGINT IS NULL THEN NULL
                          ELSE clock_timestamp() + make_interval(secs => $4::BIGINT / 1000.0) END,
                     $5, $6)
             ON CONFLICT (provider, scope, key_index) DO UPDATE SET
                 spent_until = CASE WHEN EXCLUDED.spent_until IS NOT NULL
                                     AND (b.spent_until IS NULL OR b.spent_until < EXCLUDED.spent_until)
                                    THEN EXCLUDED.spent_until ELSE b.spent_until END,
                 daily = CASE WHEN EXCLUDED.spent_until IS NOT NULL
                                     AND (b.spent_until IS NULL OR b.spent_until < EXCLUDED.spent_until)
                              THEN EXCLUDED.daily ELSE b.daily END,
                 factor = EXCLUDED.factor",
        )
        .bind(&learned.provider)
        .bind(&learned.scope)
        .bind(key_column(learned.key_index))
        .bind(learned.spent_for.map(millis))
        .bind(i64::from(learned.daily))
        .bind(learned.factor)
        .execute(pool)
        .await?;
        Ok(())
    }

    /// Records a cooldown (PostgreSQL), extended, never shortened while it lasts.
    async fn share_cooled(&self, cooled: &Cooled) -> Result<(), StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok(());
        };
        sqlx::query(
            "INSERT INTO llm_shared_cooldowns AS c (provider, model, key_index, until, refused)
             VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4::BIGINT / 1000.0), $5)
             ON CONFLICT (provider, model, key_index) DO UPDATE SET
                 refused = CASE WHEN c.until > clock_timestamp() AND c.until > EXCLUDED.until
                                THEN c.refused ELSE EXCLUDED.refused END,
                 until = greatest(c.until, EXCLUDED.until)",
        )
        .bind(&cooled.provider)
        .bind(&cooled.model)
        .bind(cooled.key.map_or(WHOLE_MODEL, key_column))
        .bind(millis(cooled.cool_for))
        .bind(i64::from(cooled.refused))
        .execute(pool)
        .await?;
        Ok(())
    }

    /// Ends the model's and the key's cooldowns (PostgreSQL), not a refused key's.
    async fn share_recovered(&self, cooled: &Cooled) -> Result<(), StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok(());
        };
        sqlx::query(
            "DELETE FROM llm_shared_cooldowns
             WHERE provider = $1 AND model = $2 AND key_index IN ($3, -2) AND refused = 0",
        )
        .bind(&cooled.provider)
        .bind(&cooled.model)
        .bind(cooled.key.map_or(WHOLE_MODEL, key_column))
        .execute(pool)
        .await?;
        Ok(())
    }

    /// Says something once: `true` the first time `(what, key)` comes, across restarts
    /// and instances (the row is claimed in one statement, before anything is said).
    pub async fn say_once(&self, what: &str, key: &str) -> Result<bool, StoreError> {
        const CLAIM: Sql = Sql::both(
            "INSERT INTO said_once (what, key) VALUES ($1, $2)
             ON CONFLICT (what, key) DO NOTHING RETURNING 1",
        );
        let claimed = retry_busy("say_once", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query_scalar::<_, i32>(CLAIM.on(pool))
                    .bind(what)
                    .bind(key)
                    .fetch_all(pool)
                    .await?
                    .len()
            }))
        })
        .await?;
        if claimed == 1 {
            self.prune_said_once().await?;
        }
        Ok(claimed == 1)
    }

    /// Forgets that something was said (it did not get through after all).
    pub async fn forget_said(&self, what: &str, key: &str) -> Result<(), StoreError> {
        const FORGET: Sql = Sql::both("DELETE FROM said_once WHERE what = $1 AND key = $2");
        retry_busy("forget_said", || async {
            on_db!(self, write, |pool| {
                sqlx::query(FORGET.on(pool))
                    .bind(what)
                    .bind(key)
                    .execute(pool)
                    .await?
                    .rows_affected()
            });
            Ok(())
        })
        .await
    }

    async fn prune_said_once(&self) -> Result<(), StoreError> {
        const PRUNE: Sql = Sql {
            sqlite: "DELETE FROM said_once WHERE what <> 'import'
                     AND at < datetime('now', '-' || $1 || ' seconds')",
            postgres: "DELETE FROM said_once WHERE what <> 'import'
                       AND at < daylog_utc(now() - make_interval(secs => $1))",
        };
        on_db!(self, write, |pool| {
            sqlx::query(PRUNE.on(pool))
                .bind(SAID_ONCE_KEPT_SECS)
                .execute(pool)
                .await?
                .rows_affected()
        });
        Ok(())
    }

    /// Records that `user_id` sent `/import` at `at` (the last one counts).
    pub async fn ask_import(&self, user_id: UserId, at: Timestamp) -> Result<(), StoreError> {
        const ASK: Sql = Sql::both(
            "INSERT INTO said_once (what, key, at) VALUES ($1, $2, $3)
             ON CONFLICT (what, key) DO UPDATE SET at = excluded.at",
        );
        let at = sql_timestamp(at);
        retry_busy("ask_import", || async {
            on_db!(self, write, |pool| {
                sqlx::query(ASK.on(pool))
                    .bind(IMPORT_ASK)
                    .bind(user_id.get().to_string())
                    .bind(&at)
                    .execute(pool)
                    .await?
                    .rows_affected()
            });
            Ok(())
        })
        .await
    }

    /// Takes `user_id`'s `/import`, if one is stored: when it was sent. Taken once: a
    /// second document (on this instance or another) finds none.
    pub async fn take_import_ask(&self, user_id: UserId) -> Result<Option<Timestamp>, StoreError> {
        const TAKE: Sql =
            Sql::both("DELETE FROM said_once WHERE what = $1 AND key = $2 RETURNING at");
        let taken = retry_busy("take_import_ask", || async {
            Ok(on_db!(self, write, |pool| {
                sqlx::query_scalar::<_, String>(TAKE.on(pool))
                    .bind(IMPORT_ASK)
                    .bind(user_id.get().to_string())
                    .fetch_all(pool)
                    .await?
            }))
        })
        .await?;
        Ok(taken.first().and_then(|at| parse_sql_timestamp(at)))
    }

    /// Records Telegram's 429 for every instance (PostgreSQL): nothing is sent to
    /// `chat` (`None`: to any chat) for `hold`. One instance (SQLite) waits in memory.
    pub async fn hold_telegram(
        &self,
        chat: Option<ChatId>,
        hold: Duration,
    ) -> Result<(), StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok(());
        };
        sqlx::query(
            "INSERT INTO telegram_holds AS h (chat_id, until)
             VALUES ($1, clock_timestamp() + make_interval(secs => $2::BIGINT / 1000.0))
             ON CONFLICT (chat_id) DO UPDATE SET until = greatest(h.until, EXCLUDED.until)",
        )
        .bind(chat.map_or(0, ChatId::get))
        .bind(millis(hold))
        .execute(pool)
        .await?;
        Ok(())
    }

    /// How long nothing may be sent to `chat` yet, as any instance's 429 said
    /// (PostgreSQL; `None` on SQLite and when nothing holds it).
    pub async fn telegram_hold(
        &self,
        chat: Option<ChatId>,
    ) -> Result<Option<Duration>, StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok(None);
        };
        let left: Option<i64> = sqlx::query_scalar(
            "SELECT ceil(extract(epoch FROM max(until) - clock_timestamp()) * 1000)::BIGINT
             FROM telegram_holds WHERE chat_id IN ($1, 0) AND until > clock_timestamp()",
        )
        .bind(chat.map_or(0, ChatId::get))
        .fetch_one(pool)
        .await?;
        Ok(left
            .and_then(|ms| u64::try_from(ms).ok())
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis))
    }
}

impl Store {
    /// Every hold some instance's 429 recorded and not yet over, as (chat, time left;
    /// chat 0: every chat), in one read (PostgreSQL; none on SQLite, where the one
    /// instance keeps its holds in memory).
    pub async fn telegram_holds(&self) -> Result<Vec<(i64, Duration)>, StoreError> {
        let Db::Postgres(pool) = &self.db else {
            return Ok(Vec::new());
        };
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT chat_id, ceil(extract(epoch FROM until - clock_timestamp()) * 1000)::BIGINT
             FROM telegram_holds WHERE until > clock_timestamp()",
        )
        .fetch_all(pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(chat, ms)| Some((chat, Duration::from_millis(u64::try_from(ms).ok()?))))
            .collect())
    }
}

/// A check-and-spend's answer as the database words it (`wait_ms`, `why`).
fn admitted(wait_ms: i64, why: &str) -> Admitted {
    let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
    match why {
        "ok" => Admitted::Yes,
        "model" => Admitted::ModelCooling(wait),
        "cooling" => Admitted::Cooling(wait),
        "refused" => Admitted::Refused(wait),
        _ => Admitted::Budget(wait),
    }
}

/// An admission function's answer with how many requests it counted: at least one
/// when admitted, none when refused.
fn granted_answer(wait_ms: i64, why: &str, granted: i64) -> (Admitted, u32) {
    match admitted(wait_ms, why) {
        Admitted::Yes => (Admitted::Yes, u32::try_from(granted).unwrap_or(0).max(1)),
        refused => (refused, 0),
    }
}

impl SharedLimits for Store {
    fn admit<'a>(&'a self, ask: Admission<'a>) -> BoxFuture<'a, Result<Admitted, String>> {
        Box::pin(async move {
            self.admit_shared(&ask, 1, Duration::ZERO)
                .await
                .map(|(admitted, _)| admitted)
                .map_err(|e| e.to_string())
        })
    }

    fn admit_block<'a>(
        &'a self,
        ask: Admission<'a>,
        want: u32,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(Admitted, u32), String>> {
        Box::pin(async move {
            self.admit_shared(&ask, want, hold)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn admit_tokens_block<'a>(
        &'a self,
        ask: Admission<'a>,
        tokens: TokensAsk,
        want: u32,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(Admitted, u32), String>> {
        Box::pin(async move {
            self.admit_tokens_shared(&ask, tokens, want, hold)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn learned(&self, learned: Learned) -> BoxFuture<'static, Result<(), String>> {
        let store = self.clone();
        Box::pin(async move {
            store
                .share_learned(&learned)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn cooled(&self, cooled: Cooled) -> BoxFuture<'static, Result<(), String>> {
        let store = self.clone();
        Box::pin(async move { store.share_cooled(&cooled).await.map_err(|e| e.to_string()) })
    }

    fn recovered(&self, cooled: Cooled) -> BoxFuture<'static, Result<(), String>> {
        let store = self.clone();
        Box::pin(async move {
            store
                .share_recovered(&cooled)
                .await
                .map_err(|e| e.to_string())
        })
    }
}
