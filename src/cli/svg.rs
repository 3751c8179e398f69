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
    // Monospace, so that the script knows each label's width exactly.
    opts.font_type = "monospace".to_string();
    let mut out = Vec::new();
    let lines: Vec<&str> = folded.lines().filter(|l| !l.ends_with(" 0")).collect();
    if lines.is_empty() {
        return Ok(empty_svg(title));
    }
    flamegraph::from_lines(&mut opts, lines.iter().copied(), &mut out)
        .map_err(|e| format!("cannot draw the flame graph: {e}"))?;
    let svg = String::from_utf8(out).map_err(|e| e.to_string())?;
    Ok(with_telling_labels(&svg))
}

/// inferno cuts a label to its first or last characters ("lay..",
/// "..oc"); the page's rule shows the most telling part of a name, the
/// function rather than its namespace (issue 26). Its script sets every
/// label at load and at each zoom through `update_text` and
/// `update_text_for_elements`: later declarations of both, from the
/// box's title (the whole name, shown on hover), take their place.
fn with_telling_labels(svg: &str) -> String {
    const LABELS: &str = r#"
function cudaleak_label(e) {
    var r = find_child(e, "rect"), t = find_child(e, "text"), title = find_child(e, "title");
    if (!r || !t || !title) return;
    var w = parseFloat(r.attributes.width.value) * frames.attributes.width.value / 100 - 3;
    var txt = title.textContent.replace(/\([^(]*\)$/, "").trim();
    t.attributes.x.value = format_percent((parseFloat(r.attributes.x.value) + (100 * 3 / frames.attributes.width.value)));
    var cw = known_font_width || fontsize * fontwidth;
    t.textContent = shortName(txt, Math.floor(w / cw));
}
function update_text_for_elements(elements) {
    for (var i = 0; i < elements.length; i++) cudaleak_label(elements[i]);
}
function update_text(e) { cudaleak_label(e); }
"#;
    match svg.find("]]></script>") {
        Some(at) => format!("{}{}{LABELS}{}", &svg[..at], super::html::SHORT_NAME, &svg[at..]),
        None => svg.to_string(),
    }
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
