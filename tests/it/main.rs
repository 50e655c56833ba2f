//! Every integration test of daylog, in one binary: it links once, and `support` is
//! compiled once and needs no `dead_code` allowance (issue 9 item 7).
//!
//! To add a test file: put it here as `tests/it/NAME.rs`, add `mod NAME;` below (keep the
//! list sorted), and start it with `use crate::support;` if it needs the harness. It
//! must not start with `mod support;` (that would look for `tests/it/NAME/support.rs`).
//! Run it alone with `cargo test --test it NAME::`.
//!
//! Every test runs in a thread of this one process, in parallel with all the others, so
//! a test must not touch process-wide state: no `std::env::set_var`, no
//! `set_current_dir` (give a child process its own `.env(..)` / `.current_dir(..)`),
//! no fixed ports (bind `127.0.0.1:0`), no fixed temporary paths (use `tempfile`), and
//! no global tracing subscriber of its own (capture logs with
//! `support::llm::LogCapture::this_thread`, which sees only its own thread).

#![expect(
    clippy::panic,
    reason = "the harness fails a test the way `assert!` does: by panicking with what it found"
)]

mod support;

mod bot_e2e;
mod budget_audit;
mod budgets;
mod chat;
mod cli;
mod cli_config;
mod cluster;
mod digest;
mod disk_full;
mod docs;
mod faults;
mod hedge_busy;
mod hedge_restart;
mod hostile_text;
mod http;
mod import;
mod import_bot;
mod inbox;
mod leases;
mod llm_budgets;
mod llm_cascade;
mod llm_logs;
mod llm_providers;
mod process;
mod rhythm;
mod round_trips;
mod search;
mod shared;
mod sql_fences;
mod store;
mod voice;
mod voice_process;
mod webapp_api;
mod webapp_browser;
mod webhook;
