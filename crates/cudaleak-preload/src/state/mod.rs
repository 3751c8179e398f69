//! The process-wide tracked state: live blocks, contexts and VMM
//! (`tracker`), the timeline's sources (`sampler`), the last events
//! (`event_ring`), out-of-memory snapshots (`oom`).
//!
//! 1. the timeline's sources, the last events: `sampler`, `event_ring`
//! 2. the tracked state: `tracker`
//! 3. out-of-memory snapshots: `oom`

pub mod event_ring;
pub mod oom;
pub mod sampler;
pub mod tracker;
