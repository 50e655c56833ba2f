//! The `daylog` binary as a user runs it: exit codes, one-sentence errors, `daylog sql`
//! staying read-only.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Workdir {
    dir: tempfile::TempDir,
}

impl Workdir {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn db_path(&self) -> PathBuf {
        self.dir.path().join("data/daylog.db")
    }

    /// Runs `daylog` in the temp dir with a clean environment (no real keys, no .env).
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_daylog"));
        cmd.args(args)
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("daylog runs")
    }

    /// [`Workdir::run`] on a blocking thread, for tests whose fake servers run on the
    /// test's own runtime; the folder goes with it.
    async fn run_beside(self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            self.run(&args, &env)
        })
        .await
        .expect("join")
    }

    fn sql(&self, query: &str) -> Output {
        self.run(&["sql", query], &[])
    }

    /// `daylog chat --user USER` with `input` typed in, until it ends at the end of input.
    fn chat(&self, user: &str, input: &[u8]) -> Output {
        self.chat_with(user, input, &[])
    }

    /// [`Workdir::chat`] with more variables in its environment.
    fn chat_with(&self, user: &str, input: &[u8], env: &[(&str, &str)]) -> Output {
        use std::io::Write as _;
        let mut child = Command::new(env!("CARGO_BIN_EXE_daylog"))
            .args(["chat", "--user", user])
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("daylog chat starts");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write");
        child.wait_with_output().expect("chat ends")
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The log of a daemon that writes to a file, journald or `docker logs` is plain text:
/// no terminal colour codes when stderr is not a terminal.
#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let w = Workdir::new();
    let migrate = w.run(&["migrate"], &[]);
    let log = stderr(&migrate);
    assert!(log.contains("database is up to date"), "{log}");
    assert!(!log.contains('\u{1b}'), "{log:?}");
}

#[test]
fn migrate_then_sql_lists_the_public_tables() {
    let w = Workdir::new();
    let migrate = w.run(&["migrate"], &[]);
    assert!(migrate.status.success(), "{}", stderr(&migrate));
    let out = w.sql("SELECT name FROM sqlite_master WHERE type IN ('table','view') ORDER BY name");
    assert!(out.status.success(), "{}", stderr(&out));
    let names: Vec<String> = stdout(&out)
        .lines()
        .skip(2)
        .filter(|l| !l.starts_with('('))
        .map(|l| l.trim().to_owned())
        // FTS5's own shadow tables behind day_logs_fts, not part of the interface.
        .filter(|name| !name.starts_with("day_logs_fts_"))
        .collect();
    assert_eq!(
        names,
        [
            "_sqlx_migrations",
            "daily_metrics",
            "day_activities",
            "day_logs",
            "day_logs_fts",
            "day_logs_search",
            "digests",
            "erasures",
            "llm_budgets",
            "llm_calls",
            "llm_refusals",
            "reminders",
            "said_once",
            "updates",
            "users"
        ]
    );
    assert!(w.db_path().exists());
}

#[test]
fn the_terminal_answers_tz_remind_and_streak() {
    let w = Workdir::new();
    let out = w.chat(
        "5",
        b"/tz moscow\n/remind 21:30\n/remind\n/tz nowhere\n/streak\n",
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("Time zone set: Europe/Moscow"), "{text}");
    assert!(text.contains("I will remind you at 21:30"), "{text}");
    assert!(
        text.contains("Daily reminder at 21:30 your time (Europe/Moscow)"),
        "{text}"
    );
    assert!(text.contains("Examples: /tz Europe/Moscow"), "{text}");
    assert!(text.contains("No streak yet"), "{text}");
}

/// A person backs up by copying `daylog.db`: after a clean exit that one file holds
/// every entry, with nothing left behind in the `-wal` file beside it.
#[test]
fn after_a_clean_exit_a_copy_of_the_database_file_alone_holds_every_entry() {
    let w = Workdir::new();
    let out = w.chat("5", b"A long walk by the river.\nA quiet evening.\n");
    assert!(out.status.success(), "{}", stderr(&out));

    let copy = Workdir::new();
    std::fs::create_dir_all(copy.db_path().parent().expect("folder")).expect("folder");
    std::fs::copy(w.db_path(), copy.db_path()).expect("copy the file alone");
    let count = copy.run(
        &[
            "sql",
            "SELECT count(*) AS n FROM day_logs",
            "--format",
            "csv",
        ],
        &[],
    );

    assert!(count.status.success(), "{}", stderr(&count));
    assert_eq!(stdout(&count).trim(), "n\n2");
    let wal = w.dir.path().join("data/daylog.db-wal");
    assert!(
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "the WAL still holds pages"
    );
}

/// `daylog backup` while the bot runs: the copy holds what was saved a moment ago
/// (still in the WAL), it is one file, and an existing file is never overwritten.
#[test]
fn a_backup_taken_while_the_bot_runs_holds_the_last_entry() {
    use std::io::{BufRead as _, Write as _};
    let w = Workdir::new();
    let mut chat = Command::new(env!("CARGO_BIN_EXE_daylog"))
        .args(["chat", "--user", "5"])
        .current_dir(w.dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("daylog chat starts");
    let mut typed = chat.stdin.take().expect("stdin");
    typed
        .write_all(b"A long walk by the river.\n")
        .expect("write");
    typed.flush().expect("flush");
    let mut replies = std::io::BufReader::new(chat.stdout.take().expect("stdout"));
    let mut reply = String::new();
    while !reply.contains("Saved") {
        reply.clear();
        assert_ne!(
            replies.read_line(&mut reply).expect("read"),
            0,
            "chat ended"
        );
    }

    let missing_folder = w.run(&["backup", "backups/copy.db"], &[]);
    std::fs::create_dir(w.dir.path().join("backups")).expect("folder");
    let taken = w.run(&["backup", "backups/copy.db"], &[]);
    let again = w.run(&["backup", "backups/copy.db"], &[]);
    drop(typed);
    assert!(chat.wait().expect("chat ends").success());

    assert_eq!(missing_folder.status.code(), Some(2));
    assert!(
        stderr(&missing_folder).contains("the folder backups does not exist"),
        "{}",
        stderr(&missing_folder)
    );
    assert!(taken.status.success(), "{}", stderr(&taken));
    assert!(
        stdout(&taken).starts_with("backed up 1 entry to backups/copy.db"),
        "{}",
        stdout(&taken)
    );
    let copy = w.dir.path().join("backups/copy.db");
    assert!(!w.dir.path().join("backups/copy.db-wal").exists());
    let count = w.run(
        &["sql", "SELECT text FROM day_logs", "--format", "csv"],
        &[("DATABASE_URL", &format!("sqlite://{}", copy.display()))],
    );
    assert_eq!(stdout(&count).trim(), "text\nA long walk by the river.");
    assert_eq!(again.status.code(), Some(2));
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );
}

/// A copy that cannot be read back as a journal (here: the file behind DATABASE_URL is
/// another program's empty database) is not left behind half-made: the failure names
/// the backup, and trying again is not refused as "already exists".
#[test]
fn a_backup_that_fails_its_check_leaves_no_file() {
    let w = Workdir::new();
    std::fs::create_dir_all(w.db_path().parent().expect("folder")).expect("folder");
    std::fs::write(w.db_path(), b"").expect("an empty database");

    let out = w.run(&["backup", "copy.db"], &[]);

    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the backup copy.db could not be made"),
        "{}",
        stderr(&out)
    );
    assert!(!w.dir.path().join("copy.db").exists());
    let uri = w.run(&["backup", "file:copy.db"], &[]);
    assert_eq!(uri.status.code(), Some(2));
    assert!(
        stderr(&uri).contains("write ./file:copy.db"),
        "{}",
        stderr(&uri)
    );
}

#[test]
fn sql_refuses_writes_and_changes_nothing() {
    let w = Workdir::new();
    assert!(w.run(&["migrate"], &[]).status.success());
    let before = std::fs::read(w.db_path()).expect("db bytes");
    for query in [
        "DELETE FROM users",
        "UPDATE users SET language = 'ru'",
        "DROP TABLE day_logs",
        "ATTACH DATABASE 'other.db' AS other",
        "PRAGMA journal_mode=delete",
        "SELECT 1; DELETE FROM users",
        "WITH x AS (SELECT 1) DELETE FROM users",
        "INSERT INTO users (user_id, chat_id) VALUES (1, 1)",
    ] {
        let out = w.sql(query);
        assert_eq!(out.status.code(), Some(2), "{query}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "one sentence for {query}: {err}");
        assert!(err.starts_with("daylog: "), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!w.dir.path().join("other.db").exists());
    let tables = w.sql("SELECT count(*) AS n FROM sqlite_master WHERE name = 'day_logs'");
    assert_eq!(
        stdout(&tables).lines().nth(2),
        Some("1"),
        "{}",
        stdout(&tables)
    );
    let after = std::fs::read(w.db_path()).expect("db bytes");
    assert_eq!(before, after, "the database file is unchanged");
}

#[test]
fn sql_formats() {
    let w = Workdir::new();
    assert!(w.run(&["migrate"], &[]).status.success());
    let csv = w.run(
        &[
            "sql",
            "SELECT 1 AS a, NULL AS b, 'x' AS c",
            "--format",
            "csv",
        ],
        &[],
    );
    assert_eq!(stdout(&csv), "a,b,c\n1,,x\n");
    let json = w.run(
        &["sql", "SELECT 1 AS a, NULL AS b", "--format", "json"],
        &[],
    );
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("json");
    assert_eq!(value, serde_json::json!([{"a": 1, "b": null}]));
    let table = w.sql("SELECT NULL AS empty_value");
    assert!(stdout(&table).contains("NULL"));
}

#[test]
fn sql_on_a_missing_database_does_not_create_it() {
    let w = Workdir::new();
    let out = w.sql("SELECT 1");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    assert!(!w.db_path().exists());
}

/// A file that is not daylog's database (an empty file, another program's) answers a
/// query about daylog's tables with where to look, not only "no such table"; a query
/// that names a missing table in daylog's own database is just a wrong query.
#[test]
fn sql_on_a_file_without_daylogs_tables_says_to_check_the_url() {
    let w = Workdir::new();
    std::fs::create_dir_all(w.db_path().parent().expect("folder")).expect("folder");
    std::fs::write(w.db_path(), b"").expect("an empty file");

    let foreign = w.sql("SELECT count(*) FROM day_logs");
    assert!(w.run(&["migrate"], &[]).status.success());
    let typo = w.sql("SELECT count(*) FROM day_log");

    assert_eq!(foreign.status.code(), Some(2));
    assert!(
        stderr(&foreign).contains("none of daylog's tables: check DATABASE_URL"),
        "{}",
        stderr(&foreign)
    );
    assert_eq!(typo.status.code(), Some(2));
    assert!(
        stderr(&typo).contains("no such table: day_log"),
        "{}",
        stderr(&typo)
    );
    assert!(!stderr(&typo).contains("DATABASE_URL"), "{}", stderr(&typo));
}

#[test]
fn bad_config_exits_2_naming_the_key() {
    let w = Workdir::new();
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("DAYLOG__RETRY__MAX_ATTEMPTS", "0")],
            "retry.max_attempts",
        ),
        (&[("DAYLOG__RETRY__MAX_ATEMPTS", "2")], "max_atempts"),
        (
            &[("DAYLOG__PROVIDERS__GROQ__KIND", "cohere")],
            "providers.groq.kind",
        ),
        (&[("DATABASE_URL", "mysql://db/daylog")], "DATABASE_URL"),
        (&[("DATABASE_URL", "postgres://db")], "DATABASE_URL"),
    ];
    for (env, key) in cases {
        let out = w.run(&["migrate"], env);
        assert_eq!(out.status.code(), Some(2), "{env:?}");
        let err = stderr(&out);
        assert!(err.contains(key), "{key} in {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn malformed_config_file_exits_2() {
    let w = Workdir::new();
    let file = w.dir.path().join("bad.toml");
    std::fs::write(&file, "[retry\nmax_attempts = ").expect("write");
    let out = w.run(
        &["migrate"],
        &[("DAYLOG_CONFIG", file.to_str().expect("utf-8"))],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not valid TOML"), "{}", stderr(&out));
}

#[test]
fn an_unwritable_database_path_is_one_sentence() {
    let w = Workdir::new();
    let blocker = w.dir.path().join("file");
    std::fs::write(&blocker, "not a folder").expect("write");
    let url = format!("sqlite://{}/daylog.db", blocker.display());
    let out = w.run(&["migrate"], &[("DATABASE_URL", &url)]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("cannot create the database folder"), "{err}");
    assert!(!err.contains("panicked"));

    // The daemon's start-up error carries the same cause: said once, not once per layer.
    let run = w.run(
        &["run"],
        &[("DATABASE_URL", &url), ("TELOXIDE_TOKEN", "1:token")],
    );
    let err = stderr(&run);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("os error").count(), 1, "{err}");
}

#[test]
fn a_database_from_a_newer_daylog_is_refused() {
    let w = Workdir::new();
    assert!(w.run(&["migrate"], &[]).status.success());
    let url = format!("sqlite://{}", w.db_path().display());
    // Pretend a future daylog applied migration 99990101000000.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let pool = sqlx::SqlitePool::connect(&url).await.expect("connect");
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (99990101000000, 'future', 1, x'00', 0)",
        )
        .execute(&pool)
        .await
        .expect("insert");
        pool.close().await;
    });
    let out = w.run(&["migrate"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("newer daylog"), "{}", stderr(&out));
}

#[test]
fn keys_never_reach_output_or_logs() {
    let w = Workdir::new();
    let out = w.run(
        &["doctor"],
        &[
            ("RUST_LOG", "trace"),
            ("MISTRAL_API_KEY", "sk-secret-mistral-1,sk-secret-mistral-2"),
            ("GEMINI_API_KEY_2", "secret-gemini-never-read"),
            ("TELOXIDE_TOKEN", "123:secret-telegram"),
        ],
    );
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(all.contains("provider mistral: 2 keys"), "{all}");
    for secret in ["sk-secret-mistral", "secret-telegram", "secret-gemini"] {
        assert!(!all.contains(secret), "{secret} leaked: {all}");
    }
}

#[test]
fn doctor_reports_a_healthy_setup() {
    let w = Workdir::new();
    assert!(w.run(&["migrate"], &[]).status.success());
    let out = w.run(
        &["doctor"],
        &[("MISTRAL_API_KEY", "k"), ("TELOXIDE_TOKEN", "1:t")],
    );
    let text = stdout(&out);
    assert!(
        text.contains("ok   database reachable and migrated"),
        "{text}"
    );
    assert!(text.contains("ok   TELOXIDE_TOKEN is set"), "{text}");
    assert!(out.status.success(), "{text}");
}

#[test]
fn usage_errors_exit_2() {
    let w = Workdir::new();
    let out = w.run(&["frobnicate"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn compose_file_parses_and_names_the_essentials() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docker-compose.yml")).expect("compose file");
    let compose: serde_yaml::Value = serde_yaml::from_str(&text).expect("valid YAML");
    let bot = &compose["services"]["daylog"];
    assert_eq!(bot["restart"].as_str(), Some("unless-stopped"));
    assert!(bot["env_file"].as_sequence().is_some() || bot["env_file"].as_str().is_some());
    let health = format!("{:?}", bot["healthcheck"]["test"]);
    assert!(health.contains("doctor"), "{health}");
    // .env's DATABASE_URL (a PostgreSQL one) is not silently overridden; PostgreSQL
    // itself is a profile of its own.
    let url = bot["environment"]["DATABASE_URL"].as_str().unwrap_or("");
    assert!(url.starts_with("${DATABASE_URL:-sqlite:"), "{url}");
    let postgres = &compose["services"]["postgres"];
    assert_eq!(
        format!("{:?}", postgres["profiles"]),
        format!(
            "{:?}",
            serde_yaml::from_str::<serde_yaml::Value>("[postgres]").expect("yaml")
        )
    );
    assert!(
        compose["volumes"]
            .as_mapping()
            .is_some_and(|v| !v.is_empty())
    );
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    assert!(dockerfile.contains("USER "), "runs as a non-root user");
    assert!(dockerfile.matches("FROM ").count() >= 2, "multi-stage");
}

/// One tiny request per key, each line naming the variable the key came from: a bad
/// second key is found even when the first works.
#[tokio::test]
async fn doctor_ping_sends_one_tiny_request_per_key() {
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let mistral = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer ping-key"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"}, "finish_reason": "stop"}]
        })))
        .expect(1)
        .mount(&mistral)
        .await;
    Mock::given(method("POST"))
        .and(header("authorization", "Bearer typo-key"))
        .respond_with(ResponseTemplate::new(401).set_body_string("invalid key"))
        .expect(1)
        .mount(&mistral)
        .await;
    let groq = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(401).set_body_string("invalid key"))
        .mount(&groq)
        .await;
    let telegram = crate::support::FakeTelegram::start().await;
    let telegram_url = telegram.url();
    let w = Workdir::new();
    let mistral_url = format!("{}/v1", mistral.uri());
    let groq_url = format!("{}/v1", groq.uri());
    let out = w
        .run_beside(
            &["doctor", "--ping"],
            &[
                ("MISTRAL_API_KEY", "ping-key"),
                ("MISTRAL_API_KEY_2", "typo-key"),
                ("GROQ_API_KEY", "revoked-key"),
                ("TELOXIDE_TOKEN", crate::support::telegram::TOKEN),
                ("TELOXIDE_API_URL", &telegram_url),
                ("DAYLOG__PROVIDERS__MISTRAL__BASE_URL", &mistral_url),
                ("DAYLOG__PROVIDERS__GROQ__BASE_URL", &groq_url),
            ],
        )
        .await;
    let text = stdout(&out);
    assert!(
        text.contains("ok   ping mistral key #0 (MISTRAL_API_KEY): answered"),
        "{text}"
    );
    assert!(
        text.contains("FAIL ping mistral key #1 (MISTRAL_API_KEY_2): the API key was refused"),
        "{text}"
    );
    assert!(
        text.contains("ok   ping telegram: answered as @daylog_bot"),
        "{text}"
    );
    assert!(
        text.contains("FAIL ping groq key #0 (GROQ_API_KEY)"),
        "{text}"
    );
    assert!(
        !text.contains("revoked-key") && !text.contains("ping-key") && !text.contains("typo-key"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1), "a failed ping fails the check");
}

/// A mistyped or revoked key is not an outage: the user is told the key was refused,
/// and the terminal of `daylog chat` (which shows only errors) names the variable.
#[tokio::test]
async fn a_refused_key_is_said_and_named_not_taken_for_an_outage() {
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let mistral = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(401).set_body_string("Unauthorized"))
        .mount(&mistral)
        .await;
    let url = format!("{}/v1", mistral.uri());
    let w = Workdir::new();
    let out = tokio::task::spawn_blocking(move || {
        let out = w.chat_with(
            "5",
            b"A long walk by the river.\n",
            &[
                ("MISTRAL_API_KEY", "sk-typo"),
                ("MISTRAL_API_KEY_2", "sk-revoked"),
                ("DAYLOG__PROVIDERS__MISTRAL__BASE_URL", &url),
            ],
        );
        drop(w);
        out
    })
    .await
    .expect("join");

    let (said, log) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{log}");
    assert!(said.contains("refused this bot's API key"), "{said}");
    assert!(!said.contains("not answering"), "{said}");
    assert!(log.contains("MISTRAL_API_KEY_2"), "{log}");
    assert!(log.contains("refused this API key"), "{log}");
    assert!(
        !log.contains("sk-typo") && !log.contains("sk-revoked"),
        "{log}"
    );
}

/// A `base_url` that answers 200 with something else (a proxy's page, another service)
/// is not "answered": the line says which setting to check, and the check fails. A
/// provider without a key is a warning, not a failure.
#[tokio::test]
async fn doctor_ping_fails_a_provider_url_that_is_not_its_api() {
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let proxy = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200).set_body_string("<html>hi</html>"))
        .mount(&proxy)
        .await;
    let url = format!("{}/v1", proxy.uri());
    let w = Workdir::new();
    assert!(w.run(&["migrate"], &[]).status.success());
    let out = w
        .run_beside(
            &["doctor", "--ping"],
            &[
                ("MISTRAL_API_KEY", "k"),
                ("TELOXIDE_TOKEN", "1:t"),
                ("TELOXIDE_API_URL", "http://127.0.0.1:9"),
                ("DAYLOG__PROVIDERS__MISTRAL__BASE_URL", &url),
            ],
        )
        .await;

    let text = stdout(&out);
    assert!(
        text.contains("FAIL ping mistral key #0 (MISTRAL_API_KEY): unusable answer (HTTP 200)"),
        "{text}"
    );
    assert!(text.contains("check providers.mistral.base_url"), "{text}");
    assert!(
        text.contains("warn provider gemini: no key (GEMINI_API_KEY not set)"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1));
}

/// A `TELOXIDE_API_URL` that is not a Bot API (a proxy's HTML page): `daylog run` would
/// take it for passing trouble and retry for ever; `doctor --ping` says which variable
/// to check, and fails.
#[tokio::test]
async fn doctor_ping_says_when_the_bot_api_url_is_not_one() {
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let proxy = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(404).set_body_string("<html>Not Found</html>"))
        .mount(&proxy)
        .await;
    let url = format!("{}/", proxy.uri());
    let w = Workdir::new();
    let out = w
        .run_beside(
            &["doctor", "--ping"],
            &[
                ("TELOXIDE_TOKEN", "1:secret-token"),
                ("TELOXIDE_API_URL", &url),
            ],
        )
        .await;
    let text = stdout(&out);
    assert!(text.contains("FAIL ping telegram:"), "{text}");
    assert!(text.contains("TELOXIDE_API_URL"), "{text}");
    assert!(!text.contains("secret-token"), "{text}");
    assert_eq!(out.status.code(), Some(1));
}

/// `daylog doctor` shows each key's stored daily budget by index, never the key.
#[tokio::test]
async fn doctor_shows_each_keys_budget_without_the_key() {
    let w = Workdir::new();
    assert!(w.run(&["migrate"], &[]).status.success());
    let url = format!("sqlite://{}", w.db_path().display());
    let store = daylog::store::Store::open_and_migrate(&url, std::time::Duration::from_secs(5))
        .await
        .expect("store");
    store
        .save_spent_budgets(&[daylog::llm::SpentBudget {
            provider: "gemini".into(),
            scope: "gemini-3.1-flash-lite".into(),
            key_index: Some(0),
            until: std::time::SystemTime::now() + std::time::Duration::from_secs(3 * 3600),
        }])
        .await
        .expect("saved");
    store.close().await;
    let out = w.run(
        &["doctor"],
        &[
            ("GEMINI_API_KEY", "secret-gemini-one,secret-gemini-two"),
            ("TELOXIDE_TOKEN", "1:t"),
        ],
    );
    let text = stdout(&out);
    assert!(
        text.contains(
            "warn budget gemini key #0 (GEMINI_API_KEY, 1st of 2) for gemini-3.1-flash-lite: daily quota spent, resets in 180 min"
        ),
        "{text}"
    );
    assert!(
        text.contains("ok   budget gemini key #1 (GEMINI_API_KEY, 2nd of 2): available"),
        "{text}"
    );
    assert!(!text.contains("secret-gemini"), "{text}");
    let sql = w.sql("SELECT provider, scope, key_index FROM llm_budgets");
    assert!(
        stdout(&sql).contains("gemini-3.1-flash-lite"),
        "{}",
        stdout(&sql)
    );
}

/// On PostgreSQL (`DATABASE_URL=postgres://…`, when the tests have a server): `migrate`,
/// `sql` (read-only: a server function with effects and a write are refused), `doctor`
/// and `backup` (which names pg_dump) work, and none of them ever shows the URL's
/// password. `DAYLOG_SQL_DATABASE_URL` is what `daylog sql` connects with when set.
#[tokio::test]
async fn on_postgres_every_command_works_and_never_shows_the_password() {
    use crate::support::postgres::{Backend, backends};
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let db = Backend::Postgres.fresh().await;
    let mut url = url::Url::parse(&db.url).expect("test URL");
    url.set_password(Some("hunter2-secret"))
        .expect("a password");
    let url = url.to_string();
    let w = Workdir::new();
    let env = [("DATABASE_URL", url.as_str())];
    let said = |out: &Output| format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(out));

    let migrate = w.run(&["migrate"], &env);
    let count = w.run(&["sql", "SELECT count(*) AS entries FROM day_logs"], &env);
    let kill = w.run(
        &["sql", "SELECT pg_terminate_backend(pg_backend_pid())"],
        &env,
    );
    let write = w.run(&["sql", "DELETE FROM users"], &env);
    let doctor = w.run(&["doctor"], &env);
    let backup = w.run(&["backup", "copy.db"], &env);
    let mut elsewhere = url::Url::parse(&url).expect("url");
    elsewhere.set_path("/no_such_database");
    let reader = w.run(
        &["sql", "SELECT 1"],
        &[
            ("DATABASE_URL", url.as_str()),
            ("DAYLOG_SQL_DATABASE_URL", elsewhere.as_str()),
        ],
    );

    assert_eq!(migrate.status.code(), Some(0), "{}", said(&migrate));
    assert_eq!(count.status.code(), Some(0), "{}", said(&count));
    assert!(
        said(&count).contains("entries") && said(&count).contains('0'),
        "{}",
        said(&count)
    );
    assert_eq!(kill.status.code(), Some(2), "{}", said(&kill));
    assert_eq!(write.status.code(), Some(2), "{}", said(&write));
    assert!(
        said(&doctor).contains("database reachable and migrated"),
        "{}",
        said(&doctor)
    );
    assert_ne!(backup.status.code(), Some(0), "{}", said(&backup));
    assert!(said(&backup).contains("pg_dump"), "{}", said(&backup));
    assert_ne!(reader.status.code(), Some(0), "{}", said(&reader));
    assert!(
        said(&reader).contains("no_such_database"),
        "{}",
        said(&reader)
    );
    // docs/operations.md's example queries for PostgreSQL run (on an empty journal).
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .expect("docs/operations.md");
    let examples = page
        .split_once("The same queries on PostgreSQL")
        .and_then(|(_, rest)| rest.split_once("\n```\n"))
        .map(|(block, _)| block)
        .expect("the PostgreSQL examples");
    let queries: Vec<&str> = examples
        .split("daylog sql \"")
        .skip(1)
        .filter_map(|q| q.split_once('"').map(|(query, _)| query))
        .collect();
    assert_eq!(queries.len(), 4, "{examples}");
    for query in queries {
        let out = w.run(&["sql", query], &env);
        assert_eq!(out.status.code(), Some(0), "{query}: {}", said(&out));
    }
    for out in [&migrate, &count, &kill, &write, &doctor, &backup, &reader] {
        assert!(!said(out).contains("hunter2"), "{}", said(out));
    }
}
