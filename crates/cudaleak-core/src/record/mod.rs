//! What the hooks record into. Bottom up:
//!
//! 1. line tables, one shard's table of blocks, module images, the runtime's allocation functions: `linetable`, `block_table`, `module_image`, `runtime_entries`
//! 2. the live map: `live_map`
//! 3. Python code copies: `python`
//! 4. interned traces: `depot`
//! 5. live bytes per call site: `site_counters`
//!
//! This file: what the live map stores for each block, in 16 bytes.
//!
//! The budget is 64 bytes per live block including the hash table's own
//! overhead (docs/performance.md). The shard's table (`block_table.rs`)
//! keeps 24-byte slots (8-byte address + this 16-byte value) at a load
//! factor between 3/8 and 3/4, so an entry costs at most 24 / (3/8) = 64
//! bytes. Everything that is the same for all blocks of one
//! call stack (API, memory kind, native and Python frames) lives once in the
//! interned trace (`depot.rs`), not here.

pub mod block_table;
pub mod depot;
pub mod linetable;
pub mod live_map;
pub mod module_image;
pub mod python;
pub mod runtime_entries;
pub mod site_counters;

use serde::{Deserialize, Serialize};

/// The memory kinds of the report schema (`$defs.group.memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum MemoryKind {
    Device = 0,
    Host = 1,
    Managed = 2,
    Physical = 3,
    Reservation = 4,
    Array = 5,
    /// extension: memory another process allocated and this one opened
    /// (cuIpcOpenMemHandle_v2, cuMemImportFromShareableHandle)
    Imported = 6,
    /// extension: a stream-ordered memory pool (cuMemPoolCreate) itself
    Pool = 7,
    /// extension: host memory the program allocated and pinned
    /// (cuMemHostRegister, cudaHostRegister); the pinning is what leaks
    Registered = 8,
    /// extension: a multicast object (cuMulticastCreate) itself; the
    /// memory bound to it is physical memory of its own
    Multicast = 9,
    /// extension: device memory of a CUDA graph's memory-alloc node (a node
    /// added with cuGraphAddMemAllocNode or cuGraphAddNode, or made by a
    /// stream-ordered allocation while its stream was captured), live from
    /// the launch that ran the node until a free node or a free call
    Graph = 10,
    /// extension: a loaded module or library (cuModuleLoad*, cuLibraryLoad*)
    /// until it is unloaded; its bytes are the device globals of its image
    /// as far as they can be read (0 when they cannot), an estimate no
    /// driver call confirms, so not counted in live bytes. Reported, never
    /// a leak for the gate: programs keep their modules loaded.
    Module = 11,
}

impl MemoryKind {
    pub const ALL: [MemoryKind; 12] = [
        MemoryKind::Device,
        MemoryKind::Host,
        MemoryKind::Managed,
        MemoryKind::Physical,
        MemoryKind::Reservation,
        MemoryKind::Array,
        MemoryKind::Imported,
        MemoryKind::Pool,
        MemoryKind::Registered,
        MemoryKind::Multicast,
        MemoryKind::Graph,
        MemoryKind::Module,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Device => "device",
            MemoryKind::Host => "host",
            MemoryKind::Managed => "managed",
            MemoryKind::Physical => "physical",
            MemoryKind::Reservation => "reservation",
            MemoryKind::Array => "array",
            MemoryKind::Imported => "imported",
            MemoryKind::Pool => "pool",
            MemoryKind::Registered => "registered",
            MemoryKind::Multicast => "multicast",
            MemoryKind::Graph => "graph",
            MemoryKind::Module => "module",
        }
    }

    /// Whether the kind's bytes are memory this process allocated, counted
    /// in `live_bytes`: not reserved address space, not memory another
    /// process allocated (imported), not a pool or multicast handle, not
    /// host memory the program allocated itself and only pinned
    /// (registered), not a loaded module's estimated globals.
    pub fn counts_in_live_bytes(self) -> bool {
        !matches!(
            self,
            MemoryKind::Reservation
                | MemoryKind::Imported
                | MemoryKind::Pool
                | MemoryKind::Registered
                | MemoryKind::Multicast
                | MemoryKind::Module
        )
    }

    /// The kind a report's `memory` field gives for this one: the shared
    /// schema's values are kept as they are; imported memory is device
    /// memory and a pool is reserved memory, with the precise kind in the
    /// `memory_kind` extension. Registered memory is host memory; a
    /// multicast object, like a pool, is reserved memory.
    pub fn shared_kind(self) -> MemoryKind {
        match self {
            MemoryKind::Imported | MemoryKind::Graph | MemoryKind::Module => MemoryKind::Device,
            MemoryKind::Pool | MemoryKind::Multicast => MemoryKind::Reservation,
            MemoryKind::Registered => MemoryKind::Host,
            k => k,
        }
    }

    /// Reserved virtual address space (cuMemAddressReserve): reported as
    /// blocks, but not counted in byte totals, which are memory. PyTorch's
    /// expandable segments reserve the size of the GPU's memory at once.
    pub fn is_address_space(self) -> bool {
        self == MemoryKind::Reservation
    }

    /// Whether a block of this kind left live is a leak for the gate and
    /// the leak counts: a loaded module is reported, but programs keep
    /// their modules loaded for their whole run.
    pub fn is_leak(self) -> bool {
        self != MemoryKind::Module
    }

    pub fn from_u8(v: u8) -> MemoryKind {
        MemoryKind::ALL
            .get(v as usize)
            .copied()
            .unwrap_or(MemoryKind::Device)
    }
}

/// Declares [`Api`] and [`API_NAMES`] from one list, so that they cannot
/// disagree.
macro_rules! api_list {
    ($($name:ident),* $(,)?) => {
        /// The call the program made, for every allocating call cudaleak can
        /// attribute a block to. Reports carry [`Api::name`].
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Api { $($name),* }

        pub const API_NAMES: &[&str] = &[$(stringify!($name)),*];

        impl Api {
            const ALL: &'static [Api] = &[$(Api::$name),*];
        }
    };
}

api_list! {
    // driver
    cuMemAlloc_v2,
    cuMemAllocPitch_v2,
    cuMemAllocManaged,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemAllocHost_v2,
    cuMemHostAlloc,
    cuMemCreate,
    cuMemAddressReserve,
    // runtime
    cudaMalloc,
    cudaMallocAsync,
    cudaMallocAsync_ptsz,
    cudaMallocFromPoolAsync,
    cudaMallocHost,
    cudaHostAlloc,
    cudaMallocManaged,
    cudaMallocPitch,
    cudaMalloc3D,
    cuArrayCreate_v2,
    cuArray3DCreate_v2,
    cuMipmappedArrayCreate,
    cudaMallocArray,
    cudaMalloc3DArray,
    cudaMallocMipmappedArray,
    cuIpcOpenMemHandle_v2,
    cuMemImportFromShareableHandle,
    cuMemPoolCreate,
    // the v1 entry points NVIDIA's driver still hands out by version
    // (cuGetProcAddress), and the allocation kinds hooked with them
    cuMemAlloc,
    cuMemAllocPitch,
    cuMemAllocHost,
    cuArrayCreate,
    cuArray3DCreate,
    cuIpcOpenMemHandle,
    cuMemPoolImportPointer,
    cuMulticastCreate,
    cuImportExternalMemory,
    cuExternalMemoryGetMappedBuffer,
    cuExternalMemoryGetMappedMipmappedArray,
    cuMemHostRegister,
    cuMemHostRegister_v2,
    cudaHostRegister,
    cuMemPoolImportFromShareableHandle,
    cudaMallocFromPoolAsync_ptsz,
    // graph memory nodes: the call that added the node (a stream-ordered
    // allocation captured into a graph keeps its own name)
    cuGraphAddMemAllocNode,
    cuGraphAddNode,
    cuGraphAddNode_v2,
    cudaGraphAddMemAllocNode,
    cudaGraphAddNode,
    // modules and libraries, loaded
    cuModuleLoad,
    cuModuleLoadData,
    cuModuleLoadDataEx,
    cuModuleLoadFatBinary,
    cuLibraryLoadData,
    cuLibraryLoadFromFile,
}

impl Api {
    pub fn name(self) -> &'static str {
        API_NAMES[self as usize]
    }

    pub fn by_name(name: &str) -> Option<Api> {
        API_NAMES.iter().position(|n| *n == name).map(|i| Api::ALL[i])
    }

    /// Whether the call returns a VMM handle (released by cuMemRelease),
    /// not an address.
    pub fn returns_handle(self) -> bool {
        matches!(
            self,
            Api::cuMemCreate | Api::cuMemImportFromShareableHandle | Api::cuMulticastCreate
        )
    }

    pub fn is_runtime(self) -> bool {
        self.name().starts_with("cuda")
    }
}

/// Interned call-stack id (`depot.rs`); 0 means "no stack" (depot full).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TraceId(pub u32);

const SIZE_BITS: u32 = 48;
const SIZE_MASK: u64 = (1 << SIZE_BITS) - 1;
const KIND_BITS: u32 = 4;
/// The largest checkpoint epoch a block can carry (28 bits: a quarter of
/// a billion checkpoints); later epochs are stored as this one.
pub const MAX_EPOCH: u32 = u32::MAX >> KIND_BITS;

/// One live block. 16 bytes; the key (address or handle) is stored by the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Block {
    /// size (48 bits, up to 256 TiB) | context slot (8 bits) | device + 1 (8 bits)
    packed: u64,
    pub trace: TraceId,
    /// checkpoint epoch current when the block was allocated
    /// (`cudaleak_checkpoint`; 28 bits) | memory kind (4 bits). The kind is
    /// also in the trace, but a release needs it (which call may release
    /// what, and whether the bytes count) and reading it here spares a walk
    /// into the trace depot, cold memory in a busy program.
    epoch_kind: u32,
}

impl Block {
    #[inline]
    pub fn new(
        size: u64,
        trace: TraceId,
        kind: MemoryKind,
        context_slot: u8,
        device: Option<u8>,
        epoch: u32,
    ) -> Block {
        let dev = device.map_or(0u64, |d| d.saturating_add(1) as u64);
        Block {
            packed: (size.min(SIZE_MASK)) | ((context_slot as u64) << 48) | (dev << 56),
            trace,
            epoch_kind: epoch.min(MAX_EPOCH) << KIND_BITS | kind as u32,
        }
    }

    pub fn kind(&self) -> MemoryKind {
        MemoryKind::from_u8((self.epoch_kind & ((1 << KIND_BITS) - 1)) as u8)
    }

    pub fn epoch(&self) -> u32 {
        self.epoch_kind >> KIND_BITS
    }

    pub fn size(&self) -> u64 {
        self.packed & SIZE_MASK
    }

    /// Slot in the preload crate's context table; 0 when the block belongs
    /// to no context (VMM handles, reservations) or the context is unknown.
    pub fn context_slot(&self) -> u8 {
        (self.packed >> 48) as u8
    }

    pub fn device(&self) -> Option<u32> {
        match (self.packed >> 56) as u8 {
            0 => None,
            d => Some(d as u32 - 1),
        }
    }

    pub fn with_trace(mut self, trace: TraceId) -> Block {
        self.trace = trace;
        self
    }

    /// The block as two words, for tables that store it in atomics
    /// (`block_table.rs`); [`Block::from_words`] reads them back.
    pub fn to_words(self) -> (u64, u64) {
        (self.packed, self.trace.0 as u64 | (self.epoch_kind as u64) << 32)
    }

    pub fn from_words(packed: u64, trace_epoch: u64) -> Block {
        Block {
            packed,
            trace: TraceId(trace_epoch as u32),
            epoch_kind: (trace_epoch >> 32) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Block>(), 16);
        assert_eq!(std::mem::size_of::<(u64, Block)>(), 24);
    }

    #[test]
    fn packing_round_trips() {
        let b = Block::new(123 << 30, TraceId(7), MemoryKind::Array, 3, Some(2), 9);
        assert_eq!(b.size(), 123 << 30);
        assert_eq!(b.context_slot(), 3);
        assert_eq!(b.device(), Some(2));
        assert_eq!(b.epoch(), 9);
        assert_eq!(b.kind(), MemoryKind::Array);
        let b = Block::new(1, TraceId(1), MemoryKind::Device, 0, None, u32::MAX);
        assert_eq!(b.device(), None);
        assert_eq!((b.kind(), b.epoch()), (MemoryKind::Device, MAX_EPOCH));
        for kind in MemoryKind::ALL {
            assert_eq!(Block::new(1, TraceId(1), kind, 0, None, MAX_EPOCH).kind(), kind);
        }
    }

    #[test]
    fn api_names_round_trip() {
        for (i, n) in API_NAMES.iter().enumerate() {
            assert_eq!(Api::by_name(n).map(|a| a as usize), Some(i));
            assert_eq!(Api::by_name(n).unwrap().name(), *n);
        }
        assert!(Api::cudaMalloc.is_runtime());
        assert!(!Api::cuMemCreate.is_runtime());
        assert_eq!(Api::by_name("cuMemFree_v2"), None);
    }
}
