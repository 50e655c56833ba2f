//! Several real `daylog run` instances on one PostgreSQL database, in webhook mode
//! behind [`Balancer`]: a small round-robin load balancer, a real HTTP server, that the
//! fake Bot API posts its webhook to. Each POST goes to the next instance that answers;
//! when none does the balancer answers 502, so the fake Telegram delivers it again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};

use super::{Bot, FakeTelegram, Providers, spawn_daylog, test_env};

/// The webhook's path and secret the instances share.
pub const PATH: &str = "/telegram/webhook";
pub const SECRET: &str = "cluster-test-secret";

/// The round-robin balancer.
pub struct Balancer {
    port: u16,
    backends: Arc<Mutex<Vec<u16>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Route {
    backends: Arc<Mutex<Vec<u16>>>,
    next: Arc<AtomicUsize>,
    client: reqwest::Client,
}

impl Balancer {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for the balancer");
        let port = listener.local_addr().expect("its address").port();
        let backends = Arc::new(Mutex::new(Vec::new()));
        let route = Route {
            backends: Arc::clone(&backends),
            next: Arc::new(AtomicUsize::new(0)),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
        };
        let app = axum::Router::new().fallback(forward).with_state(route);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            port,
            backends,
            task,
        }
    }

    /// The URL Telegram posts to (`telegram.webhook_url` of every instance).
    pub fn webhook_url(&self) -> String {
        format!("http://127.0.0.1:{}{PATH}", self.port)
    }

    /// The instances' ports, in the order they are tried.
    pub fn serve(&self, ports: &[u16]) {
        *self.backends.lock().expect("lock") = ports.to_vec();
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards one request to the next instance that answers (its status and body as
/// they came); 502 when none does.
async fn forward(
    State(route): State<Route>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Bytes) {
    let ports = route.backends.lock().expect("lock").clone();
    if ports.is_empty() {
        return (StatusCode::BAD_GATEWAY, Bytes::new());
    }
    let first = route.next.fetch_add(1, Ordering::Relaxed);
    for i in 0..ports.len() {
        let port = ports[(first + i) % ports.len()];
        let mut request = route
            .client
            .post(format!("http://127.0.0.1:{port}{}", uri.path()))
            .body(body.clone());
        for (name, value) in &headers {
            if name != "host" && name != "content-length" {
                request = request.header(name, value);
            }
        }
        if let Ok(response) = request.send().await {
            let status =
                StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let body = response.bytes().await.unwrap_or_default();
            return (status, body);
        }
    }
    (StatusCode::BAD_GATEWAY, Bytes::new())
}

/// A port no listener uses now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One instance: its port, environment, process and log. Each start is a new *life*,
/// tagged `<name>.<n>`: its calls reach the fake Bot API through
/// [`FakeTelegram::url_tagged`], so a test tells which life sent what ([`Call::via`](super::telegram::Call)),
/// and [`Instance::ended`] says how each life ended.
pub struct Instance {
    pub port: u16,
    pub env: HashMap<String, String>,
    pub log: std::path::PathBuf,
    pub bot: Option<Bot>,
    name: String,
    /// The fake Bot API each life's calls go to, tagged.
    telegram: FakeTelegram,
    lives: u32,
    /// How each life that ended ended, by its tag.
    ended: Vec<(String, End)>,
}

/// How a life of an instance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `kill -9`: it may have sent an answer it had no time to record.
    Killed,
    /// SIGTERM: a clean stop.
    Stopped,
}

impl Instance {
    /// An instance's environment: webhook mode on `port` behind `balancer`, `lease_ms`.
    pub fn env(
        db_url: &str,
        telegram: &FakeTelegram,
        providers: &Providers,
        balancer: &Balancer,
        port: u16,
        lease_ms: u64,
    ) -> HashMap<String, String> {
        let mut env = test_env(db_url, telegram, providers);
        env.insert("DAYLOG__TELEGRAM__MODE".into(), "webhook".into());
        env.insert("DAYLOG__HTTP__LISTEN".into(), format!("127.0.0.1:{port}"));
        env.insert(
            "DAYLOG__TELEGRAM__WEBHOOK_URL".into(),
            balancer.webhook_url(),
        );
        env.insert("TELEGRAM_WEBHOOK_SECRET".into(), SECRET.into());
        env.insert("DAYLOG__CLUSTER__LEASE_MS".into(), lease_ms.to_string());
        // The shipped grace: a stopped instance finishes its answers before it gives
        // its chats up (3 s, the single-instance tests' value, runs out under load).
        env.insert("DAYLOG__TELEGRAM__SHUTDOWN_GRACE_MS".into(), "8000".into());
        // `FAULT_RUST_LOG` (e.g. `info,daylog=debug`) replays a run with more to read.
        if let Ok(filter) = std::env::var("FAULT_RUST_LOG") {
            env.insert("RUST_LOG".into(), filter);
        }
        env
    }

    /// The tag of the current (or last) life.
    pub fn tag(&self) -> String {
        format!("{}.{}", self.name, self.lives)
    }

    /// How each life that ended ended, by its tag.
    pub fn ended(&self) -> &[(String, End)] {
        &self.ended
    }

    /// Starts the real binary (again: a new life) and waits until its `/readyz` says 200.
    pub async fn start(&mut self) {
        self.lives += 1;
        let api = self.telegram.url_tagged(&self.tag());
        self.env.insert("TELOXIDE_API_URL".into(), api);
        self.bot = Some(spawn_daylog(&self.env, &self.log));
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ok = client
                .get(&url)
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 200);
            if ok {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "an instance never became ready:\n{}",
                super::tail(&self.log, 30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `kill -9`, and waits for the process to be gone.
    pub async fn kill(&mut self) {
        if let Some(mut bot) = self.bot.take() {
            super::signal(&bot, "KILL");
            super::wait_exit(&mut bot, Duration::from_secs(15)).await;
            self.ended.push((self.tag(), End::Killed));
        }
    }

    /// SIGSTOP: the process stalls (no heartbeat, nothing sent) until [`Instance::resume`].
    pub fn pause(&self) {
        if let Some(bot) = &self.bot {
            super::signal(bot, "STOP");
        }
    }

    /// SIGCONT after [`Instance::pause`].
    pub fn resume(&self) {
        if let Some(bot) = &self.bot {
            super::signal(bot, "CONT");
        }
    }

    /// SIGTERM, and waits for a clean exit.
    pub async fn stop(&mut self) -> Option<i32> {
        let mut bot = self.bot.take()?;
        super::signal(&bot, "TERM");
        let code = super::wait_exit(&mut bot, Duration::from_secs(30))
            .await
            .code();
        self.ended.push((self.tag(), End::Stopped));
        code
    }
}

/// The ports of `instances`, for [`Balancer::serve`].
pub fn ports(instances: &[&Instance]) -> Vec<u16> {
    instances.iter().map(|i| i.port).collect()
}

/// `count` instances on the database `db_url` behind a new balancer, started.
pub async fn start_instances(
    db_url: &str,
    telegram: &FakeTelegram,
    providers: &Providers,
    dir: &std::path::Path,
    count: usize,
    lease_ms: u64,
) -> (Balancer, Vec<Instance>) {
    let balancer = Balancer::start().await;
    let mut instances = Vec::new();
    for n in 0..count {
        let port = free_port();
        let env = Instance::env(db_url, telegram, providers, &balancer, port, lease_ms);
        let mut instance = Instance {
            port,
            env,
            log: dir.join(format!("instance-{n}.log")),
            bot: None,
            name: format!("i{n}"),
            telegram: telegram.clone(),
            lives: 0,
            ended: Vec::new(),
        };
        instance.start().await;
        instances.push(instance);
    }
    balancer.serve(&instances.iter().map(|i| i.port).collect::<Vec<_>>());
    (balancer, instances)
}

/// A PostgreSQL server of one test's own, which the test may stop and start (the
/// shared throwaway cluster serves every other test and must not go away). As root it
/// runs as `nobody`; it listens on a Unix socket in its own folder only. Stopped and
/// removed when dropped.
pub struct OwnPostgres {
    dir: std::path::PathBuf,
    bin: std::path::PathBuf,
    root: bool,
    pub url: String,
}

impl OwnPostgres {
    /// A server of the test `what`'s own when the PostgreSQL suite runs here; `None`
    /// when it does not (`backends()` said so), or when its server is elsewhere
    /// (`DAYLOG_TEST_POSTGRES_URL`) and no binaries are installed to start one — said
    /// in a line, and under `CI=true` a failure: the test must run there.
    pub fn for_test(what: &str) -> Option<Self> {
        use super::postgres::{Backend, backends};
        if !backends().contains(&Backend::Postgres) {
            return None;
        }
        let own = Self::start();
        if own.is_none() {
            #[expect(clippy::print_stderr, reason = "the one line saying what did not run")]
            {
                eprintln!("{what} did not run: no server binaries of its own");
            }
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: it must run"
            );
        }
        own
    }

    /// `None` when no server binaries are installed.
    pub fn start() -> Option<Self> {
        // The newest installed server's binaries.
        let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").is_file().then_some((version, bin))
            })
            .collect();
        found.sort();
        let (_, bin) = found.pop()?;
        let dir = tempfile::Builder::new()
            .prefix("daylog-own-pg-")
            .tempdir()
            .expect("a folder")
            .keep();
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
        if root {
            let status = std::process::Command::new("chown")
                .args(["nobody:nogroup", &dir.display().to_string()])
                .status()
                .expect("chown");
            assert!(status.success());
        }
        let own = Self {
            url: format!(
                "postgres://daylog@localhost/postgres?host={}",
                dir.display()
            ),
            dir,
            bin,
            root,
        };
        own.run(
            "initdb",
            &[
                "-D",
                &own.data(),
                "-U",
                "daylog",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ],
        );
        own.up();
        Some(own)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run(&self, tool: &str, args: &[&str]) -> bool {
        let program = self.bin.join(tool);
        let mut command = if self.root {
            let mut command = std::process::Command::new("setpriv");
            command
                .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
                .arg(program);
            command
        } else {
            std::process::Command::new(program)
        };
        command
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// Starts the server and waits until it takes connections.
    pub fn up(&self) {
        let options = format!(
            "-c listen_addresses='' -k {} -c fsync=off -c synchronous_commit=off",
            self.dir.display()
        );
        let log = self.dir.join("server.log").display().to_string();
        assert!(
            self.run(
                "pg_ctl",
                &[
                    "-D",
                    &self.data(),
                    "-l",
                    &log,
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    &options,
                    "start"
                ]
            ),
            "the test's own PostgreSQL did not start"
        );
    }

    /// Stops the server (fast: connections are cut, as in a restart).
    pub fn down(&self) {
        assert!(self.run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]));
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
