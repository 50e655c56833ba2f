//! `daylog chat`.

use crate::config::Settings;
use crate::store::Store;

pub async fn run(_settings: Settings, _store: Store, _user: i64) -> anyhow::Result<()> {
    anyhow::bail!("chat is not built yet")
}
