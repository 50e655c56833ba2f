//! The three fences that keep `daylog sql` read-only (docs/operations.md), one at a time: each test
//! takes the other fences away and shows that the one left still refuses the write, so
//! removing any single fence makes a test fail.
//!
//! - the statement check (`sqlcmd::check`, run by `sqlcmd::query`);
//! - the file opened read-only (`mode=ro`, [`store::read_only_options`]);
//! - the connection under `PRAGMA query_only` (the same options).
//!
//! On PostgreSQL (`sqlcmd::postgres`), five: the same statement check with the check
//! of server functions with effects, one prepared statement (the extended protocol),
//! the `READ ONLY` transaction, its rollback, and `statement_timeout`.

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use std::time::Duration;

use daylog::language::Language;
use daylog::sqlcmd::{self, Limits, QueryError, Refusal};
use daylog::store::UserId;
use daylog::store::{self, NewUser, Store};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

const BUSY: Duration = Duration::from_secs(5);
/// `daylog sql`'s own limits, as shipped.
const SQL: Limits = Limits {
    timeout: Duration::from_secs(30),
    max_rows: 1_000_000,
};

/// A write that passes the statement check (it starts with WITH): only the connection's
/// own fences stand between it and the data.
const WRITE_PAST_THE_CHECK: &str = "WITH doomed AS (SELECT 1) DELETE FROM users";

struct Db {
    dir: tempfile::TempDir,
    url: String,
}

/// A migrated database with one user, closed again so only the test's pool is open.
async fn db_with_one_user() -> Db {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/daylog.db", dir.path().display());
    let store = Store::open_and_migrate(&url, BUSY).await.expect("store");
    store
        .upsert_user(&NewUser {
            user_id: UserId(1),
            username: Some("someone"),
            language: Language::En,
        })
        .await
        .expect("user");
    store.close().await;
    Db { dir, url }
}

async fn pool(options: SqliteConnectOptions) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("connect")
}

/// Users, read through a connection of its own (not the one under test).
async fn users(db: &Db) -> i64 {
    let reader = pool(SqliteConnectOptions::new().filename(db.dir.path().join("daylog.db"))).await;
    let n = sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(&reader)
        .await
        .expect("count");
    reader.close().await;
    n
}

fn daylog_sql_options(db: &Db) -> SqliteConnectOptions {
    store::read_only_options(&db.url, BUSY).expect("options")
}

#[tokio::test]
async fn the_statement_check_refuses_writes_even_on_a_writable_connection() {
    let db = db_with_one_user().await;
    // No `mode=ro`, no `query_only`: a connection that would run any write.
    let writable =
        pool(SqliteConnectOptions::new().filename(db.dir.path().join("daylog.db"))).await;

    let other = db.dir.path().join("other.db");
    let attach = format!("ATTACH DATABASE '{}' AS other", other.display());
    for sql in [
        "DELETE FROM users",
        "UPDATE users SET language = 'ru'",
        "INSERT INTO users (user_id, chat_id) VALUES (2, 2)",
        "DROP TABLE day_logs",
        "SELECT 1; DELETE FROM users",
        attach.as_str(),
        "PRAGMA query_only = OFF",
    ] {
        let refused = sqlcmd::query(&writable, sql, &SQL).await;
        assert!(
            matches!(
                &refused,
                Err(QueryError::Refused(r)) if !matches!(r, Refusal::WriteRefused(_))
            ),
            "the check, not SQLite, refuses {sql}: {refused:?}"
        );
    }

    let (n, language): (i64, String) = sqlx::query_as("SELECT count(*), max(language) FROM users")
        .fetch_one(&writable)
        .await
        .expect("users");
    assert_eq!((n, language.as_str()), (1, "en"), "no user changed");
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'day_logs'")
            .fetch_one(&writable)
            .await
            .expect("tables");
    assert_eq!(tables, 1, "day_logs still exists");
    assert!(!other.exists(), "nothing attached");
}

#[tokio::test]
async fn mode_ro_alone_refuses_a_write_the_check_lets_through() {
    let db = db_with_one_user().await;
    let only_mode_ro = pool(daylog_sql_options(&db).pragma("query_only", "OFF")).await;

    let refused = sqlcmd::query(&only_mode_ro, WRITE_PAST_THE_CHECK, &SQL).await;

    assert!(
        matches!(refused, Err(QueryError::Refused(Refusal::WriteRefused(_)))),
        "{refused:?}"
    );
    only_mode_ro.close().await;
    assert_eq!(users(&db).await, 1);
}

#[tokio::test]
async fn query_only_alone_refuses_a_write_the_check_lets_through() {
    let db = db_with_one_user().await;
    let only_query_only = pool(daylog_sql_options(&db).read_only(false)).await;

    let refused = sqlcmd::query(&only_query_only, WRITE_PAST_THE_CHECK, &SQL).await;

    assert!(
        matches!(refused, Err(QueryError::Refused(Refusal::WriteRefused(_)))),
        "{refused:?}"
    );
    only_query_only.close().await;
    assert_eq!(users(&db).await, 1);
}

/// The control for the two tests above: switching both connection fences off does let
/// the write through, so each of them really tests one fence alone.
#[tokio::test]
async fn with_both_connection_fences_off_the_same_write_goes_through() {
    let db = db_with_one_user().await;
    let unfenced = pool(
        daylog_sql_options(&db)
            .read_only(false)
            .pragma("query_only", "OFF"),
    )
    .await;

    let result = sqlcmd::query(&unfenced, WRITE_PAST_THE_CHECK, &SQL).await;

    assert!(result.is_ok(), "{result:?}");
    unfenced.close().await;
    assert_eq!(users(&db).await, 0);
}

// ---- PostgreSQL: the statement check and the server's own fences, one at a time ----

/// A migrated PostgreSQL database with one user and a pool of one connection (so a
/// later query meets whatever the earlier one left on it), or `None` when this run has
/// no PostgreSQL (said once by the harness; a failure under `CI=true`).
async fn postgres_with_one_user() -> Option<(sqlx::PgPool, crate::support::postgres::FreshDb)> {
    use crate::support::postgres::{Backend, backends};
    if !backends().contains(&Backend::Postgres) {
        return None;
    }
    let db = Backend::Postgres.fresh().await;
    let store = Store::open_and_migrate(&db.url, BUSY).await.expect("store");
    store
        .upsert_user(&NewUser {
            user_id: UserId(1),
            username: Some("someone"),
            language: Language::En,
        })
        .await
        .expect("user");
    store.close().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .expect("pool");
    Some((pool, db))
}

async fn pg_users(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn postgres_the_effects_check_alone_refuses_a_server_function() {
    let Some((pool, _db)) = postgres_with_one_user().await else {
        return;
    };
    let sql = "SELECT pg_advisory_lock(42)";
    let refused = sqlcmd::postgres::query(&pool, sql, &SQL).await;
    assert!(
        matches!(
            refused,
            Err(QueryError::Refused(Refusal::ServerFunction(_)))
        ),
        "{refused:?}"
    );
    // Nothing else would have stopped it: the server's fences let it take the lock.
    let taken = sqlcmd::postgres::run_read_only(&pool, sql, &SQL).await;
    assert!(taken.is_ok(), "{taken:?}");
}

#[tokio::test]
async fn postgres_the_read_only_transaction_alone_refuses_a_write() {
    let Some((pool, _db)) = postgres_with_one_user().await else {
        return;
    };
    let refused = sqlcmd::postgres::run_read_only(&pool, WRITE_PAST_THE_CHECK, &SQL).await;
    assert!(
        matches!(refused, Err(QueryError::Refused(Refusal::WriteRefused(_)))),
        "{refused:?}"
    );
    assert_eq!(pg_users(&pool).await, 1);
}

#[tokio::test]
async fn postgres_the_rollback_alone_keeps_a_setting_from_outliving_the_query() {
    let Some((pool, _db)) = postgres_with_one_user().await else {
        return;
    };
    // Allowed by a READ ONLY transaction (the effects check, taken away here, refuses
    // it); undone only by the rollback.
    let sql = "SELECT set_config('application_name', 'leaked', false)";
    sqlcmd::postgres::run_read_only(&pool, sql, &SQL)
        .await
        .expect("runs");
    let after: String = sqlx::query_scalar("SELECT current_setting('application_name')")
        .fetch_one(&pool)
        .await
        .expect("setting");
    assert_ne!(after, "leaked");
}

#[tokio::test]
async fn postgres_the_statement_timeout_alone_stops_a_long_query() {
    let Some((pool, _db)) = postgres_with_one_user().await else {
        return;
    };
    let limits = Limits {
        timeout: Duration::from_millis(50),
        max_rows: 10,
    };
    let stopped = sqlcmd::postgres::run_read_only(
        &pool,
        "SELECT count(*) FROM generate_series(1, 100000000)",
        &limits,
    )
    .await;
    assert!(
        matches!(stopped, Err(QueryError::TimedOut(_))),
        "{stopped:?}"
    );
}

#[tokio::test]
async fn postgres_one_prepared_statement_alone_refuses_a_second_one() {
    let Some((pool, _db)) = postgres_with_one_user().await else {
        return;
    };
    // Sent as a simple query, this would end the read-only transaction and delete.
    let sql = "SELECT 1; COMMIT; DELETE FROM users";
    let refused = sqlcmd::postgres::run_read_only(&pool, sql, &SQL).await;
    assert!(matches!(refused, Err(QueryError::Sql(_))), "{refused:?}");
    assert_eq!(pg_users(&pool).await, 1);
}
