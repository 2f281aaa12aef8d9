//! Preference data for DPO's command-line tests.

use std::path::Path;

/// 24 pairs from the bundled text, as JSONL at `path`: a prompt, the real continuation, and a
/// corrupted one.
pub fn preferences(path: &Path) {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt"))
            .unwrap();
    let letters: Vec<char> = source.chars().filter(|c| c.is_ascii_lowercase()).collect();
    let mut lines = String::new();
    for i in 0..24 {
        let at = i * 16;
        let prompt: String = letters[at..at + 10].iter().collect();
        let chosen: String = letters[at + 10..at + 16].iter().collect();
        let rejected: String = chosen
            .chars()
            .map(|c| if c == 'z' { 'a' } else { 'z' })
            .collect();
        let line = serde_json::json!({"prompt": prompt, "chosen": chosen, "rejected": rejected});
        lines.push_str(&format!("{line}\n"));
    }
    std::fs::write(path, lines).unwrap();
}
