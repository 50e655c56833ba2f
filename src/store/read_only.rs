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
/// the copy as a write. The copy is synced to disk and read back before it is reported.
pub async fn backup(url: &str, limits: Limits, dest: &Path) -> Result<Backup, StoreError> {
    let options = parse_options(url)?.read_only(true);
    let source = open_file(&database_path(url)?, limits, options).await?;
    let written = sqlx::query("VACUUM INTO ?1")
        .bind(dest.to_string_lossy())
        .execute(&source)
        .await;
    source.close().await;
    written?;
    let file = std::fs::File::open(dest).map_err(StoreError::Sync)?;
    file.sync_all().map_err(StoreError::Sync)?;
    let bytes = file.metadata().map_err(StoreError::Sync)?.len();
    let copy_options = SqliteConnectOptions::new()
        .filename(dest)
        .read_only(true)
        .pragma("query_only", "ON");
    let copy = open_file(dest, limits, copy_options).await?;
    let entries = sqlx::query_scalar("SELECT count(*) FROM day_logs")
        .fetch_one(&copy)
        .await;
    copy.close().await;
    Ok(Backup {
        entries: entries?,
        bytes,
    })
}
