//! A dump's groups before they are written: what a group is made of, its
//! summary (key digest, counts, verdict, label), suppression verdicts per
//! frame name, and the order of the lists.

use super::merge::{attribute_runtime, merge_stacks};
use super::EXAMPLES_PER_GROUP;
use crate::record::depot::TraceRef;
use crate::record::python::PythonFrame;
use crate::record::{MemoryKind, TraceId};
use crate::report::group_key::{FrameDigest, KeyDigest, KeyFrameRef};
use crate::report::render::stack_label;
use crate::report::suppress::{Matcher, Suppressions};
use crate::report::{BlockExample, Group, NativeFrame, RawStack};
use crate::symbolize::frame_table::{FrameTable, NativeId, PythonId, StrId};
use std::cmp::Ordering;
use std::collections::HashMap;

/// The api of a group whose trace is not in the depot.
pub(super) const UNKNOWN_API: &str = "unknown";

/// Adds group `g`, made by another raw stack with the same key, to `m`:
/// counts, examples, and both raw stacks in `raw_stacks`, largest first;
/// the group shows the largest one's stacks.
pub(super) fn add_raw_stack(m: &mut Group, g: Group) {
    if m.raw_stacks.is_empty() {
        m.raw_stacks.push(RawStack {
            blocks: m.blocks,
            bytes: m.bytes,
            native_stack: m.native_stack.clone(),
        });
    }
    let largest = (m.raw_stacks[0].bytes, m.raw_stacks[0].blocks);
    if (g.bytes, g.blocks) > largest {
        m.native_stack = g.native_stack.clone();
        m.merged_stack = g.merged_stack;
        m.python_stack = g.python_stack;
    }
    m.raw_stacks.push(RawStack {
        blocks: g.blocks,
        bytes: g.bytes,
        native_stack: g.native_stack,
    });
    // Stable: of equal ones, the first seen stays first.
    m.raw_stacks
        .sort_by_key(|r| std::cmp::Reverse((r.bytes, r.blocks)));
    m.blocks += g.blocks;
    m.bytes += g.bytes;
    m.pytorch_cache_segment |= g.pytorch_cache_segment;
    let room = EXAMPLES_PER_GROUP.saturating_sub(m.examples.len());
    m.examples.extend(g.examples.into_iter().take(room));
}

pub(super) struct Acc {
    pub(super) blocks: u64,
    pub(super) bytes: u64,
    pub(super) examples: Vec<BlockExample>,
}

/// The group of trace `t`, from its symbolized native and resolved Python
/// frames.
pub(super) fn build_group(
    t: &TraceRef,
    acc: Acc,
    mut native: Vec<NativeFrame>,
    python: Vec<PythonFrame>,
) -> Group {
    let mut api = t.api.name();
    if !t.api.is_runtime() {
        if let Some(rt) = attribute_runtime(api, &mut native) {
            api = rt;
        }
    }
    let merged_stack = if python.is_empty() {
        Vec::new()
    } else {
        merge_stacks(&native, t.python, &python)
    };
    let pytorch_cache_segment = native
        .iter()
        .any(|f| f.function.as_deref().is_some_and(is_pytorch_caching_allocator));
    Group {
        merged_stack,
        examples: acc.examples,
        pytorch_cache_segment,
        ..Group::new(acc.blocks, acc.bytes, api, t.kind, native, python)
    }
}

/// A function of PyTorch's default CUDA caching allocator (demangled, or
/// mangled where demangling failed): a block allocated through it is a
/// segment the allocator reserved, which it carves into tensors. The
/// `backend:cudaMallocAsync` allocator lives in the same namespace
/// (`c10::cuda::CUDACachingAllocator::CudaMallocAsync`) but makes one
/// allocation per tensor: not a cache.
pub fn is_pytorch_caching_allocator(function: &str) -> bool {
    let caching = function.contains("c10::cuda::CUDACachingAllocator")
        || function.contains("3c104cuda20CUDACachingAllocator");
    caching && !function.contains("CudaMallocAsync")
}

/// The group of blocks whose trace is not in the depot.
pub(super) fn unknown_group(acc: Acc) -> Group {
    Group {
        examples: acc.examples,
        ..Group::new(
            acc.blocks,
            acc.bytes,
            UNKNOWN_API,
            MemoryKind::Device,
            vec![],
            vec![],
        )
    }
}

/// One trace's live blocks in a dump, and the group it joined.
#[derive(Clone, Copy)]
pub(super) struct TraceCount {
    pub(super) id: TraceId,
    /// index into the dump's groups
    pub(super) group: u32,
    pub(super) blocks: u64,
    pub(super) bytes: u64,
    /// of `blocks` and `bytes`, those whose context was destroyed
    pub(super) torn_down_blocks: u64,
    pub(super) torn_down_bytes: u64,
}

/// The frame that `render::top_frame_label` names a group by (the sort's
/// last tie-breaker): its first Python frame, else its first native frame
/// with a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Label {
    Python(PythonId),
    Native(NativeId),
    Unknown,
}

/// What grouping, suppression and sorting read of one trace's group, as
/// [`build_group`] would make it.
#[derive(Clone, Copy)]
pub(super) struct TraceFacts {
    pub(super) digest: KeyDigest,
    pub(super) api: &'static str,
    pub(super) kind: MemoryKind,
    pub(super) label: Label,
    pub(super) verdict: Option<usize>,
}

/// The facts of traces already summarized over one frame table, for the
/// next summary over it (`Assembler::summarize`).
pub(super) enum FactsMemo {
    Off,
    Remember(Vec<(TraceId, TraceFacts)>),
    Reuse(Vec<(TraceId, TraceFacts)>),
}

/// One group of a dump, before it is written (if it is): what [`Group`]
/// would hold, less its frames, examples and raw stacks. About 100 bytes.
pub(super) struct GroupSummary {
    pub(super) digest: KeyDigest,
    pub(super) blocks: u64,
    pub(super) bytes: u64,
    /// of the group's first trace, as [`add_raw_stack`] keeps them
    pub(super) api: &'static str,
    pub(super) kind: MemoryKind,
    /// (bytes, blocks) of the raw stack the group shows: its largest, the
    /// first seen of equal ones (as [`add_raw_stack`] picks it)
    pub(super) largest: (u64, u64),
    /// of the raw stack the group shows
    pub(super) label: Label,
    /// the suppression rule that matches the raw stack the group shows
    pub(super) verdict: Option<usize>,
}

/// Suppression verdicts of one dump, one per distinct frame name: what
/// [`Matcher::match_group`] gives, read from the names of a [`FrameTable`].
pub(super) struct NameVerdicts<'s> {
    /// none without rules
    pub(super) matcher: Option<Matcher<'s>>,
    /// by string of the table; `None`: not asked yet
    pub(super) by_name: Vec<Option<Option<usize>>>,
}

impl<'s> NameVerdicts<'s> {
    pub(super) fn new(suppressions: &'s Suppressions) -> NameVerdicts<'s> {
        NameVerdicts {
            matcher: (!suppressions.is_empty()).then(|| suppressions.matcher()),
            by_name: Vec::new(),
        }
    }

    /// The first rule that matches `name`: the verdict on a group with
    /// that one name (`Matcher` matches groups, caching per name).
    pub(super) fn of_name(&mut self, table: &FrameTable, name: StrId) -> Option<usize> {
        let matcher = self.matcher.as_mut()?;
        let i = name as usize;
        if self.by_name.len() <= i {
            self.by_name.resize(i + 1, None);
        }
        if let Some(v) = self.by_name[i] {
            return v;
        }
        let v = matcher.match_name(table.string(name));
        self.by_name[i] = Some(v);
        v
    }

    pub(super) fn has_rules(&self) -> bool {
        self.matcher.is_some()
    }

    /// The first rule that matches a frame of the stack, as
    /// [`Matcher::match_group`]: native frames (function, file, module),
    /// then Python frames (function, file), innermost first.
    pub(super) fn of_stack(
        &mut self,
        table: &FrameTable,
        native: &[NativeId],
        python: &[PythonId],
    ) -> Option<usize> {
        self.matcher.as_ref()?;
        let native_names = native
            .iter()
            .flat_map(|&f| table.native_names(f).into_iter().flatten());
        let python_names = python.iter().flat_map(|&p| table.python_names(p));
        native_names
            .chain(python_names)
            .find_map(|name| self.of_name(table, name))
    }
}

/// The text `render::top_frame_label` gives a group named by `label`
/// (it reads that one frame).
pub(super) fn label_text(table: &FrameTable, label: Label) -> String {
    match label {
        Label::Python(p) => stack_label(Some(&table.python_frame_owned(p)), &[]),
        Label::Native(f) => stack_label(None, std::slice::from_ref(&table.native_frame(f))),
        Label::Unknown => stack_label(None, &[]),
    }
}

/// Each group's label as a rank: groups compare by rank as by label text,
/// and each distinct label's text is made once.
pub(super) fn label_ranks(table: &FrameTable, groups: &[GroupSummary]) -> Vec<u32> {
    let mut text: HashMap<Label, String> = HashMap::new();
    for g in groups {
        text.entry(g.label).or_insert_with(|| label_text(table, g.label));
    }
    let mut by_text: Vec<(&String, Label)> = text.iter().map(|(l, t)| (t, *l)).collect();
    by_text.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut rank: HashMap<Label, u32> = HashMap::with_capacity(by_text.len());
    let mut r = 0u32;
    for (i, (t, l)) in by_text.iter().enumerate() {
        if i > 0 && by_text[i - 1].0 != *t {
            r += 1;
        }
        rank.insert(*l, r);
    }
    groups.iter().map(|g| rank[&g.label]).collect()
}

/// The order of a dump's lists: bytes, then blocks (both largest first),
/// API, and the label's rank ([`label_ranks`]).
pub(super) fn group_order(groups: &[GroupSummary], ranks: &[u32], a: u32, b: u32) -> Ordering {
    let (x, y) = (&groups[a as usize], &groups[b as usize]);
    y.bytes
        .cmp(&x.bytes)
        .then(y.blocks.cmp(&x.blocks))
        .then_with(|| x.api.cmp(y.api))
        .then_with(|| ranks[a as usize].cmp(&ranks[b as usize]))
}

/// Each distinct frame's [`FrameDigest`] of one dump, by its id in the
/// dump's [`FrameTable`]: computed the first time a trace holds it.
#[derive(Default)]
pub(super) struct FrameDigests {
    pub(super) native: Vec<Option<FrameDigest>>,
    pub(super) python: Vec<Option<FrameDigest>>,
}

impl FrameDigests {
    pub(super) fn native(&mut self, table: &FrameTable, f: NativeId) -> FrameDigest {
        Self::cached(&mut self.native, f as usize, || {
            FrameDigest::of(KeyFrameRef::Native {
                function: table.function(f),
                file: table.file(f),
                line: table.line(f),
                module: table.module(f),
            })
        })
    }

    pub(super) fn python(&mut self, table: &FrameTable, p: PythonId) -> FrameDigest {
        Self::cached(&mut self.python, p as usize, || {
            FrameDigest::of(KeyFrameRef::Python {
                function: table.python_function(p),
                file: table.python_file(p),
                line: table.python_line(p),
            })
        })
    }

    pub(super) fn cached(
        v: &mut Vec<Option<FrameDigest>>,
        i: usize,
        make: impl FnOnce() -> FrameDigest,
    ) -> FrameDigest {
        if v.len() <= i {
            v.resize(i + 1, None);
        }
        *v[i].get_or_insert_with(make)
    }
}
