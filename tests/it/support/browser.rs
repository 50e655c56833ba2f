//! The Mini App's test helpers: initData signed as Telegram signs it, a seeded year of
//! entries, and a headless Chromium driven through `chromedriver` over the W3C
//! WebDriver protocol (plain JSON over HTTP with the `reqwest` daylog already has).
//!
//! Without Chromium (`chromium`, `chromium-driver`) [`Browser::start`] says so in one
//! line and the browser tests do not run — unless `CI=true`, where that fails the run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// initData for `user_id` signed with `token`, `auth_date` Unix seconds.
pub fn init_data(token: &str, user_id: i64, auth_date: i64) -> String {
    let user = json!({"id": user_id, "first_name": "Test", "username": format!("u{user_id}"), "language_code": "en"})
        .to_string();
    daylog::webapp::init_data::signed_query(
        token,
        &[
            ("auth_date", &auth_date.to_string()),
            ("query_id", "AAHdF6IQAAAAAN0XohDhrOrc"),
            ("signature", "c2lnbmF0dXJl"),
            ("user", &user),
        ],
    )
}

/// Gives `user_id` `days` days of entries back from yesterday (UTC), two a day — a
/// morning and an evening one, analysed, with metrics — in one statement. Every
/// seventh evening "went running in the park" (the search tests find it as "runs").
pub async fn seed_year(db_url: &str, user_id: i64, days: i64) {
    let pool = sqlx::SqlitePool::connect(db_url).await.expect("writer");
    sqlx::query("INSERT OR IGNORE INTO users (user_id, chat_id) VALUES (?1, ?1)")
        .bind(user_id)
        .execute(&pool)
        .await
        .expect("user");
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?2 * 2 - 1)
         INSERT INTO day_logs (user_id, chat_id, message_id, text, created_at, status,
                               analysis, metrics, attempts, replied_at)
         SELECT ?1, ?1, 1000000 + i,
                CASE WHEN i % 2 = 0
                     THEN 'Morning ' || (i / 2) || ': coffee and a plan for the day.'
                     ELSE 'Evening ' || (i / 2) || ': ' ||
                          CASE WHEN (i / 2) % 7 = 3 THEN 'went running in the park'
                               ELSE 'read a book at home' END || '.' END,
                datetime(date('now', '-' || (i / 2 + 1) || ' days'),
                         CASE WHEN i % 2 = 0 THEN '+8 hours' ELSE '+20 hours' END),
                'analyzed',
                'Analysis of entry ' || i || '.',
                json_object('mood', 1 + (i / 2) % 5, 'stress', 1 + (i * 3) % 5,
                            'energy', 1 + (i * 7) % 5, 'productivity', 3,
                            'sleep_hours', 5.0 + (i % 40) / 10.0,
                            'activities', CASE WHEN (i / 2) % 7 = 3 THEN json_array('run')
                                               ELSE json_array('reading') END,
                            'emotions', json_array('calm'), 'summary', 'Day ' || (i / 2),
                            'defaulted', json_array()),
                1, datetime('now')
         FROM n",
    )
    .bind(user_id)
    .bind(days)
    .execute(&pool)
    .await
    .expect("seed");
    pool.close().await;
}

/// A free port on 127.0.0.1 (bound and released: a test then configures it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Where a program is on `PATH`, if it is.
fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// Where the browser tests write their screenshots: `target/webapp-screens/`.
pub fn screens_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("webapp-screens");
    std::fs::create_dir_all(&dir).expect("screens folder");
    dir
}

/// A headless Chromium under `chromedriver`, closed (both processes) when dropped.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A fresh browser; `None` (after one line saying so) when Chromium or chromedriver
    /// is not installed. Under `CI=true` a missing browser fails the test instead.
    #[expect(
        clippy::print_stderr,
        reason = "the one line saying that the browser tests did not run"
    )]
    pub async fn start() -> Option<Self> {
        let chromium = which(&["chromium", "chromium-browser", "google-chrome"]);
        let driver = which(&["chromedriver"]);
        let (Some(chromium), Some(driver)) = (chromium, driver) else {
            let line = "the Mini App's browser tests did not run: chromium and chromedriver are not installed (apt-get install chromium chromium-driver)";
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{line}");
            eprintln!("{line}");
            return None;
        };
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile = tempfile::tempdir().expect("profile dir");
        let mut browser = Self {
            driver: child,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http: reqwest::Client::new(),
            _profile: profile,
        };
        browser.open_session(&chromium).await;
        Some(browser)
    }

    async fn open_session(&mut self, chromium: &Path) {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--window-size=360,800",
            // Nothing leaves the machine: Telegram's script fails to load at once.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([format!(
            "--user-data-dir={}",
            self._profile.path().display()
        )])
        .collect::<Vec<_>>();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // A 360 px wide phone, the narrowest the page promises to be usable on.
            "goog:chromeOptions": {"binary": chromium, "args": args,
                "mobileEmulation": {"deviceMetrics": {"width": 360, "height": 780, "pixelRatio": 1.0}}},
        }}});
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let answer = self
                .http
                .post(format!("{}/session", self.base))
                .json(&capabilities)
                .send()
                .await;
            if let Ok(answer) = answer {
                let body: Value = answer.json().await.expect("session JSON");
                let id = body["value"]["sessionId"].as_str().unwrap_or_default();
                assert!(!id.is_empty(), "no WebDriver session: {body}");
                self.session = id.to_owned();
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not answer"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}/{path}", self.base, self.session);
        let request = self.http.request(method, url);
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let answer = request.send().await.expect("WebDriver answers");
        let body: Value = answer.json().await.expect("WebDriver JSON");
        body["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "url", json!({"url": url}))
            .await;
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns its value.
    pub async fn eval(&self, script: &str, args: Value) -> Value {
        self.command(
            reqwest::Method::POST,
            "execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// Waits until `script` returns something truthy (a hang guard, not a timing).
    pub async fn wait_for(&self, what: &str, script: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let value = self.eval(script, json!([])).await;
            let truthy = match &value {
                Value::Null | Value::Bool(false) => false,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::Object(o) => !o.contains_key("error"),
                Value::Array(_) | Value::Bool(true) => true,
            };
            if truthy {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what} (last: {value})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the first element matching `css`.
    pub async fn click(&self, css: &str) {
        let clicked = self
            .eval(
                "const e = document.querySelector(arguments[0]); if (!e) return false; e.scrollIntoView(); e.click(); return true;",
                json!([css]),
            )
            .await;
        assert_eq!(clicked, json!(true), "nothing to click at {css}");
    }

    /// Sets the value of the input matching `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        let set = self
            .eval(
                "const e = document.querySelector(arguments[0]); if (!e) return false; e.value = arguments[1]; return true;",
                json!([css, text]),
            )
            .await;
        assert_eq!(set, json!(true), "no input at {css}");
    }

    /// Writes a PNG of the page to `dir/name.png`.
    pub async fn screenshot(&self, dir: &Path, name: &str) {
        use base64::Engine as _;
        let value = self
            .command(reqwest::Method::GET, "screenshot", Value::Null)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap_or_default())
            .expect("screenshot is base64");
        assert!(png.starts_with(b"\x89PNG"), "no screenshot: {value}");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("screenshot written");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Closing the session ends Chromium; the driver is then killed and reaped.
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = std::thread::spawn(move || {
            let _ = reqwest::blocking_delete(&url);
        })
        .join();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

mod reqwest {
    //! `reqwest` without its `blocking` feature: a DELETE from a plain thread.
    pub use ::reqwest::*;

    pub fn blocking_delete(url: &str) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let _ = ::reqwest::Client::new().delete(url).send().await;
        });
        Ok(())
    }
}
