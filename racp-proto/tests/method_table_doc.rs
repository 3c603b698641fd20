//! docs/protocol.md §6.2 says what the method table says: every method once, in table order,
//! with who serves it, its access, whether it mutates and whether it is safe to resend.

use racp_proto::{Method, Place};

fn place(place: Place) -> &'static str {
    match place {
        Place::Core => "core",
        Place::Subscription => "connection",
        Place::Endpoint => "endpoint",
        Place::Host => "host",
    }
}

fn yes_no(yes: bool) -> &'static str {
    if yes { "yes" } else { "no" }
}

#[test]
fn the_documented_method_table_is_the_method_table() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md"))
        .expect("docs/protocol.md");
    let section = doc
        .split("### 6.2 Method table")
        .nth(1)
        .expect("§6.2 is in docs/protocol.md");
    let rows: Vec<Vec<String>> = section
        .lines()
        .skip_while(|line| !line.starts_with("| method |"))
        .skip(2)
        .take_while(|line| line.starts_with("| `"))
        .map(|line| {
            line.split('|')
                .skip(1)
                .take(5)
                .map(|cell| cell.trim().trim_matches('`').replace("**", ""))
                .collect()
        })
        .collect();
    let expected: Vec<Vec<String>> = Method::ALL
        .iter()
        .map(|method| {
            let spec = method.spec();
            vec![
                spec.name.to_string(),
                place(spec.place).to_string(),
                spec.access.as_str().to_string(),
                yes_no(spec.mutates).to_string(),
                yes_no(spec.safe_to_resend).to_string(),
            ]
        })
        .collect();
    assert_eq!(rows, expected);
}
