//! The stacks of a group: runtime attribution of a driver-level trace
//! (a statically linked runtime) and the merged native and Python stack.

use crate::record::python::{eval_groups, PyRawFrame, PythonFrame};
pub(super) use crate::record::runtime_entries::runtime_entry;
use crate::report::{MergedFrame, NativeFrame};
use std::ops::Range;

pub(super) fn is_eval_loop(function: Option<&str>) -> bool {
    function.is_some_and(|n| n == "_PyEval_EvalFrameDefault" || n == "PyEval_EvalFrameEx")
}

/// Ranges of `frames` that are one physical frame each (one address,
/// possibly several inlined functions). Generic over how a frame is held:
/// a report's [`NativeFrame`], or an id into a dump's [`FrameTable`](crate::symbolize::frame_table::FrameTable), so
/// that grouping and the written group read the same stack the same way.
pub(super) fn physical_frames<T>(frames: &[T], same_address: impl Fn(&T, &T) -> bool) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=frames.len() {
        if i == frames.len() || !same_address(&frames[i], &frames[start]) {
            out.push(start..i);
            start = i;
        }
    }
    out
}

/// If the stack passes through a runtime entry point (`runtime_of` a frame:
/// the entry point it is, if it makes the traced driver call), returns that
/// entry point and drops it and everything inside it. Frames of the same
/// entry point right after it go too: a wrapper library that defines
/// `cudaMalloc` itself and forwards to the runtime's is the same call.
pub(super) fn attribute_runtime_by<T>(
    native: &mut Vec<T>,
    same_address: impl Fn(&T, &T) -> bool,
    runtime_of: impl Fn(&T) -> Option<&'static str>,
) -> Option<&'static str> {
    let physical = physical_frames(native, same_address);
    // Only the innermost few physical frames: the runtime is directly below.
    let (rt, at) = physical
        .iter()
        .take(8)
        .enumerate()
        .find_map(|(i, pf)| native[pf.clone()].iter().find_map(&runtime_of).map(|rt| (rt, i)))?;
    let mut end = physical[at].end;
    for pf in &physical[at + 1..] {
        if !native[pf.clone()].iter().any(|f| runtime_of(f) == Some(rt)) {
            break;
        }
        end = pf.end;
    }
    native.drain(..end);
    Some(rt)
}

pub(super) fn attribute_runtime(api: &str, native: &mut Vec<NativeFrame>) -> Option<&'static str> {
    attribute_runtime_by(
        native,
        |a, b| a.address == b.address,
        |f| runtime_entry(api, f.function.as_deref()),
    )
}

/// One frame of a merged stack: an index into the native or the Python
/// frames.
#[derive(Clone, Copy, Debug)]
pub(super) enum MergedRef {
    Native(usize),
    Python(usize),
}

/// The order of [`merge_stacks`], as indices (see [`physical_frames`] for
/// why it is generic).
pub(super) fn merged_order<T>(
    native: &[T],
    python_raw: &[PyRawFrame],
    same_address: impl Fn(&T, &T) -> bool,
    eval_loop: impl Fn(&T) -> bool,
) -> Vec<MergedRef> {
    let groups = eval_groups(python_raw);
    let mut next_group = 0;
    let mut out = Vec::with_capacity(native.len() + python_raw.len());
    for pf in physical_frames(native, same_address) {
        if next_group < groups.len() && native[pf.clone()].iter().any(&eval_loop) {
            out.extend(groups[next_group].clone().map(MergedRef::Python));
            next_group += 1;
        } else {
            out.extend(pf.map(MergedRef::Native));
        }
    }
    for g in &groups[next_group..] {
        out.extend(g.clone().map(MergedRef::Python));
    }
    out
}

/// Puts Python frames in the place of the interpreter's eval-loop frames:
/// the k-th `_PyEval_EvalFrameDefault` physical frame (innermost first)
/// becomes the k-th group of Python frames (see [`eval_groups`]). Python
/// groups left over (native unwinding stopped early) go at the end.
pub fn merge_stacks(
    native: &[NativeFrame],
    python_raw: &[PyRawFrame],
    python: &[PythonFrame],
) -> Vec<MergedFrame> {
    merged_order(
        native,
        python_raw,
        |a, b| a.address == b.address,
        |f| is_eval_loop(f.function.as_deref()),
    )
    .into_iter()
    .map(|m| match m {
        MergedRef::Native(i) => MergedFrame::Native(native[i].clone()),
        MergedRef::Python(i) => MergedFrame::Python(python[i].clone()),
    })
    .collect()
}
