//! The shape of a presented token: `<prefix><id>.<secret>`, as a host and a gateway read it
//! before looking anything up.

/// The two halves of a presented token.
pub struct Presented<'a> {
    pub id: &'a str,
    pub secret: &'a str,
}

/// Splits `<prefix><id>.<secret>`; `None` when the token has another shape.
pub fn split<'a>(token: &'a str, prefix: &str) -> Option<Presented<'a>> {
    let rest = token.strip_prefix(prefix)?;
    let (id, secret) = rest.split_once('.')?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (ok(id) && ok(secret)).then_some(Presented { id, secret })
}
