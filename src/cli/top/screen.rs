//! What the interactive view shows and how keys change it, apart from any
//! terminal: [`Screen`] holds the views received for each watched process
//! and what the viewer keeps of its own (each site's history and its bytes
//! when first listed), and draws into any ratatui backend, so that the
//! tests draw it into a buffer.

use super::nvml::DeviceMemory;
use cudaleak_core::base::units::{size, size_delta};
use cudaleak_core::live_view::LiveView;
use cudaleak_core::report::render::escape;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;
use std::collections::{HashMap, VecDeque};

/// Publishes a site's history keeps (the sparkline's width).
const HISTORY: usize = 20;

/// The table's columns, in order; each sorts the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Live,
    Blocks,
    Change,
    SinceAttach,
    Peak,
    Site,
}

impl Column {
    pub const ALL: [Column; 6] = [
        Column::Live,
        Column::Blocks,
        Column::Change,
        Column::SinceAttach,
        Column::Peak,
        Column::Site,
    ];

    fn title(self) -> &'static str {
        match self {
            Column::Live => "live",
            Column::Blocks => "blocks",
            Column::Change => "change",
            Column::SinceAttach => "since attach",
            Column::Peak => "at peak",
            Column::Site => "call site",
        }
    }
}

/// One watched process: its last view, and what the viewer keeps of it.
#[derive(Debug)]
pub struct Watched {
    pub pid: i32,
    pub view: Option<LiveView>,
    /// the process is gone (its view, if any, is its last state)
    pub gone: bool,
    /// each site's live bytes at its last [`HISTORY`] publishes
    history: HashMap<String, VecDeque<u64>>,
    /// each site's live bytes in the first view that listed it
    first: HashMap<String, u64>,
}

impl Watched {
    pub fn new(pid: i32) -> Watched {
        Watched {
            pid,
            view: None,
            gone: false,
            history: HashMap::new(),
            first: HashMap::new(),
        }
    }

    /// A new publish of this process.
    pub fn received(&mut self, v: LiveView) {
        for s in &v.sites {
            self.first.entry(s.site_id.clone()).or_insert(s.live_bytes);
            let h = self.history.entry(s.site_id.clone()).or_default();
            h.push_back(s.live_bytes);
            if h.len() > HISTORY {
                h.pop_front();
            }
        }
        // A site no longer listed has left the top: its history goes on
        // from 0 if it comes back.
        for (id, h) in self.history.iter_mut() {
            if !v.sites.iter().any(|s| &s.site_id == id) {
                h.push_back(0);
                if h.len() > HISTORY {
                    h.pop_front();
                }
            }
        }
        self.view = Some(v);
    }

    /// The change of `site_id` since the first view that listed it.
    pub fn since_attach(&self, site_id: &str, now: u64) -> i64 {
        now as i64 - self.first.get(site_id).copied().unwrap_or(now) as i64
    }
}

/// What a key asks of the loop around the screen.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// write a full live report of this process now (as SIGUSR1 does)
    Dump(i32),
    /// Ctrl-C: the loop decides (quit, or interrupt the command it runs)
    Interrupt,
}

/// The whole view.
pub struct Screen {
    pub watched: Vec<Watched>,
    pub current: usize,
    pub sort: Column,
    /// ascending instead of the column's natural order (largest first,
    /// labels A to Z)
    pub reversed: bool,
    /// the selected row, in the order shown
    pub row: usize,
    pub stack_open: bool,
    /// one line for what the last action did
    pub status: String,
    /// lines the caller adds under the header (`run --watch`: where the
    /// command's output goes, and the command)
    pub note: Option<String>,
    /// the driver's free and total memory of each device ordinal of the
    /// current process, or why not known
    pub devices: Result<Vec<(u32, DeviceMemory)>, String>,
    /// a process was chosen by key: [`Screen::prefer_viewed`] leaves it
    chosen: bool,
}

fn change_text(c: i64) -> String {
    if c == 0 {
        "0".into()
    } else {
        size_delta(c)
    }
}

/// A history as a line of eighths, scaled to its own largest value.
pub fn sparkline(values: &VecDeque<u64>) -> String {
    const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().max().unwrap_or(0);
    values
        .iter()
        .map(|&v| {
            if max == 0 {
                BARS[0]
            } else if v == 0 {
                ' '
            } else {
                BARS[(1 + (v as u128 * 7 / max as u128) as usize).min(8)]
            }
        })
        .collect()
}

impl Screen {
    pub fn new(pids: &[i32]) -> Screen {
        Screen {
            watched: pids.iter().map(|&p| Watched::new(p)).collect(),
            current: 0,
            sort: Column::Live,
            reversed: false,
            row: 0,
            stack_open: false,
            status: String::new(),
            note: None,
            devices: Err("not read yet".into()),
            chosen: false,
        }
    }

    /// Keeps `pids` watched: new ones added, those gone kept (their last
    /// state stays readable).
    pub fn watch(&mut self, pids: &[i32]) {
        for &p in pids {
            if !self.watched.iter().any(|w| w.pid == p) {
                self.watched.push(Watched::new(p));
            }
        }
    }

    /// While the process shown has published nothing (a shell that
    /// starts the job), shows the first one that has, until a key chose.
    pub fn prefer_viewed(&mut self) {
        if self.chosen || self.current().is_some_and(|w| w.view.is_some()) {
            return;
        }
        if let Some(i) = self.watched.iter().position(|w| w.view.is_some()) {
            self.current = i;
            self.row = 0;
        }
    }

    pub fn current(&self) -> Option<&Watched> {
        self.watched.get(self.current)
    }

    /// The current process's sites in the order shown: (index in the
    /// view, change since attach).
    pub fn order(&self) -> Vec<(usize, i64)> {
        let Some(w) = self.current() else {
            return Vec::new();
        };
        let Some(v) = &w.view else { return Vec::new() };
        let mut rows: Vec<(usize, i64)> = v
            .sites
            .iter()
            .enumerate()
            .map(|(i, s)| (i, w.since_attach(&s.site_id, s.live_bytes)))
            .collect();
        let sites = &v.sites;
        rows.sort_by(|a, b| {
            let (x, y) = (&sites[a.0], &sites[b.0]);
            let natural = match self.sort {
                Column::Live => y.live_bytes.cmp(&x.live_bytes),
                Column::Blocks => y.live_blocks.cmp(&x.live_blocks),
                Column::Change => y.change_bytes.cmp(&x.change_bytes),
                Column::SinceAttach => b.1.cmp(&a.1),
                Column::Peak => y.peak_bytes.cmp(&x.peak_bytes),
                Column::Site => x.label.cmp(&y.label),
            };
            let natural = natural
                .then(y.live_bytes.cmp(&x.live_bytes))
                .then(x.label.cmp(&y.label));
            if self.reversed {
                natural.reverse()
            } else {
                natural
            }
        });
        rows
    }

    /// What `key` does.
    pub fn key(&mut self, key: KeyEvent) -> Action {
        let rows = self.order().len();
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Interrupt;
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Esc if self.stack_open => self.stack_open = false,
            KeyCode::Esc => return Action::Quit,
            KeyCode::Down | KeyCode::Char('j') => self.row = (self.row + 1).min(rows.saturating_sub(1)),
            KeyCode::Up | KeyCode::Char('k') => self.row = self.row.saturating_sub(1),
            KeyCode::PageDown => self.row = (self.row + 10).min(rows.saturating_sub(1)),
            KeyCode::PageUp => self.row = self.row.saturating_sub(10),
            KeyCode::Home | KeyCode::Char('g') => self.row = 0,
            KeyCode::End | KeyCode::Char('G') => self.row = rows.saturating_sub(1),
            KeyCode::Enter => self.stack_open = !self.stack_open && rows > 0,
            KeyCode::Char('s') => {
                let i = Column::ALL.iter().position(|&c| c == self.sort).unwrap_or(0);
                self.sort = Column::ALL[(i + 1) % Column::ALL.len()];
                self.row = 0;
            }
            KeyCode::Char(c @ '1'..='6') => {
                self.sort = Column::ALL[c as usize - '1' as usize];
                self.row = 0;
            }
            KeyCode::Char('r') => {
                self.reversed = !self.reversed;
                self.row = 0;
            }
            KeyCode::Tab | KeyCode::Right if self.watched.len() > 1 => {
                self.current = (self.current + 1) % self.watched.len();
                self.chosen = true;
                self.row = 0;
                self.stack_open = false;
            }
            KeyCode::BackTab | KeyCode::Left if self.watched.len() > 1 => {
                self.current = (self.current + self.watched.len() - 1) % self.watched.len();
                self.chosen = true;
                self.row = 0;
                self.stack_open = false;
            }
            KeyCode::Char('d') => {
                if let Some(w) = self.current().filter(|w| !w.gone) {
                    return Action::Dump(w.pid);
                }
                self.status = "the process has exited: no report to ask for".into();
            }
            _ => {}
        }
        Action::None
    }

    fn header(&self) -> Vec<Line<'static>> {
        let mut lines = Vec::new();
        let Some(w) = self.current() else {
            lines.push(Line::from("cudaleak top: no process"));
            return lines;
        };
        let state = match (&w.view, w.gone) {
            (Some(v), _) if v.exited => "  (process exited; its last state)",
            (Some(_), true) => "  (process ended without a last view: killed?)",
            (None, true) => "  (process ended before its first view)",
            (None, false) => "  (waiting for its first view: has it made a CUDA allocation call yet?)",
            _ => "",
        };
        let command = w.view.as_ref().map(|v| v.command.join(" ")).unwrap_or_default();
        lines.push(Line::from(format!(
            "cudaleak top: pid {} {}{state}",
            w.pid,
            escape(&command)
        )));
        if let Some(v) = &w.view {
            lines.push(Line::from(format!(
                "live {} in {} blocks, peak {}; {} out-of-memory events, {} failed calls",
                size(v.live_bytes),
                v.live_blocks,
                size(v.peak_bytes),
                v.oom_events,
                v.failed_allocations
            )));
            if let Some(line) = device_line(v, &self.devices) {
                lines.push(Line::from(line));
            }
        }
        if self.watched.len() > 1 {
            let list: Vec<String> = self
                .watched
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let end = if w.gone || w.view.as_ref().is_some_and(|v| v.exited) {
                        " (exited)"
                    } else {
                        ""
                    };
                    if i == self.current {
                        format!("[{}{end}]", w.pid)
                    } else {
                        format!("{}{end}", w.pid)
                    }
                })
                .collect();
            lines.push(Line::from(format!("processes: {}  (Tab: next)", list.join(" "))));
        }
        for n in self.note.iter().flat_map(|n| n.lines()) {
            lines.push(Line::from(escape(n).into_owned()));
        }
        lines
    }

    /// Draws the whole view into `f`.
    pub fn draw(&self, f: &mut Frame) {
        let header = self.header();
        let [top, table, bottom] = Layout::vertical([
            Constraint::Length(header.len() as u16),
            Constraint::Min(3),
            Constraint::Length(1),
        ])
        .areas(f.area());
        f.render_widget(Paragraph::new(header), top);
        let order = self.order();
        let w = self.current();
        let view = w.and_then(|w| w.view.as_ref());
        let titles = Column::ALL.iter().enumerate().map(|(i, &c)| {
            let mark = match (c == self.sort, self.reversed) {
                (true, false) => " ▼",
                (true, true) => " ▲",
                _ => "",
            };
            Cell::from(format!("{}:{}{mark}", i + 1, c.title()))
        });
        let mut titles: Vec<Cell> = titles.collect();
        titles.insert(5, Cell::from("history"));
        let rows = order.iter().filter_map(|&(i, since)| {
            let s = view?.sites.get(i)?;
            let history = w
                .and_then(|w| w.history.get(&s.site_id))
                .map(sparkline)
                .unwrap_or_default();
            Some(Row::new(vec![
                Cell::from(size(s.live_bytes)),
                Cell::from(s.live_blocks.to_string()),
                Cell::from(change_text(s.change_bytes)),
                Cell::from(change_text(since)),
                Cell::from(size(s.peak_bytes)),
                Cell::from(history),
                Cell::from(escape(&s.label).into_owned()),
            ]))
        });
        let widths = [
            Constraint::Length(11),
            Constraint::Length(8),
            Constraint::Length(13),
            Constraint::Length(16),
            Constraint::Length(12),
            Constraint::Length(HISTORY as u16),
            Constraint::Min(20),
        ];
        let t = Table::new(rows, widths)
            .header(Row::new(titles).style(Style::new().add_modifier(Modifier::BOLD)))
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
        let mut state =
            TableState::default().with_selected(Some(self.row.min(order.len().saturating_sub(1))));
        f.render_stateful_widget(t, table, &mut state);
        let keys = "q quit  ↑↓ select  Enter stack  s/1-6 sort  r reverse  d write a report now";
        let footer = if self.status.is_empty() {
            keys.to_string()
        } else {
            format!("{}  |  {keys}", escape(&self.status))
        };
        f.render_widget(Paragraph::new(footer), bottom);
        if self.stack_open {
            if let Some(s) = order.get(self.row).and_then(|&(i, _)| view?.sites.get(i)) {
                let area = centered(table, 90, 80);
                let mut lines = vec![Line::from(escape(&s.label).into_owned()), Line::from("")];
                lines.extend(s.stack.iter().map(|l| Line::from(escape(l).into_owned())));
                if s.stack.is_empty() {
                    lines.push(Line::from("(no stack in this view)"));
                }
                f.render_widget(Clear, area);
                f.render_widget(
                    Paragraph::new(lines).wrap(Wrap { trim: false }).block(
                        Block::new()
                            .borders(Borders::ALL)
                            .title(format!(" stack of site {} (Esc closes) ", escape(&s.site_id))),
                    ),
                    area,
                );
            }
        }
    }
}

/// What `v`'s process holds on each device, with the driver's free and
/// total memory of each where known (`driver`), one line (escaped).
pub fn device_line(v: &LiveView, driver: &Result<Vec<(u32, DeviceMemory)>, String>) -> Option<String> {
    let mut devices = Vec::new();
    for d in &v.devices {
        let figures = match (driver, d.device.parse::<u32>()) {
            (Ok(known), Ok(ordinal)) => match known.iter().find(|k| k.0 == ordinal) {
                Some((_, m)) => format!(", driver: {} free of {}", size(m.free), size(m.total)),
                None => String::new(),
            },
            _ => String::new(),
        };
        let name = match d.device.as_str() {
            "host" => "pinned host".to_string(),
            "unknown" => "device unknown".to_string(),
            n => format!("GPU {n}"),
        };
        devices.push(format!("{name}: {}{figures}", size(d.live_bytes)));
    }
    if let Err(why) = driver {
        devices.push(format!("driver's free and total memory not known ({why})"));
    }
    (!devices.is_empty()).then(|| escape(&devices.join(" | ")).into_owned())
}

/// A rectangle of `pw`% by `ph`% in the middle of `r`.
fn centered(r: Rect, pw: u16, ph: u16) -> Rect {
    let w = r.width * pw / 100;
    let h = (r.height * ph / 100).max(3);
    Rect::new(
        r.x + (r.width - w) / 2,
        r.y + (r.height.saturating_sub(h)) / 2,
        w,
        h.min(r.height),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudaleak_core::live_view::ViewSite;
    use cudaleak_core::metrics::DeviceLive;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn site(id: &str, label: &str, live: u64, change: i64, peak: u64) -> ViewSite {
        ViewSite {
            site_id: id.into(),
            label: label.into(),
            live_bytes: live,
            live_blocks: live >> 20,
            peak_bytes: peak,
            change_bytes: change,
            stack: vec![
                format!("#0 in {label} [python]"),
                "#1 in main t.py:9 [python]".into(),
            ],
        }
    }

    fn view(seq: u64, grow: u64) -> LiveView {
        LiveView {
            pid: 42,
            command: vec!["python3".into(), "t.py\u{1b}[2J".into()],
            timestamp_ms: seq as i64,
            sequence: seq,
            exited: false,
            live_bytes: (grow + 3) << 20,
            live_blocks: grow + 3,
            peak_bytes: (grow + 3) << 20,
            failed_allocations: 1,
            oom_events: 0,
            devices: vec![DeviceLive {
                device: "0".into(),
                live_bytes: (grow + 3) << 20,
                live_blocks: grow + 3,
            }],
            sites: vec![
                site("g", "grow t.py:3", grow << 20, 1 << 20, grow << 20),
                site("s", "steady t.py:4", 3 << 20, 0, 5 << 20),
            ],
        }
    }

    fn text(s: &Screen) -> String {
        let mut t = Terminal::new(TestBackend::new(140, 20)).unwrap();
        t.draw(|f| s.draw(f)).unwrap();
        let b = t.backend().buffer().clone();
        (0..b.area.height)
            .map(|y| {
                (0..b.area.width)
                    .map(|x| b[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn press(s: &mut Screen, code: KeyCode) -> Action {
        s.key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    fn labels(s: &Screen) -> Vec<String> {
        let v = s.current().unwrap().view.as_ref().unwrap();
        s.order().iter().map(|&(i, _)| v.sites[i].label.clone()).collect()
    }

    #[test]
    fn header_table_sorting_and_the_stack() {
        let mut s = Screen::new(&[42]);
        s.devices = Ok(vec![(
            0,
            DeviceMemory {
                free: 70 << 30,
                total: 80 << 30,
            },
        )]);
        s.watched[0].received(view(1, 1));
        s.watched[0].received(view(2, 2));
        let out = text(&s);
        assert!(out.contains("cudaleak top: pid 42 python3 t.py\\x1b[2J"), "{out}");
        assert!(
            out.contains("live 5.0 MiB in 5 blocks, peak 5.0 MiB; 0 out-of-memory events, 1 failed calls"),
            "{out}"
        );
        assert!(
            out.contains("GPU 0: 5.0 MiB, driver: 70.0 GiB free of 80.0 GiB"),
            "{out}"
        );
        assert!(out.contains("1:live ▼"), "{out}");
        // Largest first: the steady 3 MiB above the growing 2 MiB; the
        // growing one changed by 1 MiB since attach, the steady by 0.
        assert_eq!(labels(&s), ["steady t.py:4", "grow t.py:3"]);
        let grow_line = out.lines().find(|l| l.contains("grow t.py:3")).unwrap();
        assert!(grow_line.contains("+1.0 MiB"), "{grow_line}");
        assert!(grow_line.contains("▄█"), "{grow_line}");
        // By change since attach, then reversed, then by label.
        press(&mut s, KeyCode::Char('4'));
        assert_eq!(labels(&s), ["grow t.py:3", "steady t.py:4"]);
        press(&mut s, KeyCode::Char('r'));
        assert_eq!(labels(&s), ["steady t.py:4", "grow t.py:3"]);
        assert!(text(&s).contains("4:since attach ▲"));
        press(&mut s, KeyCode::Char('r'));
        press(&mut s, KeyCode::Char('s'));
        assert_eq!(s.sort, Column::Peak);
        assert_eq!(labels(&s), ["steady t.py:4", "grow t.py:3"]);
        press(&mut s, KeyCode::Char('6'));
        assert_eq!(labels(&s), ["grow t.py:3", "steady t.py:4"]);
        // The second row's stack.
        press(&mut s, KeyCode::Down);
        press(&mut s, KeyCode::Enter);
        let out = text(&s);
        assert!(out.contains("stack of site s"), "{out}");
        assert!(out.contains("#1 in main t.py:9 [python]"), "{out}");
        assert_eq!(press(&mut s, KeyCode::Esc), Action::None);
        assert!(!text(&s).contains("stack of site"));
        assert_eq!(press(&mut s, KeyCode::Char('d')), Action::Dump(42));
        assert_eq!(press(&mut s, KeyCode::Char('q')), Action::Quit);
        assert_eq!(
            s.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Action::Interrupt
        );
    }

    #[test]
    fn processes_and_their_ends() {
        let mut s = Screen::new(&[42]);
        let mut shell = Screen::new(&[41, 42]);
        shell.watched[1].received(view(1, 1));
        shell.prefer_viewed();
        assert_eq!(shell.current().unwrap().pid, 42, "the first process with a view");
        s.devices = Err("no NVML".into());
        assert!(text(&s).contains("waiting for its first view"));
        s.watch(&[42, 43]);
        s.watched[0].received(view(1, 1));
        let mut last = view(2, 1);
        last.exited = true;
        s.watched[0].received(last);
        let out = text(&s);
        assert!(out.contains("(process exited; its last state)"), "{out}");
        assert!(
            out.contains("driver's free and total memory not known (no NVML)"),
            "{out}"
        );
        assert!(out.contains("processes: [42 (exited)] 43"), "{out}");
        s.prefer_viewed();
        assert_eq!(s.current().unwrap().pid, 42, "it has a view");
        press(&mut s, KeyCode::Tab);
        assert_eq!(s.current().unwrap().pid, 43);
        s.prefer_viewed();
        assert_eq!(s.current().unwrap().pid, 43, "a process chosen by key stays");
        s.watched[1].gone = true;
        assert!(text(&s).contains("process ended before its first view"));
        assert_eq!(press(&mut s, KeyCode::Char('d')), Action::None);
        assert!(s.status.contains("has exited"));
    }

    #[test]
    fn sparklines_scale_to_their_largest_value() {
        let h: VecDeque<u64> = [0, 1, 4, 8].into_iter().collect();
        assert_eq!(sparkline(&h), " ▁▄█");
        assert_eq!(sparkline(&[0, 0].into_iter().collect()), "  ");
    }
}
