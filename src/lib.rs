//! daylog: a Telegram journaling bot that never loses an entry.
//!
//! Module map: `config` (layered settings and secrets), `store` (SQLite, the only place
//! that talks SQL), `sqlcmd` (`daylog sql`), `llm` (provider clients and the cascade),
//! `analysis` (prompts, metric repair and validation), `journal` (the life of a day log,
//! front-end independent), `commands` (what each bot command answers), `worker`
//! (unfinished logs), `bot` (Telegram), `chat` (the terminal), `render` (reply HTML and
//! splitting), `charts`, `texts` (English and Russian), `cli`, `telemetry`.

pub mod bot;
pub mod charts;
pub mod chat;
pub mod cli;
pub mod config;
pub mod language;
pub mod llm;
pub mod render;
pub mod sqlcmd;
pub mod store;
pub mod telemetry;
