//! Which paths of a workspace the watcher leaves out (docs/protocol.md §8.9): `.git` and
//! `node_modules` anywhere, and what the workspace's top `.gitignore` ignores.
//!
//! The `.gitignore` support is git's pattern syntax for that one file: blank lines and `#`
//! comments, `!` negation (the last matching line wins), a trailing `/` for directories only,
//! a `/` at the start or in the middle anchoring the pattern to the workspace, `*`, `?`, `[...]`
//! and `**`. Nested `.gitignore` files, `.git/info/exclude` and the global excludes file are not
//! read: a path they ignore is reported (a change too many, never one missed). The `ignore`
//! crate would read them all, at the cost of its dependency tree; this subset covers the file
//! every project has.

use std::path::Path;

/// Directory names never watched, wherever they are.
const ALWAYS_IGNORED: [&str; 2] = [".git", "node_modules"];

/// Most `.gitignore` lines read (a generated file of thousands is not worth matching).
const MAX_RULES: usize = 1000;

#[derive(Debug, Default)]
pub struct Ignore {
    rules: Vec<Rule>,
}

#[derive(Debug)]
struct Rule {
    pattern: Vec<u8>,
    negated: bool,
    dir_only: bool,
    /// Matched against the whole relative path, not only the last name.
    anchored: bool,
}

impl Ignore {
    /// The rules of `root/.gitignore` (none when it is missing or unreadable).
    pub fn of(root: &Path) -> Ignore {
        let text = std::fs::read_to_string(root.join(".gitignore")).unwrap_or_default();
        Ignore::parse(&text)
    }

    pub fn parse(text: &str) -> Ignore {
        let rules = text
            .lines()
            .filter_map(|line| Rule::parse(line.trim_end()))
            .take(MAX_RULES)
            .collect();
        Ignore { rules }
    }

    /// Whether `relative` (`/`-separated, relative to the workspace) is left out; `dir` when
    /// it is a directory. A path under an ignored directory is ignored with it.
    pub fn ignores(&self, relative: &str, dir: bool) -> bool {
        let parts: Vec<&str> = relative.split('/').filter(|p| !p.is_empty()).collect();
        for (i, name) in parts.iter().enumerate() {
            let is_dir = dir || i + 1 < parts.len();
            if is_dir && ALWAYS_IGNORED.contains(name) {
                return true;
            }
            let prefix = parts[..=i].join("/");
            if self.matches(&prefix, name, is_dir) {
                return true;
            }
        }
        false
    }

    fn matches(&self, path: &str, name: &str, dir: bool) -> bool {
        let mut ignored = false;
        for rule in &self.rules {
            if rule.dir_only && !dir {
                continue;
            }
            let subject = if rule.anchored { path } else { name };
            if glob(&rule.pattern, subject.as_bytes()) {
                ignored = !rule.negated;
            }
        }
        ignored
    }
}

impl Rule {
    fn parse(line: &str) -> Option<Rule> {
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (negated, line) = match line.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, line.strip_prefix('\\').unwrap_or(line)),
        };
        let (dir_only, line) = match line.strip_suffix('/') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let anchored = line.contains('/');
        let line = line.strip_prefix('/').unwrap_or(line);
        if line.is_empty() {
            return None;
        }
        Some(Rule {
            pattern: line.as_bytes().to_vec(),
            negated,
            dir_only,
            anchored,
        })
    }
}

/// git's wildmatch, enough of it: `*` and `?` stop at `/`, `**` crosses it, `[...]` a class.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.first() {
        None => text.is_empty(),
        Some(b'*') if pattern.get(1) == Some(&b'*') => {
            let rest = pattern[2..].strip_prefix(b"/").unwrap_or(&pattern[2..]);
            (0..=text.len()).any(|i| glob(rest, &text[i..]))
        }
        Some(b'*') => {
            let rest = &pattern[1..];
            for i in 0..=text.len() {
                if glob(rest, &text[i..]) {
                    return true;
                }
                if text.get(i) == Some(&b'/') {
                    break;
                }
            }
            false
        }
        Some(b'?') => text.first().is_some_and(|c| *c != b'/') && glob(&pattern[1..], &text[1..]),
        Some(b'[') => match (class(&pattern[1..]), text.first()) {
            (Some((matches, len)), Some(c)) if *c != b'/' && matches(*c) => {
                glob(&pattern[1 + len..], &text[1..])
            }
            (Some(_), _) => false,
            (None, Some(b'[')) => glob(&pattern[1..], &text[1..]),
            (None, _) => false,
        },
        Some(b'\\') if pattern.len() > 1 => {
            text.first() == Some(&pattern[1]) && glob(&pattern[2..], &text[1..])
        }
        Some(c) => text.first() == Some(c) && glob(&pattern[1..], &text[1..]),
    }
}

/// A `[...]` class after its `[`: a matcher and the class's length up to and with its `]`.
#[allow(clippy::type_complexity)]
fn class(pattern: &[u8]) -> Option<(Box<dyn Fn(u8) -> bool>, usize)> {
    let end = pattern.iter().skip(1).position(|c| *c == b']')? + 1;
    let body = &pattern[..end];
    let (negated, body) = match body.first() {
        Some(b'!' | b'^') => (true, &body[1..]),
        _ => (false, body),
    };
    let body = body.to_vec();
    let matcher = move |c: u8| {
        let mut i = 0;
        let mut hit = false;
        while i < body.len() {
            if i + 2 < body.len() && body[i + 1] == b'-' {
                hit |= body[i] <= c && c <= body[i + 2];
                i += 3;
            } else {
                hit |= body[i] == c;
                i += 1;
            }
        }
        hit != negated
    };
    Some((Box::new(matcher), end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_and_node_modules_are_left_out_anywhere() {
        let none = Ignore::default();
        assert!(none.ignores(".git", true));
        assert!(none.ignores(".git/objects/ab/cdef", false));
        assert!(none.ignores("web/node_modules/x/index.js", false));
        assert!(!none.ignores("src/main.rs", false));
        // A file merely named so is not a directory to leave out.
        assert!(!none.ignores("docs/node_modules", false));
    }

    #[test]
    fn gitignore_patterns_as_git_reads_them() {
        let rules = Ignore::parse(
            "# comment\n\n*.log\n/build\ntarget/\ndocs/*.tmp\n!keep.log\ncache/**/x\n[ab].o\n",
        );
        assert!(rules.ignores("a.log", false));
        assert!(rules.ignores("deep/er/a.log", false));
        assert!(!rules.ignores("keep.log", false), "negation wins when last");
        assert!(rules.ignores("build", true));
        assert!(rules.ignores("build/out.bin", false));
        assert!(!rules.ignores("src/build", true), "anchored to the top");
        assert!(rules.ignores("src/target", true));
        assert!(!rules.ignores("src/target", false), "directories only");
        assert!(rules.ignores("docs/a.tmp", false));
        assert!(!rules.ignores("docs/sub/a.tmp", false), "* stops at /");
        assert!(rules.ignores("cache/1/2/x", false));
        assert!(rules.ignores("a.o", false));
        assert!(!rules.ignores("c.o", false));
    }
}
