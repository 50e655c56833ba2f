//! `daylog sql` on PostgreSQL: the same statement check as on SQLite, and four fences of
//! the server's own, each of which a test takes away alone:
//!
//! - the effects check ([`check`]): no server function that acts beyond reading
//!   (`pg_terminate_backend`, `pg_advisory_*`, `set_config`, `pg_read_file`, `lo_*`,
//!   `dblink*`, …) and none that runs SQL handed to it as text (`query_to_xml`,
//!   `ts_stat`), named anywhere in the statement, quoted or not;
//! - one statement through the extended protocol (sqlx prepares it: the server refuses
//!   a prepared text of two commands);
//! - a `READ ONLY` transaction, always rolled back, whatever happened;
//! - `statement_timeout` from `sql.timeout_ms` (`SET LOCAL`, inside that transaction).
//!
//! A SELECT-only role (`DAYLOG_SQL_DATABASE_URL`) is the operator's fence beside these.

use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool, PgRow, PgValueRef};
use sqlx::{Row, TypeInfo, ValueRef};

use super::{Cell, Limits, QueryError, Refusal, ResultSet, collect, describe_columns};

/// Server functions with effects, refused by name (upper case).
const REFUSED: &[&str] = &[
    "PG_TERMINATE_BACKEND",
    "PG_CANCEL_BACKEND",
    "SET_CONFIG",
    "PG_READ_FILE",
    "PG_READ_BINARY_FILE",
    "PG_LS_DIR",
    "PG_STAT_FILE",
    "PG_RELOAD_CONF",
    "PG_ROTATE_LOGFILE",
    "PG_SWITCH_WAL",
    "PG_PROMOTE",
    "PG_NOTIFY",
    "PG_LOG_BACKEND_MEMORY_CONTEXTS",
    "PG_IMPORT_SYSTEM_COLLATIONS",
    "NEXTVAL",
    "SETVAL",
    "TXID_CURRENT",
    "PG_CURRENT_XACT_ID",
    "LOREAD",
    "LOWRITE",
    // These run the SQL they are given as text, which no check of the statement sees.
    "QUERY_TO_XML",
    "QUERY_TO_XMLSCHEMA",
    "QUERY_TO_XML_AND_XMLSCHEMA",
    "TS_STAT",
];

/// Families of server functions with effects, refused by prefix (upper case).
const REFUSED_PREFIXES: &[&str] = &[
    "PG_ADVISORY_",
    "PG_TRY_ADVISORY_",
    "LO_",
    "DBLINK",
    "PG_LOGICAL_",
    "PG_REPLICATION_",
    "PG_FILE_",
    "PG_CREATE_",
    "PG_DROP_",
    "PG_START_",
    "PG_STOP_",
    "PG_BACKUP_",
    "PG_WAL_REPLAY_",
];

/// The statement check of `daylog sql` on PostgreSQL: SQLite's (one statement, a read,
/// no ATTACH), then no server function with effects. Every run of letters, digits and
/// `_` counts, inside quotes and comments too: a function quoted as an identifier is
/// still that function, and text mentioning one is refused rather than read wrongly.
/// Unicode escapes (`U&"…"`, `U&'…'`), which can spell any name, are refused outright.
pub fn check(sql: &str) -> Result<(), Refusal> {
    super::check(sql)?;
    let upper = sql.to_uppercase();
    if upper.contains("U&\"") || upper.contains("U&'") {
        return Err(Refusal::ServerFunction("U&".to_owned()));
    }
    for word in upper.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        if REFUSED.contains(&word) || REFUSED_PREFIXES.iter().any(|p| word.starts_with(p)) {
            return Err(Refusal::ServerFunction(word.to_lowercase()));
        }
    }
    Ok(())
}

/// Runs one checked statement ([`check`]) with the server's fences ([`run_read_only`]).
pub async fn query(pool: &PgPool, sql: &str, limits: &Limits) -> Result<ResultSet, QueryError> {
    check(sql)?;
    run_read_only(pool, sql, limits).await
}

/// The server's fences alone, without the statement check (public so that a test can
/// show they hold by themselves): one prepared statement in a `READ ONLY` transaction
/// under `statement_timeout`, rolled back whatever happened.
pub async fn run_read_only(
    pool: &PgPool,
    sql: &str,
    limits: &Limits,
) -> Result<ResultSet, QueryError> {
    let timeout = limits.timeout;
    let mut conn = pool.acquire().await.map_err(|e| classify(e, timeout))?;
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128);
    let begun = async {
        sqlx::query("BEGIN READ ONLY").execute(&mut *conn).await?;
        sqlx::query(&format!("SET LOCAL statement_timeout = {ms}"))
            .execute(&mut *conn)
            .await
    }
    .await;
    let result = match begun {
        Ok(_) => fetch(&mut conn, sql, limits).await,
        Err(error) => Err(classify(error, timeout)),
    };
    if sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err() {
        // Never handed back to the pool in an unknown state.
        let _ = conn.detach();
    }
    result
}

async fn fetch(
    conn: &mut PgConnection,
    sql: &str,
    limits: &Limits,
) -> Result<ResultSet, QueryError> {
    let rows = sqlx::query(sql).fetch(&mut *conn);
    let (columns, rows) =
        collect(rows, limits.max_rows, cell, |e| classify(e, limits.timeout)).await?;
    let columns = match columns {
        Some(columns) => columns,
        None => describe_columns(&mut *conn, sql).await,
    };
    Ok(ResultSet { columns, rows })
}

/// What an error of the server means for the user: a write refused by the read-only
/// transaction, the timeout, a mistake in the query, or the database failing.
fn classify(error: sqlx::Error, timeout: Duration) -> QueryError {
    let Some(db) = error.as_database_error() else {
        return QueryError::Failed(error.to_string());
    };
    let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
    let message = db.message().to_owned();
    match code.as_str() {
        // read_only_sql_transaction
        "25006" => QueryError::Refused(Refusal::WriteRefused(message)),
        // query_canceled (statement_timeout)
        "57014" => QueryError::TimedOut(timeout),
        // syntax errors and access rules (class 42), data errors (22), a prepared
        // text of several commands, insufficient privilege
        c if c.starts_with("42") || c.starts_with("22") || c.starts_with("0A") => {
            QueryError::Sql(message)
        }
        _ => QueryError::Failed(message),
    }
}

/// Microseconds from PostgreSQL's epoch (2000-01-01) to the Unix one.
const PG_EPOCH_SECS: i64 = 946_684_800;

fn cell(row: &PgRow, index: usize) -> Result<Cell, sqlx::Error> {
    let raw = row.try_get_raw(index)?;
    if raw.is_null() {
        return Ok(Cell::Null);
    }
    let type_name = raw.type_info().name().to_owned();
    Ok(match type_name.as_str() {
        "INT2" => Cell::Integer(i64::from(row.try_get::<i16, _>(index)?)),
        "INT4" => Cell::Integer(i64::from(row.try_get::<i32, _>(index)?)),
        "INT8" => Cell::Integer(row.try_get(index)?),
        "FLOAT4" => Cell::Real(f64::from(row.try_get::<f32, _>(index)?)),
        "FLOAT8" => Cell::Real(row.try_get(index)?),
        "BOOL" => Cell::Text(row.try_get::<bool, _>(index)?.to_string()),
        "BYTEA" => Cell::Blob(row.try_get(index)?),
        "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" | "CHAR" | "UNKNOWN" => {
            Cell::Text(row.try_get(index)?)
        }
        _ => other(raw, &type_name),
    })
}

/// A value of a type sqlx is not built to decode here, from its binary form: numbers,
/// moments and JSON as their text; anything else as text when it is UTF-8, else bytes.
fn other(raw: PgValueRef<'_>, type_name: &str) -> Cell {
    let Ok(bytes) = raw.as_bytes() else {
        return Cell::Null;
    };
    let text = match type_name {
        "NUMERIC" => numeric(bytes),
        "JSONB" => bytes
            .split_first()
            .and_then(|(_, rest)| std::str::from_utf8(rest).ok())
            .map(str::to_owned),
        "TIMESTAMPTZ" | "TIMESTAMP" => <[u8; 8]>::try_from(bytes).ok().and_then(|b| {
            let micros = i64::from_be_bytes(b);
            let at = jiff::Timestamp::from_microsecond(micros)
                .ok()?
                .checked_add(jiff::SignedDuration::from_secs(PG_EPOCH_SECS))
                .ok()?;
            Some(crate::time::sql_timestamp(at))
        }),
        "DATE" => <[u8; 4]>::try_from(bytes).ok().and_then(|b| {
            let days = i32::from_be_bytes(b);
            jiff::civil::date(2000, 1, 1)
                .checked_add(jiff::Span::new().days(i64::from(days)))
                .ok()
                .map(|day| day.to_string())
        }),
        _ => std::str::from_utf8(bytes).ok().map(str::to_owned),
    };
    match text {
        Some(text) => Cell::Text(text),
        None => Cell::Blob(bytes.to_vec()),
    }
}

/// PostgreSQL's binary NUMERIC as decimal text: `ndigits`, `weight`, `sign`, `dscale`
/// (each 16 bits) and base-10000 digits, the first of which is at `weight`.
fn numeric(bytes: &[u8]) -> Option<String> {
    let word = |i: usize| -> Option<i16> {
        Some(i16::from_be_bytes([
            *bytes.get(i * 2)?,
            *bytes.get(i * 2 + 1)?,
        ]))
    };
    let ndigits = usize::try_from(word(0)?).ok()?;
    let weight = i32::from(word(1)?);
    let sign = word(2)? as u16;
    let dscale = usize::try_from(word(3)?).ok()?;
    if sign == 0xC000 {
        return Some("NaN".to_owned());
    }
    let digits: Vec<i16> = (0..ndigits).map(|i| word(4 + i)).collect::<Option<_>>()?;
    let digit = |position: i32| -> i16 {
        usize::try_from(position)
            .ok()
            .and_then(|i| digits.get(i).copied())
            .unwrap_or(0)
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for position in 0..=weight {
            let d = digit(position);
            if position == 0 {
                out.push_str(&d.to_string());
            } else {
                out.push_str(&format!("{d:04}"));
            }
        }
    }
    if dscale > 0 {
        let mut fraction = String::new();
        let mut position = weight + 1;
        while fraction.len() < dscale {
            fraction.push_str(&format!("{:04}", digit(position)));
            position += 1;
        }
        fraction.truncate(dscale);
        out.push('.');
        out.push_str(&fraction);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::{check, numeric};
    use crate::sqlcmd::Refusal;

    #[test]
    fn server_functions_with_effects_are_refused_however_they_are_written() {
        for sql in [
            "SELECT pg_terminate_backend(pg_backend_pid())",
            "SELECT pg_catalog.pg_cancel_backend(1)",
            "SELECT \"pg_advisory_lock\"(1)",
            "SELECT PG_TRY_ADVISORY_LOCK(1)",
            "SELECT set_config('search_path', 'x', false)",
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT lo_import('/etc/passwd')",
            "SELECT * FROM dblink('host=x', 'DELETE FROM users') AS t(x int)",
            "SELECT query_to_xml('select 1', true, true, '')",
            "SELECT U&\"\\0070g_sleep\"(1)",
            "WITH x AS (SELECT nextval('s')) SELECT * FROM x",
        ] {
            assert!(
                matches!(check(sql), Err(Refusal::ServerFunction(_))),
                "{sql}: {:?}",
                check(sql)
            );
        }
        for sql in [
            "SELECT count(*) FROM day_logs",
            "SELECT left(created_at, 10) AS day, count(*) FROM day_logs GROUP BY 1",
            "SELECT metrics::jsonb ->> 'mood' FROM day_logs",
        ] {
            assert_eq!(check(sql), Ok(()), "{sql}");
        }
    }

    #[test]
    fn binary_numerics_read_as_their_decimal_text() {
        // 12345.67: ndigits 3, weight 1, sign +, dscale 2; digits 1, 2345, 6700.
        let words: [i16; 7] = [3, 1, 0, 2, 1, 2345, 6700];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(numeric(&bytes).as_deref(), Some("12345.67"));
        // -0.05: ndigits 1, weight -1, sign -, dscale 2; digit 500.
        let words: [i16; 5] = [1, -1, 0x4000, 2, 500];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(numeric(&bytes).as_deref(), Some("-0.05"));
        // 0 with dscale 0.
        let words: [i16; 4] = [0, 0, 0, 0];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(numeric(&bytes).as_deref(), Some("0"));
    }
}
