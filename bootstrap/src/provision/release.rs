//! The local release directory deploy/release.sh writes: `manifest.json`, one tarball per
//! platform, and install.sh. Nothing is downloaded on the remote, so it needs no internet.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// `manifest.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub version: String,
    pub artifacts: Vec<Artifact>,
    pub installer: FileEntry,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Artifact {
    pub os: String,
    pub arch: String,
    pub file: String,
    pub sha256: String,
    /// The oldest glibc a Linux build runs on (deploy/README.md, "The glibc floor"); absent in
    /// manifests from before it was recorded, and for builds not linked against glibc.
    #[serde(default)]
    pub glibc: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FileEntry {
    pub file: String,
    pub sha256: String,
}

/// A release directory and its manifest.
#[derive(Debug, Clone)]
pub struct Release {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl Release {
    pub fn load(dir: &Path) -> Result<Release, String> {
        let path = dir.join("manifest.json");
        let bytes = std::fs::read(&path).map_err(|err| {
            format!(
                "cannot read {}: {err} (deploy/release.sh --out DIR makes a release directory)",
                path.display()
            )
        })?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|err| format!("bad manifest {}: {err}", path.display()))?;
        // File names go into remote shell commands and local paths: plain names only.
        let names = manifest
            .artifacts
            .iter()
            .map(|a| a.file.as_str())
            .chain(std::iter::once(manifest.installer.file.as_str()));
        for name in names {
            if !is_plain_file_name(name) {
                return Err(format!("bad file name {name:?} in {}", path.display()));
            }
        }
        if !is_plain_file_name(&manifest.version) {
            return Err(format!(
                "bad version {:?} in {}",
                manifest.version,
                path.display()
            ));
        }
        Ok(Release {
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    /// install.sh: sent on stdin ahead of the build, only when installing, and its SHA-256
    /// checked against the manifest where it lands, before it runs.
    pub fn installer_bytes(&self) -> Result<Vec<u8>, String> {
        let path = self.dir.join(&self.manifest.installer.file);
        std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    }

    /// The artifact for a platform as `uname -s` / `uname -m` print it.
    pub fn artifact_for(&self, os: &str, arch: &str) -> Option<&Artifact> {
        let (os, arch) = (normalize_os(os), normalize_arch(arch));
        self.manifest
            .artifacts
            .iter()
            .find(|a| normalize_os(&a.os) == os && normalize_arch(&a.arch) == arch)
    }

    pub fn platforms(&self) -> Vec<String> {
        self.manifest
            .artifacts
            .iter()
            .map(|a| format!("{}-{}", a.os, a.arch))
            .collect()
    }
}

/// Where `connect` looks for a release when `--release-dir` is not given, in order: beside the
/// running pi-remote as deploy/dist.sh lays a desktop distribution out
/// (`PREFIX/bin/pi-remote` and `PREFIX/share/pi-remote/release`), then the user's data
/// directory (`$XDG_DATA_HOME/pi-remote/release`, else `~/.local/share/pi-remote/release`).
pub fn search_path() -> Vec<PathBuf> {
    let mut places = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(prefix) = exe.parent().and_then(Path::parent)
    {
        places.push(prefix.join("share/pi-remote/release"));
    }
    if let Some(data) = crate::dirs::user_dir(None, "XDG_DATA_HOME", ".local/share") {
        places.push(data.join("release"));
    }
    places
}

/// The first release on [`search_path`] of `version` (this pi-remote's: a release of another
/// version found lying about would up- or downgrade a remote unasked).
pub fn discover(version: &str) -> Option<Release> {
    first_of(&search_path(), version)
}

/// The first release of `version` in `places`.
fn first_of(places: &[PathBuf], version: &str) -> Option<Release> {
    places
        .iter()
        .filter(|dir| dir.join("manifest.json").is_file())
        .filter_map(|dir| Release::load(dir).ok())
        .find(|release| release.manifest.version == version)
}

/// The search path in words, for the message of a connect that found no release.
pub fn searched() -> String {
    let places: Vec<String> = search_path()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    places.join(", ")
}

pub fn normalize_os(os: &str) -> String {
    os.trim().to_ascii_lowercase()
}

pub fn normalize_arch(arch: &str) -> String {
    match arch.trim().to_ascii_lowercase().as_str() {
        "amd64" | "x64" => "x86_64".into(),
        "arm64" => "aarch64".into(),
        other => other.into(),
    }
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_release_of_the_wanted_version_is_found_on_the_search_path() {
        let places: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let paths: Vec<PathBuf> = places.iter().map(|d| d.path().to_path_buf()).collect();
        let manifest = |dir: &Path, version: &str| {
            let manifest = serde_json::json!({
                "version": version,
                "artifacts": [],
                "installer": {"file": "install.sh", "sha256": "00"},
            });
            std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
        };
        // The first place has none, the second another version, the third the wanted one.
        manifest(&paths[1], "0.0.9");
        manifest(&paths[2], "1.2.3");
        let found = first_of(&paths, "1.2.3").unwrap();
        assert_eq!(found.dir, paths[2]);
        assert!(
            first_of(&paths[..2], "1.2.3").is_none(),
            "another version is never taken"
        );
        assert!(first_of(&[], "1.2.3").is_none());
    }

    #[test]
    fn a_manifest_with_paths_or_shell_characters_in_names_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let write = |artifact_file: &str| {
            let manifest = serde_json::json!({
                "version": "1.2.3",
                "artifacts": [{"os": "linux", "arch": "x86_64", "file": artifact_file, "sha256": "00", "size": 1}],
                "installer": {"file": "install.sh", "sha256": "00"},
            });
            std::fs::write(dir.path().join("manifest.json"), manifest.to_string()).unwrap();
            Release::load(dir.path())
        };
        assert!(write("pi-host-1.2.3-linux-x86_64.tar.gz").is_ok());
        assert!(write("../x.tar.gz").is_err());
        assert!(write("a;rm -rf ~.tar.gz").is_err());
        assert!(write("$(x).tar.gz").is_err());
    }

    #[test]
    fn platforms_match_whatever_uname_calls_them() {
        let release = Release {
            dir: PathBuf::new(),
            manifest: Manifest {
                version: "1".into(),
                artifacts: vec![Artifact {
                    os: "linux".into(),
                    arch: "aarch64".into(),
                    file: "f".into(),
                    sha256: "00".into(),
                    glibc: None,
                }],
                installer: FileEntry {
                    file: "install.sh".into(),
                    sha256: "00".into(),
                },
            },
        };
        assert!(release.artifact_for("Linux", "arm64").is_some());
        assert!(release.artifact_for("Linux", "x86_64").is_none());
    }

    /// A release of both Linux builds, as `deploy/release.sh --arch x86_64` then `--arch
    /// aarch64` writes it: the probe's `uname -m` picks the build, checked for upload as a
    /// connect checks it.
    #[test]
    fn a_remote_gets_the_build_for_its_architecture() {
        let dir = tempfile::tempdir().unwrap();
        let artifact = |arch: &str| {
            serde_json::json!({"os": "linux", "arch": arch, "file": format!("pi-host-1.2.3-linux-{arch}.tar.gz"),
                "sha256": "00", "size": 1, "glibc": "2.17"})
        };
        let manifest = serde_json::json!({
            "version": "1.2.3",
            "artifacts": [artifact("aarch64"), artifact("x86_64")],
            "installer": {"file": "install.sh", "sha256": "00"},
            "unit": {"file": "pi-host.service", "sha256": "00"},
        });
        std::fs::write(dir.path().join("manifest.json"), manifest.to_string()).unwrap();
        let release = Release::load(dir.path()).unwrap();
        let probe = |arch: &str| {
            crate::provision::remote_shell::Probe::parse(&format!(
                "root=/r\nos=Linux\narch={arch}\nlibc=glibc 2.17\n"
            ))
            .unwrap()
        };
        for (uname_m, wanted) in [
            ("x86_64", "pi-host-1.2.3-linux-x86_64.tar.gz"),
            ("aarch64", "pi-host-1.2.3-linux-aarch64.tar.gz"),
            ("arm64", "pi-host-1.2.3-linux-aarch64.tar.gz"),
        ] {
            let picked = crate::provision::install::supported(&probe(uname_m), &release)
                .unwrap_or_else(|e| panic!("{uname_m}: {e:?}"));
            assert_eq!(picked.file, wanted, "{uname_m}");
        }
        // The floor holds for the aarch64 build too, and an architecture without a build is
        // refused with the platforms there are.
        let old = crate::provision::remote_shell::Probe::parse(
            "root=/r\nos=Linux\narch=aarch64\nlibc=glibc 2.12\n",
        )
        .unwrap();
        let error = crate::provision::install::supported(&old, &release).unwrap_err();
        assert_eq!(error.details().unwrap()["needed"]["glibcMin"], "2.17");
        let error = crate::provision::install::supported(&probe("riscv64"), &release).unwrap_err();
        assert_eq!(
            error.details().unwrap()["needed"]["platforms"],
            serde_json::json!(["linux-aarch64", "linux-x86_64"])
        );
    }
}
