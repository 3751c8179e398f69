//! Renderers: the LeakSanitizer-style text (exit summary and `cudaleak
//! report --format text`) and collapsed stacks for flamegraph tools.
//! JSON is the report model itself (serde).
//!
//! Bottom up:
//!
//! 1. escaping and capping names: `escaping`
//! 2. frames in one line, noise, the frames shown, group labels: `labels`
//! 3. collapsed stacks and the frames a picture shows: `folded_stacks`
//! 4. the out-of-memory and peak sections: `oom`
//! 5. the text report and the exit summary: `text_report`
//! 6. the tests: `tests`
//!
//! This file: the options and the rules every text section shares.

mod escaping;
mod folded_stacks;
mod labels;
mod oom;
#[cfg(test)]
mod tests;
mod text_report;

pub use escaping::*;
pub use folded_stacks::*;
pub use labels::*;
pub use oom::*;
pub use text_report::*;

pub struct TextOptions {
    /// groups shown; the rest are counted in one line
    pub max_groups: usize,
    /// frames shown per group
    pub max_frames: usize,
    /// show every frame: program start, the interpreter's own frames and
    /// foreign-call machinery included (`--full-stacks`)
    pub full_stacks: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            max_groups: 10,
            max_frames: 16,
            full_stacks: false,
        }
    }
}

pub(crate) const RULE: &str = "=================================================================";
const THIN_RULE: &str = "-----------------------------------------------------";
