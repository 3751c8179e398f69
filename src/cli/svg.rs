//! `--format svg`: an interactive flame graph (hover, click to zoom,
//! search) drawn by the `inferno` crate from the folded stacks, weighted
//! by bytes. inferno is CDDL-1.0 and is linked into the CLI only, never
//! into libcudaleak.so.

use inferno::flamegraph::{self, Options};

/// The SVG for `folded` (one "frame;frame;... bytes" line per group). With
/// nothing to draw, an SVG that says so: inferno refuses empty input.
pub fn flame_graph(title: &str, folded: &str) -> Result<String, String> {
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.count_name = "bytes".to_string();
    opts.name_type = "Frame:".to_string();
    opts.colors = flamegraph::color::Palette::Basic(flamegraph::color::BasicPalette::Mem);
    let mut out = Vec::new();
    let lines: Vec<&str> = folded.lines().filter(|l| !l.ends_with(" 0")).collect();
    if lines.is_empty() {
        return Ok(empty_svg(title));
    }
    flamegraph::from_lines(&mut opts, lines.iter().copied(), &mut out)
        .map_err(|e| format!("cannot draw the flame graph: {e}"))?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

fn empty_svg(title: &str) -> String {
    let esc = title
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"600\" height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"10\" y=\"24\">{esc}</text><text x=\"10\" y=\"46\">no bytes to draw</text></svg>\n"
    )
}
