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
    Ok(with_telling_labels(&static_labels(&svg)))
}

/// inferno's default image width and the frames' padding, its font size
/// and width per character (monospace): what its script computes with.
const IMAGE_WIDTH: f64 = 1200.0;
const XPAD: f64 = 10.0;
const CHAR_WIDTH: f64 = 12.0 * 0.59;

/// The rule of src/cli/html/short_name.js, for the labels written into the
/// SVG itself (what a viewer without scripts shows, as an `<img>` does):
/// the whole name, then without its place (" [file:line]"), then without
/// its parameters, then the function without its namespaces, then that
/// cut with an ellipsis; nothing rather than a stub of under 6 characters.
pub fn short_name(name: &str, chars: usize) -> String {
    let len = |s: &str| s.chars().count();
    if len(name) <= chars {
        return name.to_string();
    }
    let no_loc = match name.rfind(" [") {
        Some(i) if name.ends_with(']') => &name[..i],
        _ => name,
    };
    if !no_loc.is_empty() && len(no_loc) <= chars {
        return no_loc.to_string();
    }
    let trimmed = no_loc.trim_end();
    let trimmed = trimmed.strip_suffix("const").map_or(trimmed, str::trim_end);
    let no_args = match (trimmed.ends_with(')'), trimmed.find('(')) {
        (true, Some(i)) => &trimmed[..i],
        _ => no_loc,
    };
    if !no_args.is_empty() && len(no_args) <= chars {
        return no_args.to_string();
    }
    let last = no_args
        .rsplit("::")
        .next()
        .filter(|l| !l.is_empty())
        .unwrap_or(no_args);
    if last.len() < no_args.len() && len(last) < chars {
        return format!("\u{2026}{last}");
    }
    if len(last) <= chars {
        return last.to_string();
    }
    if chars < 7 {
        return String::new();
    }
    let mut cut: String = last.chars().take(chars - 1).collect();
    cut.push('\u{2026}');
    cut
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Each frame's label written by inferno (`lay..`) replaced by its most
/// telling part ([`short_name`]) from the frame's title, for the width of
/// its box.
fn static_labels(svg: &str) -> String {
    let mut out = String::with_capacity(svg.len());
    let mut rest = svg;
    while let Some(start) = rest.find("<g><title>") {
        let (before, frame) = rest.split_at(start);
        out.push_str(before);
        let Some(end) = frame.find("</g>") else {
            rest = frame;
            break;
        };
        let (one, after) = frame.split_at(end);
        out.push_str(&relabel(one).unwrap_or_else(|| one.to_string()));
        rest = after;
    }
    out.push_str(rest);
    out
}

fn relabel(frame: &str) -> Option<String> {
    let title_start = "<g><title>".len();
    let title_end = frame.find("</title>")?;
    let title = xml_unescape(&frame[title_start..title_end]);
    // "name (1,234 bytes, 5.6%)"
    let name = title.rfind(" (").map_or(title.as_str(), |i| &title[..i]);
    let w_at = frame.find(" width=\"")? + " width=\"".len();
    let width: f64 = frame[w_at..w_at + frame[w_at..].find('%')?].parse().ok()?;
    let text_open = frame.find("<text ")?;
    let text_start = text_open + frame[text_open..].find('>')? + 1;
    let text_end = text_start + frame[text_start..].find("</text>")?;
    let px = width / 100.0 * (IMAGE_WIDTH - 2.0 * XPAD) - 3.0;
    let chars = if px > 0.0 {
        (px / CHAR_WIDTH).floor() as usize
    } else {
        0
    };
    Some(format!(
        "{}{}{}",
        &frame[..text_start],
        xml_escape(&short_name(name, chars)),
        &frame[text_end..]
    ))
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

#[cfg(test)]
mod tests {
    use super::short_name;

    /// The same rule as short_name.js: the function, not its namespace.
    #[test]
    fn labels_show_the_most_telling_part() {
        let cpp = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long)";
        assert_eq!(short_name(cpp, 200), cpp);
        assert_eq!(
            short_name(cpp, 71),
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
        );
        assert_eq!(short_name(cpp, 10), "\u{2026}malloc");
        assert_eq!(
            short_name("layer05_conv_forward [train.py:12]", 22),
            "layer05_conv_forward"
        );
        assert_eq!(
            short_name("layer05_conv_forward [train.py:12]", 9),
            "layer05_\u{2026}"
        );
        assert_eq!(short_name("layer05_conv_forward", 5), "");
    }
}
