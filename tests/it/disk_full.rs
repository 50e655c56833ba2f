//! A full store (docs/behaviour.md, "The life of an entry"): the real `daylog chat` binary, fed one entry at a time while
//! its database runs out of room, then gets room back. Every line must end one of two
//! ways — stored and answered "Saved", or told that it could not be saved — and the
//! database must agree line by line. Zero tolerance.
//!
//! Two ways to fill it: the `store.max_size_mb` quota (always runs), and a real 1 MB
//! tmpfs (needs root to mount; skipped with a note otherwise). The tmpfs is what exposed
//! the lost writes: there SQLite fails at commit, after `INSERT … RETURNING` has
//! already handed back its row. Last, an answer sent while its record cannot be written
//! is not sent again on every worker poll.

// Helpers here panic on a broken fixture by design (see tests/support).
#![expect(clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use support::{FakeTelegram, Providers, test_env};

/// A generous guard against hangs; reaching it is a failure, never a measurement.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Told that an entry could not be stored (`daylog chat`: send it again; Telegram: not
/// yet, it will be taken).
const REFUSED: &str = "could not save this entry";
/// Every acceptance of an entry starts so (an analysis, or "saved, it will follow").
const ACCEPTED: &str = "Saved.";
/// Stored, but something after the insert failed: the user is told it is safe.
const STORED_SAFE: &str = "If you sent an entry, it is safe";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Accepted,
    Refused,
}

/// `daylog chat` with its stdout collected by a thread.
struct Chat {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<String>>,
    err_log: std::path::PathBuf,
}

impl Chat {
    fn start(env: &HashMap<String, String>, dir: &Path) -> Self {
        let err_log = dir.join("chat.stderr");
        let mut child = Command::new(env!("CARGO_BIN_EXE_daylog"))
            .args(["chat", "--user", "7"])
            .current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err_log).expect("stderr file"))
            .spawn()
            .expect("daylog chat starts");
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().expect("stdout");
        let out = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&out);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self {
            child,
            stdin,
            out,
            err_log,
        }
    }

    fn output(&self) -> String {
        self.out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn outcomes(&self) -> (usize, usize) {
        let out = self.output();
        (
            out.matches(ACCEPTED).count() + out.matches(STORED_SAFE).count(),
            out.matches(REFUSED).count(),
        )
    }

    /// Sends one entry and waits for its one outcome. The chat handles lines in order,
    /// so the next outcome printed is this line's.
    fn entry(&mut self, text: &str) -> Outcome {
        let before = self.outcomes();
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{text}").expect("write a line");
        stdin.flush().expect("flush");
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            let now = self.outcomes();
            if now != before {
                let accepted = now.0 - before.0;
                let refused = now.1 - before.1;
                assert_eq!(
                    accepted + refused,
                    1,
                    "one line, one outcome; output:\n{}",
                    self.output()
                );
                return if accepted == 1 {
                    Outcome::Accepted
                } else {
                    Outcome::Refused
                };
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "daylog chat exited ({status}) on a line; stderr:\n{}",
                    support::tail(&self.err_log, 30)
                );
            }
            assert!(
                Instant::now() < deadline,
                "no answer to a line; output:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Ends the input and waits for a clean exit.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait");
        assert!(
            status.success(),
            "daylog chat exits 0 ({status}); stderr:\n{}",
            support::tail(&self.err_log, 30)
        );
        std::fs::read_to_string(&self.err_log).unwrap_or_default()
    }
}

fn stored_texts(db_url: &str) -> Vec<String> {
    // Called from `spawn_blocking`, where the test's runtime may be entered.
    tokio::runtime::Handle::current().block_on(async {
        let pool = sqlx::SqlitePool::connect(db_url).await.expect("db");
        let texts = sqlx::query_scalar("SELECT text FROM day_logs ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("texts");
        pool.close().await;
        texts
    })
}

fn delete_all_logs(db_url: &str) {
    // Called from `spawn_blocking`, where the test's runtime may be entered.
    tokio::runtime::Handle::current().block_on(async {
        let pool = sqlx::SqlitePool::connect(db_url).await.expect("db");
        sqlx::query("DELETE FROM llm_calls")
            .execute(&pool)
            .await
            .expect("delete calls");
        sqlx::query("DELETE FROM day_logs")
            .execute(&pool)
            .await
            .expect("delete logs");
        pool.close().await;
    });
}

/// An entry long enough to fill a small store in a few dozen lines, unique by `n`.
fn entry_text(n: usize) -> String {
    // No trailing blank: the chat trims each line before storing it.
    format!(
        "Entry {n}: {}end.",
        "a long walk by the river, ".repeat(150)
    )
}

/// Fills the store through `chat` until it refuses a few entries in a row, then checks
/// every line against the database: accepted lines stored, refused ones not.
fn fill_until_refused(chat: &mut Chat, db_url: &str, max_lines: usize) -> usize {
    let mut sent = Vec::new();
    let mut refused_in_a_row = 0;
    while refused_in_a_row < 3 {
        assert!(
            sent.len() < max_lines,
            "the store never filled up after {max_lines} entries"
        );
        let text = entry_text(sent.len());
        let outcome = chat.entry(&text);
        refused_in_a_row = if outcome == Outcome::Refused {
            refused_in_a_row + 1
        } else {
            0
        };
        sent.push((text, outcome));
    }
    let stored = stored_texts(db_url);
    let accepted: Vec<&String> = sent
        .iter()
        .filter(|(_, o)| *o == Outcome::Accepted)
        .map(|(t, _)| t)
        .collect();
    for (text, outcome) in &sent {
        let in_db = stored.contains(text);
        assert_eq!(
            in_db,
            *outcome == Outcome::Accepted,
            "{:?} was answered {outcome:?} but is {}stored",
            &text[..12],
            if in_db { "" } else { "not " }
        );
    }
    assert_eq!(stored.len(), accepted.len(), "accepted == stored, exactly");
    assert!(
        !accepted.is_empty(),
        "some entries fit before the store filled"
    );
    accepted.len()
}

fn chat_env(
    db_url: &str,
    telegram: &FakeTelegram,
    providers: &Providers,
) -> HashMap<String, String> {
    let mut env = test_env(db_url, telegram, providers);
    env.remove("TELOXIDE_TOKEN");
    env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_refuses_entries_plainly_and_takes_them_again_when_room_returns() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let mut env = chat_env(&db, &telegram, &providers);
    env.insert("DAYLOG__STORE__MAX_SIZE_MB".into(), "1".into());
    let workdir = dir.path().to_owned();

    let db_url = db.clone();
    let stderr = tokio::task::spawn_blocking(move || {
        let mut chat = Chat::start(&env, &workdir);
        let accepted = fill_until_refused(&mut chat, &db_url, 400);
        // Room again (someone deleted old entries): the same process takes entries again.
        delete_all_logs(&db_url);
        for n in 0..3 {
            let text = format!("After the clean-up {n}");
            assert_eq!(chat.entry(&text), Outcome::Accepted, "{}", chat.output());
        }
        assert_eq!(stored_texts(&db_url).len(), 3);
        println!("quota: {accepted} entries fitted before the store was full");
        chat.finish()
    })
    .await
    .expect("join");
    assert!(
        stderr.contains("ERROR"),
        "the operator gets an error event: {stderr}"
    );
}

/// Mounts a tmpfs of `size`; skipped (with a note) where mounting is not allowed —
/// except under `CI=true`, where a test that cannot mount fails rather than passes
/// without having run.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `Err`: why the test is skipped (the test says it).
    fn mount(size: &str) -> Result<Self, String> {
        match Self::try_mount(size) {
            Ok(disk) => Ok(disk),
            Err(why) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
                panic!("CI=true: the tmpfs full-disk tests must run here, but {why}")
            }
            Err(why) => Err(format!(
                "skipped: cannot mount a tmpfs here (needs root): {why}"
            )),
        }
    }

    fn try_mount(size: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("no temporary folder: {e}"))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("`mount` did not run: {e}"))?;
        if out.status.success() {
            Ok(Self { dir })
        } else {
            Err(format!(
                "`mount -t tmpfs` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .expect("remount");
        assert!(status.success(), "remount the tmpfs");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a file the test's bot process still holds open (its runtime's last
        // tasks) must not leave the mount behind.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_entries_plainly_and_takes_them_again_when_space_returns() {
    let disk = match Tmpfs::mount("1m") {
        Ok(disk) => disk,
        Err(skipped) => {
            println!("{skipped}");
            return;
        }
    };
    let work = tempfile::tempdir().expect("work dir");
    let db = format!("sqlite://{}/daylog.db", disk.dir.path().display());
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let env = chat_env(&db, &telegram, &providers);
    let workdir = work.path().to_owned();

    let db_url = db.clone();
    let stderr = tokio::task::spawn_blocking(move || {
        let mut chat = Chat::start(&env, &workdir);
        let accepted = fill_until_refused(&mut chat, &db_url, 400);
        disk.resize("8m");
        for n in 0..3 {
            let text = format!("After the disk grew {n}");
            assert_eq!(chat.entry(&text), Outcome::Accepted, "{}", chat.output());
        }
        assert_eq!(stored_texts(&db_url).len(), accepted + 3);
        println!("tmpfs: {accepted} entries fitted before the disk was full");
        let stderr = chat.finish();
        drop(disk);
        stderr
    })
    .await
    .expect("join");
    assert!(
        stderr.contains("ERROR"),
        "the operator gets an error event: {stderr}"
    );
}

/// Sends entry `n` (1, 2, …) of `chat` and waits for its reply (the first message
/// that answers it; an analysis that follows later is a second one).
async fn telegram_entry(app: &support::App, chat: i64, n: usize, text: &str) -> Outcome {
    let id = n as i64;
    app.telegram
        .push_update(support::telegram::text_update(chat, id, text));
    let answers = |calls: &[support::telegram::Call]| {
        calls
            .iter()
            .find(|c| c.chat_id() == Some(chat) && c.reply_to() == Some(id))
            .map(|c| c.text().to_owned())
    };
    let calls = app
        .telegram
        .wait_for(&format!("the answer to entry {n}"), HANG_GUARD, |calls| {
            answers(calls).is_some()
        })
        .await;
    let reply = answers(&calls).expect("an answer");
    if reply.contains(REFUSED) {
        return Outcome::Refused;
    }
    assert!(
        reply.contains(ACCEPTED) || reply.contains(STORED_SAFE),
        "one entry, one outcome: {reply:?}"
    );
    Outcome::Accepted
}

/// The Telegram front end on a full disk (the tmpfs, where SQLite fails at commit,
/// after `INSERT … RETURNING` handed back its row): every entry is either answered as
/// saved and stored, or told once that it is not saved yet — and then, once the disk
/// has room again, taken by the same process without being sent again: in the end
/// every entry is stored and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_telegram_tells_entries_they_wait_and_takes_them_when_space_returns() {
    const CHAT: i64 = 5300;
    // Room for the migrated database, its write-ahead log and a few entries: with 1 MiB
    // the schema's thirtieth migration left no room for even the first entry (its
    // user's row failed before the entry was reached), which is not what this tests.
    let disk = match Tmpfs::mount("2m") {
        Ok(disk) => disk,
        Err(skipped) => {
            println!("{skipped}");
            return;
        }
    };
    let db = format!("sqlite://{}/daylog.db", disk.dir.path().display());
    let app = support::App::spawn_with(|env| {
        env.insert("DATABASE_URL".into(), db.clone());
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
    })
    .await;
    app.providers.healthy().await;
    let mut sent: Vec<String> = Vec::new();
    // One at a time until an entry is told to wait.
    loop {
        assert!(sent.len() < 400, "the disk never filled up");
        let text = entry_text(sent.len());
        let outcome = telegram_entry(&app, CHAT, sent.len() + 1, &text).await;
        sent.push(text);
        if outcome == Outcome::Refused {
            break;
        }
    }
    let first_wait = sent.len() as i64;
    // Two more while the disk is full: they wait in the inbox, or are told to wait.
    for n in 0..2 {
        let text = format!("While the disk was full {n}");
        app.telegram.push_update(support::telegram::text_update(
            CHAT,
            sent.len() as i64 + 1,
            &text,
        ));
        sent.push(text);
    }
    disk.resize("8m");
    for n in 0..3 {
        let text = format!("After the disk grew {n}");
        app.telegram.push_update(support::telegram::text_update(
            CHAT,
            sent.len() as i64 + 1,
            &text,
        ));
        sent.push(text);
    }
    // Every entry is taken and answered, none sent again.
    let all = sent.len() as i64;
    app.telegram
        .wait_for("every entry to be answered", HANG_GUARD, |calls| {
            (1..=all).all(|n| {
                calls
                    .iter()
                    .any(|c| c.reply_to() == Some(n) && c.text().contains(ACCEPTED))
            })
        })
        .await;

    // A connection of its own: one of the read pool may still see the snapshot it read
    // while the disk was full.
    let reader = sqlx::SqlitePool::connect(&db).await.expect("reader");
    let stored: Vec<String> = sqlx::query_scalar("SELECT text FROM day_logs ORDER BY id")
        .fetch_all(&reader)
        .await
        .expect("texts");
    reader.close().await;
    assert_eq!(stored, sent, "every entry stored once, in the order sent");
    let calls = app.telegram.calls();
    let told = |n: i64| {
        calls
            .iter()
            .filter(|c| c.reply_to() == Some(n) && c.text().contains(REFUSED))
            .count()
    };
    assert_eq!(told(first_wait), 1, "told once that it waits");
    assert!((1..=all).all(|n| told(n) <= 1), "never told twice");
    assert!(first_wait > 1, "some entries fitted before the disk filled");
    println!("telegram on tmpfs: {} entries fitted", first_wait - 1);
    let store = app.store.clone();
    app.stop().await;
    store.close().await;
    drop(disk);
}

/// Makes the writes `event` of `day_logs` (when `condition`) fail the way a full disk
/// makes them fail, until `DROP TRIGGER test_no_room`.
async fn no_room_for(app: &support::App, event: &str, condition: &str) {
    app.write(&format!(
        "CREATE TRIGGER test_no_room BEFORE {event} ON day_logs WHEN {condition}
         BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END"
    ))
    .await;
}

/// An answer that went out while the store could not record it (the disk filled up in
/// between) is not sent again on every worker poll; it is recorded once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_cannot_be_recorded_is_not_sent_again_and_again() {
    let app = support::App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
    })
    .await;
    app.providers.healthy().await;
    // Recording a reply fails the way a full disk makes it fail: the write is refused.
    no_room_for(&app, "UPDATE OF replied_at", "NEW.replied_at IS NOT NULL").await;

    app.telegram.push_update(support::telegram::text_update(
        5100,
        1,
        "A day with no room.",
    ));
    let sent = app.telegram.wait_sent(5100, 1).await;
    assert!(sent[0].text().contains(support::ANALYSIS_TEXT));
    // The worker polls every 100 ms (test settings): ten chances to send it again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(app.telegram.sent_to(5100).len(), 1, "answered once");

    // Room again: the record is written, still without a second answer.
    app.write("DROP TRIGGER test_no_room").await;
    support::wait_until("the answer to be recorded", HANG_GUARD, || async {
        app.count("SELECT count(*) FROM day_logs WHERE replied_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    assert_eq!(app.telegram.sent_to(5100).len(), 1, "answered once");
    app.stop().await;
}

/// An analysis that cannot be stored (the disk filled up between the entry and its
/// answer) is not asked for again at every worker poll: each try is a whole cascade on
/// the free tiers' budgets. The worker leaves the log alone for a growing while, and
/// answers it once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_analysis_that_cannot_be_stored_is_not_asked_for_at_every_poll() {
    let app = support::App::spawn_with(|env| {
        env.insert("DAYLOG__TELEGRAM__ANALYSES_PER_HOUR".into(), "0".into());
        // The worker still polls every 100 ms; a failed write waits 1 s, then 2 s.
        env.insert("DAYLOG__WORKER__RETRY_MIN_MS".into(), "1000".into());
        env.insert("DAYLOG__WORKER__RETRY_MAX_MS".into(), "2000".into());
    })
    .await;
    app.providers.healthy().await;
    no_room_for(&app, "UPDATE OF status", "NEW.status = 'analyzed'").await;

    app.telegram.push_update(support::telegram::text_update(
        5200,
        1,
        "A day with no room for its analysis.",
    ));
    // The handler's try fails to store its analysis, and the user is told it follows.
    let sent = app.telegram.wait_sent(5200, 1).await;
    assert!(!sent[0].text().contains(support::ANALYSIS_TEXT), "{sent:?}");
    // Eight polls, within the second the worker waits after its own first try.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let asked = app.providers.analysis_requests().await;
    assert!(
        asked <= 2,
        "the handler's try and at most one of the worker's, not one per poll: {asked}"
    );

    app.write("DROP TRIGGER test_no_room").await;
    let sent = app.telegram.wait_sent(5200, 2).await;
    assert!(sent[1].text().contains(support::ANALYSIS_TEXT), "{sent:?}");
    support::wait_until("the answer to be recorded", HANG_GUARD, || async {
        app.count(
            "SELECT count(*) FROM day_logs WHERE status = 'analyzed' AND replied_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await;
    app.stop().await;
}

/// `/export` on a full disk in `daylog chat`: the file cannot be written, and the export
/// written there before (the user's copy) is still whole, as the sentence promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_that_does_not_fit_leaves_the_previous_export_whole() {
    let disk = match Tmpfs::mount("64k") {
        Ok(disk) => disk,
        Err(skipped) => {
            println!("{skipped}");
            return;
        }
    };
    let dir = tempfile::tempdir().expect("db dir");
    let db = format!("sqlite://{}/daylog.db", dir.path().display());
    let telegram = FakeTelegram::start().await;
    let providers = Providers::start().await;
    providers.healthy().await;
    let env = chat_env(&db, &telegram, &providers);
    let files = disk.dir.path().to_owned();

    tokio::task::spawn_blocking(move || {
        let previous = files.join("daylog-export.csv");
        std::fs::write(&previous, "the export of last week\n").expect("previous export");
        let mut chat = Chat::start(&env, &files);
        // An export of these is about 100 KB: more than the whole disk.
        for n in 0..25 {
            assert_eq!(chat.entry(&entry_text(n)), Outcome::Accepted);
        }
        // Fill what is left of the disk.
        let mut filler = std::fs::File::create(files.join("filler")).expect("filler");
        while filler.write_all(&[0u8; 4096]).is_ok() {}
        drop(filler);

        let stdin = chat.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "/export").expect("write a line");
        stdin.flush().expect("flush");
        let deadline = Instant::now() + HANG_GUARD;
        while !chat.output().contains("Could not write the file") {
            assert!(Instant::now() < deadline, "no answer: {}", chat.output());
            std::thread::sleep(Duration::from_millis(10));
        }
        let now = std::fs::read_to_string(&previous).expect("previous export");
        assert!(
            now == "the export of last week\n",
            "the earlier export is untouched, not {} bytes of the new one",
            now.len()
        );
        let left: Vec<String> = std::fs::read_dir(&files)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|name| !["daylog-export.csv", "filler", "chat.stderr"].contains(&name.as_str()))
            .collect();
        assert!(left.is_empty(), "no half-written file is left: {left:?}");
        chat.finish();
        drop(disk);
    })
    .await
    .expect("join");
}
