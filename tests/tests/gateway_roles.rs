//! The role matrix through a gateway: for a device of each role on a host's URL, every method is
//! FORBIDDEN exactly where a host forbids it (tests/src/roles.rs), whether the gateway answers it
//! itself or routes it to the host; a pairing connection may only pair.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::Role;
use serde_json::json;
use tests::gateway::{Fleet, until_online};
use tests::{Client, roles};

#[tokio::test]
async fn every_method_against_every_role_is_forbidden_where_a_host_forbids_it() {
    roles::assert_every_method_listed();
    let mut fleet = Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet.gateway().await;
    let (_host, host_id) = fleet.host(&[]).await;
    // The first device is the owner; then one device per role.
    let mut devices = Vec::new();
    for role in [Role::Owner, Role::Operator, Role::Observer] {
        let (_, token) = gateway.pair_device(role.as_str(), &[]).await;
        devices.push((role, token));
    }
    for (role, token) in &devices {
        let mut client = Client::connect(&gateway.host_url(&host_id), token)
            .await
            .unwrap();
        client.hello().await;
        until_online(&mut client, &host_id).await;
        roles::assert_forbidden_below_the_lowest_role(&mut client, *role).await;
    }

    let (ok, out, err) = gateway
        .cli(&["pair", "--json", "--roles", "observer"])
        .await;
    assert!(ok, "{err}");
    let minted: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let mut pairing = Client::connect(&gateway.url(), minted["token"].as_str().unwrap())
        .await
        .unwrap();
    pairing.hello().await;
    roles::assert_a_pairing_connection_only_pairs(&mut pairing).await;
    let paired = pairing.call("pair", json!({"deviceName": "late"})).await;
    assert_eq!(paired["result"]["roles"], json!(["observer"]), "{paired}");
}
