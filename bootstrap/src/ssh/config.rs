//! Where to connect: `[user@]host[:port]`, resolved through the user's OpenSSH client config
//! (HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump, HostKeyAlias,
//! UserKnownHostsFile, ConnectTimeout), parsed by the `ssh2-config` crate.

use ssh2_config::{HostParams, ParseRule, SshConfig};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the caller can set beside the target.
#[derive(Debug, Clone, Default)]
pub struct ResolveOptions {
    /// The ssh config file; `None` reads `~/.ssh/config` when it exists.
    pub config_file: Option<PathBuf>,
    /// The known_hosts file, instead of the config's UserKnownHostsFile (else
    /// `~/.ssh/known_hosts ~/.ssh/known_hosts2`).
    pub known_hosts: Option<PathBuf>,
    /// Extra identity files (`-i`), tried before the config's.
    pub identity_files: Vec<PathBuf>,
}

/// A machine to log in to, with everything the config says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The name the user gave (a config alias or a host name).
    pub alias: String,
    /// The address to connect to (HostName, or the alias itself).
    pub host: String,
    pub port: u16,
    pub user: String,
    /// Key files to try, in order (only existing files are tried).
    pub identity_files: Vec<PathBuf>,
    /// Only the listed identity files: agent keys are used only when they match one of them.
    pub identities_only: bool,
    /// IdentityAgent: `none` turns the agent off; a path replaces `SSH_AUTH_SOCK`.
    pub identity_agent: Option<String>,
    /// Hosts to hop through, first hop first, each resolved through the config as well.
    pub jumps: Vec<Destination>,
    /// HostKeyAlias: the name the host key is looked up and recorded under instead of the
    /// host and port (docs/reliability.md 4.9).
    pub host_key_alias: Option<String>,
    /// The first user known_hosts file: read, and where a new host is recorded.
    pub known_hosts: PathBuf,
    /// Read too, as `ssh` reads them: the other UserKnownHostsFile entries, then the
    /// GlobalKnownHostsFile ones (`/etc/ssh/ssh_known_hosts ssh_known_hosts2` by default). A
    /// key on record in any of them makes the host known (docs/reliability.md 4.9).
    pub other_known_hosts: Vec<PathBuf>,
    pub connect_timeout: Duration,
}

impl Destination {
    /// `user@host:port`, for messages.
    pub fn display(&self) -> String {
        format!("{}@{}:{}", self.user, self.host, self.port)
    }
}

/// `[user@]host[:port]`, with `[v6addr]:port` for IPv6 literals.
pub fn parse_target(target: &str) -> Result<(Option<String>, String, Option<u16>), String> {
    let target = target.trim();
    let (user, rest) = match target.rsplit_once('@') {
        Some((user, rest)) if !user.is_empty() => (Some(user.to_string()), rest),
        Some(_) => return Err(format!("bad SSH target {target:?}: empty user name")),
        None => (None, target),
    };
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("bad SSH target {target:?}: missing ']'"))?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("bad SSH target {target:?}")),
        }
    } else {
        match rest.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if host.is_empty() || host.starts_with('-') || host.chars().any(char::is_whitespace) {
        return Err(format!(
            "bad SSH target {target:?}: expected [user@]host[:port]"
        ));
    }
    let port = match port {
        Some(port) => Some(
            port.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("bad SSH target {target:?}: bad port {port:?}"))?,
        ),
        None => None,
    };
    Ok((user, host.to_string(), port))
}

/// Resolves a target through the config file.
pub fn resolve(target: &str, options: &ResolveOptions) -> Result<Destination, String> {
    let config = load_config(options.config_file.as_deref())?;
    resolve_with(target, options, &config, 0)
}

fn load_config(path: Option<&Path>) -> Result<SshConfig, String> {
    let default = home().map(|home| home.join(".ssh/config"));
    let (path, required) = match path {
        Some(path) => (Some(path.to_path_buf()), true),
        None => (default, false),
    };
    let Some(path) = path else {
        return Ok(SshConfig::default());
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if !required && err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(SshConfig::default());
        }
        Err(err) => return Err(format!("cannot read {}: {err}", path.display())),
    };
    parse_config(&text).map_err(|err| format!("cannot parse {}: {err}", path.display()))
}

/// Parses a config, with its `Host` patterns in lowercase: `ssh` matches them without regard to
/// case and `ssh2-config` with, so both sides are lowercased (the patterns here, the name in
/// [`resolve_with`]) and `pi-remote connect BOX` takes the `Host box` stanza as `ssh BOX` does
/// (docs/reliability.md 4.9). Files it `Include`s are read by `ssh2-config` as they are.
fn parse_config(text: &str) -> Result<SshConfig, ssh2_config::SshParserError> {
    let lowered: String = text
        .lines()
        .map(|line| {
            let keyword = line
                .trim_start()
                .split(|c: char| c.is_whitespace() || c == '=')
                .next()
                .unwrap_or_default();
            if keyword.eq_ignore_ascii_case("host") {
                line.to_ascii_lowercase()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    SshConfig::default().parse(
        &mut BufReader::new(lowered.as_bytes()),
        ParseRule::ALLOW_UNKNOWN_FIELDS | ParseRule::ALLOW_UNSUPPORTED_FIELDS,
    )
}

/// OpenSSH nests jumps through the same config; a loop is cut at a fixed depth.
const MAX_JUMP_DEPTH: usize = 8;

fn resolve_with(
    target: &str,
    options: &ResolveOptions,
    config: &SshConfig,
    depth: usize,
) -> Result<Destination, String> {
    if depth > MAX_JUMP_DEPTH {
        return Err(format!(
            "ProxyJump nests deeper than {MAX_JUMP_DEPTH} hops (a loop?)"
        ));
    }
    let (user, alias, port) = parse_target(target)?;
    // Host patterns are in lowercase (parse_config).
    let params = config.query(alias.to_ascii_lowercase());
    let field = |name: &str| extra_field(&params, name).and_then(|args| args.into_iter().next());
    let identity_files = identity_files(options, &params);
    let (known_hosts, other_known_hosts) = known_hosts(options, &params)?;
    let jumps = jumps(&params, options, config, depth)?;
    Ok(Destination {
        host: params.host_name.clone().unwrap_or_else(|| alias.clone()),
        port: port.or(params.port).unwrap_or(22),
        user: user
            .or(params.user.clone())
            .or_else(local_user)
            .ok_or("cannot tell the local user name: give user@host")?,
        identity_files,
        identities_only: field("identitiesonly").is_some_and(|v| v.eq_ignore_ascii_case("yes")),
        identity_agent: field("identityagent"),
        jumps,
        host_key_alias: field("hostkeyalias"),
        known_hosts,
        other_known_hosts,
        connect_timeout: params.connect_timeout.unwrap_or(Duration::from_secs(15)),
        alias,
    })
}

/// The arguments of a keyword `ssh2-config` does not read itself (`name` in lowercase), when
/// the config gives any.
fn extra_field(params: &HostParams, name: &str) -> Option<Vec<String>> {
    params
        .unsupported_fields
        .get(name)
        .or_else(|| params.ignored_fields.get(name))
        .filter(|args| !args.is_empty())
        .cloned()
}

/// The `-i` files, then the config's IdentityFile ones; `ssh`'s defaults when there are none.
fn identity_files(options: &ResolveOptions, params: &HostParams) -> Vec<PathBuf> {
    let mut identity_files = options.identity_files.clone();
    identity_files.extend(params.identity_file.clone().unwrap_or_default());
    if identity_files.is_empty()
        && let Some(home) = home()
    {
        for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
            identity_files.push(home.join(".ssh").join(name));
        }
    }
    identity_files
}

/// The known_hosts file new hosts are recorded in, and the others read too.
fn known_hosts(
    options: &ResolveOptions,
    params: &HostParams,
) -> Result<(PathBuf, Vec<PathBuf>), String> {
    let user_files = match &options.known_hosts {
        Some(path) => vec![path.clone()],
        None => known_hosts_files(
            extra_field(params, "userknownhostsfile"),
            &["~/.ssh/known_hosts", "~/.ssh/known_hosts2"],
        ),
    };
    let mut user_files = user_files.into_iter();
    let known_hosts = user_files.next().ok_or(
        "no user known_hosts file (UserKnownHostsFile none, or no home directory): pass --known-hosts",
    )?;
    let mut other_known_hosts: Vec<PathBuf> = user_files.collect();
    other_known_hosts.extend(known_hosts_files(
        extra_field(params, "globalknownhostsfile"),
        &["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"],
    ));
    Ok((known_hosts, other_known_hosts))
}

/// ProxyJump's hops, each resolved through the config, first hop first.
fn jumps(
    params: &HostParams,
    options: &ResolveOptions,
    config: &SshConfig,
    depth: usize,
) -> Result<Vec<Destination>, String> {
    let mut jumps = Vec::new();
    for hop in params.proxy_jump.clone().unwrap_or_default() {
        let hop = hop.trim();
        if hop.eq_ignore_ascii_case("none") || hop.is_empty() {
            continue;
        }
        // ssh://user@host:port is also allowed in ProxyJump.
        let hop = hop.strip_prefix("ssh://").unwrap_or(hop);
        let mut resolved = resolve_with(hop, options, config, depth + 1)?;
        // A hop's own jumps come first.
        let mut nested = std::mem::take(&mut resolved.jumps);
        jumps.append(&mut nested);
        jumps.push(resolved);
    }
    Ok(jumps)
}

/// A UserKnownHostsFile or GlobalKnownHostsFile value (`none` is no file), else the defaults;
/// `~/` expanded, and a `~` path dropped when there is no home directory.
fn known_hosts_files(configured: Option<Vec<String>>, defaults: &[&str]) -> Vec<PathBuf> {
    let names = configured.unwrap_or_else(|| defaults.iter().map(|d| d.to_string()).collect());
    if names.len() == 1 && names[0].eq_ignore_ascii_case("none") {
        return Vec::new();
    }
    names
        .iter()
        .filter(|name| !name.starts_with('~') || home().is_some())
        .map(|name| expand_tilde(name))
        .collect()
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

fn local_user() -> Option<String> {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|u| !u.is_empty()))
}

fn expand_tilde(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), home()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_and_without_user_and_port() {
        assert_eq!(
            parse_target("alice@example.org:2222").unwrap(),
            (Some("alice".into()), "example.org".into(), Some(2222))
        );
        assert_eq!(parse_target("box").unwrap(), (None, "box".into(), None));
        assert_eq!(
            parse_target("[::1]:22").unwrap(),
            (None, "::1".into(), Some(22))
        );
        assert!(parse_target("-oProxyCommand=x").is_err());
        assert!(parse_target("host:0").is_err());
        assert!(parse_target("host:99999").is_err());
        assert!(parse_target("@host").is_err());
    }

    fn resolve_text(target: &str, config: &str) -> Destination {
        let parsed = parse_config(config).unwrap();
        let options = ResolveOptions {
            known_hosts: None,
            ..ResolveOptions::default()
        };
        resolve_with(target, &options, &parsed, 0).unwrap()
    }

    #[test]
    fn the_config_supplies_host_name_user_port_keys_jumps_and_known_hosts() {
        let config = "\
Host box
    HostName 10.0.0.5
    User deploy
    Port 2200
    IdentityFile /keys/box
    IdentitiesOnly yes
    UserKnownHostsFile /tmp/kh /tmp/kh2
    HostKeyAlias Box-Prod
    ProxyJump gate

Host gate
    HostName gate.example.org
    User jump
";
        let dest = resolve_text("box", config);
        assert_eq!(dest.host, "10.0.0.5");
        assert_eq!(dest.user, "deploy");
        assert_eq!(dest.port, 2200);
        assert_eq!(dest.identity_files, vec![PathBuf::from("/keys/box")]);
        assert!(dest.identities_only);
        assert_eq!(dest.known_hosts, PathBuf::from("/tmp/kh"));
        assert_eq!(
            dest.other_known_hosts,
            vec![
                PathBuf::from("/tmp/kh2"),
                PathBuf::from("/etc/ssh/ssh_known_hosts"),
                PathBuf::from("/etc/ssh/ssh_known_hosts2"),
            ]
        );
        // Lowercased where the name is formed (host_key::known_hosts_name), as ssh does.
        assert_eq!(dest.host_key_alias.as_deref(), Some("Box-Prod"));
        assert_eq!(dest.jumps[0].host_key_alias, None);
        assert_eq!(dest.jumps.len(), 1);
        assert_eq!(dest.jumps[0].host, "gate.example.org");
        assert_eq!(dest.jumps[0].user, "jump");
        assert_eq!(dest.jumps[0].port, 22);

        // What the user typed wins over the config.
        let dest = resolve_text("root@box:2300", config);
        assert_eq!((dest.user.as_str(), dest.port), ("root", 2300));

        // Host patterns match without regard to case, as in ssh.
        let dest = resolve_text("BOX", config);
        assert_eq!(
            (dest.host.as_str(), dest.alias.as_str()),
            ("10.0.0.5", "BOX")
        );
        let dest = resolve_text("u@Gate", "Host GATE\n    HostName gate.example.org\n");
        assert_eq!(dest.host, "gate.example.org");
    }

    #[test]
    fn a_jump_loop_is_an_error_not_a_hang() {
        let config = "Host a\n    ProxyJump b\nHost b\n    ProxyJump a\n";
        let parsed = SshConfig::default()
            .parse(
                &mut BufReader::new(config.as_bytes()),
                ParseRule::ALLOW_UNKNOWN_FIELDS,
            )
            .unwrap();
        let err = resolve_with("a", &ResolveOptions::default(), &parsed, 0).unwrap_err();
        assert!(err.contains("loop"), "{err}");
    }

    #[test]
    fn known_hosts_files_are_the_user_ones_then_the_global_ones_as_ssh_reads_them() {
        let config = "\
Host a
    UserKnownHostsFile /k1
    GlobalKnownHostsFile none
Host b
    UserKnownHostsFile none
Host c
    GlobalKnownHostsFile /g1 /g2
";
        let parsed = SshConfig::default()
            .parse(
                &mut BufReader::new(config.as_bytes()),
                ParseRule::ALLOW_UNKNOWN_FIELDS | ParseRule::ALLOW_UNSUPPORTED_FIELDS,
            )
            .unwrap();
        let defaults = ResolveOptions::default();
        let a = resolve_with("u@a", &defaults, &parsed, 0).unwrap();
        assert_eq!(a.known_hosts, PathBuf::from("/k1"));
        assert!(a.other_known_hosts.is_empty());
        // Nowhere to record a new host: said, rather than a file named "none".
        let err = resolve_with("u@b", &defaults, &parsed, 0).unwrap_err();
        assert!(err.contains("--known-hosts"), "{err}");
        let given = ResolveOptions {
            known_hosts: Some(PathBuf::from("/given")),
            ..ResolveOptions::default()
        };
        let c = resolve_with("u@c", &given, &parsed, 0).unwrap();
        assert_eq!(c.known_hosts, PathBuf::from("/given"));
        assert_eq!(
            c.other_known_hosts,
            vec![PathBuf::from("/g1"), PathBuf::from("/g2")]
        );
    }
}
