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
    /// `host/list` and `/racp/hosts/{hostId}`: a gateway's.
    Hosts,
}

impl Capability {
    /// What a host can have on; `fs` only while file browsing is allowed.
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
            Capability::Hosts => "hosts",
        }
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
