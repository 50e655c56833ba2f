//! Making a commit survive a power cut before it is promised to anyone (docs/behaviour.md, Promises).
//!
//! The store runs SQLite in WAL mode at `synchronous = NORMAL`: a commit is in the WAL
//! file when it returns, so a crash of the process loses nothing, but the WAL reaches
//! the disk only at a checkpoint. A power cut or a kernel crash could take back the
//! newest commits — on a quiet bot, hours of them — after Telegram was told to forget
//! the updates they stored and the users were told "saved".
//!
//! So a write that is about to be promised (an entry stored, an edit, an import, a
//! deletion, a setting said done) waits, after its commit, for one `fdatasync` of the WAL file. What a
//! process crash cannot lose is exactly what the page cache holds; syncing the WAL file
//! puts that on the disk, every commit before it included (SQLite does not reset the
//! WAL before the database file holds its pages on disk). Writes that only record
//! progress (an analysis, a reply sent) do not wait: a power cut costs at most that
//! step again, and the next durable write syncs them too.
//!
//! Callers that wait together share one sync (group commit): while one runs, the
//! others queue, and the next sync covers all of them. A burst of entries costs a few
//! syncs, not one each, and the single writer connection never waits for the disk.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The sync itself: blocking, run on tokio's blocking threads.
type SyncFile = Arc<dyn Fn() -> io::Result<()> + Send + Sync>;

/// One database's durable point: how many commits asked to be made durable, and how
/// many a finished sync covers.
pub(super) struct WalSync {
    sync: SyncFile,
    /// Commits that asked, counted as they ask (after their commit returned).
    asked: AtomicU64,
    /// The `asked` count a finished sync read before it started: every commit counted
    /// up to there is on disk; `None` once a sync failed, as nothing is promised kept
    /// after that. Held while a sync runs, so the waiters queue behind it.
    synced: tokio::sync::Mutex<Option<u64>>,
}

impl std::fmt::Debug for WalSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalSync")
            .field("asked", &self.asked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The WAL file's name in its folder. SQLite creates the WAL anew whenever the first
/// connection opens the database (and deletes it when the last one closes, as the pool
/// does to idle connections), and syncs the folder only at its own first sync of a new
/// WAL, a checkpoint that may come much later. Until the folder is synced a power cut can
/// take the new file's name away with every commit in it, so after the first sync of
/// each new WAL (a new inode) the folder is synced too. That WAL is kept open and
/// synced through until another is found at its path: no open per sync, and a file
/// system that gives a freed inode number to the next file made cannot pass a new WAL
/// off as the old one, as an open file's number is not freed (the cost: a deleted
/// WAL's blocks until the next WAL is seen).
/// Syncs the folder that holds `path`, so that a file just made there keeps its name
/// through a power cut. Elsewhere than on Unix a folder cannot be opened to sync it.
pub(super) fn sync_folder_of(path: &std::path::Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        let folder = path
            .parent()
            .filter(|folder| !folder.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        std::fs::File::open(folder)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[derive(Default)]
struct HeldWal {
    #[cfg(unix)]
    file: std::sync::Mutex<Option<(u64, std::fs::File)>>,
}

impl HeldWal {
    /// Syncs the WAL at `path`: the file held open when it is still the one there (one
    /// `stat` to tell), else the new one, opened, synced with its folder, and held.
    #[cfg(unix)]
    fn sync(&self, path: &std::path::Path) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt as _;
        let there = std::fs::metadata(path)?.ino();
        let mut held = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((inode, file)) = held.as_ref()
            && *inode == there
        {
            return file.sync_data();
        }
        let file = std::fs::File::open(path)?;
        file.sync_data()?;
        let inode = file.metadata()?.ino();
        sync_folder_of(path)?;
        *held = Some((inode, file));
        Ok(())
    }

    /// Elsewhere a folder cannot be opened as a file to sync it, nor a file's identity
    /// read: the WAL is opened and synced each time.
    #[cfg(not(unix))]
    fn sync(&self, path: &std::path::Path) -> io::Result<()> {
        std::fs::File::open(path)?.sync_data()
    }
}

impl WalSync {
    /// For the database file `db`: syncs its `-wal` file. The WAL sits beside the real
    /// file (SQLite follows symlinks), so the path is resolved first. While the store
    /// is open a commit always leaves the WAL there, so one that is missing means the
    /// path is not SQLite's: said once, loudly, as nothing can be synced then.
    pub fn for_database(db: PathBuf) -> Self {
        let mut wal = std::fs::canonicalize(&db).unwrap_or(db).into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let warned = AtomicBool::new(false);
        let held = HeldWal::default();
        Self::with(Arc::new(move || match held.sync(&wal) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                if !warned.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        wal = %wal.display(),
                        "the database's WAL file is not where expected: commits are not synced to disk"
                    );
                }
                Ok(())
            }
            Err(error) => Err(error),
        }))
    }

    fn with(sync: SyncFile) -> Self {
        Self {
            sync,
            asked: AtomicU64::new(0),
            synced: tokio::sync::Mutex::new(Some(0)),
        }
    }

    /// Returns once every commit that returned before this call is on disk.
    ///
    /// A failed sync fails every later call too: Linux may mark the pages it could not
    /// write as clean, so a later sync that succeeds proves nothing about them.
    pub async fn after_commit(&self) -> io::Result<()> {
        let mine = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
        let mut synced = self.synced.lock().await;
        match *synced {
            None => {
                return Err(io::Error::other(
                    "an earlier sync of the database failed; restart daylog once the disk is sound",
                ));
            }
            // A sync that started after this commit has finished.
            Some(through) if through >= mine => return Ok(()),
            Some(_) => {}
        }
        // Every commit counted by now is in the WAL already: this sync covers it.
        let covers = self.asked.load(Ordering::SeqCst);
        let sync = Arc::clone(&self.sync);
        let done = tokio::task::spawn_blocking(move || sync())
            .await
            .map_err(io::Error::other)
            .and_then(|synced| synced);
        *synced = done.is_ok().then_some(covers);
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A sync that counts itself; the first one waits until `release` is set.
    fn counting() -> (Arc<WalSync>, Arc<AtomicUsize>, Arc<AtomicBool>) {
        let count = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(AtomicBool::new(false));
        let (counted, released) = (Arc::clone(&count), Arc::clone(&release));
        let sync = WalSync::with(Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            while !released.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        }));
        (Arc::new(sync), count, release)
    }

    #[tokio::test]
    async fn each_commit_alone_gets_a_sync_of_its_own() -> io::Result<()> {
        let (sync, count, release) = counting();
        release.store(true, Ordering::SeqCst);
        sync.after_commit().await?;
        sync.after_commit().await?;
        assert_eq!(
            count.load(Ordering::SeqCst),
            2,
            "no commit relies on an older sync"
        );
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_waiting_together_share_a_sync() -> io::Result<()> {
        let (sync, count, release) = counting();
        let spawn = || {
            let sync = Arc::clone(&sync);
            tokio::spawn(async move { sync.after_commit().await })
        };
        let first = spawn();
        while count.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Fifty commits ask while the first sync runs: it cannot cover them.
        let waiting: Vec<_> = (0..50).map(|_| spawn()).collect();
        while sync.asked.load(Ordering::SeqCst) < 51 {
            tokio::task::yield_now().await;
        }
        release.store(true, Ordering::SeqCst);
        first.await.map_err(io::Error::other)??;
        for one in waiting {
            one.await.map_err(io::Error::other)??;
        }
        assert_eq!(
            count.load(Ordering::SeqCst),
            2,
            "the second sync covers the fifty"
        );
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn the_folder_is_synced_once_for_each_new_wal_file() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("daylog.db-wal");
        let held = HeldWal::default();
        let synced_for = || {
            held.file
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
                .map(|(inode, _)| *inode)
        };

        let first = std::fs::File::create(&path)?;
        held.sync(&path)?;
        let once = synced_for();
        assert!(once.is_some());
        held.sync(&path)?;
        assert_eq!(
            synced_for(),
            once,
            "the same file: its name is on disk already"
        );

        // SQLite deleted the WAL with its last connection and made a new one; the one
        // held open cannot lend the new file its inode number.
        drop(first);
        std::fs::remove_file(&path)?;
        std::fs::File::create(&path)?;
        held.sync(&path)?;
        assert_ne!(synced_for(), once, "a new WAL's name is synced");
        Ok(())
    }

    #[tokio::test]
    async fn a_failed_sync_fails_its_commit_and_every_later_one() {
        let fails = Arc::new(AtomicBool::new(true));
        let failing = Arc::clone(&fails);
        let sync = WalSync::with(Arc::new(move || {
            if failing.load(Ordering::SeqCst) {
                Err(io::Error::other("disk gone"))
            } else {
                Ok(())
            }
        }));
        assert!(sync.after_commit().await.is_err());
        fails.store(false, Ordering::SeqCst);
        assert!(
            sync.after_commit().await.is_err(),
            "a later sync that succeeds proves nothing about the pages the failed one lost"
        );
    }
}
