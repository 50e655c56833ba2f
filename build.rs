//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds
//! the files of `migrations/` at compile time, and cargo does not otherwise watch them
//! (a warm build would silently keep the old set).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
