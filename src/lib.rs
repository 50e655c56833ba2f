//! daylog: a Telegram journaling bot that never loses an entry.
//!
//! Module map: `config` (layered settings and secrets), `store` (SQLite, the only place
//! that talks SQL), `sqlcmd` (`daylog sql`), `llm` (provider clients and the cascade),
//! `analysis` (prompts, metric repair and validation), `journal` (the life of a day log,
//! front-end independent), `commands` (what each bot command answers), `worker`
//! (unfinished logs), `bot` (Telegram), `chat` (the terminal), `render` (reply HTML and
//! splitting), `charts`, `texts` (English and Russian), `cli`, `telemetry`; SPEC §10:
//! `time` (the one clock, user zones, local days), `reminders`, `streaks`, `good_days`,
//! `digest` (the weekly digest).

pub mod analysis;
pub mod bot;
pub mod charts;
pub mod chat;
pub mod cli;
pub mod commands;
pub mod config;
pub mod digest;
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
