//! LeakSanitizer-format suppressions (`leak:PATTERN`), matched against the
//! frames of a group: function, file and module of native frames, function
//! and file of Python frames (CONTRACT.md, "Suppressions").
//!
//! Pattern language, as in sanitizer_common's `TemplateMatch`: `*` matches
//! any run of characters, a leading `^` anchors at the start, a trailing `$`
//! at the end, and without anchors the pattern may match anywhere. Unlike
//! `TemplateMatch`, an end anchor is honoured after a non-leftmost occurrence
//! too (`foo$` matches "foofoo").

use crate::report::{Group, SuppressionUse};
use aho_corasick::AhoCorasick;
use std::collections::HashMap;

/// Built-in suppressions for one-time allocations of CUDA libraries, on by
/// default (`CUDALEAK_DEFAULT_SUPPRESSIONS=0` turns them off). Each entry
/// says where it comes from.
pub const DEFAULT_SUPPRESSIONS: &str = include_str!("../../../../suppressions/default.supp");

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suppression {
    /// the text after `leak:`, as written
    pub pattern: String,
    /// where it was read from, "file:line"
    pub origin: String,
}

#[derive(Clone, Debug, Default)]
pub struct Suppressions {
    /// Read-only outside this module: `compiled` indexes them; add rules
    /// with [`Suppressions::parse`] and [`Suppressions::extend`].
    pub rules: Vec<Suppression>,
    /// built from `rules` by parse and extend, when the rules are loaded:
    /// no lazy cell shared by concurrent dumps
    compiled: Compiled,
}

/// The rules, indexed (100,000 rules cost 1.1 s per leaked
/// group, groups × frames × 3 names × rules). Every match of a pattern
/// contains its longest literal piece (the text between `*`s, anchors
/// removed), so one Aho-Corasick pass over a name finds the only rules
/// that can match it; those are then checked in full. Patterns with no
/// literal (`*`, `^$`) are checked for every name.
#[derive(Clone, Debug, Default)]
struct Compiled {
    literals: Option<AhoCorasick>,
    /// rules (indices, in file order) per literal of `literals`
    rules_of_literal: Vec<Vec<usize>>,
    /// rules without a literal
    always: Vec<usize>,
}

impl Compiled {
    fn new(rules: &[Suppression]) -> Compiled {
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut literals: Vec<&str> = Vec::new();
        let mut rules_of_literal: Vec<Vec<usize>> = Vec::new();
        let mut always = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            let body = r.pattern.strip_prefix('^').unwrap_or(&r.pattern);
            let body = body.strip_suffix('$').unwrap_or(body);
            let longest = body.split('*').max_by_key(|piece| piece.len()).unwrap_or("");
            if longest.is_empty() {
                always.push(i);
                continue;
            }
            let at = *index.entry(longest).or_insert_with(|| {
                literals.push(longest);
                rules_of_literal.push(Vec::new());
                literals.len() - 1
            });
            rules_of_literal[at].push(i);
        }
        Compiled {
            literals: (!literals.is_empty())
                .then(|| AhoCorasick::new(&literals).ok())
                .flatten(),
            rules_of_literal,
            always,
        }
    }

    /// The first rule (in file order) that matches `name`.
    fn first_match(&self, rules: &[Suppression], name: &str) -> Option<usize> {
        let mut best: Option<usize> = None;
        let mut consider = |i: usize| {
            if best.is_none_or(|b| i < b) && pattern_matches(&rules[i].pattern, name) {
                best = Some(i);
            }
        };
        for &i in &self.always {
            consider(i);
        }
        if let Some(ac) = &self.literals {
            for m in ac.find_overlapping_iter(name) {
                for &i in &self.rules_of_literal[m.pattern().as_usize()] {
                    consider(i);
                }
            }
        }
        best
    }
}

/// The names a rule is matched against, innermost frame first: function,
/// file and module of native frames, then function and file of Python ones.
fn frame_names(group: &Group) -> impl Iterator<Item = &str> {
    let native = group
        .native_stack
        .iter()
        .flat_map(|f| [f.function.as_deref(), f.file.as_deref(), f.module.as_deref()]);
    let python = group
        .python_stack
        .iter()
        .flat_map(|f| [Some(f.function.as_str()), Some(f.file.as_str()), None]);
    native.chain(python).flatten()
}

/// Matches groups against the rules, each distinct frame name once (for
/// one dump).
pub struct Matcher<'a> {
    rules: &'a [Suppression],
    compiled: &'a Compiled,
    seen: HashMap<String, Option<usize>>,
}

impl Matcher<'_> {
    fn name_match(&mut self, name: &str) -> Option<usize> {
        if let Some(m) = self.seen.get(name) {
            return *m;
        }
        let m = self.compiled.first_match(self.rules, name);
        self.seen.insert(name.to_string(), m);
        m
    }

    /// Index of the first rule that matches `name`, one frame's function,
    /// file or module: what [`Matcher::match_group`] gives a group with
    /// that one name (a dump asks once per distinct name, without
    /// making a `Group` for it).
    pub fn match_name(&mut self, name: &str) -> Option<usize> {
        if self.rules.is_empty() || name.is_empty() {
            return None;
        }
        self.name_match(name)
    }

    /// Index of the first rule that matches any frame of `group`, frames
    /// innermost first (native, then Python), rules in file order per frame.
    pub fn match_group(&mut self, group: &Group) -> Option<usize> {
        if self.rules.is_empty() {
            return None;
        }
        frame_names(group)
            .filter(|name| !name.is_empty())
            .find_map(|name| self.name_match(name))
    }

    /// Moves matching groups from `leaks` to `suppressed` (with the pattern
    /// set) and tallies what each rule matched.
    pub fn apply(&mut self, leaks: &mut Vec<Group>, suppressed: &mut Vec<Group>) -> Vec<SuppressionUse> {
        let mut uses: Vec<SuppressionUse> = Vec::new();
        let mut kept = Vec::with_capacity(leaks.len());
        for mut g in leaks.drain(..) {
            match self.match_group(&g) {
                Some(i) => {
                    let pattern = &self.rules[i].pattern;
                    tally_use(&mut uses, pattern, g.blocks, g.bytes);
                    g.suppression = Some(pattern.clone());
                    suppressed.push(g);
                }
                None => kept.push(g),
            }
        }
        *leaks = kept;
        uses
    }
}

/// Counts one suppressed group of `blocks` and `bytes` for the rule
/// `pattern` in `uses` (in first-use order), saturating (sums
/// overflowed silently).
pub fn tally_use(uses: &mut Vec<SuppressionUse>, pattern: &str, blocks: u64, bytes: u64) {
    match uses.iter_mut().find(|u| u.pattern == pattern) {
        Some(u) => {
            u.groups = u.groups.saturating_add(1);
            u.blocks = u.blocks.saturating_add(blocks);
            u.bytes = u.bytes.saturating_add(bytes);
        }
        None => uses.push(SuppressionUse {
            pattern: pattern.to_string(),
            groups: 1,
            blocks,
            bytes,
        }),
    }
}

impl Suppressions {
    /// Parses LSan's format; `origin` names the source in messages.
    pub fn parse(text: &str, origin: &str) -> Result<Suppressions, String> {
        let mut rules = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((kind, pattern)) = line.split_once(':') else {
                return Err(format!(
                    "{origin}:{}: expected leak:PATTERN, found {line:?}",
                    i + 1
                ));
            };
            if kind.trim() != "leak" {
                return Err(format!(
                    "{origin}:{}: unknown suppression type {:?} (only leak: is supported)",
                    i + 1,
                    kind.trim()
                ));
            }
            let pattern = pattern.trim();
            if pattern.is_empty() {
                return Err(format!("{origin}:{}: empty pattern", i + 1));
            }
            rules.push(Suppression {
                pattern: pattern.to_string(),
                origin: format!("{origin}:{}", i + 1),
            });
        }
        let compiled = Compiled::new(&rules);
        Ok(Suppressions { rules, compiled })
    }

    pub fn extend(&mut self, other: Suppressions) {
        if self.rules.is_empty() {
            // Its index is already built.
            *self = other;
            return;
        }
        self.rules.extend(other.rules);
        self.compiled = Compiled::new(&self.rules);
    }

    /// No rules (usable in a `static`).
    pub const fn none() -> Suppressions {
        Suppressions {
            rules: Vec::new(),
            compiled: Compiled {
                literals: None,
                rules_of_literal: Vec::new(),
                always: Vec::new(),
            },
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// A matcher for one dump: each distinct frame name is matched once.
    pub fn matcher(&self) -> Matcher<'_> {
        Matcher {
            rules: &self.rules,
            compiled: &self.compiled,
            seen: HashMap::new(),
        }
    }

    /// Index of the first rule that matches any frame of `group` (see
    /// [`Matcher::match_group`]).
    pub fn match_group(&self, group: &Group) -> Option<usize> {
        self.matcher().match_group(group)
    }

    /// See [`Matcher::apply`].
    pub fn apply(&self, leaks: &mut Vec<Group>, suppressed: &mut Vec<Group>) -> Vec<SuppressionUse> {
        self.matcher().apply(leaks, suppressed)
    }
}

/// LSan pattern semantics (see the module comment). Empty names never match.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let (anchored_start, rest) = match pattern.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, pattern),
    };
    let (anchored_end, body) = match rest.strip_suffix('$') {
        Some(b) => (true, b),
        None => (false, rest),
    };
    let segments: Vec<&str> = body.split('*').collect();
    let last = segments.len() - 1;
    let mut pos = 0usize;
    for (i, seg) in segments.iter().enumerate() {
        let hay = &name[pos..];
        if i == 0 && anchored_start {
            if !hay.starts_with(seg) {
                return false;
            }
            if i == last && anchored_end {
                return hay.len() == seg.len();
            }
            pos += seg.len();
            continue;
        }
        if i == last && anchored_end {
            return hay.ends_with(seg);
        }
        match hay.find(seg) {
            Some(at) => pos += at + seg.len(),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::python::PythonFrame;
    use crate::record::MemoryKind;
    use crate::report::NativeFrame;

    #[test]
    fn lsan_pattern_semantics() {
        assert!(pattern_matches("cublas", "libcublasLt.so.13"));
        assert!(pattern_matches("^cublas", "cublasCreate_v2"));
        assert!(!pattern_matches("^cublas", "my_cublas_wrapper"));
        assert!(pattern_matches("Create$", "cublasCreate"));
        assert!(!pattern_matches("Create$", "cublasCreate_v2"));
        assert!(pattern_matches("^cublas*_v2$", "cublasCreate_v2"));
        assert!(!pattern_matches("^cublas*_v2$", "cublasCreate_v2x"));
        assert!(pattern_matches("a*b*c", "xxaxxbxxcxx"));
        assert!(!pattern_matches("a*b*c", "xxcxxbxxaxx"));
        assert!(pattern_matches("foo$", "foofoo"));
        assert!(pattern_matches("^main$", "main"));
        assert!(!pattern_matches("^main$", "main2"));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("^*$", "x"));
        assert!(!pattern_matches("x", ""));
        assert!(pattern_matches("train.py", "/home/u/train.py"));
    }

    fn group(native: &[(&str, &str, &str)], python: &[(&str, &str)]) -> Group {
        let native = native
            .iter()
            .map(|(func, file, module)| NativeFrame {
                address: "0x1".into(),
                function: Some(func.to_string()),
                file: Some(file.to_string()),
                line: Some(1),
                module: Some(module.to_string()),
                ..NativeFrame::default()
            })
            .collect();
        let python = python
            .iter()
            .map(|(func, file)| PythonFrame {
                function: func.to_string(),
                file: file.to_string(),
                line: Some(3),
            })
            .collect();
        Group::new(1, 100, "cudaMalloc", MemoryKind::Device, native, python)
    }

    #[test]
    fn matches_native_function_file_module_and_python_frames() {
        let s = Suppressions::parse(
            "# comment\n\nleak:^init_workspace$\nleak:/vendor/*.c\nleak:libnccl\nleak:warmup_cache\nleak:^/opt/data/loader.py$\n",
            "test.supp",
        )
        .unwrap();
        assert_eq!(s.rules.len(), 5);
        let by_func = group(&[("init_workspace", "a.c", "/bin/x")], &[]);
        let by_file = group(&[("f", "/src/vendor/blas.c", "/bin/x")], &[]);
        let by_module = group(&[("f", "a.c", "/usr/lib/libnccl.so.2")], &[]);
        let by_py_func = group(&[("f", "a.c", "/bin/x")], &[("Model.warmup_cache", "m.py")]);
        let by_py_file = group(&[("f", "a.c", "/bin/x")], &[("load", "/opt/data/loader.py")]);
        let none = group(
            &[("init_workspace2", "a.c", "/bin/x")],
            &[("g", "/opt/data/loader.pyc")],
        );
        assert_eq!(s.match_group(&by_func), Some(0));
        assert_eq!(s.match_group(&by_file), Some(1));
        assert_eq!(s.match_group(&by_module), Some(2));
        assert_eq!(s.match_group(&by_py_func), Some(3));
        assert_eq!(s.match_group(&by_py_file), Some(4));
        assert_eq!(s.match_group(&none), None);
    }

    /// A name alone gets the verdict a group with that one name gets: the
    /// dump's per-name verdicts ask by name.
    #[test]
    fn a_name_gets_the_verdict_of_a_group_of_that_one_name() {
        let s = Suppressions::parse(
            "leak:^init_workspace$\nleak:/vendor/*.c\nleak:libnccl\nleak:*Create$\n",
            "test.supp",
        )
        .unwrap();
        let names = [
            "init_workspace",
            "init_workspace2",
            "/src/vendor/blas.c",
            "/usr/lib/libnccl.so.2",
            "cublasCreate",
            "cublasCreate_v2",
            "",
            "main",
        ];
        let mut by_name = s.matcher();
        let mut by_group = s.matcher();
        for name in names {
            let one = NativeFrame {
                function: Some(name.to_string()),
                ..NativeFrame::default()
            };
            let probe = Group::new(0, 0, "", MemoryKind::Device, vec![one], vec![]);
            assert_eq!(by_name.match_name(name), by_group.match_group(&probe), "{name:?}");
        }
        assert_eq!(by_name.match_name("init_workspace"), Some(0));
        assert_eq!(by_name.match_name("cublasCreate"), Some(3));
        assert_eq!(by_name.match_name(""), None);
        assert_eq!(Suppressions::none().matcher().match_name("init_workspace"), None);
    }

    #[test]
    fn apply_moves_groups_and_counts_hits() {
        let s = Suppressions::parse("leak:libnccl\n", "x").unwrap();
        let mut leaks = vec![
            group(&[("a", "a.c", "/lib/libnccl.so")], &[]),
            group(&[("b", "b.c", "/bin/app")], &[]),
            group(&[("c", "c.c", "/lib/libnccl.so")], &[]),
        ];
        let mut suppressed = vec![];
        let uses = s.apply(&mut leaks, &mut suppressed);
        assert_eq!(leaks.len(), 1);
        assert_eq!(suppressed.len(), 2);
        assert_eq!(suppressed[0].suppression.as_deref(), Some("libnccl"));
        assert_eq!(uses.len(), 1);
        assert_eq!((uses[0].groups, uses[0].blocks, uses[0].bytes), (2, 2, 200));
    }

    #[test]
    fn bad_lines_are_reported_with_their_place() {
        let e = Suppressions::parse("leak:ok\nrace:foo\n", "my.supp").unwrap_err();
        assert!(e.contains("my.supp:2"), "{e}");
        assert!(Suppressions::parse("just-a-pattern", "f").is_err());
        assert!(Suppressions::parse("leak:", "f").is_err());
    }

    /// The rule the pre-index code picked: every rule against every name.
    fn first_match_by_scan(s: &Suppressions, g: &Group) -> Option<usize> {
        frame_names(g).find_map(|name| s.rules.iter().position(|r| pattern_matches(&r.pattern, name)))
    }

    #[test]
    fn the_index_picks_the_same_rule_as_a_scan_of_every_rule() {
        let s = Suppressions::parse(
            "leak:zzz\nleak:*\nleak:^ab\nleak:b$\nleak:a*b*c\nleak:^$\nleak:abc\nleak:^x*y$\nleak:cuda\nleak:ab\n",
            "t",
        )
        .unwrap();
        let names = [
            "",
            "a",
            "ab",
            "abc",
            "cab",
            "xay",
            "xy",
            "libcudart",
            "zzzab",
            "qq",
            "b",
        ];
        for f in names {
            for m in names {
                let g = group(&[(f, "", m)], &[("py", m)]);
                assert_eq!(s.match_group(&g), first_match_by_scan(&s, &g), "{f:?} {m:?}");
            }
        }
        // Without the catch-all: rules that need their literal.
        let s = Suppressions::parse("leak:zzz\nleak:^ab\nleak:b$\nleak:a*b*c\nleak:x*y\n", "t").unwrap();
        for f in names {
            let g = group(&[(f, "f.c", "m.so")], &[]);
            assert_eq!(s.match_group(&g), first_match_by_scan(&s, &g), "{f:?}");
        }
    }

    /// At scale the index finds what a scan of every rule finds: 100,000
    /// rules, 5 groups of 30 frames that match none (every name checked),
    /// then one that matches the last rule. It also prints the time taken
    /// for docs/performance.md (never asserted: it is no test of speed;
    /// as one, it asserted almost nothing and was left ignored):
    /// `cargo test --release -p cudaleak-core suppressions_at_scale -- --nocapture`
    #[test]
    fn suppressions_at_scale() {
        let text: String = (0..100_000)
            .map(|i| format!("leak:^vendor_fn_{i}_init$\n"))
            .collect();
        let s = Suppressions::parse(&text, "big").unwrap();
        let mut groups: Vec<Group> = (0..5)
            .map(|i| {
                let frames: Vec<(String, String, String)> = (0..30)
                    .map(|d| {
                        (
                            format!("app_fn_{i}_{d}"),
                            format!("/src/app/file_{d}.cc"),
                            "/usr/lib/libapp.so".to_string(),
                        )
                    })
                    .collect();
                let refs: Vec<(&str, &str, &str)> = frames
                    .iter()
                    .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
                    .collect();
                group(&refs, &[])
            })
            .collect();
        groups.push(group(&[("vendor_fn_99999_init", "v.c", "libv.so")], &[]));
        let t = std::time::Instant::now();
        let mut m = s.matcher();
        let indexed: Vec<_> = groups.iter().map(|g| m.match_group(g)).collect();
        let after = t.elapsed();
        let t = std::time::Instant::now();
        let scanned: Vec<_> = groups.iter().map(|g| first_match_by_scan(&s, g)).collect();
        let before = t.elapsed() / groups.len() as u32;
        assert_eq!(indexed, scanned);
        assert!(indexed[..5].iter().all(Option::is_none));
        assert!(indexed[5].is_some());
        println!(
            "100,000 rules, 6 groups x 30 frames: indexed {:?} in all (index built in that), scan {:?} per group",
            after, before
        );
    }

    #[test]
    fn default_file_parses() {
        Suppressions::parse(DEFAULT_SUPPRESSIONS, "default").unwrap();
    }
}
