//! The optional features a server names in `hello` and `host/info` (docs/protocol.md §5): one
//! table, so a host and a gateway name them alike.

/// An optional feature a server may have on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    Pairing,
    Devices,
    Sessions,
    Turns,
    Approvals,
    Fs,
    Models,
    Credentials,
    /// Images with a prompt (`turn/start`'s `images`).
    Attachments,
    /// A session's conversation past the replay window (`session/history`, a snapshot's
    /// `history`).
    History,
    /// Prompts queued while a turn runs (`turn/follow_up`, the snapshot's `queue`, the queue
    /// modes of `session/configure`).
    FollowUps,
    /// `session/compact`.
    Compaction,
    /// `session/bash`, `session/bash_abort`.
    Shell,
    /// `session/stats`.
    Stats,
    /// `session/commands`.
    Commands,
    /// `session/export`.
    Export,
    /// `session/fork`, `session/clone`.
    Branches,
    /// `host/list` and `/racp/hosts/{hostId}`: a gateway's.
    Hosts,
    /// The host's agents run in a kernel sandbox (`host/info`'s `sandbox` says which).
    Sandbox,
}

impl Capability {
    /// What a host can have on; `fs` only while file browsing is allowed, `sandbox` only
    /// while its agents run in one.
    pub const HOST: &'static [Capability] = &[
        Capability::Pairing,
        Capability::Devices,
        Capability::Sessions,
        Capability::Turns,
        Capability::Approvals,
        Capability::Fs,
        Capability::Models,
        Capability::Credentials,
        Capability::Attachments,
        Capability::History,
        Capability::FollowUps,
        Capability::Compaction,
        Capability::Shell,
        Capability::Stats,
        Capability::Commands,
        Capability::Export,
        Capability::Branches,
        Capability::Sandbox,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Pairing => "pairing",
            Capability::Devices => "devices",
            Capability::Sessions => "sessions",
            Capability::Turns => "turns",
            Capability::Approvals => "approvals",
            Capability::Fs => "fs",
            Capability::Models => "models",
            Capability::Credentials => "credentials",
            Capability::Attachments => "attachments",
            Capability::History => "history",
            Capability::FollowUps => "followUps",
            Capability::Compaction => "compaction",
            Capability::Shell => "shell",
            Capability::Stats => "stats",
            Capability::Commands => "commands",
            Capability::Export => "export",
            Capability::Branches => "branches",
            Capability::Hosts => "hosts",
            Capability::Sandbox => "sandbox",
        }
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
