//! daylog: a Telegram journaling bot that never loses an entry.
//!
//! Module map: `config` (layered settings and secrets), `store` (SQLite, the only place
//! that talks SQL), `sqlcmd` (`daylog sql`), `llm` (provider clients and the cascade),
//! `analysis` (prompts, metric repair and validation), `bot` (Telegram handlers),
//! `render` (reply HTML and splitting), `worker` (pending logs), `charts`, `chat`
//! (the terminal front end), `cli` (the subcommands), `telemetry`.

pub mod bot;
pub mod chat;
pub mod cli;
pub mod config;
pub mod language;
pub mod llm;
pub mod sqlcmd;
pub mod store;
pub mod telemetry;
