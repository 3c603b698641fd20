//! The bundle's archive, written here rather than by the desktop's `tar`: the same inputs give
//! the same bytes on any desktop (docs/architecture.md, "The agent bundle"). Entries go in a
//! fixed order (each directory's names sorted, Node last), with one time, owner root and modes
//! 0755 or 0644; the gzip header carries no name and no time.
//!
//! What never runs on the remote is left out of pi's dependencies: source maps, TypeScript
//! declarations, Markdown, and native builds for other platforms. pi's own packages
//! (`@mariozechner/`) ship whole: pi reads its own docs at run time.

use flate2::Compression;
use flate2::write::GzEncoder;
use std::io::{self, Write};
use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;

/// The packages that ship whole (pi and the libraries it is made of).
const WHOLE: &str = "lib/node_modules/@mariozechner/";

/// File name endings that no program loads: source maps, type declarations, docs.
const NEVER_LOADED: [&str; 6] = [".map", ".d.ts", ".d.mts", ".d.cts", ".md", ".markdown"];

/// Where koffi keeps one native build per platform: only the remote's is loaded.
const PER_PLATFORM: &str = "/koffi/build/koffi/";

/// What the archive holds, for the connect's upload lines and the cache's record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Parts {
    /// Compressed bytes of pi's tree (everything but Node).
    pub pi_bytes: u64,
    /// Compressed bytes of Node's build (`bin/node`), 0 without it.
    pub node_bytes: u64,
    /// Files, directories and links in the archive.
    pub entries: u64,
    /// What the entries hold, unpacked.
    pub unpacked_bytes: u64,
}

/// Whether the file at `relative` (under the bundle's root, `/`-separated) ships to a remote
/// on `cpu` (npm's name: `x64`, `arm64`).
pub fn ships(relative: &str, cpu: &str) -> bool {
    if relative.starts_with(WHOLE) {
        return true;
    }
    let name = relative.rsplit('/').next().unwrap_or(relative);
    let lower = name.to_ascii_lowercase();
    !NEVER_LOADED.iter().any(|end| lower.ends_with(end)) && for_platform(relative, cpu)
}

/// Whether `relative` (a file or a directory) is for the remote's platform, or for any.
fn for_platform(relative: &str, cpu: &str) -> bool {
    match relative.split_once(PER_PLATFORM) {
        Some((_, rest)) => rest.split('/').next() == Some(format!("linux_{cpu}").as_str()),
        None => true,
    }
}

/// The entries under `root` that ship, sorted, directories before what they hold, Node last.
pub fn entries(root: &Path, cpu: &str) -> io::Result<Vec<(String, u64)>> {
    let mut found = Vec::new();
    for top in ["bin", "lib"] {
        walk(root, top, cpu, &mut found)?;
    }
    // Node last: what precedes it is pi's part of the archive.
    if let Some(at) = found.iter().position(|(name, _)| name == "bin/node") {
        let node = found.remove(at);
        found.push(node);
    }
    Ok(found)
}

fn walk(root: &Path, relative: &str, cpu: &str, found: &mut Vec<(String, u64)>) -> io::Result<()> {
    let path = root.join(relative);
    let meta = std::fs::symlink_metadata(&path)?;
    if meta.is_dir() {
        if !for_platform(relative, cpu) {
            return Ok(());
        }
        found.push((relative.to_string(), 0));
        let mut names: Vec<String> = std::fs::read_dir(&path)?
            .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()?;
        names.sort();
        for name in names {
            walk(root, &format!("{relative}/{name}"), cpu, found)?;
        }
    } else if ships(relative, cpu) {
        let size = if meta.is_file() { meta.len() } else { 0 };
        found.push((relative.to_string(), size));
    }
    Ok(())
}

/// Writes the entries of `root` that ship to `out` as a gzipped tar; `on_progress(done,
/// total)` follows the unpacked bytes written.
pub fn write(
    root: &Path,
    out: &Path,
    cpu: &str,
    on_progress: &mut dyn FnMut(u64, u64),
) -> io::Result<Parts> {
    let entries = entries(root, cpu)?;
    let total: u64 = entries.iter().map(|(_, size)| size).sum();
    let file = Counted::new(io::BufWriter::new(std::fs::File::create(out)?));
    // Level 6, gzip's own default: level 9 makes the archive about 1% smaller and twice as
    // slow to make; unpacking takes the same time either way.
    let gzip = flate2::GzBuilder::new().write(file, Compression::new(6));
    let mut tar = tar::Builder::new(gzip);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.follow_symlinks(false);
    let mut parts = Parts::default();
    let mut done = 0;
    for (name, size) in &entries {
        if name == "bin/node" {
            parts.pi_bytes = flushed(tar.get_mut())?;
        }
        tar.append_path_with_name(root.join(name), name)?;
        done += size;
        parts.entries += 1;
        on_progress(done, total);
    }
    let gzip = tar.into_inner()?;
    let mut file = gzip.finish()?;
    file.flush()?;
    let written = file.count;
    file.into_inner()
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    parts.unpacked_bytes = total;
    if parts.pi_bytes == 0 {
        parts.pi_bytes = written;
    } else {
        parts.node_bytes = written - parts.pi_bytes;
    }
    Ok(parts)
}

/// The compressed bytes so far: the encoder is flushed first (a sync flush: a few bytes, the
/// same ones every time).
fn flushed(gzip: &mut GzEncoder<Counted<io::BufWriter<std::fs::File>>>) -> io::Result<u64> {
    gzip.flush()?;
    Ok(gzip.get_ref().count)
}

/// A writer that counts what goes through it.
struct Counted<W> {
    inner: W,
    count: u64,
}

impl<W> Counted<W> {
    fn new(inner: W) -> Self {
        Counted { inner, count: 0 }
    }

    fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A directory of the bundle's layout to test with.
#[cfg(test)]
pub(super) fn sample_tree(root: &Path) -> PathBuf {
    let files = [
        ("bin/node", "node"),
        (
            "lib/node_modules/@mariozechner/pi-coding-agent/README.md",
            "pi's docs",
        ),
        (
            "lib/node_modules/@mariozechner/pi-coding-agent/dist/cli.js",
            "pi",
        ),
        (
            "lib/node_modules/@mariozechner/pi-coding-agent/dist/cli.js.map",
            "{}",
        ),
        ("lib/node_modules/openai/index.js", "openai"),
        ("lib/node_modules/openai/index.d.ts", "types"),
        ("lib/node_modules/openai/index.js.map", "{}"),
        ("lib/node_modules/openai/README.md", "readme"),
        ("lib/node_modules/openai/LICENSE", "license"),
        (
            "lib/node_modules/koffi/build/koffi/linux_x64/koffi.node",
            "x64",
        ),
        (
            "lib/node_modules/koffi/build/koffi/linux_arm64/koffi.node",
            "arm64",
        ),
        (
            "lib/node_modules/koffi/build/koffi/win32_x64/koffi.node",
            "win",
        ),
        ("lib/node_modules/koffi/index.js", "koffi"),
    ];
    for (name, text) in files {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    std::os::unix::fs::symlink(
        "../lib/node_modules/@mariozechner/pi-coding-agent/dist/cli.js",
        root.join("bin/pi"),
    )
    .unwrap();
    root.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn what_never_runs_is_left_out_and_pi_ships_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = sample_tree(dir.path());
        let names: Vec<String> = entries(&root, "x64")
            .unwrap()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        for kept in [
            "bin/pi",
            "lib/node_modules/@mariozechner/pi-coding-agent/README.md",
            "lib/node_modules/@mariozechner/pi-coding-agent/dist/cli.js.map",
            "lib/node_modules/openai/index.js",
            "lib/node_modules/openai/LICENSE",
            "lib/node_modules/koffi/build/koffi/linux_x64/koffi.node",
            "lib/node_modules/koffi/index.js",
        ] {
            assert!(names.iter().any(|n| n == kept), "{kept} missing: {names:?}");
        }
        for left in [
            "lib/node_modules/openai/index.d.ts",
            "lib/node_modules/openai/index.js.map",
            "lib/node_modules/openai/README.md",
            "lib/node_modules/koffi/build/koffi/linux_arm64/koffi.node",
            "lib/node_modules/koffi/build/koffi/win32_x64/koffi.node",
        ] {
            assert!(!names.iter().any(|n| n == left), "{left} shipped");
        }
        assert_eq!(names.last().map(String::as_str), Some("bin/node"));
        let arm: Vec<String> = entries(&root, "arm64")
            .unwrap()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert!(arm.iter().any(|n| n.ends_with("linux_arm64/koffi.node")));
        assert!(!arm.iter().any(|n| n.ends_with("linux_x64/koffi.node")));
    }

    #[test]
    fn two_writes_of_trees_made_apart_are_byte_identical() {
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = sample_tree(one.path());
        // The second tree differs in what an archive must not carry: times, modes' group and
        // other bits, creation order.
        let second = sample_tree(two.path());
        let js = second.join("lib/node_modules/openai/index.js");
        std::fs::set_permissions(&js, std::fs::Permissions::from_mode(0o664)).unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(86_400);
        std::fs::File::options()
            .write(true)
            .open(&js)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let out = tempfile::tempdir().unwrap();
        let (a, b) = (out.path().join("a.tar.gz"), out.path().join("b.tar.gz"));
        let parts_a = write(&first, &a, "x64", &mut |_, _| {}).unwrap();
        let parts_b = write(&second, &b, "x64", &mut |_, _| {}).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(parts_a, parts_b);
        assert!(
            parts_a.node_bytes > 0 && parts_a.pi_bytes > 0,
            "{parts_a:?}"
        );
        assert_eq!(
            parts_a.pi_bytes + parts_a.node_bytes,
            std::fs::metadata(&a).unwrap().len()
        );
        // Another tree gives other bytes: the comparison can fail.
        std::fs::write(&js, "openai 2").unwrap();
        write(&second, &b, "x64", &mut |_, _| {}).unwrap();
        assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    }

    #[test]
    fn the_archive_unpacks_with_tar_to_the_tree_with_fixed_owners_and_times() {
        let dir = tempfile::tempdir().unwrap();
        let root = sample_tree(dir.path());
        let out = dir.path().join("bundle.tar.gz");
        let mut seen = Vec::new();
        write(&root, &out, "x64", &mut |done, total| {
            seen.push((done, total))
        })
        .unwrap();
        assert_eq!(seen.last().map(|(d, t)| d == t), Some(true), "{seen:?}");
        let listing = std::process::Command::new("tar")
            .args(["-tvzf"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(listing.status.success());
        let listing = String::from_utf8_lossy(&listing.stdout);
        assert!(
            listing.contains("bin/pi -> ../lib/node_modules"),
            "{listing}"
        );
        for line in listing.lines() {
            assert!(
                line.contains(" 0/0 ") || line.contains(" root/root "),
                "{line}"
            );
            assert!(line.contains("2006-07-2"), "{line}");
        }
        // No name or time in the gzip header: MTIME (bytes 4..8) is zero, FLG has no FNAME.
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..3], &[0x1f, 0x8b, 8]);
        assert_eq!(bytes[3] & 0x08, 0, "no file name");
        assert_eq!(&bytes[4..8], &[0, 0, 0, 0], "no time");
    }
}
