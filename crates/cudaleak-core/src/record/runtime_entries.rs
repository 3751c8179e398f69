//! The runtime's allocation functions and the driver calls each makes:
//! how a block recorded at the driver is named by the runtime call the
//! program made. The report's groups (`assemble`) attribute with it, and
//! the symbolizer names these functions in an object unloaded before the
//! dump, so that a runtime that was `dlclose`d still names its blocks.

/// Runtime entry points and the driver calls they make: a driver-level
/// trace whose stack passes through one of these functions is attributed
/// to it. This is how the runtime's allocations get their names: no runtime
/// allocation is hooked (recorded once, at the driver), whether the
/// runtime is a shared library or linked into the program. (The runtime's
/// pool, import and external-memory calls, never hooked, are named by
/// their driver calls.) The v1 driver
/// variants are there for a runtime that asks for them by version.
pub const RUNTIME_ATTRIBUTION: &[(&str, &[&str])] = &[
    ("cudaMalloc", &["cuMemAlloc_v2", "cuMemAlloc"]),
    (
        "cudaMallocPitch",
        &[
            "cuMemAllocPitch_v2",
            "cuMemAllocPitch",
            "cuMemAlloc_v2",
            "cuMemAlloc",
        ],
    ),
    (
        "cudaMalloc3D",
        &[
            "cuMemAllocPitch_v2",
            "cuMemAllocPitch",
            "cuMemAlloc_v2",
            "cuMemAlloc",
        ],
    ),
    ("cudaMallocManaged", &["cuMemAllocManaged"]),
    (
        "cudaMallocHost",
        &["cuMemAllocHost_v2", "cuMemHostAlloc", "cuMemAllocHost"],
    ),
    (
        "cudaHostAlloc",
        &["cuMemHostAlloc", "cuMemAllocHost_v2", "cuMemAllocHost"],
    ),
    (
        "cudaMallocAsync",
        &[
            "cuMemAllocAsync",
            "cuMemAllocAsync_ptsz",
            "cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync_ptsz",
        ],
    ),
    (
        "cudaMallocAsync_ptsz",
        &[
            "cuMemAllocAsync_ptsz",
            "cuMemAllocAsync",
            "cuMemAllocFromPoolAsync_ptsz",
            "cuMemAllocFromPoolAsync",
        ],
    ),
    (
        "cudaMallocFromPoolAsync",
        &["cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"],
    ),
    (
        "cudaMallocFromPoolAsync_ptsz",
        &["cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync"],
    ),
    ("cudaHostRegister", &["cuMemHostRegister_v2", "cuMemHostRegister"]),
    (
        "cudaMallocArray",
        &[
            "cuArrayCreate_v2",
            "cuArray3DCreate_v2",
            "cuArrayCreate",
            "cuArray3DCreate",
        ],
    ),
    (
        "cudaMalloc3DArray",
        &[
            "cuArray3DCreate_v2",
            "cuArrayCreate_v2",
            "cuArray3DCreate",
            "cuArrayCreate",
        ],
    ),
    ("cudaMallocMipmappedArray", &["cuMipmappedArrayCreate"]),
    ("cudaGraphAddMemAllocNode", &["cuGraphAddMemAllocNode"]),
    ("cudaGraphAddNode", &["cuGraphAddNode", "cuGraphAddNode_v2"]),
    ("cudaGraphAddNode_v2", &["cuGraphAddNode_v2", "cuGraphAddNode"]),
    (
        "cudaIpcOpenMemHandle",
        &["cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"],
    ),
];

/// The runtime entry point named `function` if it makes driver call `api`.
pub fn runtime_entry(api: &str, function: Option<&str>) -> Option<&'static str> {
    let function = function?;
    RUNTIME_ATTRIBUTION
        .iter()
        .find(|(rt, drivers)| *rt == function && drivers.contains(&api))
        .map(|(rt, _)| *rt)
}
