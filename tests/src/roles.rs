//! Who may call each method, written out by hand from docs/protocol.md's method list rather than
//! read from the method table, so a wrong row in the table fails the role tests of a host
//! (pi-host/tests/limits_and_roles.rs) and of a gateway (tests/tests/gateway_roles.rs).

use racp_proto::{Method, Role};
use serde_json::{Value, json};

/// The lowest role that may call each method; `None`: no device may, only a pairing connection.
pub const LOWEST_ROLE: &[(&str, Option<Role>)] = &[
    ("pair", None),
    ("host/info", Some(Role::Observer)),
    ("host/list", Some(Role::Observer)),
    ("device/list", Some(Role::Owner)),
    ("device/revoke", Some(Role::Owner)),
    ("pairing/create", Some(Role::Owner)),
    ("fs/list", Some(Role::Observer)),
    ("fs/stat", Some(Role::Observer)),
    ("fs/read", Some(Role::Operator)),
    ("workspace/status", Some(Role::Observer)),
    ("workspace/diff", Some(Role::Operator)),
    ("session/create", Some(Role::Operator)),
    ("session/list", Some(Role::Observer)),
    ("session/get", Some(Role::Observer)),
    ("session/stream", Some(Role::Observer)),
    ("session/history", Some(Role::Observer)),
    ("session/rename", Some(Role::Operator)),
    ("session/subscribe", Some(Role::Observer)),
    ("session/unsubscribe", Some(Role::Observer)),
    ("session/close", Some(Role::Operator)),
    ("turn/start", Some(Role::Operator)),
    ("turn/steer", Some(Role::Operator)),
    ("turn/follow_up", Some(Role::Operator)),
    ("turn/abort", Some(Role::Operator)),
    ("approval/respond", Some(Role::Operator)),
    ("model/list", Some(Role::Observer)),
    ("session/configure", Some(Role::Operator)),
    ("session/compact", Some(Role::Operator)),
    ("session/clear_queue", Some(Role::Operator)),
    ("session/fork", Some(Role::Operator)),
    ("session/clone", Some(Role::Operator)),
    ("credential/set", Some(Role::Owner)),
    ("credential/delete", Some(Role::Owner)),
    ("credential/list", Some(Role::Owner)),
    ("provider/set", Some(Role::Owner)),
    ("provider/delete", Some(Role::Owner)),
    ("session/bash", Some(Role::Operator)),
    ("session/bash_abort", Some(Role::Operator)),
    ("session/stats", Some(Role::Observer)),
    ("session/commands", Some(Role::Observer)),
    ("session/export", Some(Role::Observer)),
];

/// Fails unless every method of the table but `hello` has a row, and every row is a method.
pub fn assert_every_method_listed() {
    let listed: Vec<&str> = LOWEST_ROLE.iter().map(|(name, _)| *name).collect();
    for method in Method::ALL {
        assert!(
            *method == Method::Hello || listed.contains(&method.as_str()),
            "{} has no row in LOWEST_ROLE: write who may call it",
            method.as_str()
        );
    }
    for name in &listed {
        assert!(Method::from_name(name).is_some(), "{name} is not a method");
    }
}

/// Calls every method as a device of `role` (with empty params: access is checked before
/// them) and fails where FORBIDDEN is not answered exactly where the role is too low.
pub async fn assert_forbidden_below_the_lowest_role(client: &mut crate::Client, role: Role) {
    for (method, lowest) in LOWEST_ROLE {
        let reply: Value = client.call(method, json!({})).await;
        let forbidden = reply["error"]["code"] == "FORBIDDEN";
        let expected = lowest.is_none_or(|lowest| role < lowest);
        assert_eq!(
            forbidden,
            expected,
            "{method} as {}: {reply}",
            role.as_str()
        );
    }
}

/// A pairing connection may only pair: every other call is UNAUTHORIZED (it has no device yet).
pub async fn assert_a_pairing_connection_only_pairs(pairing: &mut crate::Client) {
    for (method, lowest) in LOWEST_ROLE {
        if lowest.is_some() {
            let reply = pairing.call(method, json!({})).await;
            assert_eq!(reply["error"]["code"], "UNAUTHORIZED", "{method}: {reply}");
        }
    }
}
