//! Replays every fuzz corpus through the target bodies on stable Rust, so CI needs no nightly.

use std::path::Path;

#[test]
fn corpora_replay_without_failure() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, target) in transport_core_fuzz::TARGETS {
        let dir = root.join(name);
        let entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()))
            .map(|e| e.expect("corpus entry").path())
            .collect();
        assert!(
            entries.len() >= 8,
            "corpus {name} has only {} inputs",
            entries.len()
        );
        for path in entries {
            let data = std::fs::read(&path).expect("read corpus input");
            target(&data);
        }
    }
}
