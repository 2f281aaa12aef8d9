//! An exclusive lock on a run folder, so that two trainings never write into one run.
//!
//! The lock is the kernel's advisory lock (`flock` on Unix) on `RUN/.lock`, held for as long as
//! the [`RunLock`] lives. The kernel releases it when its process ends, however it ends, so a lock
//! left by a killed process is never in the way: there is no stale lock to detect or remove. The
//! file itself stays (removing it would let a second process lock a new file of the same name
//! while a third still holds the old one); it holds the pid of the process that locked it last,
//! for the message that names who holds it.

use crate::error::{Error, Result};
use fs4::{FileExt, TryLockError};
use std::fs::{self, File};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside the run folder.
pub const LOCK_FILE: &str = ".lock";

/// The lock on one run folder, held until dropped.
#[derive(Debug)]
pub struct RunLock {
    dir: PathBuf,
    // Holding the open file holds the lock.
    _file: File,
}

impl RunLock {
    /// Creates the run folder `dir` if needed and locks it, or fails at once naming the process
    /// that holds it ([`Error::RunInUse`]). A folder that cannot be created or written is an
    /// [`Error::Io`] naming it.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |cause| Error::Io { path, cause }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(LOCK_FILE);
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        // Called through the trait: std's `File::try_lock` is newer than the crate's MSRV.
        match FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(Error::RunInUse {
                    dir: dir.to_owned(),
                    pid: text.trim().parse().ok(),
                });
            }
            Err(TryLockError::Error(cause)) => return Err(Error::Io { path, cause }),
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .and_then(|()| file.flush())
            .map_err(io(&path))?;
        Ok(RunLock {
            dir: dir.to_owned(),
            _file: file,
        })
    }

    /// The locked run folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_folder_names_the_process_holding_it_and_is_free_again_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let held = RunLock::acquire(&run).unwrap();
        assert_eq!(held.dir(), run);
        // A second open file description conflicts with the first even within one process.
        let err = RunLock::acquire(&run).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "run folder {} is in use by process {}",
                run.display(),
                std::process::id()
            )
        );
        drop(held);
        RunLock::acquire(&run).unwrap();
    }

    #[test]
    fn a_run_folder_that_is_a_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, "").unwrap();
        let err = RunLock::acquire(&file).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: ", file.display())), "{err}");
    }
}
