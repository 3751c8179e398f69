//! `--format pprof`: a gzip-compressed `profile.proto`
//! (github.com/google/pprof/blob/main/proto/profile.proto), the format
//! `go tool pprof`, Grafana Pyroscope and OpenTelemetry profiles ingest.
//!
//! Sample types: `leaked_blocks`/count and `leaked_bytes`/bytes (the
//! default), and where a report has a `peak`, `peak_blocks`/count and
//! `peak_bytes`/bytes: the groups live when the process's live bytes were
//! highest. One sample per group and process, its stack the group's merged
//! Python and native frames innermost first, with labels `rank`, `host`,
//! `pid`, `memory` (the precise memory kind), `api` and `trigger`. The
//! stack holds the frames the text report shows (no interpreter, ctypes,
//! libffi, program start or test runner around a Python program's own
//! lines), every frame with `--full-stacks`. A Python function named with
//! `<` or `>` is `FILESTEM.NAME` (`train.<module>`): pprof would blank it.
//!
//! The encoder is written here: the message is a few varints and
//! length-delimited fields, not worth a code generator.

use super::{frame_name, Process};
use cudaleak_core::report::render::picture_frames;
use cudaleak_core::report::{Group, MergedFrame};
use std::collections::HashMap;

/// A protobuf message being written: fields in any order, as the wire
/// format allows.
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint(((field as u64) << 3) | wire_type as u64);
    }

    /// An integer field (int64 and uint64 are both plain varints; a
    /// negative int64 takes ten bytes). Zero is the default and is left
    /// out, as protobuf encoders do.
    fn uint(&mut self, field: u32, v: u64) -> &mut Self {
        if v != 0 {
            self.key(field, 0);
            self.varint(v);
        }
        self
    }

    fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.uint(field, v as u64)
    }

    fn bool(&mut self, field: u32, v: bool) -> &mut Self {
        self.uint(field, v as u64)
    }

    fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }

    fn message(&mut self, field: u32, m: &Message) -> &mut Self {
        self.bytes(field, &m.0)
    }

    /// A packed repeated integer field.
    fn packed(&mut self, field: u32, values: impl IntoIterator<Item = u64>) -> &mut Self {
        let mut inner = Message::default();
        for v in values {
            inner.varint(v);
        }
        self.bytes(field, &inner.0)
    }
}

/// The profile's string table: index 0 is "", as the format requires.
struct Strings {
    list: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        Strings {
            list: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as i64;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

#[derive(PartialEq, Eq, Hash)]
struct FunctionKey {
    name: String,
    file: String,
}

#[derive(PartialEq, Eq, Hash)]
struct LocationKey {
    mapping: u64,
    address: u64,
    function: u64,
    line: i64,
}

/// A module's mapping: its id, the highest offset seen, whether every
/// frame in it had a function.
type MappingSeen = (u64, u64, bool);

/// Builds the profile; ids of functions, locations and mappings start at 1.
struct Builder {
    strings: Strings,
    functions: HashMap<FunctionKey, u64>,
    function_msgs: Vec<Message>,
    locations: HashMap<LocationKey, u64>,
    location_msgs: Vec<Message>,
    mappings: HashMap<(String, String), MappingSeen>,
    samples: Vec<Message>,
    /// every frame (`--full-stacks`), else those the text report shows
    full: bool,
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

impl Builder {
    fn function(&mut self, name: &str, file: &str) -> u64 {
        let key = FunctionKey {
            name: name.to_string(),
            file: file.to_string(),
        };
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.function_msgs.len() as u64 + 1;
        let (n, f) = (self.strings.id(name), self.strings.id(file));
        let mut m = Message::default();
        m.uint(1, id).int(2, n).int(3, n).int(4, f);
        self.function_msgs.push(m);
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, frame: &MergedFrame) -> u64 {
        let named = frame_name(frame);
        let name = match frame {
            MergedFrame::Python(p) => python_name(&p.function, &p.file),
            MergedFrame::Native(_) => named.name.clone(),
        };
        let function = self.function(&name, named.file.as_deref().unwrap_or(""));
        let (mut mapping, mut address) = (0, 0);
        if let MergedFrame::Native(n) = frame {
            if let (Some(module), Some(offset)) = (&n.module, n.offset.as_deref().and_then(parse_hex)) {
                let next = self.mappings.len() as u64 + 1;
                let key = (module.clone(), n.build_id.clone().unwrap_or_default());
                let entry = self.mappings.entry(key).or_insert((next, 0, true));
                entry.1 = entry.1.max(offset);
                entry.2 &= n.function.is_some();
                mapping = entry.0;
                // Addresses are module offsets: the same in every process
                // whatever ASLR did, so that ranks' samples merge.
                address = offset;
            }
        }
        let key = LocationKey {
            mapping,
            address,
            function,
            line: named.line.unwrap_or(0),
        };
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.location_msgs.len() as u64 + 1;
        let mut line = Message::default();
        line.uint(1, function).int(2, key.line);
        let mut m = Message::default();
        m.uint(1, id).uint(2, mapping).uint(3, address).message(4, &line);
        self.location_msgs.push(m);
        self.locations.insert(key, id);
        id
    }

    fn label_str(&mut self, key: &str, value: &str) -> Message {
        let mut m = Message::default();
        let (k, v) = (self.strings.id(key), self.strings.id(value));
        m.int(1, k).int(2, v);
        m
    }

    fn label_num(&mut self, key: &str, value: i64) -> Message {
        let mut m = Message::default();
        let k = self.strings.id(key);
        m.int(1, k);
        // `num` 0 is a real value here (rank 0): always written.
        m.key(3, 0);
        m.varint(value as u64);
        m
    }

    fn sample(&mut self, g: &Group, values: &[i64], process: &Process) {
        let stack = picture_frames(g, self.full);
        // Root first, so that the program's own module (where `main`
        // and `_start` are) is mapping 1, which pprof names as the
        // profile's binary.
        let mut ids: Vec<u64> = stack.iter().rev().map(|f| self.location(f)).collect();
        ids.reverse();
        if ids.is_empty() {
            // A group whose stack was not kept (CUDALEAK_MAX_STACKS):
            // still a sample, under a frame that says so.
            let f = self.function("[unknown stack]", "");
            let key = LocationKey {
                mapping: 0,
                address: 0,
                function: f,
                line: 0,
            };
            let next = self.location_msgs.len() as u64 + 1;
            let id = *self.locations.entry(key).or_insert(next);
            if id == next {
                let mut line = Message::default();
                line.uint(1, f);
                let mut m = Message::default();
                m.uint(1, id).message(4, &line);
                self.location_msgs.push(m);
            }
            ids.push(id);
        }
        let r = &process.1;
        let mut labels = Vec::new();
        if !super::is_merged(r) {
            if let Some(rank) = r.rank {
                labels.push(self.label_num("rank", rank));
            }
            if let Some(host) = &r.hostname {
                labels.push(self.label_str("host", host));
            }
            labels.push(self.label_num("pid", r.pid));
        }
        labels.push(self.label_str("memory", g.kind().name()));
        labels.push(self.label_str("api", &g.api));
        labels.push(self.label_str("trigger", r.trigger.name()));
        let mut m = Message::default();
        m.packed(1, ids).packed(2, values.iter().map(|&v| v as u64));
        for l in &labels {
            m.message(3, l);
        }
        self.samples.push(m);
    }
}

/// Saturates: pprof values are int64, a report's counters u64.
fn int64(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// pprof names mapping 1 as the profile's binary. Samples go in root
/// first, so that the module of `_start` (the program) takes it; but a
/// Python program's native stacks end at the interpreter's eval loop,
/// in libpython, and no frame is in the interpreter's
/// executable; and the frames around its Python lines are folded away
/// unless `--full-stacks`. Then the executable the command ran (its
/// `argv[0]`) is mapping 1, with no frames in it.
fn main_binary_first(b: &mut Builder, processes: &[Process]) {
    let full = b.full;
    let Some(program) = processes.first().and_then(|(_, r)| r.command.first()) else {
        return;
    };
    let base = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
    let name = base(program);
    let has_frames = processes.iter().any(|(_, r)| {
        r.leaks
            .iter()
            .chain(r.peak.iter().flat_map(|p| &p.groups))
            .flat_map(|g| picture_frames(g, full))
            .any(|f| matches!(f, MergedFrame::Native(n) if n.module.as_deref().is_some_and(|m| base(m) == name)))
    });
    if !has_frames {
        b.mappings.insert((program.clone(), String::new()), (1, 0, true));
    }
}

/// A Python function's name in the profile. pprof takes a name with `<`
/// or `>` (and no `.<`) for a demangled C++ name and removes its
/// `<...>` as template parameters (`looksLikeDemangledCPlusPlus` in its
/// symbolizer): `<module>`, `<lambda>` and `<listcomp>` all read
/// `<unknown>`. Such a name is `STEM.NAME`, STEM the file's name without
/// its directory and `.py` (`train.<module>`), as Python's qualified
/// names read; the function's file and line stay the frame's.
fn python_name(function: &str, file: &str) -> String {
    if !(function.contains('<') || function.contains('>')) || function.contains(".<") {
        return function.to_string();
    }
    let base = file.rsplit('/').next().unwrap_or(file);
    let stem = base.strip_suffix(".py").unwrap_or(base);
    format!("{stem}.{function}")
}

/// The uncompressed `profile.proto` message.
/// `full`: every frame of each stack (`--full-stacks`), else the frames
/// the text report shows ([`picture_frames`]).
pub fn profile(processes: &[Process], full: bool) -> Vec<u8> {
    let mut b = Builder {
        strings: Strings::new(),
        functions: HashMap::new(),
        function_msgs: Vec::new(),
        locations: HashMap::new(),
        location_msgs: Vec::new(),
        mappings: HashMap::new(),
        samples: Vec::new(),
        full,
    };
    main_binary_first(&mut b, processes);
    let with_peak = processes.iter().any(|(_, r)| r.peak.is_some());
    let mut types = vec![("leaked_blocks", "count"), ("leaked_bytes", "bytes")];
    if with_peak {
        types.extend([("peak_blocks", "count"), ("peak_bytes", "bytes")]);
    }
    let width = types.len();
    for p in processes {
        for g in &p.1.leaks {
            let mut v = vec![0i64; width];
            v[0] = int64(g.blocks);
            v[1] = int64(g.bytes);
            b.sample(g, &v, p);
        }
        if let Some(peak) = &p.1.peak {
            for g in &peak.groups {
                let mut v = vec![0i64; width];
                v[2] = int64(g.blocks);
                v[3] = int64(g.bytes);
                b.sample(g, &v, p);
            }
        }
    }
    let mut out = Message::default();
    for (t, unit) in &types {
        let mut m = Message::default();
        let (t, u) = (b.strings.id(t), b.strings.id(unit));
        m.int(1, t).int(2, u);
        out.message(1, &m);
    }
    for s in &b.samples {
        out.message(2, s);
    }
    let mut mappings: Vec<(&(String, String), &MappingSeen)> = b.mappings.iter().collect();
    mappings.sort_by_key(|(_, v)| v.0);
    let mut mapping_msgs = Vec::new();
    for ((module, build_id), (id, highest, all_named)) in mappings {
        let mut m = Message::default();
        let (file, build) = (b.strings.id(module), b.strings.id(build_id));
        // has_functions etc.: the frames are symbolized already, so that
        // pprof does not look for the module on the reader's machine.
        m.uint(1, *id)
            .uint(2, 0)
            .uint(3, highest.saturating_add(1))
            .int(5, file)
            .int(6, build)
            .bool(7, *all_named)
            .bool(8, *all_named)
            .bool(9, *all_named);
        mapping_msgs.push(m);
    }
    for m in &mapping_msgs {
        out.message(3, m);
    }
    for m in &b.location_msgs {
        out.message(4, m);
    }
    for m in &b.function_msgs {
        out.message(5, m);
    }
    let newest = processes.iter().map(|(_, r)| r.timestamp_ms).max().unwrap_or(0);
    let comments: Vec<i64> = processes
        .iter()
        .map(|(path, r)| {
            b.strings.id(&format!(
                "cudaleak {} report of {}: {}",
                r.trigger.name(),
                super::process_label(r),
                path.display()
            ))
        })
        .collect();
    let default_type = b.strings.id("leaked_bytes");
    let space = b.strings.id("space");
    let bytes_unit = b.strings.id("bytes");
    for s in &b.strings.list {
        out.bytes(6, s.as_bytes());
    }
    out.int(9, newest.saturating_mul(1_000_000));
    let mut period_type = Message::default();
    period_type.int(1, space).int(2, bytes_unit);
    out.message(11, &period_type).int(12, 1);
    for c in comments {
        out.int(13, c);
    }
    out.int(14, default_type);
    out.0
}

/// `profile` gzip-compressed, as pprof files are stored.
pub fn pprof(processes: &[Process], full: bool) -> Vec<u8> {
    gzip(&profile(processes, full))
}

/// RFC 1952: a header, the raw deflate stream (miniz_oxide, already in
/// the build through the backtrace crate), CRC-32 and length.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    out.extend(miniz_oxide::deflate::compress_to_vec(data, 6));
    out.extend(crc32(data).to_le_bytes());
    out.extend((data.len() as u32).to_le_bytes());
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (i, slot) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *slot = c;
    }
    let mut crc = !0u32;
    for &byte in data {
        crc = table[((crc ^ byte as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}
