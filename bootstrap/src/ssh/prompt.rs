//! Asking the person at the keyboard: a key's passphrase, or whether to trust a new host.
//!
//! Like OpenSSH: `$SSH_ASKPASS` answers when there is no terminal (or when
//! `SSH_ASKPASS_REQUIRE=force`); otherwise the question goes to `/dev/tty`, so it works while
//! stdout carries `--json` output. With neither, nobody is asked and the answer is "no".

use std::io::{BufRead, Write};

fn askpass() -> Option<String> {
    let program = std::env::var("SSH_ASKPASS")
        .ok()
        .filter(|p| !p.is_empty())?;
    let require = std::env::var("SSH_ASKPASS_REQUIRE").unwrap_or_default();
    match require.as_str() {
        "never" => None,
        "force" => Some(program),
        _ if has_terminal() => None,
        _ => Some(program),
    }
}

fn has_terminal() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .is_ok()
}

fn run_askpass(program: &str, prompt: &str) -> Option<String> {
    let output = std::process::Command::new(program)
        .arg(prompt)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    Some(text.trim_end_matches(['\n', '\r']).to_string())
}

/// An encrypted key's passphrase, asked as OpenSSH asks it.
pub fn ask_key_passphrase(path: &std::path::Path) -> Option<String> {
    ask_secret(&format!("Enter passphrase for key '{}': ", path.display()))
}

/// A secret typed without echo (a passphrase).
pub fn ask_secret(prompt: &str) -> Option<String> {
    if let Some(program) = askpass() {
        return run_askpass(&program, prompt);
    }
    if !has_terminal() {
        return None;
    }
    rpassword::prompt_password(prompt).ok()
}

/// A yes/no question; only `yes` or `y` is yes.
pub fn ask_yes_no(prompt: &str) -> bool {
    let answer = if let Some(program) = askpass() {
        run_askpass(&program, prompt)
    } else {
        ask_terminal(prompt)
    };
    answer.is_some_and(|a| matches!(a.trim().to_ascii_lowercase().as_str(), "yes" | "y"))
}

fn ask_terminal(prompt: &str) -> Option<String> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    let mut writer = tty.try_clone().ok()?;
    writer.write_all(prompt.as_bytes()).ok()?;
    writer.flush().ok()?;
    let mut line = String::new();
    std::io::BufReader::new(tty).read_line(&mut line).ok()?;
    Some(line)
}
