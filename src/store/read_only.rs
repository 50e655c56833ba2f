//! The read-only connection of `daylog sql`.

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
    let path = database_path(url)?;
    if !Path::new(&path).exists() {
        return Err(StoreError::Missing {
            path: path.display().to_string(),
        });
    }
    let options = read_only_options(url, limits.busy_timeout)?;
    pool_options(limits)
        .max_connections(1)
        .connect_with(options)
        .await
        .map_err(|source| StoreError::Open {
            path: url.to_owned(),
            source,
        })
}
