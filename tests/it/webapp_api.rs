//! The Mini App's API (docs/behaviour.md, The Mini App): initData checked as Telegram
//! documents it (against the published example, and initData signed here), every
//! endpoint a bare 401 without it, one user never seeing another's journal, settings
//! through the commands' own rules, and the export and deletion done by the bot in the
//! private chat — nothing deleted before the button there is pressed.
//!
//! The bot runs in process against the fake Telegram; the Mini App's routes are served
//! beside it from a second `App` on the same database, as `daylog run` serves them.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use std::time::Duration;

use serde_json::{Value, json};

use crate::support;
use support::browser::{init_data, seed_year};
use support::telegram::{TOKEN, callback_update, now_unix};

const ALICE: i64 = 5_100_001;
const BOB: i64 = 5_100_002;
/// On `telegram.allowed_users`? No: the test that sets the list leaves this one out.
const MALLORY: i64 = 5_100_003;

/// The bot and its Mini App on a port of their own.
struct MiniApp {
    bot: support::App,
    base: String,
    http: reqwest::Client,
}

impl MiniApp {
    async fn start(configure: impl FnOnce(&mut std::collections::HashMap<String, String>)) -> Self {
        Self::start_on(support::Backend::Sqlite, configure).await
    }

    /// The bot and its Mini App on a fresh database of `backend`.
    async fn start_on(
        backend: support::Backend,
        configure: impl FnOnce(&mut std::collections::HashMap<String, String>),
    ) -> Self {
        let bot = support::App::spawn_on_backend(backend, |env| {
            env.insert(
                "DAYLOG__WEBAPP__URL".to_owned(),
                "https://journal.example.com/app".to_owned(),
            );
            configure(env);
        })
        .await;
        let settings = support::settings(&bot.env);
        let app = daylog::app::App::build(settings)
            .await
            .expect("second app")
            .with_clock(bot.clock.clone());
        let router = app.mini_app().expect("mini app");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            bot,
            base,
            http: reqwest::Client::new(),
        }
    }

    fn tma(user: i64) -> String {
        format!("tma {}", init_data(TOKEN, user, now_unix()))
    }

    async fn get(&self, path: &str, authorization: Option<&str>) -> (u16, String) {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(value) = authorization {
            request = request.header("Authorization", value);
        }
        let answer = request.send().await.expect("GET");
        (answer.status().as_u16(), answer.text().await.expect("body"))
    }

    async fn get_json(&self, path: &str, user: i64) -> Value {
        let (status, body) = self.get(path, Some(&Self::tma(user))).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).expect("JSON")
    }

    async fn post(&self, path: &str, authorization: Option<&str>, body: Value) -> (u16, String) {
        let mut request = self.http.post(format!("{}{path}", self.base)).json(&body);
        if let Some(value) = authorization {
            request = request.header("Authorization", value);
        }
        let answer = request.send().await.expect("POST");
        (answer.status().as_u16(), answer.text().await.expect("body"))
    }
}

/// `days` days of two analysed entries each for `user`, in the bot's database
/// (`seed_year` on SQLite; the same rows in PostgreSQL's dialect).
async fn seed(app: &MiniApp, user: i64, days: i64) {
    let url = &app.bot.env["DATABASE_URL"];
    if app.bot.backend == support::Backend::Sqlite {
        return seed_year(url, user, days).await;
    }
    let raw = support::Raw::connect(url).await;
    raw.exec(&format!(
        "INSERT INTO users (user_id, chat_id) VALUES ({user}, {user}) ON CONFLICT DO NOTHING"
    ))
    .await;
    raw.exec(&format!(
        "INSERT INTO day_logs (user_id, chat_id, message_id, text, created_at, status,
                               analysis, metrics, attempts, replied_at)
         SELECT {user}, {user}, 1000000 + i,
                CASE WHEN i % 2 = 0
                     THEN 'Morning ' || (i / 2) || ': coffee and a plan for the day.'
                     ELSE 'Evening ' || (i / 2) || ': ' ||
                          CASE WHEN (i / 2) % 7 = 3 THEN 'went running in the park'
                               ELSE 'read a book at home' END || '.' END,
                daylog_utc((date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
                           - make_interval(days => i / 2 + 1)
                           + make_interval(hours => CASE WHEN i % 2 = 0 THEN 8 ELSE 20 END)),
                'analyzed',
                'Analysis of entry ' || i || '.',
                json_build_object('mood', 1 + (i / 2) % 5, 'stress', 1 + (i * 3) % 5,
                            'energy', 1 + (i * 7) % 5, 'productivity', 3,
                            'sleep_hours', 5.0 + (i % 40) / 10.0,
                            'activities', CASE WHEN (i / 2) % 7 = 3 THEN json_build_array('run')
                                               ELSE json_build_array('reading') END,
                            'emotions', json_build_array('calm'), 'summary', 'Day ' || (i / 2),
                            'defaulted', json_build_array())::text,
                1, daylog_utc(now())
         FROM generate_series(0, {days} * 2 - 1) AS i"
    ))
    .await;
    raw.close().await;
}

const GETS: [&str; 9] = [
    "/app/api/me",
    "/app/api/entries",
    "/app/api/entries/1",
    "/app/api/days/2026-01-01",
    "/app/api/year",
    "/app/api/chart?days=30",
    "/app/api/search?q=coffee",
    "/app/api/nothing-here",
    "/app/api/entries?before=1&limit=5",
];
const POSTS: [&str; 3] = ["/app/api/settings", "/app/api/export", "/app/api/delete"];

#[test]
fn the_published_example_validates_with_its_token_and_no_other() {
    use daylog::webapp::init_data::{Refused, secret_key, validate};
    // docs.telegram-mini-apps.com's example initData ("Validating"), signed with a token of
    // our own by an outside implementation (Python's `hmac`), which reproduces the page's
    // published hash for the page's token (not kept: it has a real token's shape).
    let example = "query_id=AAHdF6IQAAAAAN0XohDhrOrc&user=%7B%22id%22%3A279058397%2C%22first_name%22%3A%22Vladislav%22%2C%22last_name%22%3A%22Kibenko%22%2C%22username%22%3A%22vdkfrost%22%2C%22language_code%22%3A%22ru%22%2C%22is_premium%22%3Atrue%7D&auth_date=1662771648&hash=8ed6af6611a85f760eb5e7b2b16447e8c792d4183911339dcea8b832379320a8";
    let token = "123456:known-answer-token";
    let day = Duration::from_secs(86_400);
    let signed = validate(example, &secret_key(token), 1_662_771_700, day).expect("valid");
    assert_eq!(signed.user_id.get(), 279_058_397);
    assert_eq!(
        validate(example, &secret_key(TOKEN), 1_662_771_700, day),
        Err(Refused::BadHash)
    );
    // Our own signing agrees with the check, `signature` included.
    let ours = init_data(TOKEN, 42, 1_700_000_000);
    assert!(ours.contains("signature="));
    let signed = validate(&ours, &secret_key(TOKEN), 1_700_000_000, day).expect("ours");
    assert_eq!(signed.user_id.get(), 42);
}

/// On each backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_refuses_a_request_without_valid_init_data_with_a_bare_401() {
    for backend in support::backends() {
        every_endpoint_refuses_on(backend).await;
    }
}

async fn every_endpoint_refuses_on(backend: support::Backend) {
    let app = MiniApp::start_on(backend, |env| {
        env.insert(
            "DAYLOG__TELEGRAM__ALLOWED_USERS".to_owned(),
            format!("[{ALICE}, {BOB}]"),
        );
    })
    .await;
    seed(&app, ALICE, 3).await;
    let now = now_unix();
    let good = init_data(TOKEN, ALICE, now);
    let tampered = good.replace(&format!("%22id%22%3A{ALICE}"), &format!("%22id%22%3A{BOB}"));
    assert_ne!(tampered, good);
    let refusals: Vec<(&str, Option<String>)> = vec![
        ("no header", None),
        ("another scheme", Some(format!("Bearer {good}"))),
        ("garbage", Some("tma not-init-data".to_owned())),
        (
            "another bot's token",
            Some(format!("tma {}", init_data("999:OTHER", ALICE, now))),
        ),
        (
            "too old",
            Some(format!("tma {}", init_data(TOKEN, ALICE, now - 25 * 3600))),
        ),
        (
            "from the future",
            Some(format!("tma {}", init_data(TOKEN, ALICE, now + 3600))),
        ),
        ("tampered", Some(format!("tma {tampered}"))),
        (
            "a duplicate key",
            Some(format!("tma {good}&auth_date={now}")),
        ),
        ("not an allowed user", Some(MiniApp::tma(MALLORY))),
    ];
    for (why, header) in &refusals {
        for path in GETS {
            let (status, body) = app.get(path, header.as_deref()).await;
            assert_eq!(
                (status, body.as_str()),
                (401, ""),
                "{backend}: GET {path}, {why}"
            );
        }
        for path in POSTS {
            let body = json!({"setting": "remind", "value": "21:30"});
            let (status, body) = app.post(path, header.as_deref(), body).await;
            assert_eq!((status, body.as_str()), (401, ""), "POST {path}, {why}");
        }
    }
    // Nothing happened on the refused requests: no reminder, no message, nothing deleted.
    assert_eq!(app.bot.count("SELECT count(*) FROM reminders").await, 0);
    assert!(app.bot.telegram.sent_to(ALICE).is_empty());
    assert_eq!(app.bot.count("SELECT count(*) FROM day_logs").await, 6);
    // The same requests with valid initData are served.
    let (status, _) = app
        .get("/app/api/entries", Some(&MiniApp::tma(ALICE)))
        .await;
    assert_eq!(status, 200);
    app.bot.stop().await;
}

/// On each backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_sees_only_their_own_journal_and_another_users_entry_is_404() {
    for backend in support::backends() {
        users_kept_apart_on(backend).await;
    }
}

async fn users_kept_apart_on(backend: support::Backend) {
    let app = MiniApp::start_on(backend, |_| {}).await;
    seed(&app, ALICE, 10).await;
    seed(&app, BOB, 10).await;
    app.bot
        .write(&format!(
            "UPDATE day_logs SET text = 'Bob''s secret: quokka' WHERE user_id = {BOB}"
        ))
        .await;
    let ids = |user: i64| format!("SELECT min(id) FROM day_logs WHERE user_id = {user}");
    let bobs = app.bot.count(&ids(BOB)).await;
    let alices = app.bot.count(&ids(ALICE)).await;

    let page = app.get_json("/app/api/entries?limit=100", ALICE).await;
    let entries = page["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 20, "{backend}");
    assert!(!page.to_string().contains("quokka"));
    // Newest first, with analysis, metrics and local time.
    assert!(
        entries[0]["text"]
            .as_str()
            .expect("text")
            .starts_with("Evening 0")
    );
    assert!(entries[0]["analysis"].is_string());
    assert!(entries[0]["metrics"]["line"].is_string());
    assert_eq!(entries[0]["time"], "20:00");
    // More on scroll: the page after the first five.
    let first = app.get_json("/app/api/entries?limit=5", ALICE).await;
    assert_eq!(first["more"], true);
    let last = first["entries"][4]["id"].as_i64().expect("id");
    let next = app
        .get_json(&format!("/app/api/entries?limit=5&before={last}"), ALICE)
        .await;
    assert_eq!(next["entries"][0]["id"], entries[5]["id"]);
    // Bob's id as a cursor finds nothing of Alice's or Bob's.
    let sneaky = app
        .get_json(&format!("/app/api/entries?before={bobs}"), ALICE)
        .await;
    assert_eq!(sneaky["entries"], json!([]));

    // One entry: Alice's is there; Bob's answers 404, as a missing one.
    let tma = MiniApp::tma(ALICE);
    let (status, _) = app
        .get(&format!("/app/api/entries/{alices}"), Some(&tma))
        .await;
    assert_eq!(status, 200);
    let (bob_status, bob_body) = app
        .get(&format!("/app/api/entries/{bobs}"), Some(&tma))
        .await;
    let (missing_status, missing_body) = app.get("/app/api/entries/999999999", Some(&tma)).await;
    assert_eq!((bob_status, bob_body.as_str()), (404, ""));
    assert_eq!((missing_status, missing_body), (bob_status, bob_body));

    // The day, the search and the year are Alice's alone.
    let today = entries[0]["day"].as_str().expect("a day").to_owned();
    let day = app.get_json(&format!("/app/api/days/{today}"), ALICE).await;
    assert_eq!(day["entries"].as_array().map(Vec::len), Some(2));
    assert!(!day.to_string().contains("quokka"));
    let found = app.get_json("/app/api/search?q=quokka", ALICE).await;
    assert_eq!(found["hits"], json!([]));
    let bob_found = app.get_json("/app/api/search?q=quokka", BOB).await;
    assert_eq!(bob_found["hits"].as_array().map(Vec::len), Some(5));
    let marked = &bob_found["hits"][0]["runs"];
    assert!(
        marked
            .as_array()
            .expect("runs")
            .iter()
            .any(|run| run["matched"] == true && run["text"] == "quokka"),
        "{marked}"
    );
    // The chart is SVG, drawn for the caller.
    let (status, svg) = app
        .get("/app/api/chart?days=90&lines=sleep&bg=101010", Some(&tma))
        .await;
    assert_eq!(status, 200);
    assert!(
        svg.starts_with("<svg") && svg.contains("#101010"),
        "{}",
        &svg[..80]
    );
    app.bot.stop().await;
}

/// On each backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_read_by_the_commands_own_rules() {
    for backend in support::backends() {
        settings_on(backend).await;
    }
}

async fn settings_on(backend: support::Backend) {
    let app = MiniApp::start_on(backend, |_| {}).await;
    let tma = MiniApp::tma(ALICE);
    let change = |setting: &str, value: &str| json!({"setting": setting, "value": value});
    let (status, said) = app
        .post("/app/api/settings", Some(&tma), change("remind", "25:99"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        app.bot.count("SELECT count(*) FROM reminders").await,
        0,
        "{said}"
    );
    let (status, said) = app
        .post("/app/api/settings", Some(&tma), change("remind", "21:30"))
        .await;
    assert_eq!(status, 200, "{said}");
    assert_eq!(
        app.bot
            .count(&format!(
                "SELECT count(*) FROM reminders WHERE user_id = {ALICE} AND local_time = '21:30' AND enabled = 1"
            ))
            .await,
        1
    );
    let (status, _) = app
        .post("/app/api/settings", Some(&tma), change("tz", "UTC+3"))
        .await;
    assert_eq!(status, 200);
    let me = app.get_json("/app/api/me", ALICE).await;
    assert_eq!(me["reminder"], "21:30", "{backend}");
    assert_ne!(me["zone"], "UTC");
    let (status, _) = app
        .post("/app/api/settings", Some(&tma), change("lang", "ru"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(app.get_json("/app/api/me", ALICE).await["language"], "ru");
    app.bot.stop().await;
}

/// On each backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_deletion_are_the_bots_own_in_the_private_chat() {
    for backend in support::backends() {
        export_and_deletion_on(backend).await;
    }
}

async fn export_and_deletion_on(backend: support::Backend) {
    let app = MiniApp::start_on(backend, |_| {}).await;
    seed(&app, ALICE, 5).await;
    let tma = MiniApp::tma(ALICE);

    let (status, _) = app.post("/app/api/export", Some(&tma), json!({})).await;
    assert_eq!(status, 200);
    let csv = app.bot.telegram.wait_file("SendDocument").await;
    assert!(
        String::from_utf8_lossy(&csv).contains("Evening 0"),
        "{backend}"
    );

    let (status, _) = app.post("/app/api/delete", Some(&tma), json!({})).await;
    assert_eq!(status, 200);
    let asked = app
        .bot
        .telegram
        .wait_for("the delete question", Duration::from_secs(10), |calls| {
            calls
                .iter()
                .any(|c| c.chat_id() == Some(ALICE) && c.body["reply_markup"].is_object())
        })
        .await;
    let question = asked
        .iter()
        .find(|c| c.chat_id() == Some(ALICE) && c.body["reply_markup"].is_object())
        .expect("question");
    let yes = question.body["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
        .as_str()
        .expect("a yes button")
        .to_owned();
    assert_eq!(yes, format!("delete:yes:{ALICE}"));
    // Nothing is deleted before the button is pressed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.bot.count("SELECT count(*) FROM day_logs").await, 10);
    app.bot
        .telegram
        .push_update(callback_update(ALICE, &yes, 1));
    support::wait_until("the deletion", Duration::from_secs(10), || async {
        app.bot.count("SELECT count(*) FROM day_logs").await == 0
    })
    .await;
    app.bot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_menu_button_and_app_open_the_page_in_a_private_chat_only() {
    use support::telegram::{group_text_update, text_update};
    let app = MiniApp::start(|_| {}).await;
    let telegram = &app.bot.telegram;
    let set = telegram
        .wait_for("the menu button", Duration::from_secs(10), |calls| {
            calls.iter().any(|c| c.method == "SetChatMenuButton")
        })
        .await;
    let button = &set
        .iter()
        .find(|c| c.method == "SetChatMenuButton")
        .expect("set")
        .body["menu_button"];
    assert_eq!(button["type"], "web_app");
    assert_eq!(button["web_app"]["url"], "https://journal.example.com/app");

    telegram.push_update(text_update(ALICE, 1, "/app"));
    let sent = telegram.wait_sent(ALICE, 1).await;
    let keyboard = &sent[0].body["reply_markup"]["inline_keyboard"][0][0];
    assert_eq!(
        keyboard["web_app"]["url"], "https://journal.example.com/app",
        "{:?}",
        sent[0].body
    );

    let group = -100_500;
    telegram.push_update(group_text_update(group, ALICE, 2, "/app"));
    let said = telegram.wait_sent(group, 1).await;
    assert!(said[0].body["reply_markup"].is_null());
    assert!(
        said[0].text().contains("private chat"),
        "{}",
        said[0].text()
    );
    app.bot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_url_the_menu_button_is_the_default_and_nothing_is_served() {
    use support::telegram::text_update;
    let bot = support::App::spawn().await;
    let set = bot
        .telegram
        .wait_for("the menu button", Duration::from_secs(10), |calls| {
            calls.iter().any(|c| c.method == "SetChatMenuButton")
        })
        .await;
    let button = &set
        .iter()
        .find(|c| c.method == "SetChatMenuButton")
        .expect("set")
        .body["menu_button"];
    assert_eq!(button["type"], "default");
    bot.telegram.push_update(text_update(ALICE, 1, "/app"));
    let sent = bot.telegram.wait_sent(ALICE, 1).await;
    assert!(sent[0].text().contains("not set up"), "{}", sent[0].text());
    let settings = support::settings(&bot.env);
    let app = daylog::app::App::build(settings).await.expect("app");
    let routes = app.mini_app().expect("routes");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, routes).await;
    });
    let status = reqwest::get(format!("{base}/app"))
        .await
        .expect("GET")
        .status();
    assert_eq!(status, 404);
    bot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_may_be_framed_by_telegram_web_and_loads_nothing_else() {
    let app = MiniApp::start(|_| {}).await;
    let answer = app
        .http
        .get(format!("{}/app", app.base))
        .send()
        .await
        .expect("GET /app");
    assert_eq!(answer.status(), 200);
    let csp = answer.headers()["content-security-policy"]
        .to_str()
        .expect("CSP")
        .to_owned();
    assert!(
        csp.contains("frame-ancestors 'self' https://web.telegram.org https://*.web.telegram.org"),
        "{csp}"
    );
    assert!(
        csp.contains("script-src 'self' https://telegram.org"),
        "{csp}"
    );
    assert!(answer.headers().get("x-frame-options").is_none());
    assert!(
        answer
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    let page = answer.text().await.expect("page");
    let hosts: Vec<&str> = page
        .match_indices("https://")
        .map(|(i, _)| &page[i..page[i..].find('"').map_or(page.len(), |end| i + end)])
        .collect();
    assert_eq!(hosts, ["https://telegram.org/js/telegram-web-app.js"]);
    let (status, _) = app.get("/app/api/me", Some(&MiniApp::tma(ALICE))).await;
    assert_eq!(status, 200);
    app.bot.stop().await;
}
