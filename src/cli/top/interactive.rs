//! The interactive view in a terminal (ratatui over crossterm): reads each
//! watched process's view as the library publishes it, the keys, and the
//! driver's memory, and draws [`Screen`] until `q`. The terminal is
//! restored on every way out: `q`, an error, a panic (ratatui's hook), and
//! SIGTERM or SIGHUP (a flag the loop reads).

use super::nvml::{of_process, Nvml};
use super::screen::{Action, Screen};
use super::{read_view, watched_process, Target};
use crate::cli::dump::{request_dump, Requested};
use crate::cli::CliResult;
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the view watches.
pub enum Scope {
    /// one process (`cudaleak top PID`)
    One(i32),
    /// every process of a run that runs the library (`run --watch`):
    /// `root` the command, `processes` lists the run's processes (the
    /// command's descendants, orphans included), `ended` is set once the
    /// command has exited, `note` is shown under the header
    Run {
        root: i32,
        processes: Box<dyn Fn() -> Vec<i32>>,
        ended: Arc<AtomicBool>,
        note: String,
    },
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Waits up to `ms` for input on the terminal: true when bytes wait to be
/// read. A terminal that has gone (its window closed, the connection
/// dropped) is an error: its input is then readable with nothing to read,
/// and crossterm's own wait would read that end of input for ever.
fn wait_input(ms: i32) -> Result<bool, String> {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of ours.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    if n <= 0 {
        return Ok(false);
    }
    if fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return Err("the terminal went away".into());
    }
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int, ours.
    let rc = unsafe { libc::ioctl(0, libc::FIONREAD, &mut waiting) };
    if rc != 0 || waiting == 0 {
        return Err("the terminal went away".into());
    }
    Ok(true)
}

/// The viewer's pending requests withdrawn, however the loop ends.
struct Withdraw(Vec<Target>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        for t in &self.0 {
            t.withdraw();
        }
    }
}

/// The terminal back as it was, however the loop ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
        let _ = ratatui::crossterm::execute!(std::io::stdout(), ratatui::crossterm::cursor::Show);
    }
}

/// Those of `pids` that map the library.
fn running_library(mut pids: Vec<i32>) -> Vec<i32> {
    pids.sort_unstable();
    pids.dedup();
    pids.retain(|&p| {
        std::fs::read_to_string(format!("/proc/{p}/maps")).is_ok_and(|m| m.contains("libcudaleak.so"))
    });
    pids
}

/// Runs the view until `q`.
pub fn interactive(scope: Scope, refresh: Duration) -> CliResult {
    let first = match &scope {
        Scope::One(pid) => vec![*pid],
        Scope::Run { .. } => Vec::new(),
    };
    let mut screen = Screen::new(&first);
    if let Scope::Run { note, .. } = &scope {
        screen.note = Some(note.clone());
    }
    let mut targets: Vec<Target> = Vec::new();
    for &pid in &first {
        targets.push(Target::open(pid)?);
    }
    let nvml = Nvml::load();
    // Under `run`, its own handlers pass these signals on to the command,
    // whose end the view then shows.
    if let Scope::One(_) = scope {
        for sig in [libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the handler only stores to an atomic.
            unsafe { libc::signal(sig, on_stop as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        }
    }
    let mut terminal = ratatui::try_init().map_err(|e| format!("cannot use the terminal: {e}"))?;
    let _restore = Restore;
    let mut targets = Withdraw(targets);
    let targets = &mut targets.0;
    let mut next_read = Instant::now();
    let mut interrupted = false;
    // Drawn when something changed: the viewer shares the machine with
    // the job it watches.
    let mut dirty = true;
    loop {
        if STOP.load(Ordering::Relaxed) {
            return Ok(0);
        }
        if Instant::now() >= next_read {
            if let Scope::Run { processes, .. } = &scope {
                let pids = running_library(processes());
                for &p in &pids {
                    if !targets.iter().any(|t| t.pid == p) {
                        if let Ok(t) = Target::open(p) {
                            targets.push(t);
                        }
                    }
                }
                screen.watch(&targets.iter().map(|t| t.pid).collect::<Vec<_>>());
            }
            for t in targets.iter_mut() {
                let Some(w) = screen.watched.iter_mut().find(|w| w.pid == t.pid) else {
                    continue;
                };
                if w.gone || w.view.as_ref().is_some_and(|v| v.exited) {
                    continue;
                }
                if let Some(v) = t.poll() {
                    if v.exited {
                        t.remove_view();
                    }
                    w.received(v);
                } else if !watched_process(t.pid) {
                    // Gone without an exited view (killed): the last one
                    // read, if any, stays shown; the file goes.
                    if let Some(v) = read_view(&t.view) {
                        if v.sequence > w.view.as_ref().map_or(0, |o| o.sequence) {
                            w.received(v);
                        }
                    }
                    t.remove_view();
                    t.withdraw();
                    w.gone = true;
                }
            }
            screen.prefer_viewed();
            screen.devices = match screen.current() {
                Some(w) => of_process(w.pid, w.view.as_ref(), &nvml),
                None => Ok(Vec::new()),
            };
            if let Scope::Run { ended, .. } = &scope {
                if ended.load(Ordering::Acquire) {
                    screen.status = "the command has exited: q shows the summary".into();
                }
            }
            next_read = Instant::now() + refresh;
            dirty = true;
        }
        if dirty {
            terminal
                .draw(|f| screen.draw(f))
                .map_err(|e| format!("cannot draw the view: {e}"))?;
            dirty = false;
        }
        let reading = |e: std::io::Error| format!("reading the terminal: {e}");
        // Events crossterm has read already first; then the terminal,
        // watched here rather than by crossterm (see wait_input).
        let ready = event::poll(Duration::ZERO).map_err(reading)?
            || (wait_input(100)? && event::poll(Duration::ZERO).map_err(reading)?);
        if !ready {
            continue;
        }
        dirty = true;
        let Event::Key(key) = event::read().map_err(|e| format!("reading the terminal: {e}"))? else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        match screen.key(key) {
            Action::None => {}
            Action::Quit => return Ok(0),
            Action::Interrupt => match &scope {
                // In raw mode Ctrl-C is a key, not a signal: under `run
                // --watch` it interrupts the command as a terminal would,
                // once; again, or with nothing to interrupt, it quits.
                Scope::Run { root, ended, .. } if !interrupted && !ended.load(Ordering::Acquire) => {
                    // SAFETY: kill with a pid and a signal number.
                    unsafe { libc::kill(*root, libc::SIGINT) };
                    interrupted = true;
                    screen.status = "SIGINT sent to the command (Ctrl-C again leaves the view)".into();
                }
                _ => return Ok(0),
            },
            Action::Dump(pid) => {
                screen.status = match targets.iter().find(|t| t.pid == pid) {
                    Some(t) => match request_dump(&t.dir, pid, t.owner) {
                        Ok(Requested::Created) => format!(
                            "asked process {pid} for a live report; it is written in {}",
                            t.dir.display()
                        ),
                        Ok(Requested::AlreadyPending) => {
                            format!("a report of process {pid} is already asked for")
                        }
                        Err(e) => e,
                    },
                    None => format!("process {pid} is not watched"),
                };
            }
        }
    }
}
