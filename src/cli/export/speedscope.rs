//! `--format speedscope`: the leaks flame graph as speedscope's file
//! format (<https://www.speedscope.app/file-format-schema.json>): one
//! weighted sampled profile per process, in bytes, each group a sample
//! (its merged Python and native stack, root first, the allocating API as
//! the leaf, as in folded output) weighted by its leaked bytes. The
//! stack holds the frames the text report shows (no interpreter, ctypes,
//! libffi or program start around a Python program's lines), every frame
//! with `--full-stacks`.

use super::{frame_name, process_label, Process};
use cudaleak_core::report::render::picture_frames;
use cudaleak_core::report::saturating_sum;
use serde_json::{json, Value};
use std::collections::HashMap;

pub fn speedscope(processes: &[Process], full: bool) -> Value {
    let mut frames: Vec<Value> = Vec::new();
    let mut index: HashMap<(String, Option<String>, Option<i64>), usize> = HashMap::new();
    let mut frame = |name: String, file: Option<String>, line: Option<i64>| -> usize {
        let next = index.len();
        *index
            .entry((name.clone(), file.clone(), line))
            .or_insert_with(|| {
                let mut f = json!({"name": name});
                if let Some(file) = file {
                    f["file"] = json!(file);
                }
                if let Some(line) = line {
                    f["line"] = json!(line);
                }
                frames.push(f);
                next
            })
    };
    let mut profiles = Vec::new();
    for (_, r) in processes {
        let mut samples = Vec::new();
        let mut weights = Vec::new();
        for g in &r.leaks {
            let mut stack: Vec<usize> = picture_frames(g, full)
                .iter()
                .rev()
                .map(|f| {
                    let n = frame_name(f);
                    frame(n.name, n.file, n.line)
                })
                .collect();
            stack.push(frame(g.api.clone(), None, None));
            samples.push(stack);
            weights.push(g.bytes);
        }
        let total = saturating_sum(weights.iter().copied());
        profiles.push(json!({
            "type": "sampled",
            "name": format!("leaked bytes: {} ({} report)", process_label(r), r.trigger.name()),
            "unit": "bytes",
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": weights,
        }));
    }
    let name = match processes {
        [(_, r)] => format!("cudaleak: {}", process_label(r)),
        _ => format!("cudaleak: {} processes", processes.len()),
    };
    json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "name": name,
        "exporter": format!("cudaleak {}", env!("CARGO_PKG_VERSION")),
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": profiles,
    })
}
