//! What makes two allocation stacks one group: one key for the groups of a
//! dump (`assemble`), the growth and trend flags across dumps, and the
//! matching of groups across reports (`combine`: merge, `diff`, ranks).
//!
//! Groups are matched by symbolized frames, never by addresses, which
//! differ between processes (ASLR) and runs. A group with Python frames is
//! keyed by its merged stack, less the frames of the machinery that only
//! carries a call: the interpreter's own frames (between Python frames and
//! around them) and the foreign-call frames below the Python line (libffi,
//! ctypes, pybind11 dispatch). On CPython 3.13 one Python line,
//! `allocate:13 ← train_step:26`, came out as two groups (4 blocks and 1)
//! because the native return addresses inside `_PyEval_EvalFrameDefault`
//! differed: a specialized call site and a generic one. For a person that
//! is one leak, and a group must not "grow" by moving between the two.
//!
//! Within a process (a dump's groups, growth across its dumps) the key is
//! used as its [`KeyDigest`], made from the dump's interned frames: the
//! whole key of every group alive cost 27 KB per distinct stack.

use crate::base::hash::mix64;
use crate::record::python::PythonFrame;
use crate::record::MemoryKind;
use crate::report::{Group, MergedFrame, NativeFrame};
use std::cmp::Ordering;
use std::hash::{DefaultHasher, Hash, Hasher};

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// A native frame without its address: (function, file, line, module file name).
type FrameId = (Option<String>, Option<String>, Option<i64>, Option<String>);

fn frame_id(f: &NativeFrame) -> FrameId {
    (
        f.function.clone(),
        f.file.clone(),
        f.line,
        f.module.as_deref().map(|m| basename(m).to_string()),
    )
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum KeyFrame {
    Native(FrameId),
    Python(PythonFrame),
}

/// A group's identity, within a process and across processes.
///
/// Keys are whole symbolized stacks (often 60 frames of strings): the
/// hash is computed once, when the key is made, and is all that hashing
/// a key then reads (a dump of 1024 groups spent more in SipHash over
/// keys than in symbolizing them); equal keys have equal hashes, so
/// comparing the hash first only makes unequal keys differ sooner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupKey {
    hash: u64,
    api: String,
    memory: MemoryKind,
    frames: Vec<KeyFrame>,
}

impl Hash for GroupKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Ord for GroupKey {
    /// By content, not by hash: reports list groups in this order.
    fn cmp(&self, other: &Self) -> Ordering {
        (&self.api, self.memory, &self.frames).cmp(&(&other.api, other.memory, &other.frames))
    }
}

impl PartialOrd for GroupKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A frame of the machinery that carries a call into or out of Python:
/// the interpreter itself (libpython, or a `python3.X` executable that
/// links it statically), libffi and ctypes, pybind11's dispatch.
pub fn is_call_machinery(f: &NativeFrame) -> bool {
    is_call_machinery_named(f.module.as_deref(), f.function.as_deref())
}

/// [`is_call_machinery`] of a frame given by its module and function.
pub fn is_call_machinery_named(module: Option<&str>, function: Option<&str>) -> bool {
    let module = module.map(basename).unwrap_or("");
    let function = function.unwrap_or("");
    let python_executable = module.strip_prefix("python").is_some_and(|v| {
        v.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'd' | 'm' | 't'))
    });
    module.starts_with("libpython")
        || python_executable
        || module.starts_with("libffi")
        || module.starts_with("_ctypes")
        || function.starts_with("pybind11::")
}

impl GroupKey {
    pub fn of(g: &Group) -> GroupKey {
        let frames = if g.merged_stack.is_empty() {
            g.native_stack
                .iter()
                .map(|f| KeyFrame::Native(frame_id(f)))
                .collect()
        } else {
            g.merged_stack
                .iter()
                .filter_map(|f| match f {
                    MergedFrame::Python(p) => Some(KeyFrame::Python(p.clone())),
                    MergedFrame::Native(n) if is_call_machinery(n) => None,
                    MergedFrame::Native(n) => Some(KeyFrame::Native(frame_id(n))),
                })
                .collect()
        };
        let mut h = DefaultHasher::new();
        (&g.api, g.memory, &frames).hash(&mut h);
        GroupKey {
            hash: h.finish(),
            api: g.api.clone(),
            memory: g.memory,
            frames,
        }
    }

    /// This key as 128 bits (see [`KeyDigest`]).
    pub fn digest(&self) -> KeyDigest {
        KeyDigest::of(
            &self.api,
            self.memory,
            self.frames.iter().map(|f| match f {
                KeyFrame::Native((function, file, line, module)) => KeyFrameRef::Native {
                    function: function.as_deref(),
                    file: file.as_deref(),
                    line: *line,
                    module: module.as_deref(),
                },
                KeyFrame::Python(p) => KeyFrameRef::Python {
                    function: &p.function,
                    file: &p.file,
                    line: p.line,
                },
            }),
        )
    }
}

/// One frame of a key, borrowed from wherever the frames are kept (a
/// report's [`Group`], or the interned frames of a dump).
#[derive(Clone, Copy, Debug)]
pub enum KeyFrameRef<'a> {
    /// a native frame without its address; of `module`, only the file
    /// name counts
    Native {
        function: Option<&'a str>,
        file: Option<&'a str>,
        line: Option<i64>,
        module: Option<&'a str>,
    },
    Python {
        function: &'a str,
        file: &'a str,
        line: Option<i64>,
    },
}

/// A [`GroupKey`] as 128 bits: what a dump groups traces by and what the
/// growth across the dumps of a process is tracked by, without holding
/// every group's symbolized stack (27 KB per distinct leaked
/// stack of 30 frames, whatever the cap on groups written). Equal keys have
/// equal digests; unequal keys share one with a probability of about
/// n²/2^129 among n groups (below 10^-26 for a million groups).
///
/// Two SipHash-1-3 states, one started with a constant of its own: 64
/// bits alone would make one collision likely past a few billion groups.
/// The encoding is prefix-free (a tag before each frame, an end tag, and
/// strings hashed with their terminator), so a collision needs the hash
/// functions to collide, not two keys to write the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyDigest(pub u128);

struct Hasher128(DefaultHasher, DefaultHasher);

impl Hasher for Hasher128 {
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
        self.1.write(bytes);
    }

    fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// One frame of a key as 128 bits, by the same prefix-free encoding: a
/// dump computes it once per distinct frame, not once per trace that
/// holds the frame (hashing every frame's strings for every
/// trace was half of a 100k-stack exit report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameDigest(u128);

fn hasher128() -> Hasher128 {
    let mut second = DefaultHasher::new();
    second.write_u64(0x9e37_79b9_7f4a_7c15);
    Hasher128(DefaultHasher::new(), second)
}

impl Hasher128 {
    fn finish128(&self) -> u128 {
        (u128::from(self.0.finish()) << 64) | u128::from(self.1.finish())
    }
}

impl FrameDigest {
    pub fn of(f: KeyFrameRef<'_>) -> FrameDigest {
        let mut h = hasher128();
        match f {
            KeyFrameRef::Native {
                function,
                file,
                line,
                module,
            } => {
                h.write_u8(1);
                (function, file, line, module.map(basename)).hash(&mut h);
            }
            KeyFrameRef::Python { function, file, line } => {
                h.write_u8(2);
                (function, file, line).hash(&mut h);
            }
        }
        FrameDigest(h.finish128())
    }
}

impl KeyDigest {
    /// The digest of the key with these parts (as [`GroupKey::of`] makes
    /// them: the frames already chosen, in order).
    pub fn of<'a>(
        api: &str,
        memory: MemoryKind,
        frames: impl IntoIterator<Item = KeyFrameRef<'a>>,
    ) -> KeyDigest {
        KeyDigest::of_digests(api, memory, frames.into_iter().map(FrameDigest::of))
    }

    /// [`KeyDigest::of`] from the frames' digests. The frames' digests are
    /// already SipHash outputs, so they are chained by two lanes of the
    /// murmur3 finalizer (a bijection each step), not hashed again: the
    /// second SipHash pass over every frame of every trace was 15 % of a
    /// 100k-stack exit report. The count of frames closes it.
    pub fn of_digests(
        api: &str,
        memory: MemoryKind,
        frames: impl IntoIterator<Item = FrameDigest>,
    ) -> KeyDigest {
        let mut h = hasher128();
        (api, memory).hash(&mut h);
        let (mut a, mut b) = (h.0.finish(), h.1.finish());
        let mut n = 0u64;
        for f in frames {
            let (hi, lo) = ((f.0 >> 64) as u64, f.0 as u64);
            a = mix64(a ^ lo).wrapping_add(hi);
            b = mix64(b ^ hi ^ 0x9e37_79b9_7f4a_7c15).wrapping_add(lo.rotate_left(32));
            n += 1;
        }
        let a = mix64(a ^ n);
        let b = mix64(b ^ n.wrapping_mul(0xc2b2_ae3d_27d4_eb4f));
        KeyDigest((u128::from(a) << 64) | u128::from(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(function: &str, module: &str, line: i64, address: &str) -> NativeFrame {
        NativeFrame {
            address: address.into(),
            function: Some(function.into()),
            file: Some("x.c".into()),
            line: Some(line),
            module: Some(module.into()),
            ..NativeFrame::default()
        }
    }

    fn py(function: &str, line: i64) -> MergedFrame {
        MergedFrame::Python(PythonFrame {
            function: function.into(),
            file: "train.py".into(),
            line: Some(line),
        })
    }

    fn group(merged: Vec<MergedFrame>) -> Group {
        let mut g = Group::new(1, 1, "cudaMalloc", MemoryKind::Device, vec![], vec![]);
        g.merged_stack = merged;
        g
    }

    /// The interpreter and foreign-call frames around one Python line do
    /// not split it; an extension's own frames and the lines do.
    #[test]
    fn python_groups_ignore_the_call_machinery() {
        let site = |eval_line: i64, ffi: &str| {
            group(vec![
                MergedFrame::Native(native("ffi_call_unix64", "/usr/lib/libffi.so.8", 1, ffi)),
                MergedFrame::Native(native(
                    "_ctypes_callproc",
                    "/lib/_ctypes.cpython-313.so",
                    1300,
                    "0x2",
                )),
                MergedFrame::Native(native(
                    "_PyObject_MakeTpCall",
                    "/lib/libpython3.13.so.1.0",
                    eval_line,
                    "0x3",
                )),
                py("allocate", 13),
                MergedFrame::Native(native(
                    "PyObject_Vectorcall",
                    "/lib/libpython3.13.so.1.0",
                    eval_line,
                    "0x4",
                )),
                py("train_step", 26),
                MergedFrame::Native(native("Py_RunMain", "/usr/bin/python3.13", 775, "0x5")),
                MergedFrame::Native(native("_start", "/usr/bin/python3", 0, "0x5")),
                MergedFrame::Native(native("__libc_start_main", "/lib/libc.so.6", 360, "0x6")),
            ])
        };
        assert_eq!(GroupKey::of(&site(242, "0x1")), GroupKey::of(&site(250, "0x9")));
        assert_eq!(
            GroupKey::of(&site(242, "0x1")).frames.len(),
            3,
            "two Python lines and libc"
        );
        // A module that is not the interpreter, whatever its name.
        let ext = native("step", "/lib/python_ext.so", 1, "0x1");
        assert!(!is_call_machinery(&ext));
        let pybind = group(vec![
            MergedFrame::Native(native("c10::alloc", "/lib/libc10.so", 5, "0x7")),
            MergedFrame::Native(native(
                "pybind11::cpp_function::dispatcher",
                "/lib/ext.so",
                1,
                "0x8",
            )),
            py("allocate", 13),
        ]);
        let direct = group(vec![
            MergedFrame::Native(native("c10::alloc", "/lib/libc10.so", 5, "0x9")),
            py("allocate", 13),
        ]);
        assert_eq!(GroupKey::of(&pybind), GroupKey::of(&direct));
        let other_alloc = group(vec![
            MergedFrame::Native(native("c10::other_alloc", "/lib/libc10.so", 9, "0x9")),
            py("allocate", 13),
        ]);
        assert_ne!(GroupKey::of(&direct), GroupKey::of(&other_alloc));
        let other_line = group(vec![
            MergedFrame::Native(native("c10::alloc", "/lib/libc10.so", 5, "0x9")),
            py("allocate", 14),
        ]);
        assert_ne!(GroupKey::of(&direct), GroupKey::of(&other_line));
    }

    /// Without Python frames every native frame counts, but not its address.
    #[test]
    fn native_groups_match_by_symbols_not_addresses() {
        let g = |line: i64, addr: &str| {
            Group::new(
                1,
                1,
                "cudaMalloc",
                MemoryKind::Device,
                vec![native("step", "/bin/app", line, addr)],
                vec![],
            )
        };
        assert_eq!(GroupKey::of(&g(10, "0x1")), GroupKey::of(&g(10, "0x2")));
        assert_ne!(GroupKey::of(&g(10, "0x1")), GroupKey::of(&g(11, "0x1")));
    }

    /// The digest tells keys apart exactly as the key does, and is the
    /// same whether made from a key or from the frames' parts.
    #[test]
    fn digests_are_equal_exactly_when_keys_are() {
        let g = |function: &str, line: i64, module: &str| {
            Group::new(
                1,
                1,
                "cudaMalloc",
                MemoryKind::Device,
                vec![native(function, module, line, "0x1")],
                vec![],
            )
        };
        let mut groups = vec![
            g("step", 10, "/bin/app"),
            g("step", 10, "/other/dir/app"),
            g("step", 11, "/bin/app"),
            g("ste", 10, "/bin/app"),
            g("step", 10, "/bin/app2"),
            Group::new(1, 1, "cudaMalloc", MemoryKind::Device, vec![], vec![]),
            Group::new(1, 1, "cudaMallocHost", MemoryKind::Device, vec![], vec![]),
            Group::new(1, 1, "cudaMalloc", MemoryKind::Host, vec![], vec![]),
            group(vec![py("allocate", 13)]),
            group(vec![py("allocate", 13), py("allocate", 13)]),
            group(vec![py("allocate", 14)]),
        ];
        // A function name that holds what follows it in another frame.
        let mut split = g("st", 10, "/bin/app");
        split.native_stack[0].file = Some("epx.c".into());
        groups.push(split);
        let mut none = g("step", 10, "/bin/app");
        none.native_stack[0].function = None;
        groups.push(none);
        for a in &groups {
            let ka = GroupKey::of(a);
            let from_parts = KeyDigest::of(
                &a.api,
                a.memory,
                if a.merged_stack.is_empty() {
                    a.native_stack
                        .iter()
                        .map(|f| KeyFrameRef::Native {
                            function: f.function.as_deref(),
                            file: f.file.as_deref(),
                            line: f.line,
                            module: f.module.as_deref(),
                        })
                        .collect::<Vec<_>>()
                } else {
                    a.merged_stack
                        .iter()
                        .map(|f| match f {
                            MergedFrame::Python(p) => KeyFrameRef::Python {
                                function: &p.function,
                                file: &p.file,
                                line: p.line,
                            },
                            MergedFrame::Native(_) => unreachable!("no native frames here"),
                        })
                        .collect()
                },
            );
            assert_eq!(ka.digest(), from_parts, "{ka:?}");
            for b in &groups {
                let kb = GroupKey::of(b);
                assert_eq!(ka == kb, ka.digest() == kb.digest(), "{ka:?} {kb:?}");
            }
        }
    }
}
