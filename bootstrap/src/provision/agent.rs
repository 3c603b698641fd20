//! The agent the host drives: pi, installed by `connect` into pi-host's own directory on the
//! remote (`R/data/agent/versions/V`, beside which the host's agent check also looks) and named
//! by absolute path in the remote's `config.toml`, so the host never looks it up on `PATH`.
//!
//! From the remote's own npm: `npm install --global --prefix` into a staging directory, a
//! `bin/node` link to the Node that npm ran with (a service's `PATH` is the system's, so pi's
//! `#!/usr/bin/env node` must find its Node beside it), pi's `--version` checked, then renamed
//! into place; the config line is written last. A failure leaves the previous agent, its config
//! line and the running host as they were (docs/architecture.md, "One `pi-remote connect`").
//!
//! From a bundle (provision/bundle/) when the remote's npm cannot do it: a remote without a
//! Node pi runs on gets one in the bundle (`bin/node`), one without npm, or whose npm cannot
//! reach a registry, gets pi's tree made on the desktop; unpacked into the same staging
//! directory, checked and renamed the same way.
//!
//! The config line ends with [`MARK`]: a connect rewrites only a line it wrote. An `agent` line
//! without it is the operator's, and then the agent is left alone.

use super::bundle::{self, BundleSpec};
use super::remote_shell::{
    AgentConfig, AgentInstall, AgentSource, Libc, MARK, MIN_NODE_VERSION, Probe, RemoteNode,
    Running,
};
use super::stage::Stage;
use racp_proto::AppError;
use racp_proto::methods::host::AgentState;
use serde_json::{Value, json};

/// pi's npm package.
pub const PI_PACKAGE: &str = "@mariozechner/pi-coding-agent";

/// The pi version the project is tested with, the one deploy/agent/ pins (the bundle's tree).
pub use super::bundle::PI_VERSION;

/// What a connect does about the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentWork {
    /// Nothing: the reason, for the skipped stage.
    Keep(String),
    /// Install (or check and keep) pi `version` and write its config line.
    Install(AgentInstall),
}

/// Where pi `version` goes under the remote's install root.
pub fn agent_dir(root: &str, version: &str) -> String {
    format!("{root}/data/agent/versions/{version}")
}

/// The agent command the host runs: pi by absolute path, in RPC mode.
pub fn agent_command(root: &str, version: &str) -> String {
    let pi = format!("{}/bin/pi", agent_dir(root, version));
    shell_words::join([pi.as_str(), "--mode", "rpc"])
}

/// `agent = "..." # written by pi-remote connect`.
pub fn config_line(root: &str, version: &str) -> String {
    format!(
        "agent = {} {MARK}",
        toml_string(&agent_command(root, version))
    )
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Decides from the probe: the operator's agent is kept; pi `version` installed where the
/// config names it, and run by the host that runs (or none runs), is kept; anything else is
/// installed (the remote keeps a copy it finds working, so only the config and a restart
/// remain).
pub fn decide(probe: &Probe, running: Option<&Running>, version: &str) -> AgentWork {
    if let AgentConfig::Operator(_) = probe.agent_config {
        return AgentWork::Keep("the remote's config.toml names its own agent".into());
    }
    let line = config_line(&probe.root, version);
    let configured = probe.agent_config == AgentConfig::Ours(line.clone())
        && probe.agent_installed.as_deref() == Some(version);
    let pi = format!("{}/bin/pi", agent_dir(&probe.root, version));
    let host_runs_it = || {
        probe.host_agent().is_some_and(|agent| {
            agent.state == AgentState::Ready
                && agent.path.as_deref() == Some(pi.as_str())
                && agent.version.as_deref() == Some(version)
        })
    };
    if configured && (running.is_none() || host_runs_it()) {
        return AgentWork::Keep(format!("pi {version} is installed"));
    }
    AgentWork::Install(AgentInstall {
        package: PI_PACKAGE.into(),
        version: version.into(),
        config_line: line,
        source: AgentSource::Npm,
    })
}

/// Where the remote gets pi, decided from the probe before anything is uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The remote's npm (or the copy it has, which it keeps when that runs).
    Npm,
    /// A bundle made here.
    Bundle(BundleSpec),
}

/// The remote's npm when it has a Node pi runs on and an npm beside it, unless this machine
/// has a bundle for it made already (`cached`): a bundle goes up and unpacks in seconds, npm
/// takes ten or more (docs/benchmarks.md §5). Else a bundle (with Node when the remote has
/// none pi runs on); refused, before anything is uploaded, when no bundle can serve it. A
/// probe that did not look (the host was current) leaves it to the remote, which says what it
/// misses.
/// `npm_failed`: the remote's npm was tried and could not install pi.
pub fn source(
    probe: &Probe,
    version: &str,
    npm_failed: bool,
    cached: impl Fn(BundleSpec) -> bool,
) -> Result<Source, AppError> {
    let node_ok = probe.node.as_ref().is_some_and(RemoteNode::is_enough);
    let keeps_its_own = probe.os.is_empty() || probe.agent_installed.as_deref() == Some(version);
    if !npm_failed && keeps_its_own {
        return Ok(Source::Npm);
    }
    if !npm_failed && node_ok && probe.npm.is_some() {
        let linux = super::release::normalize_os(&probe.os) == "linux";
        let made = bundle::npm_cpu(&probe.arch)
            .filter(|_| linux && version == PI_VERSION)
            .map(|cpu| BundleSpec {
                cpu,
                with_node: false,
            })
            .filter(|spec| cached(*spec));
        return Ok(made.map_or(Source::Npm, Source::Bundle));
    }
    let refusal = NoSource::new(probe);
    if version != PI_VERSION {
        return Err(refusal.not_bundled(version));
    }
    let linux = super::release::normalize_os(&probe.os) == "linux";
    let Some(cpu) = bundle::npm_cpu(&probe.arch).filter(|_| linux) else {
        return Err(refusal.no_bundle(
            "no_node_build",
            format!(
                "Node.js has no official build for {} {}",
                probe.os, probe.arch
            ),
        ));
    };
    if node_ok {
        return Ok(Source::Bundle(BundleSpec {
            cpu,
            with_node: false,
        }));
    }
    if let Some((reason, why)) = node_build_refuses(&probe.libc) {
        return Err(refusal.no_bundle(reason, why));
    }
    Ok(Source::Bundle(BundleSpec {
        cpu,
        with_node: true,
    }))
}

/// Why Node.js's official Linux build cannot run on a remote with `libc`: the reason for the
/// details and the words for the message.
fn node_build_refuses(libc: &Libc) -> Option<(&'static str, String)> {
    match (libc.family.as_str(), libc.version.as_deref()) {
        ("musl", _) => Some((
            "no_node_build",
            format!(
                "Node.js's official Linux builds need glibc {} and the remote has musl",
                bundle::NODE_GLIBC_MIN
            ),
        )),
        ("glibc", Some(v))
            if super::remote_shell::version_cmp(v, bundle::NODE_GLIBC_MIN).is_lt() =>
        {
            Some((
                "glibc_too_old",
                format!(
                    "Node.js's official Linux builds need glibc {} or newer and the remote has glibc {v}",
                    bundle::NODE_GLIBC_MIN
                ),
            ))
        }
        _ => None,
    }
}

/// The agent stage's failure when pi can come from nowhere: what the remote has and the fix.
struct NoSource<'a> {
    probe: &'a Probe,
    /// The remote's Node, in words.
    found: String,
    fix: String,
    details: Value,
}

impl<'a> NoSource<'a> {
    fn new(probe: &'a Probe) -> Self {
        let fix = format!(
            "install Node.js {} or newer with npm on the remote and connect again, or name your own agent in {}/config.toml (agent = \"/path/to/pi --mode rpc\")",
            MIN_NODE_VERSION, probe.root
        );
        let details = json!({"node": probe.node.as_ref().map(|n| json!({"path": n.path, "version": n.version})), "npm": probe.npm, "hint": fix});
        NoSource {
            probe,
            found: found_node(probe),
            fix,
            details,
        }
    }

    /// Only the pinned version can be bundled: `version` needs the remote's npm.
    fn not_bundled(&self, version: &str) -> AppError {
        let (found, fix) = (&self.found, &self.fix);
        super::stage_failed(
            Stage::Agent,
            format!(
                "pi {version} can come only from the remote's npm, and pi needs Node.js {MIN_NODE_VERSION} or newer with npm where the remote has {found}; {fix}"
            ),
            self.details.clone(),
        )
    }

    /// No bundle runs on the remote: `reason` goes into the details, `why` into the message.
    fn no_bundle(&self, reason: &str, why: String) -> AppError {
        let probe = self.probe;
        let (found, fix) = (&self.found, &self.fix);
        let mut details = self.details.clone();
        details["reason"] = json!(reason);
        details["found"] = json!({"os": probe.os, "arch": probe.arch, "libc": probe.libc.family, "libcVersion": probe.libc.version});
        super::stage_failed(
            Stage::Agent,
            format!(
                "pi needs Node.js {MIN_NODE_VERSION} or newer and the remote has {found}; {why}; nothing was uploaded; {fix}"
            ),
            details,
        )
    }
}

/// Whether `error` is the remote's npm failing to install pi (session.sh exits 82 then).
pub fn npm_failed(error: &AppError) -> bool {
    error
        .details()
        .is_some_and(|d| d["reason"] == Stage::Agent.as_str() && d["exitCode"] == 82)
}

/// The remote's Node as the messages name it.
pub fn found_node(probe: &Probe) -> String {
    match &probe.node {
        Some(node) if node.is_enough() && probe.npm.is_none() => format!(
            "Node.js {} at {} but no npm",
            node.version.as_deref().unwrap_or("?"),
            node.path
        ),
        Some(RemoteNode {
            path,
            version: Some(version),
        }) => format!("Node.js {version} at {path}"),
        Some(RemoteNode {
            path,
            version: None,
        }) => format!("a node at {path} that does not run"),
        None => "no Node.js".to_string(),
    }
}

/// A pi version as a plain name: it goes into paths and the plan line.
pub fn valid_version(version: &str) -> bool {
    !version.is_empty()
        && version.starts_with(|c: char| c.is_ascii_digit())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::remote_shell::printf_word;

    fn probe(extra: &str) -> Probe {
        Probe::parse(&format!("root=/home/u/.pi-host\n{extra}")).unwrap()
    }

    #[test]
    fn the_pinned_version_is_the_one_the_tests_run() {
        let lock = include_str!("../../../tests/pi/package-lock.json");
        let lock: serde_json::Value = serde_json::from_str(lock).unwrap();
        let tested = &lock["packages"][format!("node_modules/{PI_PACKAGE}")]["version"];
        assert_eq!(tested, PI_VERSION);
    }

    #[test]
    fn the_config_line_is_toml_naming_pi_by_absolute_path() {
        let line = config_line("/home/a user/.pi-host", "0.73.1");
        assert_eq!(
            line,
            format!(
                "agent = \"'/home/a user/.pi-host/data/agent/versions/0.73.1/bin/pi' --mode rpc\" {MARK}"
            )
        );
        let odd = config_line("/h/\"q\\\n", "1.0.0");
        assert!(
            odd.starts_with("agent = \"'/h/\\\"q\\\\\\u000A/data"),
            "{odd}"
        );
    }

    #[test]
    fn printf_words_carry_any_text_as_one_plain_word() {
        let text = "agent = \"'/h s/%d\\n' x\" # é";
        let word = printf_word(text);
        assert!(word.chars().all(|c| c.is_ascii_alphanumeric() || c == '\\'));
        // As session.sh prints it: the plan's word, split from the line, in double quotes.
        let printed = std::process::Command::new("sh")
            .args([
                "-c",
                "set -f; set -- $0; printf \"$2\"",
                &format!("go {word}"),
            ])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(printed.stdout).unwrap(), text);
    }

    #[test]
    fn the_operator_s_agent_is_kept_and_ours_is_installed_until_the_host_runs_it() {
        let operator = probe("agentconf=agent = \"/opt/my-agent\"\n");
        assert!(matches!(
            decide(&operator, None, PI_VERSION),
            AgentWork::Keep(_)
        ));
        let AgentWork::Install(install) = decide(&probe(""), None, PI_VERSION) else {
            panic!("no agent: install");
        };
        assert_eq!(install.version, PI_VERSION);
        let line = config_line("/home/u/.pi-host", PI_VERSION);
        assert_eq!(install.config_line, line);

        let installed = probe(&format!("agentconf={line}\nagentv={PI_VERSION}\n"));
        assert!(matches!(
            decide(&installed, None, PI_VERSION),
            AgentWork::Keep(_)
        ));
        // Another version wanted: installed again.
        assert!(matches!(
            decide(&installed, None, "0.74.0"),
            AgentWork::Install(_)
        ));
        // A running host that does not run it (started before the config named it).
        let running = Running {
            version: "0.1.0".into(),
            port: 1,
            draining: false,
            cert_sha256: None,
        };
        assert!(matches!(
            decide(&installed, Some(&running), PI_VERSION),
            AgentWork::Install(_)
        ));
        let status = serde_json::json!({"agent": {"state": "ready", "version": PI_VERSION,
            "path": format!("/home/u/.pi-host/data/agent/versions/{PI_VERSION}/bin/pi")}});
        let runs_it = probe(&format!(
            "agentconf={line}\nagentv={PI_VERSION}\nstatus={status}\n"
        ));
        assert!(matches!(
            decide(&runs_it, Some(&running), PI_VERSION),
            AgentWork::Keep(_)
        ));
    }

    #[test]
    fn pi_comes_from_the_remote_s_npm_else_a_bundle_else_a_refusal_naming_why() {
        let linux = "os=Linux\narch=x86_64\nlibc=glibc 2.36\n";
        let node = "nodebin=/usr/bin/node\nnode=v20.20.2\n";
        let npm = "npmbin=/usr/bin/npm\n";
        let decide_for = |extra: &str, npm_failed: bool| {
            source(
                &probe(&format!("{linux}{extra}")),
                PI_VERSION,
                npm_failed,
                |_| false,
            )
        };
        let bundle = |with_node| {
            Source::Bundle(BundleSpec {
                cpu: "x64",
                with_node,
            })
        };
        assert_eq!(
            decide_for(&format!("{node}{npm}"), false).unwrap(),
            Source::Npm
        );
        assert_eq!(
            decide_for(&format!("{node}{npm}"), true).unwrap(),
            bundle(false)
        );
        assert_eq!(decide_for(node, false).unwrap(), bundle(false));
        // A bundle made here already beats the remote's npm; only the one without Node, and
        // only for the pinned version.
        let with_npm = probe(&format!("{linux}{node}{npm}"));
        let cached_here = |spec: BundleSpec| {
            spec == BundleSpec {
                cpu: "x64",
                with_node: false,
            }
        };
        assert_eq!(
            source(&with_npm, PI_VERSION, false, cached_here).unwrap(),
            bundle(false)
        );
        assert_eq!(
            source(&with_npm, "0.74.0", false, cached_here).unwrap(),
            Source::Npm
        );
        let kept = probe(&format!("{linux}{node}{npm}agentv={PI_VERSION}\n"));
        assert_eq!(
            source(&kept, PI_VERSION, false, cached_here).unwrap(),
            Source::Npm
        );
        assert_eq!(decide_for("", false).unwrap(), bundle(true));
        assert_eq!(
            decide_for("nodebin=/usr/bin/node\nnode=v18.19.0\n", false).unwrap(),
            bundle(true)
        );
        // A copy already there is kept by the remote: nothing to send.
        assert_eq!(
            decide_for(&format!("agentv={PI_VERSION}\n"), false).unwrap(),
            Source::Npm
        );
        let refused = |text: &str| {
            let error = source(&probe(text), PI_VERSION, false, |_| true).unwrap_err();
            assert_eq!(error.code(), racp_proto::ErrorCode::HostBootstrapFailed);
            assert!(
                error.message().contains("nothing was uploaded"),
                "{}",
                error.message()
            );
            error.details().unwrap()["reason"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            refused("os=Linux\narch=x86_64\nlibc=glibc 2.17\n"),
            "glibc_too_old"
        );
        assert_eq!(
            refused(
                "os=Linux\narch=x86_64\nldd=musl libc (x86_64) Version 1.2.4\nmusl=/lib/ld-musl-x86_64.so.1\n"
            ),
            "no_node_build"
        );
        assert_eq!(
            refused("os=Linux\narch=armv7l\nlibc=glibc 2.36\n"),
            "no_node_build"
        );
        // Another version than the pinned one comes only from npm.
        let other = source(&probe(linux), "0.74.0", false, |_| true).unwrap_err();
        assert_eq!(other.details().unwrap()["reason"], "agent");
    }

    #[test]
    fn versions_are_plain_names() {
        assert!(valid_version("0.73.1") && valid_version("1.0.0-beta.2+x"));
        for bad in ["", "latest", "../x", "1 2", "1;x", "$(x)"] {
            assert!(!valid_version(bad), "{bad}");
        }
    }
}
