//! PostgreSQL's connections as the store hands them out ([`PgConns`]): taken from sqlx's
//! pool once and kept, so that a statement that completed gives its connection straight
//! to the next one.
//!
//! sqlx pings every connection it gets back (`return_to_pool`: a `Sync` and a wait for
//! `ReadyForQuery`, not configurable): after each statement a round trip, a wake-up of
//! the server's backend and one of this process, which SQLite's in-process connections
//! never pay. The store therefore keeps the connections it uses checked out of sqlx's
//! pool, in a list of its own, and every PostgreSQL statement of the store goes through
//! here (`&PgConns` and `&mut PgConn` are sqlx executors). The rules, each with its
//! reason:
//!
//! - A connection goes back to the list only once its statement *completed*: its result
//!   read to the end, or an error the server sent that ends the statement and not the
//!   session. A statement whose future was dropped (a timeout, a cancelled task) or that
//!   failed on the wire leaves the connection to sqlx, which pings it — reading what the
//!   server still sends for the cancelled statement — and only then lends it again, or
//!   closes it. So the next statement never lands behind a cancelled one.
//! - A transaction that did not end (its future dropped, an early return) closes its
//!   connection, and the server rolls the transaction back: a connection never comes
//!   back from here inside a transaction. A `COMMIT` refused with an `ERROR` (a
//!   serialization failure, a deferred constraint) has ended it too: the server rolled
//!   it back, and the connection is kept.
//! - A connection that sat unused for [`PING_IDLE`] is pinged before its next statement
//!   (the server, a restart or a proxy may have closed it meanwhile), as sqlx's
//!   `before_acquire` does for the connections it lends ([`super::Store::open_postgres`]).
//! - At most [`LEASES`] connections are in use at once, each with a permit: one fewer
//!   than sqlx's pool, whose last connection is the inbox's `PgListener`'s (several
//!   instances), which sqlx lends directly. A statement first waits for a permit —
//!   first come, first served, as in sqlx's own pool — then takes the most recently
//!   used free connection, and opens one from sqlx only when none is free, so that the
//!   store never holds more than [`LEASES`] either. A connection given back releases
//!   its permit only once it is in the list, so the waiter served next finds it there.
//!   The wait for a permit, and an idle connection's ping, count against sqlx's acquire
//!   timeout here; a connection sqlx is opening is waited for under sqlx's own timeout
//!   only (given up half-way, it is a server backend started for nothing — under a
//!   burst, a storm of them).
//! - A connection held for [`RECYCLE`], or left unused in the list that long, goes back
//!   to sqlx, so that sqlx's idle timeout and maximum lifetime still apply to it.
//!
//! A statement's rows are read to their end before the first is handed on (the store
//! reads every result whole anyway: see `returned` in the parent module), so a
//! connection is free again as soon as the call that used it returns.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt as _, StreamExt as _};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgQueryResult, PgRow, PgSeverity, PgStatement};
use sqlx::{Describe, Either, Execute, Executor, Postgres};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{PING_IDLE, POSTGRES_CONNECTIONS};

/// How many connections the store holds at most: sqlx's pool less the one the inbox's
/// listener takes from it directly.
const LEASES: usize = POSTGRES_CONNECTIONS as usize - 1;

/// How long the store keeps a connection before giving it back to sqlx once (a ping),
/// so that sqlx's idle timeout and maximum lifetime see it.
const RECYCLE: Duration = Duration::from_secs(300);

/// The store's PostgreSQL connections. Cheap to clone.
#[derive(Clone)]
pub struct PgConns(Arc<Inner>);

struct Inner {
    pool: PgPool,
    /// Connections not in use whose last statement completed, the most recently used
    /// last.
    free: Mutex<Vec<Idle>>,
    /// One permit per connection in use. Waiters are served in the order they came
    /// (tokio's semaphore is fair).
    permits: Arc<Semaphore>,
    /// How long a statement waits for a permit (sqlx's acquire timeout).
    wait: Duration,
}

/// A connection taken from sqlx and kept.
struct Kept {
    conn: PoolConnection<Postgres>,
    /// When it was taken from sqlx ([`RECYCLE`]).
    taken: Instant,
}

/// A connection in use, with the permit it is used under.
struct Held {
    kept: Kept,
    /// Declared last, so released after the connection went wherever it goes: a
    /// waiter woken by it finds the connection in the list ([`PgConns::give_back`]).
    permit: OwnedSemaphorePermit,
}

/// A connection in the list, not in use.
struct Idle {
    kept: Kept,
    since: Instant,
}

impl std::fmt::Debug for PgConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConns")
            .field("free", &self.lock_free().len())
            .field("available", &self.0.permits.available_permits())
            .finish()
    }
}

impl PgConns {
    pub(super) fn new(pool: PgPool) -> Self {
        let wait = pool.options().get_acquire_timeout();
        Self(Arc::new(Inner {
            pool,
            free: Mutex::new(Vec::with_capacity(LEASES)),
            permits: Arc::new(Semaphore::new(LEASES)),
            wait,
        }))
    }

    /// sqlx's pool itself, for what must take its connection there: migrations (before
    /// anything else runs) and the inbox's listener.
    pub(super) fn sqlx_pool(&self) -> &PgPool {
        &self.0.pool
    }

    fn lock_free(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list is only pushed to and popped from: a panic elsewhere cannot leave it
        // half-changed.
        self.0.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection for one or more statements, once a permit is free (in the order
    /// asked): the most recently used free connection, else a new one from sqlx. Waits
    /// for a permit, and for the pings of idle connections, at most sqlx's acquire
    /// timeout ([`sqlx::Error::PoolTimedOut`], a busy database to the store); a new
    /// connection under sqlx's own.
    pub async fn acquire(&self) -> Result<PgHold, sqlx::Error> {
        // Boxed: the wait is most of the future, and it sits inside every statement's.
        Box::pin(async {
            let deadline = tokio::time::Instant::now() + self.0.wait;
            let permit =
                tokio::time::timeout_at(deadline, Arc::clone(&self.0.permits).acquire_owned())
                    .await
                    .map_err(|_| sqlx::Error::PoolTimedOut)?
                    .map_err(|_| sqlx::Error::PoolClosed)?;
            let kept = match self.take_free(deadline).await? {
                Some(kept) => kept,
                // None free: the store holds at most the permits with this one too
                // (see the module's rules), and sqlx has a connection for it, or soon
                // will (one it is pinging).
                None => Kept {
                    conn: self.0.pool.acquire().await?,
                    taken: Instant::now(),
                },
            };
            Ok(PgHold(PgConn {
                held: Some(Held { kept, permit }),
                state: State::Ready,
                home: self.clone(),
            }))
        })
        .await
    }

    /// Starts a transaction on a connection of its own ([`PgHold::begin`]).
    pub async fn begin(&self) -> Result<PgTx, sqlx::Error> {
        Box::pin(async { self.acquire().await?.begin().await }).await
    }

    /// The most recently used free connection that still answers; `None` when the
    /// list is empty. A ping not answered by `deadline` closes its connection and
    /// times the statement out.
    async fn take_free(&self, deadline: tokio::time::Instant) -> Result<Option<Kept>, sqlx::Error> {
        loop {
            let Some(Idle { mut kept, since }) = self.lock_free().pop() else {
                return Ok(None);
            };
            if since.elapsed() < PING_IDLE {
                return Ok(Some(kept));
            }
            let pinged =
                tokio::time::timeout_at(deadline, sqlx::Connection::ping(&mut *kept.conn)).await;
            match pinged {
                Ok(Ok(())) => return Ok(Some(kept)),
                Ok(Err(error)) => {
                    tracing::debug!(%error, "an idle PostgreSQL connection was gone; closing it");
                    kept.conn.close_on_drop();
                }
                Err(_) => {
                    // Its answer half-read: never lent again.
                    kept.conn.close_on_drop();
                    return Err(sqlx::Error::PoolTimedOut);
                }
            }
        }
    }

    /// A connection whose statement completed: into the list, or back to sqlx when the
    /// store is closing or has held it for [`RECYCLE`]; its permit is released after.
    /// Connections left unused in the list for [`RECYCLE`] (after a burst) go back to
    /// sqlx too, which closes them once they idle past its timeout.
    fn give_back(&self, held: Held) {
        let Held { kept, permit } = held;
        if kept.taken.elapsed() >= RECYCLE {
            return;
        }
        let idle = Idle {
            kept,
            since: Instant::now(),
        };
        let to_sqlx: Vec<Idle> = {
            let mut free = self.lock_free();
            // Asked under the lock: `close` marks sqlx's pool closed before it empties
            // the list under it, so nothing pushed here outlives the emptying.
            if self.0.pool.is_closed() {
                vec![idle]
            } else {
                free.push(idle);
                let stale = free
                    .iter()
                    .take_while(|idle| idle.since.elapsed() >= RECYCLE)
                    .count();
                free.drain(..stale).collect()
            }
        };
        // The connection is in the list: the waiter this permit goes to finds it there.
        drop(permit);
        // Dropped outside the lock: sqlx pings each before taking it back.
        drop(to_sqlx);
    }

    /// Gives every free connection back to sqlx and closes its pool, waiting for the
    /// connections in use to come back.
    pub(super) async fn close(&self) {
        // Marks sqlx's pool closed at once, before the list is emptied (`give_back`).
        let closing = self.0.pool.close();
        let free: Vec<Idle> = std::mem::take(&mut *self.lock_free());
        drop(free);
        self.0.permits.close();
        closing.await;
    }
}

/// Whether a connection can take its next statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Its last statement completed (or it ran none).
    Ready,
    /// A statement was sent and did not complete: its future was dropped, or it failed
    /// on the wire.
    Busy,
    /// Inside a transaction ([`PgTx`]) that has not ended.
    InTransaction,
}

/// A connection handed out by [`PgConns::acquire`], for one or more statements:
/// `&mut *hold` runs them ([`PgConn`]).
#[derive(Debug)]
pub struct PgHold(PgConn);

/// A hold and a transaction each lend their connection to statements (`&mut *hold`).
macro_rules! lends_its_connection {
    ($holder:ty) => {
        impl std::ops::Deref for $holder {
            type Target = PgConn;

            fn deref(&self) -> &PgConn {
                &self.0
            }
        }

        impl std::ops::DerefMut for $holder {
            fn deref_mut(&mut self) -> &mut PgConn {
                &mut self.0
            }
        }
    };
}

lends_its_connection!(PgHold);
lends_its_connection!(PgTx);

impl PgHold {
    /// The connection, out of the store's hands for good (a session of its own, like
    /// the polling lock's): sqlx opens another in its place.
    pub(super) fn detach(mut self) -> Option<PgConnection> {
        self.0.held.take().map(|held| held.kept.conn.detach())
    }

    /// Starts a transaction on this connection. A transaction dropped before
    /// [`PgTx::commit`] or [`PgTx::rollback`] closes its connection.
    pub async fn begin(mut self) -> Result<PgTx, sqlx::Error> {
        // In a transaction from the moment `BEGIN` may have reached the server: dropped
        // before the answer (or failing), the connection is closed, never lent inside one.
        self.0.state = State::InTransaction;
        (&mut *self).execute(sqlx::raw_sql("BEGIN")).await?;
        Ok(PgTx(self.0))
    }
}

/// A handed-out connection with what its last statement left it in: `&mut PgConn`
/// runs statements (an executor). Dropped, it goes back to the store's list when its
/// last statement completed, else to sqlx (see the module's rules).
pub struct PgConn {
    held: Option<Held>,
    state: State,
    home: PgConns,
}

impl std::fmt::Debug for PgConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConn")
            .field("state", &self.state)
            .finish()
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        let Some(mut held) = self.held.take() else {
            return;
        };
        match self.state {
            State::Ready => self.home.give_back(held),
            // sqlx pings it, reading what the server still sends, before lending it.
            State::Busy => drop(held),
            // Closing it ends the transaction on the server.
            State::InTransaction => {
                held.kept.conn.close_on_drop();
                drop(held);
            }
        }
    }
}

impl PgConn {
    /// The connection, for a statement about to be sent: busy until [`Self::ran`]
    /// says it completed.
    fn start(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        let held = self.held.as_mut().ok_or(sqlx::Error::PoolClosed)?;
        if self.state == State::Ready {
            self.state = State::Busy;
        }
        Ok(&mut held.kept.conn)
    }

    /// Records how a statement ended (`failed`: its error, if any): a connection whose
    /// statement completed is ready for the next.
    fn ran(&mut self, failed: Option<&sqlx::Error>) {
        if self.state == State::Busy && completed(failed) {
            self.state = State::Ready;
        }
    }
}

/// Whether a statement completed: it returned, or the server refused it with an
/// `ERROR` (the session goes on: sqlx reads the rest of the answer before the next
/// statement). A `FATAL` or `PANIC` ends the session; any other error (I/O, protocol,
/// a row that does not decode half-way) may leave the answer half-read.
fn completed(failed: Option<&sqlx::Error>) -> bool {
    match failed {
        None => true,
        Some(sqlx::Error::Database(error)) => error
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .is_some_and(|error| ends_only_the_statement(error.severity())),
        Some(_) => false,
    }
}

/// Whether an error the server sent with this severity leaves the session going.
fn ends_only_the_statement(severity: PgSeverity) -> bool {
    matches!(severity, PgSeverity::Error)
}

/// A transaction on a handed-out connection: `&mut *tx` runs statements in it. Ended by
/// [`PgTx::commit`] or [`PgTx::rollback`]; dropped before that, its connection is closed
/// (the server rolls the transaction back).
#[derive(Debug)]
pub struct PgTx(PgConn);

impl PgTx {
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        let committed = self.end("COMMIT").await;
        // Refused with an `ERROR` (a serialization failure, a deferred constraint), a
        // `COMMIT` has ended the transaction too: the server rolled it back, and the
        // session goes on outside one.
        if let Err(error) = &committed
            && completed(Some(error))
        {
            self.0.state = State::Ready;
        }
        committed
    }

    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        self.end("ROLLBACK").await
    }

    async fn end(&mut self, how: &'static str) -> Result<(), sqlx::Error> {
        // Still in the transaction until the end is answered: dropped before that, or
        // failing, the connection is closed.
        (&mut self.0).execute(sqlx::raw_sql(how)).await?;
        self.0.state = State::Ready;
        Ok(())
    }
}

/// Runs a statement on `conn` and reads its whole answer, recording how it ended.
async fn whole_answer<'q, E>(
    conn: &mut PgConn,
    query: E,
) -> Vec<Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
where
    E: 'q + Execute<'q, Postgres>,
{
    let answer: Vec<_> = match conn.start() {
        Ok(raw) => raw.fetch_many(query).collect().await,
        Err(error) => vec![Err(error)],
    };
    // An answer stops at its first error; without one it was read to its end.
    let failed = answer.last().and_then(|last| last.as_ref().err());
    conn.ran(failed);
    answer
}

impl<'c> Executor<'c> for &'c mut PgConn {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        async move { futures::stream::iter(whole_answer(self, query).await) }
            .flatten_stream()
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        async move {
            let row = self.start()?.fetch_optional(query).await;
            self.ran(row.as_ref().err());
            row
        }
        .boxed()
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [sqlx::postgres::PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        async move {
            let statement = self.start()?.prepare_with(sql, parameters).await;
            self.ran(statement.as_ref().err());
            statement
        }
        .boxed()
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        async move {
            let described = self.start()?.describe(sql).await;
            self.ran(described.as_ref().err());
            described
        }
        .boxed()
    }
}

/// Each statement on `&PgConns` takes a connection for itself alone (autocommit), as on
/// sqlx's `&PgPool`.
impl<'p> Executor<'p> for &'_ PgConns {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let conns = self.clone();
        async move {
            let answer = match conns.acquire().await {
                Ok(mut conn) => whole_answer(&mut conn, query).await,
                Err(error) => vec![Err(error)],
            };
            futures::stream::iter(answer)
        }
        .flatten_stream()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let conns = self.clone();
        async move {
            let mut conn = conns.acquire().await?;
            (&mut *conn).fetch_optional(query).await
        }
        .boxed()
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [sqlx::postgres::PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'p: 'e,
    {
        let conns = self.clone();
        async move {
            let mut conn = conns.acquire().await?;
            (&mut *conn).prepare_with(sql, parameters).await
        }
        .boxed()
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        let conns = self.clone();
        async move {
            let mut conn = conns.acquire().await?;
            (&mut *conn).describe(sql).await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use sqlx::postgres::PgSeverity;

    use super::{completed, ends_only_the_statement};

    /// A database error that is not PostgreSQL's (sqlx builds `PgDatabaseError` only
    /// from a server's answer: an `ERROR` the server sent is kept in the `it` tests).
    #[derive(Debug)]
    struct Foreign;

    impl std::fmt::Display for Foreign {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("not PostgreSQL's")
        }
    }

    impl std::error::Error for Foreign {}

    impl sqlx::error::DatabaseError for Foreign {
        fn message(&self) -> &str {
            "not PostgreSQL's"
        }

        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }

        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn which_ends_of_a_statement_keep_its_connection() {
        let cases: [(&str, Option<sqlx::Error>, bool); 6] = [
            ("answered", None, true),
            (
                "io",
                Some(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into())),
                false,
            ),
            (
                "protocol",
                Some(sqlx::Error::Protocol("unexpected message".into())),
                false,
            ),
            (
                "encode",
                Some(sqlx::Error::Encode("too long".into())),
                false,
            ),
            (
                "decode",
                Some(sqlx::Error::Decode("not a number".into())),
                false,
            ),
            (
                "another database's error",
                Some(sqlx::Error::Database(Box::new(Foreign))),
                false,
            ),
        ];
        for (what, failed, kept) in cases {
            assert_eq!(completed(failed.as_ref()), kept, "{what}");
        }
    }

    #[test]
    fn only_an_error_of_severity_error_leaves_the_session_going() {
        let cases = [
            (PgSeverity::Error, true),
            (PgSeverity::Fatal, false),
            (PgSeverity::Panic, false),
        ];
        for (severity, goes_on) in cases {
            assert_eq!(ends_only_the_statement(severity), goes_on, "{severity:?}");
        }
    }
}
