//! The Telegram bot.

use crate::config::Settings;
use crate::store::Store;

pub async fn run(_settings: Settings, _store: Store) -> anyhow::Result<()> {
    anyhow::bail!("the Telegram daemon is not built yet")
}
