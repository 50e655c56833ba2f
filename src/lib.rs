//! daylog: a Telegram journaling bot that never loses an entry.
//!
//! Module map: `config` (layered settings and secrets), `store` (SQLite, the only place
//! that talks SQL), `llm` (provider clients and the cascade), `analysis` (prompts, metric
//! repair and validation), `bot` (Telegram handlers and reply rendering), `worker`
//! (pending logs), `charts`, `cli` (the subcommands), `telemetry`.

pub mod analysis;
pub mod config;
pub mod language;
pub mod llm;
