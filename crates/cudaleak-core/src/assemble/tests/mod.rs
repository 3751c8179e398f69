//! The assembler's tests, and the straightforward assembler (every trace
//! a full group, then capped) its reports are compared with.
//!
//! Bottom up:
//!
//! 1. one dump's groups, their frames, suppressions, growth and trends: `groups`
//! 2. the bounded dump against the straightforward assembler: `reference`
//!
//! This file: fake symbols and dump metadata both use.

mod groups;
mod reference;

use super::assembler::*;
use super::grouping::*;
use super::growth::*;
use super::*;
use crate::record::depot::{Depot, TraceKey};
use crate::record::linetable::LineFormat;
use crate::record::python::{CodeInfo, CodeTable, PyRawFrame, PY_FRAME_ENTRY};
use crate::record::{Api, Block, MemoryKind, TraceId};
use crate::report::group_key::GroupKey;
use crate::report::suppress::Suppressions;
use crate::report::{
    BlockExample, Group, KindTotals, LeftOut, MergedFrame, NativeFrame, Report, Totals, Trend, Trigger,
    FORMAT, VERSION,
};
use crate::symbolize::{hex, SymbolSource};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

/// Fake symbols: address → list of (function, file, line).
struct FakeSymbols(HashMap<u64, Vec<(&'static str, &'static str, i64)>>);

impl SymbolSource for FakeSymbols {
    fn symbolize(&mut self, ra: u64) -> Vec<NativeFrame> {
        let pc = ra - 1;
        match self.0.get(&ra) {
            Some(v) => v
                .iter()
                .map(|(f, file, line)| NativeFrame {
                    address: hex(pc),
                    function: Some(f.to_string()),
                    file: Some(file.to_string()),
                    line: Some(*line),
                    module: Some("/bin/app".into()),
                    ..NativeFrame::default()
                })
                .collect(),
            None => vec![NativeFrame {
                address: hex(pc),
                function: None,
                file: None,
                line: None,
                module: None,
                ..NativeFrame::default()
            }],
        }
    }
}

fn meta(seq: u64) -> DumpMeta {
    DumpMeta {
        trigger: Trigger::Exit,
        sequence: seq,
        pid: 42,
        ppid: Some(1),
        command: vec!["app".into()],
        hostname: Some("h".into()),
        rank: None,
        instance: None,
        timestamp_ms: 1,
        reason: None,
        exit_status: Some(0),
        signal: None,
        python: None,
    }
}

fn symbols() -> FakeSymbols {
    FakeSymbols(HashMap::from([
        (0x101, vec![("leak_a", "app.c", 10)]),
        (0x201, vec![("leak_b", "app.c", 20)]),
        (0x301, vec![("main", "app.c", 30)]),
        (0x401, vec![("cudaMalloc", "cudart.c", 5)]),
        (0x501, vec![("internal_alloc", "cudart.c", 2)]),
        (0x601, vec![("_PyEval_EvalFrameDefault", "ceval.c", 1)]),
        (0x611, vec![("_PyEval_EvalFrameDefault", "ceval.c", 2)]),
        (0x701, vec![("ffi_call", "ffi.c", 1)]),
        (
            0x801,
            vec![("inlined_helper", "app.c", 7), ("outer", "app.c", 70)],
        ),
    ]))
}

fn key(api: &str, native: &'static [u64]) -> TraceKey<'static> {
    TraceKey {
        api: Api::by_name(api).unwrap(),
        kind: MemoryKind::Device,
        native,
        python: &[],
    }
}
