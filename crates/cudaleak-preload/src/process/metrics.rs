//! The metrics file (`CUDALEAK_METRICS_DIR`): the dumper thread rewrites
//! `cudaleak.<host>[.r<rank>].<pid>.prom` every `CUDALEAK_METRICS_INTERVAL`
//! from the per-call-site counters the hooks keep anyway
//! ([`tracker::SITES`]), so the allocation path pays nothing for it. The
//! exit report's figures are written last, and the file is removed: a
//! file whose process is gone is one that was killed (`cudaleak
//! metrics-clean` removes those). What the text says is
//! [`cudaleak_core::metrics`]'s.

use crate::base::settings;
use crate::process::dump;
use crate::state::{live_bytes, oom, tracker};
use cudaleak_core::base::lock::FutexMutex;
use cudaleak_core::config::Config;
use cudaleak_core::metrics::{self, DeviceLive, Labels, Sample, SiteInfo};
use cudaleak_core::record::TraceId;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// World-readable: node_exporter, which reads the files, runs as a user
/// of its own. Who may read them is decided by the directory's
/// permissions, which the user chose.
const FILE_MODE: u32 = 0o644;

/// Traces symbolized per write, as candidates for the top sites: the
/// sites are picked among the traces holding the most (several traces can
/// be one site).
const CANDIDATES_PER_SITE: usize = 4;

struct Writer {
    dir: PathBuf,
    labels: Labels,
    /// where the directory stands: unchecked, usable, or warned about
    dir_ok: Option<bool>,
    next: Instant,
    /// the file this process wrote, to remove at exit
    written: Option<PathBuf>,
    /// the process whose last write is done: the dumper thread goes on
    /// for a moment after the exit report, and must not write the file
    /// again
    ended_pid: i64,
}

static WRITER: FutexMutex<Option<Writer>> = FutexMutex::new(None);
const LOCK_TIMEOUT: Duration = Duration::from_millis(200);

fn env_number(env: &impl Fn(&str) -> Option<String>, names: &[&str]) -> Option<i64> {
    names.iter().find_map(|n| env(n)?.trim().parse().ok())
}

/// At load: where the file goes (made absolute: the program may change its
/// directory later) and the labels the environment gives.
pub fn configure(config: &Config, cwd: &Path, env: impl Fn(&str) -> Option<String>) {
    let Some(dir) = &config.metrics_dir else { return };
    let labels = Labels {
        job: config.job.clone().or_else(|| metrics::job_of(&env)),
        rank: settings::rank(),
        local_rank: env_number(
            &env,
            &["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"],
        ),
        host: dump::hostname(),
        pid: 0,
    };
    *WRITER.lock() = Some(Writer {
        dir: cwd.join(dir),
        labels,
        dir_ok: None,
        next: Instant::now(),
        written: None,
        ended_pid: 0,
    });
}

fn this_pid() -> i64 {
    // SAFETY: getpid takes no argument, cannot fail and touches no memory.
    i64::from(unsafe { libc::getpid() })
}

/// Each trace's symbolized site, kept from one write (or publish) to the
/// next: a trace's frames never change. Taken only inside the writer's or
/// the view's lock, both held across a fork.
static SITE_INFO: FutexMutex<std::collections::BTreeMap<u32, SiteInfo>> =
    FutexMutex::new(std::collections::BTreeMap::new());

/// Traces [`SITE_INFO`] keeps at most.
const SITE_INFO_MAX: usize = 4096;

/// Devices held on so far, a bit each ([`device_bit`]): a device keeps
/// its series, at 0, once it holds nothing, so that a graph of it falls
/// to zero instead of ending.
static DEVICES_SEEN: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// The bit of a [`tracker::live_by_device`] key: 0 unknown, 1 to 256 a
/// device, 257 host memory.
fn device_bit(key: u16) -> usize {
    if key == tracker::HOST {
        257
    } else {
        usize::from(key.min(256))
    }
}

fn device_name(bit: usize) -> String {
    match bit {
        0 => "unknown".into(),
        257 => "host".into(),
        d => (d - 1).to_string(),
    }
}

/// The last reading by device, used again when the live map could not be
/// read in time (a thread holding a shard's lock): a series must not
/// lose its device label for one write.
static LAST_BY_DEVICE: FutexMutex<Vec<DeviceLive>> = FutexMutex::new(Vec::new());

/// What each device held on so far holds now.
fn devices_now() -> Vec<DeviceLive> {
    let Some(by) = tracker::live_by_device(LOCK_TIMEOUT) else {
        return LAST_BY_DEVICE
            .lock_for(LOCK_TIMEOUT)
            .map(|l| l.clone())
            .unwrap_or_default();
    };
    for &(key, _, _) in &by {
        let bit = device_bit(key);
        DEVICES_SEEN[bit / 64].fetch_or(1 << (bit % 64), Ordering::Relaxed);
    }
    let mut out = Vec::new();
    for bit in 0..DEVICES_SEEN.len() * 64 {
        if DEVICES_SEEN[bit / 64].load(Ordering::Relaxed) & (1 << (bit % 64)) == 0 {
            continue;
        }
        let (bytes, blocks) = by
            .iter()
            .find(|e| device_bit(e.0) == bit)
            .map_or((0, 0), |e| (e.1, e.2));
        out.push(DeviceLive {
            device: device_name(bit),
            live_bytes: bytes,
            live_blocks: blocks,
        });
    }
    if let Some(mut last) = LAST_BY_DEVICE.lock_for(LOCK_TIMEOUT) {
        last.clone_from(&out);
    }
    out
}

/// The figures now with the `top` call sites holding the most (also the
/// live view's, `live_view.rs`): totals from the site counters, the top
/// sites symbolized as reports name them, the devices from the live
/// blocks.
pub fn sample(labels: &Labels, leaked_bytes: Option<u64>, top: usize) -> Sample {
    // The rank as reports name it now: a launcher may set it after load
    // (it is read again at the first allocation call).
    let labels = Labels {
        rank: settings::rank(),
        pid: this_pid(),
        ..labels.clone()
    };
    let limit = tracker::DEPOT.len();
    let mut live: Vec<(TraceId, u64, u64)> = Vec::new();
    tracker::SITES.for_each_live(limit, |t, bytes, blocks| live.push((t, bytes, blocks)));
    let peak = live_bytes::peak();
    let mut at_peak = std::collections::HashMap::new();
    tracker::SITES.for_each_at_peak(limit, peak, |t, bytes, _| {
        at_peak.insert(t.0, bytes);
    });
    // The devices from the live map now, beside the counters: not after
    // the new sites are symbolized below, which at a process's first
    // write takes long enough for the program to allocate thousands of
    // blocks that the counters read here do not hold.
    let devices = devices_now();
    let (live_bytes_now, live_blocks) = live.iter().fold((0u64, 0u64), |(b, n), &(_, bytes, blocks)| {
        (b + bytes, n + blocks)
    });
    // Candidates: the traces holding the most now, and those that held
    // the most at the peak.
    live.sort_by_key(|e| std::cmp::Reverse(e.1));
    let mut candidates: Vec<u32> = live
        .iter()
        .take(top * CANDIDATES_PER_SITE)
        .map(|e| e.0 .0)
        .collect();
    let mut by_peak: Vec<(u32, u64)> = at_peak.iter().map(|(&t, &b)| (t, b)).collect();
    by_peak.sort_by_key(|e| std::cmp::Reverse(e.1));
    candidates.extend(by_peak.iter().take(top).map(|e| e.0));
    candidates.sort_unstable();
    candidates.dedup();
    let live_of: std::collections::HashMap<u32, (u64, u64)> = live
        .iter()
        .map(|&(t, bytes, blocks)| (t.0, (bytes, blocks)))
        .collect();
    // Traces symbolized before are taken from the cache; the others are
    // symbolized under the dump state's lock, once.
    let mut cache = SITE_INFO.lock_for(LOCK_TIMEOUT);
    let missing: Vec<u32> = match &cache {
        Some(c) => candidates
            .iter()
            .copied()
            .filter(|t| !c.contains_key(t))
            .collect(),
        None => candidates.clone(),
    };
    let fresh: Vec<(u32, SiteInfo)> = if top == 0 || missing.is_empty() {
        Vec::new()
    } else {
        dump::with_state(Some(LOCK_TIMEOUT), |state| {
            let mut out = Vec::new();
            state.with_assembler(|asm| {
                for &t in &missing {
                    if let Some(g) = asm.site_group(TraceId(t)) {
                        out.push((t, SiteInfo::of(g)));
                    }
                }
            });
            out
        })
        .unwrap_or_default()
    };
    let mut uncached = Vec::new();
    if let Some(c) = cache.as_mut() {
        // Bounded: a program with ever new call sites starts it afresh.
        if c.len() + fresh.len() > SITE_INFO_MAX {
            c.clear();
        }
        c.extend(fresh);
    } else {
        uncached = fresh;
    }
    let figures = |t: u32| {
        let (bytes, blocks) = live_of.get(&t).copied().unwrap_or((0, 0));
        (bytes, blocks, at_peak.get(&t).copied().unwrap_or(0))
    };
    let mut sites: Vec<(&SiteInfo, u64, u64, u64)> = Vec::new();
    if top > 0 {
        for &t in &candidates {
            let info = cache
                .as_ref()
                .and_then(|c| c.get(&t))
                .or_else(|| uncached.iter().find(|e| e.0 == t).map(|e| &e.1));
            if let Some(info) = info {
                let (bytes, blocks, peak_bytes) = figures(t);
                sites.push((info, bytes, blocks, peak_bytes));
            }
        }
    }
    let sites = metrics::top_sites_of(sites, top);
    drop(cache);
    // A block recorded between the two reads above is in the devices'
    // figures but not in the peak: a peak below what the same sample
    // shows live would be false.
    let on_devices: u64 = devices.iter().map(|d| d.live_bytes).sum();
    Sample {
        labels,
        live_bytes: live_bytes_now,
        live_blocks,
        peak_bytes: peak.max(live_bytes_now).max(on_devices),
        failed_allocations: tracker::failed_allocations(),
        oom_events: oom::event_count() as u64,
        leaked_bytes,
        sites,
        devices,
    }
}

fn write(w: &mut Writer, leaked_bytes: Option<u64>) {
    if w.dir_ok.is_none() {
        let ok = cudaleak_core::writer::prepare_dir(&w.dir);
        if let Err(e) = &ok {
            settings::warn(&format!(
                "cudaleak: cannot write metrics into {}: {e}; CUDALEAK_METRICS_DIR is ignored",
                w.dir.display()
            ));
        }
        w.dir_ok = Some(ok.is_ok());
    }
    if w.dir_ok != Some(true) {
        return;
    }
    let s = sample(&w.labels, leaked_bytes, settings::config().metrics_top);
    let name = metrics::file_name(&s.labels.host, s.labels.rank, s.labels.pid);
    // A file of this process under another name (its rank came later) goes.
    if let Some(old) = w.written.take_if(|p| p.file_name().is_none_or(|n| *n != *name)) {
        let _ = std::fs::remove_file(old);
    }
    if let Ok(path) = cudaleak_core::writer::replace_file_with_mode(
        &w.dir,
        &name,
        metrics::render(&s).as_bytes(),
        FILE_MODE,
    ) {
        w.written = Some(path);
    }
}

/// Forgets a file written under another pid: a fork child's copy of the
/// state names its parent's, which is not the child's to replace or
/// remove.
fn forget_others(w: &mut Writer) {
    let host = w.labels.host.clone();
    let me = this_pid();
    w.written.take_if(|p| {
        metrics::pid_of(&p.file_name().unwrap_or_default().to_string_lossy(), &host) != Some(me)
    });
}

/// On the dumper thread: writes the file when it is due; returns how long
/// until the next write (None when metrics are off).
pub fn tick() -> Option<Duration> {
    let mut guard = WRITER.lock_for(LOCK_TIMEOUT)?;
    let w = guard.as_mut()?;
    let every = settings::config().metrics_interval;
    if !tracker::saw_allocation_call() || w.ended_pid == this_pid() {
        return Some(every);
    }
    let now = Instant::now();
    if now >= w.next {
        forget_others(w);
        write(w, None);
        w.next = now + every;
    }
    Some(w.next.saturating_duration_since(Instant::now()))
}

/// After the exit report: the last figures, with what it lists as leaked,
/// then the file goes (a process that ends leaves none behind).
pub fn last_write(leaked_bytes: u64) {
    let Some(mut guard) = WRITER.lock_for(LOCK_TIMEOUT) else {
        return;
    };
    let Some(w) = guard.as_mut() else { return };
    if !tracker::saw_allocation_call() || w.ended_pid == this_pid() {
        return;
    }
    w.ended_pid = this_pid();
    forget_others(w);
    write(w, Some(leaked_bytes));
    if let Some(p) = w.written.take() {
        let _ = std::fs::remove_file(p);
    }
}

/// After an `exec` that failed: the old image's last write removed the
/// file; the process goes on, and so does its file.
pub fn resume() {
    if let Some(mut guard) = WRITER.lock_for(LOCK_TIMEOUT) {
        if let Some(w) = guard.as_mut() {
            w.ended_pid = 0;
            w.next = Instant::now();
        }
    }
}

/// `pthread_atfork` prepare: a write in progress finishes first (its lock
/// is taken before the dump state's, in the writer's order).
pub fn lock_for_fork() {
    WRITER.raw_lock();
}

/// `pthread_atfork` parent.
///
/// # Safety
/// The calling thread took the lock in [`lock_for_fork`].
pub unsafe fn unlock_after_fork() {
    // SAFETY: the caller's contract.
    unsafe { WRITER.raw_unlock() };
}

/// `pthread_atfork` child: the child writes a file of its own, from now.
///
/// # Safety
/// Single-threaded child; the prepare handler took the lock.
pub unsafe fn reset_in_child_and_unlock() {
    // SAFETY: the caller's contract.
    unsafe {
        if let Some(w) = WRITER.get_unchecked().as_mut() {
            w.written = None;
            w.ended_pid = 0;
            w.next = Instant::now();
        }
        WRITER.raw_unlock();
    }
    // The child's devices are those it allocates on.
    for word in &DEVICES_SEEN {
        word.store(0, Ordering::Relaxed);
    }
    // Free: it is taken only inside the writer's or the view's lock, both
    // held by the prepare handlers.
    if let Some(mut last) = LAST_BY_DEVICE.try_lock() {
        last.clear();
    }
}
