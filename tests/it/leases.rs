//! Work done under a claim several instances share, when the claim runs out in the
//! middle of it (docs/behaviour.md, "Several instances"): a digest whose claim another
//! instance took while it was being written is written and sent by that one only.
//! PostgreSQL only (SQLite has one instance, whose claims are in memory): without one
//! the test prints one line and passes (fails with `CI=true`).

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use daylog::digest::Digests;
use daylog::frontend::{Messenger, Response, SendError, Target};
use daylog::llm::Llm;
use daylog::store::{
    ChatId, DigestClaim, DigestId, DigestStatus, FrontEnd, NewUser, Store, UserId,
};
use daylog::time::{SystemClock, UserZone};
use daylog::users::Users;
use wiremock::{MockServer, ResponseTemplate};

use crate::support::llm::*;
use crate::support::postgres::{Backend, FreshDb, backends};

/// A fresh PostgreSQL database, or `None` (and one line saying so) without one.
async fn postgres() -> Option<FreshDb> {
    if backends().contains(&Backend::Postgres) {
        Some(Backend::Postgres.fresh().await)
    } else {
        #[expect(clippy::print_stderr, reason = "the one line saying what did not run")]
        {
            eprintln!("lease tests did not run: no PostgreSQL");
        }
        None
    }
}

async fn store(url: &str) -> Store {
    Store::open_and_migrate(url, Duration::from_secs(5))
        .await
        .expect("store opens")
}

/// A front end that counts what it was asked to send.
#[derive(Default)]
struct Recorder(Mutex<usize>);

impl Messenger for Recorder {
    async fn send(&self, _: Target, _: Vec<Response>) -> Result<(), SendError> {
        *self.0.lock().expect("lock") += 1;
        Ok(())
    }
    async fn typing(&self, _chat_id: daylog::domain::ChatId) {}
}

/// The provider, which answers only after another instance (a store of its own)
/// claimed the digest, this instance's claim having run out meanwhile (its
/// `next_attempt_at` set back: the write took longer than the claim).
struct SlowWrite {
    url: String,
    digest: DigestId,
    other: Arc<Mutex<Option<DigestClaim>>>,
}

impl wiremock::Respond for SlowWrite {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        let (url, digest) = (self.url.clone(), self.digest);
        // Its own runtime on a thread of its own: the responder is not async.
        let claim = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let other = store(&url).await;
                let pool = sqlx::PgPool::connect(&url).await.expect("pool");
                sqlx::query(
                    "UPDATE digests SET next_attempt_at = daylog_utc(now() - interval '1 second')
                     WHERE id = $1",
                )
                .bind(digest.get())
                .execute(&pool)
                .await
                .expect("ran out");
                let claimed = other
                    .claim_digest(digest, Duration::from_secs(300))
                    .await
                    .expect("claim");
                other.close().await;
                claimed.map(|(_, claim)| claim)
            })
        })
        .join()
        .expect("the other instance's claim");
        *self.other.lock().expect("lock") = claim;
        json_reply(200, "openai/chat_completion.json")
    }
}

/// A digest whose claim ran out while it was written and was claimed by another
/// instance: its text is not stored and it is not sent here; the other instance's
/// claim still holds it (that one writes and sends it, once).
#[tokio::test]
async fn a_digest_claimed_by_another_instance_while_it_was_written_is_not_sent_here() {
    let Some(db) = postgres().await else { return };
    let store = store(&db.url).await;
    store
        .upsert_user(&NewUser {
            user_id: UserId(1),
            username: Some("someone"),
            language: daylog::language::Language::En,
        })
        .await
        .expect("user");
    let week: jiff::civil::Date = "2026-11-23".parse().expect("day");
    let (digest, _) = store
        .insert_digest(UserId(1), ChatId(1), week, FrontEnd::Telegram, None)
        .await
        .expect("stored");
    let other = Arc::new(Mutex::new(None));
    let provider = MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(SlowWrite {
            url: db.url.clone(),
            digest: digest.id,
            other: Arc::clone(&other),
        })
        .mount(&provider)
        .await;
    let toml = one_step("openai", &format!("{}/v1", provider.uri()), "m");
    let settings = settings(&toml, &[("P_API_KEY", "key")]);
    let llm = Arc::new(Llm::new(&settings).expect("llm"));
    let users = Users::new(store.clone(), Arc::new(SystemClock), UserZone::utc(), 4);
    let digests = Arc::new(Digests::new(
        store.clone(),
        users,
        llm,
        settings.worker.clone(),
    ));
    let recorder = Arc::new(Recorder::default());
    let mut tasks = tokio::task::JoinSet::new();
    let permits = Arc::new(tokio::sync::Semaphore::new(4));
    digests
        .deliver_due(&recorder, FrontEnd::Telegram, &mut tasks, &permits)
        .await;
    while tasks.join_next().await.is_some() {}
    let claim = other.lock().expect("lock").take();
    let mut claim = claim.expect("the other instance claimed it while it was written");
    assert_eq!(*recorder.0.lock().expect("lock"), 0, "not sent here");
    let row = store
        .digest_of_week(UserId(1), week)
        .await
        .expect("read")
        .expect("the digest");
    assert_eq!(row.status, DigestStatus::Pending);
    assert_eq!(row.text, None, "its text is the other instance's to store");
    assert!(
        store
            .keep_digest_claim(digest.id, &mut claim, Duration::from_secs(300))
            .await
            .expect("asked"),
        "the other instance's claim stands"
    );
}

/// A claim that ran out and was taken by another instance holds nothing any more:
/// checked before a send it says so, and the text it would store is not stored; the
/// new claim holds.
#[tokio::test]
async fn a_digest_claim_taken_by_another_instance_no_longer_holds() {
    let Some(db) = postgres().await else { return };
    let (one, other) = (store(&db.url).await, store(&db.url).await);
    one.upsert_user(&NewUser {
        user_id: UserId(1),
        username: None,
        language: daylog::language::Language::En,
    })
    .await
    .expect("user");
    let week: jiff::civil::Date = "2026-11-23".parse().expect("day");
    let (digest, _) = one
        .insert_digest(UserId(1), ChatId(1), week, FrontEnd::Telegram, None)
        .await
        .expect("stored");
    let hold = Duration::from_secs(300);
    // A claim that runs out at once, then another instance's.
    let (_, mut first) = one
        .claim_digest(digest.id, Duration::ZERO)
        .await
        .expect("claim")
        .expect("due");
    let (_, mut second) = other
        .claim_digest(digest.id, hold)
        .await
        .expect("claim")
        .expect("ran out");
    assert!(
        !one.store_claimed_digest_text(digest.id, "A week.", "0:", &first)
            .await
            .expect("asked"),
        "not stored under a claim taken over"
    );
    assert!(
        !one.keep_digest_claim(digest.id, &mut first, hold)
            .await
            .expect("asked"),
        "not sent under a claim taken over"
    );
    assert!(
        other
            .keep_digest_claim(digest.id, &mut second, hold)
            .await
            .expect("asked")
    );
    assert!(
        other
            .store_claimed_digest_text(digest.id, "A week.", "0:", &second)
            .await
            .expect("asked")
    );
}

/// The leases an earlier version took for updates without a chat (made-up keys far
/// below any chat id) are deleted once run out; a chat's lease row stays.
#[tokio::test]
async fn run_out_leases_of_updates_without_a_chat_are_deleted() {
    for backend in backends() {
        let db = backend.fresh().await;
        let store = store(&db.url).await;
        let me = store
            .register_instance(&daylog::store::NewInstance {
                version: "test",
                host: "here",
                pid: 1,
                mode: "webhook",
            })
            .await
            .expect("registered");
        let made_up = (i64::MIN / 2).saturating_sub(7);
        for key in [made_up, -1_001_234, 42] {
            store
                .take_chat_lease(key, me, Duration::ZERO)
                .await
                .expect("take")
                .expect("free");
        }
        assert_eq!(
            store.forget_chatless_leases().await.expect("deleted"),
            1,
            "{backend}"
        );
        assert!(
            store
                .chat_lease_left(made_up)
                .await
                .expect("read")
                .is_none(),
            "{backend}"
        );
        assert!(
            store.chat_lease_left(42).await.expect("read").is_some(),
            "{backend}"
        );
    }
}

/// A front end whose send never ends (Telegram's `retry_after` waited out again and
/// again), counting the sends it was asked for.
#[derive(Default)]
struct Stuck(Mutex<usize>);

impl Messenger for Stuck {
    async fn send(&self, _: Target, _: Vec<Response>) -> Result<(), SendError> {
        *self.0.lock().expect("lock") += 1;
        std::future::pending().await
    }
    async fn typing(&self, _chat_id: daylog::domain::ChatId) {}
}

/// A digest's send is bounded inside the claim renewed for it: one that has not ended
/// by then is given up as a transient failure (the digest stays pending, retried later
/// under a new claim) instead of going out after another instance claimed and sent it.
#[tokio::test]
async fn a_digest_send_that_outlasts_its_claim_is_given_up_for_a_later_try() {
    for backend in backends() {
        let db = backend.fresh().await;
        let store = store(&db.url).await;
        store
            .upsert_user(&NewUser {
                user_id: UserId(1),
                username: None,
                language: daylog::language::Language::En,
            })
            .await
            .expect("user");
        let week: jiff::civil::Date = "2026-11-23".parse().expect("day");
        let (digest, _) = store
            .insert_digest(UserId(1), ChatId(1), week, FrontEnd::Telegram, None)
            .await
            .expect("stored");
        assert!(
            store
                .store_digest_text(digest.id, "A week.", "0:")
                .await
                .expect("written")
        );
        // Never asked: the digest is written.
        let toml = one_step("openai", "http://127.0.0.1:9/v1", "m");
        let settings = settings(&toml, &[("P_API_KEY", "key")]);
        let llm = Arc::new(Llm::new(&settings).expect("llm"));
        let users = Users::new(store.clone(), Arc::new(SystemClock), UserZone::utc(), 4);
        let digests = Arc::new(
            Digests::new(store.clone(), users, llm, settings.worker.clone())
                .send_within(Duration::from_millis(50)),
        );
        let stuck = Arc::new(Stuck::default());
        let mut tasks = tokio::task::JoinSet::new();
        let permits = Arc::new(tokio::sync::Semaphore::new(4));
        digests
            .deliver_due(&stuck, FrontEnd::Telegram, &mut tasks, &permits)
            .await;
        while tasks.join_next().await.is_some() {}
        assert_eq!(*stuck.0.lock().expect("lock"), 1, "{backend}: sent once");
        let row = store
            .digest_of_week(UserId(1), week)
            .await
            .expect("read")
            .expect("the digest");
        assert_eq!(row.status, DigestStatus::Pending, "{backend}");
        assert_eq!(row.text.as_deref(), Some("A week."), "{backend}");
        assert!(
            store.due_digest(digest.id).await.expect("read").is_none(),
            "{backend}: tried again later, not at once"
        );
        store.close().await;
    }
}
