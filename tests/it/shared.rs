//! What several instances share through the database (docs/behaviour.md, "Several
//! instances"): one budget spent by three stores or three `Llm`s, never over; a
//! cooldown or a refused key found by one and skipped by another; no request while the
//! shared budgets cannot be checked, and the task taken when they can; a reminder, a
//! digest, a notice claimed once; `/import`'s window across a restart. The PostgreSQL
//! tests print one line and pass when no PostgreSQL is found (fail with `CI=true`, as
//! every PostgreSQL test does).

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use daylog::llm::{Admission, Admitted, Llm, Outcome, SharedLimits, Task};
use daylog::store::{ChatId, FrontEnd, NewUser, Store, UserId};
use wiremock::{MockServer, ResponseTemplate};

use crate::support::llm::*;
use crate::support::postgres::{Backend, FreshDb, Raw, backends};
use crate::support::wait_until;

const KEYS: [(&str, &str); 2] = [("A_API_KEY", "key-a"), ("B_API_KEY", "key-b")];

/// A fresh PostgreSQL database, or `None` (and one line saying so) without one.
async fn postgres() -> Option<FreshDb> {
    if backends().contains(&Backend::Postgres) {
        Some(Backend::Postgres.fresh().await)
    } else {
        #[expect(clippy::print_stderr, reason = "the one line saying what did not run")]
        {
            eprintln!("shared-state tests did not run: no PostgreSQL");
        }
        None
    }
}

async fn store(url: &str) -> Store {
    Store::open_and_migrate(url, Duration::from_secs(5))
        .await
        .expect("store opens")
}

/// A budget of `per_minute` requests a minute and `per_day` a day on provider `p`.
fn ask(per_minute: Option<u32>, per_day: Option<u32>) -> Admission<'static> {
    Admission {
        provider: "p",
        scope: "",
        model: "m",
        key_index: Some(0),
        forced: false,
        per_second: None,
        per_minute,
        per_day,
        day_reset_secs: 8 * 3600,
    }
}

/// 150 concurrent check-and-spends from three stores on one budget of 40: exactly 40
/// go through, whichever window (a minute, a day) is the one that binds, and every
/// refusal says how long.
#[tokio::test]
async fn three_stores_admitting_at_once_never_overspend_one_budget() {
    let Some(db) = postgres().await else { return };
    let stores = [
        store(&db.url).await,
        store(&db.url).await,
        store(&db.url).await,
    ];
    for (per_minute, per_day) in [(Some(40), None), (Some(1000), Some(40))] {
        Raw::connect(&db.url)
            .await
            .exec("DELETE FROM llm_shared_budgets")
            .await;
        let admitted = AtomicUsize::new(0);
        let asks = (0..150).map(|i| {
            let store = &stores[i % 3];
            let admitted = &admitted;
            async move {
                match store.admit(ask(per_minute, per_day)).await.expect("asked") {
                    Admitted::Yes => _ = admitted.fetch_add(1, Ordering::Relaxed),
                    Admitted::Budget(wait) => assert!(wait > Duration::ZERO),
                    other => panic!("not a budget answer: {other:?}"),
                }
            }
        });
        futures::future::join_all(asks).await;
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            40,
            "per minute {per_minute:?}, per day {per_day:?}"
        );
    }
}

/// What one answer taught (a 429's named reset) holds for every instance: another
/// store's admission is refused until then.
#[tokio::test]
async fn a_reset_learned_by_one_instance_holds_for_another() {
    let Some(db) = postgres().await else { return };
    let (one, other) = (store(&db.url).await, store(&db.url).await);
    assert_eq!(
        other.admit(ask(None, None)).await.expect("asked"),
        Admitted::Yes
    );
    one.learned(daylog::llm::Learned {
        provider: "p".into(),
        scope: String::new(),
        key_index: Some(0),
        spent_for: Some(Duration::from_secs(60)),
        daily: false,
        factor: 1.0,
    })
    .await
    .expect("learned");
    assert!(matches!(
        other.admit(ask(None, None)).await.expect("asked"),
        Admitted::Budget(wait) if wait > Duration::from_secs(50)
    ));
}

/// A whole model cooling (a dead primary, found by one instance) is said to be the
/// model's, not the asking key's: the asking instance then skips every key of it.
#[tokio::test]
async fn a_model_cooling_is_answered_as_the_models() {
    let Some(db) = postgres().await else { return };
    let (one, other) = (store(&db.url).await, store(&db.url).await);
    one.cooled(daylog::llm::Cooled {
        provider: "p".into(),
        model: "m".into(),
        key: None,
        cool_for: Duration::from_secs(60),
        refused: false,
    })
    .await
    .expect("cooled");
    assert!(matches!(
        other.admit(ask(None, None)).await.expect("asked"),
        Admitted::ModelCooling(wait) if wait > Duration::from_secs(50)
    ));
}

/// Provider `a` (with `budget` lines) then a healthy `b`; steps a/m1 then b/m2.
fn config(a: &MockServer, budget: &str, b: &MockServer, deadline_ms: u64) -> String {
    let mut toml = FAST_RETRY.replace(
        "deadline_ms = 20000",
        &format!("deadline_ms = {deadline_ms}"),
    );
    toml.push_str(&provider("a", "openai", &format!("{}/v1", a.uri())));
    toml.push_str(&format!("[providers.a.budget]\n{budget}\n"));
    toml.push_str(&provider("b", "openai", &format!("{}/v1", b.uri())));
    toml.push_str(&analysis_steps(&[("a", "m1"), ("b", "m2")]));
    toml
}

fn shared_llm(toml: &str, store: &Store) -> Llm {
    Llm::new(&settings(toml, &KEYS))
        .expect("llm")
        .sharing(Arc::new(store.clone()))
}

/// A key the provider refused (401) at one instance is not sent on by another: it is
/// skipped as cooling, and the other step answers.
#[tokio::test]
async fn a_key_refused_at_one_instance_is_skipped_by_another() {
    let Some(db) = postgres().await else { return };
    let a = server_with(ResponseTemplate::new(401).set_body_string("{}")).await;
    let b = ok_server().await;
    let toml = config(&a, "", &b, 20_000);
    let (one_store, other_store) = (store(&db.url).await, store(&db.url).await);
    let (one, other) = (
        shared_llm(&toml, &one_store),
        shared_llm(&toml, &other_store),
    );
    let sink = RecordingSink::default();

    let first = one
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("b answers");
    assert_eq!(first.provider, "b");
    assert_eq!(calls(&a).await, 1);
    let raw = Raw::connect(&db.url).await;
    wait_until("the refusal is shared", Duration::from_secs(10), || async {
        raw.value::<i64>("SELECT count(*) FROM llm_shared_cooldowns WHERE refused = 1")
            .await
            > 0
    })
    .await;

    let other_sink = RecordingSink::default();
    let second = other
        .run(Task::Analysis, &request(false), &other_sink)
        .await
        .expect("b answers");
    assert_eq!(second.provider, "b");
    assert_eq!(
        calls(&a).await,
        1,
        "the other instance did not try the refused key"
    );
    assert_eq!(other_sink.count("m1", Outcome::SkippedCooldown), 1);
}

/// A model that failed `failures_to_trip` times in a row at one instance (a dead
/// primary) is skipped by another, which pays nothing for it.
#[tokio::test]
async fn a_dead_primary_found_by_one_instance_is_skipped_by_another() {
    let Some(db) = postgres().await else { return };
    let a = server_with(ResponseTemplate::new(503).set_body_string("{}")).await;
    let b = ok_server().await;
    let toml = config(&a, "", &b, 20_000);
    let (one_store, other_store) = (store(&db.url).await, store(&db.url).await);
    let (one, other) = (
        shared_llm(&toml, &one_store),
        shared_llm(&toml, &other_store),
    );
    let sink = RecordingSink::default();
    let first = one
        .run(Task::Analysis, &request(false), &sink)
        .await
        .expect("b answers");
    assert_eq!(first.provider, "b");
    let paid = calls(&a).await;
    assert!(
        paid >= 3,
        "the first instance found it dead: {paid} attempts"
    );
    let raw = Raw::connect(&db.url).await;
    wait_until(
        "the cooldown is shared",
        Duration::from_secs(10),
        || async {
            raw.value::<i64>("SELECT count(*) FROM llm_shared_cooldowns WHERE until > now()")
                .await
                > 0
        },
    )
    .await;

    let other_sink = RecordingSink::default();
    let second = other
        .run(Task::Analysis, &request(false), &other_sink)
        .await
        .expect("b answers");
    assert_eq!(second.provider, "b");
    assert_eq!(
        calls(&a).await,
        paid,
        "the other instance sent nothing to it"
    );
    assert_eq!(other_sink.count("m1", Outcome::SkippedCooldown), 1);
}

/// A fake free tier: `limit` requests a minute, a 429 (that names nothing) past it.
struct FreeTier {
    limit: usize,
    sent: std::sync::Mutex<Vec<Instant>>,
    refused: AtomicUsize,
}

/// The fake free tier as wiremock's responder (the test keeps its own handle).
struct Tier(Arc<FreeTier>);

impl wiremock::Respond for Tier {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        let now = Instant::now();
        let tier = &self.0;
        let mut sent = tier.sent.lock().expect("lock");
        sent.retain(|at| now.duration_since(*at) < Duration::from_secs(60));
        if sent.len() >= tier.limit {
            tier.refused.fetch_add(1, Ordering::Relaxed);
            return ResponseTemplate::new(429).set_body_string("{\"message\":\"slow down\"}");
        }
        sent.push(now);
        json_reply(200, "openai/chat_completion.json")
    }
}

async fn free_tier(limit: usize) -> (MockServer, Arc<FreeTier>) {
    let tier = Arc::new(FreeTier {
        limit,
        sent: std::sync::Mutex::new(Vec::new()),
        refused: AtomicUsize::new(0),
    });
    let server = MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(Tier(Arc::clone(&tier)))
        .mount(&server)
        .await;
    (server, tier)
}

/// A burst of 30 tasks on a free tier of 5 a minute, through `llms` in turn (all at
/// once): the 429s the free tier gave.
async fn burst(llms: &[Llm], tier: &FreeTier) -> usize {
    let sink = RecordingSink::default();
    let tasks = (0..30).map(|i| {
        let llm = &llms[i % llms.len()];
        let sink = &sink;
        async move {
            llm.run(Task::Analysis, &request(false), sink)
                .await
                .expect("an answer");
        }
    });
    futures::future::join_all(tasks).await;
    tier.refused.load(Ordering::Relaxed)
}

/// Three instances spend one free-tier budget: a burst through three `Llm`s sharing
/// the database gets no more 429s than through one (and the free tier is used to its
/// limit, the rest spilling over to the next step).
#[tokio::test]
async fn a_burst_through_three_instances_gets_no_more_429s_than_through_one() {
    let Some(db) = postgres().await else { return };
    let store = store(&db.url).await;
    let b = ok_server().await;

    let (alone, alone_tier) = free_tier(5).await;
    let one = [Llm::new(&settings(
        &config(&alone, "requests_per_minute = 5", &b, 20_000),
        &KEYS,
    ))
    .expect("llm")];
    let refused_alone = burst(&one, &alone_tier).await;

    let (a, tier) = free_tier(5).await;
    let toml = config(&a, "requests_per_minute = 5", &b, 20_000);
    let three = [
        shared_llm(&toml, &store),
        shared_llm(&toml, &store),
        shared_llm(&toml, &store),
    ];
    let refused_three = burst(&three, &tier).await;

    assert!(
        refused_three <= refused_alone,
        "three instances: {refused_three} 429s, one: {refused_alone}"
    );
    assert_eq!(
        calls(&a).await - refused_three,
        5,
        "the free tier is used to its limit"
    );
}

/// While the shared budgets cannot be checked (the database refuses connections) no
/// request is sent, on any step; the task waits, and is answered once the database is
/// back.
#[tokio::test]
async fn with_the_database_gone_nothing_is_sent_and_the_task_is_answered_when_it_returns() {
    let Some(db) = postgres().await else { return };
    let store = store(&db.url).await;
    let a = ok_server().await;
    let b = ok_server().await;
    let llm = Arc::new(shared_llm(&config(&a, "", &b, 60_000), &store));
    let mut admin_url = url::Url::parse(&db.url).expect("url");
    let name = admin_url.path().trim_start_matches('/').to_owned();
    admin_url.set_path("/postgres");
    let admin = Raw::connect(admin_url.as_str()).await;
    admin
        .exec(&format!(
            "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS false"
        ))
        .await;
    admin
        .exec(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ))
        .await;

    let sink = Arc::new(RecordingSink::default());
    let task = {
        let (llm, sink) = (Arc::clone(&llm), Arc::clone(&sink));
        tokio::spawn(async move {
            llm.run(Task::Analysis, &request(false), sink.as_ref())
                .await
        })
    };
    wait_until(
        "the task asked and was held",
        Duration::from_secs(20),
        || async {
            sink.count("m1", Outcome::SkippedBudget) + sink.count("m2", Outcome::SkippedBudget) >= 3
        },
    )
    .await;
    assert_eq!(
        calls(&a).await + calls(&b).await,
        0,
        "nothing sent unchecked"
    );

    admin
        .exec(&format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS true"))
        .await;
    let answer = task
        .await
        .expect("task")
        .expect("answered once the database is back");
    assert_eq!(answer.provider, "a");
    assert_eq!(calls(&a).await, 1);
}

async fn user(store: &Store, user_id: i64) {
    store
        .upsert_user(&NewUser {
            user_id: UserId(user_id),
            username: Some("someone"),
            language: daylog::language::Language::En,
        })
        .await
        .expect("user");
}

/// A reminder due at two instances at once is moved on as sent by one of them only.
#[tokio::test]
async fn a_reminder_claimed_by_two_at_once_is_sent_once() {
    for backend in backends() {
        let db = backend.fresh().await;
        let (one, other) = (store(&db.url).await, store(&db.url).await);
        user(&one, 1).await;
        let at = |text: &str| -> jiff::Timestamp { text.parse().expect("moment") };
        let now = at("2026-12-01T21:05:00Z");
        let time = daylog::time::LocalTime::parse("21:00").expect("time");
        one.set_reminder(UserId(1), time, at("2026-12-01T21:00:00Z"), now)
            .await
            .expect("set");
        let day: jiff::civil::Date = "2026-12-01".parse().expect("day");
        // Both read it due before either moves it on.
        let mut seen = Vec::new();
        for store in [&one, &other] {
            seen.push((
                store,
                store.due_reminders(now, 10).await.expect("due").remove(0),
            ));
        }
        let claims = seen.into_iter().map(|(store, due)| async move {
            store
                .advance_reminder(
                    UserId(1),
                    &due.next_due_at,
                    Some(day),
                    at("2026-12-02T21:00:00Z"),
                )
                .await
                .expect("advance")
        });
        let won = futures::future::join_all(claims).await;
        assert_eq!(won.iter().filter(|w| **w).count(), 1, "{backend}: {won:?}");
    }
}

/// A pending digest listed by two instances' workers at once is claimed by one.
#[tokio::test]
async fn a_digest_listed_by_two_workers_is_claimed_by_one() {
    let Some(db) = postgres().await else { return };
    let (one, other) = (store(&db.url).await, store(&db.url).await);
    user(&one, 1).await;
    let week: jiff::civil::Date = "2026-11-23".parse().expect("day");
    let (digest, _) = one
        .insert_digest(UserId(1), ChatId(1), week, FrontEnd::Telegram, None)
        .await
        .expect("stored");
    let hold = Duration::from_secs(300);
    let claims = [&one, &other]
        .map(|store| async move { store.claim_digest(digest.id, hold).await.expect("claim") });
    let claimed = futures::future::join_all(claims).await;
    assert_eq!(claimed.iter().filter(|c| c.is_some()).count(), 1);
    assert!(
        other
            .claim_digest(digest.id, hold)
            .await
            .expect("claim")
            .is_none(),
        "held"
    );
}

/// What is said once is claimed once by two instances at once, and again once it was
/// forgotten (it did not get through).
#[tokio::test]
async fn a_notice_is_said_once_across_instances() {
    for backend in backends() {
        let db = backend.fresh().await;
        let (one, other) = (store(&db.url).await, store(&db.url).await);
        let says = [&one, &other].map(|store| store.say_once("refused", "-100"));
        let said = futures::future::join_all(says).await;
        let said: Vec<bool> = said.into_iter().map(|s| s.expect("said")).collect();
        assert_eq!(
            said.iter().filter(|s| **s).count(),
            1,
            "{backend}: {said:?}"
        );
        assert!(!one.say_once("refused", "-100").await.expect("said"));
        assert!(
            one.say_once("album", "-100").await.expect("said"),
            "another notice"
        );
        other.forget_said("refused", "-100").await.expect("forgot");
        assert!(one.say_once("refused", "-100").await.expect("said"));
    }
}

/// `/import`'s window is stored: a store opened after a restart takes it, once.
#[tokio::test]
async fn the_import_window_survives_a_restart() {
    for backend in backends() {
        let db = backend.fresh().await;
        let asked: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().expect("moment");
        let before = store(&db.url).await;
        before.ask_import(UserId(5), asked).await.expect("asked");
        before.close().await;
        let after = store(&db.url).await;
        assert_eq!(after.take_import_ask(UserId(6)).await.expect("read"), None);
        assert_eq!(
            after.take_import_ask(UserId(5)).await.expect("read"),
            Some(asked),
            "{backend}"
        );
        assert_eq!(
            after.take_import_ask(UserId(5)).await.expect("read"),
            None,
            "taken"
        );
    }
}

/// Telegram's 429 recorded by one instance holds a chat for another (PostgreSQL), and
/// only that chat.
#[tokio::test]
async fn a_telegram_hold_recorded_by_one_instance_is_seen_by_another() {
    let Some(db) = postgres().await else { return };
    let (one, other) = (store(&db.url).await, store(&db.url).await);
    assert_eq!(
        other.telegram_hold(Some(ChatId(7))).await.expect("read"),
        None
    );
    one.hold_telegram(Some(ChatId(7)), Duration::from_secs(30))
        .await
        .expect("held");
    let hold = other.telegram_hold(Some(ChatId(7))).await.expect("read");
    assert!(
        hold.is_some_and(|h| h > Duration::from_secs(20)),
        "{hold:?}"
    );
    assert_eq!(
        other.telegram_hold(Some(ChatId(8))).await.expect("read"),
        None
    );
}

/// Blocks (several requests counted in one check-and-spend): 150 concurrent claims of
/// up to 8 from three stores on one budget of 40 are granted exactly 40 in all —
/// whichever window binds — each claim at least one or none, never more than it asked.
#[tokio::test]
async fn blocks_claimed_at_once_by_three_stores_never_overspend_one_budget() {
    let Some(db) = postgres().await else { return };
    let stores = [
        store(&db.url).await,
        store(&db.url).await,
        store(&db.url).await,
    ];
    for (per_minute, per_day) in [(Some(40), None), (Some(1000), Some(40))] {
        Raw::connect(&db.url)
            .await
            .exec("DELETE FROM llm_shared_budgets")
            .await;
        let granted = AtomicUsize::new(0);
        let asks = (0..150).map(|i| {
            let store = &stores[i % 3];
            let granted = &granted;
            async move {
                let (answer, n) = store
                    .admit_block(ask(per_minute, per_day), 8, Duration::from_millis(100))
                    .await
                    .expect("asked");
                match answer {
                    Admitted::Yes => {
                        assert!((1..=8).contains(&n), "{n}");
                        granted.fetch_add(n as usize, Ordering::Relaxed);
                    }
                    Admitted::Budget(wait) => assert!(wait > Duration::ZERO && n == 0),
                    other => panic!("not a budget answer: {other:?}"),
                }
            }
        });
        futures::future::join_all(asks).await;
        assert_eq!(
            granted.load(Ordering::Relaxed),
            40,
            "per minute {per_minute:?}, per day {per_day:?}"
        );
    }
}

/// The shared database as a store, counting the check-and-spends asked of it.
struct Counting {
    store: Store,
    asked: AtomicUsize,
}

impl SharedLimits for Counting {
    fn admit<'a>(
        &'a self,
        ask: Admission<'a>,
    ) -> futures::future::BoxFuture<'a, Result<Admitted, String>> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        self.store.admit(ask)
    }
    fn admit_block<'a>(
        &'a self,
        ask: Admission<'a>,
        want: u32,
        hold: Duration,
    ) -> futures::future::BoxFuture<'a, Result<(Admitted, u32), String>> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        self.store.admit_block(ask, want, hold)
    }
    fn admit_tokens<'a>(
        &'a self,
        ask: Admission<'a>,
        tokens: daylog::llm::TokensAsk,
    ) -> futures::future::BoxFuture<'a, Result<Admitted, String>> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        self.store.admit_tokens(ask, tokens)
    }
    fn admit_tokens_block<'a>(
        &'a self,
        ask: Admission<'a>,
        tokens: daylog::llm::TokensAsk,
        want: u32,
        hold: Duration,
    ) -> futures::future::BoxFuture<'a, Result<(Admitted, u32), String>> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        self.store.admit_tokens_block(ask, tokens, want, hold)
    }
    fn learned(
        &self,
        learned: daylog::llm::Learned,
    ) -> futures::future::BoxFuture<'static, Result<(), String>> {
        self.store.learned(learned)
    }
    fn cooled(
        &self,
        cooled: daylog::llm::Cooled,
    ) -> futures::future::BoxFuture<'static, Result<(), String>> {
        self.store.cooled(cooled)
    }
    fn recovered(
        &self,
        cooled: daylog::llm::Cooled,
    ) -> futures::future::BoxFuture<'static, Result<(), String>> {
        self.store.recovered(cooled)
    }
}

/// 60 tasks at once on a budget with room for many (600 a minute): the database is
/// asked far fewer times than there are requests (the budget claimed in blocks), and
/// every request is counted there. On a free tier's few (5 a minute) each request is
/// asked for alone.
#[tokio::test]
async fn a_large_budget_is_claimed_in_blocks_and_a_small_one_request_by_request() {
    let Some(db) = postgres().await else { return };
    let b = ok_server().await;
    for per_minute in [600, 5] {
        let counting = Arc::new(Counting {
            store: store(&db.url).await,
            asked: AtomicUsize::new(0),
        });
        Raw::connect(&db.url)
            .await
            .exec("DELETE FROM llm_shared_budgets")
            .await;
        let a = ok_server().await;
        let llm = Llm::new(&settings(
            &config(
                &a,
                &format!("requests_per_minute = {per_minute}"),
                &b,
                20_000,
            ),
            &KEYS,
        ))
        .expect("llm")
        .sharing(Arc::clone(&counting) as Arc<dyn SharedLimits>);
        let sink = RecordingSink::default();
        let asking = request(false);
        let tasks = (0..60).map(|_| llm.run(Task::Analysis, &asking, &sink));
        for answer in futures::future::join_all(tasks).await {
            answer.expect("an answer");
        }
        let asked = counting.asked.load(Ordering::Relaxed);
        let sent_to_a = calls(&a).await;
        if per_minute == 600 {
            assert_eq!(sent_to_a, 60, "every request on the large budget");
            assert!(asked < 60 / 4, "asked {asked} times for 60 requests");
        } else {
            assert!(asked >= sent_to_a, "asked {asked} for {sent_to_a}");
            assert_eq!(sent_to_a, 5, "the small budget used to its limit, no more");
        }
        let counted: i64 = Raw::connect(&db.url)
            .await
            .value("SELECT coalesce(sum(cardinality(sends)), 0)::BIGINT FROM llm_shared_budgets")
            .await;
        assert!(
            counted >= i64::try_from(sent_to_a).expect("small"),
            "{counted} counted for {sent_to_a} sent"
        );
    }
}

/// A fake provider whose every answer says it took `used` tokens.
async fn taking(used: u64) -> MockServer {
    let body = fixture("openai/chat_completion.json")
        .replace("\"total_tokens\": 50", &format!("\"total_tokens\": {used}"));
    assert!(
        body.contains(&format!("\"total_tokens\": {used}")),
        "{body}"
    );
    server_with(ResponseTemplate::new(200).set_body_raw(body, "application/json")).await
}

/// The tokens the shared database counts in the last minute, over every budget.
async fn tokens_counted(url: &str) -> i64 {
    Raw::connect(url)
        .await
        .value(
            "SELECT coalesce(sum(k), 0)::BIGINT FROM llm_shared_tokens,
                    unnest(at, n) AS e(a, k) WHERE a > now() - interval '1 minute'",
        )
        .await
}

/// One tokens-per-minute budget spent by three instances: a burst of 30 analyses
/// through three `Llm`s sharing the database sends the provider no more tokens in the
/// minute than the budget declares (each answer takes less than its estimate), and
/// the rest spill over to the next step. Each instance counting alone sent all 30.
#[tokio::test]
async fn three_instances_spend_one_tokens_per_minute_budget_together() {
    let Some(db) = postgres().await else { return };
    let store = store(&db.url).await;
    let b = ok_server().await;
    let (used, per_minute) = (200, 2000);
    let a = taking(used).await;
    let toml = config(&a, &format!("tokens_per_minute = {per_minute}"), &b, 20_000);
    let llms = [
        shared_llm(&toml, &store),
        shared_llm(&toml, &store),
        shared_llm(&toml, &store),
    ];
    let sink = RecordingSink::default();
    let asking = request(false);
    let tasks = (0..30).map(|i| llms[i % 3].run(Task::Analysis, &asking, &sink));
    for answer in futures::future::join_all(tasks).await {
        answer.expect("an answer");
    }
    let sent = u64::try_from(calls(&a).await).expect("small");
    assert!(sent > 0, "the budget is used");
    assert!(
        sent * used <= per_minute,
        "{sent} answers of {used} tokens on a budget of {per_minute} a minute"
    );
    assert_eq!(
        calls(&b).await + calls(&a).await,
        30,
        "the rest spilled over"
    );
}

/// A tokens-per-minute budget large enough to be claimed in blocks (20 000 a minute,
/// over 32 requests' estimates): three instances sending 150 requests at once ask the
/// database far fewer times than they send, each block's tokens counted with it, and
/// the provider still gets no more tokens in the minute than the budget declares; the
/// rest spill over to the next step.
#[tokio::test]
async fn three_instances_claim_a_large_tokens_budget_in_blocks_and_never_overspend_it() {
    let Some(db) = postgres().await else { return };
    let b = ok_server().await;
    let (used, per_minute) = (200, 20_000);
    let a = taking(used).await;
    let toml = config(&a, &format!("tokens_per_minute = {per_minute}"), &b, 20_000);
    let counting: Vec<Arc<Counting>> = futures::future::join_all((0..3).map(|_| async {
        Arc::new(Counting {
            store: store(&db.url).await,
            asked: AtomicUsize::new(0),
        })
    }))
    .await;
    let llms: Vec<Llm> = counting
        .iter()
        .map(|c| {
            Llm::new(&settings(&toml, &KEYS))
                .expect("llm")
                .sharing(Arc::clone(c) as Arc<dyn SharedLimits>)
        })
        .collect();
    let sink = RecordingSink::default();
    let asking = request(false);
    let tasks = (0..150).map(|i| llms[i % 3].run(Task::Analysis, &asking, &sink));
    for answer in futures::future::join_all(tasks).await {
        answer.expect("an answer");
    }
    let sent = u64::try_from(calls(&a).await).expect("small");
    let asked: usize = counting
        .iter()
        .map(|c| c.asked.load(Ordering::Relaxed))
        .sum();
    assert!(sent >= 32, "the budget is used: {sent} sent");
    assert!(
        sent * used <= per_minute,
        "{sent} answers of {used} tokens on a budget of {per_minute} a minute"
    );
    // Asked request by request, every request sent is one ask (and a refused one
    // more); in blocks, fewer asks than requests (how many fewer depends on how the
    // 150 tasks meet each block, 100 ms long, on a loaded machine).
    assert!(
        asked < usize::try_from(sent).expect("small"),
        "asked {asked} times for {sent} requests"
    );
    assert!(
        tokens_counted(&db.url).await >= i64::try_from(sent * used).expect("small"),
        "every request's tokens counted"
    );
    assert_eq!(
        calls(&b).await + calls(&a).await,
        150,
        "the rest spilled over"
    );
}

/// What answers really took moves the shared count: a request's estimate is counted
/// when it is admitted, and its answer's correction (more, or less) with the next
/// admission of that budget. The budget (5 000 a minute, under 32 estimates) is asked
/// request by request.
#[tokio::test]
async fn answers_set_the_shared_tokens_right_with_the_next_admission() {
    let Some(db) = postgres().await else { return };
    let store = store(&db.url).await;
    let b = ok_server().await;
    let sink = RecordingSink::default();
    let asking = request(false);
    for (used, more) in [(900_u64, true), (10, false)] {
        Raw::connect(&db.url)
            .await
            .exec("DELETE FROM llm_shared_tokens")
            .await;
        let a = taking(used).await;
        let llm = shared_llm(&config(&a, "tokens_per_minute = 5000", &b, 20_000), &store);
        llm.run(Task::Analysis, &asking, &sink)
            .await
            .expect("an answer");
        let estimate = tokens_counted(&db.url).await;
        assert!(estimate > 10 && estimate < 900, "the estimate: {estimate}");
        // The first answer's correction goes with the second admission.
        llm.run(Task::Analysis, &asking, &sink)
            .await
            .expect("an answer");
        let used = i64::try_from(used).expect("small");
        assert_eq!(
            tokens_counted(&db.url).await,
            used + estimate,
            "took {} than estimated",
            if more { "more" } else { "less" }
        );
        assert_eq!(calls(&a).await, 2);
    }
}

/// 150 concurrent check-and-spends of 400 tokens from three stores on a budget of
/// 6000 tokens a minute: exactly 15 go through (counted with their requests, in every
/// window or none), and an older instance's `daylog_admit` beside them still works.
#[tokio::test]
async fn three_stores_counting_tokens_at_once_never_overspend_them() {
    let Some(db) = postgres().await else { return };
    let stores = [
        store(&db.url).await,
        store(&db.url).await,
        store(&db.url).await,
    ];
    let tokens = daylog::llm::TokensAsk {
        per_minute: 6000,
        tokens: 400,
        add: 0,
        give_back: 0,
    };
    let admitted = AtomicUsize::new(0);
    let asks = (0..150).map(|i| {
        let store = &stores[i % 3];
        let admitted = &admitted;
        async move {
            match store
                .admit_tokens(ask(Some(1000), None), tokens)
                .await
                .expect("asked")
            {
                Admitted::Yes => _ = admitted.fetch_add(1, Ordering::Relaxed),
                Admitted::Budget(wait) => assert!(wait > Duration::ZERO),
                other => panic!("not a budget answer: {other:?}"),
            }
        }
    });
    futures::future::join_all(asks).await;
    assert_eq!(admitted.load(Ordering::Relaxed), 15);
    assert_eq!(tokens_counted(&db.url).await, 6000);
    // A correction that gives back 1000 makes room for two more.
    let give_back = daylog::llm::TokensAsk {
        give_back: 1000,
        ..tokens
    };
    assert_eq!(
        stores[0]
            .admit_tokens(ask(Some(1000), None), give_back)
            .await
            .expect("asked"),
        Admitted::Yes
    );
    assert_eq!(
        stores[1]
            .admit_tokens(ask(Some(1000), None), tokens)
            .await
            .expect("asked"),
        Admitted::Yes
    );
    assert!(matches!(
        stores[2].admit_tokens(ask(Some(1000), None), tokens).await,
        Ok(Admitted::Budget(_))
    ));
    // The previous release's call counts the same budget's requests beside them.
    assert_eq!(
        stores[0].admit(ask(Some(1000), None)).await.expect("asked"),
        Admitted::Yes
    );
    let sends: i64 = Raw::connect(&db.url)
        .await
        .value("SELECT coalesce(sum(cardinality(sends)), 0)::BIGINT FROM llm_shared_budgets")
        .await;
    assert_eq!(sends, 18, "15 + 2 with their tokens, 1 without");
}
