//! `daylog sql`: one read-only statement against the store, printed as a table, CSV or
//! JSON.
//!
//! Three fences keep it read-only: a statement check here (one statement, starting with
//! SELECT / WITH / VALUES / EXPLAIN, no ATTACH), the file opened with `mode=ro`, and the
//! connection under `PRAGMA query_only`. The check gives the clear sentence; SQLite's own
//! read-only modes are what make it hold.

use std::fmt::Write as _;

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Column, Row, TypeInfo, ValueRef};
use unicode_width::UnicodeWidthStr;

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
            Cell::Blob(b) => b
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
                .into(),
        }
    }
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

/// Runs one checked statement on a read-only pool.
pub async fn query(pool: &SqlitePool, sql: &str) -> Result<ResultSet, QueryError> {
    check(sql)?;
    let rows = sqlx::query(sql).fetch_all(pool).await.map_err(|e| {
        let message = e.as_database_error().map(|d| d.message().to_owned());
        match message {
            Some(m)
                if m.contains("readonly")
                    || m.contains("read-only")
                    || m.contains("query_only") =>
            {
                QueryError::Refused(Refusal::WriteRefused(m))
            }
            Some(m) => QueryError::Sql(m),
            None => QueryError::Sql(e.to_string()),
        }
    })?;
    let columns = match rows.first() {
        Some(row) => row.columns().iter().map(|c| c.name().to_owned()).collect(),
        None => describe_columns(pool, sql).await,
    };
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let mut cells = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            cells.push(cell(row, i).map_err(|e| QueryError::Sql(e.to_string()))?);
        }
        out.push(cells);
    }
    Ok(ResultSet { columns, rows: out })
}

/// Column names of a statement that returned no rows.
async fn describe_columns(pool: &SqlitePool, sql: &str) -> Vec<String> {
    use sqlx::Executor;
    match pool.describe(sql).await {
        Ok(d) => d.columns().iter().map(|c| c.name().to_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("the query failed: {0}")]
    Sql(String),
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
                .map(|c| c.display().replace(['\n', '\r'], " "))
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = result.columns.iter().map(|c| c.width()).collect();
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
    let header: Vec<String> = result
        .columns
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
        let fields: Vec<String> = row
            .iter()
            .map(|c| match c {
                Cell::Null => String::new(),
                other => other.display(),
            })
            .collect();
        let _ = writer.write_record(&fields);
    }
    let bytes = writer.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn render_json(result: &ResultSet) -> String {
    let rows: Vec<serde_json::Value> = result
        .rows
        .iter()
        .map(|row| {
            let object: serde_json::Map<String, serde_json::Value> = result
                .columns
                .iter()
                .cloned()
                .zip(row.iter().map(Cell::to_json))
                .collect();
            serde_json::Value::Object(object)
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".to_owned());
    text.push('\n');
    text
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
