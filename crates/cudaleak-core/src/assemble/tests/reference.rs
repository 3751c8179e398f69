//! The bounded dump gives the reports the straightforward one gave: a
//! reference assembler (every trace a full group, then capped), a made-up
//! program to feed both, and the comparisons.

use super::*;

/// The cap as the dump applied it before its memory was bounded by the
/// groups it writes, to a report already made: the `max` largest groups
/// of each list kept, what `leaks` leaves out counted in
/// `totals.groups_left_out`.
fn cap_groups(r: &mut Report, max: usize) {
    if r.leaks.len() > max {
        let mut left = LeftOut::default();
        for g in r.leaks.drain(max..) {
            if !g.kind().is_leak() {
                continue;
            }
            left.groups += 1;
            left.blocks = left.blocks.saturating_add(g.blocks);
            if !g.memory.is_address_space() {
                left.bytes = left.bytes.saturating_add(g.bytes);
            }
        }
        r.totals.groups_left_out = (left.groups > 0).then_some(left);
    }
    r.suppressed.truncate(max);
    r.growth.truncate(max);
}

// ---- the bounded dump gives what the straightforward one gave ----

/// The dump as it was made before its memory was bounded by the groups
/// it writes (by the distinct stacks alive instead): every trace a full
/// group first, merged by `GroupKey`, growth keyed by `GroupKey`, then
/// sorted, suppressed and capped by `cap_groups`.
#[allow(clippy::too_many_arguments)]
fn straightforward(
    depot: &Depot,
    codes: &CodeTable,
    symbols: &mut dyn SymbolSource,
    suppressions: &Suppressions,
    growth: &mut GrowthTracker<GroupKey>,
    snap: &Snapshot,
    meta: DumpMeta,
    max: usize,
) -> Report {
    let mut by_trace: HashMap<TraceId, Acc> = HashMap::new();
    let mut by_memory: BTreeMap<MemoryKind, KindTotals> = BTreeMap::new();
    let mut live_bytes = 0u64;
    // Blocks of destroyed contexts: in their groups, apart in the totals.
    let mut torn_by_trace: HashMap<TraceId, (u64, u64)> = HashMap::new();
    let (mut torn_blocks, mut torn_bytes) = (0u64, 0u64);
    let live_count = snap.blocks.len();
    for (i, &(addr, b)) in snap.blocks.iter().chain(&snap.torn_down).enumerate() {
        let kind = depot.get(b.trace).map_or(MemoryKind::Device, |t| t.kind);
        if i >= live_count {
            let t = torn_by_trace.entry(b.trace).or_default();
            t.0 += 1;
            t.1 += b.size();
            if kind.is_leak() {
                torn_blocks += 1;
            }
            if kind.counts_in_live_bytes() {
                torn_bytes += b.size();
            }
        } else {
            if kind.counts_in_live_bytes() {
                live_bytes += b.size();
            }
            let k = by_memory.entry(kind).or_default();
            k.blocks += 1;
            k.bytes += b.size();
        }
        let acc = by_trace.entry(b.trace).or_insert(Acc {
            blocks: 0,
            bytes: 0,
            examples: Vec::new(),
        });
        acc.blocks += 1;
        acc.bytes += b.size();
        if acc.examples.len() < EXAMPLES_PER_GROUP {
            acc.examples.push(BlockExample {
                address: hex(addr),
                size: b.size(),
                device: b.device(),
            });
        }
    }
    let mut ids: Vec<TraceId> = by_trace.keys().copied().collect();
    ids.sort();
    let mut groups: Vec<Group> = Vec::new();
    let mut index: HashMap<GroupKey, usize> = HashMap::new();
    for id in ids {
        let acc = by_trace.remove(&id).unwrap();
        let mut g = match depot.get(id) {
            Some(t) => {
                let mut native = Vec::new();
                for &ra in t.native {
                    native.extend(symbols.symbolize(ra));
                }
                let python = t.python.iter().map(|f| codes.resolve(f)).collect();
                build_group(&t, acc, native, python)
            }
            None => unknown_group(acc),
        };
        let (torn_blocks, torn_bytes) = torn_by_trace.get(&id).copied().unwrap_or_default();
        (g.torn_down_blocks, g.torn_down_bytes) = (torn_blocks, torn_bytes);
        match index.entry(GroupKey::of(&g)) {
            Entry::Occupied(e) => {
                let m = &mut groups[*e.get()];
                m.torn_down_blocks += torn_blocks;
                m.torn_down_bytes += torn_bytes;
                add_raw_stack(m, g)
            }
            Entry::Vacant(e) => {
                e.insert(groups.len());
                groups.push(g);
            }
        }
    }
    let mut keys: Vec<(&GroupKey, usize)> = index.iter().map(|(k, &i)| (k, i)).collect();
    keys.sort_unstable_by_key(|&(_, i)| i);
    let changes = growth.observe(keys.iter().map(|&(k, i)| (k, groups[i].blocks, groups[i].bytes)));
    let mut suppress = suppressions.matcher();
    let mut leaks = Vec::new();
    let mut grown = Vec::new();
    for (mut g, c) in groups.into_iter().zip(changes) {
        g.trend = c.trend;
        if c.bytes_delta > 0 && suppress.match_group(&g).is_none() {
            let mut gg = g.clone();
            gg.blocks_delta = Some(c.blocks_delta);
            gg.bytes_delta = Some(c.bytes_delta);
            grown.push(gg);
        }
        leaks.push(g);
    }
    let order = |a: &Group, b: &Group| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.blocks.cmp(&a.blocks))
            .then_with(|| a.api.cmp(&b.api))
            .then_with(|| {
                crate::report::render::top_frame_label(a).cmp(&crate::report::render::top_frame_label(b))
            })
    };
    leaks.sort_by(order);
    grown.sort_by(|a, b| b.bytes_delta.cmp(&a.bytes_delta).then_with(|| order(a, b)));
    let mut suppressed = Vec::new();
    let suppressions_used = suppress.apply(&mut leaks, &mut suppressed);
    // Loaded modules after every leak (suppressed ones keep their order).
    leaks.sort_by_key(|g| !g.kind().is_leak());
    let mut r = Report {
        format: FORMAT.into(),
        version: VERSION,
        trigger: meta.trigger,
        sequence: meta.sequence,
        pid: meta.pid,
        ppid: meta.ppid,
        command: meta.command,
        hostname: meta.hostname,
        rank: meta.rank,
        instance: meta.instance,
        timestamp_ms: meta.timestamp_ms,
        totals: Totals {
            live_blocks: snap.blocks.len() as u64,
            live_bytes,
            peak_bytes: snap.peak_bytes.max(live_bytes),
            allocations: snap.allocations,
            frees: snap.frees,
            failed_allocations: snap.failed_allocations,
            invalid_frees: snap.invalid_frees,
            by_memory,
            stacks_dropped: depot.dropped(),
            stacks_skipped_nested: snap.stacks_skipped_nested,
            groups_left_out: None,
            torn_down_blocks: torn_blocks,
            torn_down_bytes: torn_bytes,
        },
        leaks,
        growth: grown,
        suppressed,
        reason: meta.reason,
        exit_status: meta.exit_status,
        signal: meta.signal,
        suppressions_used,
        python: meta.python,
        incomplete_shards: snap.incomplete_shards,
        merged_from: vec![],
        run_id: None,
        timeline: None,
        oom: None,
        peak: None,
        oom_events: Vec::new(),
        allocation_trace: None,
    };
    cap_groups(&mut r, max);
    r
}

/// Symbols for a made-up program: application functions (two addresses
/// with the same symbols), an inlined pair, an address without symbols,
/// the interpreter's eval loop at two call sites, call machinery, a
/// static runtime entry point, a frame without a module.
fn program_symbols() -> FakeSymbols {
    let mut m: HashMap<u64, Vec<(&'static str, &'static str, i64)>> = HashMap::from([
        (0x2001, vec![("helper", "app.c", 7), ("outer", "app.c", 70)]),
        (0x4001, vec![("_PyEval_EvalFrameDefault", "ceval.c", 1)]),
        (0x4011, vec![("_PyEval_EvalFrameDefault", "ceval.c", 2)]),
        (0x5001, vec![("ffi_call", "ffi.c", 1)]),
        (0x6001, vec![("cudaMalloc", "cudart.c", 5)]),
        (0x7001, vec![("PyObject_Vectorcall", "call.c", 3)]),
    ]);
    const NAMES: [&str; 10] = ["f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9"];
    for (i, name) in NAMES.iter().enumerate() {
        let line = 10 * i as i64;
        m.insert(0x1001 + 0x10 * i as u64, vec![(name, "app.c", line)]);
    }
    // Another call of f0 with the same line: one group with 0x1001.
    m.insert(0x1101, vec![("f0", "app.c", 0)]);
    FakeSymbols(m)
}

/// Modules as the real symbolizer gives them: what call machinery and
/// suppressions look at.
struct ProgramSymbols(FakeSymbols);

impl SymbolSource for ProgramSymbols {
    fn symbolize(&mut self, ra: u64) -> Vec<NativeFrame> {
        let module = match ra {
            0x4001 | 0x4011 | 0x7001 => Some("/usr/lib/libpython3.12.so.1.0"),
            0x5001 => Some("/usr/lib/libffi.so.8"),
            0x6001 => Some("/usr/lib/libtorch.so"),
            0x1091 => None,
            _ => Some("/bin/app"),
        };
        let mut frames = self.0.symbolize(ra);
        for f in &mut frames {
            if f.function.is_some() {
                f.module = module.map(String::from);
            }
        }
        frames
    }
}

/// Counts the calls per address.
struct Counting<S>(S, HashMap<u64, u32>);

impl<S: SymbolSource> SymbolSource for Counting<S> {
    fn symbolize(&mut self, ra: u64) -> Vec<NativeFrame> {
        *self.1.entry(ra).or_default() += 1;
        self.0.symbolize(ra)
    }
}

struct Program {
    depot: Box<Depot>,
    codes: CodeTable,
    traces: Vec<(TraceId, MemoryKind)>,
}

/// About 400 traces made at random (fixed seed) from the symbols above
/// and five Python code objects (one unknown to the code table).
fn program() -> Program {
    let depot = Box::new(Depot::new());
    let codes = CodeTable::new();
    for (code, file, name) in [
        (1u64, "train_a.py", "step"),
        (2, "train_a.py", "forward"),
        (3, "train_b.py", "main"),
        (4, "train_b.py", "<module>"),
    ] {
        codes.insert(
            code,
            0,
            CodeInfo {
                filename: file.into(),
                qualname: name.into(),
                firstlineno: 10 * code as i32,
                format: LineFormat::Lnotab,
                linetable: vec![6, 2, 6, 3],
            },
        );
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let apis = [
        Api::cudaMalloc,
        Api::by_name("cuMemAlloc_v2").unwrap(),
        Api::by_name("cuMemAllocManaged").unwrap(),
        Api::by_name("cuMemAddressReserve").unwrap(),
    ];
    let kinds = [
        MemoryKind::Device,
        MemoryKind::Device,
        MemoryKind::Managed,
        MemoryKind::Reservation,
    ];
    let addresses = [
        0x1001, 0x1011, 0x1021, 0x1031, 0x1041, 0x1051, 0x1061, 0x1071, 0x1081, 0x1091, 0x1101, 0x2001,
        0x3001, 0x5001, 0x7001,
    ];
    let mut traces = Vec::new();
    for _ in 0..600 {
        let a = next(apis.len() as u64) as usize;
        let mut native: Vec<u64> = Vec::new();
        if a == 1 && next(2) == 0 {
            native.push(0x6001);
        }
        let depth = 1 + next(4);
        for _ in 0..depth {
            native.push(addresses[next(addresses.len() as u64) as usize]);
        }
        let mut python = Vec::new();
        if next(3) == 0 {
            for level in 0..1 + next(3) {
                if next(2) == 0 {
                    native.push(0x5001);
                }
                native.push([0x4001, 0x4011][next(2) as usize]);
                if level == 0 && next(2) == 0 {
                    native.push(0x7001);
                }
                python.push(PyRawFrame {
                    code: [1, 2, 3, 4, 9][next(5) as usize],
                    guard: 0,
                    offset: [0, 6, 12][next(3) as usize] as u32,
                    flags: PY_FRAME_ENTRY,
                });
            }
            if next(4) == 0 {
                // One more Python frame than eval-loop frames.
                python.push(PyRawFrame {
                    code: 4,
                    guard: 0,
                    offset: 0,
                    flags: 0,
                });
            }
        }
        native.push(0x1001);
        let id = depot.intern(
            &TraceKey {
                api: apis[a],
                kind: kinds[a],
                native: &native,
                python: &python,
            },
            |_| {},
        );
        if !traces.iter().any(|&(t, _)| t == id) {
            traces.push((id, kinds[a]));
        }
    }
    // Loaded modules too: no leaks, after the leaks, cut first.
    for i in 0..40u64 {
        let native = [addresses[(i % 11) as usize], 0x1001];
        let id = depot.intern(
            &TraceKey {
                api: Api::cuModuleLoadData,
                kind: MemoryKind::Module,
                native: &native,
                python: &[],
            },
            |_| {},
        );
        if !traces.iter().any(|&(t, _)| t == id) {
            traces.push((id, MemoryKind::Module));
        }
    }
    // Blocks whose stack was not stored.
    traces.push((TraceId(0), MemoryKind::Device));
    Program { depot, codes, traces }
}

/// Live blocks of dump `dump`: trace i has a number of blocks that
/// grows, stays, or comes and goes with the dump, of 1, 2 or 4 bytes
/// (many ties for the sort's later keys).
fn snapshot(p: &Program, dump: u64) -> Snapshot {
    let mut blocks = Vec::new();
    let mut address = 0x10_0000u64;
    for (i, &(id, kind)) in p.traces.iter().enumerate() {
        let i = i as u64;
        let n = match i % 4 {
            0 => 1 + dump,
            1 => 2,
            2 => (i + dump) % 3,
            _ => 1 + (dump % 2) * (i % 5),
        };
        for _ in 0..n {
            address += 0x100;
            blocks.push((address, Block::new(1 << (i % 3), id, kind, 0, Some(0), 0)));
        }
    }
    // Every seventh block was on a context destroyed since (a reset).
    let (blocks, torn_down) =
        blocks
            .into_iter()
            .enumerate()
            .fold((Vec::new(), Vec::new()), |(mut live, mut torn), (i, b)| {
                if i % 7 == 3 {
                    torn.push(b)
                } else {
                    live.push(b)
                }
                (live, torn)
            });
    assert!(!torn_down.is_empty());
    Snapshot {
        blocks,
        torn_down,
        allocations: 1000,
        ..Default::default()
    }
}

#[test]
fn bounded_assembly_gives_the_reports_of_the_straightforward_one() {
    let p = program();
    let rules = "leak:^f3$\nleak:libffi\nleak:train_b.py\nleak:^f3$\nleak:outer\n";
    for supp in [Suppressions::default(), Suppressions::parse(rules, "t").unwrap()] {
        for max in [usize::MAX, 0, 1, 7, 40] {
            let mut new_growth = GrowthTracker::default();
            let mut old_growth = GrowthTracker::<GroupKey>::default();
            for dump in 0..5 {
                let snap = snapshot(&p, dump);
                let new = Assembler {
                    depot: &p.depot,
                    codes: &p.codes,
                    symbols: &mut ProgramSymbols(program_symbols()),
                    suppressions: &supp,
                    growth: &mut new_growth,
                }
                .assemble_at_most(&snap, meta(dump), max);
                let old = straightforward(
                    &p.depot,
                    &p.codes,
                    &mut ProgramSymbols(program_symbols()),
                    &supp,
                    &mut old_growth,
                    &snap,
                    meta(dump),
                    max,
                );
                assert_eq!(new, old, "max {max}, dump {dump}, {} rules", supp.rules.len());
                if max == usize::MAX && dump == 3 {
                    // The test sees what it claims to see.
                    assert!(new.leaks.len() > 100, "{}", new.leaks.len());
                    assert!(new.leaks.iter().filter(|g| g.raw_stacks.len() > 1).count() >= 5);
                    assert!(new.leaks.iter().any(|g| g.api == "cudaMalloc"
                        && g.native_stack[0].function.as_deref() != Some("cudaMalloc")));
                    assert!(new.leaks.iter().any(|g| g.trend == Some(Trend::Growing)));
                    // Loaded modules, all after the leaks.
                    let first_module = new.leaks.iter().position(|g| !g.kind().is_leak());
                    assert!(first_module.is_some_and(|i| new.leaks[i..].iter().all(|g| !g.kind().is_leak())));
                    assert!(new.leaks.iter().any(|g| g.trend == Some(Trend::Steady)));
                    assert!(new.leaks.iter().any(|g| g.api == "unknown"));
                    assert!(new.growth.len() > 10);
                    if !supp.is_empty() {
                        assert!(new.suppressed.len() > 10);
                        assert_eq!(new.suppressions_used.len(), 4, "{:#?}", new.suppressions_used);
                    }
                }
                if max == usize::MAX && dump == 2 {
                    // grew at the second dump, smaller at the third
                    assert!(new.leaks.iter().any(|g| g.trend == Some(Trend::Bounded)));
                }
                if max == 7 {
                    let left = new.totals.groups_left_out.expect("more than 7 groups");
                    assert!(left.bytes < left.blocks * 4, "reserved bytes are not counted");
                }
            }
        }
    }
}

/// The peak's groups reuse the leaks' facts of the traces they share
/// (`FactsMemo`): they are what a dump with no blocks, which has none to
/// reuse, makes of the same peak, suppression rules or not.
#[test]
fn the_peak_s_groups_are_the_same_with_the_leaks_facts_reused() {
    let p = program();
    let rules = "leak:^f3$\nleak:libffi\nleak:train_b.py\nleak:outer\n";
    for supp in [Suppressions::default(), Suppressions::parse(rules, "t").unwrap()] {
        let mut snap = snapshot(&p, 3);
        // Every trace, some with no live block now (`snapshot`'s zeros):
        // those are the ones the memo must not answer for.
        let sites: Vec<(TraceId, u64, u64)> = p
            .traces
            .iter()
            .enumerate()
            .map(|(i, &(id, _))| (id, 1 + i as u64 % 3, 64 * (1 + i as u64)))
            .collect();
        snap.peak = Some(PeakSites {
            bytes: sites.iter().map(|s| s.2).sum(),
            timestamp_ms: 5,
            sites,
        });
        let report = |snap: &Snapshot| {
            Assembler {
                depot: &p.depot,
                codes: &p.codes,
                symbols: &mut ProgramSymbols(program_symbols()),
                suppressions: &supp,
                growth: &mut GrowthTracker::default(),
            }
            .assemble_at_most(snap, meta(1), 40)
        };
        let with_leaks = report(&snap).peak.expect("a peak");
        snap.blocks.clear();
        let alone = report(&snap).peak.expect("a peak");
        // (Its `bytes` is the larger of the peak and what is live now.)
        assert!(with_leaks.groups == alone.groups, "{} rules", supp.rules.len());
        assert_eq!(with_leaks.groups_left_out, alone.groups_left_out);
        assert!(with_leaks.groups.len() > 30, "{}", with_leaks.groups.len());
        assert!(with_leaks.groups.iter().all(|g| g.suppression.is_none()));
    }
}

/// Each return address is symbolized once per dump, whatever the
/// number of traces through it (they were symbolized once per trace).
#[test]
fn each_address_is_symbolized_once_per_dump() {
    let p = program();
    let mut growth = GrowthTracker::default();
    for dump in 0..2 {
        let mut symbols = Counting(ProgramSymbols(program_symbols()), HashMap::new());
        let r = Assembler {
            depot: &p.depot,
            codes: &p.codes,
            symbols: &mut symbols,
            suppressions: &Suppressions::default(),
            growth: &mut growth,
        }
        .assemble_at_most(&snapshot(&p, dump), meta(dump), 3);
        assert_eq!(r.leaks.len(), 3);
        assert!(symbols.1.len() > 10);
        assert!(symbols.1.values().all(|&n| n == 1), "{:?}", symbols.1);
    }
}
