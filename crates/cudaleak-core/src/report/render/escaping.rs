//! Escaping what a report holds before it reaches text, and capping the
//! names it brings.

use std::borrow::Cow;
use std::fmt::Write;

/// The longest name (function, file, module) any rendering shows, in
/// bytes: a 50 MB function name made a 150 MB page.
pub const MAX_NAME_BYTES: usize = 4096;

/// `s` cut to at most [`MAX_NAME_BYTES`] bytes (at a character boundary)
/// with an ellipsis: the one place where text, folded, SVG and HTML
/// renderings cap the names a report brings.
pub fn cap_name(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_NAME_BYTES {
        return Cow::Borrowed(s);
    }
    let mut end = MAX_NAME_BYTES - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &s[..end]))
}

/// `s` with every control character (C0, DEL, C1) and bidirectional
/// override written as an escape (`\n`, `\x1b`, `\u{202e}`), and `\`
/// doubled when there is something to escape. Every string from a report
/// goes through it before it reaches text output: a report whose fields
/// held an ANSI escape and a newline could otherwise forge a
/// "cudaleak: 0 bytes leaked" line on the terminal.
pub fn escape(s: &str) -> Cow<'_, str> {
    fn unprintable(c: char) -> bool {
        c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    let s = match cap_name(s) {
        Cow::Borrowed(s) => s,
        Cow::Owned(capped) => return Cow::Owned(escape(&capped).into_owned()),
    };
    if !s.chars().any(unprintable) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x100 && unprintable(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if unprintable(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}
