//! Unwind rules: how to get from a frame to its caller, packed in 8 bytes,
//! and read from a module's `.eh_frame` (gimli).

use crate::base::loader::find_module;

/// How to get from one frame to its caller, in 8 bytes so that the cache
/// holds it in one atomic word and reading it costs no decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(8))]
pub(super) struct Rule {
    pub(super) cfa_offset: i32,
    /// where the caller's rbp is saved, relative to the CFA (if `RBP_SAVED`)
    pub(super) rbp_offset: i16,
    /// a `KIND_*` value, with `RBP_SAVED`
    pub(super) kind: u8,
    /// where the return address is, relative to the CFA (-8 on x86-64)
    pub(super) ra_offset: i8,
}

/// CFA = rsp + offset
pub(super) const KIND_RSP: u8 = 1;
/// CFA = rbp + offset
pub(super) const KIND_RBP: u8 = 2;
/// CFA = *(rbp + offset): functions that realign the stack (DRAP)
pub(super) const KIND_RBP_DEREF: u8 = 3;
/// the outermost frame, or a frame we cannot unwind
const KIND_STOP: u8 = 4;
pub(super) const KIND_MASK: u8 = 0x7f;
pub(super) const RBP_SAVED: u8 = 0x80;

impl Rule {
    pub(super) const STOP: Rule = Rule {
        cfa_offset: 0,
        rbp_offset: 0,
        kind: KIND_STOP,
        ra_offset: -8,
    };
    /// No unwind info: assume the classic frame-pointer prologue.
    pub(super) const FRAME_POINTER: Rule = Rule {
        cfa_offset: 16,
        rbp_offset: -16,
        kind: KIND_RBP | RBP_SAVED,
        ra_offset: -8,
    };

    #[inline(always)]
    pub(super) fn pack(self) -> u64 {
        // SAFETY: 8 bytes of plain integers.
        unsafe { std::mem::transmute::<Rule, u64>(self) }
    }

    #[inline(always)]
    pub(super) fn unpack(v: u64) -> Rule {
        // SAFETY: every bit pattern is a valid Rule.
        unsafe { std::mem::transmute::<u64, Rule>(v) }
    }
}

type Reader = gimli::EndianSlice<'static, gimli::LittleEndian>;

/// Reads the unwind rule for `pc` from its module's .eh_frame.
#[cold]
pub(super) fn rule_from_eh_frame(pc: u64) -> Rule {
    use gimli::{
        BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindSection, X86_64,
    };
    let Some(m) = find_module(pc as usize) else {
        return Rule::STOP;
    };
    let Some((hdr_addr, hdr_len)) = m.eh_frame_hdr else {
        return Rule::FRAME_POINTER;
    };
    // SAFETY: PT_GNU_EH_FRAME is mapped read-only for the module's life.
    let hdr_bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(hdr_addr as *const u8, hdr_len) };
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_addr as u64);
    let Ok(parsed) = EhFrameHdr::new(hdr_bytes, LittleEndian).parse(&bases, 8) else {
        return Rule::FRAME_POINTER;
    };
    let eh_frame_addr = match parsed.eh_frame_ptr() {
        gimli::Pointer::Direct(a) => a as usize,
        gimli::Pointer::Indirect(_) => return Rule::FRAME_POINTER,
    };
    if eh_frame_addr >= m.eh_segment_end {
        return Rule::FRAME_POINTER;
    }
    // SAFETY: .eh_frame lies in the same mapped segment, up to its end.
    let eh_bytes: &'static [u8] =
        unsafe { std::slice::from_raw_parts(eh_frame_addr as *const u8, m.eh_segment_end - eh_frame_addr) };
    let eh_frame: EhFrame<Reader> = EhFrame::new(eh_bytes, LittleEndian);
    let bases = bases.set_eh_frame(eh_frame_addr as u64).set_text(m.start as u64);
    let Some(table) = parsed.table() else {
        return Rule::FRAME_POINTER;
    };
    let Ok(fde) = table.fde_for_address(&eh_frame, &bases, pc, EhFrame::cie_from_offset) else {
        return Rule::FRAME_POINTER;
    };
    let mut ctx = Box::new(gimli::UnwindContext::new());
    let Ok(row) = fde.unwind_info_for_address(&eh_frame, &bases, &mut ctx, pc) else {
        return Rule::FRAME_POINTER;
    };
    // No rule for a register reads as Undefined, as gimli 0.31's lookup
    // answered before it returned an Option (one gimli with backtrace's).
    let rule = |r| row.register(r).unwrap_or(RegisterRule::Undefined);
    let ra_offset = match rule(X86_64::RA) {
        RegisterRule::Offset(o) if (-128..0).contains(&o) => o as i8,
        _ => return Rule::STOP, // Undefined: the outermost frame
    };
    let rbp_offset = match rule(X86_64::RBP) {
        RegisterRule::Offset(o) if (i16::MIN as i64..0).contains(&o) => Some(o as i16),
        RegisterRule::Undefined | RegisterRule::SameValue => None,
        _ => return Rule::STOP,
    };
    let (kind, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset }
            if (i32::MIN as i64..=i32::MAX as i64).contains(offset) =>
        {
            match *register {
                X86_64::RSP => (KIND_RSP, *offset as i32),
                X86_64::RBP => (KIND_RBP, *offset as i32),
                _ => return Rule::FRAME_POINTER,
            }
        }
        CfaRule::Expression(e) => {
            // The DRAP form GCC emits for stack-realigning functions:
            // DW_OP_breg6 (rbp) <sleb offset>; DW_OP_deref.
            let Ok(expr) = e.get(&eh_frame) else {
                return Rule::FRAME_POINTER;
            };
            match drap_offset(expr.0.slice()) {
                Some(off) => (KIND_RBP_DEREF, off),
                None => return Rule::FRAME_POINTER,
            }
        }
        _ => return Rule::FRAME_POINTER,
    };
    Rule {
        cfa_offset,
        rbp_offset: rbp_offset.unwrap_or(0),
        kind: kind | if rbp_offset.is_some() { RBP_SAVED } else { 0 },
        ra_offset,
    }
}

/// `DW_OP_breg6 <sleb128>; DW_OP_deref` → the offset.
fn drap_offset(bytes: &[u8]) -> Option<i32> {
    let (&op, rest) = bytes.split_first()?;
    if op != 0x76 {
        return None;
    }
    let mut value: i64 = 0;
    let mut shift = 0;
    let mut i = 0;
    loop {
        let b = *rest.get(i)?;
        value |= ((b & 0x7f) as i64) << shift;
        shift += 7;
        i += 1;
        if b & 0x80 == 0 {
            if shift < 64 && b & 0x40 != 0 {
                value |= -1i64 << shift;
            }
            break;
        }
        if shift > 28 {
            return None;
        }
    }
    (rest.get(i..)? == [0x06]).then_some(value as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_pack_and_unpack() {
        for r in [
            Rule::STOP,
            Rule::FRAME_POINTER,
            Rule {
                cfa_offset: 1 << 20,
                rbp_offset: -24,
                kind: KIND_RSP | RBP_SAVED,
                ra_offset: -8,
            },
            Rule {
                cfa_offset: -8,
                rbp_offset: 0,
                kind: KIND_RBP_DEREF,
                ra_offset: -8,
            },
        ] {
            assert_eq!(Rule::unpack(r.pack()), r);
            assert_ne!(r.pack(), 0);
        }
        assert_eq!(std::mem::size_of::<Rule>(), 8);
    }

    #[test]
    fn drap_expression_is_recognized() {
        // DW_OP_breg6 -8; DW_OP_deref
        assert_eq!(drap_offset(&[0x76, 0x78, 0x06]), Some(-8));
        assert_eq!(drap_offset(&[0x77, 0x78, 0x06]), None);
        assert_eq!(drap_offset(&[0x76, 0x78]), None);
    }
}
