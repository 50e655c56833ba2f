//! Fault injection (docs/behaviour.md, "Promises": no accepted log is lost): kill -9 of the real binary at
//! random moments, providers flapping under load, a database locked by someone else, and
//! a user with 100 000 logs. Randomness is seeded (`FAULT_SEED` replays a run); waits
//! are on conditions with generous hang guards, never on how fast something was.

// Helpers here panic on a broken fixture by design (see tests/support).
#![expect(clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{Connection as _, SqlitePool};
use support::fill::fill_logs;
use support::telegram::{Call, text_update};
use support::{ANALYSIS_TEXT, App, FakeTelegram, Providers, Rng, spawn_daylog, tail, test_env};

/// A generous guard against hangs; reaching it is a failure, never a measurement.
const HANG_GUARD: Duration = Duration::from_secs(90);

/// Analysis replies (the final answer to a log) per `(chat, message replied to)`.
fn analysis_replies(calls: &[Call]) -> HashMap<(i64, i64), usize> {
    let mut replies = HashMap::new();
    for call in calls {
        if call.method == "SendMessage"
            && call.text().contains(ANALYSIS_TEXT)
            && let (Some(chat), Some(message)) = (call.chat_id(), call.reply_to())
        {
            *replies.entry((chat, message)).or_default() += 1;
        }
    }
    replies
}

fn duplicates(replies: &HashMap<(i64, i64), usize>) -> usize {
    replies.values().map(|n| n.saturating_sub(1)).sum()
}

async fn count(pool: &SqlitePool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("count query")
}

/// Every stored log is analysed and its answer recorded as sent.
async fn all_answered(pool: &SqlitePool, expected: i64) -> bool {
    let stored = count(pool, "SELECT count(*) FROM day_logs").await;
    let done = count(
        pool,
        "SELECT count(*) FROM day_logs WHERE status = 'analyzed' AND replied_at IS NOT NULL",
    )
    .await;
    stored == expected && done == expected
}

fn set_my_commands(telegram: &FakeTelegram) -> usize {
    telegram
        .calls()
        .iter()
        .filter(|c| c.method == "SetMyCommands")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_loses_no_log_and_answers_twice_only_after_a_crash() {
    let seed = Rng::seed_from_env(0x0DA7_1065);
    let rounds: usize = std::env::var("FAULT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let log = dir.path().join("bot.log");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers
        .jittery(
            seed,
            Duration::from_millis(50),
            Duration::from_millis(300),
            10,
        )
        .await;
    let mut env = test_env(&db, &telegram, &providers);
    // Many logs per user in one hour: the per-user limit is not what is tested here.
    env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());

    let mut pushed: Vec<(i64, i64)> = Vec::new();
    let mut next_message: HashMap<i64, i64> = HashMap::new();
    // Index into the fake's calls where each life started: a log answered twice within
    // one life is a bug whatever the crashes.
    let mut lives: Vec<usize> = Vec::new();
    let mut kills = 0;
    for round in 0..rounds {
        let started = set_my_commands(&telegram);
        lives.push(telegram.calls().len());
        let mut bot = spawn_daylog(&env, &log);
        // Mostly kill a running bot; sometimes one that is still starting up.
        if round == 0 || !rng.chance(20) {
            telegram
                .wait_for("the bot to start", HANG_GUARD, |calls| {
                    calls.iter().filter(|c| c.method == "SetMyCommands").count() > started
                })
                .await;
        }
        for _ in 0..rng.between(1, 4) {
            let chat = 1000 + rng.below(6) as i64;
            let message = next_message.entry(chat).or_insert(0);
            *message += 1;
            telegram.push_update(text_update(
                chat,
                *message,
                &format!("Round {round}: entry {message} of chat {chat}."),
            ));
            pushed.push((chat, *message));
            if rng.chance(30) {
                tokio::time::sleep(Duration::from_millis(rng.below(150))).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(501))).await;
        bot.kill().expect("kill -9");
        let _ = bot.wait();
        kills += 1;
        // A request the dead process had fully sent may still be in the fake's queue; let
        // it land so it counts in the life that sent it.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    // Last life: healthy providers, run until every accepted log is answered.
    providers.reset().await;
    providers.healthy().await;
    let started = set_my_commands(&telegram);
    lives.push(telegram.calls().len());
    let mut bot = spawn_daylog(&env, &log);
    // Until it polls, a SIGTERM would find no handler installed yet.
    telegram
        .wait_for("the last life to start", HANG_GUARD, |calls| {
            calls.iter().filter(|c| c.method == "SetMyCommands").count() > started
        })
        .await;
    let pool = SqlitePool::connect(&db).await.expect("db");
    let expected = pushed.len() as i64;
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !all_answered(&pool, expected).await {
        if tokio::time::Instant::now() > deadline {
            let _ = bot.kill();
            let rows: Vec<(i64, i64, String, Option<String>)> = sqlx::query_as(
                "SELECT chat_id, message_id, status, replied_at FROM day_logs
                 WHERE status <> 'analyzed' OR replied_at IS NULL",
            )
            .fetch_all(&pool)
            .await
            .expect("rows");
            panic!(
                "not every log answered (seed {seed}): {} stored of {expected}; unfinished {rows:?}\nbot log:\n{}",
                count(&pool, "SELECT count(*) FROM day_logs").await,
                tail(&log, 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &bot.id().to_string()])
        .status();
    let status = tokio::task::spawn_blocking(move || bot.wait())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(
        status.code(),
        Some(0),
        "the last life stops cleanly ({status}); bot log:\n{}",
        tail(&log, 30)
    );

    let calls = telegram.calls();
    let replies = analysis_replies(&calls);
    for key in &pushed {
        assert!(
            replies.get(key).copied().unwrap_or(0) >= 1,
            "log {key:?} was never answered (seed {seed})"
        );
    }
    let stored = count(&pool, "SELECT count(*) FROM day_logs").await;
    let stuck = count(
        &pool,
        "SELECT count(*) FROM day_logs WHERE status <> 'analyzed'",
    )
    .await;
    lives.push(calls.len());
    let mut within_one_life = 0;
    for window in lives.windows(2) {
        within_one_life += duplicates(&analysis_replies(&calls[window[0]..window[1]]));
    }
    let duplicated = duplicates(&replies);
    for (key, n) in replies.iter().filter(|(_, n)| **n > 1) {
        let in_lives: Vec<usize> = lives
            .windows(2)
            .enumerate()
            .filter(|(_, w)| analysis_replies(&calls[w[0]..w[1]]).contains_key(key))
            .map(|(i, _)| i)
            .collect();
        println!("log {key:?} answered {n} times, in lives {in_lives:?}");
    }
    let last_life = lives[lives.len() - 2];
    let answered_by_crashing_lives: usize = analysis_replies(&calls[..last_life]).values().sum();
    println!(
        "kill -9 loop (seed {seed}): {rounds} rounds, {kills} kills, {} logs pushed, {stored} stored, \
         {answered_by_crashing_lives} answered before the last life, {stuck} not analysed, \
         {duplicated} duplicate answers ({within_one_life} within one life)",
        pushed.len()
    );
    assert_eq!(stored, expected, "every pushed update is stored once");
    assert_eq!(stuck, 0, "nothing stuck pending");
    assert_eq!(within_one_life, 0, "one life never answers a log twice");
    assert!(
        duplicated <= kills,
        "{duplicated} duplicate answers but only {kills} crashes (seed {seed})"
    );
}

/// The state of the "disk" for one life of the bot in the full-disk loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    /// Not one more page: every entry is refused.
    None,
    /// A few pages: the store fills up during the life.
    Little,
    /// The filler removed.
    Plenty,
}

/// The quota every life of the full-disk loop runs with (`store.max_size_mb`).
const QUOTA_MB: u64 = 1;

/// Someone else's data in the same file: fills the quota up (then frees `free_rows`
/// rows of it again), or removes it. The bot is not running meanwhile.
async fn set_room(db: &str, room: Room) {
    let mut conn = sqlx::SqliteConnection::connect(db)
        .await
        .expect("filler connection");
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut conn)
        .await
        .expect("page size");
    let pages = QUOTA_MB * 1024 * 1024 / page_size as u64;
    sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
        .execute(&mut conn)
        .await
        .expect("quota");
    sqlx::query("CREATE TABLE IF NOT EXISTS test_filler (id INTEGER PRIMARY KEY, b BLOB)")
        .execute(&mut conn)
        .await
        .expect("filler table");
    sqlx::query("DELETE FROM test_filler")
        .execute(&mut conn)
        .await
        .expect("empty the filler");
    if room != Room::Plenty {
        // Half-page rows, until SQLite says the quota is reached.
        while sqlx::query("INSERT INTO test_filler (b) VALUES (zeroblob(?1))")
            .bind(page_size / 2)
            .execute(&mut conn)
            .await
            .is_ok()
        {}
    }
    if room == Room::Little {
        sqlx::query("DELETE FROM test_filler WHERE id IN (SELECT id FROM test_filler LIMIT 8)")
            .execute(&mut conn)
            .await
            .expect("free a little");
    }
    conn.close().await.expect("close");
}

/// Messages (chat, replied-to message) that got a given sentence.
fn replied_with(calls: &[Call], fragment: &str) -> std::collections::HashSet<(i64, i64)> {
    calls
        .iter()
        .filter(|c| c.method == "SendMessage" && c.text().contains(fragment))
        .filter_map(|c| Some((c.chat_id()?, c.reply_to()?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_the_disk_fills_and_empties_answers_every_stored_entry_and_refuses_the_rest() {
    let seed = Rng::seed_from_env(0xD15C_F011);
    let rounds: usize = std::env::var("FAULT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let log = dir.path().join("bot.log");
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let mut env = test_env(&db, &telegram, &providers);
    env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
    env.insert("DAYLOG__STORE__MAX_SIZE_MB".into(), QUOTA_MB.to_string());
    // Two pages of text per entry: the quota fills in a few entries.
    let filler = "a long day, written out at length. ".repeat(100);

    let mut pushed: Vec<(i64, i64)> = Vec::new();
    let mut next_message: HashMap<i64, i64> = HashMap::new();
    let mut rooms = Vec::new();
    let mut refusals = 0;
    for round in 0..rounds {
        // The first life creates the file; after that the disk is full, nearly full or
        // empty, at random (each at least once).
        if round > 0 {
            let room = match (round, rng.below(3)) {
                (1, _) => Room::None,
                (2, _) => Room::Little,
                (_, 0) => Room::None,
                (_, 1) => Room::Little,
                _ => Room::Plenty,
            };
            set_room(&db, room).await;
            rooms.push(room);
        }
        let started = set_my_commands(&telegram);
        let life_start = telegram.calls().len();
        let mut bot = spawn_daylog(&env, &log);
        telegram
            .wait_for("the bot to start", HANG_GUARD, |calls| {
                calls.iter().filter(|c| c.method == "SetMyCommands").count() > started
            })
            .await;
        for _ in 0..rng.between(2, 6) {
            let chat = 4000 + rng.below(4) as i64;
            let message = next_message.entry(chat).or_insert(0);
            *message += 1;
            telegram.push_update(text_update(
                chat,
                *message,
                &format!("Round {round}, entry {message}: {filler}"),
            ));
            pushed.push((chat, *message));
        }
        tokio::time::sleep(Duration::from_millis(rng.below(600))).await;
        bot.kill().expect("kill -9");
        let _ = bot.wait();
        tokio::time::sleep(Duration::from_millis(150)).await;

        // Within this life: told "not saved" means not stored; answered means stored.
        // (Telegram re-delivers to the next life what a dead bot never confirmed, so a
        // refused entry may be stored later.)
        let stored_now = stored_messages(&db).await;
        let life = &telegram.calls()[life_start..];
        for m in replied_with(life, "could not save") {
            assert!(
                !stored_now.contains(&m),
                "{m:?} was told it was not saved, but it is stored (round {round}, seed {seed})"
            );
            refusals += 1;
        }
        for m in replied_with(life, ANALYSIS_TEXT) {
            assert!(
                stored_now.contains(&m),
                "{m:?} was answered but is not stored (round {round}, seed {seed})"
            );
        }
    }

    // Last life: room again. What no life confirmed is delivered to it, so each entry
    // ends up stored or was refused, and each stored entry must be answered.
    set_room(&db, Room::Plenty).await;
    let started = set_my_commands(&telegram);
    let mut bot = spawn_daylog(&env, &log);
    telegram
        .wait_for("the last life to start", HANG_GUARD, |calls| {
            calls.iter().filter(|c| c.method == "SetMyCommands").count() > started
        })
        .await;
    let pool = SqlitePool::connect(&db).await.expect("db");
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let stored = stored_messages(&db).await;
        let refused = replied_with(&telegram.calls(), "could not save");
        let settled = pushed
            .iter()
            .all(|m| stored.contains(m) || refused.contains(m));
        if settled && all_answered(&pool, stored.len() as i64).await {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = bot.kill();
            panic!(
                "stored entries left unanswered (seed {seed})\nbot log:\n{}",
                tail(&log, 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &bot.id().to_string()])
        .status();
    let _ = tokio::task::spawn_blocking(move || bot.wait()).await;

    pool.close().await;
    let stored = stored_messages(&db).await;
    let calls = telegram.calls();
    let accepted = replied_with(&calls, ANALYSIS_TEXT);
    let refused = replied_with(&calls, "could not save");
    let lost: Vec<_> = pushed
        .iter()
        .filter(|m| !stored.contains(m) && !refused.contains(m))
        .collect();
    println!(
        "full-disk kill loop (seed {seed}): rooms {rooms:?}; {} entries pushed, {} stored, {} \
         answered, {refusals} refusals",
        pushed.len(),
        stored.len(),
        accepted.len(),
    );
    assert!(
        lost.is_empty(),
        "entries neither stored nor refused: {lost:?} (seed {seed})"
    );
    assert_eq!(
        accepted, stored,
        "the entries answered are exactly the entries stored (seed {seed})"
    );
    assert!(refusals > 0, "the disk really was full (seed {seed})");
}

async fn stored_messages(db: &str) -> std::collections::HashSet<(i64, i64)> {
    let mut conn = sqlx::SqliteConnection::connect(db).await.expect("db");
    let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT chat_id, message_id FROM day_logs")
        .fetch_all(&mut conn)
        .await
        .expect("stored");
    conn.close().await.expect("close");
    rows.into_iter().collect()
}

/// Messages of one kind (by a fragment of their text) sent to anyone.
fn sent_containing(calls: &[Call], fragment: &str) -> usize {
    calls
        .iter()
        .filter(|c| c.method == "SendMessage" && c.text().contains(fragment))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_flapping_under_load_lose_nothing_and_answer_each_log_once() {
    const CHATS: i64 = 25;
    const PER_CHAT: i64 = 4;
    const TOGGLES: usize = 14;
    let seed = Rng::seed_from_env(0xF1A9);
    let mut rng = Rng::new(seed);
    let app = App::spawn_with(|env| {
        // The budgets are test_env's generous ones: these fakes enforce no free tier
        // (tests/it/budgets.rs covers the shipped budgets).
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
    })
    .await;
    app.providers.healthy().await;

    // Arrange: 100 logs from 25 chats, sent in bursts while the providers go up and
    // down every few hundred ms (down = 503 everywhere, or 429 with a Retry-After).
    let logs: Vec<(i64, i64)> = (1..=PER_CHAT)
        .flat_map(|message| (0..CHATS).map(move |chat| (2000 + chat, message)))
        .collect();
    let mut next = 0;
    let mut up = true;
    let mut toggles = 0;
    while next < logs.len() || toggles < TOGGLES {
        let burst = (rng.between(3, 12) as usize).min(logs.len() - next);
        for &(chat, message) in &logs[next..next + burst] {
            app.telegram.push_update(text_update(
                chat,
                message,
                &format!("Flapping day {message} of chat {chat}."),
            ));
        }
        next += burst;
        tokio::time::sleep(Duration::from_millis(rng.between(150, 400))).await;
        app.providers.reset().await;
        up = !up;
        if up {
            app.providers.healthy().await;
        } else if rng.chance(50) {
            app.providers.all_down().await;
        } else {
            app.providers.all_rate_limited().await;
        }
        toggles += 1;
    }

    // Act: the providers come back for good.
    app.providers.reset().await;
    app.providers.healthy().await;
    let pool = app.store.read_pool().expect("a SQLite store").clone();
    let expected = logs.len() as i64;
    support::wait_until("every log analysed and answered", HANG_GUARD, || async {
        all_answered(&pool, expected).await
    })
    .await;

    // Assert: every log answered with its analysis exactly once.
    let calls = app.telegram.calls();
    let replies = analysis_replies(&calls);
    for key in &logs {
        assert_eq!(
            replies.get(key).copied().unwrap_or(0),
            1,
            "log {key:?} (seed {seed})"
        );
    }
    let saved_pending = sent_containing(&calls, "will follow");
    let not_saved = sent_containing(&calls, "could not save");
    let failed_attempts = count(
        &pool,
        "SELECT count(*) FROM llm_calls WHERE outcome <> 'ok'",
    )
    .await;
    println!(
        "flapping (seed {seed}): {toggles} toggles, {expected} logs, {} analysis answers, \
         {saved_pending} 'saved, will follow', {failed_attempts} failed LLM attempts, \
         {} duplicates",
        replies.values().sum::<usize>(),
        duplicates(&replies)
    );
    assert_eq!(not_saved, 0, "no entry refused");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_locked_by_another_connection_for_3_s_loses_no_message() {
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
    })
    .await;
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update(3000, 1, "Before the lock."));
    app.telegram.wait_sent(3000, 1).await;

    // Arrange: someone else (a `sqlite3` shell, a backup) holds the write lock, with a
    // write in its transaction, for 3 s — less than `store.busy_timeout_ms`.
    let mut locker = sqlx::SqliteConnection::connect(&app.env["DATABASE_URL"])
        .await
        .expect("second connection");
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut locker)
        .await
        .expect("lock");
    sqlx::query("INSERT INTO users (user_id, chat_id) VALUES (1, 1)")
        .execute(&mut locker)
        .await
        .expect("write under the lock");
    let mut logs = vec![(3000, 1)];
    for chat in 3001..3011 {
        for message in 1..=2 {
            app.telegram.push_update(text_update(
                chat,
                message,
                &format!("Locked-out entry {message} of chat {chat}."),
            ));
            logs.push((chat, message));
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let answered_during_lock = analysis_replies(&app.telegram.calls()).len();
    sqlx::query("COMMIT")
        .execute(&mut locker)
        .await
        .expect("unlock");

    let pool = app.store.read_pool().expect("a SQLite store").clone();
    let expected = logs.len() as i64;
    support::wait_until("every message stored and answered", HANG_GUARD, || async {
        all_answered(&pool, expected).await
    })
    .await;
    let calls = app.telegram.calls();
    let replies = analysis_replies(&calls);
    for key in &logs {
        assert_eq!(replies.get(key).copied().unwrap_or(0), 1, "log {key:?}");
    }
    assert_eq!(sent_containing(&calls, "could not save"), 0);
    assert_eq!(sent_containing(&calls, "went wrong"), 0);
    println!(
        "database locked 3 s: {} messages, {answered_during_lock} answered while locked, all stored and answered once",
        logs.len()
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_longer_than_busy_timeout_still_loses_no_message_and_answers_once() {
    // Arrange: `busy_timeout` (1 s) is shorter than the 3 s lock this time. Before the
    // store retried busy writes, the entries were refused ("send it again") and a reply
    // that could not be recorded as sent was sent a second time by the worker.
    let app = App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
        env.insert("DAYLOG__STORE__BUSY_TIMEOUT_MS".into(), "1000".into());
    })
    .await;
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update(3100, 1, "Before the lock."));
    app.telegram.wait_sent(3100, 1).await;
    let pool = app.store.read_pool().expect("a SQLite store").clone();
    support::wait_until("the first answer recorded", HANG_GUARD, || async {
        all_answered(&pool, 1).await
    })
    .await;

    let mut locker = sqlx::SqliteConnection::connect(&app.env["DATABASE_URL"])
        .await
        .expect("second connection");
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut locker)
        .await
        .expect("lock");
    sqlx::query("INSERT INTO users (user_id, chat_id) VALUES (1, 1)")
        .execute(&mut locker)
        .await
        .expect("write under the lock");
    let mut logs = vec![(3100, 1)];
    for chat in 3101..3106 {
        app.telegram
            .push_update(text_update(chat, 1, "Locked out for longer."));
        logs.push((chat, 1));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    sqlx::query("COMMIT")
        .execute(&mut locker)
        .await
        .expect("unlock");

    // Act + Assert: every message stored and answered, once, and nobody asked to resend.
    let expected = logs.len() as i64;
    support::wait_until("every message stored and answered", HANG_GUARD, || async {
        all_answered(&pool, expected).await
    })
    .await;
    let calls = app.telegram.calls();
    let replies = analysis_replies(&calls);
    for key in &logs {
        assert_eq!(replies.get(key).copied().unwrap_or(0), 1, "log {key:?}");
    }
    assert_eq!(sent_containing(&calls, "could not save"), 0);
    assert_eq!(sent_containing(&calls, "went wrong"), 0);
    app.stop().await;
}

/// The `EXPLAIN QUERY PLAN` details of one query, one line per step.
async fn query_plan(pool: &SqlitePool, sql: &str, user: i64, n: i64) -> Vec<String> {
    sqlx::query_as::<_, (i64, i64, i64, String)>(&format!("EXPLAIN QUERY PLAN {sql}"))
        .bind(user)
        .bind(n)
        .fetch_all(pool)
        .await
        .expect("plan")
        .into_iter()
        .map(|(_, _, _, detail)| detail)
        .collect()
}

fn assert_searches_the_user_index(what: &str, index: &str, plan: &[String]) {
    let text = plan.join("\n");
    assert!(
        plan.iter()
            .any(|s| s.starts_with("SEARCH day_logs USING") && s.contains(index)),
        "{what} does not search {index}:\n{text}"
    );
    assert!(
        !plan.iter().any(|s| s.starts_with("SCAN day_logs")),
        "{what} scans day_logs:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_100_000_logs_is_served_through_the_index() {
    use daylog::commands::{self, Command};
    use daylog::frontend::Response;

    use daylog::store::{DAILY_METRICS_SQL, HISTORY_SQL, UserId};

    // Arrange
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let env: HashMap<String, String> = [("DATABASE_URL".to_owned(), db.clone())].into();
    let settings = daylog::config::Settings::load_from(&env).expect("settings");
    let app = daylog::app::App::build(settings).await.expect("app");
    let store = app.store().clone();
    fill_logs(&db, 100_000).await;
    let pool = store.read_pool().expect("a SQLite store").clone();
    assert_eq!(count(&pool, "SELECT count(*) FROM day_logs").await, 100_000);

    // Assert: the plans search the (user_id, created_at) index.
    for days in [30, 365] {
        let plan = query_plan(&pool, DAILY_METRICS_SQL, 77, days).await;
        // The covering (user_id, day, metrics…) index: no row, no JSON is read.
        assert_searches_the_user_index(
            &format!("/stats {days}"),
            "COVERING INDEX day_logs_user_day",
            &plan,
        );
    }
    let plan = query_plan(&pool, HISTORY_SQL, 77, 10).await;
    assert_searches_the_user_index("/history", "INDEX day_logs_user_created", &plan);
    assert!(
        !plan.iter().any(|s| s.contains("TEMP B-TREE")),
        "/history sorts instead of reading the index in order: {plan:?}"
    );
    // The hourly limit reads the user's recent logs through indexes, then their calls.
    let plan = query_plan(&pool, daylog::store::RECENT_USE_SQL, 77, i64::MAX).await;
    for index in [
        "day_logs USING COVERING INDEX day_logs_user_created",
        "day_logs USING COVERING INDEX day_logs_user_edited",
        "llm_calls USING INDEX llm_calls_day_log",
    ] {
        assert!(
            plan.iter()
                .any(|s| s.starts_with("SEARCH") && s.contains(index)),
            "{index}: {plan:?}"
        );
    }
    assert!(
        !plan
            .iter()
            .any(|s| s.starts_with("SCAN") && s != "SCAN CONSTANT ROW"),
        "{plan:?}"
    );

    let plan = query_plan(&pool, daylog::store::RECENT_USE_SQL, 77, i64::MAX).await;
    assert!(
        plan.iter().any(
            |s| s.starts_with("SEARCH day_logs USING") && s.contains("INDEX day_logs_deferred")
        ),
        "the entries still waiting for their slot: {plan:?}"
    );
    // An entry over the limit finds the one `limit` places before it through the same
    // indexes (`?1` is the log, `?2` the user); what it sorts is that hour's entries.
    let plan = query_plan(&pool, daylog::store::DEFER_TO_FREE_SLOT_SQL, i64::MAX, 77).await;
    for (table, index) in [
        ("SEARCH e USING", "INDEX day_logs_user_created"),
        ("SEARCH w USING", "INDEX day_logs_deferred"),
    ] {
        assert!(
            plan.iter()
                .any(|s| s.starts_with(table) && s.contains(index)),
            "{index}: {plan:?}"
        );
    }
    assert!(
        !plan
            .iter()
            .any(|s| s.starts_with("SCAN") && !s.starts_with("SCAN (subquery")),
        "{plan:?}"
    );

    // Act + Assert: the commands answer on this data.
    let journal = std::sync::Arc::clone(app.journal());
    for days in ["30", "365"] {
        let responses = commands::respond(
            journal.store(),
            journal.users(),
            daylog::domain::UserId(77),
            Command::Stats(days.into()),
        )
        .await
        .expect("/stats");
        assert!(
            responses
                .iter()
                .any(|r| matches!(r, Response::Photo { png, .. } if png.starts_with(b"\x89PNG"))),
            "/stats {days} sends a chart"
        );
        // The fill's users keep the default zone (UTC) and day start (04:00).
        let today = daylog::time::UserZone::utc().local_day(jiff::Timestamp::now(), 4);
        let first = today
            .checked_sub(jiff::Span::new().days(days.parse::<i64>().expect("days") - 1))
            .expect("first day");
        let rows = store.daily_metrics(UserId(77), first).await.expect("rows");
        let want = days.parse::<usize>().expect("days");
        // One day fewer when the day started (04:00) between the fill and this check:
        // the fill's newest log is then yesterday's, and today has none yet.
        assert!(
            (want - 1..=want + 1).contains(&rows.len()),
            "{} days for /stats {days}",
            rows.len()
        );
        // Every full day holds about 205 logs; today only those since the day started.
        let (last, earlier) = rows.split_last().expect("a day");
        let full_days = if last.day == today {
            assert!(last.logs >= 1);
            earlier
        } else {
            &rows[..]
        };
        assert!(full_days.iter().all(|r| r.logs > 150), "{full_days:?}");
        assert!(
            rows.iter()
                .all(|r| r.mood.is_some_and(|m| (1.0..=5.0).contains(&m)))
        );
    }
    let history = store.history(UserId(77), 10).await.expect("history");
    assert_eq!(history.len(), 10);
    assert!(history.iter().all(|l| l.user_id == UserId(77)));
    assert!(
        history
            .windows(2)
            .all(|w| w[0].created_at >= w[1].created_at)
    );
    let responses = commands::respond(
        journal.store(),
        journal.users(),
        daylog::domain::UserId(77),
        Command::History("10".into()),
    )
    .await
    .expect("/history");
    assert!(matches!(responses.as_slice(), [Response::Text(_)]));
    store.close().await;
}
