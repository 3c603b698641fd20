//! Where the agent program is: the configured command's program resolved to an absolute path
//! (a bare name looked up in [`search_dirs`], in order), and, for a Node program, the Node that
//! runs it. File system lookups only: nothing is run here.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What the lookup depends on besides the file system: taken from the host's environment.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub path: Option<OsString>,
    pub home: Option<PathBuf>,
    /// `$NVM_DIR` (default `~/.nvm`) and `$NVM_BIN` (set in a shell where nvm is active).
    pub nvm_dir: Option<PathBuf>,
    pub nvm_bin: Option<PathBuf>,
    pub data_dir: PathBuf,
}

impl Env {
    pub fn current(data_dir: &Path) -> Env {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        Env {
            path: var("PATH"),
            home: var("HOME").map(PathBuf::from),
            nvm_dir: var("NVM_DIR").map(PathBuf::from),
            nvm_bin: var("NVM_BIN").map(PathBuf::from),
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// The directories of `PATH`, in order (relative entries are skipped: the host's working
    /// directory is not a place to run programs from).
    fn path_dirs(&self) -> Vec<PathBuf> {
        self.path
            .as_deref()
            .map(|path| {
                std::env::split_paths(path)
                    .filter(|dir| dir.is_absolute())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Where a bare program name is looked for, in this order: `PATH`, `~/.local/bin`,
/// `~/.npm-global/bin`, nvm's bin (`$NVM_BIN`, else the version `alias/default` names, else the
/// newest installed), and `DATA_DIR/agent/current/bin`, where pi-host's own agent goes. A host
/// run as a service has the system's default `PATH`, so an agent installed for the user is
/// found by the places after it.
pub fn search_dirs(env: &Env) -> Vec<PathBuf> {
    let mut dirs = env.path_dirs();
    if let Some(home) = &env.home {
        dirs.push(home.join(".local/bin"));
        dirs.push(home.join(".npm-global/bin"));
    }
    dirs.extend(nvm_bin(env));
    dirs.push(env.data_dir.join("agent/current/bin"));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|dir| seen.insert(dir.clone()));
    dirs
}

/// nvm's bin directory for the version a new shell would use.
fn nvm_bin(env: &Env) -> Option<PathBuf> {
    if let Some(bin) = &env.nvm_bin {
        return Some(bin.clone());
    }
    let root = env
        .nvm_dir
        .clone()
        .or_else(|| env.home.as_ref().map(|home| home.join(".nvm")))?;
    let mut installed: Vec<(super::version::Version, String)> =
        std::fs::read_dir(root.join("versions/node"))
            .ok()?
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                Some((super::version::Version::parse(&name)?, name))
            })
            .collect();
    installed.sort();
    let default = std::fs::read_to_string(root.join("alias/default")).unwrap_or_default();
    let wanted = default.trim().trim_start_matches('v');
    // `22`, `22.1` or `v22.1.0` pick the newest installed version they prefix; an alias
    // (`node`, `lts/*`, ...) or nothing picks the newest installed.
    let matches = |name: &str| {
        let name = name.trim_start_matches('v');
        !wanted.is_empty() && (name == wanted || name.starts_with(&format!("{wanted}.")))
    };
    let chosen = installed
        .iter()
        .rev()
        .find(|(_, name)| matches(name))
        .or(installed.last())?;
    Some(root.join("versions/node").join(&chosen.1).join("bin"))
}

/// The outcome of a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing at `path` (a configured path), or nowhere in `looked_in` (a bare name).
    Missing {
        program: String,
        looked_in: Vec<PathBuf>,
    },
    Agent(Located),
}

/// The agent as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The words that start the agent, before its own arguments: `[PATH]`, or `[NODE, SCRIPT]`
    /// for a command that runs a script with `node`; every word absolute.
    pub launcher: Vec<String>,
    /// How many words of the configured command the launcher replaces.
    pub replaces: usize,
    /// The agent: its program or, run by `node`, its script.
    pub path: PathBuf,
    pub runtime: Runtime,
}

/// What runs the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runtime {
    /// Not a Node program (a native binary, or a script of another interpreter).
    Native,
    /// A Node program and its Node. `beside`: it was found in the agent's own directory rather
    /// than on `PATH`, so the agent runs with that directory first on its `PATH` (its
    /// `#!/usr/bin/env node` line must find that Node too).
    Node { node: PathBuf, beside: bool },
    /// A Node program, and no `node` beside it or on `PATH`.
    NodeMissing,
}

/// Finds the agent of the command line `words` (already split).
pub fn locate(words: &[String], env: &Env) -> Found {
    let Some(program) = words.first() else {
        return Found::Missing {
            program: String::new(),
            looked_in: Vec::new(),
        };
    };
    let path = match find_program(program, env) {
        Ok(path) => path,
        Err(looked_in) => {
            return Found::Missing {
                program: program.clone(),
                looked_in,
            };
        }
    };
    if is_node(&path) {
        // `node SCRIPT ARGS...`: the script is the agent.
        if let Some(script) = words.get(1).filter(|word| !word.starts_with('-')) {
            let script_path = absolute(script);
            if !script_path.is_file() {
                return Found::Missing {
                    program: script.clone(),
                    looked_in: vec![script_path],
                };
            }
            return Found::Agent(Located {
                launcher: vec![display(&path), display(&script_path)],
                replaces: 2,
                path: script_path,
                runtime: Runtime::Node {
                    node: path,
                    beside: false,
                },
            });
        }
    }
    let runtime = if shebang_wants_node(&path) {
        find_node(&path, env)
    } else {
        Runtime::Native
    };
    Found::Agent(Located {
        launcher: vec![display(&path)],
        replaces: 1,
        path,
        runtime,
    })
}

/// A program with a `/` is taken as a path (made absolute); a bare name is looked for in
/// [`search_dirs`]. Err: the places it is not.
fn find_program(program: &str, env: &Env) -> Result<PathBuf, Vec<PathBuf>> {
    if program.contains('/') {
        let path = absolute(program);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(vec![path])
        };
    }
    let dirs = search_dirs(env);
    dirs.iter()
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or(dirs)
}

fn find_node(agent: &Path, env: &Env) -> Runtime {
    if let Some(node) = shebang_node_path(agent) {
        return if is_executable(&node) {
            Runtime::Node {
                node,
                beside: false,
            }
        } else {
            Runtime::NodeMissing
        };
    }
    let beside = agent.parent().map(|dir| dir.join("node"));
    if let Some(node) = beside.filter(|node| is_executable(node)) {
        let on_path = env
            .path_dirs()
            .into_iter()
            .map(|dir| dir.join("node"))
            .find(|candidate| is_executable(candidate));
        return Runtime::Node {
            beside: on_path.as_ref() != Some(&node),
            node,
        };
    }
    env.path_dirs()
        .into_iter()
        .map(|dir| dir.join("node"))
        .find(|candidate| is_executable(candidate))
        .map_or(Runtime::NodeMissing, |node| Runtime::Node {
            node,
            beside: false,
        })
}

/// The interpreter named by the file's `#!` line (for `#!/usr/bin/env [-S] NAME`, NAME).
fn interpreter(path: &Path) -> Option<String> {
    let mut head = [0u8; 256];
    let mut file = std::fs::File::open(path).ok()?;
    let n = file.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    let first = words.next()?;
    if Path::new(first)
        .file_name()
        .is_some_and(|name| name == "env")
    {
        return words
            .find(|word| !word.starts_with('-'))
            .map(str::to_string);
    }
    Some(first.to_string())
}

fn shebang_wants_node(path: &Path) -> bool {
    interpreter(path).is_some_and(|name| is_node(Path::new(&name)))
}

/// The Node a `#!/abs/path/node` line names (None for `#!/usr/bin/env node`).
fn shebang_node_path(path: &Path) -> Option<PathBuf> {
    interpreter(path)
        .map(PathBuf::from)
        .filter(|node| node.is_absolute() && is_node(node))
}

fn is_node(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name == "node" || name == "nodejs")
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

fn absolute(path: &str) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| PathBuf::from(path))
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn env(root: &Path, path: &[&str]) -> Env {
        Env {
            path: Some(std::env::join_paths(path.iter().map(|p| root.join(p))).unwrap()),
            home: Some(root.join("home")),
            nvm_dir: None,
            nvm_bin: None,
            data_dir: root.join("data"),
        }
    }

    fn words(text: &str) -> Vec<String> {
        shell_words::split(text).unwrap()
    }

    #[test]
    fn a_bare_name_is_found_on_path_first_then_in_the_user_places_in_order() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let env = env(root, &["bin"]);
        let missing = locate(&words("pi --mode rpc"), &env);
        let Found::Missing { looked_in, .. } = missing else {
            panic!("{missing:?}")
        };
        assert_eq!(
            looked_in,
            vec![
                root.join("bin"),
                root.join("home/.local/bin"),
                root.join("home/.npm-global/bin"),
                root.join("data/agent/current/bin"),
            ]
        );
        script(&root.join("data/agent/current/bin/pi"), "#!/bin/sh\n");
        script(&root.join("home/.npm-global/bin/pi"), "#!/bin/sh\n");
        let Found::Agent(found) = locate(&words("pi --mode rpc"), &env) else {
            panic!()
        };
        assert_eq!(found.path, root.join("home/.npm-global/bin/pi"));
        assert_eq!(found.runtime, Runtime::Native);
        // Not executable: not a candidate.
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/pi"), "#!/bin/sh\n").unwrap();
        assert_eq!(
            expect_agent(locate(&words("pi"), &env)).path,
            root.join("home/.npm-global/bin/pi")
        );
        script(&root.join("bin/pi"), "#!/bin/sh\n");
        let Found::Agent(found) = locate(&words("pi"), &env) else {
            panic!()
        };
        assert_eq!(found.launcher, vec![display(&root.join("bin/pi"))]);
    }

    #[test]
    fn nvm_s_default_version_is_searched() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let env = env(root, &["bin"]);
        for version in ["v18.20.0", "v20.11.1", "v22.3.0"] {
            std::fs::create_dir_all(
                root.join("home/.nvm/versions/node")
                    .join(version)
                    .join("bin"),
            )
            .unwrap();
        }
        let bin = |v: &str| root.join("home/.nvm/versions/node").join(v).join("bin");
        assert_eq!(nvm_bin(&env), Some(bin("v22.3.0")), "no alias: the newest");
        std::fs::create_dir_all(root.join("home/.nvm/alias")).unwrap();
        std::fs::write(root.join("home/.nvm/alias/default"), "20\n").unwrap();
        assert_eq!(nvm_bin(&env), Some(bin("v20.11.1")));
        std::fs::write(root.join("home/.nvm/alias/default"), "lts/*\n").unwrap();
        assert_eq!(nvm_bin(&env), Some(bin("v22.3.0")));
    }

    #[test]
    fn a_node_program_gets_the_node_beside_it_before_the_one_on_path() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let env = env(root, &["bin"]);
        let pi = root.join("home/.local/bin/pi");
        script(&pi, "#!/usr/bin/env node\nconsole.log('x')\n");
        assert_eq!(
            expect_agent(locate(&words("pi"), &env)).runtime,
            Runtime::NodeMissing
        );
        script(&root.join("bin/node"), "#!/bin/sh\n");
        assert_eq!(
            expect_agent(locate(&words("pi"), &env)).runtime,
            Runtime::Node {
                node: root.join("bin/node"),
                beside: false
            }
        );
        script(&root.join("home/.local/bin/node"), "#!/bin/sh\n");
        assert_eq!(
            expect_agent(locate(&words("pi"), &env)).runtime,
            Runtime::Node {
                node: root.join("home/.local/bin/node"),
                beside: true
            }
        );
        // An absolute interpreter is the one.
        script(&pi, &format!("#!{}\n", root.join("bin/node").display()));
        assert_eq!(
            expect_agent(locate(&words("pi"), &env)).runtime,
            Runtime::Node {
                node: root.join("bin/node"),
                beside: false
            }
        );
    }

    #[test]
    fn node_with_a_script_is_the_script_run_by_that_node() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let env = env(root, &["bin"]);
        script(&root.join("bin/node"), "#!/bin/sh\n");
        let cli = root.join("pkg/cli.js");
        script(&cli, "#!/usr/bin/env node\n");
        let found = expect_agent(locate(
            &words(&format!("node {} --mode rpc", cli.display())),
            &env,
        ));
        assert_eq!(found.path, cli);
        assert_eq!(found.replaces, 2);
        assert_eq!(
            found.launcher,
            vec![display(&root.join("bin/node")), display(&cli)]
        );
        let gone = locate(&words("node /nonexistent/cli.js"), &env);
        assert!(matches!(gone, Found::Missing { program, .. } if program == "/nonexistent/cli.js"));
        let path = locate(&words("/nonexistent/pi --mode rpc"), &env);
        assert!(
            matches!(&path, Found::Missing { looked_in, .. } if looked_in == &[PathBuf::from("/nonexistent/pi")]),
            "{path:?}"
        );
    }

    fn expect_agent(found: Found) -> Located {
        match found {
            Found::Agent(located) => located,
            other => panic!("{other:?}"),
        }
    }
}
