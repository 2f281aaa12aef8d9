//! Every step's `tokens_per_s` is its own: at validation and checkpoint steps, where the trainer
//! reports two steps back to back, neither reads far above the run's throughput.

use lmx::models::gpt2::{Gpt2, Train};
use lmx::runtime::data::Windows;
use lmx::runtime::model::LanguageModel;
use lmx::runtime::train::{Callback, Control, Overlap, StepReport, TrainConfig, Trainer};
use lmx::runtime::Result;
use std::sync::{Arc, Mutex};

/// Keeps every step's throughput.
struct Rates(Arc<Mutex<Vec<f64>>>);

impl Callback for Rates {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        self.0.lock().unwrap().push(report.tokens_per_s);
        Ok(Control::Continue)
    }
}

#[test]
fn no_step_reports_a_throughput_far_above_the_run_s() -> Result<()> {
    let tokens: Vec<u32> = (0..40_000u32).map(|i| (i * 7919) % 256).collect();
    let windows = Windows::new(Arc::new(tokens), 32)?;
    // A model of many operations: handing a step to MLX's CPU stream runs most of it, so a step
    // drained at a boundary right after the previous report has almost nothing left to wait for.
    let model = Gpt2::preset("tiny").expect("gpt2.lmx has a tiny preset");
    for overlap in [Overlap::Off, Overlap::Build, Overlap::Submit] {
        let out = tempfile::tempdir().unwrap();
        let train = TrainConfig {
            steps: 18,
            batch_size: 8,
            seq_len: 32,
            overlap,
            // Each third step validates and saves: two reports back to back.
            eval_every: 3,
            eval_batches: 1,
            checkpoint_every: 3,
            out_dir: out.path().to_path_buf(),
            ..TrainConfig::default()
        };
        let mut trainer = Trainer::<Train>::new(model.clone(), train, windows.clone())?;
        let rates = Arc::new(Mutex::new(Vec::new()));
        trainer.add_callback(Rates(rates.clone()));
        trainer.run()?;
        let mut rates = rates.lock().unwrap().clone();
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        // Timed from the previous report, such a step read 100 to 1000 times the median; timed
        // from its own start to the next step's, none is more than a few times as fast.
        assert!(
            rates[rates.len() - 1] < 10.0 * median,
            "{overlap:?}: tokens/s {rates:?}"
        );
    }
    Ok(())
}
