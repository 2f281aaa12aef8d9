//! Checkpoints of a whole training state: the layout on disk, an exact round trip after AdamW
//! steps, errors that leave the in-memory state untouched, keep-last-N, and crash safety (a save
//! that fails between files, a save killed part-way, a replaced checkpoint).

use lmx_runtime::checkpoint::{
    self, Checkpoints, DurableWriter, FileWriter, MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE,
};
use lmx_runtime::nn::{self, init::Keys, LinearParams};
use lmx_runtime::optim::AdamW;
use lmx_runtime::state::TrainState;
use lmx_runtime::step::{StepOptions, TrainStep};
use lmx_runtime::{Error, Result};
use mlx_rs::{random, transforms::eval, Array};
use safetensors::SafeTensors;
use serde_json::json;
use std::path::Path;

type Mlp = Vec<LinearParams>;
type State = TrainState<Mlp, AdamW>;

fn mlp(hidden: i32, seed: u64) -> Result<Mlp> {
    let mut keys = Keys::from_seed(seed)?;
    Ok(vec![
        nn::init::linear(6, hidden, true, &mut keys)?,
        nn::init::linear(hidden, 3, true, &mut keys)?,
    ])
}

fn loss(params: &Mlp, batch: &[Array], _key: &Array) -> Result<Array> {
    let hidden = nn::silu(&nn::linear(&params[0], &batch[0])?)?;
    nn::cross_entropy(&nn::linear(&params[1], &hidden)?, &batch[1])
}

/// A state after `steps` AdamW steps (eager), so that moments, step and key are all non-trivial.
fn trained(steps: usize, seed: u64) -> Result<State> {
    let optimizer = AdamW::default();
    let mut state = TrainState::new(mlp(8, seed)?, &optimizer, seed)?;
    let options = StepOptions {
        clip_norm: Some(1.0),
        compile: false,
        ..StepOptions::default()
    };
    let mut step = TrainStep::new(&state, optimizer, loss, options)?;
    let (kx, ky) = random::split(&random::key(7)?, 2)?;
    let batch = [
        random::normal::<f32>(&[4, 6], None, None, &kx)?,
        random::randint::<_, i32>(0, 3, &[4], &ky)?,
    ];
    for _ in 0..steps {
        step.step(&mut state, 0.01, &batch)?;
    }
    eval(&state.flatten())?;
    Ok(state)
}

/// Every array of the state as bits, with its shape.
fn snapshot(state: &State) -> Vec<(Vec<i32>, Vec<u32>)> {
    state
        .flatten()
        .iter()
        .map(|array| {
            let bits = match array.dtype() {
                mlx_rs::Dtype::Uint32 => array.as_slice::<u32>().to_vec(),
                _ => array
                    .as_slice::<f32>()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
            };
            (array.shape().to_vec(), bits)
        })
        .collect()
}

fn checkpoint_error<T>(result: Result<T>) -> (std::path::PathBuf, String) {
    match result {
        Err(Error::Checkpoint { path, message }) => (path, message),
        Err(other) => panic!("expected a checkpoint error, got {other}"),
        Ok(_) => panic!("expected a checkpoint error, got success"),
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_directory_holds_named_safetensors_and_json() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let state = trained(2, 0)?;
    let dir = Checkpoints::new(root.path()).save(123, &state, &json!({"step": 123}))?;
    assert_eq!(dir, root.path().join("step-000123"));
    assert_eq!(entries(&dir), [MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE]);

    let bytes = std::fs::read(dir.join(MODEL_FILE)).unwrap();
    let mut names = SafeTensors::deserialize(&bytes)
        .unwrap()
        .names()
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    names.sort();
    assert_eq!(names, ["0.bias", "0.weight", "1.bias", "1.weight"]);

    let bytes = std::fs::read(dir.join(OPTIMIZER_FILE)).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file
        .names()
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    names.sort();
    assert_eq!(
        names,
        [
            "0.bias.0",
            "0.bias.1",
            "0.weight.0",
            "0.weight.1",
            "1.bias.0",
            "1.bias.1",
            "1.weight.0",
            "1.weight.1",
            "rng",
            "step"
        ]
    );
    assert_eq!(file.tensor("0.weight.1").unwrap().shape(), [8, 6]);
    assert_eq!(file.tensor("step").unwrap().data(), 2.0_f32.to_le_bytes());
    assert_eq!(file.tensor("rng").unwrap().dtype(), safetensors::Dtype::U32);
    Ok(())
}

#[test]
fn a_state_with_adamw_moments_round_trips_exactly() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let state = trained(3, 0)?;
    let trainer = json!({"step": 3, "data": {"epoch": 0, "position": 12}, "schedule": {"kind": "constant", "lr": 0.01}});
    let dir = Checkpoints::new(root.path()).save(3, &state, &trainer)?;

    let mut fresh = TrainState::new(mlp(8, 99)?, &AdamW::default(), 99)?;
    assert_ne!(snapshot(&fresh), snapshot(&state));
    let back = checkpoint::load(&dir, &mut fresh)?;
    assert_eq!(back, trainer);
    assert_eq!(snapshot(&fresh), snapshot(&state));
    assert_eq!(fresh.declaration(), state.declaration());
    Ok(())
}

#[test]
fn loading_into_the_wrong_model_names_the_tensor_and_leaves_the_state_untouched() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let dir = Checkpoints::new(root.path()).save(1, &trained(1, 0)?, &json!({}))?;
    let mut other = TrainState::new(mlp(5, 1)?, &AdamW::default(), 1)?;
    let before = snapshot(&other);
    let (path, message) = checkpoint_error(checkpoint::load(&dir, &mut other));
    assert_eq!(path, dir.join(MODEL_FILE));
    assert_eq!(
        message,
        "0.weight: checkpoint has [8, 6], model expects [5, 6]"
    );
    assert_eq!(snapshot(&other), before);
    Ok(())
}

#[test]
fn a_corrupt_file_is_named_and_the_state_untouched() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let dir = Checkpoints::new(root.path()).save(1, &trained(1, 0)?, &json!({"step": 1}))?;
    let mut state = TrainState::new(mlp(8, 1)?, &AdamW::default(), 1)?;
    let before = snapshot(&state);

    let optimizer = dir.join(OPTIMIZER_FILE);
    let bytes = std::fs::read(&optimizer).unwrap();
    std::fs::write(&optimizer, &bytes[..bytes.len() / 2]).unwrap();
    let (path, message) = checkpoint_error(checkpoint::load(&dir, &mut state));
    assert_eq!(path, optimizer);
    assert!(
        message.starts_with("not a valid safetensors file"),
        "{message}"
    );
    assert_eq!(snapshot(&state), before);

    std::fs::write(&optimizer, &bytes).unwrap();
    std::fs::write(dir.join(TRAINER_FILE), b"{\"step\": ").unwrap();
    let (path, message) = checkpoint_error(checkpoint::load(&dir, &mut state));
    assert_eq!(path, dir.join(TRAINER_FILE));
    assert!(message.starts_with("not valid JSON"), "{message}");
    assert_eq!(snapshot(&state), before);
    Ok(())
}

#[test]
fn keep_last_prunes_the_oldest() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(root.path()).keep_last(2);
    let state = trained(1, 0)?;
    for step in [10, 20, 30, 40] {
        checkpoints.save(step, &state, &json!({"step": step}))?;
    }
    let steps: Vec<u64> = checkpoints
        .list()?
        .into_iter()
        .map(|(step, _)| step)
        .collect();
    assert_eq!(steps, [30, 40]);
    assert_eq!(checkpoints.latest()?, Some(root.path().join("step-000040")));
    // A save older than those kept (a run resumed from further back) is kept nonetheless.
    checkpoints.save(5, &state, &json!({}))?;
    let steps: Vec<u64> = checkpoints
        .list()?
        .into_iter()
        .map(|(step, _)| step)
        .collect();
    assert_eq!(steps, [5, 30, 40]);
    Ok(())
}

#[test]
fn pruning_keeps_the_checkpoint_of_lowest_loss_and_a_diverged_run_names_the_last_sane_one(
) -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(root.path()).keep_last(3);
    let state = trained(1, 0)?;
    assert_eq!(checkpoints.last_sane()?, None, "no checkpoint yet");
    // A run that learns, then blows up: the losses 5.97, 2.2e11, 1.0e12.
    for (step, loss) in [(10, 6.5), (20, 5.97), (30, 6.2), (40, 2.2e11), (50, 1.0e12)] {
        checkpoints.save(step, &state, &json!({"step": step, "loss": loss}))?;
    }
    let steps: Vec<u64> = checkpoints
        .list()?
        .into_iter()
        .map(|(step, _)| step)
        .collect();
    assert_eq!(steps, [20, 30, 40, 50], "the last 3 and the best");
    let dir = |step| root.path().join(checkpoint::dir_name(step));
    // 6.2 is within a tenth of 5.97 and more recent.
    assert_eq!(checkpoints.last_sane()?, Some((dir(30), 6.2)));
    checkpoints.save(60, &state, &json!({"step": 60, "loss": null}))?;
    let steps: Vec<u64> = checkpoints
        .list()?
        .into_iter()
        .map(|(step, _)| step)
        .collect();
    assert_eq!(steps, [20, 40, 50, 60], "the best outlives the last 3");
    assert_eq!(checkpoints.last_sane()?, Some((dir(20), 5.97)));
    assert_eq!(checkpoints.remove_after(20)?, [dir(40), dir(50), dir(60)]);
    assert_eq!(checkpoints.latest()?, Some(dir(20)));
    Ok(())
}

/// Writes `files` files, then fails as a full disk or a kill would.
struct FailAfter {
    files: usize,
}

impl FileWriter for FailAfter {
    fn write(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        if self.files == 0 {
            return Err(Error::Io {
                path: path.to_owned(),
                cause: std::io::Error::other("simulated failure"),
            });
        }
        self.files -= 1;
        DurableWriter.write(path, bytes)
    }
}

#[test]
fn a_save_failing_between_files_leaves_the_previous_checkpoint_loadable() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(root.path());
    let first = trained(1, 0)?;
    checkpoints.save(1, &first, &json!({"step": 1}))?;
    let second = trained(2, 0)?;
    for files in 0..3 {
        assert!(checkpoints
            .save_with(2, &second, &json!({"step": 2}), &mut FailAfter { files })
            .is_err());
        assert_eq!(
            entries(root.path()),
            ["step-000001"],
            "after failing at file {files}"
        );
    }
    // Failing while replacing the very checkpoint being loaded from leaves it whole, too.
    assert!(checkpoints
        .save_with(1, &second, &json!({"step": 2}), &mut FailAfter { files: 1 })
        .is_err());
    let latest = checkpoints.latest()?.expect("the first checkpoint");
    let mut state = TrainState::new(mlp(8, 5)?, &AdamW::default(), 5)?;
    assert_eq!(checkpoint::load(&latest, &mut state)?, json!({"step": 1}));
    assert_eq!(snapshot(&state), snapshot(&first));
    Ok(())
}

#[test]
fn leftovers_of_a_killed_save_are_ignored_then_cleaned() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(root.path());
    let state = trained(1, 0)?;
    checkpoints.save(1, &state, &json!({"step": 1}))?;
    // A process killed mid-save leaves a temporary directory with a partial file, and one killed
    // while replacing a checkpoint leaves the old copy aside; other files are not checkpoints.
    let stale = root.path().join(".tmp-step-000002");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join(MODEL_FILE), b"partial").unwrap();
    std::fs::create_dir(root.path().join(".tmp-old-step-000001")).unwrap();
    std::fs::write(root.path().join("notes.txt"), b"not a checkpoint").unwrap();
    std::fs::create_dir(root.path().join("step-12x")).unwrap();

    assert_eq!(checkpoints.list()?, [(1, root.path().join("step-000001"))]);
    let mut loaded = TrainState::new(mlp(8, 5)?, &AdamW::default(), 5)?;
    checkpoint::load(&checkpoints.latest()?.unwrap(), &mut loaded)?;
    assert_eq!(snapshot(&loaded), snapshot(&state));

    checkpoints.save(2, &state, &json!({"step": 2}))?;
    assert_eq!(
        entries(root.path()),
        ["notes.txt", "step-000001", "step-000002", "step-12x"]
    );
    Ok(())
}

#[test]
fn saving_a_step_again_replaces_it() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(root.path());
    checkpoints.save(7, &trained(1, 0)?, &json!({"take": 1}))?;
    let newer = trained(2, 0)?;
    let dir = checkpoints.save(7, &newer, &json!({"take": 2}))?;
    assert_eq!(entries(root.path()), ["step-000007"]);
    let mut state = TrainState::new(mlp(8, 5)?, &AdamW::default(), 5)?;
    assert_eq!(checkpoint::load(&dir, &mut state)?, json!({"take": 2}));
    assert_eq!(snapshot(&state), snapshot(&newer));
    Ok(())
}

#[test]
fn a_save_killed_while_replacing_a_checkpoint_gets_it_back() -> Result<()> {
    let root = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(root.path());
    let first = trained(1, 0)?;
    checkpoints.save(1, &first, &json!({"step": 1}))?;
    checkpoints.save(2, &first, &json!({"step": 2}))?;
    // Killed between the two renames of replacing step 2: the old copy is aside, the new one
    // (complete or not) still temporary, and step 2 is missing.
    std::fs::rename(
        root.path().join("step-000002"),
        root.path().join(".tmp-old-step-000002"),
    )
    .unwrap();
    std::fs::create_dir(root.path().join(".tmp-step-000002")).unwrap();
    assert_eq!(checkpoints.latest()?, Some(root.path().join("step-000001")));

    checkpoints.save(3, &trained(3, 0)?, &json!({"step": 3}))?;
    assert_eq!(
        entries(root.path()),
        ["step-000001", "step-000002", "step-000003"]
    );
    let mut state = TrainState::new(mlp(8, 5)?, &AdamW::default(), 5)?;
    assert_eq!(
        checkpoint::load(&root.path().join("step-000002"), &mut state)?,
        json!({"step": 2})
    );
    assert_eq!(snapshot(&state), snapshot(&first));
    Ok(())
}
