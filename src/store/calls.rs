//! The call recorder: `llm_calls` (written in the background through [`CallSink`]),
//! content-policy refusals and spent daily budgets.

use std::time::Duration;

use crate::domain::ModelRef;
use crate::llm::{Attempt, AttemptSink, LatencySample, SpentBudget};

use super::{Db, DigestId, LogId, Sql, Store, StoreError, on_db, retry_busy};

/// What a recorded call was about: a log, or a digest (so a user's `/delete` takes
/// its rows too, whose error text may quote the request back).
#[derive(Debug, Clone, Copy, Default)]
struct Owner {
    day_log_id: Option<LogId>,
    digest_id: Option<DigestId>,
}

/// Records attempts of one log's (or one digest's) cascade into `llm_calls`.
pub struct CallSink {
    calls: CallRecorder,
    owner: Owner,
}

impl AttemptSink for CallSink {
    fn record(&self, attempt: Attempt) {
        self.calls.send(Recorded::Call(self.owner, attempt));
    }
}

/// Most `llm_calls` rows written in one statement.
const CALL_BATCH: usize = 200;
/// How many of the latest calls a restart reads its hedging latencies from: enough for
/// each step's window (32 answers) at a few steps and tasks.
pub const LATENCY_LOOKBACK: i64 = 2000;

enum Recorded {
    Call(Owner, Attempt),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Writes `llm_calls` in the background, many rows per statement: two or more calls per
/// log would otherwise be as many separate writes on the one writer connection.
#[derive(Clone, Debug)]
pub(super) struct CallRecorder {
    queue: tokio::sync::mpsc::UnboundedSender<Recorded>,
}

impl CallRecorder {
    /// Starts the writer task; it ends when the last [`Store`] clone is dropped.
    pub(super) fn spawn(write: Db) -> Self {
        let (queue, mut incoming) = tokio::sync::mpsc::unbounded_channel::<Recorded>();
        tokio::spawn(async move {
            // What queued meanwhile goes with each write, nothing waits for more: the
            // hourly limit counts the analyses recorded here, and an edit sent the
            // moment its answer arrives must find the answer's call.
            while let Some(first) = incoming.recv().await {
                let mut batch = vec![first];
                while batch.len() < CALL_BATCH {
                    match incoming.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let mut calls = Vec::with_capacity(batch.len());
                let mut flushes = Vec::new();
                for item in batch {
                    match item {
                        Recorded::Call(log, attempt) => calls.push((log, attempt)),
                        Recorded::Flush(done) => flushes.push(done),
                    }
                }
                if !calls.is_empty() {
                    match insert_calls(&write, &calls).await {
                        Ok(()) => {}
                        Err(error) if error.is_busy() => {
                            // Locked for longer than every retry: these rows are lost,
                            // the logs they describe are not.
                            tracing::warn!(%error, rows = calls.len(), "could not record LLM calls");
                        }
                        // One bad row (its log deleted meanwhile) must not lose the others.
                        Err(_) => {
                            for call in &calls {
                                if let Err(error) =
                                    insert_calls(&write, std::slice::from_ref(call)).await
                                {
                                    tracing::warn!(%error, day_log_id = call.0.day_log_id.map(LogId::get), digest_id = call.0.digest_id.map(DigestId::get), "could not record an LLM call");
                                }
                            }
                        }
                    }
                }
                for done in flushes {
                    let _ = done.send(());
                }
            }
        });
        Self { queue }
    }

    fn send(&self, item: Recorded) {
        if self.queue.send(item).is_err() {
            tracing::warn!("the LLM call recorder has stopped; a call was not recorded");
        }
    }

    pub(super) async fn flush(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.send(Recorded::Flush(done));
        let _ = wait.await;
    }
}

/// [`insert_calls`] on PostgreSQL: one text for any number of rows (each column an
/// array), planned once per connection; a `VALUES` list per row count was a statement
/// of its own for every size of batch.
const INSERT_CALLS_POSTGRES: &str = "INSERT INTO llm_calls (day_log_id, digest_id, task,
         provider, model, key_index, attempt, http_status, outcome, latency_ms, wait_ms, error)
     SELECT * FROM unnest(CAST($1 AS BIGINT[]), CAST($2 AS BIGINT[]), CAST($3 AS TEXT[]),
         CAST($4 AS TEXT[]), CAST($5 AS TEXT[]), CAST($6 AS BIGINT[]), CAST($7 AS BIGINT[]),
         CAST($8 AS BIGINT[]), CAST($9 AS TEXT[]), CAST($10 AS BIGINT[]),
         CAST($11 AS BIGINT[]), CAST($12 AS TEXT[]))";

async fn insert_calls(db: &Db, calls: &[(Owner, Attempt)]) -> Result<(), StoreError> {
    retry_busy("record_calls", || async {
        match db {
            Db::Sqlite(sqlite) => {
                let mut insert = sqlx::QueryBuilder::new(
                    "INSERT INTO llm_calls (day_log_id, digest_id, task, provider, model, key_index,
                         attempt, http_status, outcome, latency_ms, wait_ms, error) ",
                );
                insert.push_values(calls, |mut row, (owner, attempt)| {
                    row.push_bind(owner.day_log_id)
                        .push_bind(owner.digest_id)
                        .push_bind(attempt.task.as_str())
                        .push_bind(attempt.provider.clone())
                        .push_bind(attempt.model.clone())
                        .push_bind(attempt.key_index.map(|i| i as i64))
                        .push_bind(i64::from(attempt.attempt))
                        .push_bind(attempt.http_status.map(i64::from))
                        .push_bind(attempt.outcome.as_str())
                        .push_bind(attempt.latency_ms as i64)
                        .push_bind(attempt.wait_ms as i64)
                        .push_bind(attempt.error.clone());
                });
                insert.build().execute(&sqlite.write).await?;
            }
            Db::Postgres(pg) => {
                fn column<'a, T>(
                    calls: &'a [(Owner, Attempt)],
                    of: impl Fn(&'a (Owner, Attempt)) -> T,
                ) -> Vec<T> {
                    calls.iter().map(of).collect()
                }
                sqlx::query(INSERT_CALLS_POSTGRES)
                    .bind(column(calls, |(o, _)| o.day_log_id.map(LogId::get)))
                    .bind(column(calls, |(o, _)| o.digest_id.map(DigestId::get)))
                    .bind(column(calls, |(_, a)| a.task.as_str()))
                    .bind(column(calls, |(_, a)| a.provider.as_str()))
                    .bind(column(calls, |(_, a)| a.model.as_str()))
                    .bind(column(calls, |(_, a)| a.key_index.map(|i| i as i64)))
                    .bind(column(calls, |(_, a)| i64::from(a.attempt)))
                    .bind(column(calls, |(_, a)| a.http_status.map(i64::from)))
                    .bind(column(calls, |(_, a)| a.outcome.as_str()))
                    .bind(column(calls, |(_, a)| a.latency_ms as i64))
                    .bind(column(calls, |(_, a)| a.wait_ms as i64))
                    .bind(column(calls, |(_, a)| a.error.as_deref()))
                    .execute(pg)
                    .await?;
            }
        }
        Ok(())
    })
    .await
}

fn unix_secs(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Store {
    // ---- Content-policy refusals (docs/behaviour.md, The cascade) ----

    /// The models (provider, model) that refused this log's current text on content
    /// policy: they are never asked about it again.
    pub async fn refusals(&self, day_log_id: LogId) -> Result<Vec<ModelRef>, StoreError> {
        let rows: Vec<(String, String)> = on_db!(self, read, |pool| {
            sqlx::query_as(
                "SELECT provider, model FROM llm_refusals WHERE day_log_id = $1
                 ORDER BY created_at, provider, model",
            )
            .bind(day_log_id)
            .fetch_all(pool)
            .await?
        });
        Ok(rows.into_iter().map(ModelRef::from).collect())
    }

    /// Remembers that these models refused `analysed_text` of this log. Nothing is
    /// stored when the log's text has changed meanwhile (an edit is a new question).
    pub async fn record_refusals(
        &self,
        day_log_id: LogId,
        analysed_text: &str,
        refused: &[ModelRef],
    ) -> Result<(), StoreError> {
        for ModelRef { provider, model } in refused {
            retry_busy("record_refusals", || async {
                on_db!(self, write, |pool| {
                    sqlx::query(
                        "INSERT INTO llm_refusals (day_log_id, provider, model)
                         SELECT id, $2, $3 FROM day_logs WHERE id = $1 AND text = $4
                         ON CONFLICT DO NOTHING",
                    )
                    .bind(day_log_id)
                    .bind(provider)
                    .bind(model)
                    .bind(analysed_text)
                    .execute(pool)
                    .await?
                    .rows_affected()
                });
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    // ---- Spent daily budgets (docs/behaviour.md, The cascade) ----

    /// Stores daily budgets spent until their reset; rows already over are pruned.
    pub async fn save_spent_budgets(&self, spent: &[SpentBudget]) -> Result<(), StoreError> {
        const SAVE: Sql = Sql {
            sqlite: "INSERT INTO llm_budgets (provider, scope, key_index, spent_until, reason)
                     VALUES ($1, $2, $3, datetime($4, 'unixepoch'), 'per-day quota')
                     ON CONFLICT (provider, scope, key_index) DO UPDATE SET
                         spent_until = excluded.spent_until, reason = excluded.reason,
                         updated_at = datetime('now')",
            postgres: "INSERT INTO llm_budgets (provider, scope, key_index, spent_until, reason)
                     VALUES ($1, $2, $3, daylog_utc(to_timestamp($4)), 'per-day quota')
                     ON CONFLICT (provider, scope, key_index) DO UPDATE SET
                         spent_until = excluded.spent_until, reason = excluded.reason,
                         updated_at = daylog_utc(now())",
        };
        const PRUNE: Sql = Sql {
            sqlite: "DELETE FROM llm_budgets WHERE spent_until <= datetime('now')",
            postgres: "DELETE FROM llm_budgets WHERE spent_until <= daylog_utc(now())",
        };
        for s in spent {
            let until = unix_secs(s.until);
            let key_index = s
                .key_index
                .and_then(|i| i64::try_from(i).ok())
                .unwrap_or(-1);
            retry_busy("save_spent_budgets", || async {
                on_db!(self, write, |pool| {
                    sqlx::query(SAVE.on(pool))
                        .bind(&s.provider)
                        .bind(&s.scope)
                        .bind(key_index)
                        .bind(until)
                        .execute(pool)
                        .await?
                        .rows_affected()
                });
                Ok(())
            })
            .await?;
        }
        retry_busy("prune_budgets", || async {
            on_db!(self, write, |pool| {
                sqlx::query(PRUNE.on(pool))
                    .execute(pool)
                    .await?
                    .rows_affected()
            });
            Ok(())
        })
        .await
    }

    /// The daily budgets stored as spent and not yet reset.
    pub async fn spent_budgets(&self) -> Result<Vec<SpentBudget>, StoreError> {
        const SPENT: Sql = Sql {
            sqlite:
                "SELECT provider, scope, key_index, CAST(strftime('%s', spent_until) AS INTEGER)
                     FROM llm_budgets WHERE spent_until > datetime('now')
                     ORDER BY provider, scope, key_index",
            postgres: "SELECT provider, scope, key_index,
                         CAST(extract(epoch FROM daylog_moment(spent_until)) AS BIGINT)
                     FROM llm_budgets WHERE spent_until > daylog_utc(now())
                     ORDER BY provider, scope, key_index",
        };
        let rows: Vec<(String, String, i64, i64)> = on_db!(self, read, |pool| {
            sqlx::query_as(SPENT.on(pool)).fetch_all(pool).await?
        });
        Ok(rows
            .into_iter()
            .map(|(provider, scope, key_index, until)| SpentBudget {
                provider,
                scope,
                key_index: usize::try_from(key_index).ok(),
                until: std::time::SystemTime::UNIX_EPOCH
                    + Duration::from_secs(u64::try_from(until).unwrap_or(0)),
            })
            .collect())
    }

    /// The latencies of the usable answers among the last [`LATENCY_LOOKBACK`] calls,
    /// oldest first: what a restarted process's hedging starts from. Only analyses and
    /// metrics, whose thresholds they teach (a digest or a long recording is slow by
    /// nature). A range of the primary key, so a year of calls costs no more than a
    /// week's.
    pub async fn recent_latencies(&self) -> Result<Vec<LatencySample>, StoreError> {
        let rows: Vec<(String, String, i64)> = on_db!(self, read, |pool| {
            sqlx::query_as(
                "SELECT provider, model, latency_ms FROM llm_calls
                 WHERE id > (SELECT coalesce(max(id), 0) FROM llm_calls) - $1 AND outcome = 'ok'
                   AND task IN ('analysis', 'metrics')
                 ORDER BY id",
            )
            .bind(LATENCY_LOOKBACK)
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|(provider, model, latency_ms)| LatencySample {
                provider,
                model,
                latency: Duration::from_millis(u64::try_from(latency_ms).unwrap_or(0)),
            })
            .collect())
    }

    // ---- LLM calls ----

    pub async fn record_call(
        &self,
        day_log_id: Option<LogId>,
        attempt: &Attempt,
    ) -> Result<(), StoreError> {
        let owner = Owner {
            day_log_id,
            digest_id: None,
        };
        insert_calls(&self.db, &[(owner, attempt.clone())]).await
    }

    /// A sink for the cascade that records each attempt against one log. Recording runs
    /// in the background so the cascade never waits on the database.
    pub fn call_sink(&self, day_log_id: Option<LogId>) -> CallSink {
        CallSink {
            calls: self.calls.clone(),
            owner: Owner {
                day_log_id,
                digest_id: None,
            },
        }
    }

    /// A sink that records each attempt against one digest.
    pub fn digest_call_sink(&self, digest_id: DigestId) -> CallSink {
        CallSink {
            calls: self.calls.clone(),
            owner: Owner {
                day_log_id: None,
                digest_id: Some(digest_id),
            },
        }
    }

    /// Waits until every LLM call recorded so far through a [`CallSink`] is written.
    pub async fn flush_calls(&self) {
        self.calls.flush().await;
    }
}
