//! The runtime's finalizing flag, read where CPython's own getter reads it.
//!
//! Every capture first asks whether the interpreter is finalizing: from
//! then on thread states and frames are torn down, and a capture takes no
//! Python frames. The getter (`_Py_IsFinalizing`, `Py_IsFinalizing` from
//! 3.13) loads one word of `_PyRuntime` and tests it against zero; calling
//! it cost a Python pair 8 instructions more than loading that word
//! (callgrind: the getter's 6, and the call). So the probe reads the
//! getter's machine code, and when it is
//! exactly that load and test (one of the shapes below), a capture loads
//! the same word itself. Any other code (another compiler, an
//! instrumented build, another architecture) keeps the call.
//!
//! The shapes, x86-64, each after an optional `endbr64`:
//!
//! 1. From a shared libpython, through the global offset table:
//!    `mov rax, [rip+d32]` (the table's slot of `_PyRuntime`),
//!    `mov rax, [rax+off]`, `test rax, rax`, `setne al`,
//!    `movzx eax, al`, `ret`. The slot must hold the address dlsym gives
//!    for `_PyRuntime`.
//! 2. From an executable that links the interpreter in:
//!    `mov rax, [rip+d32]` (the flag itself), then the same test and
//!    return. The word must lie in the first 64 KiB of `_PyRuntime`.
//!
//! The code is read one instruction at a time, each only after the one
//! before it matched and does not end the function, so no byte past the
//! getter's own code is read.

/// `endbr64`, which builds with control-flow protection start with.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// `mov rax, [rip+d32]`, the displacement after it.
const MOV_RAX_RIP: [u8; 3] = [0x48, 0x8b, 0x05];
/// `mov rax, [rax+d8]`, the displacement after it.
const MOV_RAX_RAX_D8: [u8; 3] = [0x48, 0x8b, 0x40];
/// `mov rax, [rax+d32]`, the displacement after it.
const MOV_RAX_RAX_D32: [u8; 3] = [0x48, 0x8b, 0x80];
/// `test rax, rax; setne al; movzx eax, al; ret`: the getter's answer,
/// whether the loaded word is non-zero.
const TEST_AND_RETURN: [u8; 10] = [0x48, 0x85, 0xc0, 0x0f, 0x95, 0xc0, 0x0f, 0xb6, 0xc0, 0xc3];
/// How far into `_PyRuntime` the flag may lie (it is among the first
/// fields: 0x10 to 0x260 in 3.10 to 3.13).
const RUNTIME_SPAN: usize = 64 << 10;

/// What the getter at `code` loads, when its code is one of the shapes in
/// the module comment: the address of the flag word, or None. `read`
/// gives the byte at an address (the code's own, or a test's); `runtime`
/// is the address of `_PyRuntime` (0: unknown, and nothing is matched).
pub(super) fn flag_address(code: usize, runtime: usize, read: &dyn Fn(usize) -> u8) -> Option<usize> {
    if runtime == 0 || code == 0 {
        return None;
    }
    let mut at = code;
    let starts_with = |at: usize, bytes: &[u8]| bytes.iter().enumerate().all(|(i, &b)| read(at + i) == b);
    let d32 = |at: usize| i32::from_le_bytes([read(at), read(at + 1), read(at + 2), read(at + 3)]);
    if starts_with(at, &ENDBR64) {
        at += ENDBR64.len();
    }
    if !starts_with(at, &MOV_RAX_RIP) {
        return None;
    }
    // The displacement is from the end of the instruction (7 bytes).
    let loaded = (at + 7).wrapping_add_signed(d32(at + 3) as isize);
    at += 7;
    let offset = if starts_with(at, &MOV_RAX_RAX_D8) {
        let off = read(at + 3) as i8;
        at += 4;
        Some(off as isize)
    } else if starts_with(at, &MOV_RAX_RAX_D32) {
        let off = d32(at + 3);
        at += 7;
        Some(off as isize)
    } else {
        None
    };
    if !starts_with(at, &TEST_AND_RETURN) {
        return None;
    }
    let flag = match offset {
        // Shape 1: `loaded` is the table's slot, which holds `_PyRuntime`.
        Some(off) => {
            let slot = (0..8).fold(0usize, |v, i| v | (read(loaded + i) as usize) << (8 * i));
            if slot != runtime || !(0..RUNTIME_SPAN as isize).contains(&off) {
                return None;
            }
            runtime + off as usize
        }
        // Shape 2: `loaded` is the flag.
        None => {
            if !(runtime..runtime + RUNTIME_SPAN).contains(&loaded) {
                return None;
            }
            loaded
        }
    };
    // An aligned word, so that a capture can load it atomically.
    flag.is_multiple_of(8).then_some(flag)
}

/// [`flag_address`] of the running interpreter's getter at `code`.
///
/// # Safety
/// `code` is the address dlsym gave for the getter (mapped code of this
/// process) or 0, and `runtime` the one it gave for `_PyRuntime` or 0.
/// The slot of shape 1 is read only after the code matched, and it lies
/// in the interpreter's mapped global offset table.
pub(super) unsafe fn flag_of_getter(code: usize, runtime: usize) -> Option<usize> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    // SAFETY: bytes of the getter's code, read in order and each only once
    // the instructions before it matched (module comment), or of the
    // global offset table slot that the matched load names; both mapped
    // (the contract).
    flag_address(code, runtime, &|a| unsafe { (a as *const u8).read_volatile() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bytes` placed at `base`, as code or data: reads outside panic, so
    /// a test also fails when the matcher reads past the getter's code.
    fn memory(parts: Vec<(usize, Vec<u8>)>) -> impl Fn(usize) -> u8 + std::panic::RefUnwindSafe {
        move |a| {
            for (base, bytes) in &parts {
                let base = *base;
                if (base..base + bytes.len()).contains(&a) {
                    return bytes[a - base];
                }
            }
            panic!("read outside the getter's code and its slot: {a:#x}")
        }
    }

    const CODE: usize = 0x29_1ae0;
    const RUNTIME: usize = 0x7f00_0000_0000;

    /// 3.11.7's `_Py_IsFinalizing` as a shared libpython builds it: the
    /// table's slot at 0x443d30, the flag at offset 0x18.
    fn shared_311() -> Vec<u8> {
        let mut c = vec![0x48, 0x8b, 0x05];
        c.extend(((0x44_3d30 - (CODE + 7)) as i32).to_le_bytes());
        c.extend([0x48, 0x8b, 0x40, 0x18]);
        c.extend(TEST_AND_RETURN);
        c
    }

    #[test]
    fn the_shared_librarys_getter_gives_the_runtimes_word() {
        let slot = RUNTIME.to_le_bytes();
        let code = shared_311();
        let m = memory(vec![(CODE, code.to_vec()), (0x44_3d30, slot.to_vec())]);
        assert_eq!(flag_address(CODE, RUNTIME, &m), Some(RUNTIME + 0x18));
        // A slot that holds anything but `_PyRuntime` is not trusted.
        assert_eq!(flag_address(CODE, RUNTIME + 4096, &m), None);
        assert_eq!(flag_address(CODE, 0, &m), None);
    }

    #[test]
    fn endbr64_and_a_four_byte_offset_are_read_too() {
        // 3.13's shape: `mov rax, [rax+0x260]`, behind endbr64.
        let mut code = ENDBR64.to_vec();
        code.extend([0x48, 0x8b, 0x05]);
        code.extend(((0x4e_acb0 - (CODE + 4 + 7)) as i32).to_le_bytes());
        code.extend([0x48, 0x8b, 0x80, 0x60, 0x02, 0x00, 0x00]);
        code.extend(TEST_AND_RETURN);
        let slot = RUNTIME.to_le_bytes();
        let m = memory(vec![(CODE, code.to_vec()), (0x4e_acb0, slot.to_vec())]);
        assert_eq!(flag_address(CODE, RUNTIME, &m), Some(RUNTIME + 0x260));
    }

    #[test]
    fn an_executables_getter_loads_the_word_itself() {
        let runtime = 0x55_0000;
        let mut code = vec![0x48, 0x8b, 0x05];
        code.extend(((runtime + 0x18 - (CODE + 7)) as i32).to_le_bytes());
        code.extend(TEST_AND_RETURN);
        let m = memory(vec![(CODE, code.to_vec())]);
        assert_eq!(flag_address(CODE, runtime, &m), Some(runtime + 0x18));
        // A word outside `_PyRuntime` is some other variable.
        assert_eq!(flag_address(CODE, runtime + 0x20, &m), None);
        assert_eq!(flag_address(CODE, runtime - RUNTIME_SPAN, &m), None);
    }

    #[test]
    fn any_other_code_keeps_the_call() {
        let slot = RUNTIME.to_le_bytes();
        let good = shared_311();
        // Each byte changed in turn: nothing matches (the offset's low
        // bit makes an unaligned word).
        for i in 0..good.len() {
            let mut code = good.clone();
            code[i] ^= 0x01;
            let m = memory(vec![(CODE, code.to_vec()), (0x44_3d30, slot.to_vec())]);
            let got = std::panic::catch_unwind(|| flag_address(CODE, RUNTIME, &m));
            match got {
                Ok(None) => {}
                Ok(Some(a)) => panic!("byte {i} changed, and still {a:#x}"),
                // A changed displacement names a slot outside the memory
                // given, which is read once the code matched: the only
                // read outside the getter's code.
                Err(_) => assert!((3..7).contains(&i), "byte {i}: read past the code"),
            }
        }
        // A getter cut short after its load (a call or jump follows) is
        // not read past that load.
        let mut code = shared_311()[..7].to_vec();
        code.push(0xe8);
        let m = memory(vec![(CODE, code.to_vec()), (0x44_3d30, slot.to_vec())]);
        assert_eq!(flag_address(CODE, RUNTIME, &m), None);
    }

    #[test]
    fn an_unaligned_word_keeps_the_call() {
        let mut code = shared_311();
        code[10] = 0x1c;
        let slot = RUNTIME.to_le_bytes();
        let m = memory(vec![(CODE, code.to_vec()), (0x44_3d30, slot.to_vec())]);
        assert_eq!(flag_address(CODE, RUNTIME, &m), None);
    }
}
