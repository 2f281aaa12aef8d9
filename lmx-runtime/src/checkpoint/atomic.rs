//! Atomic writes: files and whole directories appear complete under their final name or not at
//! all.
//!
//! Everything is first written beside its destination under a name starting with
//! [`TEMP_PREFIX`], made durable (each file fsynced, then the directory), and renamed into place;
//! the rename is atomic, and the parent directory is fsynced after it. A crash at any point leaves
//! the destination as it was plus temporary entries, which readers ignore and the next save
//! removes. Replacing a directory takes two renames (the old one aside, the new one in); a crash
//! between them leaves the destination missing and its old copy aside, which the next save puts
//! back. A new folder that a command fills (an exported model, a derived run) is staged the same
//! way ([`create_dir`]).

use crate::error::{Error, Result};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The prefix of the temporary entries atomic writes leave behind when interrupted.
pub const TEMP_PREFIX: &str = ".tmp-";

/// Marks, after [`TEMP_PREFIX`], an entry set aside while being replaced.
const OLD_TAG: &str = "old-";

/// Writes one file durably. The trainer uses [`DurableWriter`]; tests substitute writers that
/// fail part-way to check that an interrupted save leaves earlier checkpoints intact.
pub trait FileWriter {
    /// Creates the file `path` holding `bytes`, flushed to stable storage before returning.
    fn write(&mut self, path: &Path, bytes: &[u8]) -> Result<()>;
}

/// Writes files and fsyncs them.
#[derive(Clone, Copy, Debug, Default)]
pub struct DurableWriter;

impl FileWriter for DurableWriter {
    fn write(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        let io = |cause| Error::Io {
            path: path.to_owned(),
            cause,
        };
        let mut file = fs::File::create(path).map_err(io)?;
        file.write_all(bytes).map_err(io)?;
        file.sync_all().map_err(io)
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |cause| Error::Io {
        path: path.to_owned(),
        cause,
    }
}

/// Flushes a directory's entries (new names, renames) to stable storage.
fn sync_dir(dir: &Path) -> Result<()> {
    if cfg!(unix) {
        fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error(dir))?;
    }
    Ok(())
}

/// Flushes every file and folder under `dir`, and `dir` itself, to stable storage.
fn sync_tree(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            fs::File::open(&path)
                .and_then(|file| file.sync_all())
                .map_err(io_error(&path))?;
        }
    }
    sync_dir(dir)
}

/// The parent directory of `path` and the temporary path beside it for `tag`.
fn beside(path: &Path, tag: &str) -> Result<(PathBuf, PathBuf)> {
    let parent = path.parent().map(Path::to_owned).unwrap_or_default();
    let parent = if parent.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        parent
    };
    let name = path.file_name().ok_or_else(|| Error::Checkpoint {
        path: path.to_owned(),
        message: "the destination has no file name".into(),
    })?;
    let temp = parent.join(format!("{TEMP_PREFIX}{tag}{}", name.to_string_lossy()));
    Ok((parent, temp))
}

/// Removes a file or directory if it exists.
fn remove(path: &Path) -> Result<()> {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => Err(err),
    };
    result.map_err(io_error(path))
}

/// Cleans up after interrupted writes in `dir`: an entry set aside while being replaced
/// (`.tmp-old-<name>`) is put back when `<name>` is missing (the write stopped between the two
/// renames), and every other temporary entry is removed.
pub(crate) fn remove_stale(dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(io_error(dir)(err)),
    };
    for entry in entries {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(TEMP_PREFIX) else {
            continue;
        };
        let original = rest
            .strip_prefix(OLD_TAG)
            .map(|original| dir.join(original));
        match original {
            Some(original) if !original.exists() => {
                fs::rename(entry.path(), &original).map_err(io_error(&original))?;
                sync_dir(dir)?;
            }
            _ => remove(&entry.path())?,
        }
    }
    Ok(())
}

/// Writes the file `path` atomically.
pub(crate) fn write_file(path: &Path, bytes: &[u8], writer: &mut dyn FileWriter) -> Result<()> {
    let (parent, temp) = beside(path, "")?;
    fs::create_dir_all(&parent).map_err(io_error(&parent))?;
    if let Err(err) = writer.write(&temp, bytes) {
        let _ = fs::remove_file(&temp);
        return Err(err);
    }
    fs::rename(&temp, path).map_err(io_error(path))?;
    sync_dir(&parent)
}

/// Writes the directory `dir` holding `files` (name, bytes) atomically, replacing any directory
/// of that name.
pub(crate) fn write_dir(
    dir: &Path,
    files: &[(&str, Vec<u8>)],
    writer: &mut dyn FileWriter,
) -> Result<()> {
    let (parent, temp) = beside(dir, "")?;
    fs::create_dir_all(&parent).map_err(io_error(&parent))?;
    remove(&temp)?;
    fs::create_dir(&temp).map_err(io_error(&temp))?;
    let written = files
        .iter()
        .try_for_each(|(name, bytes)| writer.write(&temp.join(name), bytes));
    if let Err(err) = written.and_then(|()| sync_dir(&temp)) {
        let _ = fs::remove_dir_all(&temp);
        return Err(err);
    }
    if dir.exists() {
        let (_, old) = beside(dir, OLD_TAG)?;
        remove(&old)?;
        fs::rename(dir, &old).map_err(io_error(dir))?;
        fs::rename(&temp, dir).map_err(io_error(dir))?;
        sync_dir(&parent)?;
        remove(&old)?;
    } else {
        fs::rename(&temp, dir).map_err(io_error(dir))?;
    }
    sync_dir(&parent)
}

/// Fails with [`Error::FolderTaken`] unless `dir` can become a new folder: missing, or an empty
/// folder. [`create_dir`] checks it; commands call it before their work, so that a taken name
/// costs nothing.
pub fn refuse_taken(dir: &Path) -> Result<()> {
    let occupied = fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if occupied || (dir.exists() && !dir.is_dir()) {
        return Err(Error::FolderTaken {
            path: dir.to_owned(),
        });
    }
    Ok(())
}

/// Makes `dir` (missing, or an empty folder) a new folder that `fill` writes, atomically: `fill`
/// writes into a folder staged beside it (a temporary entry, which [`remove_stale`] would clear),
/// whose every file and folder is then synced, and which is renamed into place (a rename
/// replaces an empty folder whole). On any failure the staged folder is removed and `dir` is as
/// it was.
pub fn create_dir<E: From<Error>>(
    dir: &Path,
    fill: impl FnOnce(&Path) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    refuse_taken(dir)?;
    let (parent, temp) = beside(dir, "")?;
    fs::create_dir_all(&parent).map_err(io_error(&parent))?;
    remove(&temp)?;
    fs::create_dir(&temp).map_err(io_error(&temp))?;
    let written = fill(&temp).and_then(|()| {
        sync_tree(&temp)?;
        fs::rename(&temp, dir).map_err(io_error(dir))?;
        Ok(sync_dir(&parent)?)
    });
    if written.is_err() {
        let _ = fs::remove_dir_all(&temp);
    }
    written
}
