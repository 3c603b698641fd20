//! Model servers an owner added (`provider/set`): OpenAI-compatible providers on the remote's
//! network, in `providers.json` in the data directory. pi-host's pi extension registers each in
//! the agent's model registry when it starts, over a provider of the same name in the remote
//! user's own configuration (docs/protocol.md §7.21).

use super::file::{self, FileError};
use racp_proto::methods::model::ProviderSetParams;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

pub const FILE: &str = "providers.json";
const KIND: &str = "providers";

pub struct Providers {
    path: PathBuf,
    entries: Mutex<BTreeMap<String, ProviderSetParams>>,
}

impl Providers {
    pub fn open(data_dir: &std::path::Path) -> Result<Providers, FileError> {
        let path = data_dir.join(FILE);
        let entries = file::load(&path, KIND)?;
        Ok(Providers {
            path,
            entries: Mutex::new(entries),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ProviderSetParams>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds or replaces a provider; false when it was there already, the same.
    pub fn set(&self, provider: ProviderSetParams) -> Result<bool, FileError> {
        let mut entries = self.lock();
        if entries.get(&provider.provider) == Some(&provider) {
            return Ok(false);
        }
        let mut next = entries.clone();
        next.insert(provider.provider.clone(), provider);
        file::save(&self.path, KIND, &next)?;
        *entries = next;
        Ok(true)
    }

    /// Removes a provider; false when there was none.
    pub fn delete(&self, provider: &str) -> Result<bool, FileError> {
        let mut entries = self.lock();
        if !entries.contains_key(provider) {
            return Ok(false);
        }
        let mut next = entries.clone();
        next.remove(provider);
        file::save(&self.path, KIND, &next)?;
        *entries = next;
        Ok(true)
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }

    pub fn requires_key(&self, provider: &str) -> bool {
        self.lock().get(provider).is_some_and(|p| p.requires_key)
    }

    pub fn contains(&self, provider: &str) -> bool {
        self.lock().contains_key(provider)
    }
}
