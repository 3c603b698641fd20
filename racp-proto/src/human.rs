//! What a person reads on a terminal, for every command line here (pi-host, pi-gateway,
//! pi-remote): moments as "in 10 min (16:40 UTC)" or "3 h ago (2026-12-01 13:02 UTC)", never
//! epoch milliseconds; role lists as words.

/// A moment relative to `now_ms`, with its UTC time (and date when it is not today's).
pub fn moment(at_ms: u64, now_ms: u64) -> String {
    let relative = if at_ms >= now_ms {
        format!("in {}", span(at_ms - now_ms))
    } else {
        format!("{} ago", span(now_ms - at_ms))
    };
    let (date, time) = utc(at_ms);
    if utc(now_ms).0 == date {
        format!("{relative} ({time} UTC)")
    } else {
        format!("{relative} ({date} {time} UTC)")
    }
}

/// A duration rounded to the nearest of its largest unit: "40 s", "10 min", "3 h", "2 days"
/// (a token minted for 10 minutes reads "in 10 min" a moment later, not "in 9 min").
fn span(ms: u64) -> String {
    let s = (ms + 500) / 1000;
    let nearest = |unit: u64| (s + unit / 2) / unit;
    match s {
        0..60 => format!("{s} s"),
        60..3570 => format!("{} min", nearest(60)),
        3570..84_600 => format!("{} h", nearest(3600)),
        _ => match nearest(86_400) {
            1 => "1 day".into(),
            days => format!("{days} days"),
        },
    }
}

/// How long ago something was last seen, in whole units: `now`, `42 s ago`, `3 min ago`,
/// `5 h ago`, `2 days ago`. Rounded down, unlike [`moment`]'s span: "last seen 59 min ago"
/// must not claim an hour it was not yet.
pub fn ago(seconds: u64) -> String {
    match seconds {
        0..5 => "now".into(),
        5..60 => format!("{seconds} s ago"),
        60..3600 => format!("{} min ago", seconds / 60),
        3600..86_400 => format!("{} h ago", seconds / 3600),
        86_400..172_800 => "1 day ago".into(),
        _ => format!("{} days ago", seconds / 86_400),
    }
}

/// The UTC date (`2026-12-02`) and time of day (`16:40`) of a moment.
fn utc(ms: u64) -> (String, String) {
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(t) => (
            format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day()),
            format!("{:02}:{:02}", t.hour(), t.minute()),
        ),
        Err(_) => ("?".into(), "?".into()),
    }
}

/// A JSON list of role names as words: `owner, operator`.
pub fn roles(roles: &serde_json::Value) -> String {
    let words: Vec<&str> = roles
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str())
        .collect();
    if words.is_empty() {
        "none".into()
    } else {
        words.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_at_their_bounds() {
        assert_eq!(ago(4), "now");
        assert_eq!(ago(5), "5 s ago");
        assert_eq!(ago(59), "59 s ago");
        assert_eq!(ago(60), "1 min ago");
        assert_eq!(ago(3599), "59 min ago");
        assert_eq!(ago(3600), "1 h ago");
        assert_eq!(ago(86_399), "23 h ago");
        assert_eq!(ago(86_400), "1 day ago");
        assert_eq!(ago(172_800), "2 days ago");
    }

    const NOW: u64 = 1_796_169_600_000; // 2026-12-02 00:00 UTC

    #[test]
    fn moments_read_as_people_say_them() {
        assert_eq!(
            moment(NOW + 10 * 60_000 - 150, NOW),
            "in 10 min (00:09 UTC)"
        );
        assert_eq!(moment(NOW + 40_000, NOW), "in 40 s (00:00 UTC)");
        assert_eq!(
            moment(NOW - 3 * 3_600_000, NOW),
            "3 h ago (2026-12-01 21:00 UTC)"
        );
        assert_eq!(
            moment(NOW - 2 * 86_400_000, NOW),
            "2 days ago (2026-11-30 00:00 UTC)"
        );
    }

    #[test]
    fn a_moment_today_names_only_its_time() {
        let now = 1_796_229_000_000; // 2026-12-02 16:30:00 UTC
        assert_eq!(moment(now + 600_000, now), "in 10 min (16:40 UTC)");
        assert_eq!(moment(now - 180_000, now), "3 min ago (16:27 UTC)");
        assert_eq!(
            moment(now - 2 * 86_400_000, now),
            "2 days ago (2026-11-30 16:30 UTC)"
        );
    }

    #[test]
    fn roles_are_words() {
        assert_eq!(
            roles(&serde_json::json!(["owner", "operator"])),
            "owner, operator"
        );
        assert_eq!(roles(&serde_json::json!([])), "none");
    }
}
