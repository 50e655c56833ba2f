//! The Mini App in a real browser (docs/behaviour.md, The Mini App): the real `daylog
//! run` binary with a seeded year (365 days, two entries a day) in its database, and
//! the page opened in headless Chromium as Telegram opens it (`#tgWebAppData=…`). It
//! shows the journal, opens a day from the calendar, switches a chart, finds an entry
//! by another form of a word, changes the reminder (the store then has it), and asks
//! for deletion (the question arrives in the fake Telegram chat; nothing is deleted);
//! initData signed by another token, too old, or tampered with gets one sentence and a
//! 401. Each state's screenshot goes to `target/webapp-screens/` (or
//! `$CARGO_TARGET_DIR/webapp-screens/`), with the page's own timings in `timings.json`.
//!
//! Without Chromium and chromedriver the test says so in one line and passes; with
//! `CI=true` it fails.

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support;
use support::browser::{Browser, free_port, init_data, screens_dir, seed_year};
use support::telegram::{TOKEN, now_unix};
use support::{FakeTelegram, Providers, spawn_daylog, test_env};

const ALICE: i64 = 6_200_001;
const SEEDED_DAYS: i64 = 365;

/// The page's address for `init_data`, as Telegram Desktop opens it (dark theme).
fn page_url(base: &str, init_data: &str) -> String {
    let encode =
        |text: &str| url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
    let theme = json!({"bg_color": "#17212b", "text_color": "#f5f5f5", "hint_color": "#708499",
        "button_color": "#5288c1", "button_text_color": "#ffffff", "secondary_bg_color": "#232e3c",
        "link_color": "#6ab3f3"});
    format!(
        "{base}/app#tgWebAppData={}&tgWebAppVersion=7.0&tgWebAppPlatform=tdesktop&tgWebAppThemeParams={}",
        encode(init_data),
        encode(&theme.to_string())
    )
}

/// The real binary serving the Mini App on a port of its own.
struct Served {
    telegram: FakeTelegram,
    _providers: Providers,
    _dir: tempfile::TempDir,
    _bot: support::Bot,
    env: HashMap<String, String>,
    base: String,
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let db_url = format!("sqlite://{}/daylog.db", dir.path().display());
    let mut env = test_env(&db_url, &telegram, &providers);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    env.insert("DAYLOG__HTTP__LISTEN".into(), format!("127.0.0.1:{port}"));
    env.insert("DAYLOG__WEBAPP__URL".into(), format!("{base}/app"));
    let log = support::bot_log_path(&env);
    let bot = spawn_daylog(&env, &log);
    let client = reqwest::Client::new();
    support::wait_until("the Mini App's listener", Duration::from_secs(60), || {
        let client = client.clone();
        let url = format!("{base}/readyz");
        async move {
            client
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    })
    .await;
    seed_year(&db_url, ALICE, SEEDED_DAYS).await;
    Served {
        telegram,
        _providers: providers,
        _dir: dir,
        _bot: bot,
        env,
        base,
    }
}

async fn count(env: &HashMap<String, String>, sql: &str) -> i64 {
    let pool = sqlx::SqlitePool::connect(&env["DATABASE_URL"])
        .await
        .expect("reader");
    let n = sqlx::query_scalar(sql).fetch_one(&pool).await.expect(sql);
    pool.close().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mini_app_in_headless_chromium() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let served = serve().await;
    let screens = screens_dir();
    let shots = |name: &str| (screens.clone(), name.to_owned());

    // The journal, newest first; more on scroll.
    browser
        .goto(&page_url(
            &served.base,
            &init_data(TOKEN, ALICE, now_unix()),
        ))
        .await;
    browser
        .wait_for("the journal", "return document.body.dataset.state === 'journal' && document.querySelectorAll('#entries .entry').length >= 20")
        .await;
    let first = browser
        .eval(
            "return document.querySelector('#entries .entry .text').textContent",
            json!([]),
        )
        .await;
    assert_eq!(first, "Evening 0: read a book at home.");
    let timings = browser
        .eval(
            "const p = (n) => (performance.getEntriesByName(n)[0] || {}).startTime || null;
             return {journal_shown_ms: p('journal-shown'), first_contentful_paint_ms: p('first-contentful-paint'),
                     dom_content_loaded_ms: performance.timing.domContentLoadedEventEnd - performance.timing.navigationStart};",
            json!([]),
        )
        .await;
    std::fs::write(screens.join("timings.json"), timings.to_string()).expect("timings");
    let (dir, name) = shots("1-journal");
    browser.screenshot(&dir, &name).await;
    browser
        .eval("window.scrollTo(0, document.body.scrollHeight)", json!([]))
        .await;
    browser
        .wait_for(
            "the next page",
            "return document.querySelectorAll('#entries .entry').length > 20",
        )
        .await;

    // The calendar: the square of the newest entry's day opens that day's two entries.
    let today = browser
        .eval(
            "return document.querySelector('#entries .entry .when').textContent.slice(0, 10)",
            json!([]),
        )
        .await;
    let today = today.as_str().expect("a day").to_owned();
    browser.click("[data-tab=calendar]").await;
    browser
        .wait_for(
            "the year in pixels",
            "return document.querySelectorAll('#pixels .cell[data-day]').length >= 365",
        )
        .await;
    browser
        .click(&format!("#pixels .cell[data-day='{today}']"))
        .await;
    browser
        .wait_for("the day's entries", &format!("return document.getElementById('day-entries').dataset.day === '{today}' && document.querySelectorAll('#day-entries .entry').length === 2"))
        .await;
    let (dir, name) = shots("2-calendar-day");
    browser.screenshot(&dir, &name).await;

    // Charts: a month of scores, then a year, then sleep.
    browser.click("[data-tab=charts]").await;
    browser
        .wait_for(
            "the chart",
            "return document.getElementById('chart').dataset.shown === 'scores-30'",
        )
        .await;
    browser.click("[data-days='365']").await;
    browser
        .wait_for(
            "the year's chart",
            "return document.getElementById('chart').dataset.shown === 'scores-365'",
        )
        .await;
    browser.click("[data-lines='sleep']").await;
    browser
        .wait_for(
            "the sleep chart",
            "return document.getElementById('chart').dataset.shown === 'sleep-365'",
        )
        .await;
    let (dir, name) = shots("3-chart-sleep-365");
    browser.screenshot(&dir, &name).await;

    // Search by another form of the word: "runs" finds "running", marked.
    browser.click("[data-tab=search]").await;
    browser.fill("#q", "runs").await;
    browser.click("#search-form button").await;
    let marked = browser
        .wait_for(
            "the search hits",
            "const m = document.querySelector('#hits mark'); return m && m.textContent",
        )
        .await;
    assert_eq!(marked, "running");
    let (dir, name) = shots("4-search");
    browser.screenshot(&dir, &name).await;

    // The reminder, changed in place: the store has it.
    browser.click("[data-tab=settings]").await;
    browser.fill("#reminder", "21:45").await;
    browser.click("#save-reminder").await;
    browser
        .wait_for(
            "the bot's answer",
            "return document.getElementById('settings-message').textContent",
        )
        .await;
    let reminder = format!(
        "SELECT count(*) FROM reminders WHERE user_id = {ALICE} AND local_time = '21:45' AND enabled = 1"
    );
    assert_eq!(count(&served.env, &reminder).await, 1);
    let (dir, name) = shots("5-settings");
    browser.screenshot(&dir, &name).await;

    // The language, changed in place: the page speaks it at once.
    browser.fill("#lang", "ru").await;
    browser.click("form[data-setting='lang'] button").await;
    browser
        .wait_for(
            "the page in Russian",
            "return document.querySelector('[data-tab=journal]').textContent === 'Записи'",
        )
        .await;
    let (dir, name) = shots("5b-settings-russian");
    browser.screenshot(&dir, &name).await;

    // Deletion: the page asks, the bot asks again in the chat; nothing is deleted.
    browser.click("#delete").await;
    browser.click("#delete-yes").await;
    browser
        .wait_for(
            "the page's answer",
            "return document.getElementById('data-message').textContent",
        )
        .await;
    served
        .telegram
        .wait_for("the delete question", Duration::from_secs(20), |calls| {
            calls.iter().any(|c| {
                c.chat_id() == Some(ALICE)
                    && c.body["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
                        == format!("delete:yes:{ALICE}")
            })
        })
        .await;
    assert_eq!(
        count(&served.env, "SELECT count(*) FROM day_logs").await,
        SEEDED_DAYS * 2
    );
    let (dir, name) = shots("6-delete-asked");
    browser.screenshot(&dir, &name).await;

    // Refusals: one sentence, no data, and the API said 401.
    let now = now_unix();
    let good = init_data(TOKEN, ALICE, now);
    let refused = [
        (
            "7-refused-other-token",
            init_data("999:OTHER-token", ALICE, now),
        ),
        (
            "8-refused-too-old",
            init_data(TOKEN, ALICE, now - 25 * 3600),
        ),
        (
            "9-refused-tampered",
            good.replace("%22id%22%3A6200001", "%22id%22%3A6200002"),
        ),
    ];
    for (name, data) in refused {
        assert_ne!(data, good);
        browser.goto("about:blank").await;
        browser.goto(&page_url(&served.base, &data)).await;
        let said = browser
            .wait_for(name, "return document.body.dataset.state === 'refused' && document.getElementById('notice').textContent")
            .await;
        assert!(
            said.as_str()
                .is_some_and(|s| s.contains("opens from the bot")),
            "{said}"
        );
        let api = browser
            .eval("return document.body.dataset.api", json!([]))
            .await;
        assert_eq!(api, Value::from("401"), "{name}");
        let shown = browser
            .eval(
                "return document.querySelectorAll('.entry').length",
                json!([]),
            )
            .await;
        assert_eq!(shown, json!(0), "{name}");
        let (dir, shot) = shots(name);
        browser.screenshot(&dir, &shot).await;
    }
}

/// Users of the API benchmark, each with a seeded year, asking at once.
const BENCH_USERS: i64 = 50;
/// Requests per user in each half of the benchmark.
const BENCH_ROUNDS: usize = 20;
/// Page loads timed in Chromium.
const BENCH_LOADS: usize = 10;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

fn summary(mut ms: Vec<f64>) -> Value {
    ms.sort_by(f64::total_cmp);
    json!({"n": ms.len(), "p50_ms": percentile(&ms, 0.5), "p95_ms": percentile(&ms, 0.95), "max_ms": ms.last()})
}

/// BENCHMARKS.md, "The Mini App": the journal page's first paint with a seeded year in
/// headless Chromium, and `GET /app/api/entries` at 50 concurrent users against
/// `/history 20` through the bot for the same users, in one run. Writes
/// `webapp-screens/benchmark.json`; run it with
/// `cargo test --release --test it webapp_browser::benchmark -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run on demand (BENCHMARKS.md)"]
async fn benchmark_page_and_api_against_history() {
    let served = serve().await;
    for user in 1..BENCH_USERS {
        seed_year(&served.env["DATABASE_URL"], ALICE + user, SEEDED_DAYS).await;
    }
    let mut result =
        json!({"users": BENCH_USERS, "rounds": BENCH_ROUNDS, "entries_per_user": SEEDED_DAYS * 2});

    // The page: navigation start → the journal shown (a mark the page sets), and FCP.
    if let Some(browser) = Browser::start().await {
        let mut shown = Vec::new();
        let mut fcp = Vec::new();
        for _ in 0..BENCH_LOADS {
            browser.goto("about:blank").await;
            browser
                .goto(&page_url(
                    &served.base,
                    &init_data(TOKEN, ALICE, now_unix()),
                ))
                .await;
            let t = browser
                .wait_for("the journal", "const s = performance.getEntriesByName('journal-shown')[0]; const f = performance.getEntriesByName('first-contentful-paint')[0]; return s && f && [s.startTime, f.startTime]")
                .await;
            shown.push(t[0].as_f64().unwrap_or(f64::NAN));
            fcp.push(t[1].as_f64().unwrap_or(f64::NAN));
        }
        result["page_journal_shown"] = summary(shown);
        result["page_first_contentful_paint"] = summary(fcp);
    }

    // The API: 50 users at once, each asking for its newest entries in a loop: 20 (a
    // page of the journal) and 5 (what `/history` shows by default).
    for limit in [20, 5] {
        let (ms, wall) = ask_api(&served.base, limit).await;
        result[format!("api_entries_{limit}")] = summary(ms);
        result[format!("api_entries_{limit}")]["wall_s"] = json!(wall);
    }

    // The baseline: `/history` (5 entries, one message) through the bot for the same
    // users at once, from the update's push to the reply the fake Telegram receives.
    let started = std::time::Instant::now();
    let telegram = &served.telegram;
    let asks = (0..BENCH_USERS).map(|user| async move {
        let chat = ALICE + user;
        let mut ms = Vec::new();
        for round in 0..BENCH_ROUNDS {
            let at = std::time::Instant::now();
            telegram.push_update(support::telegram::text_update(
                chat,
                i64::try_from(round).unwrap_or(0) + 1,
                "/history",
            ));
            telegram.wait_sent(chat, round + 1).await;
            ms.push(at.elapsed().as_secs_f64() * 1000.0);
        }
        ms
    });
    let history: Vec<f64> = futures::future::join_all(asks).await.concat();
    for user in 0..BENCH_USERS {
        let sent = telegram.sent_to(ALICE + user).len();
        assert_eq!(sent, BENCH_ROUNDS, "one message per /history");
    }
    result["bot_history"] = summary(history);
    result["bot_history"]["wall_s"] = json!(started.elapsed().as_secs_f64());
    let ratio = |p: &str| {
        result["api_entries_5"][p].as_f64().unwrap_or(f64::NAN)
            / result["bot_history"][p].as_f64().unwrap_or(f64::NAN)
    };
    let (p50, p95) = (ratio("p50_ms"), ratio("p95_ms"));
    result["api_vs_history_p50"] = json!(p50);
    result["api_vs_history_p95"] = json!(p95);
    std::fs::write(screens_dir().join("benchmark.json"), result.to_string()).expect("written");
}

/// `GET /app/api/entries?limit=…` by [`BENCH_USERS`] users at once, [`BENCH_ROUNDS`]
/// each: every latency in ms, and the wall time in s.
async fn ask_api(base: &str, limit: u32) -> (Vec<f64>, f64) {
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    let asks = (0..BENCH_USERS).map(|user| {
        let client = client.clone();
        let url = format!("{base}/app/api/entries?limit={limit}");
        let tma = format!("tma {}", init_data(TOKEN, ALICE + user, now_unix()));
        async move {
            let mut ms = Vec::new();
            for _ in 0..BENCH_ROUNDS {
                let at = std::time::Instant::now();
                let answer = client
                    .get(&url)
                    .header("Authorization", &tma)
                    .send()
                    .await
                    .expect("GET");
                assert_eq!(answer.status(), 200);
                let _ = answer.bytes().await.expect("body");
                ms.push(at.elapsed().as_secs_f64() * 1000.0);
            }
            ms
        }
    });
    let ms = futures::future::join_all(asks).await.concat();
    (ms, started.elapsed().as_secs_f64())
}
