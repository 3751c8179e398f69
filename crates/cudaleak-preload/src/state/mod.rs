//! The process-wide tracked state: live blocks, contexts and VMM
//! (`tracker`), the timeline's sources (`sampler`), the last events
//! (`event_ring`), out-of-memory snapshots (`oom`).

pub mod event_ring;
pub mod oom;
pub mod sampler;
pub mod tracker;
