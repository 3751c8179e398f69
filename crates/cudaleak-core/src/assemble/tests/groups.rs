//! One dump's groups: their order and frames (symbols, inlined frames,
//! runtime attribution, Python frames), suppressions, and growth and
//! trends over dumps.

use super::*;

#[test]
fn pytorch_cache_segments_are_the_native_allocator_s_only() {
    for (name, cache) in [
        ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)", true),
        ("c10::cuda::CUDACachingAllocator::Native::ExpandableSegment::map(c10::cuda::CUDACachingAllocator::Native::SegmentRange)", true),
        ("c10::cuda::CUDACachingAllocator::THCCachingAllocator::malloc(void**, int, unsigned long, CUstream_st*)", true),
        ("_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator6mallocEimP11CUstream_st", true),
        ("c10::cuda::CUDACachingAllocator::CudaMallocAsync::mallocAsync(void**, int, unsigned long, CUstream_st*)", false),
        ("_ZN3c104cuda20CUDACachingAllocator15CudaMallocAsync11mallocAsyncEPPvimP11CUstream_st", false),
        ("at::cuda::setWorkspaceForHandle()", false),
        ("cudaMalloc", false),
    ] {
        assert_eq!(is_pytorch_caching_allocator(name), cache, "{name}");
    }
}

#[test]
fn groups_sorted_by_bytes_with_symbolized_frames() {
    let depot = Box::new(Depot::new());
    let a = depot.intern(&key("cudaMalloc", &[0x101, 0x301]), |_| {});
    let b = depot.intern(&key("cudaMalloc", &[0x201, 0x301]), |_| {});
    let snap = Snapshot {
        blocks: vec![
            (0x1000, Block::new(100, a, MemoryKind::Device, 1, Some(0), 0)),
            (0x2000, Block::new(100, a, MemoryKind::Device, 1, Some(0), 0)),
            (0x3000, Block::new(500, b, MemoryKind::Device, 1, Some(0), 0)),
        ],
        allocations: 5,
        frees: 2,
        peak_bytes: 900,
        ..Default::default()
    };
    let mut syms = symbols();
    let sup = Suppressions::default();
    let mut growth = GrowthTracker::default();
    let r = Assembler {
        depot: &depot,
        codes: &CodeTable::new(),
        symbols: &mut syms,
        suppressions: &sup,
        growth: &mut growth,
    }
    .assemble(&snap, meta(1));
    assert_eq!(r.totals.live_blocks, 3);
    assert_eq!(r.totals.live_bytes, 700);
    assert_eq!(r.totals.peak_bytes, 900);
    assert_eq!(r.leaks.len(), 2);
    assert_eq!(r.leaks[0].bytes, 500);
    assert_eq!(r.leaks[0].native_stack[0].function.as_deref(), Some("leak_b"));
    assert_eq!(r.leaks[0].native_stack[0].line, Some(20));
    assert_eq!(r.leaks[0].native_stack[0].address, "0x200");
    assert_eq!(r.leaks[1].blocks, 2);
    assert_eq!(r.leaks[1].examples.len(), 2);
    assert_eq!(r.totals.by_memory[&MemoryKind::Device].bytes, 700);
    // First dump: everything grew since process start.
    assert_eq!(r.growth.len(), 2);
    assert_eq!(r.growth[0].bytes_delta, Some(500));
}

#[test]
fn static_runtime_frames_are_attributed_and_dropped() {
    let depot = Box::new(Depot::new());
    let t = depot.intern(&key("cuMemAlloc_v2", &[0x501, 0x401, 0x101, 0x301]), |_| {});
    let wrong = depot.intern(&key("cuMemAllocManaged", &[0x401, 0x101]), |_| {});
    let snap = Snapshot {
        blocks: vec![
            (0x1000, Block::new(64, t, MemoryKind::Device, 0, None, 0)),
            (0x2000, Block::new(32, wrong, MemoryKind::Device, 0, None, 0)),
        ],
        ..Default::default()
    };
    let mut syms = symbols();
    let r = Assembler {
        depot: &depot,
        codes: &CodeTable::new(),
        symbols: &mut syms,
        suppressions: &Suppressions::default(),
        growth: &mut GrowthTracker::default(),
    }
    .assemble(&snap, meta(1));
    assert_eq!(r.leaks[0].api, "cudaMalloc");
    assert_eq!(r.leaks[0].native_stack[0].function.as_deref(), Some("leak_a"));
    // cudaMalloc never calls cuMemAllocManaged: no attribution.
    assert_eq!(r.leaks[1].api, "cuMemAllocManaged");
    assert_eq!(r.leaks[1].native_stack.len(), 2);
}

#[test]
fn inlined_frames_expand_in_place() {
    let depot = Box::new(Depot::new());
    let t = depot.intern(&key("cudaMalloc", &[0x801, 0x301]), |_| {});
    let snap = Snapshot {
        blocks: vec![(0x1000, Block::new(1, t, MemoryKind::Device, 0, None, 0))],
        ..Default::default()
    };
    let r = Assembler {
        depot: &depot,
        codes: &CodeTable::new(),
        symbols: &mut symbols(),
        suppressions: &Suppressions::default(),
        growth: &mut GrowthTracker::default(),
    }
    .assemble(&snap, meta(1));
    let names: Vec<_> = r.leaks[0]
        .native_stack
        .iter()
        .map(|f| f.function.clone().unwrap())
        .collect();
    assert_eq!(names, ["inlined_helper", "outer", "main"]);
}

#[test]
fn python_frames_replace_eval_loop_frames() {
    let depot = Box::new(Depot::new());
    let codes = CodeTable::new();
    for (code, name, first) in [(1u64, "inner", 10), (2, "middle", 20), (3, "outer", 30)] {
        codes.insert(
            code,
            0,
            CodeInfo {
                filename: "t.py".into(),
                qualname: name.into(),
                firstlineno: first,
                format: LineFormat::Lnotab,
                linetable: vec![],
            },
        );
    }
    // inner+middle ran in one eval invocation (middle entered from C),
    // outer in another.
    let py = [
        PyRawFrame {
            code: 1,
            guard: 0,
            offset: 0,
            flags: 0,
        },
        PyRawFrame {
            code: 2,
            guard: 0,
            offset: 0,
            flags: PY_FRAME_ENTRY,
        },
        PyRawFrame {
            code: 3,
            guard: 0,
            offset: 0,
            flags: PY_FRAME_ENTRY,
        },
    ];
    static NATIVE: [u64; 5] = [0x701, 0x601, 0x701, 0x601, 0x301];
    let t = depot.intern(
        &TraceKey {
            api: Api::cudaMalloc,
            kind: MemoryKind::Device,
            native: &NATIVE,
            python: &py,
        },
        |_| {},
    );
    let snap = Snapshot {
        blocks: vec![(0x1000, Block::new(1, t, MemoryKind::Device, 0, None, 0))],
        ..Default::default()
    };
    let r = Assembler {
        depot: &depot,
        codes: &codes,
        symbols: &mut symbols(),
        suppressions: &Suppressions::default(),
        growth: &mut GrowthTracker::default(),
    }
    .assemble(&snap, meta(1));
    let g = &r.leaks[0];
    assert_eq!(g.python_stack.len(), 3);
    assert_eq!(g.python_stack[0].function, "inner");
    assert_eq!(g.python_stack[0].line, Some(10));
    let merged: Vec<String> = g
        .merged_stack
        .iter()
        .map(|f| match f {
            MergedFrame::Native(n) => n.function.clone().unwrap(),
            MergedFrame::Python(p) => format!("py:{}", p.function),
        })
        .collect();
    assert_eq!(
        merged,
        [
            "ffi_call",
            "py:inner",
            "py:middle",
            "ffi_call",
            "py:outer",
            "main"
        ]
    );
}

/// CPython 3.13 reached one Python line through two call sites in
/// the eval loop (specialized and generic): one group, both raw
/// stacks kept, and blocks moving between them is not growth.
#[test]
fn one_python_line_is_one_group_whatever_the_eval_loop_call_site() {
    let depot = Box::new(Depot::new());
    let codes = CodeTable::new();
    codes.insert(
        1,
        0,
        CodeInfo {
            filename: "train.py".into(),
            qualname: "allocate".into(),
            firstlineno: 13,
            format: LineFormat::Lnotab,
            linetable: vec![],
        },
    );
    let py = [PyRawFrame {
        code: 1,
        guard: 0,
        offset: 0,
        flags: PY_FRAME_ENTRY,
    }];
    static SPECIALIZED: [u64; 3] = [0x701, 0x601, 0x301];
    static GENERIC: [u64; 3] = [0x701, 0x611, 0x301];
    let trace = |native: &'static [u64]| {
        depot.intern(
            &TraceKey {
                api: Api::cudaMalloc,
                kind: MemoryKind::Device,
                native,
                python: &py,
            },
            |_| {},
        )
    };
    let (a, b) = (trace(&SPECIALIZED), trace(&GENERIC));
    assert_ne!(a, b);
    let block = |t| Block::new(100, t, MemoryKind::Device, 0, None, 0);
    let mut growth = GrowthTracker::default();
    let mut dump = |blocks: Vec<(u64, Block)>, seq| {
        Assembler {
            depot: &depot,
            codes: &codes,
            symbols: &mut symbols(),
            suppressions: &Suppressions::default(),
            growth: &mut growth,
        }
        .assemble(
            &Snapshot {
                blocks,
                ..Default::default()
            },
            meta(seq),
        )
    };
    let r = dump(
        vec![(0x1000, block(a)), (0x2000, block(a)), (0x3000, block(b))],
        1,
    );
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    let g = &r.leaks[0];
    assert_eq!((g.blocks, g.bytes), (3, 300));
    assert_eq!(g.raw_stacks.len(), 2);
    assert_eq!((g.raw_stacks[0].blocks, g.raw_stacks[1].blocks), (2, 1));
    assert_eq!(g.native_stack[1].line, Some(1), "the largest raw stack shows");
    assert_eq!(g.raw_stacks[1].native_stack[1].line, Some(2));
    assert_eq!(g.examples.len(), 3);
    // Same blocks, moved to the other call site: no growth.
    let r = dump(
        vec![(0x1000, block(b)), (0x2000, block(b)), (0x3000, block(a))],
        2,
    );
    assert_eq!(r.leaks.len(), 1);
    assert!(r.growth.is_empty(), "{:#?}", r.growth);
    assert_eq!(r.leaks[0].native_stack[1].line, Some(2));
}

#[test]
fn suppressed_groups_leave_leaks_and_growth() {
    let depot = Box::new(Depot::new());
    let a = depot.intern(&key("cudaMalloc", &[0x101, 0x301]), |_| {});
    let b = depot.intern(&key("cudaMalloc", &[0x201, 0x301]), |_| {});
    let snap = Snapshot {
        blocks: vec![
            (0x1000, Block::new(10, a, MemoryKind::Device, 0, None, 0)),
            (0x2000, Block::new(20, b, MemoryKind::Device, 0, None, 0)),
        ],
        ..Default::default()
    };
    let sup = Suppressions::parse("leak:^leak_b$", "t").unwrap();
    let r = Assembler {
        depot: &depot,
        codes: &CodeTable::new(),
        symbols: &mut symbols(),
        suppressions: &sup,
        growth: &mut GrowthTracker::default(),
    }
    .assemble(&snap, meta(1));
    assert_eq!(r.leaks.len(), 1);
    assert_eq!(r.suppressed.len(), 1);
    assert_eq!(r.suppressed[0].suppression.as_deref(), Some("^leak_b$"));
    assert_eq!(r.growth.len(), 1);
    assert_eq!(r.suppressions_used[0].bytes, 20);
    // Totals still count every live block.
    assert_eq!(r.totals.live_bytes, 30);
}

#[test]
fn growth_and_trends_over_dumps() {
    let mut g = GrowthTracker::<TraceId>::default();
    let (leak, cache, steady) = (TraceId(1), TraceId(2), TraceId(3));
    // Changes of (leak, cache, steady), in that order.
    let dump = |g: &mut GrowthTracker<TraceId>, l: u64, c: u64| {
        g.observe([(&leak, l, l * 10), (&cache, c, c * 10), (&steady, 1, 5)])
    };
    let d1 = dump(&mut g, 1, 4);
    assert_eq!(d1[0].bytes_delta, 10);
    assert_eq!(d1[2].bytes_delta, 5);
    assert_eq!(d1[0].trend, None);
    let d2 = dump(&mut g, 2, 8);
    assert_eq!(d2[2].bytes_delta, 0, "unchanged group is not growth");
    let d3 = dump(&mut g, 3, 8);
    assert_eq!(d3[0].trend, Some(Trend::Growing));
    assert_eq!(d3[1].trend, Some(Trend::Bounded));
    assert_eq!(d3[2].trend, Some(Trend::Steady), "allocated once: not cache-like");
    assert_eq!(d3[1].bytes_delta, 0);
    let d4 = dump(&mut g, 4, 8);
    assert_eq!(d4[0].trend, Some(Trend::Growing));
    assert_eq!(d4[0].blocks_delta, 1);
    // A group absent from a dump starts over when it comes back.
    g.observe([(&leak, 4, 40)]);
    let d6 = g.observe([(&leak, 4, 40), (&cache, 8, 80)]);
    assert_eq!(d6[1].bytes_delta, 80);
}
