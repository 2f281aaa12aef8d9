//! The run directory of `lmx train`: locked for the whole run, refused when it holds another run,
//! cleared on `--overwrite`, and checked for writing before any training.

use lmx::runtime::checkpoint::Checkpoints;
use lmx::runtime::run_lock::{RunLock, LOCK_FILE};
use std::path::{Path, PathBuf};

/// What `lmx train` writes in a run directory: what `--overwrite` removes.
const RUN_ENTRIES: &[&str] = &[
    super::run_file::RUN_FILE,
    ".run.json.partial",
    "metrics.jsonl",
    "checkpoints",
    super::tokenizer::TRAINED_FILE,
    "curves.svg",
];

/// A locked run directory.
pub struct RunDir {
    dir: PathBuf,
    /// `None` for a rank of a data-parallel run other than 0, which only reads the folder.
    lock: Option<RunLock>,
    /// Whether locking it made it: a run that fails before writing anything then leaves no
    /// folder behind.
    made: bool,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> anyhow::Error + '_ {
    move |err| anyhow::anyhow!("{}: {err}", path.display())
}

impl RunDir {
    /// Creates `dir` if needed and locks it until dropped (the process's end releases it too).
    pub fn lock(dir: &Path) -> anyhow::Result<RunDir> {
        let made = !dir.exists();
        Ok(RunDir {
            dir: dir.to_owned(),
            lock: Some(RunLock::acquire(dir)?),
            made,
        })
    }

    /// The run directory that rank 0 of a data-parallel run locks and writes, as another rank
    /// reads it (its checkpoints to resume from).
    pub fn of_rank_0(dir: &Path) -> RunDir {
        RunDir {
            dir: dir.to_owned(),
            lock: None,
            made: false,
        }
    }

    /// The names of its entries, but the lock's, sorted.
    fn entries(&self) -> anyhow::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let name = entry.map_err(io(&self.dir))?.file_name();
            let name = name.to_string_lossy().into_owned();
            if name != LOCK_FILE {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Fails unless the directory is empty: a fresh run never mixes with what is there.
    pub fn refuse_unless_empty(&self) -> anyhow::Result<()> {
        let entries = self.entries()?;
        if entries.is_empty() {
            return Ok(());
        }
        anyhow::bail!(
            "run directory {} is not empty (it holds {}): give --resume to continue its run, \
             --overwrite to replace it, or another --out",
            self.dir.display(),
            entries.join(", ")
        )
    }

    /// Removes the files of the run it holds.
    pub fn clear(&self) -> anyhow::Result<()> {
        for name in RUN_ENTRIES {
            let path = self.dir.join(name);
            let removed = match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
                Ok(_) => std::fs::remove_file(&path),
                Err(_) => continue,
            };
            removed.map_err(io(&path))?;
        }
        Ok(())
    }

    /// Its checkpoints.
    pub fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    /// Creates `checkpoints/` and writes a file into it, so that a place a checkpoint cannot be
    /// written is found before training, not at the first save.
    pub fn probe(&self) -> anyhow::Result<()> {
        let root = self.checkpoints();
        std::fs::create_dir_all(&root).map_err(io(&root))?;
        // Named as the temporary entries that saves clean up, should a kill leave it.
        let probe = root.join(format!(
            "{}probe",
            lmx::runtime::checkpoint::atomic::TEMP_PREFIX
        ));
        std::fs::write(&probe, b"").map_err(io(&root))?;
        std::fs::remove_file(&probe).map_err(io(&root))
    }

    /// The checkpoint `checkpoint` as one of this run's, or an error saying it is not.
    pub fn own_checkpoint(&self, checkpoint: &Path) -> anyhow::Result<PathBuf> {
        let canonical = |path: &Path| std::fs::canonicalize(path).map_err(io(path));
        let found = canonical(checkpoint)?;
        let root = canonical(&self.checkpoints())?;
        let listed = Checkpoints::new(&root).list()?;
        if !listed.iter().any(|(_, dir)| *dir == found) {
            anyhow::bail!(
                "{} is not a checkpoint of the run in {} (its checkpoints are in {})",
                checkpoint.display(),
                self.dir.display(),
                self.checkpoints().display()
            );
        }
        Ok(checkpoint.to_owned())
    }
}

impl Drop for RunDir {
    /// Removes the folder where locking it made it and the run wrote nothing into it (it failed
    /// first): the lock file and an empty `checkpoints/` from [`RunDir::probe`].
    fn drop(&mut self) {
        if !self.made || self.lock.is_none() {
            return;
        }
        let Ok(entries) = self.entries() else {
            return;
        };
        // `remove_dir` removes only an empty folder.
        let untouched = entries.iter().all(|name| name == "checkpoints")
            && (entries.is_empty() || std::fs::remove_dir(self.checkpoints()).is_ok());
        if untouched {
            let _ = std::fs::remove_file(self.dir.join(LOCK_FILE));
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}
