//! daylog: a Telegram journaling bot that never loses an entry.
//!
//! The map of these modules, their layers and the walk of one entry through them is
//! docs/architecture.md. In short, from the top: the binary (`cli`, `telemetry`), the
//! start-up (`app`), the front ends (`bot`, `terminal`) and what they are to the journal
//! (`frontend`), what users ask for (`commands`, `import`, `reminders`, `digest`,
//! `worker`), the life of an entry (`journal`, a file per stage) and a user's zone,
//! language and streaks (`users`), SQL (`store`, `sqlcmd`), the two siblings `analysis`
//! (prompts, metrics) and `llm` (providers, budgets, the cascade), `config`, the floor
//! (`render`, `charts`, `texts`, `time`, `day`, `streaks`, `good_days`, `llm_request`),
//! and below it all `domain` (typed ids, a model reference, a log's outcome and metrics)
//! beside `language`. Imports go down, never up.

pub mod analysis;
pub mod app;
pub mod bot;
pub mod charts;
pub mod cli;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod day;
pub mod digest;
pub mod domain;
pub mod frontend;
pub mod good_days;
pub mod http;
pub mod import;
pub mod journal;
pub mod language;
pub mod llm;
pub mod llm_request;
pub mod observe;
pub mod reminders;
pub mod render;
pub mod sqlcmd;
pub mod store;
pub mod streaks;
pub mod telemetry;
pub mod terminal;
pub mod texts;
pub mod time;
pub mod users;
pub mod webapp;
pub mod worker;

use std::time::Duration;

/// The HTTP client of the LLM providers (one reqwest stack with the bot's, its own
/// pool). Every attempt sets its own timeout (`retry.request_timeout_ms`).
pub fn http_client() -> reqwest::Result<reqwest::Client> {
    teloxide::net::default_reqwest_settings().build()
}

/// A Bot API connection that sends nothing this long is dead (a long poll waits 10 s).
pub const TELEGRAM_SILENCE: Duration = Duration::from_secs(17);
/// The most one Bot API download may take while it keeps moving: a 20 MB voice note or
/// import at 35 KB/s.
pub const TELEGRAM_TRANSFER: Duration = Duration::from_secs(10 * 60);

/// The Bot API's client. teloxide's default gives every request 17 s in all, which cut
/// off a large voice note or import on a slow link every time it was tried; here the
/// response body may take [`TELEGRAM_TRANSFER`] while no read waits longer than
/// [`TELEGRAM_SILENCE`]. Until the answer's headers arrive reqwest counts that silence
/// once, from the start, so an upload (an export, a chart) still has 17 s to go out:
/// a year's export is about 200 KB, 12 KB/s.
pub fn telegram_client() -> reqwest::Result<reqwest::Client> {
    telegram_client_with(TELEGRAM_SILENCE, TELEGRAM_TRANSFER)
}

/// [`telegram_client`] with other limits (tests).
pub fn telegram_client_with(
    silence: Duration,
    total: Duration,
) -> reqwest::Result<reqwest::Client> {
    // teloxide's settings (connect timeout, no Nagle), its total timeout replaced.
    teloxide::net::default_reqwest_settings()
        .read_timeout(silence)
        .timeout(total)
        .build()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::telegram_client_with;

    /// A server on 127.0.0.1 that answers one request with a body of `bytes` bytes,
    /// one every `gap`; its URL.
    async fn trickle(bytes: usize, gap: Duration) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = [0_u8; 4096];
            let _ = socket.read(&mut request).await;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {bytes}\r\n\r\n");
            socket.write_all(head.as_bytes()).await.expect("head");
            for _ in 0..bytes {
                tokio::time::sleep(gap).await;
                if socket.write_all(b"x").await.is_err() {
                    return;
                }
            }
        });
        format!("http://{addr}/file/bot1:t/voice.ogg")
    }

    /// A Bot API transfer is cut off by silence, not by how long it takes in all
    /// (teloxide's default cut every request at 17 s).
    #[tokio::test]
    async fn a_telegram_transfer_that_keeps_moving_is_not_cut_off() {
        let silence = Duration::from_secs(1);
        let client =
            telegram_client_with(silence, Duration::from_secs(60)).expect("telegram client");
        // Moving all along, for longer in all than the silence allowed.
        let moving = client
            .get(trickle(15, Duration::from_millis(100)).await)
            .send()
            .await
            .expect("headers")
            .bytes()
            .await
            .expect("a transfer that keeps moving completes");
        assert_eq!(moving.len(), 15);
        // Silent for longer than allowed.
        let stalled = client
            .get(trickle(2, silence * 3).await)
            .send()
            .await
            .expect("headers")
            .bytes()
            .await;
        assert!(stalled.is_err(), "a silent transfer is given up");
    }
}
