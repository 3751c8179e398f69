//! `--format svg`: an interactive flame graph (hover, click to zoom,
//! search) drawn by the `inferno` crate from the folded stacks, weighted
//! by bytes. inferno is CDDL-1.0 and is linked into the CLI only, never
//! into libcudaleak.so.

use inferno::flamegraph::{self, Options};
use std::collections::{HashMap, HashSet};

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
    // The leaves: the API each stack ends in, never numbered.
    let leaves: HashSet<&str> = lines
        .iter()
        .filter_map(|l| {
            l.rsplit_once(' ')
                .map(|(stack, _)| stack.rsplit(';').next().unwrap_or(stack))
        })
        .collect();
    Ok(with_telling_labels(&static_labels(&svg, &leaves)))
}

/// inferno's default image width and the frames' padding, its font size
/// and width per character (monospace): what its script computes with.
const IMAGE_WIDTH: f64 = 1200.0;
const XPAD: f64 = 10.0;
const CHAR_WIDTH: f64 = 12.0 * 0.59;

/// The rule of src/cli/html/short_name.js, for the labels written into the
/// SVG itself (what a viewer without scripts shows, as an `<img>` does):
/// the whole name, then without its place (`" [file:line]"`), then without
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

/// How many of the frames too narrow for their names are numbered, with
/// their names in the key under the graph.
const KEYED: usize = 10;
/// The numbers' font size (the frames' is 12): "10" fits a box 15 pixels
/// wide.
const KEY_FONT: f64 = 9.0;
/// The key's lines: their height, and the two columns' left edges.
const KEY_LINE: f64 = 16.0;
const KEY_COLUMNS: [f64; 2] = [XPAD, IMAGE_WIDTH / 2.0];

/// One frame of inferno's SVG: `<g><title>NAME (N bytes, P%)</title><rect
/// ... width="W%" .../><text ...>LABEL</text></g>`.
struct Frame<'a> {
    /// the whole `<g>...` up to its `</g>`
    svg: &'a str,
    title: String,
    name: String,
    /// the box's width in pixels, less the label's padding
    px: f64,
}

impl<'a> Frame<'a> {
    fn parse(svg: &'a str) -> Option<Frame<'a>> {
        let title_start = "<g><title>".len();
        let title_end = svg.find("</title>")?;
        let title = xml_unescape(&svg[title_start..title_end]);
        // "name (1,234 bytes, 5.6%)"
        let name = title
            .rfind(" (")
            .map_or(title.as_str(), |i| &title[..i])
            .to_string();
        let w_at = svg.find(" width=\"")? + " width=\"".len();
        let width: f64 = svg[w_at..w_at + svg[w_at..].find('%')?].parse().ok()?;
        let px = width / 100.0 * (IMAGE_WIDTH - 2.0 * XPAD) - 3.0;
        Some(Frame { svg, title, name, px })
    }

    /// How many characters of `font` pixels fit its box.
    fn chars(&self, font: f64) -> usize {
        if self.px > 0.0 {
            (self.px / (CHAR_WIDTH * font / 12.0)).floor() as usize
        } else {
            0
        }
    }

    /// The frame with its label `label`, its `<g>` marked with `key`.
    fn relabelled(&self, label: &str, key: Option<usize>) -> Option<String> {
        let text_open = self.svg.find("<text ")?;
        let text_start = text_open + self.svg[text_open..].find('>')? + 1;
        let text_end = text_start + self.svg[text_start..].find("</text>")?;
        let head = &self.svg[..text_open];
        let text_tag = &self.svg[text_open..text_start];
        Some(match key {
            Some(k) => format!(
                "{}{}{}{}",
                head.replacen("<g>", &format!("<g data-key=\"{k}\">"), 1),
                text_tag.replacen("<text ", "<text class=\"keyed\" ", 1),
                xml_escape(label),
                &self.svg[text_end..]
            ),
            None => format!("{head}{text_tag}{}{}", xml_escape(label), &self.svg[text_end..]),
        })
    }
}

/// Each frame's label written by inferno (`lay..`) replaced by its most
/// telling part ([`short_name`]) from the frame's title, for the width of
/// its box. At 60 call sites through one helper no site's box is wide
/// enough for its name: the [`KEYED`] widest frames of the program whose
/// names do not fit (not the root, not a leaf in `leaves`, not a name that
/// several such boxes share: the helper tells none apart) get a number,
/// and the key under the graph names them, as the HTML page's flame
/// graphs do.
fn static_labels(svg: &str, leaves: &HashSet<&str>) -> String {
    // The frames, and what lies between them.
    let mut pieces: Vec<Result<Frame, &str>> = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find("<g><title>") {
        let (before, frame) = rest.split_at(start);
        pieces.push(Err(before));
        let Some(end) = frame.find("</g>") else {
            rest = frame;
            break;
        };
        let (one, after) = frame.split_at(end);
        pieces.push(Frame::parse(one).ok_or(one));
        rest = after;
    }
    pieces.push(Err(rest));

    let narrow: Vec<(usize, &Frame)> = pieces
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((i, p.as_ref().ok()?)))
        .filter(|(_, f)| {
            f.name != "all"
                && !leaves.contains(f.name.as_str())
                && short_name(&f.name, f.chars(12.0)) != f.name
        })
        .collect();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (_, f) in &narrow {
        *names.entry(f.name.as_str()).or_default() += 1;
    }
    let mut candidates: Vec<(usize, &Frame)> = narrow
        .into_iter()
        .filter(|(_, f)| names[f.name.as_str()] == 1)
        .collect();
    candidates.sort_by(|a, b| b.1.px.total_cmp(&a.1.px));
    // Piece index -> its number.
    let mut keyed: HashMap<usize, usize> = HashMap::new();
    let mut key_lines: Vec<String> = Vec::new();
    for (i, f) in candidates {
        let k = key_lines.len() + 1;
        if k > KEYED {
            break;
        }
        if f.chars(KEY_FONT) < k.to_string().len() {
            continue;
        }
        keyed.insert(i, k);
        key_lines.push(format!("{k}  {}", f.title));
    }

    let mut out = String::with_capacity(svg.len());
    for (i, p) in pieces.iter().enumerate() {
        match p {
            Err(text) => out.push_str(text),
            Ok(f) => {
                let key = keyed.get(&i).copied();
                let label = match key {
                    Some(k) => {
                        let num = k.to_string();
                        let rest = short_name(&f.name, f.chars(KEY_FONT).saturating_sub(num.len() + 1));
                        if rest.is_empty() {
                            num
                        } else {
                            format!("{num} {rest}")
                        }
                    }
                    None => short_name(&f.name, f.chars(12.0)),
                };
                out.push_str(&f.relabelled(&label, key).unwrap_or_else(|| f.svg.to_string()));
            }
        }
    }
    with_key(&out, &key_lines)
}

/// `svg` with `lines` under the graph, in two columns: the SVG grows by
/// their height.
fn with_key(svg: &str, lines: &[String]) -> String {
    if lines.is_empty() {
        return svg.to_string();
    }
    let rows = lines.len().div_ceil(KEY_COLUMNS.len());
    let grow = rows as f64 * KEY_LINE + 8.0;
    // The outer <svg>'s height and viewBox.
    let Some(open_end) = svg.find("<svg ").and_then(|i| svg[i..].find('>').map(|j| i + j)) else {
        return svg.to_string();
    };
    let open = &svg[..open_end];
    let Some(height) = attr_value(open, "height").and_then(|h| h.parse::<f64>().ok()) else {
        return svg.to_string();
    };
    let new_height = height + grow;
    let open = open
        .replacen(
            &format!("height=\"{height}\""),
            &format!("height=\"{new_height}\""),
            1,
        )
        .replacen(
            &format!("viewBox=\"0 0 {IMAGE_WIDTH} {height}\""),
            &format!("viewBox=\"0 0 {IMAGE_WIDTH} {new_height}\""),
            1,
        );
    let mut key = String::from("<g id=\"cudaleak-key\">");
    for (i, line) in lines.iter().enumerate() {
        let (col, row) = (i / rows, i % rows);
        let x = KEY_COLUMNS[col.min(KEY_COLUMNS.len() - 1)];
        let y = height + 4.0 + (row as f64 + 1.0) * KEY_LINE - 4.0;
        key.push_str(&format!(
            "<text class=\"key-line\" x=\"{x}\" y=\"{y}\" data-key=\"{}\">{}</text>",
            i + 1,
            xml_escape(line)
        ));
    }
    key.push_str("</g>");
    let Some(close) = svg.rfind("</svg>") else {
        return svg.to_string();
    };
    // inferno's background fills the old height: it fills the new one.
    let body = svg[open_end..close].replacen(
        &format!("height=\"{height}\" fill=\"url(#background)\""),
        &format!("height=\"{new_height}\" fill=\"url(#background)\""),
        1,
    );
    format!("{open}{body}{key}{}", &svg[close..])
    .replacen(
        "</style>",
        &format!(".keyed {{ font-size:{KEY_FONT}px; font-weight:bold; }}\n.key-line {{ font-size:11px; }}\n</style>"),
        1,
    )
}

/// The value of attribute `name` in a start tag.
fn attr_value<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    Some(&tag[start..start + tag[start..].find('"')?])
}

/// inferno cuts a label to its first or last characters ("lay..",
/// "..oc"); the page's rule shows the most telling part of a name, the
/// function rather than its namespace. Its script sets every
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
    var name = shortName(txt, Math.floor(w / cw));
    // A numbered frame (the key under the graph names it) keeps its
    // number while its name does not fit.
    var key = e.getAttribute("data-key");
    if (key && name !== txt) {
        var rest = shortName(txt, Math.floor(w / (cw * 9 / 12)) - key.length - 1);
        t.textContent = rest ? key + " " + rest : key;
        t.setAttribute("class", "keyed");
    } else {
        t.textContent = name;
        t.removeAttribute("class");
    }
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
