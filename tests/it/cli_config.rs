//! The `daylog` binary against a careless operator: values that used to panic the store,
//! database URLs that silently meant a temporary database, a percent-encoded path, a
//! malformed `.env`, a migration edited after it ran, and `daylog sql` on hostile
//! entries, a runaway query and a corrupt file.

// Helpers here panic on a broken fixture by design.
#![expect(clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs `daylog` in `dir` with a clean environment (no real keys, no .env unless the
/// test writes one).
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_daylog"));
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("daylog runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const EVERY_COMMAND: [&[&str]; 5] = [
    &["migrate"],
    &["sql", "SELECT 1"],
    &["doctor"],
    &["chat"],
    &["run"],
];

/// `DAYLOG__JOURNAL__DAY_STARTS_HOUR=04`, as the README writes the hour: TOML takes no
/// leading zero, and the sentence says that, not "too large a number".
#[test]
fn a_number_with_a_leading_zero_is_told_so() {
    let dir = tempfile::tempdir().expect("dir");
    let out = run(
        dir.path(),
        &["migrate"],
        &[("DAYLOG__JOURNAL__DAY_STARTS_HOUR", "04")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("journal.day_starts_hour"), "{err}");
    assert!(err.contains("leading zero"), "{err}");
}

/// A database file SQLite cannot open (here a folder stands where the file should be;
/// in real life a Docker volume owned by root): the sentence names DATABASE_URL, the
/// absolute path, and what to check.
#[test]
fn a_database_that_cannot_be_opened_is_named_with_what_to_check() {
    let dir = tempfile::tempdir().expect("dir");
    let in_the_way = dir.path().join("data/daylog.db");
    std::fs::create_dir_all(&in_the_way).expect("a folder in the file's place");
    let out = run(
        dir.path(),
        &["migrate"],
        &[("DATABASE_URL", "sqlite://data/daylog.db")],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("DATABASE_URL"), "{err}");
    let absolute = std::fs::canonicalize(dir.path())
        .expect("dir")
        .join("data/daylog.db");
    assert!(
        err.contains(&absolute.display().to_string())
            || err.contains(&in_the_way.display().to_string()),
        "{err}"
    );
    assert!(err.contains("can write"), "{err}");
}

/// A variable that is not Unicode (some other program's) is no reason to panic.
#[cfg(unix)]
#[test]
fn a_non_unicode_variable_in_the_environment_is_no_panic() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempfile::tempdir().expect("dir");
    let out = Command::new(env!("CARGO_BIN_EXE_daylog"))
        .args(["migrate"])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SOME_OTHER_TOOL", std::ffi::OsStr::from_bytes(b"caf\xe9"))
        .output()
        .expect("daylog runs");
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_busy_timeout_sqlite_cannot_take_is_a_config_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("dir");
    for value in ["3000000000", "99999999999999999999"] {
        let out = run(
            dir.path(),
            &["migrate"],
            &[("DAYLOG__STORE__BUSY_TIMEOUT_MS", value)],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(err.contains("store.busy_timeout_ms"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn an_empty_or_in_memory_database_url_is_refused_by_every_command() {
    let dir = tempfile::tempdir().expect("dir");
    for url in [
        "sqlite://",
        "sqlite:",
        "sqlite::memory:",
        "sqlite://x.db?mode=memory",
        // SQLite URIs and VFSs that keep the database in memory just as well.
        "sqlite://file::memory:?cache=shared",
        "sqlite://file:x.db%3Fmode=memory",
        "sqlite://x.db?vfs=memdb",
    ] {
        refused_by_every_command(dir.path(), url, "DATABASE_URL");
    }
}

/// Every command, run in `dir` with `DATABASE_URL=url`, exits 2 with a sentence that
/// names `DATABASE_URL` and says `says`, and saves nothing.
fn refused_by_every_command(dir: &Path, url: &str, says: &str) {
    for args in EVERY_COMMAND {
        let out = run(
            dir,
            args,
            &[("DATABASE_URL", url), ("TELOXIDE_TOKEN", "123:abc")],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{url} {args:?}: {err}");
        assert!(err.contains("DATABASE_URL"), "{url} {args:?}: {err}");
        assert!(err.contains(says), "{url} {args:?}: {err}");
        assert!(!stdout(&out).contains("Saved"), "{url} {args:?}");
    }
}

/// `~` is a shell's: left to SQLite it makes a folder named `~` in the working one.
#[test]
fn a_database_url_under_tilde_is_refused_by_every_command() {
    let dir = tempfile::tempdir().expect("dir");
    for url in [
        "sqlite://~/daylog.db",
        "sqlite://%7e/daylog.db",
        "sqlite:~/x/d.db",
    ] {
        refused_by_every_command(dir.path(), url, "write the full path");
    }
    assert!(!dir.path().join("~").exists());
}

#[test]
fn a_read_only_database_url_is_refused_by_every_command() {
    let dir = tempfile::tempdir().expect("dir");
    assert!(run(dir.path(), &["migrate"], &[]).status.success());
    for url in [
        "sqlite://data/daylog.db?mode=ro",
        "sqlite://data/daylog.db?immutable=1",
    ] {
        refused_by_every_command(dir.path(), url, "read-only");
    }
}

#[test]
fn a_percent_encoded_database_path_means_the_same_file_for_every_command() {
    let dir = tempfile::tempdir().expect("dir");
    let env = [("DATABASE_URL", "sqlite://my%20data/day%23log.db")];
    let migrate = run(dir.path(), &["migrate"], &env);
    assert!(migrate.status.success(), "{}", stderr(&migrate));
    assert!(dir.path().join("my data/day#log.db").exists());
    assert!(!dir.path().join("my%20data").exists());

    let sql = run(
        dir.path(),
        &["sql", "SELECT count(*) AS n FROM day_logs"],
        &env,
    );
    assert!(sql.status.success(), "{}", stderr(&sql));
    assert!(stdout(&sql).contains("(1 row)"), "{}", stdout(&sql));

    let doctor = run(dir.path(), &["doctor"], &env);
    assert!(
        stdout(&doctor).contains("ok   database reachable and migrated"),
        "{}",
        stdout(&doctor)
    );
}

#[test]
fn a_malformed_env_line_is_skipped_with_its_number_and_the_rest_still_loads() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join(".env"),
        "# settings\nMISTRAL_API_KEY=sk-first\nthis line has sk-secret-in-it\nDATABASE_URL=sqlite://after-the-bad-line/daylog.db\n",
    )
    .expect(".env");
    let out = run(dir.path(), &["migrate"], &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        dir.path().join("after-the-bad-line/daylog.db").exists(),
        "the line after the malformed one was loaded"
    );
    assert!(err.contains("line 3"), "the warning names the line: {err}");
    assert!(
        !err.contains("sk-secret"),
        "never the line's content: {err}"
    );
}

/// A line that sets one of daylog's own variables and cannot be read (a value with a
/// space, unquoted) stops daylog with a sentence naming the variable, never its value:
/// skipped, `allowed_users` would fall back to everyone, a key to none.
#[test]
fn an_unreadable_line_setting_a_daylog_variable_stops_it_by_name() {
    for (line, name) in [
        (
            "DAYLOG__TELEGRAM__ALLOWED_USERS=[111, 222]",
            "DAYLOG__TELEGRAM__ALLOWED_USERS",
        ),
        (
            "MISTRAL_API_KEY=sk-secret-1, sk-secret-2",
            "MISTRAL_API_KEY",
        ),
        (
            "GEMINI_API_KEY_2=sk-secret-3 sk-secret-4",
            "GEMINI_API_KEY_2",
        ),
        ("export TELOXIDE_TOKEN=123:secret token", "TELOXIDE_TOKEN"),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join(".env"), format!("{line}\n")).expect(".env");
        let out = run(dir.path(), &["migrate"], &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{line}: {err}");
        assert!(err.contains(&format!("line 1 ({name})")), "{err}");
        assert!(err.contains("must be in quotes"), "{err}");
        assert!(
            !err.contains("secret") && !err.contains("222"),
            "never the value: {err}"
        );
        assert!(
            !dir.path().join("data").exists(),
            "nothing was started: {line}"
        );
    }
    // Quoted, the same value loads.
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join(".env"),
        "DAYLOG__TELEGRAM__ALLOWED_USERS=\"[111, 222]\"\n",
    )
    .expect(".env");
    let out = run(dir.path(), &["doctor"], &[]);
    assert!(
        !stderr(&out).contains("could not be read"),
        "{}",
        stderr(&out)
    );
}

/// An empty variable in the real environment (a compose file's `MISTRAL_API_KEY=`) wins
/// over `.env`, as dotenvy's rule has it; that is said, by name, never by value.
#[test]
fn an_empty_variable_that_hides_a_dotenv_value_is_named() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join(".env"),
        "MISTRAL_API_KEY=sk-from-dotenv\nGROQ_API_KEY=\n",
    )
    .expect(".env");

    let out = run(
        dir.path(),
        &["doctor"],
        &[("MISTRAL_API_KEY", ""), ("GROQ_API_KEY", "")],
    );

    let said = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
    assert!(
        said.contains(
            "MISTRAL_API_KEY is set but empty in the environment, which wins over its value in"
        ),
        "{said}"
    );
    assert!(!said.contains("GROQ_API_KEY is set but empty"), "{said}");
    assert!(!said.contains("sk-from-dotenv"), "{said}");
}

/// `daylog run` without a token names the `.env` it looked for (the working folder's):
/// run from another folder, that is the reason.
#[test]
fn a_missing_token_names_the_env_file_looked_for() {
    let dir = tempfile::tempdir().expect("dir");
    let out = run(dir.path(), &["run"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let looked_for = std::fs::canonicalize(dir.path()).expect("dir").join(".env");
    assert!(
        err.contains(&looked_for.display().to_string())
            || err.contains(&dir.path().join(".env").display().to_string()),
        "{err}"
    );
}

#[test]
fn env_lines_after_an_unreadable_one_still_load() {
    // An unterminated quote (dotenvy would take the rest of the file as its value) and
    // a substitution that never closes: each is skipped, named, and the next line loads.
    for bad in ["KEY=\"no closing quote", "KEY=${NEVER_CLOSED"] {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(
            dir.path().join(".env"),
            format!("MISTRAL_API_KEY=sk-first\n{bad}\nDATABASE_URL=sqlite://after/daylog.db\n"),
        )
        .expect(".env");
        let out = run(dir.path(), &["migrate"], &[]);
        let err = stderr(&out);
        assert!(out.status.success(), "{bad}: {err}");
        assert!(
            dir.path().join("after/daylog.db").exists(),
            "{bad}: the line after it was loaded; {err}"
        );
        assert!(
            err.contains("line 2"),
            "{bad}: the warning names the line: {err}"
        );
    }
}

#[test]
fn doctor_fails_when_an_applied_migration_was_changed_since_or_failed_part_way() {
    for (tamper, expected) in [
        (
            "UPDATE _sqlx_migrations SET checksum = x'00'
             WHERE version = (SELECT min(version) FROM _sqlx_migrations)",
            "FAIL database: migration",
        ),
        (
            "UPDATE _sqlx_migrations SET success = 0
             WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
            "partially applied",
        ),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        let url = format!("sqlite://{}/daylog.db", dir.path().display());
        let env = [("DATABASE_URL", url.as_str())];
        assert!(run(dir.path(), &["migrate"], &env).status.success());
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let pool = sqlx::SqlitePool::connect(&url).await.expect("connect");
            sqlx::query(tamper).execute(&pool).await.expect("tamper");
            pool.close().await;
        });
        // What the daemon does with such a database…
        let migrate = run(dir.path(), &["migrate"], &env);
        assert_eq!(migrate.status.code(), Some(1), "{}", stderr(&migrate));
        // …and doctor must say so rather than "migrated".
        let doctor = run(dir.path(), &["doctor"], &env);
        let out = stdout(&doctor);
        assert_eq!(doctor.status.code(), Some(1), "{out}");
        assert!(!out.contains("migrated\n"), "{out}");
        assert!(out.contains(expected), "{out}");
    }
}

#[test]
fn doctor_fails_on_a_damaged_database_file() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("daylog.db");
    let url = format!("sqlite://{}", file.display());
    let env = [("DATABASE_URL", url.as_str())];
    assert!(run(dir.path(), &["migrate"], &env).status.success());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let pool = sqlx::SqlitePool::connect(&url).await.expect("connect");
        sqlx::query("INSERT INTO users (user_id, chat_id) VALUES (1, 1)")
            .execute(&pool)
            .await
            .expect("user");
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
             INSERT INTO day_logs (user_id, chat_id, message_id, text)
             SELECT 1, 1, i, printf('%.500c', 'x') FROM n",
        )
        .execute(&pool)
        .await
        .expect("logs");
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&pool)
            .await
            .expect("checkpoint");
        pool.close().await;
    });
    // A page in the middle of the entries goes bad (a disk error, a bad copy); the
    // schema and the migrations table at the start of the file stay readable.
    let mut bytes = std::fs::read(&file).expect("read");
    let middle = bytes.len() / 2 / 4096 * 4096;
    for (i, byte) in bytes[middle..middle + 4096].iter_mut().enumerate() {
        *byte = (i * 7919 % 251) as u8;
    }
    std::fs::write(&file, bytes).expect("write");

    let doctor = run(dir.path(), &["doctor"], &env);
    let out = stdout(&doctor);
    assert_eq!(doctor.status.code(), Some(1), "{out}");
    assert!(out.contains("FAIL database"), "{out}");
    assert!(!out.contains("migrated\n"), "{out}");
}

#[test]
fn sql_shows_hostile_entries_escaped_and_stops_a_runaway_query() {
    let dir = tempfile::tempdir().expect("dir");
    assert!(run(dir.path(), &["migrate"], &[]).status.success());

    let table = run(
        dir.path(),
        &[
            "sql",
            "SELECT 'ok' || char(27) || ']0;pwned' || char(7) || char(155) AS t",
        ],
        &[],
    );
    assert!(table.status.success(), "{}", stderr(&table));
    let out = stdout(&table);
    assert!(
        !out.chars().any(|c| c != '\n' && c.is_control()),
        "a control character reached the terminal: {out:?}"
    );
    assert!(out.contains("ok\\x1b]0;pwned\\x07\\u{009b}"), "{out}");

    let runaway = run(
        dir.path(),
        &[
            "sql",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        ],
        &[("DAYLOG__SQL__TIMEOUT_MS", "200")],
    );
    assert_eq!(runaway.status.code(), Some(1), "{}", stderr(&runaway));
    assert!(
        stderr(&runaway).contains("sql.timeout_ms"),
        "{}",
        stderr(&runaway)
    );
}

#[test]
fn sql_on_a_corrupt_database_file_is_a_failure_not_bad_usage() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir(dir.path().join("data")).expect("data dir");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(dir.path().join("data/daylog.db"), garbage).expect("garbage");
    let out = run(dir.path(), &["sql", "SELECT count(*) FROM day_logs"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not a database"), "{err}");
    // A mistake in the query itself stays bad usage.
    let dir = tempfile::tempdir().expect("dir");
    assert!(run(dir.path(), &["migrate"], &[]).status.success());
    let typo = run(dir.path(), &["sql", "SELECT * FROM day_log"], &[]);
    assert_eq!(typo.status.code(), Some(2), "{}", stderr(&typo));
}

#[test]
fn chat_names_a_malformed_env_line_on_its_terminal() {
    // `RUST_LOG=` left blank, as `.env.example` leaves its variables: chat logs only
    // errors, and the warning about the `.env` is still said on its terminal.
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join(".env"),
        "MISTRAL_API_KEY=sk-first\nthis line has sk-secret-in-it\nDATABASE_URL=sqlite://db/daylog.db\n",
    )
    .expect(".env");
    let out = run(dir.path(), &["chat"], &[("RUST_LOG", "")]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("line 2"), "the warning names the line: {err}");
    assert!(
        !err.contains("sk-secret"),
        "never the line's content: {err}"
    );
    assert!(
        !err.contains("INFO"),
        "a blank RUST_LOG is chat's default: {err}"
    );
}
