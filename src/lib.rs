//! daylog: a Telegram journaling bot that never loses an entry.
//!
//! Module map, in the order an entry passes through it (README has the table): `app`
//! (the one start-up, [`app::App::build`]), `cli`, `telemetry`, `config`; the front ends
//! `bot` (Telegram) and `chat` (the terminal) and what they are to the journal,
//! `frontend`; `commands`, `import`, `reminders`, `digest` (the weekly digest), `worker` (unfinished logs); `journal`
//! (the life of a day log, front-end independent); `store` (SQLite, the only place that
//! talks SQL), `sqlcmd` (`daylog sql`); `llm` (provider clients and the cascade),
//! `analysis` (prompts, metric repair and validation); `render` (reply HTML and
//! splitting), `charts`, `texts` (English and Russian), `day` (one day's metrics), `language`; SPEC §10: `time` (the
//! one clock, user zones, local days), `streaks`, `good_days`. README states the layers that
//! imports go down, never up.

pub mod analysis;
pub mod app;
pub mod bot;
pub mod charts;
pub mod chat;
pub mod cli;
pub mod commands;
pub mod config;
pub mod day;
pub mod digest;
pub mod frontend;
pub mod good_days;
pub mod import;
pub mod journal;
pub mod language;
pub mod llm;
pub mod reminders;
pub mod render;
pub mod sqlcmd;
pub mod store;
pub mod streaks;
pub mod telemetry;
pub mod texts;
pub mod time;
pub mod worker;

/// The one HTTP client of the process, shared by the Telegram bot and every LLM provider.
/// Its 17 s total timeout suits Bot API calls; LLM attempts set their own per request.
pub fn http_client() -> reqwest::Result<reqwest::Client> {
    teloxide::net::default_reqwest_settings().build()
}
