//! Credentials recognised by their shape: provider key prefixes (`sk-…`, `AIza…`, `ghp_…`, AWS
//! access key ids), `Bearer`/`Basic` values, the value after a secret-looking name (`?key=…`,
//! `x-api-key: …`, `"api_key": "…"`, also JSON-escaped inside a string), and userinfo in URLs.
//! Each secret becomes `[redacted]`; its name or prefix stays, so the message still reads.
//!
//! Hand-written rather than a regex set: one pass over the bytes, dispatching on the byte at
//! hand, so text without a trigger (nearly every streamed delta) costs a scan and no allocation;
//! and rules like "a name's last word" or "key-like" read more plainly as code than as patterns.

use super::REDACTED;
use std::borrow::Cow;

/// `text` with every credential shape redacted; borrowed when nothing matched.
pub fn redact(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let Some(first) = find(bytes, 0) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut next = Some(first);
    while let Some((start, end)) = next {
        // Spans start and end on ASCII bytes, so they are char boundaries.
        out.push_str(&text[copied..start]);
        out.push_str(REDACTED);
        copied = end;
        next = find(bytes, end);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Whether `bytes` hold a credential shape.
pub fn matches(bytes: &[u8]) -> bool {
    find(bytes, 0).is_some()
}

/// The bytes a secret's shape is found from: the separator after a name (`:`, `=`, and
/// `://`), the `-`/`_` that ends a key prefix, the `A` of `AIza`/`AKIA`/`ASIA`, the space after
/// `Bearer`/`Basic`. Anything else is skipped by one table lookup.
const TRIGGER: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    let bytes = b":=-_A ";
    while i < bytes.len() {
        table[bytes[i] as usize] = true;
        i += 1;
    }
    table
};

/// The next secret's byte span at or after `from`.
fn find(bytes: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut i = from;
    while let Some(skip) = bytes.get(i..)?.iter().position(|&b| TRIGGER[b as usize]) {
        i += skip;
        let found = match bytes[i] {
            b':' if bytes[i + 1..].starts_with(b"//") => userinfo(bytes, i + 3),
            b':' | b'=' => named_value(bytes, i, from),
            b'-' | b'_' => key_ending_prefix(bytes, i, from),
            b'A' if starts_word(bytes, i) => prefixed_key(bytes, i),
            b' ' => scheme_before(bytes, i, from),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
        i += 1;
    }
    None
}

/// A key whose prefix ends with the `-` or `_` at `sep` (`sk-`, `ghp_`, `github_pat_`).
fn key_ending_prefix(bytes: &[u8], sep: usize, floor: usize) -> Option<(usize, usize)> {
    [2, 3, 4, 10].into_iter().find_map(|back| {
        let start = sep.checked_sub(back).filter(|s| *s >= floor)?;
        (b"spgxh".contains(&bytes[start]) && starts_word(bytes, start))
            .then(|| prefixed_key(bytes, start))
            .flatten()
    })
}

/// `Bearer`/`Basic` right before the space at `space`: the credential after it.
fn scheme_before(bytes: &[u8], space: usize, floor: usize) -> Option<(usize, usize)> {
    let last = bytes[space.checked_sub(1)?].to_ascii_lowercase();
    let back = match last {
        b'r' => 6,
        b'c' => 5,
        _ => return None,
    };
    let start = space.checked_sub(back).filter(|s| *s >= floor)?;
    starts_word(bytes, start)
        .then(|| scheme_value(bytes, start))
        .flatten()
}

/// Provider key prefixes. `keep` is how much of the prefix stays visible; `min` the shortest
/// body (after the prefix) taken for a key. A distinctive prefix needs nothing more; bare `sk-`
/// (`sk-learn`) needs a body that looks like a key.
struct Prefix {
    text: &'static [u8],
    keep: usize,
    min: usize,
    key_like: bool,
    /// The body may hold dots: pi-host's own tokens (`<prefix><id>.<secret>`).
    dotted: bool,
}

const PREFIXES: &[Prefix] = &[
    Prefix {
        text: b"sk-ant-",
        keep: 3,
        min: 8,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"sk-proj-",
        keep: 3,
        min: 8,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"sk-svcacct-",
        keep: 3,
        min: 8,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"sk-admin-",
        keep: 3,
        min: 8,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"sk-",
        keep: 3,
        min: 16,
        key_like: true,
        dotted: false,
    },
    Prefix {
        text: b"sk_",
        keep: 3,
        min: 16,
        key_like: true,
        dotted: false,
    },
    Prefix {
        text: b"AIza",
        keep: 4,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"pplx-",
        keep: 5,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"github_pat_",
        keep: 11,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"ghp_",
        keep: 4,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"gho_",
        keep: 4,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"ghs_",
        keep: 4,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"ghu_",
        keep: 4,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"ghr_",
        keep: 4,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"gsk_",
        keep: 4,
        min: 20,
        key_like: false,
        dotted: false,
    },
    Prefix {
        text: b"xai-",
        keep: 4,
        min: 20,
        key_like: false,
        dotted: false,
    },
    // pi-host's own pairing and device tokens (racp-server's token.rs): a pairing link the
    // agent prints (`pi-host pair`) must not hand its token to the model or a client.
    Prefix {
        text: b"ppt_",
        keep: 4,
        min: 8,
        key_like: false,
        dotted: true,
    },
    Prefix {
        text: b"pdt_",
        keep: 4,
        min: 8,
        key_like: false,
        dotted: true,
    },
    Prefix {
        text: b"hf_",
        keep: 3,
        min: 30,
        key_like: false,
        dotted: false,
    },
];

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

fn prefixed_key(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
    let rest = &bytes[at..];
    if let Some(id) = aws_access_key_id(rest) {
        return Some((at + 4, at + id));
    }
    let prefix = PREFIXES.iter().find(|p| rest.starts_with(p.text))?;
    let body = if prefix.dotted {
        run(&rest[prefix.text.len()..], |b| is_key_byte(b) || b == b'.')
    } else {
        run(&rest[prefix.text.len()..], is_key_byte)
    };
    let body_text = &rest[prefix.text.len()..prefix.text.len() + body];
    if body < prefix.min || (prefix.key_like && !key_like(body_text)) {
        return None;
    }
    Some((at + prefix.keep, at + prefix.text.len() + body))
}

/// `AKIA`/`ASIA` and 16 upper-case letters or digits, as a whole word: its length.
fn aws_access_key_id(rest: &[u8]) -> Option<usize> {
    if !(rest.starts_with(b"AKIA") || rest.starts_with(b"ASIA")) {
        return None;
    }
    let body = run(&rest[4..], |b| b.is_ascii_uppercase() || b.is_ascii_digit());
    let after = rest.get(4 + body).copied();
    (body == 16 && !after.is_some_and(|b| b.is_ascii_alphanumeric())).then_some(20)
}

/// A random-looking value: letters and digits, or a long run of mixed case (so
/// "authentication", "sessionName" or "sk-learn-is-great" are words, not keys).
fn key_like(value: &[u8]) -> bool {
    let has = |f: fn(&u8) -> bool| value.iter().any(f);
    !value.starts_with(b"[redacted]")
        && ((value.len() >= 8 && has(u8::is_ascii_digit) && has(u8::is_ascii_alphabetic))
            || (value.len() >= 20 && has(u8::is_ascii_uppercase) && has(u8::is_ascii_lowercase)))
}

/// What may follow `Bearer`/`Basic` as a credential rather than as a word: 8 or more characters
/// with a digit, a symbol or a capital past the first (`Basic dXNlcjpwYXNz` has no digit;
/// "Bearer authentication" is prose).
fn scheme_credential(token: &[u8]) -> bool {
    token.len() >= 8
        && (token.iter().any(u8::is_ascii_digit)
            || token.iter().any(|b| b"-._~+/=".contains(b))
            || token.iter().skip(1).any(u8::is_ascii_uppercase))
}

/// `Bearer x` / `Basic x`: the scheme stays, the credential after it goes.
fn scheme_value(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
    let rest = &bytes[at..];
    let scheme = [&b"bearer"[..], b"basic"]
        .into_iter()
        .find(|s| rest.len() > s.len() && rest[..s.len()].eq_ignore_ascii_case(s))?;
    let spaces = run(&rest[scheme.len()..], |b| b == b' ');
    if spaces == 0 {
        return None;
    }
    let start = scheme.len() + spaces;
    let token = run(&rest[start..], |b| {
        b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b)
    });
    scheme_credential(&rest[start..start + token]).then_some((at + start, at + start + token))
}

/// `scheme://user:pass@host`: everything between `://` and the authority's last `@`.
fn userinfo(bytes: &[u8], start: usize) -> Option<(usize, usize)> {
    let authority = run(&bytes[start..], |b| {
        !(b.is_ascii_whitespace() || b"/?#\"'\\<>,;()[]{}".contains(&b))
    });
    let at = bytes[start..start + authority]
        .iter()
        .rposition(|&b| b == b'@')?;
    (at > 0).then_some((start, start + at))
}

/// How strongly a name says that its value is a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    /// `key`, `token`, `primary_key`: only a key-like value is taken.
    Weak,
    /// `api_key`, `x-api-key`, `access_token`, `password`, `authorization`: any value.
    Strong,
    /// `Authorization`, `Cookie`: the value runs to the end of the line (`a=b; c=d`,
    /// `Bearer x`).
    Header,
}

/// A secret-looking name before the `:` or `=` at `sep` (looked back at from there, never
/// before `floor`), and the span of its value.
fn named_value(bytes: &[u8], sep: usize, floor: usize) -> Option<(usize, usize)> {
    let (start, end, quoted_name) = name_before(bytes, sep, floor);
    let name = classify_name(&bytes[start..end])?;
    let query = bytes[sep] == b'=' && start > 0 && b"?&;".contains(&bytes[start - 1]);
    let (k, quote) = value_start(bytes, sep + 1);
    if quoted_name && bytes[sep] == b':' && quote.is_none() {
        // `"token": 12`: a JSON number or object, not a secret string.
        return None;
    }
    let span = value_span(bytes, k, quote, name);
    let value = &bytes[span.0..span.1];
    let taken = match name {
        _ if value.is_empty() || value.starts_with(b"[redacted]") => false,
        _ if query => true,
        Name::Header => true,
        // Unquoted after a strong name is code as often as a secret (`apiKey: string`,
        // `api_key = os.environ[...]`): only a key-like value goes.
        Name::Strong if quote.is_some() => true,
        Name::Strong | Name::Weak => key_like(value),
    };
    taken.then_some(span)
}

/// The name that ends before the separator at `sep` (never before `floor`): its start, its
/// end, and whether it is quoted.
fn name_before(bytes: &[u8], sep: usize, floor: usize) -> (usize, usize, bool) {
    // Back over spaces and a closing quote (`"`, `'`, or `\"` inside a JSON string).
    let mut j = sep;
    while j > floor && bytes[j - 1] == b' ' {
        j -= 1;
    }
    let quoted_name = j > floor && matches!(bytes[j - 1], b'"' | b'\'');
    if quoted_name {
        j -= 1;
        // `\"` inside a JSON string, `\\\"` inside a string of JSON inside one...
        while j > floor && bytes[j - 1] == b'\\' {
            j -= 1;
        }
    }
    let end = j;
    while j > floor && is_key_byte(bytes[j - 1]) {
        j -= 1;
    }
    // `\napi_key=`: the `n` belongs to the escape, not to the name.
    if j > floor && bytes[j - 1] == b'\\' && end > j && b"nrtbf".contains(&bytes[j]) {
        j += 1;
    }
    (j, end, quoted_name)
}

/// Where a value starts after the separator (`from` is the byte after it), past spaces and an
/// opening quote; and that quote (`\\` for an escaped one).
fn value_start(bytes: &[u8], from: usize) -> (usize, Option<u8>) {
    let k = from + run(&bytes[from..], |b| b == b' ');
    let escapes = run(&bytes[k..], |b| b == b'\\');
    if escapes > 0 && matches!(bytes.get(k + escapes), Some(b'"' | b'\'')) {
        return (k + escapes + 1, Some(b'\\'));
    }
    match bytes.get(k) {
        Some(&q @ (b'"' | b'\'')) => (k + 1, Some(q)),
        _ => (k, None),
    }
}

/// The span of the value starting at `k`: to its closing quote, else to where a value of
/// `name`'s kind ends; a header's scheme (`Bearer `) and trailing spaces left out.
fn value_span(bytes: &[u8], k: usize, quote: Option<u8>, name: Name) -> (usize, usize) {
    let value = match (quote, name) {
        (Some(b'\\'), _) => run(&bytes[k..], |b| b != b'\\' && b != b'"'),
        (Some(q), _) => quoted_run(&bytes[k..], q),
        (None, Name::Header) => run(&bytes[k..], |b| {
            !(b == b'\n' || b == b'\r' || b == b'"' || b == b'\'' || b == b'\\')
        }),
        (None, _) => run(&bytes[k..], |b| {
            !(b.is_ascii_whitespace() || b"\"'\\&,;<>{}[]()".contains(&b))
        }),
    };
    let mut span = (k, k + value);
    if name == Name::Header {
        // `Authorization: Bearer x`: the scheme stays.
        let text = &bytes[k..k + value];
        for scheme in [&b"bearer "[..], b"basic ", b"token "] {
            if text.len() > scheme.len() && text[..scheme.len()].eq_ignore_ascii_case(scheme) {
                span.0 += scheme.len() + run(&text[scheme.len()..], |b| b == b' ');
            }
        }
        // Trailing spaces are not part of the value.
        while span.1 > span.0 && bytes[span.1 - 1] == b' ' {
            span.1 -= 1;
        }
    }
    span
}

/// The redacted form of a JSON member's string value when its name (`"api_key": "…"` as an
/// object member, not as text) says it is a secret; `None` to leave it to the text rules.
pub fn member_value(name: &str, value: &str) -> Option<String> {
    let kind = classify_name(name.as_bytes())?;
    let bytes = value.as_bytes();
    let mut keep = 0;
    if kind == Name::Header {
        for scheme in [&b"bearer "[..], b"basic ", b"token "] {
            if bytes.len() > scheme.len() && bytes[..scheme.len()].eq_ignore_ascii_case(scheme) {
                keep = scheme.len();
            }
        }
    }
    let secret = &bytes[keep..];
    let taken = !secret.is_empty()
        && !secret.starts_with(b"[redacted]")
        && (kind != Name::Weak || key_like(secret));
    // `keep` ends on an ASCII byte, so it is a char boundary.
    taken.then(|| format!("{}{REDACTED}", &value[..keep]))
}

/// The words of a name: split at `-`, `_` and lower-to-upper case changes (`x-api-key`,
/// `apiKey`, `OPENAI_API_KEY`, `SecretAccessKey`). Borrowed: names are looked at on every `:`
/// of every JSON text, so this allocates nothing.
fn words(name: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < name.len() {
            let b = name[i];
            if b == b'-' || b == b'_' {
                let word = &name[start..i];
                i += 1;
                start = i;
                if !word.is_empty() {
                    return Some(word);
                }
                continue;
            }
            let camel = i > start
                && b.is_ascii_uppercase()
                && (name[i - 1].is_ascii_lowercase() || name[i - 1].is_ascii_digit());
            if camel {
                let word = &name[start..i];
                start = i;
                i += 1;
                return Some(word);
            }
            i += 1;
        }
        if start < name.len() {
            let word = &name[start..];
            start = name.len();
            return Some(word);
        }
        None
    })
}

fn is_one_of(word: &[u8], list: &[&str]) -> bool {
    list.iter().any(|w| word.eq_ignore_ascii_case(w.as_bytes()))
}

const SECRET_LAST: &[&str] = &[
    "key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "credential",
    "credentials",
    "signature",
    "sig",
    "auth",
];

/// Words that make a name's value a secret whatever it looks like.
const STRONG: &[&str] = &[
    "api",
    "apikey",
    "secret",
    "password",
    "passwd",
    "pwd",
    "access",
    "private",
    "auth",
    "session",
    "refresh",
    "client",
    "bearer",
    "credential",
    "credentials",
    "subscription",
    "signature",
    "sig",
];

fn classify_name(name: &[u8]) -> Option<Name> {
    // Names are short; a long run is text, not a name.
    if name.is_empty() || name.len() > 64 || !name[0].is_ascii_alphabetic() {
        return None;
    }
    // Cheap test first: most names (`type`, `content`, `delta`) end in none of these.
    let last_byte = name[name.len() - 1].to_ascii_lowercase();
    if !b"yntdlsegh".contains(&last_byte) {
        return None;
    }
    let last = words(name).last()?;
    if is_one_of(last, &["authorization", "cookie"]) {
        return Some(Name::Header);
    }
    if !is_one_of(last, SECRET_LAST) {
        return None;
    }
    if words(name).any(|w| is_one_of(w, STRONG)) {
        Some(Name::Strong)
    } else {
        Some(Name::Weak)
    }
}

/// The first byte of a word: the previous byte is no letter or digit (or is the letter of an
/// escape such as `\n` in JSON text).
fn starts_word(bytes: &[u8], at: usize) -> bool {
    match at {
        0 => true,
        1 => !bytes[0].is_ascii_alphanumeric(),
        _ => {
            let prev = bytes[at - 1];
            !prev.is_ascii_alphanumeric() || (bytes[at - 2] == b'\\' && b"nrtbf".contains(&prev))
        }
    }
}

/// The length of a quoted value up to its closing `quote`, escapes (`\\n`, `\\"`) included
/// whole, so replacing it leaves a JSON string intact.
fn quoted_run(bytes: &[u8], quote: u8) -> usize {
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if i + 1 < bytes.len() => i += 2,
            b'\\' => return i,
            b if b == quote => return i,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// How many leading bytes of `bytes` satisfy `keep`.
fn run(bytes: &[u8], keep: impl Fn(u8) -> bool) -> usize {
    bytes.iter().position(|&b| !keep(b)).unwrap_or(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text in, text out: one row per shape.
    #[rustfmt::skip]
    const ROWS: &[(&str, &str)] = &[
        // Provider key prefixes.
        ("key sk-abcDEF0123456789xyzXYZ ok", "key sk-[redacted] ok"),
        ("401 Incorrect API key provided: sk-proj-abcdefghijklmnop1234.", "401 Incorrect API key provided: sk-[redacted]."),
        ("sk-proj-abcdefghijklmnop", "sk-[redacted]"),
        ("x-ant sk-ant-api03-abcdefghijklmnop_QRST-uvw", "x-ant sk-[redacted]"),
        ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "stripe sk_[redacted]"),
        ("AIzaSyA1234567890abcdefghijklmnopqrstu", "AIza[redacted]"),
        ("pplx-0123456789abcdef0123456789abcdef0123456789abcdef", "pplx-[redacted]"),
        ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", "ghp_[redacted]"),
        ("gsk_abcdefghijklmnopqrstuvwxyz0123456789", "gsk_[redacted]"),
        ("xai-abcdefghijklmnopqrstuvwxyz0123456789", "xai-[redacted]"),
        ("id AKIAIOSFODNN7EXAMPLE used", "id AKIA[redacted] used"),
        ("ASIAY34FZKBOKMUTVV7A", "ASIA[redacted]"),
        // pi-host's own tokens, whose secret follows a dot: a pairing link, a device token.
        ("racps://127.0.0.1:7878/pair?cert=sha256:ab#ppt_SBL3KbOrgHc3.ndXdNu84TxCiuEr3vZN_rg", "racps://127.0.0.1:7878/pair?cert=sha256:ab#ppt_[redacted]"),
        ("token pdt_Q1w2E3r4.abcdefghijklmnopqrstuv ok", "token pdt_[redacted] ok"),
        // Authorization schemes.
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "Authorization: Bearer [redacted]"),
        ("sent bearer abcdef0123456789 then", "sent bearer [redacted] then"),
        ("proxy said Basic dXNlcjpwYXNzd29yZA== no", "proxy said Basic [redacted] no"),
        ("Basic dXNlcjpwYXNz", "Basic [redacted]"),
        ("Authorization: Token 0123456789abcdef", "Authorization: Token [redacted]"),
        ("authorization: rawtokenvalue", "authorization: [redacted]"),
        ("Proxy-Authorization: Basic dXNlcjpwYXNz\r\nHost: x", "Proxy-Authorization: Basic [redacted]\r\nHost: x"),
        // Names in URL queries.
        ("GET https://generativelanguage.googleapis.com/v1/models?key=abc123&alt=sse", "GET https://generativelanguage.googleapis.com/v1/models?key=[redacted]&alt=sse"),
        ("https://x.example/v1?api-key=v&x=1", "https://x.example/v1?api-key=[redacted]&x=1"),
        ("https://x.example/cb?access_token=ya29.a0Af&state=1", "https://x.example/cb?access_token=[redacted]&state=1"),
        ("https://x.example/?token=t0", "https://x.example/?token=[redacted]"),
        ("https://x.example/?apikey=abc&q", "https://x.example/?apikey=[redacted]&q"),
        // Headers.
        ("x-api-key: hunter2secret", "x-api-key: [redacted]"),
        ("x-api-key:abcdef123456 next", "x-api-key:[redacted] next"),
        ("api-key: Az7Sx4Dc1Fv9", "api-key: [redacted]"),
        ("Cookie: session=abc; other=def\nnext", "Cookie: [redacted]\nnext"),
        // JSON, quoted and compact, and escaped inside a JSON string.
        (r#"{"api-key": "v"}"#, r#"{"api-key": "[redacted]"}"#),
        (r#"{"x-api-key":"v"}"#, r#"{"x-api-key":"[redacted]"}"#),
        (r#"{"error":"bad \"api_key\":\"v\" given"}"#, r#"{"error":"bad \"api_key\":\"[redacted]\" given"}"#),
        (r#"{"m":"{\"e\":\"{\\\"api_key\\\":\\\"v\\\"}\"}"}"#, r#"{"m":"{\"e\":\"{\\\"api_key\\\":\\\"[redacted]\\\"}\"}"}"#),
        (r#"{'apiKey': 'v'}"#, r#"{'apiKey': '[redacted]'}"#),
        (r#"{"token": "abc123def456"}"#, r#"{"token": "[redacted]"}"#),
        (r#"{"access_token":"t"}"#, r#"{"access_token":"[redacted]"}"#),
        (r#"{"api_key":"\n1\"2"}"#, r#"{"api_key":"[redacted]"}"#),
        // Userinfo in URLs.
        ("via https://user:pass@proxy:8080 failed", "via https://[redacted]@proxy:8080 failed"),
        ("redis://:p4ss@cache/0", "redis://[redacted]@cache/0"),
        // AWS secret access keys after their name.
        ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key=[redacted]"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key = [redacted]"),
        (r#""SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY""#, r#""SecretAccessKey": "[redacted]""#),
        ("OPENAI_API_KEY=abc123def456", "OPENAI_API_KEY=[redacted]"),
        ("password = 'hunter'", "password = '[redacted]'"),
        // An escape's letter is no part of a word.
        (r"line\nsk-proj-abcdefghijklmnop", r"line\nsk-[redacted]"),
        (r"x\napi_key=v4lue123", r"x\napi_key=[redacted]"),
    ];

    /// Every key prefix, with the shortest body it alone takes (no digits, so no other rule
    /// would): dropping a prefix from [`PREFIXES`] fails its row. Written out by hand.
    #[rustfmt::skip]
    const PREFIX_ROWS: &[(&str, &str)] = &[
        ("k sk-ant-abcdefgh", "k sk-[redacted]"),
        ("k ppt_abcd.efgh", "k ppt_[redacted]"),
        ("k pdt_abcd.efgh", "k pdt_[redacted]"),
        ("k sk-proj-abcdefgh", "k sk-[redacted]"),
        ("k sk-svcacct-abcdefgh", "k sk-[redacted]"),
        ("k sk-admin-abcdefgh", "k sk-[redacted]"),
        ("k sk-abcdefgh01234567", "k sk-[redacted]"),
        ("k sk_abcdefgh01234567", "k sk_[redacted]"),
        ("k AIzaabcdefghijklmnopqrst", "k AIza[redacted]"),
        ("k pplx-abcdefghijklmnopqrst", "k pplx-[redacted]"),
        ("k github_pat_abcdefghijklmnopqrst", "k github_pat_[redacted]"),
        ("k ghp_abcdefghijklmnopqrst", "k ghp_[redacted]"),
        ("k gho_abcdefghijklmnopqrst", "k gho_[redacted]"),
        ("k ghs_abcdefghijklmnopqrst", "k ghs_[redacted]"),
        ("k ghu_abcdefghijklmnopqrst", "k ghu_[redacted]"),
        ("k ghr_abcdefghijklmnopqrst", "k ghr_[redacted]"),
        ("k gsk_abcdefghijklmnopqrst", "k gsk_[redacted]"),
        ("k xai-abcdefghijklmnopqrst", "k xai-[redacted]"),
        ("k hf_abcdefghijklmnopqrstuvwxyzabcd", "k hf_[redacted]"),
        ("k AKIAABCDEFGHIJKLMNOP", "k AKIA[redacted]"),
        ("k ASIAABCDEFGHIJKLMNOP", "k ASIA[redacted]"),
    ];

    /// The last words that make a name a secret's (a key-like value after them goes), and the
    /// words that make any quoted value after the name go. Written out by hand.
    const SECRET_NAME_ENDINGS: &[&str] = &[
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "credential",
        "credentials",
        "signature",
        "sig",
        "auth",
    ];
    const STRONG_NAME_WORDS: &[&str] = &[
        "api",
        "apikey",
        "secret",
        "password",
        "passwd",
        "pwd",
        "access",
        "private",
        "auth",
        "session",
        "refresh",
        "client",
        "bearer",
        "credential",
        "credentials",
        "subscription",
        "signature",
        "sig",
    ];

    #[test]
    fn each_key_prefix_takes_the_body_only_it_would() {
        for (input, expected) in PREFIX_ROWS {
            assert_eq!(redact(input), *expected, "{input}");
        }
        // And a prefix added to the code has a row here.
        for prefix in PREFIXES {
            let text = std::str::from_utf8(prefix.text).unwrap();
            assert!(
                PREFIX_ROWS
                    .iter()
                    .any(|(input, _)| input.starts_with(&format!("k {text}"))),
                "{text} has no row in PREFIX_ROWS"
            );
        }
    }

    #[test]
    fn each_secret_name_takes_its_value() {
        for ending in SECRET_NAME_ENDINGS {
            // A plain first word: only the ending makes it a secret's name.
            let input = format!("my_{ending}=abc123def456 next");
            assert_eq!(
                redact(&input),
                format!("my_{ending}=[redacted] next"),
                "{input}"
            );
            let camel = format!("my{}{}", ending[..1].to_uppercase(), &ending[1..]);
            let json = format!(r#"{{"{camel}": "abc123def456"}}"#);
            assert!(redact(&json).contains("[redacted]"), "{json}");
        }
        for word in STRONG_NAME_WORDS {
            // A word that is no key after a strong name goes too; after a weak one it stays.
            let input = format!(r#"{{"{word}_token": "plainword"}}"#);
            assert_eq!(
                redact(&input),
                format!(r#"{{"{word}_token": "[redacted]"}}"#),
                "{input}"
            );
        }
        assert_eq!(
            redact(r#"{"my_token": "plainword"}"#),
            r#"{"my_token": "plainword"}"#
        );
        for header in ["Authorization", "Cookie", "X-Proxy-Authorization"] {
            let input = format!("{header}: some words here\nnext");
            assert!(
                redact(&input).starts_with(&format!("{header}: [redacted]")),
                "{input}"
            );
        }
    }

    /// Text that must come through unchanged.
    const SURVIVORS: &[&str] = &[
        "an ordinary sentence about keys and tokens",
        "pip install sk-learn; import sklearn",
        "sk-learn-is-a-great-library",
        "123e4567-e89b-12d3-a456-426614174000",
        "3.14159 -42 1e308 18446744073709551616",
        r#"{"type":"message_update","max_tokens":4096,"input_tokens":12}"#,
        r#"{"token": 12, "key": null, "keys": ["a"]}"#,
        "the key: it matters",
        "Bearer authentication is described in RFC 6750",
        "use Basic auth",
        "monkey=banana",
        "https://example.com/path?q=1&page=2",
        "mailto:someone@example.com",
        "https://github.com/@user",
        "AKIA is a prefix; AKIAIOSFODNN7EXAMPLEX is too long",
        r#"{"primary_key":"user_id"}"#,
        r#"{"key":"sessionName"}"#,
        "interface Options { apiKey: string; token?: string }",
        "api_key = os.environ[\"OPENAI_API_KEY\"]",
        "password = input()",
        "ppt_short",
        "sk-[redacted] and Bearer [redacted] and https://[redacted]@host",
        r#"{"api_key":"[redacted]"}"#,
    ];

    #[test]
    fn one_row_per_shape() {
        for (input, expected) in ROWS {
            assert_eq!(redact(input), *expected, "{input}");
            assert!(matches(input.as_bytes()), "{input}");
        }
    }

    #[test]
    fn non_secrets_survive() {
        for text in SURVIVORS {
            assert!(
                matches!(redact(text), Cow::Borrowed(_)),
                "{text} -> {}",
                redact(text)
            );
        }
    }

    #[test]
    fn redacting_twice_changes_nothing() {
        for (input, _) in ROWS {
            let once = redact(input).into_owned();
            assert_eq!(redact(&once), once, "{input}");
        }
    }

    #[test]
    fn odd_input_does_not_panic() {
        for text in [
            "",
            ":",
            "=",
            "://",
            "a://@",
            "Bearer",
            "Bearer ",
            "sk-",
            "AKIA",
            "\"key\":",
            "é:é=é://é@",
        ] {
            let _ = redact(text);
        }
    }
}
