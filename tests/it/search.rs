//! `/search` against a real SQLite file (docs/behaviour.md, "Search"): the FTS5 index follows every write
//! by the schema's own triggers, every word must match, Latin diacritics and Cyrillic
//! case fold, and whatever a user types is a query of their own entries only, never
//! FTS5 syntax and never an error.

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] fns: a failure is a test failure"
)]

use std::collections::HashSet;
use std::time::Duration;

use std::collections::HashMap;
use std::sync::Arc;

use daylog::charts;
use daylog::commands::{self, Command};
use daylog::config::Settings;
use daylog::frontend::Response;
use daylog::journal::Journal;
use daylog::language::Language;
use daylog::render;
use daylog::store::{self, Inserted, NewLog, NewUser, SearchHit, Store};
use daylog::store::{ChatId, LogId, MessageId, UserId};
use proptest::prelude::*;
use sqlx::SqlitePool;
use support::App;
use support::telegram::text_update;

use crate::support;
use crate::support::postgres::{Backend, FreshDb, Raw, backends, on_each_backend};

const ME: i64 = 1;
const OTHER: i64 = 2;

struct TestDb {
    _db: FreshDb,
    url: String,
    store: Store,
}

/// A migrated store on SQLite (the tests of SQLite's own index and of the app).
async fn fresh() -> TestDb {
    fresh_on(Backend::Sqlite).await
}

/// A migrated store on `backend`, in a database of its own.
async fn fresh_on(backend: Backend) -> TestDb {
    let db = backend.fresh().await;
    let url = db.url.clone();
    let store = Store::open_and_migrate(&url, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("store opens on {backend}: {e}"));
    TestDb {
        _db: db,
        url,
        store,
    }
}

async fn user(store: &Store, user_id: i64) {
    store
        .upsert_user(&NewUser {
            user_id: UserId(user_id),
            username: None,
            language: Language::En,
        })
        .await
        .expect("user");
}

async fn entry(store: &Store, user_id: i64, message_id: i64, text: &str) -> LogId {
    match store
        .insert_log(&NewLog {
            user_id: UserId(user_id),
            chat_id: ChatId(user_id),
            message_id: MessageId(message_id),
            text,
            local_day: None,
            written_at: None,
        })
        .await
        .expect("insert")
    {
        Inserted::New(log) => log.id,
        Inserted::Duplicate(id) => id,
    }
}

fn ids(hits: &[SearchHit]) -> Vec<LogId> {
    hits.iter().map(|h| h.id).collect()
}

/// FTS5's own check of an external content index against `day_logs`: fails when the
/// index holds a token the content no longer has, or misses one it has.
/// (It is written as an INSERT, so it needs a writable connection.)
async fn assert_index_in_step(url: &str) {
    if url.starts_with("postgres") {
        // PostgreSQL's index: one row per entry, no row of an entry that is gone.
        let raw = Raw::connect(url).await;
        let (entries, indexed, orphans): (i64, i64, i64) = (
            raw.value("SELECT count(*) FROM day_logs").await,
            raw.value("SELECT count(*) FROM day_logs_fts").await,
            raw.value(
                "SELECT count(*) FROM day_logs_fts s
                 WHERE NOT EXISTS (SELECT 1 FROM day_logs d WHERE d.id = s.id AND d.user_id = s.user_id)",
            )
            .await,
        );
        raw.close().await;
        assert_eq!(
            (indexed, orphans),
            (entries, 0),
            "the index follows day_logs"
        );
        return;
    }
    let pool = writer(url).await;
    sqlx::query("INSERT INTO day_logs_fts (day_logs_fts, rank) VALUES ('integrity-check', 1)")
        .execute(&pool)
        .await
        .expect("the FTS index matches day_logs");
    pool.close().await;
}

async fn writer(url: &str) -> SqlitePool {
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            url.parse::<sqlx::sqlite::SqliteConnectOptions>()
                .expect("url")
                .foreign_keys(true),
        )
        .await
        .expect("writer")
}

// SQLite only, as the tests below marked so: they test FTS5 itself (its build, its
// query syntax, its integrity check, its query plan, the SQLite migrations that fill
// it). PostgreSQL's index is held by the tests that run on both backends and by
// `both_backends_find_rank_and_cut_alike`.
#[tokio::test]
async fn the_bundled_sqlite_has_fts5() {
    let db = fresh().await;

    let fts5: i64 = sqlx::query_scalar("SELECT sqlite_compileoption_used('ENABLE_FTS5')")
        .fetch_one(db.store.read_pool().expect("a SQLite store"))
        .await
        .expect("compile options");

    assert_eq!(fts5, 1);
}

on_each_backend! {
    async fn every_word_must_match_and_matches_are_bold_in_the_snippet(db: TestDb) {
        user(&db.store, ME).await;
    let both = entry(&db.store, ME, 1, "Ran in the park, then coffee with Anna.").await;
    entry(&db.store, ME, 2, "Coffee alone at home.").await;
    entry(&db.store, ME, 3, "A run in the rain.").await;

    let hits = db
        .store
        .search(UserId(ME), "coffee park")
        .await
        .expect("search");

    assert_eq!(ids(&hits), vec![both]);
    let runs = hits[0].snippet();
    let bold: Vec<&str> = runs
        .iter()
        .filter(|r| r.matched)
        .map(|r| r.text.as_str())
        .collect();
    assert_eq!(bold, ["park", "coffee"]);
    let plain: String = runs.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(plain, "Ran in the park, then coffee with Anna.");
    // The day the store gave the entry (stored without one, the day it was stored on,
    // which starts at 04:00: not `date('now')`, another day between 00:00 and 04:00).
    let raw = Raw::connect(&db.url).await;
    let stored: String = raw
        .value(&format!("SELECT local_day FROM day_logs WHERE id = {}", both.get()))
        .await;
    raw.close().await;
    assert_eq!(hits[0].day, Some(stored.parse().expect("date")));
}
}

on_each_backend! {
    async fn best_matches_come_first_and_at_most_five(db: TestDb) {
        user(&db.store, ME).await;
    for i in 0..8 {
        entry(
            &db.store,
            ME,
            i,
            &format!("Entry {i}: a long day of meetings, email, lunch, meetings again."),
        )
        .await;
    }
    let best = entry(&db.store, ME, 100, "Tired.").await;
    let dense = entry(&db.store, ME, 101, "Tired, tired, tired.").await;
    for i in 0..6 {
        entry(
            &db.store,
            ME,
            200 + i,
            &format!("Day {i}: tired after meetings, email, lunch and a long commute home."),
        )
        .await;
    }

    let hits = db.store.search(UserId(ME), "tired").await.expect("search");

    assert_eq!(hits.len(), 5);
    // bm25: the word making up all of a short entry ranks above a long entry that
    // mentions it once.
    let first_two: HashSet<LogId> = ids(&hits).into_iter().take(2).collect();
    assert_eq!(first_two, HashSet::from([best, dense]));
}
}

on_each_backend! {
    async fn another_users_flood_of_newer_matches_does_not_hide_mine(db: TestDb) {
        user(&db.store, ME).await;
    user(&db.store, OTHER).await;
    let mine = entry(&db.store, ME, 1, "Tired but happy.").await;
    let raw = Raw::connect(&db.url).await;
    raw.exec(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {flood})
         INSERT INTO day_logs (user_id, chat_id, message_id, text)
         SELECT {OTHER}, {OTHER}, 100 + i, 'Tired, tired.' FROM n",
        flood = store::SEARCH_CANDIDATES * 2
    ))
    .await;
    raw.close().await;

    let hits = db.store.search(UserId(ME), "tired").await.expect("search");

    assert_eq!(ids(&hits), [mine]);
}
}

on_each_backend! {
    async fn latin_diacritics_and_cyrillic_case_fold(db: TestDb) {
        user(&db.store, ME).await;
    let cafe = entry(&db.store, ME, 1, "Un café crème à Zürich.").await;
    let russian = entry(
        &db.store,
        ME,
        2,
        "Сегодня был ХОРОШИЙ день, гуляли в парке.",
    )
    .await;

    assert_eq!(
        ids(&db.store.search(UserId(ME), "cafe").await.expect("s")),
        [cafe]
    );
    assert_eq!(
        ids(&db
            .store
            .search(UserId(ME), "ZURICH creme")
            .await
            .expect("s")),
        [cafe]
    );
    assert_eq!(
        ids(&db.store.search(UserId(ME), "Café").await.expect("s")),
        [cafe]
    );
    assert_eq!(
        ids(&db
            .store
            .search(UserId(ME), "хороший ДЕНЬ")
            .await
            .expect("s")),
        [russian]
    );
    let runs = db.store.search(UserId(ME), "парке").await.expect("s")[0].snippet();
    assert!(
        runs.iter().any(|r| r.matched && r.text == "парке"),
        "{runs:?}"
    );
}
}

on_each_backend! {
    /// Russian writes "ещё" and "еще" for one word: either spelling finds both, and the
    /// snippet shows each entry as it was written, its own spelling bold.
    async fn yo_and_ye_are_one_letter_to_search_and_snippets_keep_the_original(db: TestDb) {
        user(&db.store, ME).await;
    let dotted = entry(&db.store, ME, 1, "Ещё один день, ещё прогулка. Ёлка!").await;
    let plain = entry(&db.store, ME, 2, "еще без точек, елка").await;
    let mut both = vec![dotted, plain];
    both.sort_unstable();

    for query in ["еще", "ещё", "ЕЩЁ", "Еще"] {
        let mut found = ids(&db.store.search(UserId(ME), query).await.expect("s"));
        found.sort_unstable();
        assert_eq!(found, both, "{query}");
    }
    for query in ["ёлка", "елка", "ЁЛКА"] {
        assert_eq!(
            db.store.search(UserId(ME), query).await.expect("s").len(),
            2,
            "{query}"
        );
    }
    let hits = db.store.search(UserId(ME), "еще").await.expect("s");
    let dotted_hit = hits
        .iter()
        .find(|h| h.id == LogId(dotted.get()))
        .expect("found");
    let bold: Vec<String> = dotted_hit
        .snippet()
        .into_iter()
        .filter(|r| r.matched)
        .map(|r| r.text)
        .collect();
    assert_eq!(bold, ["Ещё", "ещё"]);
    let shown: String = dotted_hit.snippet().into_iter().map(|r| r.text).collect();
    assert!(shown.contains("Ёлка"), "{shown}");

    // A long entry is cut around the match; what is shown is still as written.
    let long = format!(
        "{}ёж пришёл тут{}",
        "слово ".repeat(30),
        " конец".repeat(30)
    );
    let long_id = entry(&db.store, ME, 3, &long).await;
    let hits = db.store.search(UserId(ME), "еж").await.expect("s");
    assert_eq!(ids(&hits), [long_id]);
    let runs = hits[0].snippet();
    let shown: String = runs.iter().map(|r| r.text.as_str()).collect();
    assert!(shown.starts_with('…') && shown.ends_with('…'), "{shown}");
    assert!(shown.contains(" пришёл тут "), "{shown}");
    assert!(runs.iter().any(|r| r.matched && r.text == "ёж"), "{runs:?}");

    // The folded index follows edits and deletes like the plain one did.
    db.store
        .update_text(ChatId(ME), MessageId(1), "Сегодня без слов")
        .await
        .expect("edit")
        .expect("changed");
    assert_eq!(
        ids(&db.store.search(UserId(ME), "ещё").await.expect("s")),
        [plain]
    );
    db.store.delete_user(UserId(ME)).await.expect("/delete");
    assert!(
        db.store
            .search(UserId(ME), "еще")
            .await
            .expect("s")
            .is_empty()
    );
}
}

#[test]
fn the_search_fold_changes_only_yo() {
    assert_eq!(store::fold_for_search("Ёлка, ещё, café"), "Елка, еще, café");
    assert_eq!(
        store::fts_query("ещё \"Ёж\""),
        Some("\"еще\" AND \"\"\"Еж\"\"\"".into())
    );
}

/// Any word of е, ё and other letters, written with any choice of е or ё where the
/// entry has either, finds the entry, and the snippet marks the word as written.
#[test]
fn any_spelling_of_yo_finds_the_word_as_written() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // On each backend: the same property.
    for backend in backends() {
        let db = runtime.block_on(async {
            let db = fresh_on(backend).await;
            user(&db.store, ME).await;
            entry(&db.store, ME, 1, "start").await;
            db
        });
        let letter = prop::sample::select(vec!['е', 'ё', 'Е', 'Ё', 'ж', 'Ж', 'a']);
        let word = prop::collection::vec(letter, 1..8);
        let flips = prop::collection::vec(any::<bool>(), 8);
        proptest!(ProptestConfig::with_cases(100), |(word in word, flips in flips)| {
            let written: String = word.iter().collect();
            let asked: String = word
                .iter()
                .zip(&flips)
                .map(|(c, flip)| match (c, flip) {
                    ('е', true) => 'ё',
                    ('ё', true) => 'е',
                    ('Е', true) => 'ё',
                    ('Ё', true) => 'е',
                    (c, _) => *c,
                })
                .collect();
            let text = format!("before {written} after");
            runtime.block_on(db.store.update_text(ChatId(ME), MessageId(1), &text)).expect("edit");
            let hits = runtime.block_on(db.store.search(UserId(ME), &asked)).expect("search");
            prop_assert_eq!(hits.len(), 1, "{:?} for {:?}", asked, written);
            let bold: Vec<String> = hits[0]
                .snippet()
                .into_iter()
                .filter(|r| r.matched)
                .map(|r| r.text)
                .collect();
            prop_assert_eq!(bold, vec![written.clone()]);
        });
        runtime.block_on(assert_index_in_step(&db.url));
    }
}

on_each_backend! {
    async fn edits_and_deletes_are_reflected_by_the_schema(db: TestDb) {
        user(&db.store, ME).await;
    user(&db.store, OTHER).await;
    let mine = entry(&db.store, ME, 1, "Walked the dog by the river.").await;
    entry(&db.store, OTHER, 1, "The river was cold.").await;

    db.store
        .update_text(ChatId(ME), MessageId(1), "Walked the dog in the forest.")
        .await
        .expect("edit")
        .expect("changed");

    assert!(
        db.store
            .search(UserId(ME), "river")
            .await
            .expect("s")
            .is_empty()
    );
    assert_eq!(
        ids(&db.store.search(UserId(ME), "forest").await.expect("s")),
        [mine]
    );
    assert_index_in_step(&db.url).await;

    db.store.delete_user(UserId(ME)).await.expect("/delete");

    assert!(
        db.store
            .search(UserId(ME), "forest")
            .await
            .expect("s")
            .is_empty()
    );
    assert!(
        db.store
            .search(UserId(ME), "dog")
            .await
            .expect("s")
            .is_empty()
    );
    assert_eq!(
        db.store
            .search(UserId(OTHER), "river")
            .await
            .expect("s")
            .len(),
        1
    );
    assert_index_in_step(&db.url).await;

    // Rows that go by the users(user_id) cascade, not by a DELETE of day_logs.
    let raw = Raw::connect(&db.url).await;
    raw.exec(&format!("DELETE FROM users WHERE user_id = {OTHER}")).await;
    raw.close().await;
    assert!(
        db.store
            .search(UserId(OTHER), "river")
            .await
            .expect("s")
            .is_empty()
    );
    assert_index_in_step(&db.url).await;
}
}

/// SQLite only: README's query is FTS5's (the PostgreSQL examples of docs/operations.md
/// are run by `cli::on_postgres_every_command_works_and_never_shows_the_password`).
#[tokio::test]
async fn the_readme_query_runs_through_the_read_only_daylog_sql() {
    let db = fresh().await;
    user(&db.store, ME).await;
    entry(&db.store, ME, 1, "Coffee in the park.").await;
    entry(&db.store, ME, 2, "Coffee at home.").await;
    let pool = store::open_read_only(&db.url, store::Limits::busy_timeout(Duration::from_secs(5)))
        .await
        .expect("read-only");

    let result = daylog::sqlcmd::query(
        &pool,
        "SELECT d.created_at, d.text FROM
         day_logs_fts JOIN day_logs d ON d.id = day_logs_fts.rowid WHERE day_logs_fts MATCH
         'coffee AND park' ORDER BY rank",
        &daylog::sqlcmd::Limits {
            timeout: std::time::Duration::from_secs(30),
            max_rows: 1_000_000,
        },
    )
    .await
    .expect("the query of README runs");

    assert_eq!(result.rows.len(), 1);
}

/// SQLite only: a SQLite migration filling FTS5.
#[tokio::test]
async fn the_migration_indexes_entries_stored_before_it() {
    // Arrange: a database at the schema before this migration, with an entry.
    let (_dir, url) = support::database_before(
        "20261201000005",
        &[
            "INSERT INTO users (user_id, chat_id) VALUES (1, 1)",
            "INSERT INTO day_logs (user_id, chat_id, message_id, text) VALUES (1, 1, 1, 'An old entry about tulips.')",
        ],
    )
    .await;

    // Act
    let store = Store::open_and_migrate(&url, Duration::from_secs(5))
        .await
        .expect("migrates");

    // Assert
    assert_eq!(
        store.search(UserId(ME), "tulips").await.expect("s").len(),
        1
    );
    assert_index_in_step(&url).await;
}

/// SQLite only: a SQLite migration refilling FTS5.
#[tokio::test]
async fn the_fold_migration_reindexes_entries_stored_before_it() {
    // Arrange: the schema just before the fold, with an entry written with ё.
    let (_dir, url) = support::database_before(
        "20261201000012",
        &[
            "INSERT INTO users (user_id, chat_id) VALUES (1, 1)",
            "INSERT INTO day_logs (user_id, chat_id, message_id, text) VALUES (1, 1, 1, 'Ещё раз')",
        ],
    )
    .await;

    // Act
    let store = Store::open_and_migrate(&url, Duration::from_secs(5))
        .await
        .expect("migrates");

    // Assert: found by either spelling; deleting it leaves no token behind.
    assert_eq!(store.search(UserId(ME), "еще").await.expect("s").len(), 1);
    assert_eq!(store.search(UserId(ME), "ещё").await.expect("s").len(), 1);
    store.delete_user(UserId(ME)).await.expect("delete");
    assert!(store.search(UserId(ME), "еще").await.expect("s").is_empty());
    assert_index_in_step(&url).await;
}

/// SQLite only: SQLite's query plan.
#[tokio::test]
async fn the_search_reads_the_index_not_every_row() {
    let db = fresh().await;

    let plan: Vec<String> = sqlx::query_as::<_, (i64, i64, i64, String)>(&format!(
        "EXPLAIN QUERY PLAN {}",
        store::SEARCH_SQL
    ))
    .bind(ME)
    .bind("\"word\"")
    .bind("[")
    .bind("]")
    .bind(5)
    .bind(1000)
    .fetch_all(db.store.read_pool().expect("a SQLite store"))
    .await
    .expect("plan")
    .into_iter()
    .map(|row| row.3)
    .collect();

    // The candidates: matches newest first straight from the index (no sort), each
    // joined to its row by primary key and stopped after SEARCH_CANDIDATES.
    // (The candidates' CTE is named in the plan, or flattened into a subquery: the
    // best few are counted over them with a window, `count(*) OVER ()`.)
    let step = |text: &str| plan.iter().position(|s| s == text);
    let candidates_step = |prefix: &str| {
        plan.iter().position(|s| {
            s == &format!("{prefix} candidates") || (s.starts_with(&format!("{prefix} (subquery")))
        })
    };
    let (start, end) = (
        candidates_step("CO-ROUTINE").unwrap_or_else(|| panic!("candidates: {plan:#?}")),
        candidates_step("SCAN").unwrap_or_else(|| panic!("candidates scanned: {plan:#?}")),
    );
    let candidates = &plan[start..end];
    assert!(
        candidates
            .iter()
            .any(|s| s.starts_with("SCAN day_logs_fts VIRTUAL TABLE INDEX")),
        "{plan:?}"
    );
    assert!(
        candidates.contains(&"SEARCH d USING INTEGER PRIMARY KEY (rowid=?)".to_owned()),
        "{plan:?}"
    );
    assert!(
        !candidates.iter().any(|s| s.contains("TEMP B-TREE")),
        "{plan:?}"
    );
    // The snippets: the best few, each looked up in the index by rowid, never a second
    // scan of every match.
    let best = step("SCAN best").expect("best first");
    assert!(
        plan[best..]
            .iter()
            .any(|s| s.starts_with("SCAN day_logs_fts VIRTUAL TABLE INDEX") && s.contains(":=")),
        "{plan:?}"
    );
    assert!(!plan.iter().any(|s| s.contains("AUTOMATIC")), "{plan:?}");
}

#[test]
fn user_words_become_fts5_strings() {
    assert_eq!(store::fts_query("   \n "), None);
    // Nothing in them for the tokenizer to find: no word is left to look for.
    assert_eq!(store::fts_query("\" - * ( ) --"), None);
    assert_eq!(
        store::fts_query("a NEAR b -"),
        Some("\"a\" AND (\"NEAR\" OR \"near\"*) AND \"b\"".into())
    );
    assert_eq!(
        store::fts_query("x\0y say:\"hi\""),
        Some("\"x\" AND \"y\" AND \"say:\"\"hi\"\"\"".into())
    );
    // An operator or a star typed beside a word is text, quoted: marks at a word's ends
    // cost it no forms ("друзья*", "(работа)"), a mark inside one keeps it as typed.
    assert_eq!(
        store::fts_query("друзья* OR (работа) - NEAR(друзья"),
        Some(
            "(\"друзья*\" OR \"друз\"*) AND \"OR\" AND (\"(работа)\" OR \"работ\"*) AND \"NEAR(друзья\""
                .into()
        )
    );
    assert_eq!(
        store::fts_query("Друзья"),
        Some("(\"Друзья\" OR \"друз\"*)".into())
    );
}

on_each_backend! {
    /// A lone `-` beside words is skipped, as it was when strings stood side by side; alone,
    /// it finds nothing.
    async fn a_word_with_nothing_to_find_is_left_out(db: TestDb) {
    // Arrange
        user(&db.store, ME).await;
    let coffee = entry(&db.store, ME, 1, "Coffee - then the park.").await;

    // Act
    let beside_words = db
        .store
        .search(UserId(ME), "coffee - park")
        .await
        .expect("s");
    let alone = db.store.search(UserId(ME), "- * \"").await.expect("s");

    // Assert
    assert_eq!(ids(&beside_words), [coffee]);
    assert!(alone.is_empty());
}
}

/// Words the property test mixes: FTS5 operators and punctuation, words of both users'
/// entries, and words of nobody's.
const VOCABULARY: &[&str] = &[
    "\"", "\"\"", "NEAR", "NEAR(", "AND", "OR", "NOT", "*", "-", ":", "^", "(", ")", "text:",
    "-park", "park*", "^coffee", "{text}", "+", "'", "''", ";", "--", "%", "_", "park", "coffee",
    "secret", "river", "день", "парк", "café", "cafe", "nothing", "x",
];

fn hostile_query() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(prop::sample::select(VOCABULARY), 0..6).prop_map(|w| w.join(" ")),
        prop::collection::vec(prop::sample::select(VOCABULARY), 1..6).prop_map(|w| w.concat()),
    ]
}

/// Lower-cased words as unicode61 sees them in these fixtures (letters and digits).
fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase().replace('é', "e"))
        .collect()
}

/// Could search find `token` as a form of `word` (both lower case)? Every form begins
/// with the word's stem, of three letters or more, which keeps at least the word's
/// first two (English may end a stem in `i` for `y`: "try", "tri").
fn may_be_a_form(word: &str, token: &str) -> bool {
    let start: String = word.chars().take(2).collect();
    token == word || (word.chars().count() >= 3 && token.starts_with(&start))
}

#[test]
fn any_string_is_a_valid_query_of_the_users_own_entries_only() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // On each backend: the same property.
    for backend in backends() {
        let mine_texts = [
            "Coffee in the park.",
            "Secret coffee: NEAR the river (really) *",
            "День в парке, café.",
            "\"Quoted\" - park -- ^ :",
        ];
        let other_texts = [
            "secret river park coffee NEAR AND OR NOT",
            "день парк café x",
        ];
        let (db, mine) = runtime.block_on(async {
            let db = fresh_on(backend).await;
            user(&db.store, ME).await;
            user(&db.store, OTHER).await;
            let mut mine = Vec::new();
            for (i, text) in (1..).zip(mine_texts) {
                mine.push((entry(&db.store, ME, i, text).await, words(text)));
            }
            for (i, text) in (1..).zip(other_texts) {
                entry(&db.store, OTHER, i, text).await;
            }
            (db, mine)
        });
        let my_ids: HashSet<LogId> = mine.iter().map(|(id, _)| *id).collect();

        proptest!(ProptestConfig::with_cases(300), |(query in hostile_query())| {
            let hits = runtime.block_on(db.store.search(UserId(ME), &query));

            let hits = hits.map_err(|e| TestCaseError::fail(format!("{query:?}: {e}")))?;
            for hit in &hits {
                prop_assert!(my_ids.contains(&LogId(hit.id.get())), "{query:?} found someone else's {}", hit.id);
            }
            // Plain words: every entry that contains all of them as typed, and only entries
            // that contain each of them in some form.
            let asked: Vec<String> = query.split_whitespace().map(str::to_owned).collect();
            if !asked.is_empty() && asked.iter().all(|w| w.chars().all(char::is_alphanumeric)) {
                let asked = words(&query);
                let as_typed: HashSet<LogId> = mine
                    .iter()
                    .filter(|(_, have)| asked.is_subset(have))
                    .map(|(id, _)| *id)
                    .collect();
                let in_some_form: HashSet<LogId> = mine
                    .iter()
                    .filter(|(_, have)| {
                        asked.iter().all(|word| have.iter().any(|token| may_be_a_form(word, token)))
                    })
                    .map(|(id, _)| *id)
                    .collect();
                let found: HashSet<LogId> = hits.iter().map(|h| h.id).collect();
                prop_assert!(found.is_superset(&as_typed), "{query:?}: {found:?}");
                prop_assert!(found.is_subset(&in_some_form), "{query:?}: {found:?}");
            }
        });
    }
}

async fn journal(db: &TestDb) -> Arc<Journal> {
    let env: HashMap<String, String> = [("DATABASE_URL".to_owned(), db.url.clone())].into();
    let settings = Settings::load_from(&env).expect("settings");
    let app = daylog::app::App::build(settings).await.expect("app");
    Arc::clone(app.journal())
}

/// The Telegram HTML of a command's one text answer.
async fn answer_html(journal: &Journal, command: Command) -> String {
    let responses = commands::respond(journal.store(), journal.users(), UserId(ME), command)
        .await
        .expect("answer");
    match responses.as_slice() {
        [Response::Text(reply)] => render::split_message(reply.pieces(), 4096).concat(),
        other => panic!("not one text: {other:?}"),
    }
}

on_each_backend! {
    async fn the_search_answer_escapes_the_entry_and_bolds_only_the_matches(db: TestDb) {
        user(&db.store, ME).await;
    entry(&db.store, ME, 1, "<b>Not bold</b> & tulips <i>here</i>").await;
    let journal = journal(&db).await;

    let found = answer_html(&journal, Command::Search("TULIPS".into())).await;
    let nothing = answer_html(&journal, Command::Search("roses".into())).await;
    let no_words = answer_html(&journal, Command::Search("  ".into())).await;
    let syntax = answer_html(&journal, Command::Search("\" NEAR( *".into())).await;

    assert!(
        found.contains("&lt;b&gt;Not bold&lt;/b&gt; &amp; <b>tulips</b> &lt;i&gt;here&lt;/i&gt;"),
        "{found}"
    );
    assert!(found.starts_with("<b>Found: 1"), "{found}");
    assert_eq!(nothing, "None of your entries contains all of these words.");
    assert!(no_words.starts_with("Usage: /search"), "{no_words}");
    assert_eq!(syntax, nothing);
}
}

on_each_backend! {
    /// A found entry whose stored day is no date (a hand edit) is still shown, without a
    /// day line, never with the stored text as its day; a good day is shown as a date.
    async fn a_found_entry_whose_day_is_no_date_is_shown_without_its_day(db: TestDb) {
        user(&db.store, ME).await;
    let good = entry(&db.store, ME, 1, "tulips in the park").await;
    let bad = entry(&db.store, ME, 2, "tulips at home").await;
    let raw = Raw::connect(&db.url).await;
    for (id, day) in [(good, "2026-04-05"), (bad, "junk day")] {
        raw.exec(&format!(
            "UPDATE day_logs SET local_day = '{day}' WHERE id = {}",
            id.get()
        ))
        .await;
    }
    raw.close().await;
    let journal = journal(&db).await;

    let found = answer_html(&journal, Command::Search("tulips".into())).await;

    assert!(found.starts_with("<b>Found: 2"), "{found}");
    assert!(
        found.contains("<b>2026-04-05</b>\n<b>tulips</b> in the park"),
        "{found}"
    );
    assert!(found.contains("\n\n<b>tulips</b> at home"), "{found}");
    assert!(!found.contains("junk"), "{found}");
}
}

/// Stores an analysed entry of `user_id` on `day` with the given metrics JSON.
async fn analysed_on(db: &TestDb, user_id: i64, message_id: i64, day: &str, metrics: &str) {
    let id = entry(&db.store, user_id, message_id, "An entry.").await;
    assert!(
        db.store
            .record(
                LogId(id.get()),
                "An entry.",
                &support::analysed("An analysis.", metrics)
            )
            .await
            .expect("analysed")
    );
    // Text both dialects read, with the values formatted in (a day is digits and dashes).
    let raw = Raw::connect(&db.url).await;
    raw.exec(&format!(
        "UPDATE day_logs SET created_at = '{day} 12:00:00', local_day = '{day}' WHERE id = {}",
        id.get()
    ))
    .await;
    raw.close().await;
}

fn metrics(mood: u8, defaulted: &[&str]) -> String {
    serde_json::json!({
        "mood": mood, "stress": 3, "energy": 3, "productivity": 3, "sleep_hours": null,
        "activities": [], "emotions": [], "summary": "", "defaulted": defaulted,
    })
    .to_string()
}

fn pixel(png: &[u8], month: u32, day: u32) -> [u8; 3] {
    let img = image::load_from_memory(png).expect("png").to_rgb8();
    let (x, y) = charts::year_cell_origin(month, day);
    img.get_pixel((x + 8) as u32, (y + 8) as u32).0
}

fn rgb(color: plotters::style::RGBColor) -> [u8; 3] {
    [color.0, color.1, color.2]
}

on_each_backend! {
async fn the_year_colours_each_day_by_its_moods_that_were_not_defaulted(db: TestDb) {
    user(&db.store, ME).await;
    user(&db.store, OTHER).await;
    analysed_on(&db, ME, 1, "2025-03-10", &metrics(5, &[])).await;
    analysed_on(&db, ME, 2, "2025-03-11", &metrics(3, &["mood"])).await;
    // A defaulted 3 beside a real 1: the day is a 1, not a 2.
    analysed_on(&db, ME, 3, "2025-03-12", &metrics(3, &["mood"])).await;
    analysed_on(&db, ME, 4, "2025-03-12", &metrics(1, &["sleep_hours"])).await;
    analysed_on(&db, ME, 5, "2024-03-13", &metrics(5, &[])).await;
    analysed_on(&db, OTHER, 1, "2025-03-13", &metrics(5, &[])).await;
    let journal = journal(&db).await;

    let responses = commands::respond(
        journal.store(),
        journal.users(),
        UserId(ME),
        Command::Year("2025".into()),
    )
    .await
    .expect("/year");

    let [Response::Photo { png, file_name, .. }] = responses.as_slice() else {
        panic!("not one photo: {responses:?}");
    };
    assert_eq!(file_name, "daylog-year-2025.png");
    assert_eq!(pixel(png, 3, 10), rgb(charts::MOOD_COLORS[4]));
    assert_eq!(
        pixel(png, 3, 11),
        rgb(charts::NO_MOOD_COLOR),
        "only a defaulted mood"
    );
    assert_eq!(pixel(png, 3, 12), rgb(charts::MOOD_COLORS[0]));
    assert_eq!(
        pixel(png, 3, 13),
        rgb(charts::NO_MOOD_COLOR),
        "another year, another user"
    );
}
}

on_each_backend! {
async fn the_year_defaults_to_this_one_and_a_bad_year_gets_a_sentence(db: TestDb) {
    user(&db.store, ME).await;
    let journal = journal(&db).await;
    // The year of a UTC moment as the store writes it.
    let this_year = daylog::time::sql_timestamp(jiff::Timestamp::now())[..4].to_owned();

    let responses = commands::respond(
        journal.store(),
        journal.users(),
        UserId(ME),
        Command::Year(String::new()),
    )
    .await
    .expect("/year");
    let bad = answer_html(&journal, Command::Year("25".into())).await;

    assert!(
        matches!(responses.as_slice(), [Response::Photo { file_name, .. }]
            if *file_name == format!("daylog-year-{this_year}.png")),
        "{responses:?}"
    );
    assert!(bad.starts_with("Usage: /year"), "{bad}");
}
}

/// On each backend (the app in process).
#[tokio::test]
async fn in_telegram_search_answers_in_escaped_html_and_year_sends_a_png() {
    for backend in backends() {
        in_telegram_search_and_year_on(backend).await;
    }
}

async fn in_telegram_search_and_year_on(backend: Backend) {
    let app = App::spawn_on_backend(backend, |_| {}).await;
    app.providers.healthy().await;
    app.telegram
        .push_update(text_update(21, 1, "Coffee <with> Anna & Bob."));
    app.telegram.wait_sent(21, 1).await;

    app.telegram
        .push_update(text_update(21, 2, "/search anna COFFEE"));
    let found = app.telegram.wait_sent(21, 2).await;
    app.telegram
        .push_update(text_update(21, 3, "/search -anna \"coffee* (bob)"));
    let hostile = app.telegram.wait_sent(21, 3).await;
    app.telegram.push_update(text_update(21, 4, "/year"));
    let calls = app
        .telegram
        .wait_for("a photo", Duration::from_secs(20), |calls| {
            calls.iter().any(|c| c.method == "SendPhoto")
        })
        .await;

    assert_eq!(found[1].body["parse_mode"], "HTML");
    assert!(
        found[1]
            .text()
            .contains("<b>Coffee</b> &lt;with&gt; <b>Anna</b> &amp; Bob."),
        "{}",
        found[1].text()
    );
    // Words only: FTS5 would read `-` as NOT, `*` as a prefix, `(…)` as a group.
    assert!(
        hostile[2].text().contains("<b>Anna</b>"),
        "{backend}: {}",
        hostile[2].text()
    );
    let photo = calls
        .iter()
        .find(|c| c.method == "SendPhoto")
        .expect("photo");
    let png = photo.file.as_ref().expect("file part");
    let image = image::load_from_memory(png).expect("a PNG");
    assert_eq!(
        (image.width(), image.height()),
        (charts::YEAR_WIDTH, charts::YEAR_HEIGHT)
    );
    assert!(
        photo.body["caption"]
            .as_str()
            .unwrap_or_default()
            .contains("in pixels"),
        "{:?}",
        photo.body
    );
    app.stop().await;
}

on_each_backend! {
    /// `/search` shows up to 5 matches: the title counts every match, not only those shown.
    async fn the_search_title_counts_every_match_not_only_those_shown(db: TestDb) {
        user(&db.store, ME).await;
    for i in 1..=7 {
        entry(&db.store, ME, i, &format!("tired day number {i}")).await;
    }
    let journal = journal(&db).await;

    let found = answer_html(&journal, Command::Search("tired".into())).await;

    assert!(
        found.starts_with("<b>Found: 7; here are the 5 best</b>"),
        "{found}"
    );
    assert_eq!(found.matches("<b>tired</b>").count(), 5, "{found}");
}
}

// ---- word forms: a word also finds its other forms, through its Snowball stem ----

/// The ids `/search words` finds, in id order.
async fn found(store: &Store, words: &str) -> Vec<LogId> {
    let mut ids = ids(&store.search(UserId(ME), words).await.expect("search"));
    ids.sort_unstable();
    ids
}

/// Entries that do not hold the words searched for, so that bm25 sees a journal
/// (a word in more than half the entries scores next to nothing).
async fn other_entries(store: &Store, from_message: i64) {
    for (i, text) in (from_message..).zip([
        "Дома, без новостей.",
        "Quiet evening with a book.",
        "Дождь весь день.",
        "Cooked soup and slept early.",
    ]) {
        entry(store, ME, i, text).await;
    }
}

/// FTS5, with the index's tokenizer, takes the query `fts_query` makes: a group of a
/// word and its stem as a prefix, groups joined by `AND`. (A group beside a string
/// without `AND` is a syntax error, which is why the words are joined by it.)
/// SQLite only: FTS5's query syntax.
#[tokio::test]
async fn fts5_takes_a_word_or_its_stem_as_a_prefix() {
    // Arrange
    let db = fresh().await;
    user(&db.store, ME).await;
    let friends = entry(&db.store, ME, 1, "Вечер с друзьями в парке.").await;
    entry(&db.store, ME, 2, "Вечер с другом.").await;
    let query = store::fts_query("друзья парк").expect("words");
    let fts = |query: String| {
        sqlx::query_scalar::<_, i64>(
            "SELECT rowid FROM day_logs_fts WHERE day_logs_fts MATCH ?1 ORDER BY rowid",
        )
        .bind(query)
        .fetch_all(db.store.read_pool().expect("a SQLite store"))
    };

    // Act
    let matched = fts(query.clone()).await;
    let side_by_side = fts("(\"друзья\" OR \"друз\"*) \"парк\"".into()).await;

    // Assert
    assert_eq!(
        query,
        "(\"друзья\" OR \"друз\"*) AND (\"парк\" OR \"парк\"*)"
    );
    assert_eq!(matched.expect("FTS5 takes it"), [friends.get()]);
    let error = side_by_side
        .expect_err("a group beside a string")
        .to_string();
    assert!(error.contains("syntax error"), "{error}");
}

on_each_backend! {
    async fn a_russian_word_finds_its_other_forms(db: TestDb) {
    // Arrange
        user(&db.store, ME).await;
    let friends = entry(&db.store, ME, 1, "Вечер с друзьями.").await;
    let at_work = entry(&db.store, ME, 2, "Весь день на работе.").await;
    let a_job = entry(&db.store, ME, 3, "Ищу новую работу.").await;
    let tree = entry(&db.store, ME, 4, "Нарядили Ёлку!").await;
    let ran = entry(&db.store, ME, 5, "Утром бегал в парке.").await;
    other_entries(&db.store, 10).await;

    // Act
    let friends_found = found(&db.store, "друзья").await;
    let work_found = found(&db.store, "работа").await;
    let tree_found = found(&db.store, "ёлка").await;
    let tree_found_without_yo = found(&db.store, "ЕЛКА").await;
    let ran_found = found(&db.store, "бег").await;
    let both_words = found(&db.store, "Друзья вечер").await;
    let not_both = found(&db.store, "друзья работа").await;
    let with_a_comma = found(&db.store, "друзья, вечер").await;

    // Assert
    assert_eq!(friends_found, [friends]);
    assert_eq!(work_found, [at_work, a_job]);
    assert_eq!(tree_found, [tree]);
    assert_eq!(tree_found_without_yo, [tree]);
    assert_eq!(ran_found, [ran]);
    assert_eq!(both_words, [friends]);
    assert!(not_both.is_empty(), "every word must match: {not_both:?}");
    assert_eq!(with_a_comma, [friends], "punctuation costs no forms");
}
}

on_each_backend! {
    async fn an_english_word_finds_its_other_forms(db: TestDb) {
    // Arrange
        user(&db.store, ME).await;
    let running = entry(&db.store, ME, 1, "Went running before work.").await;
    let runs = entry(&db.store, ME, 2, "She runs every morning.").await;
    let run = entry(&db.store, ME, 3, "A short run.").await;
    entry(&db.store, ME, 4, "A rune on the stone, by the runway.").await;
    let walked = entry(&db.store, ME, 5, "Walked the dog twice.").await;
    other_entries(&db.store, 10).await;

    // Act
    let run_found = found(&db.store, "run").await;
    let running_found = found(&db.store, "Running").await;
    let walk_found = found(&db.store, "walking").await;

    // Assert: "rune" and "runway" begin with "run" but are no form of it.
    assert_eq!(run_found, [running, runs, run]);
    assert_eq!(running_found, [running, runs, run]);
    assert_eq!(walk_found, [walked]);
}
}

on_each_backend! {
    /// A stem of three letters is not searched as a prefix: "кот"* would find "который",
    /// "котлеты". It finds its own forms only; a shorter stem finds the word only.
    async fn a_short_word_finds_its_forms_not_every_word_it_begins(db: TestDb) {
    // Arrange
        user(&db.store, ME).await;
    let cat = entry(&db.store, ME, 1, "Кот спит.").await;
    let cats = entry(&db.store, ME, 2, "Гладила котов и кошку.").await;
    entry(&db.store, ME, 3, "Который час?").await;
    entry(&db.store, ME, 4, "Котлеты на ужин.").await;
    let she = entry(&db.store, ME, 5, "Она пришла.").await;
    entry(&db.store, ME, 6, "Они ушли, оно осталось.").await;
    other_entries(&db.store, 10).await;

    // Act
    let cat_found = found(&db.store, "кот").await;
    let she_found = found(&db.store, "она").await;

    // Assert
    assert_eq!(cat_found, [cat, cats]);
    assert_eq!(she_found, [she]);
}
}

on_each_backend! {
    /// An entry with the word as typed ranks above one with another form only, though
    /// both are as long and the other one is newer (bm25 ties go to the newest).
    async fn the_word_as_typed_ranks_above_its_other_forms(db: TestDb) {
    // Arrange
        user(&db.store, ME).await;
    let work = entry(&db.store, ME, 1, "Сегодня была работа до ночи.").await;
    let job = entry(&db.store, ME, 2, "Сегодня нашла работу до ночи.").await;
    let run = entry(&db.store, ME, 3, "I run every day.").await;
    let runs = entry(&db.store, ME, 4, "She runs every day.").await;
    other_entries(&db.store, 10).await;

    // Act
    let by_prefix = ids(&db.store.search(UserId(ME), "работа").await.expect("s"));
    let by_listed_forms = ids(&db.store.search(UserId(ME), "run").await.expect("s"));
    let other_form_typed = ids(&db.store.search(UserId(ME), "работу").await.expect("s"));

    // Assert
    assert_eq!(by_prefix, [work, job]);
    assert_eq!(by_listed_forms, [run, runs]);
    assert_eq!(other_form_typed, [job, work]);
}
}

on_each_backend! {
    /// The answer shows the forms it found in bold, with their letters as written (ё too).
    async fn the_search_answer_bolds_the_forms_it_found(db: TestDb) {
    // Arrange
        user(&db.store, ME).await;
    entry(&db.store, ME, 1, "Вечер с друзьями, потом с другом домой.").await;
    entry(&db.store, ME, 2, "Нарядили ёлку, а елки в лесу ещё стоят.").await;
    entry(&db.store, ME, 3, "Running late, then runs again & again.").await;
    let journal = journal(&db).await;

    // Act
    let friends = answer_html(&journal, Command::Search("друзья".into())).await;
    let tree = answer_html(&journal, Command::Search("Ёлка".into())).await;
    let run = answer_html(&journal, Command::Search("run".into())).await;

    // Assert
    assert!(
        friends.contains("Вечер с <b>друзьями</b>, потом с другом домой."),
        "{friends}"
    );
    assert!(
        tree.contains("Нарядили <b>ёлку</b>, а <b>елки</b> в лесу ещё стоят."),
        "{tree}"
    );
    assert!(
        run.contains("<b>Running</b> late, then <b>runs</b> again &amp; again."),
        "{run}"
    );
}
}

on_each_backend! {
    /// Quotes, stars, operators, parentheses and a lone `-` beside words that have forms
    /// are still text, never FTS5 syntax, and never an error.
    async fn hostile_words_beside_word_forms_are_only_words(db: TestDb) {
    // Arrange
        user(&db.store, ME).await;
    let plain = entry(&db.store, ME, 1, "С друзьями после работы.").await;
    let marked = entry(&db.store, ME, 2, "Друзья OR работа: (работа) - * NEAR").await;
    other_entries(&db.store, 10).await;

    // Act
    let dash_and_forms = found(&db.store, "друзья - работа").await;
    let only_marks = found(&db.store, "- * \" ( )").await;
    let or_is_a_word = found(&db.store, "друзья OR").await;
    let star_is_no_prefix = found(&db.store, "друзья*").await;
    let minus_is_no_not = found(&db.store, "-друзья").await;
    let parens_are_no_group = found(&db.store, "(работа) друзья").await;
    let near_is_no_operator = found(&db.store, "NEAR(друзья работа)").await;
    let quotes = found(&db.store, "\"друзья работа\" \"\"").await;

    // Assert
    assert_eq!(dash_and_forms, [plain, marked]);
    assert!(only_marks.is_empty(), "{only_marks:?}");
    assert_eq!(or_is_a_word, [marked]);
    // Marks at a word's ends are dropped by the tokenizer and cost it none of its forms:
    // "друзья*" is the word "друзья", which finds "с друзьями" too.
    // So do "-друзья" (no NOT: both entries), "(работа)" and a quoted phrase's words.
    assert_eq!(star_is_no_prefix, [plain, marked]);
    assert_eq!(minus_is_no_not, [plain, marked]);
    assert_eq!(parens_are_no_group, [plain, marked]);
    assert!(near_is_no_operator.is_empty(), "{near_is_no_operator:?}");
    assert_eq!(quotes, [plain, marked]);
}
}

/// A message of a thousand words is still a query of bounded size: a word typed again
/// is looked for once, and past a budget of forms the words are looked for as typed.
#[test]
fn a_long_query_looks_for_a_bounded_number_of_forms() {
    // Arrange: a thousand distinct words of three letters, each a list of forms.
    let consonants: Vec<char> = "бвгджзклмнпрстфхцчшщ".chars().collect();
    let vowels: Vec<char> = "аоуыэ".chars().collect();
    let mut distinct = Vec::new();
    for a in &consonants {
        for v in &vowels {
            for b in &consonants {
                distinct.push(format!("{a}{v}{b}"));
            }
        }
    }
    distinct.truncate(1000);

    // Act
    let repeated = store::fts_query(&["Кот"; 1000].join(" "));
    let long = store::fts_query(&distinct.join(" ")).expect("words");

    // Assert
    assert_eq!(repeated, store::fts_query("Кот"));
    let forms = long.matches(" OR ").count();
    assert!(forms <= store::SEARCH_MAX_FORMS, "{forms}");
    assert!(
        forms > store::SEARCH_MAX_FORMS / 2,
        "the first words keep their forms"
    );
    assert_eq!(long.matches(" AND ").count(), 999);
    let last = distinct.last().expect("words");
    assert_eq!(
        long.rsplit(" AND ").next(),
        Some(format!("\"{last}\"").as_str())
    );
}

on_each_backend! {
    /// The English stemmer writes a `y` as `i` ("cities" → "citi", "tries" → "tri"): the
    /// word with its `y` is one of its forms too, so the plural finds the singular, as the
    /// singular ("city" → `citi*`) already found the plural.
    async fn an_english_y_that_the_stem_makes_i_is_found_both_ways(db: TestDb) {
    // Arrange
        user(&db.store, ME).await;
    let city = entry(&db.store, ME, 1, "A walk across the city.").await;
    let cities = entry(&db.store, ME, 2, "Two cities in one week.").await;
    let happy = entry(&db.store, ME, 3, "A happy evening.").await;
    let happier = entry(&db.store, ME, 4, "Happier than yesterday.").await;
    let tried = entry(&db.store, ME, 5, "Tried the new bakery.").await;
    let to_try = entry(&db.store, ME, 6, "Want to try climbing.").await;
    let trying = entry(&db.store, ME, 7, "Trying to sleep earlier.").await;
    other_entries(&db.store, 10).await;

    // Act
    let from_cities = found(&db.store, "cities").await;
    let from_city = found(&db.store, "city").await;
    let from_happiness = found(&db.store, "happiness").await;
    let from_tries = found(&db.store, "tries").await;

    // Assert
    assert_eq!(from_cities, [city, cities]);
    assert_eq!(from_city, [city, cities]);
    assert_eq!(from_happiness, [happy, happier]);
    assert_eq!(from_tries, [tried, to_try, trying]);
    assert_eq!(
        store::fts_query("cities"),
        Some("(\"cities\" OR \"citi\"* OR \"city\"*)".into())
    );
}
}

/// A stem whose words the index holds few of is searched as those words (FTS5 reads
/// them lazily, newest first), each an FTS5 string whatever the index holds; one that
/// begins too many stays a prefix, and one that begins none adds nothing.
#[test]
fn a_prefix_stem_may_be_listed_as_the_index_words_it_begins() {
    let listed = |stem: &str| match stem {
        "walk" => Some(vec!["walk".to_owned(), "walked".into(), "walk\"ing".into()]),
        "citi" => Some(Vec::new()),
        _ => None,
    };
    assert_eq!(
        store::fts_query_with("walked", listed),
        Some("(\"walked\" OR \"walk\" OR \"walked\" OR \"walk\"\"ing\")".into())
    );
    assert_eq!(
        store::fts_query_with("cities", listed),
        Some("(\"cities\" OR \"city\"*)".into())
    );
    assert_eq!(
        store::fts_query_with("друзья", listed),
        Some("(\"друзья\" OR \"друз\"*)".into())
    );
}

on_each_backend! {
    /// Through the store, with the index's own words: every form is still found, and a
    /// word typed with FTS5 syntax around it stays text.
    async fn a_listed_stem_finds_every_form_the_index_holds(db: TestDb) {
        user(&db.store, ME).await;
    let walked = entry(&db.store, ME, 1, "Walked to the lake.").await;
    let walking = entry(&db.store, ME, 2, "Walking in the rain.").await;
    let walks = entry(&db.store, ME, 3, "Two walks a day.").await;
    other_entries(&db.store, 10).await;

    let found_walk = found(&db.store, "walk").await;
    let found_hostile = found(&db.store, "walk* OR NEAR(").await;

    assert_eq!(found_walk, [walked, walking, walks]);
    assert!(found_hostile.is_empty(), "{found_hostile:?}");
}
}

/// The same entries and the same queries give the same entries in the same order, with
/// the same snippets, on SQLite (FTS5) and on PostgreSQL (its index, ranked and cut by
/// the store): word forms, ё, diacritics, phrases of inner marks, long entries.
#[tokio::test]
async fn both_backends_find_rank_and_cut_alike() {
    const ENTRIES: &[&str] = &[
        "Walked the dog by the river, then coffee with Anna.",
        "Walking in the rain; my e-mail inbox is full again.",
        "Tired. Tired, tired, tired.",
        "Un café crème à Zürich, tired but happy.",
        "Ещё один день, ещё прогулка с друзьями в парке. Ёлка!",
        "еще без точек, елка, друзья пришли вечером",
        "Кот спал весь день, котлеты на ужин, который раз.",
        "Two walks a day keep the doctor away; cities are loud, the city sleeps.",
        "Cooked soup and slept early.",
        "Дождь весь день.",
    ];
    const QUERIES: &[&str] = &[
        "tired",
        "walk",
        "walked",
        "coffee river",
        "e-mail",
        "cafe",
        "CRÈME",
        "еще",
        "ёлка",
        "друзья",
        "кот",
        "city",
        "cities",
        "day",
        "день",
        "нет такого",
        "\"walk* OR NEAR(",
    ];
    let long = format!(
        "{}прогулка с котом {}",
        "слово за словом ".repeat(20),
        "и так далее ".repeat(20)
    );
    let mut results = Vec::new();
    for backend in backends() {
        let db = fresh_on(backend).await;
        user(&db.store, ME).await;
        for (i, text) in (1..).zip(ENTRIES.iter().copied().chain([long.as_str()])) {
            entry(&db.store, ME, i, text).await;
        }
        let mut found = Vec::new();
        for query in QUERIES {
            let hits = db.store.search(UserId(ME), query).await.expect("search");
            found.push((
                *query,
                hits.iter()
                    .map(|hit| (hit.id, hit.matched, hit.snippet()))
                    .collect::<Vec<_>>(),
            ));
        }
        results.push((backend, found));
    }
    if let [(_, sqlite), (_, postgres)] = results.as_slice() {
        for (a, b) in sqlite.iter().zip(postgres) {
            assert_eq!(a, b, "SQLite, then PostgreSQL");
        }
    }
}
