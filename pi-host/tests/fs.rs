//! `fs/list`, `fs/stat` and `fs/read` stay inside the permitted roots, symlinks and `..`
//! included; `fs/read` pages text and flags binary.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::json;
use std::path::Path;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn listing_and_stat_are_confined_to_the_roots() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    let hello = client.hello().await;
    assert!(
        hello["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("fs"))
    );

    let root = host.root.path();
    let project = host.workspace("project");
    std::fs::write(root.join("notes.md"), "hello").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "x").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
    std::os::unix::fs::symlink(&project, root.join("shortcut")).unwrap();

    let listed = client.call("fs/list", json!({"path": root})).await;
    let entries = listed["result"]["entries"].as_array().unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["escape", "notes.md", "project", "shortcut"],
        "sorted by name"
    );
    let kind = |name: &str| entries.iter().find(|e| e["name"] == name).unwrap()["kind"].clone();
    assert_eq!(kind("project"), "dir");
    assert_eq!(kind("notes.md"), "file");
    assert_eq!(
        kind("shortcut"),
        "dir",
        "a link inside the roots shows its target"
    );
    assert_eq!(
        kind("escape"),
        "symlink",
        "a link out of the roots stays a link"
    );
    let notes = entries.iter().find(|e| e["name"] == "notes.md").unwrap();
    assert_eq!(notes["size"], 5);

    let stat = client
        .call(
            "fs/stat",
            json!({"path": format!("{}/notes.md", root.display())}),
        )
        .await;
    assert_eq!(stat["result"]["kind"], "file");

    let code = |reply: serde_json::Value| reply["error"]["code"].clone();
    let escape = format!("{}/escape", root.display());
    assert_eq!(
        code(client.call("fs/list", json!({"path": escape})).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    let through = format!("{}/escape/secret.txt", root.display());
    assert_eq!(
        code(client.call("fs/stat", json!({"path": through})).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    let dotdot = format!("{}/project/../..", root.display());
    assert_eq!(
        code(client.call("fs/list", json!({"path": dotdot})).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    let outside = client.call("fs/list", json!({"path": "/etc"})).await;
    assert_eq!(code(outside.clone()), "REMOTE_PATH_FORBIDDEN");
    // The refusal names where paths may be.
    let root_text = root.display().to_string();
    assert!(
        outside["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&root_text),
        "{outside}"
    );
    assert!(
        outside["error"]["details"]["roots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == &json!(root_text)),
        "{outside}"
    );
    let missing = format!("{}/missing", root.display());
    assert_eq!(
        code(client.call("fs/stat", json!({"path": missing})).await),
        "REMOTE_PATH_NOT_FOUND"
    );
    let file = format!("{}/notes.md", root.display());
    assert_eq!(
        code(client.call("fs/list", json!({"path": file})).await),
        "INVALID_PARAMS"
    );
    assert_eq!(
        code(client.call("fs/list", json!({"path": "relative"})).await),
        "INVALID_PARAMS"
    );
}

#[tokio::test]
async fn with_fs_off_the_capability_is_gone_and_calls_say_so() {
    let host = HostProcess::start_with(bin(), &["--disable-fs"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    let hello = client.hello().await;
    let capabilities = hello["capabilities"].as_array().unwrap();
    assert!(!capabilities.contains(&json!("fs")));
    assert!(capabilities.contains(&json!("sessions")));
    let reply = client
        .call("fs/list", json!({"path": host.root.path()}))
        .await;
    assert_eq!(reply["error"]["code"], "CAPABILITY_UNAVAILABLE");
    assert_eq!(reply["error"]["details"]["capability"], "fs");
    let info = client.call("host/info", json!({})).await;
    assert_eq!(info["result"]["capabilities"], hello["capabilities"]);
}

/// A root that holds the host's data directory (as `$HOME` does by default) still keeps it out
/// of reach: no listing, stat or workspace inside it, and it is not shown in its parent.
#[tokio::test]
async fn the_data_directory_is_out_of_reach_whatever_the_roots() {
    let temp = std::env::temp_dir().canonicalize().unwrap();
    let host = HostProcess::start_with(bin(), &["--root", temp.to_str().unwrap()]).await;
    let (_, token) = host.pair_device("laptop", &["--roles", "operator"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let data = host.data_dir.path().canonicalize().unwrap();
    assert!(data.starts_with(&temp), "the data dir lies inside the root");

    let code = |reply: serde_json::Value| reply["error"]["code"].as_str().unwrap_or("").to_string();
    for path in [
        data.clone(),
        data.join("host.key"),
        data.join("pi-host.db"),
        data.join("no-such-file"),
        data.join("../").join(data.file_name().unwrap()),
    ] {
        for method in ["fs/list", "fs/stat", "fs/read"] {
            let reply = client.call(method, json!({"path": path})).await;
            assert_eq!(
                code(reply),
                "REMOTE_PATH_FORBIDDEN",
                "{method} {}",
                path.display()
            );
        }
    }
    let created = client
        .call("session/create", json!({"workspace": data}))
        .await;
    assert_eq!(code(created), "REMOTE_PATH_FORBIDDEN");
    // A symlink to it from inside the root leads nowhere either.
    let link = host.root.path().join("data-link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let reply = client
        .call("fs/stat", json!({"path": link.join("host.key")}))
        .await;
    assert_eq!(code(reply), "REMOTE_PATH_FORBIDDEN");

    let parent = client
        .call("fs/list", json!({"path": data.parent().unwrap()}))
        .await;
    let names: Vec<&str> = parent["result"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(!names.is_empty());
    let data_name = data.file_name().unwrap().to_str().unwrap();
    assert!(
        !names.contains(&data_name),
        "the data dir is listed: {names:?}"
    );
}

/// Outside the roots, a path that exists and one that does not answer the same way.
#[tokio::test]
async fn paths_outside_the_roots_do_not_reveal_whether_they_exist() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("shadow"), "secret").unwrap();
    let root = host.root.path();
    std::os::unix::fs::symlink(outside.path(), root.join("etc")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("gone"), root.join("dangling")).unwrap();

    let mut answers = Vec::new();
    for path in [
        root.join("etc/shadow"),
        root.join("etc/no-such-file"),
        root.join("etc/no/such/dir"),
        root.join("dangling"),
        outside.path().join("shadow"),
        outside.path().join("no-such-file"),
    ] {
        let reply = client.call("fs/stat", json!({"path": path})).await;
        answers.push((path, reply["error"]["code"].clone()));
    }
    for (path, code) in &answers {
        assert_eq!(code, "REMOTE_PATH_FORBIDDEN", "{}", path.display());
    }
    let missing = client
        .call("fs/stat", json!({"path": root.join("no-such-file")}))
        .await;
    assert_eq!(missing["error"]["code"], "REMOTE_PATH_NOT_FOUND");
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

async fn operator(host: &HostProcess) -> Client {
    let (_, token) = host.pair_device("laptop", &["--roles", "operator"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    client
}

#[tokio::test]
async fn a_file_is_read_in_pages_that_end_on_whole_characters() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let path = host.root.path().join("notes.md");
    // "abc" then "é" (two bytes): a page of 4 bytes would cut the character.
    std::fs::write(&path, "abcé").unwrap();
    let read = |offset: u64, length: u64| json!({"path": path, "offset": offset, "length": length});

    let whole = client.call("fs/read", json!({"path": path})).await["result"].clone();
    assert_eq!(whole["data"], "abcé");
    assert_eq!(whole["encoding"], "utf8");
    assert_eq!(
        (whole["size"].clone(), whole["length"].clone()),
        (json!(5), json!(5))
    );
    assert_eq!(whole["eof"], true);
    assert_eq!(whole["binary"], false);
    assert_eq!(whole["sha256"], sha256_hex("abcé".as_bytes()));
    assert!(whole["modifiedAt"].as_u64().unwrap() > 0);

    let cut = client.call("fs/read", read(0, 4)).await["result"].clone();
    assert_eq!(
        (cut["data"].clone(), cut["length"].clone()),
        (json!("abc"), json!(3))
    );
    assert_eq!(cut["eof"], false, "{cut}");
    assert_eq!(
        cut["sha256"], whole["sha256"],
        "the hash is the whole file's"
    );
    let rest = client.call("fs/read", read(3, 4)).await["result"].clone();
    assert_eq!(
        (rest["data"].clone(), rest["eof"].clone()),
        (json!("é"), json!(true))
    );
    // Exactly up to the character's end: all of it, nothing cut.
    let exact = client.call("fs/read", read(0, 5)).await["result"].clone();
    assert_eq!(
        (exact["data"].clone(), exact["length"].clone()),
        (json!("abcé"), json!(5))
    );
    // Shorter than the character itself: not text on its own.
    let half = client.call("fs/read", read(3, 1)).await["result"].clone();
    assert_eq!(
        (half["binary"].clone(), half["length"].clone()),
        (json!(true), json!(1))
    );
    assert!(half.get("data").is_none(), "{half}");
    let past = client.call("fs/read", read(99, 4)).await["result"].clone();
    assert_eq!(
        (past["length"].clone(), past["eof"].clone()),
        (json!(0), json!(true))
    );
    assert_eq!(past["data"], "");

    // A longer file in the largest pages, put back together.
    let big: String = (0..200_000)
        .map(|i| format!("line {i} — ünïcode\n"))
        .collect();
    let big_path = host.root.path().join("big.txt");
    std::fs::write(&big_path, &big).unwrap();
    let (mut offset, mut joined, mut pages) = (0u64, String::new(), 0);
    loop {
        let page = json!({"path": big_path, "offset": offset, "length": 524_288});
        let page = client.call("fs/read", page).await["result"].clone();
        assert_eq!(page["sha256"], sha256_hex(big.as_bytes()));
        joined.push_str(page["data"].as_str().unwrap());
        offset += page["length"].as_u64().unwrap();
        pages += 1;
        if page["eof"] == true {
            break;
        }
    }
    assert_eq!(joined, big);
    assert!(pages > 1, "{} bytes in {pages} page(s)", big.len());
}

#[tokio::test]
async fn binary_is_flagged_and_sent_only_when_asked() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let root = host.root.path();
    let bytes = [0x89u8, b'P', b'N', b'G', 0, 1, 2, 0xff];
    std::fs::write(root.join("image.png"), bytes).unwrap();
    std::fs::write(root.join("latin1.txt"), [b'c', b'a', b'f', 0xe9]).unwrap();

    let flagged = client
        .call("fs/read", json!({"path": root.join("image.png")}))
        .await["result"]
        .clone();
    assert_eq!(flagged["binary"], true);
    assert!(
        flagged.get("data").is_none() && flagged.get("encoding").is_none(),
        "{flagged}"
    );
    let asked = json!({"path": root.join("image.png"), "encoding": "base64"});
    let asked = client.call("fs/read", asked).await["result"].clone();
    assert_eq!(asked["encoding"], "base64");
    use base64::Engine;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(asked["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(decoded, bytes);
    // Invalid UTF-8 without a NUL byte is binary too.
    let latin = client
        .call("fs/read", json!({"path": root.join("latin1.txt")}))
        .await["result"]
        .clone();
    assert_eq!(latin["binary"], true, "{latin}");
}

#[tokio::test]
async fn reads_refuse_what_is_not_a_file_inside_the_roots() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let root = host.root.path();
    let code = |reply: serde_json::Value| reply["error"]["code"].as_str().unwrap_or("").to_string();
    let read = |path: &Path| json!({"path": path});

    let dir = client.call("fs/read", read(root)).await;
    assert_eq!(code(dir.clone()), "READ_PATH_IS_DIRECTORY");
    assert!(
        dir["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fs/list"),
        "{dir}"
    );
    let missing = client.call("fs/read", read(&root.join("missing"))).await;
    assert_eq!(code(missing), "REMOTE_PATH_NOT_FOUND");
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "x").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), root.join("leak")).unwrap();
    assert_eq!(
        code(client.call("fs/read", read(&root.join("leak"))).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    let dotdot = root
        .join("..")
        .join(outside.path().file_name().unwrap())
        .join("secret");
    assert_eq!(
        code(client.call("fs/read", read(&dotdot)).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    // A FIFO would block a reader forever: refused at once.
    let fifo = root.join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    assert_eq!(
        code(client.call("fs/read", read(&fifo)).await),
        "INVALID_PARAMS"
    );

    // The page bound, both sides of it.
    std::fs::write(root.join("a.txt"), "a").unwrap();
    let with_length = |length: u64| json!({"path": root.join("a.txt"), "length": length});
    assert_eq!(
        code(client.call("fs/read", with_length(0)).await),
        "INVALID_PARAMS"
    );
    assert_eq!(
        code(client.call("fs/read", with_length(524_289)).await),
        "INVALID_PARAMS"
    );
    let largest = client.call("fs/read", with_length(524_288)).await;
    assert_eq!(largest["result"]["data"], "a", "{largest}");

    // The permission policy's denylist holds for devices too, through a link as well.
    std::fs::write(root.join(".env"), "SECRET=1").unwrap();
    std::fs::write(root.join("server.key"), "-----BEGIN").unwrap();
    std::os::unix::fs::symlink(root.join(".env"), root.join("settings.txt")).unwrap();
    for name in [".env", "server.key", "settings.txt"] {
        let reply = client.call("fs/read", read(&root.join(name))).await;
        assert_eq!(
            code(reply.clone()),
            "WORKSPACE_PATH_DENIED",
            "{name}: {reply}"
        );
        assert!(!reply.to_string().contains("SECRET"), "{reply}");
    }

    // An observer browses names, never contents.
    let (_, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut observer = Client::connect(&host.url(), &token).await.unwrap();
    observer.hello().await;
    let refused = observer.call("fs/read", read(&root.join("a.txt"))).await;
    assert_eq!(code(refused), "FORBIDDEN");
}

/// A 50 MB file read whole in the largest pages comes back byte for byte, each page naming the
/// same hash (hashed once, not once a page); a change to the file changes the hash at once.
#[tokio::test]
async fn a_fifty_megabyte_file_reads_in_pages_and_a_change_shows_in_its_hash() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let path = host.root.path().join("big.log");
    let line = "0123456789abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n";
    let text = line.repeat((50 << 20) / line.len());
    std::fs::write(&path, &text).unwrap();
    let expected = sha256_hex(text.as_bytes());
    let (mut offset, mut pages) = (0u64, 0);
    let mut joined = String::with_capacity(text.len());
    loop {
        let page = json!({"path": path, "offset": offset, "length": 524_288});
        let page = client.call("fs/read", page).await["result"].clone();
        assert_eq!(page["sha256"], expected, "page {pages}");
        joined.push_str(page["data"].as_str().unwrap());
        offset += page["length"].as_u64().unwrap();
        pages += 1;
        if page["eof"] == true {
            break;
        }
    }
    assert_eq!(pages, text.len().div_ceil(524_288));
    assert!(joined == text, "the pages put together differ");

    // Appended to: the next read names the new content's hash, not the cached one.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"one more line\n"))
        .unwrap();
    let last = json!({"path": path, "offset": text.len()});
    let last = client.call("fs/read", last).await["result"].clone();
    assert_eq!(last["data"], "one more line\n");
    assert_ne!(last["sha256"], expected);
    let mut changed = text.into_bytes();
    changed.extend_from_slice(b"one more line\n");
    assert_eq!(last["sha256"], sha256_hex(&changed));
}

/// `~` and `~/…` are the host user's home in every path a client sends (docs/protocol.md §7.8):
/// the desktop's shell cannot know it. `~user` stays as given, so it is refused as relative.
#[tokio::test]
async fn tilde_paths_are_the_host_users_home() {
    let home = tempfile::tempdir().unwrap();
    let home_path = std::fs::canonicalize(home.path()).unwrap();
    let home_text = home_path.to_str().unwrap();
    std::fs::create_dir(home_path.join("src")).unwrap();
    std::fs::write(home_path.join("src/a.txt"), "from home").unwrap();
    let host =
        HostProcess::start_with_env(bin(), &["--root", home_text], &[("HOME", home_text)]).await;
    let mut client = operator(&host).await;

    let listed = client.call("fs/list", json!({"path": "~/src"})).await;
    assert_eq!(
        listed["result"]["path"],
        json!(home_path.join("src")),
        "{listed}"
    );
    assert_eq!(listed["result"]["entries"][0]["name"], "a.txt", "{listed}");
    let stat = client.call("fs/stat", json!({"path": "~"})).await;
    assert_eq!(stat["result"]["kind"], "dir", "{stat}");
    let read = client.call("fs/read", json!({"path": "~/src/a.txt"})).await;
    assert_eq!(read["result"]["data"], "from home", "{read}");
    let created = client
        .call("session/create", json!({"workspace": "~/src"}))
        .await;
    assert_eq!(
        created["result"]["session"]["workspace"],
        json!(home_path.join("src")),
        "{created}"
    );

    let other = client.call("fs/list", json!({"path": "~nobody/src"})).await;
    assert_eq!(other["error"]["code"], "INVALID_PARAMS", "{other}");
    let message = other["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("~/… for the host user's home"),
        "{message}"
    );
}
