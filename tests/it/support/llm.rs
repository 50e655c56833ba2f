//! Helpers for the LLM-layer tests: settings pointing at fake providers on 127.0.0.1, fixture
//! loading, a recording attempt sink and a log capture.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failure here is a test failure"
)]

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use daylog::config::{CONFIG_FILE_VAR, Settings};
use daylog::llm::{Attempt, AttemptSink, Outcome};
use wiremock::ResponseTemplate;

/// Fast retry settings so tests never sleep long.
pub const FAST_RETRY: &str = "[retry]
max_attempts = 3
min_delay_ms = 10
max_delay_ms = 50
request_timeout_ms = 5000
hedge_after_ms = 0
deadline_ms = 20000

[cooldown]
duration_ms = 60000
failures_to_trip = 3
";

/// A key that must never show up anywhere but a request header.
pub const SECRET: &str = "sk-live-SECRET-0123456789";

/// A small request; `json` asks for JSON mode.
pub fn request(json: bool) -> daylog::llm::ChatRequest {
    daylog::llm::ChatRequest {
        system: "System prompt.".into(),
        user: "My day was fine.".into(),
        json,
    }
}

/// A fake provider that gives every POST `answer`.
pub async fn server_with(answer: ResponseTemplate) -> wiremock::MockServer {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(answer)
        .mount(&server)
        .await;
    server
}

/// A healthy OpenAI-compatible provider: every chat completion answered at once.
pub async fn ok_server() -> wiremock::MockServer {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/chat/completions"))
        .respond_with(json_reply(200, "openai/chat_completion.json"))
        .mount(&server)
        .await;
    server
}

/// How many requests `server` has received.
pub async fn calls(server: &wiremock::MockServer) -> usize {
    server
        .received_requests()
        .await
        .expect("recording on")
        .len()
}

/// One provider named `p` of `kind` at `base_url`, one analysis step with `model`.
pub fn one_step(kind: &str, base_url: &str, model: &str) -> String {
    let mut toml = FAST_RETRY.to_owned();
    toml.push_str(&provider("p", kind, base_url));
    toml.push_str(&analysis_steps(&[("p", model)]));
    toml
}

/// A recorded provider reply from `tests/fixtures/`.
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn json_reply(status: u16, fixture_name: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_raw(fixture(fixture_name), "application/json")
}

/// A fixture's 200 whose answer text `prose` is replaced by a JSON object, as a
/// JSON-mode request is answered.
pub fn json_mode_reply(fixture_name: &str, prose: &str) -> ResponseTemplate {
    let body = fixture(fixture_name);
    assert!(body.contains(prose), "{fixture_name} says {prose:?}");
    let body = body.replace(prose, r#"{\"mood\": 4}"#);
    ResponseTemplate::new(200).set_body_raw(body, "application/json")
}

/// A `[providers.NAME]` table.
pub fn provider(name: &str, kind: &str, base_url: &str) -> String {
    format!("[providers.{name}]\nkind = \"{kind}\"\nbase_url = \"{base_url}\"\n")
}

/// `[[analysis.steps]]` entries, one per (provider, model).
pub fn analysis_steps(steps: &[(&str, &str)]) -> String {
    steps
        .iter()
        .map(|(p, m)| format!("[[analysis.steps]]\nprovider = \"{p}\"\nmodel = \"{m}\"\n"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Settings from the defaults, one TOML layer and `env` (keys, overrides).
pub fn settings(toml: &str, env: &[(&str, &str)]) -> Settings {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(toml.as_bytes()).expect("write config");
    settings_from_file(file.path(), env)
}

pub fn settings_from_file(path: &Path, env: &[(&str, &str)]) -> Settings {
    let mut vars: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    vars.insert(
        CONFIG_FILE_VAR.to_owned(),
        path.to_str().expect("utf-8 path").to_owned(),
    );
    super::settings(&vars)
}

/// Keeps every attempt, for assertions.
#[derive(Default)]
pub struct RecordingSink(Mutex<Vec<Attempt>>);

impl AttemptSink for RecordingSink {
    fn record(&self, attempt: Attempt) {
        self.0.lock().unwrap().push(attempt);
    }
}

impl RecordingSink {
    pub fn attempts(&self) -> Vec<Attempt> {
        self.0.lock().unwrap().clone()
    }

    /// (model, outcome) per attempt, in order.
    pub fn outcomes(&self) -> Vec<(String, Outcome)> {
        self.attempts()
            .into_iter()
            .map(|a| (a.model, a.outcome))
            .collect()
    }

    pub fn count(&self, model: &str, outcome: Outcome) -> usize {
        self.attempts()
            .iter()
            .filter(|a| a.model == model && a.outcome == outcome)
            .count()
    }
}

/// Captures formatted tracing output at every level.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

thread_local! {
    /// The capture of the test running on this thread, if it asked for one.
    static THREAD_CAPTURE: std::cell::RefCell<Option<LogCapture>> =
        const { std::cell::RefCell::new(None) };
}

fn thread_capture() -> Option<LogCapture> {
    // An event from a thread-local's destructor, as the thread exits, finds this one
    // gone: no capture then (panicking there aborts the whole test binary).
    THREAD_CAPTURE
        .try_with(|c| c.borrow().clone())
        .ok()
        .flatten()
}

/// The process's one tracing subscriber, installed on first use by any test: it keeps
/// the events of threads that capture ([`LogCapture::this_thread`]) and, with `TEST_LOG`
/// set, writes every event at `debug` to the test output.
///
/// One global subscriber, not a thread-local one per test: a thread-local default
/// shares callsite interest with the tests running beside it and can miss events at
/// random. Here every callsite's interest is "sometimes" and the thread is asked per event.
pub fn install_test_subscriber() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        let capture = tracing_subscriber::fmt::layer()
            .with_writer(|| ThreadWriter(thread_capture()))
            .with_ansi(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|_| {
                THREAD_CAPTURE
                    .try_with(|c| c.borrow().is_some())
                    .unwrap_or(false)
            }));
        let test_log = std::env::var("TEST_LOG").is_ok().then(|| {
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(tracing_subscriber::EnvFilter::new("debug"))
        });
        tracing_subscriber::registry()
            .with(capture)
            .with(test_log)
            .try_init()
            .expect("the only global subscriber of the test binary");
    });
}

/// Where the capturing layer writes: the emitting thread's capture, or nowhere.
struct ThreadWriter(Option<LogCapture>);

impl Write for ThreadWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(capture) = &self.0 {
            capture.0.lock().unwrap().extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A capture of the calling thread's events, until it is dropped. A `#[tokio::test]`
/// runs its tasks on its own thread, so this sees what that test's code logs and nothing
/// of the tests running in parallel.
pub struct ThreadCapture(LogCapture);

impl LogCapture {
    pub fn this_thread() -> ThreadCapture {
        install_test_subscriber();
        let capture = LogCapture::default();
        THREAD_CAPTURE.with(|c| *c.borrow_mut() = Some(capture.clone()));
        ThreadCapture(capture)
    }
}

impl ThreadCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.0.lock().unwrap()).into_owned()
    }

    pub fn clear(&self) {
        self.0.0.lock().unwrap().clear();
    }
}

impl Drop for ThreadCapture {
    fn drop(&mut self) {
        THREAD_CAPTURE.with(|c| *c.borrow_mut() = None);
    }
}
