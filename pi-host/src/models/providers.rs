//! Model servers an owner added (`provider/set`): OpenAI-compatible providers on the remote's
//! network, in `providers.json` in the data directory. pi-host's pi extension registers each in
//! the agent's model registry when it starts, over a provider of the same name in the remote
//! user's own configuration (docs/protocol.md §7.21).

use super::file::{FileError, Keyed};
use racp_proto::methods::model::ProviderSetParams;

/// The file in the data directory.
pub const FILE: &str = "providers.json";

pub struct Providers(Keyed<ProviderSetParams>);

impl Providers {
    pub fn open(data_dir: &std::path::Path) -> Result<Providers, FileError> {
        Keyed::open(data_dir, FILE, "providers").map(Providers)
    }

    /// Adds or replaces a provider; false when it was there already, the same.
    pub fn set(&self, provider: ProviderSetParams) -> Result<bool, FileError> {
        let name = provider.provider.clone();
        self.0.insert(&name, provider)
    }

    /// Removes a provider; false when there was none.
    pub fn delete(&self, provider: &str) -> Result<bool, FileError> {
        self.0.remove(provider)
    }

    pub fn count(&self) -> usize {
        self.0.lock().len()
    }

    pub fn requires_key(&self, provider: &str) -> bool {
        self.0.lock().get(provider).is_some_and(|p| p.requires_key)
    }

    pub fn contains(&self, provider: &str) -> bool {
        self.0.lock().contains_key(provider)
    }
}
