//! The always-on denylist (docs/protocol.md, "Permissions"): paths no tool call may touch,
//! whatever the mode and whatever a person granted. Data: the built-in rows below, the host's
//! own data directory and files, and what the host's config adds (`--deny-path`); nothing a
//! device sends can shorten it.

use std::path::{Component, Path, PathBuf};

/// One way a path is on the list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    /// The file or directory at this absolute path, and everything under it.
    Under(PathBuf),
    /// A file in the directory whose name starts with the prefix (`~/.ssh/id_*`).
    NamePrefixIn(PathBuf, String),
    /// Any file with this name, anywhere.
    Name(String),
    /// Any file whose name starts with this (`.env.*`).
    NamePrefix(String),
    /// Any file with this extension (`*.pem`).
    Extension(String),
    /// Writes under a directory with these consecutive names, anywhere (`.git/objects`).
    WritesUnder(&'static [&'static str]),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    rule: Rule,
    /// What the entry protects, as the refusal names it.
    what: &'static str,
}

/// The list, built once per host from its home, data directory and config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denylist {
    entries: Vec<Entry>,
}

/// Files under the home directory: credential bundles.
const HOME_FILES: &[(&str, &str)] = &[
    (".aws/credentials", "cloud credentials"),
    (".netrc", "credentials"),
    (".git-credentials", "credentials"),
    (".docker/config.json", "registry credentials"),
    (".kube/config", "cluster credentials"),
    (".config/gcloud", "cloud credentials"),
    // pi's own provider keys.
    (".pi/agent/auth.json", "the agent's provider keys"),
];

/// File names refused anywhere: environment files and package-registry tokens.
const NAMES: &[(&str, &str)] = &[
    (".env", "an environment file"),
    (".npmrc", "registry tokens"),
    (".pypirc", "registry tokens"),
];

/// Where pi finds code and settings it runs at its start: writes there are refused.
const PI_CODE: &[&[&str]] = &[
    &[".pi", "extensions"],
    &[".pi", "settings.json"],
    &[".pi", "agent"],
];

/// Extensions refused anywhere: private keys and certificate bundles.
const EXTENSIONS: &[&str] = &["pem", "key", "p12"];

impl Denylist {
    /// The built-in list for a host whose user's home is `home`, whose own files are
    /// `host_paths` (data directory, config, TLS files), plus the config's `extra` entries.
    pub fn new(home: Option<&Path>, host_paths: &[PathBuf], extra: &[String]) -> Denylist {
        let mut entries = Vec::new();
        let mut add = |rule, what| entries.push(Entry { rule, what });
        if let Some(home) = home {
            add(
                Rule::NamePrefixIn(home.join(".ssh"), "id_".into()),
                "a private key",
            );
            for (file, what) in HOME_FILES {
                add(Rule::Under(home.join(file)), what);
            }
        }
        for (name, what) in NAMES {
            add(Rule::Name((*name).into()), what);
        }
        add(Rule::NamePrefix(".env.".into()), "an environment file");
        for ext in EXTENSIONS {
            add(
                Rule::Extension((*ext).into()),
                "a private key or certificate bundle",
            );
        }
        add(
            Rule::WritesUnder(&[".git", "objects"]),
            "the repository's objects",
        );
        add(
            Rule::WritesUnder(&[".git", "hooks"]),
            "the repository's hooks",
        );
        // Like a hook, code pi runs later unasked: the extensions and settings it loads at its
        // next start (a project's `.pi/`, the user's `~/.pi/agent/`).
        for names in PI_CODE {
            add(
                Rule::WritesUnder(names),
                "what pi loads and runs at its start",
            );
        }
        for path in host_paths {
            add(Rule::Under(path.clone()), "pi-host's own files");
        }
        for entry in extra {
            if let Some(rule) = configured(entry, home) {
                add(rule, "a path the host's config denies");
            }
        }
        let mut list = Denylist { entries };
        list.add_real_paths();
        list
    }

    /// pi's provider keys (`auth.json`) in an agent config directory other than
    /// `~/.pi/agent` (`PI_CODING_AGENT_DIR`).
    pub fn add_agent_dir(&mut self, dir: &Path) {
        let file = dir.join("auth.json");
        let real = std::fs::canonicalize(&file).ok().filter(|r| *r != file);
        for path in std::iter::once(file).chain(real) {
            self.entries.push(Entry {
                rule: Rule::Under(path),
                what: "the agent's provider keys",
            });
        }
    }

    /// Each absolute entry also under its real path: a home or data directory reached through
    /// a symlink is judged by where it leads.
    fn add_real_paths(&mut self) {
        let mut more = Vec::new();
        for entry in &self.entries {
            let real = |dir: &Path| std::fs::canonicalize(dir).ok().filter(|r| r != dir);
            match &entry.rule {
                Rule::Under(path) => {
                    if let Some(real) = real(path) {
                        more.push(Entry {
                            rule: Rule::Under(real),
                            what: entry.what,
                        });
                    }
                }
                Rule::NamePrefixIn(dir, prefix) => {
                    if let Some(real) = real(dir) {
                        more.push(Entry {
                            rule: Rule::NamePrefixIn(real, prefix.clone()),
                            what: entry.what,
                        });
                    }
                }
                _ => {}
            }
        }
        self.entries.extend(more);
    }

    /// The host's list: the built-in entries for the user's `home`, the host's own files, the
    /// config's entries, and pi's provider keys where the agent's config directory was moved.
    pub fn for_host(config: &crate::config::ServeConfig, home: Option<&Path>) -> Denylist {
        let mut denylist = Denylist::new(home, &config.protected_paths(), &config.deny_paths);
        if let Some(dir) = std::env::var_os("PI_CODING_AGENT_DIR").filter(|d| !d.is_empty()) {
            denylist.add_agent_dir(Path::new(&dir));
        }
        denylist
    }

    /// What protects `path` (absolute, normalised), if anything; `write` when the call may
    /// change it.
    pub fn hit(&self, path: &Path, write: bool) -> Option<&'static str> {
        let name = path.file_name().map(|n| n.to_string_lossy());
        let name = name.as_deref().unwrap_or("");
        self.entries
            .iter()
            .find(|entry| matches(&entry.rule, path, name, write))
            .map(|entry| entry.what)
    }
}

fn matches(rule: &Rule, path: &Path, name: &str, write: bool) -> bool {
    match rule {
        Rule::Under(dir) => path.starts_with(dir),
        Rule::NamePrefixIn(dir, prefix) => path.parent() == Some(dir) && name.starts_with(prefix),
        Rule::Name(wanted) => name == wanted,
        Rule::NamePrefix(prefix) => name.starts_with(prefix.as_str()),
        Rule::Extension(ext) => path
            .extension()
            .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case(ext)),
        Rule::WritesUnder(names) => write && has_consecutive(path, names),
    }
}

fn has_consecutive(path: &Path, names: &[&str]) -> bool {
    let parts: Vec<_> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part.to_string_lossy()),
            _ => None,
        })
        .collect();
    parts
        .windows(names.len())
        .any(|w| w.iter().zip(names).all(|(a, b)| a == b))
}

/// A `--deny-path` entry: `/abs` or `~/rel` (that path and below), `*.ext`, or a file name.
fn configured(entry: &str, home: Option<&Path>) -> Option<Rule> {
    let entry = entry.trim();
    if let Some(rest) = entry.strip_prefix("~/") {
        return home.map(|home| Rule::Under(home.join(rest)));
    }
    if entry.starts_with('/') {
        return Some(Rule::Under(PathBuf::from(entry)));
    }
    if let Some(ext) = entry.strip_prefix("*.") {
        return (!ext.is_empty()).then(|| Rule::Extension(ext.into()));
    }
    (!entry.is_empty() && !entry.contains('/')).then(|| Rule::Name(entry.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Denylist {
        Denylist::new(
            Some(Path::new("/home/u")),
            &[PathBuf::from("/home/u/.pi-host")],
            &["~/secrets".into(), "*.kdbx".into(), "token.txt".into()],
        )
    }

    #[test]
    fn private_keys_only_under_ssh_with_the_id_prefix() {
        let l = list();
        assert!(l.hit(Path::new("/home/u/.ssh/id_ed25519"), false).is_some());
        assert!(l.hit(Path::new("/home/u/.ssh/id_rsa.pub"), false).is_some());
        assert!(
            l.hit(Path::new("/home/u/.ssh/known_hosts"), false)
                .is_none()
        );
        assert!(l.hit(Path::new("/home/u/ws/id_ed25519"), false).is_none());
    }

    #[test]
    fn names_and_extensions_anywhere() {
        let l = list();
        for denied in [
            "/w/.env",
            "/w/.env.local",
            "/w/a/server.pem",
            "/w/tls.KEY",
            "/w/c.p12",
            "/w/.npmrc",
            "/w/.pypirc",
            "/w/x.kdbx",
            "/w/token.txt",
        ] {
            assert!(l.hit(Path::new(denied), false).is_some(), "{denied}");
        }
        for allowed in [
            "/w/.envrc",
            "/w/env",
            "/w/keys.txt",
            "/w/a.pem.txt",
            "/w/npmrc",
            "/w/token.txt.bak",
        ] {
            assert!(l.hit(Path::new(allowed), false).is_none(), "{allowed}");
        }
    }

    #[test]
    fn credential_bundles_and_the_hosts_files_and_their_contents() {
        let l = list();
        for denied in [
            "/home/u/.aws/credentials",
            "/home/u/.netrc",
            "/home/u/.git-credentials",
            "/home/u/.docker/config.json",
            "/home/u/.kube/config",
            "/home/u/.config/gcloud",
            "/home/u/.config/gcloud/credentials.db",
            "/home/u/.pi/agent/auth.json",
            "/home/u/.pi-host/host.db",
            "/home/u/secrets/a",
        ] {
            assert!(l.hit(Path::new(denied), false).is_some(), "{denied}");
        }
        for allowed in [
            "/home/u/.aws/config",
            "/home/u/.docker/other.json",
            "/home/u/.config/gcloudx",
            "/home/u/.pi/agent/settings.json",
            "/home/u/.pi-hostx",
            "/home/u/secretsx",
        ] {
            assert!(l.hit(Path::new(allowed), false).is_none(), "{allowed}");
        }
    }

    #[test]
    fn git_objects_and_hooks_are_refused_to_writes_only() {
        let l = list();
        let object = Path::new("/w/.git/objects/ab/cdef");
        let hook = Path::new("/w/sub/.git/hooks/pre-commit");
        assert!(l.hit(object, true).is_some());
        assert!(l.hit(hook, true).is_some());
        assert!(l.hit(object, false).is_none());
        assert!(l.hit(Path::new("/w/.git/config"), true).is_none());
        assert!(l.hit(Path::new("/w/git/objects/x"), true).is_none());
    }

    #[test]
    fn what_pi_loads_at_its_start_is_refused_to_writes_only() {
        let l = list();
        for code in [
            "/w/.pi/extensions/evil.ts",
            "/w/.pi/settings.json",
            "/home/u/.pi/agent/extensions/x/index.ts",
            "/home/u/.pi/agent/models.json",
        ] {
            assert!(l.hit(Path::new(code), true).is_some(), "{code}");
            assert!(l.hit(Path::new(code), false).is_none(), "{code}");
        }
        for other in [
            "/w/.pi/notes.md",
            "/w/pi/extensions/a.ts",
            "/w/.pi/prompts/a.md",
        ] {
            assert!(l.hit(Path::new(other), true).is_none(), "{other}");
        }
    }

    #[test]
    fn the_agents_keys_where_its_config_directory_was_moved() {
        let mut l = list();
        let keys = Path::new("/srv/pi/auth.json");
        assert!(l.hit(keys, false).is_none());
        l.add_agent_dir(Path::new("/srv/pi"));
        assert!(l.hit(keys, false).is_some());
        assert!(l.hit(Path::new("/srv/pi/models.json"), false).is_none());
    }

    #[test]
    fn config_entries_only_add() {
        assert_eq!(configured("", None), None);
        assert_eq!(configured("*.", None), None);
        assert_eq!(configured("a/b", None), None);
        assert_eq!(configured("~/x", None), None);
        assert_eq!(
            configured("/srv/keys", None),
            Some(Rule::Under("/srv/keys".into()))
        );
        let base = Denylist::new(Some(Path::new("/home/u")), &[], &[]);
        let more = Denylist::new(Some(Path::new("/home/u")), &[], &["/srv".into()]);
        assert!(more.entries.len() > base.entries.len());
        assert!(more.entries.starts_with(&base.entries));
    }
}
