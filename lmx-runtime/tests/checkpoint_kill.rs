//! Crash safety against a real kill: a child process saves checkpoints in a loop, resuming after
//! the latest as a restarted run would, and is killed (SIGKILL) in the middle of a save (after
//! one, two or all three of its files, before the rename) or at moments spread over its saves. Each time, the latest checkpoint loads
//! whole, its three files come from one save, and the next save clears what the killed one left.

use lmx_runtime::checkpoint::{self, Checkpoints, DurableWriter, FileWriter};
use lmx_runtime::nn::LinearParams;
use lmx_runtime::optim::AdamW;
use lmx_runtime::state::TrainState;
use lmx_runtime::tree;
use lmx_runtime::Array;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Set in the child: the folder it writes checkpoints into.
const CHILD_DIR: &str = "LMX_CHECKPOINT_KILL_DIR";
/// Set in the child when it should announce each file it writes (and pause after it).
const CHILD_ANNOUNCES: &str = "LMX_CHECKPOINT_KILL_ANNOUNCE";
/// This test's name, which the child runs.
const TEST: &str = "a_writer_killed_at_any_moment_leaves_the_latest_checkpoint_whole";

/// A 2-layer state of about 8 MB whose every parameter, and its step, is `value`.
fn state(value: f32) -> TrainState<Vec<LinearParams>, AdamW> {
    let filled = |shape: &[i32]| Array::full::<f32>(shape, Array::from_f32(value)).unwrap();
    let params = vec![
        LinearParams::new(filled(&[1024, 1024]), Some(filled(&[1024]))),
        LinearParams::new(filled(&[1024, 1024]), None),
    ];
    let mut state = TrainState::new(params, &AdamW::default(), 0).unwrap();
    state.step = Array::from_f32(value);
    state
}

/// Writes each file durably, then tells the parent (`wrote ...`) and waits long enough to be
/// killed before the next file: a kill there lands in the middle of a save.
struct Announcing;

impl FileWriter for Announcing {
    fn write(&mut self, path: &Path, bytes: &[u8]) -> lmx_runtime::Result<()> {
        DurableWriter.write(path, bytes)?;
        println!("\nwrote {}", path.display());
        std::thread::sleep(Duration::from_millis(100));
        Ok(())
    }
}

/// The child: resumes after the latest checkpoint, as a restarted run would, and saves the next
/// steps until it is killed. (Each report starts on a line of its own: the test harness's
/// `test ... ` header has no line end.)
fn write_until_killed(root: &Path) {
    let checkpoints = Checkpoints::new(root).keep_last(2);
    let first = checkpoints
        .list()
        .unwrap()
        .last()
        .map_or(1, |(step, _)| step + 1);
    let mut writer: Box<dyn FileWriter> = if std::env::var_os(CHILD_ANNOUNCES).is_some() {
        Box::new(Announcing)
    } else {
        Box::new(DurableWriter)
    };
    for step in first.. {
        let state = state(step as f32);
        checkpoints
            .save_with(step, &state, &json!({ "step": step }), writer.as_mut())
            .unwrap();
        println!("\nsaved {step}");
    }
}

/// The latest checkpoint of `root` loads, and its model, optimizer and trainer files all hold
/// the step its directory is named after. Returns that step.
fn check_latest(root: &Path) -> Option<u64> {
    let checkpoints = Checkpoints::new(root);
    let latest = checkpoints.latest().unwrap()?;
    let (step, _) = *checkpoints.list().unwrap().last().unwrap();
    let mut loaded = state(0.0);
    let trainer = checkpoint::load(&latest, &mut loaded)
        .unwrap_or_else(|err| panic!("{} does not load: {err}", latest.display()));
    assert_eq!(trainer["step"], step, "{}: trainer.json", latest.display());
    assert_eq!(
        loaded.step.item_exact::<f32>(),
        step as f32,
        "the optimizer file's step"
    );
    for leaf in tree::flatten(&loaded.params) {
        let (low, high) = (leaf.min(None).unwrap(), leaf.max(None).unwrap());
        assert_eq!(
            (low.item_exact::<f32>(), high.item_exact::<f32>()),
            (step as f32, step as f32),
            "{}: a parameter from another save",
            latest.display()
        );
    }
    Some(step)
}

#[test]
fn a_writer_killed_at_any_moment_leaves_the_latest_checkpoint_whole() {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        write_until_killed(Path::new(&dir));
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut survived: Vec<u64> = Vec::new();
    for round in 0..12u64 {
        // Even rounds: kill right after the 1st, 2nd or 3rd file of a save (the child announces
        // each and pauses), so the kill lands mid-save. Odd rounds: a plain child, killed 0, 34,
        // 68, ... 170 ms after a save, which spans its next save (about 200 ms in a debug build:
        // 24 MB made, encoded, written, fsynced, renamed, older ones pruned).
        let mid_save = round % 2 == 0;
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, root.path())
            .stdout(Stdio::piped());
        if mid_save {
            command.env(CHILD_ANNOUNCES, "1");
        }
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut line = || lines.next().expect("the child runs until killed").unwrap();
        while !line().starts_with("saved ") {}
        if mid_save {
            for _ in 0..=(round / 2) % 3 {
                while !line().starts_with("wrote ") {}
            }
        } else {
            std::thread::sleep(Duration::from_millis(17 * (round - 1)));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let temporary = std::fs::read_dir(root.path()).unwrap().any(|entry| {
            entry
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".tmp-")
        });
        assert!(
            temporary || !mid_save,
            "round {round}: the kill landed mid-save, which leaves a temporary directory"
        );
        survived.push(check_latest(root.path()).expect("a checkpoint was saved"));
    }
    assert!(
        survived.windows(2).all(|pair| pair[0] < pair[1]),
        "every run adds checkpoints and a kill never loses an earlier one: {survived:?}"
    );

    // The next save clears the leftovers of the killed ones.
    let checkpoints = Checkpoints::new(root.path()).keep_last(2);
    checkpoints
        .save(1000, &state(1000.0), &json!({ "step": 1000 }))
        .unwrap();
    let leftovers: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(check_latest(root.path()), Some(1000));
}
