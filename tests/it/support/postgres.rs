//! The backends a store test runs on: SQLite always, PostgreSQL when this machine can
//! give it one.
//!
//! PostgreSQL comes from `DAYLOG_TEST_POSTGRES_URL` (a server whose user may create
//! databases) or, when the server binaries are installed
//! (`/usr/lib/postgresql/<version>/bin/initdb`), from a throwaway cluster this process
//! starts on first use: one cluster per test process, a fresh database per test.
//! Without either, the tests run on SQLite only and one line says so; under `CI=true`,
//! or when the server is installed but the cluster does not start, that is a failure
//! instead (a suite that did not run is not a suite that passed).
//!
//! The cluster never outlives the test process, however it ends (a panic, a SIGKILL,
//! Ctrl-C): it is started by a watchdog shell in a process group of its own, whose
//! stdin is a pipe only this process holds. When the process is gone the pipe closes,
//! the watchdog's `cat` returns, and it stops the server (`pg_ctl stop -m immediate`)
//! and removes its folder. Nothing here needs a teardown or unsafe code.
//!
//! As root (CI runs as root) the cluster runs as `nobody`: `initdb` refuses root. The
//! server listens on a Unix socket in its own folder only, so no port can collide.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::Connection;

/// A database engine a store test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        })
    }
}

/// A fresh, empty database of one backend, for one test: its `DATABASE_URL`.
pub struct FreshDb {
    pub url: String,
    /// The SQLite file's folder (removed when the test is done); `None` on PostgreSQL,
    /// whose database goes with the cluster.
    _dir: Option<tempfile::TempDir>,
}

/// The backends this run tests: SQLite, and PostgreSQL when there is one (see the
/// module's comment; under `CI=true` a missing PostgreSQL fails the test).
pub fn backends() -> Vec<Backend> {
    if server().is_some() {
        vec![Backend::Sqlite, Backend::Postgres]
    } else {
        vec![Backend::Sqlite]
    }
}

impl Backend {
    /// A new empty database of this backend (not migrated).
    pub async fn fresh(self) -> FreshDb {
        match self {
            Self::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}/nested/daylog.db", dir.path().display());
                FreshDb {
                    url,
                    _dir: Some(dir),
                }
            }
            Self::Postgres => {
                let server = server().expect("PostgreSQL was listed as a backend");
                FreshDb {
                    url: server.create_database().await,
                    _dir: None,
                }
            }
        }
    }
}

/// Where fresh PostgreSQL databases are created.
struct Server {
    /// A URL of the server whose database part is replaced by each test's.
    base: url::Url,
    /// The watchdog of a cluster this process started (`None`: an outside server); kept
    /// only so that its stdin stays open for as long as this process lives.
    _watchdog: Option<(Child, ChildStdin)>,
}

static SERVER: OnceLock<Option<Server>> = OnceLock::new();
static NEXT_DB: AtomicU64 = AtomicU64::new(1);

fn server() -> Option<&'static Server> {
    SERVER
        .get_or_init(|| {
            let found = find_server();
            match found {
                Ok(server) => Some(server),
                Err(why) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
                    panic!("CI=true: the PostgreSQL store tests must run here, but {why}")
                }
                // Installed but not working is a failure too, not a quiet skip.
                Err(why) if server_binaries().is_some() => {
                    panic!("PostgreSQL is installed but its store tests cannot run: {why}")
                }
                Err(why) => {
                    #[expect(clippy::print_stderr, reason = "the one line saying what did not run")]
                    {
                        eprintln!("PostgreSQL store tests did not run (SQLite only): {why}");
                    }
                    None
                }
            }
        })
        .as_ref()
}

fn find_server() -> Result<Server, String> {
    if let Ok(url) = std::env::var("DAYLOG_TEST_POSTGRES_URL") {
        let base = url::Url::parse(&url)
            .map_err(|e| format!("DAYLOG_TEST_POSTGRES_URL is no URL: {e}"))?;
        return Ok(Server {
            base,
            _watchdog: None,
        });
    }
    let bin = server_binaries().ok_or(
        "no DAYLOG_TEST_POSTGRES_URL and no /usr/lib/postgresql/<version>/bin/initdb".to_owned(),
    )?;
    start_cluster(&bin)
}

/// The newest installed server's `bin` folder.
fn server_binaries() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// The watchdog: starts the cluster, says `ready` (or what failed), waits for its
/// stdin to close (this process gone), then stops the cluster and removes its folder.
/// `$1` the server binaries, `$2` the folder, `$3` `root` when it must run as nobody.
const WATCHDOG: &str = r#"
bin=$1; dir=$2; mode=$3
group=$(id -g nobody 2>/dev/null || echo 65534)
run() { if [ "$mode" = root ]; then setpriv --reuid=nobody --regid="$group" --clear-groups "$@"; else "$@"; fi; }
if [ "$mode" = root ]; then chown "nobody:$group" "$dir"; fi
if run "$bin/initdb" -D "$dir/data" -U daylog --auth=trust --no-sync -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
   && run "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses='' -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
        start >/dev/null 2>&1; then
    echo ready
else
    echo "failed: $(tail -n 3 "$dir/initdb.log" "$dir/server.log" 2>/dev/null | tr '\n' ' ')"
fi
cat >/dev/null
run "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1
rm -rf "$dir"
"#;

fn start_cluster(bin: &std::path::Path) -> Result<Server, String> {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::Builder::new()
        .prefix("daylog-pg-")
        .tempdir()
        .map_err(|e| format!("no folder for the cluster: {e}"))?
        .keep();
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("watchdog")
        .arg(bin)
        .arg(&dir)
        .arg(if root { "root" } else { "user" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C to the test run does not kill the watchdog
        // before it has stopped the cluster.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the cluster's watchdog: {e}"))?;
    let stdin = child.stdin.take().ok_or("the watchdog has no stdin")?;
    let stdout = child.stdout.take().ok_or("the watchdog has no stdout")?;
    let mut said = String::new();
    BufReader::new(stdout)
        .read_line(&mut said)
        .map_err(|e| format!("the watchdog said nothing: {e}"))?;
    if said.trim() != "ready" {
        return Err(format!(
            "the throwaway cluster did not start: {}",
            said.trim()
        ));
    }
    let base = url::Url::parse(&format!(
        "postgres://daylog@localhost/postgres?host={}",
        dir.display()
    ))
    .map_err(|e| e.to_string())?;
    Ok(Server {
        base,
        _watchdog: Some((child, stdin)),
    })
}

impl Server {
    /// Creates an empty database with a name no other test (of any process) uses, and
    /// returns its URL.
    async fn create_database(&self) -> String {
        let name = format!(
            "daylog_t{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = sqlx::PgConnection::connect(self.base.as_str())
            .await
            .expect("connect to the test server");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create a test database");
        admin.close().await.ok();
        let mut url = self.base.clone();
        url.set_path(&format!("/{name}"));
        url.to_string()
    }
}

/// The watchdog stops the cluster and removes its folder once the test process's end
/// of its stdin closes, whatever else happens: shown with stand-ins for `initdb` and
/// `pg_ctl` that record how they were called.
#[test]
fn the_watchdog_stops_the_cluster_when_its_process_is_gone() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::tempdir().expect("bin");
    let record = bin.path().join("calls");
    for tool in ["initdb", "pg_ctl"] {
        let path = bin.path().join(tool);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho \"{tool} $*\" >> '{}'\n", record.display()),
        )
        .expect("stand-in");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let dir = tempfile::tempdir().expect("cluster folder").keep();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("watchdog")
        .arg(bin.path())
        .arg(&dir)
        .arg("user")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("watchdog");
    let mut said = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut said)
        .expect("a line");
    assert_eq!(said.trim(), "ready");
    let calls = || std::fs::read_to_string(&record).unwrap_or_default();
    assert!(!calls().contains("stop"), "stopped too early: {}", calls());
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"anything\n").expect("write");
    drop(stdin);
    let status = child.wait().expect("the watchdog ends");
    assert!(status.success());
    assert!(calls().contains("pg_ctl -D"), "{}", calls());
    assert!(calls().contains("-m immediate stop"), "{}", calls());
    assert!(!dir.exists(), "the cluster's folder is removed");
}

/// A test's own connection to its database, for SQL the store does not offer (a hand
/// edit, a count): the same text runs on both backends where the dialects agree
/// (placeholders `$1`…).
pub enum Raw {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Raw {
    pub async fn connect(url: &str) -> Self {
        if url.starts_with("postgres") {
            Self::Postgres(sqlx::PgPool::connect(url).await.expect("raw connection"))
        } else {
            Self::Sqlite(
                sqlx::SqlitePool::connect(url)
                    .await
                    .expect("raw connection"),
            )
        }
    }

    /// Runs a statement with no parameters; how many rows it changed.
    pub async fn exec(&self, sql: &str) -> u64 {
        match self {
            Self::Sqlite(pool) => sqlx::query(sql)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            Self::Postgres(pool) => sqlx::query(sql)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The rows of a query with no parameters.
    pub async fn rows<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
            + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
            + Send
            + Unpin,
    {
        match self {
            Self::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Self::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The one value of a query with no parameters.
    pub async fn value<T>(&self, sql: &str) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Sqlite>
            + sqlx::Type<sqlx::Sqlite>
            + for<'r> sqlx::Decode<'r, sqlx::Postgres>
            + sqlx::Type<sqlx::Postgres>
            + Send
            + Unpin,
    {
        match self {
            Self::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Self::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub async fn close(self) {
        match self {
            Self::Sqlite(pool) => pool.close().await,
            Self::Postgres(pool) => pool.close().await,
        }
    }
}

/// A test that runs once on each backend of [`backends`], each time on a fresh store
/// from the calling module's `fresh_on(backend)`: one test code for SQLite and PostgreSQL.
macro_rules! on_each_backend {
    ($(#[$meta:meta])* async fn $name:ident($db:ident: TestDb) $body:block) => {
        $(#[$meta])*
        #[tokio::test]
        async fn $name() {
            for backend in backends() {
                let $db = fresh_on(backend).await;
                $body
            }
        }
    };
}
pub(crate) use on_each_backend;
