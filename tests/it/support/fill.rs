//! A large history for query tests and benchmarks: shared by `tests/it/faults.rs` and
//! `benches/queries.rs` (which includes this file by path).

use sqlx::SqlitePool;

/// Fills user 77 with `n` analysed logs, one every 7 minutes back from now (100 000
/// logs span about 16 months), in one statement; user 78 gets a few hundred so that
/// filtering by user is part of what the queries do.
pub async fn fill_logs(db_url: &str, n: i64) {
    let pool = SqlitePool::connect(db_url).await.expect("writer");
    let mut tx = pool.begin().await.expect("tx");
    sqlx::query("INSERT INTO users (user_id, chat_id) VALUES (77, 77), (78, 78)")
        .execute(&mut *tx)
        .await
        .expect("users");
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO day_logs (user_id, chat_id, message_id, text, created_at, status,
                               analysis, metrics, attempts, replied_at)
         SELECT CASE WHEN i % 250 = 0 THEN 78 ELSE 77 END,
                CASE WHEN i % 250 = 0 THEN 78 ELSE 77 END,
                i,
                'Day log number ' || i || ': worked, ran, slept.',
                datetime('now', '-' || (i * 7) || ' minutes'),
                'analyzed',
                'An analysis of log ' || i || '.',
                json_object('mood', 1 + i % 5, 'stress', 1 + (i * 3) % 5,
                            'energy', 1 + (i * 7) % 5, 'productivity', 1 + (i * 11) % 5,
                            'sleep_hours', 4.0 + (i % 50) / 10.0,
                            'activities', json_array('run', 'work'),
                            'emotions', json_array('calm'),
                            'summary', 'Summary of day ' || i,
                            'defaulted', CASE WHEN i % 10 = 0 THEN json_array('sleep_hours')
                                              ELSE json_array() END),
                1,
                datetime('now')
         FROM n",
    )
    .bind(n)
    .execute(&mut *tx)
    .await
    .expect("fill");
    tx.commit().await.expect("commit");
    pool.close().await;
}
