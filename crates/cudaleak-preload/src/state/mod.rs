//! The process-wide tracked state: live blocks, contexts and VMM
//! (`tracker`), live bytes and their peak (`live_bytes`), the timeline's
//! sources (`sampler`), the last events (`event_ring`), out-of-memory
//! snapshots (`oom`), CUDA graphs' memory nodes (`graphs`).
//!
//! 1. the peak's count, the timeline's sources, the last events: `live_bytes`, `sampler`, `event_ring`
//! 2. the tracked state: `tracker`
//! 3. out-of-memory snapshots, graph memory: `oom`, `graphs`

pub mod event_ring;
pub mod graphs;
pub mod live_bytes;
pub mod oom;
pub mod sampler;
pub mod tracker;
