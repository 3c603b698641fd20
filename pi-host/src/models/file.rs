//! The two files a desktop's settings live in (`credentials.json`, `providers.json` in the data
//! directory): JSON, mode 0600, replaced atomically. pi-host's pi extension reads the same files
//! when an agent starts (`agent/extensions/settings.ts`), so their shape is a contract between
//! the two: `{"version": 1, "<kind>": {"<provider>": {...}}}`.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// One settings file held in memory: entries by provider, each change on disk before the
/// memory changes.
pub struct Keyed<T> {
    path: PathBuf,
    kind: &'static str,
    entries: Mutex<BTreeMap<String, T>>,
    /// Told the entries after each change, under the lock that orders the changes.
    observer: Option<Observer<T>>,
}

type Observer<T> = Box<dyn Fn(&BTreeMap<String, T>) + Send + Sync>;

impl<T: Serialize + DeserializeOwned + Clone + PartialEq> Keyed<T> {
    /// Reads `data_dir/name` (none: empty); `kind` is its top-level key.
    pub fn open(data_dir: &Path, name: &str, kind: &'static str) -> Result<Self, FileError> {
        let path = data_dir.join(name);
        let entries = load(&path, kind)?;
        Ok(Keyed {
            path,
            kind,
            entries: Mutex::new(entries),
            observer: None,
        })
    }

    /// Tells `observer` the entries now and after every change, in the order of the changes.
    pub fn observed(
        mut self,
        observer: impl Fn(&BTreeMap<String, T>) + Send + Sync + 'static,
    ) -> Self {
        observer(&self.lock());
        self.observer = Some(Box::new(observer));
        self
    }

    fn changed(&self, entries: &BTreeMap<String, T>) {
        if let Some(observer) = &self.observer {
            observer(entries);
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, T>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `key` to `value`; false when it held that value already (nothing written).
    pub fn insert(&self, key: &str, value: T) -> Result<bool, FileError> {
        let mut entries = self.lock();
        if entries.get(key) == Some(&value) {
            return Ok(false);
        }
        let mut next = entries.clone();
        next.insert(key.to_string(), value);
        save(&self.path, self.kind, &next)?;
        *entries = next;
        self.changed(&entries);
        Ok(true)
    }

    /// Removes `key`; false when it was not there.
    pub fn remove(&self, key: &str) -> Result<bool, FileError> {
        let mut entries = self.lock();
        if !entries.contains_key(key) {
            return Ok(false);
        }
        let mut next = entries.clone();
        next.remove(key);
        save(&self.path, self.kind, &next)?;
        *entries = next;
        self.changed(&entries);
        Ok(true)
    }
}

const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is not a pi-host {kind} file ({reason}); fix it or move it away, then start again",
        path.display()
    )]
    Damaged {
        path: PathBuf,
        kind: &'static str,
        reason: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Entries by provider, read from `path` (none when the file does not exist). `kind` is the
/// file's top-level key.
fn load<T: DeserializeOwned>(
    path: &Path,
    kind: &'static str,
) -> Result<BTreeMap<String, T>, FileError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(FileError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let damaged = |reason: String| FileError::Damaged {
        path: path.to_path_buf(),
        kind,
        reason,
    };
    // serde's message may quote a value it could not read: a key must not reach a log, so
    // only its position is kept.
    let mut file: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes)
        .map_err(|e| {
            damaged(format!(
                "not JSON at line {} column {}",
                e.line(),
                e.column()
            ))
        })?;
    let version = file.get("version").and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(VERSION)) {
        return Err(damaged(format!("version {version:?}, expected {VERSION}")));
    }
    let entries = file.remove(kind).unwrap_or_default();
    serde_json::from_value(entries)
        .map_err(|e| damaged(format!("its {kind} do not read ({})", e.classify_name())))
}

/// Writes `entries` to `path` (0600, atomically).
fn save<T: Serialize>(
    path: &Path,
    kind: &'static str,
    entries: &BTreeMap<String, T>,
) -> Result<(), FileError> {
    let body = serde_json::json!({ "version": VERSION, kind: entries });
    let write_error = |source| FileError::Write {
        path: path.to_path_buf(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(&body).map_err(|e| write_error(e.into()))?;
    racp_server::private_file::replace_private(path, &bytes).map_err(write_error)
}

/// What a serde error is, in a word, without the values it may quote.
trait Classify {
    fn classify_name(&self) -> &'static str;
}

impl Classify for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "an I/O error",
            serde_json::error::Category::Syntax => "a syntax error",
            serde_json::error::Category::Data => "a field of the wrong type or missing",
            serde_json::error::Category::Eof => "the file ends early",
        }
    }
}
