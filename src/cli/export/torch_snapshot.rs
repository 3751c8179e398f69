//! `--format torch-snapshot`: the pickle `torch.cuda.memory._snapshot()`
//! returns and `torch.cuda.memory._dump_snapshot` writes, which PyTorch's
//! viewers read (`python -m torch.cuda._memory_viz`, the page at
//! pytorch.org/memory_viz). Fields as `torch/cuda/memory.py` documents
//! them for `_snapshot`:
//!
//! - `segments`: one per leaked block this report knows the address of
//!   (a group's `examples`: cudaleak records each cudaMalloc, which is
//!   what PyTorch calls a segment), each holding one `active_allocated`
//!   block with the group's frames; the rest of a group's blocks, whose
//!   addresses the report does not keep, as one more segment at an
//!   address above every real one, so that sizes add up to the leaked
//!   bytes exactly. Device memory only (not host or reserved memory).
//! - `device_traces`: per device, the trace entries. With
//!   `CUDALEAK_TRACE=N`, the report's last N allocation events
//!   (`allocation_trace`): `alloc`, `free_completed` and `oom` (each failed
//!   call), with address, size, time and frames; without it, an `oom`
//!   action for each out-of-memory episode (`oom_events`), with
//!   `device_free` when it is known.
//!
//! With several processes (a directory of ranks), each process's devices
//! become devices of their own, numbered in process order; stderr says
//! which is which.

use super::pickle::Value;
use super::{frame_name, process_label, Process};
use cudaleak_core::record::MemoryKind;
use cudaleak_core::report::render::stack_of;
use cudaleak_core::report::Group;
use std::collections::BTreeMap;

fn frames(g: &Group) -> Value {
    Value::List(
        stack_of(g)
            .iter()
            .map(|f| {
                let n = frame_name(f);
                Value::dict(vec![
                    ("filename", Value::str(n.file.unwrap_or_else(|| "??".into()))),
                    ("line", Value::int(n.line.unwrap_or(0))),
                    ("name", Value::str(n.name)),
                ])
            })
            .collect(),
    )
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

/// Memory a CUDA device holds for the process.
fn is_device_memory(g: &Group) -> bool {
    g.memory != MemoryKind::Host && g.kind().counts_in_live_bytes()
}

/// PyTorch's caching allocator calls segments under 1 MiB "small".
/// The driver's free memory when the failed call of `size` bytes at
/// `timestamp_us` (an event of the allocation trace) failed: its
/// episode's, the first failure and those within one second after it,
/// as the report's `oom_events` or its `oom` give it; 0 when unknown
/// (PyTorch requires the field, and printed "0.0B free" for every one).
fn device_free_at(r: &cudaleak_core::report::Report, timestamp_us: i64, size: u64) -> u64 {
    // The trace's clock ticks coarsely (a few ms): a failure may read a
    // little earlier than its episode's first.
    const SLACK_MS: i64 = 50;
    let ms = timestamp_us / 1000;
    let within = |start: i64| ms >= start - SLACK_MS && ms <= start + 1000 + SLACK_MS;
    r.oom_events
        .iter()
        .rev()
        .find(|e| e.requested_bytes == size && within(e.timestamp_ms) && e.device_free_bytes.is_some())
        .and_then(|e| e.device_free_bytes)
        .or_else(|| {
            r.oom
                .as_ref()
                .filter(|o| o.requested_bytes == size && within(o.timestamp_ms))
                .and_then(|o| o.device_free_bytes)
        })
        .unwrap_or(0)
}

fn segment(device: u32, address: u64, size: u64, frames: Value) -> Value {
    let block = Value::dict(vec![
        ("address", Value::int(address)),
        ("size", Value::int(size)),
        ("requested_size", Value::int(size)),
        ("state", Value::str("active_allocated")),
        ("frames", frames),
    ]);
    Value::dict(vec![
        ("device", Value::int(device)),
        ("address", Value::int(address)),
        ("total_size", Value::int(size)),
        ("allocated_size", Value::int(size)),
        ("active_size", Value::int(size)),
        ("requested_size", Value::int(size)),
        ("stream", Value::int(0)),
        (
            "segment_type",
            Value::str(if size < (1 << 20) { "small" } else { "large" }),
        ),
        (
            "segment_pool_id",
            Value::Tuple(vec![Value::int(0), Value::int(0)]),
        ),
        ("is_expandable", Value::Bool(false)),
        ("frames", Value::List(Vec::new())),
        ("blocks", Value::List(vec![block])),
    ])
}

pub fn snapshot(processes: &[Process]) -> Vec<u8> {
    // (process index, its device) -> the snapshot's device number
    let mut devices: BTreeMap<(usize, u32), u32> = BTreeMap::new();
    let device_of = |p: usize, d: u32, devices: &mut BTreeMap<(usize, u32), u32>| -> u32 {
        if processes.len() == 1 {
            devices.insert((p, d), d);
            return d;
        }
        let next = devices.len() as u32;
        *devices.entry((p, d)).or_insert(next)
    };
    let mut segments = Vec::new();
    let mut traces: BTreeMap<u32, Vec<Value>> = BTreeMap::new();
    for (i, (_, r)) in processes.iter().enumerate() {
        // Blocks whose address is not known go above every known one.
        let mut next_free = r
            .leaks
            .iter()
            .flat_map(|g| &g.examples)
            .filter_map(|e| parse_hex(&e.address).map(|a| a.saturating_add(e.size)))
            .max()
            .unwrap_or(0);
        for g in r.leaks.iter().filter(|g| is_device_memory(g)) {
            let mut known_bytes = 0u64;
            let mut known_blocks = 0u64;
            let mut device = 0;
            for e in &g.examples {
                let Some(address) = parse_hex(&e.address) else {
                    continue;
                };
                device = e.device.unwrap_or(0);
                let d = device_of(i, device, &mut devices);
                segments.push(segment(d, address, e.size, frames(g)));
                known_bytes = known_bytes.saturating_add(e.size);
                known_blocks += 1;
            }
            let rest = g.bytes.saturating_sub(known_bytes);
            if g.blocks > known_blocks && rest > 0 {
                // Aligned as PyTorch's segments are (2 MiB for large ones).
                let address = next_free.div_ceil(2 << 20).saturating_mul(2 << 20).max(2 << 20);
                let d = device_of(i, device, &mut devices);
                segments.push(segment(d, address, rest, frames(g)));
                next_free = address.saturating_add(rest);
            }
        }
        if let Some(t) = &r.allocation_trace {
            // CUDALEAK_TRACE: the ring's events, each failed call an `oom`.
            for e in &t.events {
                let site = e.site.and_then(|i| t.sites.get(i as usize));
                if site.is_some_and(|g| !is_device_memory(g)) {
                    continue;
                }
                let action = match e.action.as_str() {
                    "alloc" => "alloc",
                    "free" => "free_completed",
                    "oom" => "oom",
                    _ => continue,
                };
                let d = device_of(i, e.device.unwrap_or(0), &mut devices);
                let mut entry = vec![
                    ("action", Value::str(action)),
                    ("addr", Value::int(parse_hex(&e.address).unwrap_or(0))),
                    ("size", Value::int(e.size)),
                    ("stream", Value::int(0)),
                    ("time_us", Value::int(e.timestamp_us)),
                    ("frames", site.map_or(Value::List(Vec::new()), frames)),
                ];
                if action == "oom" {
                    let free = device_free_at(r, e.timestamp_us, e.size);
                    entry.push(("device_free", Value::int(free)));
                }
                traces.entry(d).or_default().push(Value::dict(entry));
            }
            continue;
        }
        for e in &r.oom_events {
            let d = device_of(i, e.device.unwrap_or(0), &mut devices);
            let free = e
                .device_free_bytes
                .or_else(|| {
                    r.oom
                        .as_ref()
                        .filter(|o| o.timestamp_ms == e.timestamp_ms)
                        .and_then(|o| o.device_free_bytes)
                })
                .unwrap_or(0);
            traces.entry(d).or_default().push(Value::dict(vec![
                ("action", Value::str("oom")),
                ("addr", Value::int(0)),
                ("size", Value::int(e.requested_bytes)),
                ("stream", Value::int(0)),
                ("time_us", Value::int(e.timestamp_ms.saturating_mul(1000))),
                ("device_free", Value::int(free)),
                ("frames", Value::List(Vec::new())),
            ]));
        }
    }
    if processes.len() > 1 {
        for ((p, d), n) in &devices {
            eprintln!(
                "cudaleak: snapshot device {n} is device {d} of {}",
                cudaleak_core::report::render::escape(&process_label(&processes[*p].1))
            );
        }
    }
    let count = devices.values().max().map_or(1, |m| m + 1);
    let device_traces = (0..count)
        .map(|d| Value::List(traces.remove(&d).unwrap_or_default()))
        .collect();
    super::pickle::dumps(&Value::dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(device_traces)),
    ]))
}
