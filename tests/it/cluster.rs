//! Several instances on one database: the store's side (instances, chat leases and
//! their fencing, the polling lock, the upgrade policy) on each backend, and the
//! daemon's side with real binaries (a second `daylog run` on one SQLite file).

#![expect(
    clippy::expect_used,
    reason = "helpers outside #[test] fns fail loudly by design"
)]

use std::time::Duration;

use daylog::store::{
    ChatId, Fence, InstanceId, LogId, MessageId, NewInstance, NewLog, NewUpdate, Store, StoreError,
    UpdateKey, UserId,
};

use crate::support::postgres::{Backend, FreshDb, Raw, backends, on_each_backend};

struct TestDb {
    _db: FreshDb,
    backend: Backend,
    url: String,
    store: Store,
}

async fn fresh_on(backend: Backend) -> TestDb {
    let db = backend.fresh().await;
    let url = db.url.clone();
    let store = Store::open_and_migrate(&url, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("store opens on {backend}: {e}"));
    TestDb {
        _db: db,
        backend,
        url,
        store,
    }
}

/// A short lease: the store takes any; the settings' bounds are the daemon's.
const LEASE: Duration = Duration::from_millis(300);

async fn instance(store: &Store, mode: &str) -> InstanceId {
    store
        .register_instance(&NewInstance {
            version: "test",
            host: "here",
            pid: 1,
            mode,
        })
        .await
        .expect("registered")
}

/// Takes `chat`'s lease for `who`, waiting (a generous limit) until it can.
async fn take_when_free(store: &Store, chat: i64, who: InstanceId) -> Fence {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(fence) = store.take_chat_lease(chat, who, LEASE).await.expect("take") {
            return fence;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stored_update(store: &Store, update_id: i64, chat: i64) -> UpdateKey {
    store
        .insert_updates(
            1,
            &[NewUpdate {
                update_id,
                chat_id: Some(chat),
                user_id: Some(chat),
                payload: "{}",
            }],
        )
        .await
        .expect("stored");
    UpdateKey {
        bot_id: 1,
        update_id,
    }
}

async fn handled(db: &TestDb, update_id: i64) -> bool {
    let raw = Raw::connect(&db.url).await;
    let count: i64 = raw
        .value(&format!(
            "SELECT count(*) FROM updates WHERE update_id = {update_id} AND handled_at IS NOT NULL"
        ))
        .await;
    raw.close().await;
    count == 1
}

on_each_backend! {
    /// One holder at a time; the holder renews without a new generation; another takes
    /// the chat only once the lease ran out, with the next generation; from then on the
    /// old holder's fenced writes change nothing, the new holder's go through.
    async fn a_chat_lease_is_held_by_one_and_a_take_over_fences_the_old_holder(db: TestDb) {
    let store = &db.store;
    let (a, b) = (instance(store, "webhook").await, instance(store, "webhook").await);
    let first = store.take_chat_lease(7, a, LEASE).await.expect("take").expect("free");
    assert_eq!(first.generation, 1, "{}", db.backend);
    assert_eq!(store.take_chat_lease(7, b, LEASE).await.expect("take"), None, "held by a");
    let again = store.take_chat_lease(7, a, LEASE).await.expect("take").expect("mine");
    assert_eq!(again, first, "the holder renews, same generation");
    assert!(store.renew_chat_lease(&first, LEASE).await.expect("renew"));
    let update = stored_update(store, 100, 7).await;

    let taken = take_when_free(store, 7, b).await;
    assert_eq!(taken.generation, 2, "a take-over raises the generation");
    assert!(!store.renew_chat_lease(&first, LEASE).await.expect("renew"), "lost");
    assert!(store.heartbeat(a, LEASE, &[7]).await.expect("beat").is_empty(), "a holds nothing");
    assert!(!store.fence_holds(&first).await.expect("check"));
    assert!(
        !store.mark_update_handled_fenced(update, &first).await.expect("mark"),
        "the old holder's mark is refused"
    );
    assert!(!handled(&db, 100).await, "and wrote nothing");
    assert!(store.mark_update_handled_fenced(update, &taken).await.expect("mark"));
    assert!(handled(&db, 100).await);
    assert!(
        store.mark_update_handled_fenced(update, &taken).await.expect("mark"),
        "marking again under the lease is no error"
    );
    }
}

on_each_backend! {
    /// A transaction's write under a lease checks it first: after a take-over it is
    /// refused whole (`Fenced`), and nothing of it is written.
    async fn a_fenced_write_after_a_take_over_is_refused_and_writes_nothing(db: TestDb) {
    let store = &db.store;
    let (a, b) = (instance(store, "webhook").await, instance(store, "webhook").await);
    store
        .upsert_user(&daylog::store::NewUser {
            user_id: UserId(9),
            username: None,
            language: daylog::language::Language::En,
        })
        .await
        .expect("user");
    let id: LogId = store
        .insert_log(&NewLog {
            user_id: UserId(9),
            chat_id: ChatId(9),
            message_id: MessageId(1),
            text: "a day",
            local_day: None,
            written_at: None,
        })
        .await
        .expect("log")
        .id();
    let outcome = daylog::domain::Outcome::Failed(daylog::domain::Failure::GaveUp);
    assert!(store.record(id, "a day", &outcome).await.expect("record"));
    let old = store.take_chat_lease(9, a, LEASE).await.expect("take").expect("free");
    let new = take_when_free(store, 9, b).await;
    let refused = store.mark_replied_fenced(id, &old).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { chat_id: 9 })),
        "{refused:?}"
    );
    let log = store.log(id).await.expect("read").expect("row");
    assert_eq!(log.replied_at, None, "nothing written under the old lease");
    store.mark_replied_fenced(id, &new).await.expect("the holder writes");
    let log = store.log(id).await.expect("read").expect("row");
    assert!(log.replied_at.is_some());
    }
}

on_each_backend! {
    /// What answering an entry writes among instances — its outcome and the record of
    /// its answer — is checked against the chat's lease in the write itself: under the
    /// lease it goes through; after a take-over the old holder's outcome is refused
    /// (`false`: it sends nothing), and its records of answers sent are refused and
    /// named, while the other answers of the same group commit (another chat's, or sent
    /// under no lease) are recorded.
    async fn an_answers_outcome_and_record_are_written_only_under_the_chats_lease(db: TestDb) {
    let store = &db.store;
    let (a, b) = (instance(store, "webhook").await, instance(store, "webhook").await);
    let mut ids = Vec::new();
    for chat in [21, 22, 23] {
        store
            .upsert_user(&daylog::store::NewUser {
                user_id: UserId(chat),
                username: None,
                language: daylog::language::Language::En,
            })
            .await
            .expect("user");
        let id: LogId = store
            .insert_log(&NewLog {
                user_id: UserId(chat),
                chat_id: ChatId(chat),
                message_id: MessageId(1),
                text: "a day",
                local_day: None,
                written_at: None,
            })
            .await
            .expect("log")
            .id();
        ids.push(id);
    }
    let outcome = daylog::domain::Outcome::Failed(daylog::domain::Failure::GaveUp);
    let old = store.take_chat_lease(21, a, LEASE).await.expect("take").expect("free");
    let kept = store.take_chat_lease(22, a, Duration::from_secs(600)).await.expect("take").expect("free");
    let new = take_when_free(store, 21, b).await;

    assert!(
        !store.record_under(ids[0], "a day", &outcome, Some(&old)).await.expect("record"),
        "{}: the old holder's outcome is refused",
        db.backend
    );
    let log = store.log(ids[0]).await.expect("read").expect("row");
    assert_eq!(log.status.as_str(), "pending", "nothing written under the old lease");
    assert!(store.record_under(ids[0], "a day", &outcome, Some(&new)).await.expect("record"));
    assert!(store.record_under(ids[1], "a day", &outcome, Some(&kept)).await.expect("record"));
    assert!(store.record(ids[2], "a day", &outcome).await.expect("record"));

    let taken = store
        .mark_replied_all(&[(ids[0], Some(old)), (ids[1], Some(kept)), (ids[2], None)])
        .await
        .expect("recorded");
    assert_eq!(taken, [ids[0]], "{}: the one sent under a lease taken over", db.backend);
    let replied = |id: LogId| async move {
        store.log(id).await.expect("read").expect("row").replied_at.is_some()
    };
    assert!(!replied(ids[0]).await, "not recorded under the old lease");
    assert!(replied(ids[1]).await);
    assert!(replied(ids[2]).await);
    assert_eq!(
        store.mark_replied_all(&[(ids[0], Some(new))]).await.expect("recorded"),
        [],
        "the holder records it"
    );
    assert!(replied(ids[0]).await);
    }
}

on_each_backend! {
    /// A lease given up is free at once; a clean stop gives up every lease of the
    /// instance and it no longer counts as alive; the heartbeat renews what it holds
    /// in hand, and a lease given up stays given up.
    async fn a_released_lease_and_a_stopped_instances_chats_are_free_at_once(db: TestDb) {
    let store = &db.store;
    let (a, b) = (instance(store, "polling").await, instance(store, "webhook").await);
    assert_eq!(store.alive_instances(LEASE * 10).await.expect("count"), 2);
    let one = store.take_chat_lease(1, a, LEASE * 100).await.expect("take").expect("free");
    let two = store.take_chat_lease(2, a, LEASE * 100).await.expect("take").expect("free");
    let held = store.heartbeat(a, LEASE * 100, &[1, 2]).await.expect("beat");
    assert_eq!(held.len(), 2, "{held:?}");
    store.release_chat_lease(&one).await.expect("release");
    let held = store.heartbeat(a, LEASE * 100, &[2]).await.expect("beat");
    assert_eq!(held, vec![two], "a lease given up is not renewed by the next beat");
    let taken = store.take_chat_lease(1, b, LEASE).await.expect("take").expect("released");
    assert_eq!(taken.generation, 2);
    store.instance_stopped(a).await.expect("stopped");
    let taken = store.take_chat_lease(2, b, LEASE).await.expect("take").expect("given up");
    assert_eq!(taken.generation, two.generation + 1);
    assert_eq!(store.alive_instances(LEASE * 10).await.expect("count"), 1);
    let rows = store.instances().await.expect("rows");
    assert_eq!(rows.len(), 2);
    assert!(rows[0].stopped_at.is_some() && rows[1].stopped_at.is_none());
    assert_eq!((rows[0].mode.as_str(), rows[0].version.as_str()), ("polling", "test"));
    }
}

on_each_backend! {
    /// Two instances taking the same chats at the same moment: each chat gets exactly
    /// one holder.
    async fn instances_taking_the_same_chats_at_once_get_one_holder_each(db: TestDb) {
    let store = &db.store;
    let (a, b) = (instance(store, "webhook").await, instance(store, "webhook").await);
    let take_all = |who: InstanceId| {
        let store = store.clone();
        async move {
            let mut won = Vec::new();
            for chat in 0..40 {
                if store.take_chat_lease(chat, who, LEASE * 100).await.expect("take").is_some() {
                    won.push(chat);
                }
            }
            won
        }
    };
    let (mut by_a, by_b) = tokio::join!(take_all(a), take_all(b));
    by_a.extend(&by_b);
    by_a.sort_unstable();
    assert_eq!(by_a, (0..40).collect::<Vec<_>>(), "{}", db.backend);
    }
}

on_each_backend! {
    /// The upgrade policy: a schema a newer build migrated is run beside when each of
    /// its unknown migrations is additive, refused ("newer daylog") otherwise.
    async fn a_newer_schema_is_run_beside_only_when_its_new_migrations_are_additive(db: TestDb) {
    let future = |version: i64, description: &str| match db.backend {
        Backend::Sqlite => format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES ({version}, '{description}', 1, x'00', 0)"
        ),
        Backend::Postgres => format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES ({version}, '{description}', true, '\\x00'::bytea, 0)"
        ),
    };
    let raw = Raw::connect(&db.url).await;
    raw.exec(&future(99990101000000, "shared budgets additive")).await;
    let beside = Store::open_and_migrate(&db.url, Duration::from_secs(5)).await;
    assert!(beside.is_ok(), "{}: {:?}", db.backend, beside.err());
    let beside = beside.expect("opened");
    beside.ensure_migrated().await.expect("runs beside an additive migration");
    beside.close().await;
    raw.exec(&future(99990102000000, "drop a column")).await;
    let refused = Store::open_and_migrate(&db.url, Duration::from_secs(5)).await;
    assert!(
        matches!(refused, Err(StoreError::NewerSchema { found: 99990102000000, .. })),
        "{:?}",
        refused.err()
    );
    raw.close().await;
    }
}

/// PostgreSQL: a write transaction that checked its lease keeps the lease row locked
/// until it ends, so a take-over arriving in between waits for the fenced writes to
/// commit instead of landing between the check and the commit (the check takes the row
/// `FOR SHARE`; without it the take-over goes through at once).
#[tokio::test]
async fn a_take_over_waits_for_a_fenced_transaction_that_checked_its_lease() {
    use sqlx::Connection as _;
    for backend in backends() {
        if backend != Backend::Postgres {
            continue;
        }
        let db = fresh_on(backend).await;
        let store = &db.store;
        let (a, b) = (
            instance(store, "webhook").await,
            instance(store, "webhook").await,
        );
        let fence = store
            .take_chat_lease(11, a, LEASE)
            .await
            .expect("take")
            .expect("free");
        let mut writer = sqlx::PgConnection::connect(&db.url).await.expect("connect");
        sqlx::query("BEGIN")
            .execute(&mut writer)
            .await
            .expect("begin");
        let held: i64 = sqlx::query_scalar(store.fence_check_statement())
            .bind(fence.chat_id)
            .bind(fence.holder.0)
            .bind(fence.generation)
            .fetch_one(&mut writer)
            .await
            .expect("check");
        assert_eq!(held, 1, "the lease is a's when it checks");
        let raw = Raw::connect(&db.url).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while raw
            .value::<i64>(
                "SELECT count(*) FROM chat_leases
                 WHERE chat_id = 11 AND expires_at > daylog_utc_ms(now())",
            )
            .await
            > 0
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lease never ran out"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let taker = store.clone();
        let take = tokio::spawn(async move { taker.take_chat_lease(11, b, LEASE).await });
        loop {
            assert!(
                !take.is_finished(),
                "the take-over went through while a's fenced transaction was open"
            );
            let waiting: i64 = raw
                .value(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .await;
            if waiting > 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "nothing waited");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sqlx::query("COMMIT")
            .execute(&mut writer)
            .await
            .expect("commit");
        let taken = take
            .await
            .expect("joined")
            .expect("take")
            .expect("expired: b takes it");
        assert_eq!(taken.generation, fence.generation + 1);
        assert!(!store.fence_holds(&fence).await.expect("check"));
        raw.close().await;
        let _ = writer.close().await;
    }
}

/// One polling instance per PostgreSQL database: the advisory lock is held by one
/// store at a time and free again once its holder lets go (or its process ends).
#[tokio::test]
async fn one_polling_lock_per_postgres_database() {
    for backend in backends() {
        let db = fresh_on(backend).await;
        let other = Store::open(&db.url, Duration::from_secs(5))
            .await
            .expect("second store");
        let mut first = db
            .store
            .try_polling_lock()
            .await
            .expect("lock")
            .expect("free");
        let second = other.try_polling_lock().await.expect("lock");
        if backend == Backend::Postgres {
            assert!(second.is_none(), "held by the first");
            assert!(first.still_held().await);
            drop(first);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while other.try_polling_lock().await.expect("lock").is_none() {
                assert!(tokio::time::Instant::now() < deadline, "never released");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else {
            assert!(
                second.is_some(),
                "SQLite: the lock file keeps a second daemon out"
            );
        }
        other.close().await;
    }
}

/// Runs `daylog ARGS` with exactly `env` (plus `PATH`), stdin closed; its output.
fn daylog(env: &std::collections::HashMap<String, String>, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_daylog"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("daylog runs")
}

/// Waits until `count` running instances are recorded in the database at `url`.
async fn wait_instances(url: &str, count: i64) {
    crate::support::wait_until(
        &format!("{count} instances recorded"),
        Duration::from_secs(60),
        || async {
            // Not there yet (the file, the table) is not yet.
            const RUNNING: &str = "SELECT count(*) FROM instances WHERE stopped_at IS NULL";
            let has: Result<i64, sqlx::Error> = if url.starts_with("postgres") {
                match sqlx::PgPool::connect(url).await {
                    Ok(pool) => {
                        let has = sqlx::query_scalar(RUNNING).fetch_one(&pool).await;
                        pool.close().await;
                        has
                    }
                    Err(error) => Err(error),
                }
            } else {
                match sqlx::SqlitePool::connect(url).await {
                    Ok(pool) => {
                        let has = sqlx::query_scalar(RUNNING).fetch_one(&pool).await;
                        pool.close().await;
                        has
                    }
                    Err(error) => Err(error),
                }
            };
            has.is_ok_and(|has| has >= count)
        },
    )
    .await;
}

/// One daemon per SQLite file: a second `daylog run` is refused with a sentence and
/// exits non-zero, while `chat`, `sql`, `backup` and `migrate` work beside the first;
/// the lock goes with its process, even one killed with SIGKILL.
#[tokio::test]
async fn a_second_daemon_on_one_sqlite_file_is_refused_and_the_tools_work_beside_it() {
    use crate::support::{FakeTelegram, Providers, signal, spawn_daylog, test_env, wait_exit};
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let env = test_env(&db, &telegram, &providers);
    let log = dir.path().join("first.log");
    let mut first = spawn_daylog(&env, &log);
    wait_instances(&db, 1).await;

    let second_log = dir.path().join("second.log");
    let mut second = spawn_daylog(&env, &second_log);
    let status = wait_exit(&mut second, Duration::from_secs(30)).await;
    let said = std::fs::read_to_string(&second_log).expect("log");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(
        said.contains("another `daylog run` is already using the database"),
        "{said}"
    );
    assert!(said.contains("daylog.db.lock"), "{said}");

    let migrate = daylog(&env, &["migrate"]);
    assert!(migrate.status.success(), "{migrate:?}");
    let sql = daylog(&env, &["sql", "SELECT mode, version FROM instances"]);
    assert!(sql.status.success(), "{sql:?}");
    assert!(
        String::from_utf8_lossy(&sql.stdout).contains("polling"),
        "{sql:?}"
    );
    let copy = dir.path().join("copy.db");
    let backup = daylog(&env, &["backup", copy.to_str().expect("path")]);
    assert!(backup.status.success(), "{backup:?}");
    let chat = daylog(&env, &["chat"]);
    assert!(chat.status.success(), "{chat:?}");
    assert!(
        first.try_wait().expect("wait").is_none(),
        "the first still runs"
    );

    signal(&first, "KILL");
    wait_exit(&mut first, Duration::from_secs(15)).await;
    let mut third = spawn_daylog(&env, &dir.path().join("third.log"));
    wait_instances(&db, 2).await; // the killed one never said it stopped
    signal(&third, "TERM");
    let status = wait_exit(&mut third, Duration::from_secs(15)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        crate::support::tail(&dir.path().join("third.log"), 20)
    );
    let raw = Raw::connect(&db).await;
    let stopped: i64 = raw
        .value("SELECT count(*) FROM instances WHERE stopped_at IS NOT NULL")
        .await;
    raw.close().await;
    assert_eq!(stopped, 1, "a clean stop is recorded");
}

/// One polling instance per PostgreSQL database: a second is refused with a sentence
/// before it asks Telegram anything; the lock goes with its process, even one killed
/// with SIGKILL, and the next polling instance starts.
#[tokio::test]
async fn a_second_polling_instance_on_postgres_is_refused_until_the_first_is_gone() {
    use crate::support::{FakeTelegram, Providers, signal, spawn_daylog, test_env, wait_exit};
    if !backends().contains(&Backend::Postgres) {
        return; // said once by `backends()` (a failure under CI=true)
    }
    let db = Backend::Postgres.fresh().await;
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let env = test_env(&db.url, &telegram, &providers);
    let mut first = spawn_daylog(&env, &dir.path().join("first.log"));
    wait_instances(&db.url, 1).await;

    let second_log = dir.path().join("second.log");
    let mut second = spawn_daylog(&env, &second_log);
    let status = wait_exit(&mut second, Duration::from_secs(30)).await;
    let said = std::fs::read_to_string(&second_log).expect("log");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(
        said.contains("already polling Telegram for this database"),
        "{said}"
    );
    assert!(!said.contains(db.url.as_str()), "no URL in what is said");

    signal(&first, "KILL");
    wait_exit(&mut first, Duration::from_secs(15)).await;
    let third_log = dir.path().join("third.log");
    let mut third = spawn_daylog(&env, &third_log);
    wait_instances(&db.url, 2).await;
    signal(&third, "TERM");
    let status = wait_exit(&mut third, Duration::from_secs(15)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        crate::support::tail(&third_log, 20)
    );
}

/// A log decided but never answered, in chat `chat` of user `chat`.
async fn unanswered(store: &Store, chat: i64) {
    store
        .upsert_user(&daylog::store::NewUser {
            user_id: UserId(chat),
            username: None,
            language: daylog::language::Language::En,
        })
        .await
        .expect("user");
    let id = store
        .insert_log(&NewLog {
            user_id: UserId(chat),
            chat_id: ChatId(chat),
            message_id: MessageId(1),
            text: "a day",
            local_day: None,
            written_at: None,
        })
        .await
        .expect("log")
        .id();
    let outcome = crate::support::analysed("A fine day.", crate::support::METRICS_JSON);
    assert!(store.record(id, "a day", &outcome).await.expect("record"));
}

on_each_backend! {
    /// A chat taken over from another instance has its own unfinished logs claimed, all
    /// of them, and no other chat's (those stay with whoever holds them).
    async fn a_chat_taken_over_lists_its_own_unfinished_logs_only(db: TestDb) {
    let store = &db.store;
    unanswered(store, 43).await;
    unanswered(store, 44).await;
    let mine = store
        .unfinished_in_chat(daylog::store::FrontEnd::Telegram, 44)
        .await
        .expect("listed");
    assert_eq!(mine.len(), 1, "{}", db.backend);
    assert_eq!(mine[0].1.chat_id, ChatId(44));
    let all = store
        .unfinished(daylog::store::FrontEnd::Telegram, 10)
        .await
        .expect("listed");
    assert_eq!(all.len(), 2);
    }
}

/// The worker finishes what is unfinished under the chat's lease: on PostgreSQL a log
/// of a chat another live instance holds is left to it, and answered once that lease
/// is free; on SQLite (one daemon per file) a lease left by a dead holder is freed at
/// the start.
#[tokio::test]
async fn the_worker_leaves_a_chat_another_instance_holds_until_its_lease_is_free() {
    use crate::support::{FakeTelegram, Providers, signal, spawn_daylog, test_env, wait_exit};
    for backend in backends() {
        let db = backend.fresh().await;
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open_and_migrate(&db.url, Duration::from_secs(5))
            .await
            .expect("store");
        unanswered(&store, 41).await;
        unanswered(&store, 42).await;
        let other = instance(&store, "webhook").await;
        let elsewhere = store
            .take_chat_lease(42, other, Duration::from_secs(3600))
            .await
            .expect("take")
            .expect("free");
        let telegram = FakeTelegram::start().await;
        let providers = Providers::start().await;
        providers.healthy().await;
        let env = test_env(&db.url, &telegram, &providers);
        let log = dir.path().join("bot.log");
        let mut bot = spawn_daylog(&env, &log);
        telegram.wait_sent(41, 1).await;
        if backend == Backend::Postgres {
            // Ten more looks of the worker (every 100 ms here): the log stays unanswered.
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(
                telegram.sent_to(42).is_empty(),
                "{backend}: chat 42 is the other instance's"
            );
            store.release_chat_lease(&elsewhere).await.expect("release");
        }
        // On SQLite the daemon's lock file proves every other holder gone: it gives
        // their leases up at its start and answers at once.
        telegram.wait_sent(42, 1).await;
        signal(&bot, "TERM");
        let status = wait_exit(&mut bot, Duration::from_secs(15)).await;
        assert_eq!(status.code(), Some(0), "{}", crate::support::tail(&log, 20));
        assert_eq!(telegram.sent_to(41).len(), 1, "answered once");
        assert_eq!(telegram.sent_to(42).len(), 1, "answered once");
        store.close().await;
    }
}

on_each_backend! {
    /// `instances` and `chat_leases` are public (`daylog sql`, docs/operations.md): their
    /// columns keep their names and order on both backends.
    async fn the_cluster_tables_keep_their_public_columns(db: TestDb) {
    assert_eq!(
        db.store.columns("instances").await.expect("columns"),
        ["id", "started_at", "last_seen", "version", "host", "pid", "mode", "stopped_at"],
        "{}",
        db.backend
    );
    assert_eq!(
        db.store.columns("chat_leases").await.expect("columns"),
        ["chat_id", "holder", "generation", "expires_at"],
        "{}",
        db.backend
    );
    }
}

/// A fault test's folder (the instances' logs). With `FAULT_KEEP` set it is kept after
/// the test and named on stderr, with `calls.txt` (every answer, in the order the fake
/// Bot API received them, each with the life of the instance that sent it) written by
/// [`keep_calls`].
fn fault_dir() -> (Option<tempfile::TempDir>, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("daylog-fault-")
        .tempdir()
        .expect("dir");
    if std::env::var_os("FAULT_KEEP").is_some() {
        let kept = dir.keep();
        #[expect(clippy::print_stderr, reason = "where the kept logs are")]
        {
            eprintln!("the fault test's logs are kept in {}", kept.display());
        }
        return (None, kept);
    }
    let path = dir.path().to_path_buf();
    (Some(dir), path)
}

/// Writes `calls.txt` into a kept fault folder (see [`fault_dir`]).
fn keep_calls(telegram: &crate::support::FakeTelegram, dir: &std::path::Path) {
    if std::env::var_os("FAULT_KEEP").is_none() {
        return;
    }
    let lines: Vec<String> = telegram
        .calls()
        .iter()
        .enumerate()
        .filter(|(_, call)| call.method == "SendMessage")
        .map(|(n, call)| {
            format!(
                "{n} {} chat {} to {} {:?}",
                call.via.as_deref().unwrap_or("-"),
                call.chat_id().unwrap_or_default(),
                call.reply_to().unwrap_or_default(),
                call.text().chars().take(30).collect::<String>()
            )
        })
        .collect();
    std::fs::write(dir.join("calls.txt"), lines.join("\n")).expect("calls.txt");
}

/// For each chat, the message ids its replies answered, in the order they were sent.
fn replies_by_chat(
    telegram: &crate::support::FakeTelegram,
) -> std::collections::BTreeMap<i64, Vec<i64>> {
    let mut by_chat: std::collections::BTreeMap<i64, Vec<i64>> = std::collections::BTreeMap::new();
    for call in telegram.calls() {
        if call.method != "SendMessage" {
            continue;
        }
        if let (Some(chat), Some(to)) = (call.chat_id(), call.reply_to()) {
            by_chat.entry(chat).or_default().push(to);
        }
    }
    by_chat
}

/// Waits until every chat of `chats` has at least `per_chat` distinct replies.
/// The lease of the fault tests that kill nobody: long enough that a stall of this
/// busy 2-core machine (three daemons, PostgreSQL and the other tests) never passes for a
/// death — a take-over then happens only on a stop or a kill, which is what they test.
/// The kill test keeps 2 s leases, so that its take-overs come quickly.
const STEADY_LEASE_MS: u64 = 10_000;

async fn wait_answered(
    telegram: &crate::support::FakeTelegram,
    chats: &[i64],
    per_chat: usize,
    logs: &[std::path::PathBuf],
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let by_chat = replies_by_chat(telegram);
        let missing: Vec<i64> = chats
            .iter()
            .copied()
            .filter(|chat| {
                let mut ids = by_chat.get(chat).cloned().unwrap_or_default();
                ids.sort_unstable();
                ids.dedup();
                ids.len() < per_chat
            })
            .collect();
        if missing.is_empty() {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let tails: Vec<String> = logs
                .iter()
                .map(|log| crate::support::tail(log, 15))
                .collect();
            panic!(
                "chats never answered in full: {missing:?}\n{}",
                tails.join("\n---\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three instances on one PostgreSQL database behind one balancer: every entry of 100
/// chats answered once, each chat's replies in the order of its messages.
#[tokio::test]
async fn three_instances_behind_one_balancer_answer_every_entry_once_and_in_order() {
    use crate::support::telegram::text_update;
    use crate::support::{FakeTelegram, Providers};
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let db = Backend::Postgres.fresh().await;
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let (_balancer, mut instances) = crate::support::cluster::start_instances(
        &db.url,
        &telegram,
        &providers,
        dir.path(),
        3,
        STEADY_LEASE_MS,
    )
    .await;
    let chats: Vec<i64> = (1000..1100).collect();
    for message in 1..=3 {
        for chat in &chats {
            telegram.push_update(text_update(*chat, message, "A quiet day at home."));
        }
    }
    let logs: Vec<_> = instances.iter().map(|i| i.log.clone()).collect();
    wait_answered(&telegram, &chats, 3, &logs).await;
    for instance in &mut instances {
        assert_eq!(
            instance.stop().await,
            Some(0),
            "{}",
            crate::support::tail(&instance.log, 20)
        );
    }
    let answers = check_answers(&telegram, &chats, 3);
    assert_eq!(answers.out_of_order, Vec::new(), "each chat in order");
    assert!(answers.again.is_empty(), "once each: {:?}", answers.again);
}

/// What a run of the fault suite left, as the fake Bot API saw it (every entry is
/// answered, or [`check_answers`] fails).
struct Answers {
    /// The answers sent again: each with its entry and the lives (see
    /// [`crate::support::cluster::Instance`]) that sent the copy before it and it.
    again: Vec<Again>,
    /// The chats whose first answers came out of the order of their messages, each with
    /// the messages its answers went to, in the order sent.
    out_of_order: Vec<(i64, Vec<i64>)>,
}

/// An answer sent again.
struct Again {
    chat: i64,
    message: i64,
    /// The life that sent the copy before, and the one that sent this one.
    before: String,
    now: String,
}

impl std::fmt::Debug for Again {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chat {} message {}: sent by {} then by {}",
            self.chat, self.message, self.before, self.now
        )
    }
}

/// Every entry of `chats` (messages 1 to `per_chat`) answered; what came twice or out
/// of order.
fn check_answers(telegram: &crate::support::FakeTelegram, chats: &[i64], per_chat: i64) -> Answers {
    let mut answers = Answers {
        again: Vec::new(),
        out_of_order: Vec::new(),
    };
    let mut sent: std::collections::BTreeMap<i64, Vec<(i64, String)>> =
        std::collections::BTreeMap::new();
    for call in telegram.calls() {
        if call.method != "SendMessage" {
            continue;
        }
        if let (Some(chat), Some(to)) = (call.chat_id(), call.reply_to()) {
            let via = call.via.clone().unwrap_or_default();
            sent.entry(chat).or_default().push((to, via));
        }
    }
    for chat in chats {
        let replies = sent.get(chat).cloned().unwrap_or_default();
        let mut first: Vec<i64> = Vec::new();
        let mut last_copy: std::collections::HashMap<i64, String> =
            std::collections::HashMap::new();
        for (message, via) in &replies {
            match last_copy.insert(*message, via.clone()) {
                Some(before) => answers.again.push(Again {
                    chat: *chat,
                    message: *message,
                    before,
                    now: via.clone(),
                }),
                None => first.push(*message),
            }
        }
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (1..=per_chat).collect::<Vec<_>>(),
            "chat {chat}: every entry answered ({replies:?})"
        );
        if first != sorted {
            answers
                .out_of_order
                .push((*chat, replies.into_iter().map(|(m, _)| m).collect()));
        }
    }
    answers
}

/// The answers sent again beyond what a kill allows (docs/behaviour.md, Several
/// instances): a copy is allowed only when the copy before it was sent by a life that
/// was then killed (`kill -9` between sending it and recording it) and it comes from
/// another life. A copy after a life that stopped cleanly, that is still running, or
/// that sent both — a chat answered by two holders at once, or an instance still
/// sending after its chat was taken over — is not.
fn beyond_kills<'a>(
    again: &'a [Again],
    instances: &[crate::support::cluster::Instance],
) -> Vec<&'a Again> {
    use crate::support::cluster::End;
    let killed = |life: &str| {
        instances.iter().any(|instance| {
            instance
                .ended()
                .iter()
                .any(|(tag, end)| tag == life && *end == End::Killed)
        })
    };
    again
        .iter()
        .filter(|copy| copy.before == copy.now || !killed(&copy.before))
        .collect()
}

/// kill -9 of one instance of three at random moments, again and again, while 300
/// entries from 100 chats arrive: every entry answered, each chat's in order; a second
/// answer only for an entry whose instance died between sending and recording it.
#[tokio::test]
async fn killing_instances_at_random_loses_no_entry_and_keeps_each_chats_order() {
    use crate::support::telegram::text_update;
    use crate::support::{FakeTelegram, Providers, Rng};
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let db = Backend::Postgres.fresh().await;
    let (_dir, dir) = fault_dir();
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let (_balancer, mut instances) =
        crate::support::cluster::start_instances(&db.url, &telegram, &providers, &dir, 3, 2000)
            .await;
    let chats: Vec<i64> = (2000..2100).collect();
    let seed = Rng::seed_from_env(34);
    let mut rng = Rng::new(seed);
    let pushing = {
        let (telegram, chats) = (telegram.clone(), chats.clone());
        tokio::spawn(async move {
            for message in 1..=3 {
                for chat in &chats {
                    telegram.push_update(text_update(*chat, message, "A quiet day at home."));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        })
    };
    let mut kills = 0;
    while !pushing.is_finished() || kills < 4 {
        tokio::time::sleep(Duration::from_millis(rng.between(200, 1200))).await;
        let victim = usize::try_from(rng.below(3)).expect("index");
        instances[victim].kill().await;
        kills += 1;
        tokio::time::sleep(Duration::from_millis(rng.between(0, 600))).await;
        instances[victim].start().await;
    }
    pushing.await.expect("pushed");
    let logs: Vec<_> = instances.iter().map(|i| i.log.clone()).collect();
    wait_answered(&telegram, &chats, 3, &logs).await;
    for instance in &mut instances {
        assert_eq!(
            instance.stop().await,
            Some(0),
            "{}",
            crate::support::tail(&instance.log, 20)
        );
    }
    keep_calls(&telegram, &dir);
    let answers = check_answers(&telegram, &chats, 3);
    eprintln!(
        "seed {seed}: {kills} kills, {} answers sent again (each after its first copy's sender was killed)",
        answers.again.len()
    );
    assert_eq!(
        answers.out_of_order,
        Vec::new(),
        "seed {seed}: each chat's replies in order"
    );
    let beyond = beyond_kills(&answers.again, &instances);
    assert!(
        beyond.is_empty(),
        "seed {seed}: answers sent again with no kill between: {beyond:?}"
    );
}

/// A rolling restart under load: each of three instances stopped (SIGTERM) and started
/// again in turn while 300 entries from 100 chats arrive: every entry answered once,
/// each chat's replies in order (a stopped instance finishes what it holds, then gives
/// its chats up).
#[tokio::test]
async fn a_rolling_restart_under_load_answers_every_entry_once_and_in_order() {
    use crate::support::telegram::text_update;
    use crate::support::{FakeTelegram, Providers};
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let db = Backend::Postgres.fresh().await;
    let (_dir, dir) = fault_dir();
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let (_balancer, mut instances) = crate::support::cluster::start_instances(
        &db.url,
        &telegram,
        &providers,
        &dir,
        3,
        STEADY_LEASE_MS,
    )
    .await;
    let chats: Vec<i64> = (3000..3100).collect();
    let pushing = {
        let (telegram, chats) = (telegram.clone(), chats.clone());
        tokio::spawn(async move {
            for message in 1..=3 {
                for chat in &chats {
                    telegram.push_update(text_update(*chat, message, "A quiet day at home."));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        })
    };
    for instance in &mut instances {
        assert_eq!(
            instance.stop().await,
            Some(0),
            "{}",
            crate::support::tail(&instance.log, 20)
        );
        instance.start().await;
    }
    pushing.await.expect("pushed");
    let logs: Vec<_> = instances.iter().map(|i| i.log.clone()).collect();
    wait_answered(&telegram, &chats, 3, &logs).await;
    for instance in &mut instances {
        assert_eq!(
            instance.stop().await,
            Some(0),
            "{}",
            crate::support::tail(&instance.log, 20)
        );
    }
    keep_calls(&telegram, &dir);
    let answers = check_answers(&telegram, &chats, 3);
    assert_eq!(
        answers.out_of_order,
        Vec::new(),
        "each chat's replies in order"
    );
    assert!(
        answers.again.is_empty(),
        "a clean stop sends nothing twice: {:?}",
        answers.again
    );
}

/// An instance that stalls past its chat's lease (SIGSTOP) right after it recorded an
/// entry's analysis, while another instance takes the chat over and answers it, sends
/// nothing once it runs again: it finds the lease gone before it sends. The chat gets
/// each answer once, in order.
#[tokio::test]
async fn an_instance_stalled_past_its_lease_sends_nothing_once_its_chat_was_taken_over() {
    use crate::support::cluster::ports;
    use crate::support::telegram::text_update;
    use crate::support::{FakeTelegram, Providers};
    use sqlx::Connection as _;
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let db = Backend::Postgres.fresh().await;
    let (_dir, dir) = fault_dir();
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    // Slow enough that the entry's row is there well before its analysis is recorded.
    providers.slow(Duration::from_millis(1500)).await;
    let (balancer, mut instances) =
        crate::support::cluster::start_instances(&db.url, &telegram, &providers, &dir, 2, 2000)
            .await;
    let chat = 5000;
    balancer.serve(&ports(&[&instances[0]]));
    telegram.push_update(text_update(chat, 1, "A quiet day at home."));

    // The entry's row is held locked, so the first instance's record of its analysis
    // waits; once it waits, the instance is stopped and the record let through.
    let raw = Raw::connect(&db.url).await;
    crate::support::wait_until("the entry stored", Duration::from_secs(60), || async {
        raw.value::<i64>(&format!(
            "SELECT count(*) FROM day_logs WHERE chat_id = {chat}"
        ))
        .await
            == 1
    })
    .await;
    let mut lock = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query("BEGIN")
        .execute(&mut lock)
        .await
        .expect("begin");
    sqlx::query(&format!(
        "SELECT id FROM day_logs WHERE chat_id = {chat} FOR UPDATE"
    ))
    .execute(&mut lock)
    .await
    .expect("locked");
    crate::support::wait_until("the record waiting", Duration::from_secs(60), || async {
        raw.value::<i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE day_logs SET status%'",
        )
        .await
            == 1
    })
    .await;
    instances[0].pause();
    sqlx::query("COMMIT")
        .execute(&mut lock)
        .await
        .expect("commit");
    crate::support::wait_until("the record committed", Duration::from_secs(60), || async {
        raw.value::<i64>(&format!(
            "SELECT count(*) FROM day_logs WHERE chat_id = {chat} AND status = 'analyzed'"
        ))
        .await
            == 1
    })
    .await;

    // The chat's next entry goes to the other instance, which takes the chat over once
    // the stalled one's lease ran out, and answers both.
    balancer.serve(&ports(&[&instances[1]]));
    telegram.push_update(text_update(chat, 2, "A quiet day at home."));
    let logs: Vec<_> = instances.iter().map(|i| i.log.clone()).collect();
    wait_answered(&telegram, &[chat], 2, &logs).await;

    // Running again, the stalled instance finishes what it was doing, and stops.
    instances[0].resume();
    for instance in &mut instances {
        assert_eq!(
            instance.stop().await,
            Some(0),
            "{}",
            crate::support::tail(&instance.log, 20)
        );
    }
    raw.close().await;
    keep_calls(&telegram, &dir);
    let answers = check_answers(&telegram, &[chat], 2);
    assert_eq!(answers.out_of_order, Vec::new(), "in order");
    assert!(
        answers.again.is_empty(),
        "the stalled instance sent after the take-over: {:?}",
        answers.again
    );
}

/// PostgreSQL restarted in the middle of a burst: while it is gone `/readyz` says 503
/// and the webhook is answered 5xx (Telegram keeps the updates); every update Telegram
/// got a 2xx for is there, and every entry is answered once it is back.
#[tokio::test]
async fn postgres_restarted_in_a_burst_loses_nothing_and_answers_everything_after() {
    use crate::support::telegram::text_update;
    use crate::support::{FakeTelegram, Providers};
    // A server of its own to restart (the shared one serves every other test).
    let Some(pg) = crate::support::cluster::OwnPostgres::for_test("the PostgreSQL restart test")
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let (_balancer, mut instances) = crate::support::cluster::start_instances(
        &pg.url,
        &telegram,
        &providers,
        dir.path(),
        2,
        STEADY_LEASE_MS,
    )
    .await;
    let chats: Vec<i64> = (4000..4020).collect();
    for chat in &chats {
        telegram.push_update(text_update(*chat, 1, "A quiet day at home."));
    }
    pg.down();
    for chat in &chats {
        telegram.push_update(text_update(*chat, 2, "A quiet day at home."));
    }
    let client = reqwest::Client::new();
    let readyz = format!("http://127.0.0.1:{}/readyz", instances[0].port);
    crate::support::wait_until("/readyz to say 503", Duration::from_secs(60), || async {
        client
            .get(&readyz)
            .send()
            .await
            .is_ok_and(|r| r.status().as_u16() == 503)
    })
    .await;
    crate::support::wait_until(
        "a webhook post answered 5xx",
        Duration::from_secs(60),
        || async {
            telegram
                .webhook_posts()
                .iter()
                .any(|(_, status)| *status >= 500)
        },
    )
    .await;
    pg.up();
    let logs: Vec<_> = instances.iter().map(|i| i.log.clone()).collect();
    wait_answered(&telegram, &chats, 2, &logs).await;
    for instance in &mut instances {
        assert_eq!(
            instance.stop().await,
            Some(0),
            "{}",
            crate::support::tail(&instance.log, 20)
        );
    }
    let answers = check_answers(&telegram, &chats, 2);
    assert_eq!(answers.out_of_order, Vec::new(), "each chat in order");
}

on_each_backend! {
    /// An entry's insert for an update handled under a lease (on PostgreSQL one
    /// statement: the lease's row read `FOR SHARE`, the insert, the update's mark):
    /// after a take-over it is refused (`Fenced`) and writes neither the entry nor the
    /// mark; under the lease in hand it stores the entry and marks the update, and the
    /// same message again is a duplicate that marks its own update. (SQLite runs one
    /// instance, its lock file says so: its entry's insert checks no lease.)
    async fn an_entry_stored_under_a_taken_over_lease_is_refused_and_writes_nothing(db: TestDb) {
    if db.backend == Backend::Sqlite {
        return;
    }
    let store = &db.store;
    let (a, b) = (instance(store, "webhook").await, instance(store, "webhook").await);
    store
        .upsert_user(&daylog::store::NewUser {
            user_id: UserId(12),
            username: None,
            language: daylog::language::Language::En,
        })
        .await
        .expect("user");
    let entry = NewLog {
        user_id: UserId(12),
        chat_id: ChatId(12),
        message_id: MessageId(1),
        text: "a day",
        local_day: None,
        written_at: None,
    };
    let old = store.take_chat_lease(12, a, LEASE).await.expect("take").expect("free");
    let new = take_when_free(store, 12, b).await;
    let first = stored_update(store, 1, 12).await;
    store.fence_update(first, Some(old));
    let refused = store.insert_log_for(&entry, Some(first)).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { chat_id: 12 })),
        "{refused:?}"
    );
    let raw = Raw::connect(&db.url).await;
    assert_eq!(raw.value::<i64>("SELECT count(*) FROM day_logs").await, 0);
    assert!(!handled(&db, 1).await, "the update is left to the new holder");
    store.fence_update(first, Some(new));
    let stored = store.insert_log_for(&entry, Some(first)).await.expect("the holder stores");
    assert!(matches!(stored, daylog::store::Inserted::New(_)), "{stored:?}");
    assert!(handled(&db, 1).await);
    let second = stored_update(store, 2, 12).await;
    store.fence_update(second, Some(new));
    let again = store.insert_log_for(&entry, Some(second)).await.expect("again");
    assert!(
        matches!(again, daylog::store::Inserted::Duplicate(id) if id == stored.id()),
        "{again:?}"
    );
    assert!(handled(&db, 2).await);
    assert_eq!(raw.value::<i64>("SELECT count(*) FROM day_logs").await, 1);
    raw.close().await;
    store.fence_update(first, None);
    store.fence_update(second, None);
    }
}
