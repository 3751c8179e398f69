//! Sizes and counts as people read them: every renderer (text report, exit
//! summary, diff, merge, timeline, the CLI's lines) formats through these,
//! so that no line says "Live of 73400320 byte(s)" or "1 blocks" again.

/// `n` with its noun, singular or plural: "1 block", "2 blocks".
pub fn count(n: u64, singular: &str) -> String {
    if n == 1 {
        format!("1 {singular}")
    } else if singular.ends_with('s') {
        format!("{n} {singular}es")
    } else {
        format!("{n} {singular}s")
    }
}

/// A size in binary units with one decimal: "600 bytes", "1 byte",
/// "4.0 KiB", "70.0 MiB". Exact below 1 KiB.
pub fn size(bytes: u64) -> String {
    if bytes < 1024 {
        return count(bytes, "byte");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < BINARY_UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    // 1023.96 KiB would print as "1024.0 KiB": step up instead.
    if format!("{value:.1}") == "1024.0" && unit + 1 < BINARY_UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", BINARY_UNITS[unit])
}

/// A size where the exact count matters too: "70.0 MiB (73400320 bytes)";
/// below 1 KiB the exact count alone ("600 bytes").
pub fn size_exact(bytes: u64) -> String {
    if bytes < 1024 {
        size(bytes)
    } else {
        format!("{} ({bytes} bytes)", size(bytes))
    }
}

/// A signed change in size: "+4.0 KiB", "-600 bytes", "0 bytes".
pub fn size_delta(delta: i64) -> String {
    let sign = match delta {
        d if d > 0 => "+",
        d if d < 0 => "-",
        _ => "",
    };
    format!("{sign}{}", size(delta.unsigned_abs()))
}

/// The units [`size`] steps through above 1 KiB, each 1024 times the one
/// before. The Python module's `format_size` uses them too, from its
/// generated copy (python/cudaleak/_tables.py; docs/decisions.md, "The
/// Python module's tables are generated from the Rust ones").
pub const BINARY_UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// The units [`parse_size`] takes (lower case) and the bytes of each: binary
/// ones for "k" and "KiB", decimal ones for "kB". The Python module's
/// `parse_size` takes the same, from its generated copy
/// (python/cudaleak/_tables.py).
pub const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("byte", 1),
    ("bytes", 1),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("kb", 1_000),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("mb", 1_000_000),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("gb", 1_000_000_000),
    ("t", 1 << 40),
    ("tib", 1 << 40),
    ("tb", 1_000_000_000_000),
];

/// Parses a size as people write it: "4096", "1 MiB", "1.5GiB", "10 MB"
/// (decimal units), "512 KiB", "100 bytes"; None when it is not one.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let factor = SIZE_UNITS.iter().find(|(name, _)| *name == unit)?.1 as f64;
    let bytes = value * factor;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_have_the_right_plural() {
        assert_eq!(count(1, "block"), "1 block");
        assert_eq!(count(0, "block"), "0 blocks");
        assert_eq!(count(3, "process"), "3 processes");
        assert_eq!(count(1, "process"), "1 process");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(1), "1 byte");
        assert_eq!(size(600), "600 bytes");
        assert_eq!(size(4096), "4.0 KiB");
        assert_eq!(size(73400320), "70.0 MiB");
        assert_eq!(size(1024 * 1024 - 1), "1.0 MiB");
        assert_eq!(size(u64::MAX), "16.0 EiB");
        assert_eq!(size_exact(73400320), "70.0 MiB (73400320 bytes)");
        assert_eq!(size_exact(600), "600 bytes");
        assert_eq!(size_delta(-600), "-600 bytes");
        assert_eq!(size_delta(4096), "+4.0 KiB");
        assert_eq!(size_delta(i64::MIN), "-8.0 EiB");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1 MiB"), Some(1 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("10 MB"), Some(10_000_000));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("-1"), None);
    }
}
