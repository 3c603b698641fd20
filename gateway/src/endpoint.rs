//! The endpoint's calls the gateway answers itself, as a host's `handlers::endpoint` does:
//! `pair`, `host/list`, `device/list`, `device/revoke`, `pairing/create`.

use crate::devices::{Caller, DeviceRecord};
use crate::hosts;
use crate::revocation;
use crate::state::Gateway;
use racp_proto::methods::host::{
    DeviceInfo, DeviceListResult, PairingCreateParams, PairingCreateResult,
};
use racp_proto::{AppError, EndpointCall};
use racp_server::connection::Answer;
use racp_server::identity::pairing_link;
use racp_server::wire::to_raw;
use std::sync::Arc;

/// One exhaustive match over the method table's `EndpointCall`. `reached_as` is the address
/// the desktop reached the gateway at (its Host header), for a pairing link.
pub fn answer(
    gateway: Arc<Gateway>,
    caller: Caller,
    reached_as: String,
    call: EndpointCall,
) -> Answer {
    let device = caller.device();
    Box::pin(async move {
        let now = racp_server::clock::now_ms();
        match call {
            EndpointCall::Pair(params) => {
                let Caller::Pairing { token_id } = caller else {
                    return Err(hosts::internal(&"pair without a pairing token"));
                };
                let paired = gateway.devices.pair(&token_id, params.device_name, now);
                to_raw(&paired.await?)
            }
            EndpointCall::HostList(_) => {
                to_raw(&hosts::list(&gateway.js, &gateway.hosts, &device?, now).await?)
            }
            EndpointCall::DeviceList(_) => to_raw(&device_list(&gateway, &device?)),
            EndpointCall::DeviceRevoke(params) => {
                revocation::revoke(&gateway, &params.device_id, &device?).await?;
                to_raw(&racp_proto::Ack {})
            }
            EndpointCall::PairingCreate(params) => {
                let device = device?;
                let created = pairing_create(&gateway, &device, &reached_as, params, now);
                to_raw(&created.await?)
            }
        }
    })
}

/// The devices `viewer` may see, as this replica's watch of the devices bucket has them.
fn device_list(gateway: &Gateway, viewer: &DeviceRecord) -> DeviceListResult {
    DeviceListResult {
        devices: gateway
            .devices
            .list(viewer)
            .into_iter()
            .map(|d| DeviceInfo {
                current: d.device_id == viewer.device_id,
                device_id: d.device_id,
                name: d.name,
                roles: d.roles,
                created_at: d.created_at,
                last_seen_at: None,
            })
            .collect(),
    }
}

/// A pairing token minted by `device`, granting at most the hosts it may reach, and its link
/// at the address the desktop reached the gateway at.
async fn pairing_create(
    gateway: &Gateway,
    device: &DeviceRecord,
    reached_as: &str,
    params: PairingCreateParams,
    now: u64,
) -> Result<PairingCreateResult, AppError> {
    let ttl = params
        .ttl_seconds
        .unwrap_or(racp_proto::limits::DEFAULT_PAIRING_TTL_SECONDS);
    let expires_at = now + ttl * 1000;
    let hosts = device.grant(params.hosts)?;
    let minted = gateway
        .devices
        .mint_pairing(params.roles.clone(), hosts, expires_at)
        .await?;
    let settings = &gateway.settings;
    let cert = settings.cert_sha256.as_ref();
    let url = pairing_link(reached_as, cert, cert.is_some(), &minted.token);
    Ok(PairingCreateResult {
        url,
        token: minted.token,
        expires_at,
        roles: params.roles,
        cert_sha256: settings.cert_sha256.map(|s| s.to_hex()),
    })
}
