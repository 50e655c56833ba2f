//! The read-only connections of `daylog sql` and `daylog backup`.

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

use super::{Limits, StoreError, database_path, parse_options, pool_options};

/// The connection of `daylog sql`: read-only at the file level (`mode=ro`) and at the
/// connection level (`PRAGMA query_only`). Each fence alone refuses every write; tests
/// take one away at a time to prove the other still holds.
pub fn read_only_options(
    url: &str,
    busy_timeout: Duration,
) -> Result<SqliteConnectOptions, StoreError> {
    Ok(parse_options(url)?
        .read_only(true)
        .create_if_missing(false)
        .busy_timeout(busy_timeout)
        .pragma("query_only", "ON"))
}

/// Opens a database for `daylog sql` with [`read_only_options`]. A missing file is an
/// error, never a new file.
pub async fn open_read_only(url: &str, limits: Limits) -> Result<SqlitePool, StoreError> {
    let options = read_only_options(url, limits.busy_timeout)?;
    open_file(&database_path(url)?, limits, options).await
}

/// Opens a PostgreSQL database for `daylog sql`: a pool of one connection (the
/// read-only fences are the query's, `sqlcmd::postgres`). Errors name the database by
/// its name and host, never the URL.
pub async fn open_postgres_for_sql(url: &str, limits: Limits) -> Result<sqlx::PgPool, StoreError> {
    let (options, shown) = super::postgres_options(url)?;
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(limits.busy_timeout.max(std::time::Duration::from_secs(5)))
        .connect_with(options)
        .await
        .map_err(|source| StoreError::Open {
            path: shown,
            source,
        })
}

/// One connection to the existing file `path`; a missing file is an error, never a new
/// file.
async fn open_file(
    path: &Path,
    limits: Limits,
    options: SqliteConnectOptions,
) -> Result<SqlitePool, StoreError> {
    let shown = || path.display().to_string();
    if !path.exists() {
        return Err(StoreError::Missing { path: shown() });
    }
    pool_options(limits)
        .max_connections(1)
        .connect_with(
            options
                .create_if_missing(false)
                .busy_timeout(limits.busy_timeout),
        )
        .await
        .map_err(|source| StoreError::Open {
            path: shown(),
            source,
        })
}

/// What `daylog backup` wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backup {
    /// Entries in the copy, counted in the copy itself.
    pub entries: i64,
    pub bytes: u64,
}

/// Writes a consistent copy of the database to `dest`, a file that must not exist yet,
/// with SQLite's `VACUUM INTO`: one read transaction's snapshot, so it is whole even
/// while the bot writes, and a single file (no `-wal` beside it). The connection is
/// read-only at the file level; `query_only` is left off, since SQLite counts writing
/// the copy as a write. The copy and its folder are synced to disk, and the copy is
/// checked (`quick_check`) and its entries counted before it is reported; a copy that
/// fails any of that is removed, so that trying again is not refused as "exists".
pub async fn backup(url: &str, limits: Limits, dest: &Path) -> Result<Backup, StoreError> {
    if super::is_postgres_url(url) {
        // The server's own tool makes a consistent copy; daylog does not copy a server.
        return Err(StoreError::Backup {
            path: dest.display().to_string(),
            message: "the database is PostgreSQL: back it up with pg_dump (for example \
                      `pg_dump --format=custom --file=daylog.dump \"$DATABASE_URL\"`)"
                .to_owned(),
        });
    }
    let options = parse_options(url)?.read_only(true);
    let source = open_file(&database_path(url)?, limits, options).await?;
    let written = sqlx::query("VACUUM INTO ?1")
        .bind(dest.to_string_lossy())
        .execute(&source)
        .await;
    source.close().await;
    let failed = |message: String| StoreError::Backup {
        path: dest.display().to_string(),
        message,
    };
    let result = match written {
        Ok(_) => check_copy(dest, limits).await.map_err(failed),
        Err(error) => Err(failed(error.to_string())),
    };
    if result.is_err() {
        let _ = std::fs::remove_file(dest);
    }
    result
}

/// Syncs the new copy and its folder, and reads it back whole.
async fn check_copy(dest: &Path, limits: Limits) -> Result<Backup, String> {
    let file = std::fs::File::open(dest).map_err(|e| e.to_string())?;
    file.sync_all().map_err(|e| e.to_string())?;
    let bytes = file.metadata().map_err(|e| e.to_string())?.len();
    super::durable::sync_folder_of(dest).map_err(|e| e.to_string())?;
    let options = SqliteConnectOptions::new()
        .filename(dest)
        .read_only(true)
        .pragma("query_only", "ON");
    let copy = open_file(dest, limits, options)
        .await
        .map_err(|e| e.to_string())?;
    let damage = super::quick_check(&copy).await;
    let entries = sqlx::query_scalar("SELECT count(*) FROM day_logs")
        .fetch_one(&copy)
        .await;
    copy.close().await;
    if let Some(found) = damage {
        return Err(format!("the copy reads back damaged ({found})"));
    }
    let entries = entries.map_err(|e| e.to_string())?;
    Ok(Backup { entries, bytes })
}

#[cfg(test)]
mod tests {
    use super::{Limits, backup};

    #[tokio::test]
    async fn a_backup_of_a_postgresql_database_names_pg_dump_and_writes_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let dest = dir.path().join("copy.db");
        let refused = backup(
            "postgres://daylog:secret@db.example/daylog",
            Limits::busy_timeout(std::time::Duration::from_secs(1)),
            &dest,
        )
        .await
        .expect_err("refused");
        let said = refused.to_string();
        assert!(said.contains("pg_dump"), "{said}");
        assert!(
            !said.contains("secret"),
            "the URL's password is never repeated: {said}"
        );
        assert!(!dest.exists());
    }
}
