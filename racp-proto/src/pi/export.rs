//! pi's HTML export (`export_html`): one self-contained page whose conversation (the session's
//! entries, the system prompt, the tools) is a base64-encoded JSON text inside
//! `<script id="session-data" type="application/json">`, which the page's own script decodes and
//! renders. Everything else on the page is pi's template (styles, script, vendored libraries).

use std::ops::Range;

/// Where pi's template puts the session data.
const OPEN: &str = r#"<script id="session-data" type="application/json">"#;
const CLOSE: &str = "</script>";

/// The byte range of the page's embedded session data (its base64 text), when it has one.
pub fn session_data(html: &str) -> Option<Range<usize>> {
    let start = html.find(OPEN)? + OPEN.len();
    let len = html[start..].find(CLOSE)?;
    Some(start..start + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_is_the_script_elements_text() {
        let page = r#"<p>x</p><script id="session-data" type="application/json">eyJhIjoxfQ==</script><script>go()</script>"#;
        let range = session_data(page).unwrap_or_default();
        assert_eq!(&page[range], "eyJhIjoxfQ==");
        assert_eq!(session_data("<p>no data</p>"), None);
        assert_eq!(session_data(&page[..60]), None, "unclosed");
    }
}
