//! `daylog sql`: one read-only statement against the store, printed as a table, CSV or
//! JSON.
//!
//! Three fences keep it read-only: a statement check here (one statement, starting with
//! SELECT / WITH / VALUES / EXPLAIN, no ATTACH), the file opened with `mode=ro`, and the
//! connection under `PRAGMA query_only`. The check gives the clear sentence; SQLite's own
//! read-only modes are what make it hold.
//!
//! On PostgreSQL ([`postgres`]) the same check, a check of server functions with
//! effects, and the server's fences: one prepared statement, a `READ ONLY` transaction
//! always rolled back, `statement_timeout`.
//!
//! Output: the table is for a terminal, so control characters in what users wrote (ESC,
//! OSC, other C0/C1 codes, DEL, bidi overrides) are shown escaped (`\x1b`, `\n`,
//! `\u{202e}`) and never reach the terminal raw. CSV and JSON are exact. JSON objects
//! keep the column order; a repeated column name gets a suffix (`x`, `x_2`, `x_3`).
//! BLOBs are lowercase hex in CSV and JSON (`<N bytes>` in the table). A query still
//! running after `sql.timeout_ms` is interrupted, and one returning more than
//! `sql.max_rows` rows is refused (they are held in memory to lay out the table).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use futures::TryStreamExt as _;

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Column, Row, TypeInfo, ValueRef};
use unicode_width::UnicodeWidthStr;

use crate::config::SqlSettings;

pub mod postgres;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("the query is empty")]
    Empty,
    #[error("daylog sql runs one statement at a time; remove everything after the first `;`")]
    SeveralStatements,
    #[error(
        "daylog sql only reads: start the query with SELECT, WITH, VALUES or EXPLAIN (`{0}` is not allowed)"
    )]
    NotARead(String),
    #[error("daylog sql cannot ATTACH other databases")]
    Attach,
    #[error("daylog sql only reads; the database refused a change: {0}")]
    WriteRefused(String),
    /// PostgreSQL: a server function that acts beyond reading (see `sqlcmd::postgres`).
    #[error("daylog sql only reads: `{0}` acts on the server and is not allowed")]
    ServerFunction(String),
}

/// A value of one result cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Cell {
    fn display(&self) -> String {
        match self {
            Cell::Null => "NULL".to_owned(),
            Cell::Integer(i) => i.to_string(),
            Cell::Real(f) => f.to_string(),
            Cell::Text(s) => s.clone(),
            Cell::Blob(b) => format!("<{} bytes>", b.len()),
        }
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            Cell::Null => serde_json::Value::Null,
            Cell::Integer(i) => (*i).into(),
            Cell::Real(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Cell::Text(s) => s.clone().into(),
            Cell::Blob(b) => hex(b).into(),
        }
    }

    /// The exact value for CSV: text as stored, BLOBs as hex, NULL as an empty field.
    fn exact(&self) -> String {
        match self {
            Cell::Null => String::new(),
            Cell::Blob(b) => hex(b),
            other => other.display(),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Whether a character must not reach a terminal as it is: control characters (C0,
/// DEL, C1, which start escape sequences) and the invisible marks that reorder text.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Text made safe to print on a terminal (the table format).
pub fn escape_for_terminal(text: &str) -> String {
    if !text.chars().any(needs_escape) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// JSON keys for the columns: a repeated name gets `_2`, `_3`, … (never a name that
/// another column already has), so no value overwrites another.
fn unique_names(columns: &[String]) -> Vec<String> {
    let mut used: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut names = Vec::with_capacity(columns.len());
    for (i, name) in columns.iter().enumerate() {
        let taken = |candidate: &str, used: &std::collections::HashSet<String>| {
            used.contains(candidate) || columns[i + 1..].iter().any(|c| c == candidate)
        };
        let mut chosen = name.clone();
        if used.contains(&chosen) {
            let mut n = 2;
            loop {
                chosen = format!("{name}_{n}");
                if !taken(&chosen, &used) {
                    break;
                }
                n += 1;
            }
        }
        used.insert(chosen.clone());
        names.push(chosen);
    }
    names
}

/// Column names and rows of a result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResultSet {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

/// Words of the statement outside string literals, quoted identifiers and comments,
/// upper-cased, plus whether a `;` is followed by anything but blanks and comments.
fn scan(sql: &str) -> (Vec<String>, bool) {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut after_semicolon = false;
    let mut trailing_content = false;
    let mut chars = sql.chars().peekable();
    let flush = |word: &mut String, words: &mut Vec<String>| {
        if !word.is_empty() {
            words.push(word.to_ascii_uppercase());
            word.clear();
        }
    };
    while let Some(c) = chars.next() {
        let starts_content = !c.is_whitespace() && c != ';';
        match c {
            '\'' | '"' | '`' | '[' => {
                flush(&mut word, &mut words);
                let close = if c == '[' { ']' } else { c };
                for d in chars.by_ref() {
                    if d == close {
                        // A doubled quote inside a literal reopens it; treating it as
                        // close-then-open gives the same result for our purpose.
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                flush(&mut word, &mut words);
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
                continue;
            }
            '/' if chars.peek() == Some(&'*') => {
                flush(&mut word, &mut words);
                chars.next();
                let mut prev = ' ';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                continue;
            }
            ';' => {
                flush(&mut word, &mut words);
                after_semicolon = true;
            }
            c if c.is_alphanumeric() || c == '_' => word.push(c),
            _ => flush(&mut word, &mut words),
        }
        if after_semicolon && starts_content {
            trailing_content = true;
        }
    }
    flush(&mut word, &mut words);
    (words, trailing_content)
}

/// Refuses anything but one reading statement, with a sentence that says why.
pub fn check(sql: &str) -> Result<(), Refusal> {
    let (words, several) = scan(sql);
    let first = words.first().ok_or(Refusal::Empty)?;
    if several {
        return Err(Refusal::SeveralStatements);
    }
    if words.iter().any(|w| w == "ATTACH") {
        return Err(Refusal::Attach);
    }
    if !matches!(first.as_str(), "SELECT" | "WITH" | "VALUES" | "EXPLAIN") {
        return Err(Refusal::NotARead(first.clone()));
    }
    Ok(())
}

fn cell(row: &SqliteRow, index: usize) -> Result<Cell, sqlx::Error> {
    let raw = row.try_get_raw(index)?;
    if raw.is_null() {
        return Ok(Cell::Null);
    }
    let type_name = raw.type_info().name().to_owned();
    Ok(match type_name.as_str() {
        "INTEGER" | "BOOLEAN" => Cell::Integer(row.try_get(index)?),
        "REAL" => Cell::Real(row.try_get(index)?),
        "BLOB" => Cell::Blob(row.try_get(index)?),
        _ => Cell::Text(row.try_get(index)?),
    })
}

/// SQLite's primary result codes that say something about the query rather than the
/// database file (`SQLITE_ERROR`: syntax, no such table, …; `SQLITE_RANGE`, `SQLITE_MISMATCH`).
fn is_query_mistake(code: i32) -> bool {
    matches!(code & 0xff, 1 | 20 | 25)
}

/// How often (in SQLite VM instructions) the timeout is checked: cheap, and well under a
/// millisecond apart.
const PROGRESS_OPS: i32 = 10_000;

fn classify(error: sqlx::Error, timeout: Duration) -> QueryError {
    let Some(db) = error.as_database_error() else {
        return QueryError::Failed(error.to_string());
    };
    let message = db.message().to_owned();
    let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
    if code & 0xff == 9 {
        // SQLITE_INTERRUPT: the progress handler stopped it.
        return QueryError::TimedOut(timeout);
    }
    if code & 0xff == 8
        || message.contains("readonly")
        || message.contains("read-only")
        || message.contains("query_only")
    {
        return QueryError::Refused(Refusal::WriteRefused(message));
    }
    if is_query_mistake(code) {
        QueryError::Sql(message)
    } else {
        // A corrupt or unreadable file, an I/O error: not the user's query.
        QueryError::Failed(message)
    }
}

/// What one query may take: `sql.timeout_ms` and `sql.max_rows`, or a test's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub timeout: Duration,
    pub max_rows: u64,
}

impl From<&SqlSettings> for Limits {
    fn from(settings: &SqlSettings) -> Self {
        Self {
            timeout: settings.timeout(),
            max_rows: settings.max_rows(),
        }
    }
}

/// Runs one checked statement on a read-only pool, interrupted after `sql.timeout_ms`
/// and refused beyond `sql.max_rows` rows (held in memory for the table's widths).
pub async fn query(pool: &SqlitePool, sql: &str, limits: &Limits) -> Result<ResultSet, QueryError> {
    let timeout = limits.timeout;
    check(sql)?;
    let mut conn = pool.acquire().await.map_err(|e| classify(e, timeout))?;
    {
        // Checked inside SQLite's VM, so a query that computes without returning rows
        // (an endless WITH RECURSIVE under count(*)) is stopped too.
        let deadline = Instant::now() + timeout;
        let mut handle = conn.lock_handle().await.map_err(|e| classify(e, timeout))?;
        handle.set_progress_handler(PROGRESS_OPS, move || Instant::now() < deadline);
    }
    let rows = sqlx::query(sql).fetch(&mut *conn);
    let (columns, rows) = collect(rows, limits.max_rows, cell, |e| classify(e, timeout)).await?;
    let columns = match columns {
        Some(columns) => columns,
        None => describe_columns(&mut *conn, sql).await,
    };
    Ok(ResultSet { columns, rows })
}

/// The rows of a statement as cells, and the column names when there was a row; an
/// error once more than `max_rows` come (they are held in memory for the table's widths).
async fn collect<R: Row>(
    mut rows: impl futures::Stream<Item = Result<R, sqlx::Error>> + Unpin,
    max_rows: u64,
    cell: fn(&R, usize) -> Result<Cell, sqlx::Error>,
    classify: impl Fn(sqlx::Error) -> QueryError,
) -> Result<(Option<Vec<String>>, Vec<Vec<Cell>>), QueryError> {
    let mut columns = None;
    let mut out = Vec::new();
    while let Some(row) = rows.try_next().await.map_err(&classify)? {
        if out.len() as u64 >= max_rows {
            return Err(QueryError::TooManyRows(max_rows));
        }
        columns.get_or_insert_with(|| {
            row.columns()
                .iter()
                .map(|c| c.name().to_owned())
                .collect::<Vec<_>>()
        });
        let mut cells = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            cells.push(cell(&row, i).map_err(|e| QueryError::Sql(e.to_string()))?);
        }
        out.push(cells);
    }
    Ok((columns, out))
}

/// Column names of a statement that returned no rows.
async fn describe_columns<'c, E: sqlx::Executor<'c>>(conn: E, sql: &'c str) -> Vec<String> {
    match conn.describe(sql).await {
        Ok(d) => d.columns().iter().map(|c| c.name().to_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A mistake in the query (syntax, an unknown table): bad usage.
    #[error("the query failed: {0}")]
    Sql(String),
    /// The database could not answer (a corrupt file, an I/O error).
    #[error("the database could not run the query: {0}")]
    Failed(String),
    #[error(
        "the query was stopped after {} ms (sql.timeout_ms); add a LIMIT or a narrower WHERE, or raise the limit",
        .0.as_millis()
    )]
    TimedOut(Duration),
    #[error(
        "the query returned more than {0} rows (sql.max_rows); add a LIMIT, or raise the limit"
    )]
    TooManyRows(u64),
}

/// Prints a result in the chosen format.
pub fn render(result: &ResultSet, format: Format) -> String {
    match format {
        Format::Table => render_table(result),
        Format::Csv => render_csv(result),
        Format::Json => render_json(result),
    }
}

fn render_table(result: &ResultSet) -> String {
    let cells: Vec<Vec<String>> = result
        .rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| escape_for_terminal(&c.display()))
                .collect()
        })
        .collect();
    let columns: Vec<String> = result
        .columns
        .iter()
        .map(|c| escape_for_terminal(c))
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.width()).collect();
    for row in &cells {
        for (i, value) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(value.width());
            }
        }
    }
    let pad = |text: &str, width: usize, right: bool| {
        let fill = " ".repeat(width.saturating_sub(text.width()));
        if right {
            format!("{fill}{text}")
        } else {
            format!("{text}{fill}")
        }
    };
    let mut out = String::new();
    let header: Vec<String> = columns
        .iter()
        .zip(&widths)
        .map(|(c, w)| pad(c, *w, false))
        .collect();
    let _ = writeln!(out, "{}", header.join(" | ").trim_end());
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    let _ = writeln!(out, "{}", rule.join("-+-"));
    for (row, raw) in cells.iter().zip(&result.rows) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .zip(raw)
            .map(|((v, w), c)| pad(v, *w, matches!(c, Cell::Integer(_) | Cell::Real(_))))
            .collect();
        let _ = writeln!(out, "{}", line.join(" | ").trim_end());
    }
    let n = result.rows.len();
    let _ = writeln!(out, "({n} row{})", if n == 1 { "" } else { "s" });
    out
}

fn render_csv(result: &ResultSet) -> String {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let _ = writer.write_record(&result.columns);
    for row in &result.rows {
        let fields: Vec<String> = row.iter().map(Cell::exact).collect();
        let _ = writer.write_record(&fields);
    }
    let bytes = writer.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// An array of objects, written by hand so that keys keep the column order (a JSON map
/// type would sort them).
fn render_json(result: &ResultSet) -> String {
    if result.rows.is_empty() {
        return "[]\n".to_owned();
    }
    let keys: Vec<String> = unique_names(&result.columns)
        .iter()
        .map(|k| serde_json::Value::from(k.as_str()).to_string())
        .collect();
    let mut out = String::from("[\n");
    for (r, row) in result.rows.iter().enumerate() {
        out.push_str("  {\n");
        for (i, (key, cell)) in keys.iter().zip(row).enumerate() {
            let comma = if i + 1 < row.len() { "," } else { "" };
            let _ = writeln!(out, "    {key}: {}{comma}", cell.to_json());
        }
        out.push_str(if r + 1 < result.rows.len() {
            "  },\n"
        } else {
            "  }\n"
        });
    }
    out.push_str("]\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pass_the_check() {
        for sql in [
            "SELECT 1",
            "  select * from day_logs;  ",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "VALUES (1)",
            "EXPLAIN QUERY PLAN SELECT * FROM day_logs",
            "SELECT 'a; DROP TABLE users' AS s -- trailing; comment",
            "SELECT 1; -- only a comment after",
        ] {
            assert_eq!(check(sql), Ok(()), "{sql}");
        }
    }

    #[test]
    fn writes_and_tricks_are_refused() {
        assert!(matches!(check("DELETE FROM users"), Err(Refusal::NotARead(w)) if w == "DELETE"));
        assert!(matches!(
            check("update users set x=1"),
            Err(Refusal::NotARead(_))
        ));
        assert!(matches!(
            check("DROP TABLE users"),
            Err(Refusal::NotARead(_))
        ));
        assert!(matches!(
            check("PRAGMA journal_mode=delete"),
            Err(Refusal::NotARead(_))
        ));
        assert_eq!(check("ATTACH 'x.db' AS x"), Err(Refusal::Attach));
        assert_eq!(check("SELECT 1; SELECT 2"), Err(Refusal::SeveralStatements));
        assert_eq!(
            check("SELECT 1;DELETE FROM users"),
            Err(Refusal::SeveralStatements)
        );
        assert_eq!(check("  -- nothing\n"), Err(Refusal::Empty));
        assert_eq!(check(""), Err(Refusal::Empty));
    }

    #[test]
    fn table_aligns_unicode_and_shows_null() {
        let result = ResultSet {
            columns: vec!["name".into(), "n".into()],
            rows: vec![
                vec![Cell::Text("день".into()), Cell::Integer(5)],
                vec![Cell::Null, Cell::Integer(12)],
            ],
        };
        let text = render(&result, Format::Table);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "name | n");
        assert_eq!(lines[2], "день |  5");
        assert_eq!(lines[3], "NULL | 12");
        assert_eq!(lines[4], "(2 rows)");
    }

    #[test]
    fn the_table_never_prints_control_characters_raw() {
        let hostile = "\u{1b}[31mred\u{1b}]0;title\u{7}\u{7f}\u{9b}2J\u{202e}txt\nnext\ttab";
        let result = ResultSet {
            columns: vec!["\u{1b}[1mcol".into()],
            rows: vec![vec![Cell::Text(hostile.into())]],
        };
        let text = render(&result, Format::Table);
        assert!(
            !text.chars().any(|c| c != '\n' && needs_escape(c)),
            "raw control character in {text:?}"
        );
        assert_eq!(text.lines().count(), 4, "one line per row: {text}");
        assert!(text.starts_with("\\x1b[1mcol"), "{text}");
        assert!(
            text.contains(
                "\\x1b[31mred\\x1b]0;title\\x07\\x7f\\u{009b}2J\\u{202e}txt\\nnext\\ttab"
            ),
            "{text}"
        );
        // Plain text, Cyrillic included, is left alone.
        assert_eq!(escape_for_terminal("день, ok"), "день, ok");
    }

    #[test]
    fn csv_and_json_stay_exact_and_blobs_are_hex() {
        let result = ResultSet {
            columns: vec!["t".into(), "b".into()],
            rows: vec![vec![
                Cell::Text("\u{1b}[31m".into()),
                Cell::Blob(vec![0x00, 0xff, 0x10]),
            ]],
        };
        assert_eq!(render(&result, Format::Csv), "t,b\n\u{1b}[31m,00ff10\n");
        let json: serde_json::Value =
            serde_json::from_str(&render(&result, Format::Json)).expect("valid json");
        assert_eq!(
            json,
            serde_json::json!([{"t": "\u{1b}[31m", "b": "00ff10"}])
        );
    }

    #[test]
    fn json_keeps_column_order_and_suffixes_repeated_names() {
        let result = ResultSet {
            columns: vec!["z".into(), "x".into(), "x".into(), "a".into(), "x".into()],
            rows: vec![vec![
                Cell::Integer(1),
                Cell::Integer(2),
                Cell::Integer(3),
                Cell::Integer(4),
                Cell::Integer(5),
            ]],
        };
        let text = render(&result, Format::Json);
        let keys: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix('"')?.split('"').next())
            .collect();
        assert_eq!(keys, ["z", "x", "x_2", "a", "x_3"], "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).expect("valid json");
        assert_eq!(json[0]["x_3"], 5);
        // A suffix never takes the name of a real column.
        assert_eq!(
            unique_names(&["x".into(), "x".into(), "x_2".into()]),
            ["x", "x_3", "x_2"]
        );
        assert_eq!(render(&ResultSet::default(), Format::Json), "[]\n");
    }

    fn limits(timeout_ms: u64, max_rows: u64) -> Limits {
        Limits {
            timeout: Duration::from_millis(timeout_ms),
            max_rows,
        }
    }

    #[tokio::test]
    async fn more_rows_than_max_rows_are_refused_not_held_in_memory() {
        let pool = memory_pool().await;
        let endless_rows =
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c";
        let error = query(&pool, endless_rows, &limits(30_000, 1000))
            .await
            .expect_err("refused");
        assert!(matches!(error, QueryError::TooManyRows(1000)), "{error:?}");
        let exactly = query(
            &pool,
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000) SELECT x FROM c",
            &limits(30_000, 1000),
        )
        .await
        .expect("1000 rows are allowed");
        assert_eq!(exactly.rows.len(), 1000);
        assert_eq!(exactly.columns, ["x"]);
    }

    async fn memory_pool() -> SqlitePool {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .expect("in-memory database")
    }

    #[tokio::test]
    async fn a_runaway_query_is_stopped_after_the_timeout() {
        let pool = memory_pool().await;
        let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
        let error = query(&pool, endless, &limits(50, 10))
            .await
            .expect_err("interrupted");
        assert!(matches!(error, QueryError::TimedOut(_)), "{error:?}");
        assert!(error.to_string().contains("sql.timeout_ms"), "{error}");
        // The same connection still answers a query that finishes.
        let ok = query(&pool, "SELECT 1 AS one", &limits(30_000, 10))
            .await
            .expect("a quick query");
        assert_eq!(ok.rows, vec![vec![Cell::Integer(1)]]);
    }

    #[tokio::test]
    async fn a_mistake_in_the_query_is_not_a_database_failure() {
        let pool = memory_pool().await;
        let error = query(&pool, "SELECT * FROM no_such_table", &limits(5000, 10))
            .await
            .expect_err("fails");
        assert!(matches!(error, QueryError::Sql(_)), "{error:?}");
    }

    #[test]
    fn csv_and_json_formats() {
        let result = ResultSet {
            columns: vec!["a".into(), "b".into()],
            rows: vec![vec![Cell::Text("x,y".into()), Cell::Null]],
        };
        assert_eq!(render(&result, Format::Csv), "a,b\n\"x,y\",\n");
        let json: serde_json::Value =
            serde_json::from_str(&render(&result, Format::Json)).expect("valid json");
        assert_eq!(json, serde_json::json!([{"a": "x,y", "b": null}]));
    }
}
