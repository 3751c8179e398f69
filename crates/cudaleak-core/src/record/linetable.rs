//! Instruction offset → line number, for the three line-table formats that
//! CPython 3.8 to 3.13 use. Decoded at dump time from a copy of the table,
//! so the interpreter is never asked (it may be gone by then).
//!
//! Sources, all in the CPython repository:
//! - 3.8, 3.9: `co_lnotab`, Objects/lnotab_notes.txt and `PyCode_Addr2Line`
//!   in Objects/codeobject.c (tags v3.8.0, v3.9.0).
//! - 3.10: `co_linetable`, Objects/lnotab_notes.txt and `_PyCode_CheckLineNumber`
//!   in Objects/codeobject.c (tag v3.10.0).
//! - 3.11 to 3.13: the location table of PEP 657, Objects/locations.md
//!   (3.12+) / Objects/lnotab_notes.txt (3.11) and `_PyCode_CheckLineNumber`
//!   (tags v3.11.0, v3.12.0, v3.13.0).

/// Which encoding a copied line table uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LineFormat {
    /// (byte delta: u8, line delta: i8) pairs; 3.8, 3.9
    Lnotab,
    /// (byte delta: u8, line delta: i8, -128 = no line) pairs; 3.10
    Linetable310,
    /// PEP 657 location entries in code units; 3.11 and later
    Locations311,
}

/// Line of the instruction at `offset` (bytes from the start of the
/// bytecode), or `None` when the table gives that instruction no line.
pub fn line_for_offset(format: LineFormat, table: &[u8], firstlineno: i32, offset: u32) -> Option<i32> {
    match format {
        LineFormat::Lnotab => Some(lnotab_line(table, firstlineno, offset)),
        LineFormat::Linetable310 => linetable310_line(table, firstlineno, offset),
        LineFormat::Locations311 => locations_line(table, firstlineno, offset),
    }
}

/// `PyCode_Addr2Line` of 3.8/3.9: advance while the next address is not
/// past the query, adding signed line deltas.
fn lnotab_line(table: &[u8], firstlineno: i32, offset: u32) -> i32 {
    let mut line = firstlineno;
    let mut addr: u32 = 0;
    for pair in table.chunks_exact(2) {
        addr += pair[0] as u32;
        if addr > offset {
            break;
        }
        line += pair[1] as i8 as i32;
    }
    line
}

/// 3.10: each entry covers `[start, start + delta)` bytes; a line delta of
/// -128 means the range has no line (the running line is unchanged).
fn linetable310_line(table: &[u8], firstlineno: i32, offset: u32) -> Option<i32> {
    let mut line = firstlineno;
    let mut end: u32 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += pair[0] as u32;
        let ldelta = pair[1] as i8;
        let this_line = if ldelta == -128 {
            None
        } else {
            line += ldelta as i32;
            Some(line)
        };
        if start <= offset && offset < end {
            return this_line;
        }
    }
    None
}

struct Cursor<'a> {
    table: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.table.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// Unsigned varint: 6-bit little-endian chunks, 0x40 = more follow.
    fn varint(&mut self) -> Option<u32> {
        let mut b = self.byte()?;
        let mut value = (b & 63) as u32;
        let mut shift = 0;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 30 {
                return None;
            }
            value |= ((b & 63) as u32) << shift;
        }
        Some(value)
    }

    /// Signed varint: sign in the lowest bit.
    fn svarint(&mut self) -> Option<i32> {
        let u = self.varint()?;
        Some(if u & 1 != 0 {
            -((u >> 1) as i32)
        } else {
            (u >> 1) as i32
        })
    }
}

/// PEP 657 location table: each entry starts with a byte `1cccclll`
/// (code `cccc`, length `lll + 1` code units of 2 bytes).
/// - 15: no location; 14: long form (svarint line delta, then end line,
///   column, end column varints); 13: no columns (svarint line delta);
/// - 10–12: one-line form, line delta = code - 10, two column bytes;
/// - 0–9: short form, same line, one column byte.
fn locations_line(table: &[u8], firstlineno: i32, offset: u32) -> Option<i32> {
    let mut c = Cursor { table, pos: 0 };
    let mut line = firstlineno;
    let mut end: u32 = 0;
    while let Some(first) = c.byte() {
        if first & 0x80 == 0 {
            return None; // not at an entry start: corrupt copy
        }
        let code = (first >> 3) & 15;
        let start = end;
        end += ((first & 7) as u32 + 1) * 2;
        let this_line = match code {
            15 => None,
            14 => {
                line += c.svarint()?;
                c.varint()?;
                c.varint()?;
                c.varint()?;
                Some(line)
            }
            13 => {
                line += c.svarint()?;
                Some(line)
            }
            10..=12 => {
                line += code as i32 - 10;
                c.byte()?;
                c.byte()?;
                Some(line)
            }
            _ => {
                c.byte()?;
                Some(line)
            }
        };
        if start <= offset && offset < end {
            return this_line;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// lnotab_notes.txt (3.8): "0, 1; 6, 1; 44, 5" style pairs; a byte
    /// delta is applied before its line delta takes effect.
    #[test]
    fn lnotab_follows_addr2line() {
        // firstlineno 10: bytes 0-5 line 10, 6-49 line 11, 50.. line 16
        let t = [6, 1, 44, 5];
        assert_eq!(lnotab_line(&t, 10, 0), 10);
        assert_eq!(lnotab_line(&t, 10, 5), 10);
        assert_eq!(lnotab_line(&t, 10, 6), 11);
        assert_eq!(lnotab_line(&t, 10, 49), 11);
        assert_eq!(lnotab_line(&t, 10, 50), 16);
        // negative delta (signed since 3.6), e.g. a loop back edge
        assert_eq!(lnotab_line(&[4, 3, 2, 0xfe], 1, 6), 2);
    }

    #[test]
    fn linetable310_ranges_and_no_line() {
        // [0,4) line 2, [4,10) no line, [10,12) line 5
        let t = [4, 1, 6, 0x80, 2, 3];
        assert_eq!(linetable310_line(&t, 1, 0), Some(2));
        assert_eq!(linetable310_line(&t, 1, 4), None);
        assert_eq!(linetable310_line(&t, 1, 10), Some(5));
        assert_eq!(linetable310_line(&t, 1, 12), None);
    }

    /// Real CPython 3.11.7 data: `co_linetable` and `co_lines()` of
    ///     def f(x):
    ///         y = x + 1
    ///         for i in range(3):
    ///             y += i
    ///         return (y +
    ///                 2)
    #[test]
    fn locations_match_cpython_311_co_lines() {
        let table = [
            128, 0, 216, 8, 9, 136, 65, 137, 5, 128, 65, 221, 13, 18, 144, 49, 137, 88, 140, 88, 240, 0, 1,
            5, 15, 240, 0, 1, 5, 15, 136, 1, 216, 8, 9, 136, 81, 137, 6, 136, 1, 136, 1, 216, 12, 13, 216,
            12, 13, 241, 3, 1, 13, 14, 240, 0, 1, 5, 15,
        ];
        let co_lines = [
            (0, 2, 1),
            (2, 4, 2),
            (4, 6, 2),
            (6, 10, 2),
            (10, 12, 2),
            (12, 24, 3),
            (24, 26, 3),
            (26, 30, 3),
            (30, 40, 3),
            (40, 42, 3),
            (42, 44, 3),
            (44, 46, 3),
            (46, 48, 4),
            (48, 50, 4),
            (50, 54, 4),
            (54, 56, 4),
            (56, 58, 4),
            (58, 60, 5),
            (60, 62, 6),
            (62, 66, 5),
            (66, 68, 5),
        ];
        for (start, end, line) in co_lines {
            for off in (start..end).step_by(2) {
                assert_eq!(locations_line(&table, 1, off), Some(line), "offset {off}");
            }
        }
        assert_eq!(locations_line(&table, 1, 68), None);
    }
}
