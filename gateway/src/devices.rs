//! The gateway's devices and pairing tokens, kept in NATS key-value buckets so every replica
//! sees the same ones (docs/architecture.md, "Gateway"). Tokens are `gdt_<id>.<secret>` (device)
//! and `gpt_<id>.<secret>` (pairing); only the secret's SHA-256 is stored. A secret is 256
//! random bits, so a plain digest is as good as a keyed one here, and replicas share no key.

use async_nats::jetstream::{self, kv};
use dashmap::DashMap;
use racp_proto::methods::handshake::PairResult;
use racp_proto::{AppError, ErrorCode, Principal, Role};
use racp_server::token::split;
use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};

pub const DEVICES_BUCKET: &str = "racp_gw_devices";
pub const PAIRING_BUCKET: &str = "racp_gw_pairing";
const DEVICE_PREFIX: &str = "gdt_";
const PAIRING_PREFIX: &str = "gpt_";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    pub device_id: String,
    pub name: String,
    pub roles: Vec<Role>,
    /// SHA-256 of the token's secret, hex.
    pub tag: String,
    pub created_at: u64,
    /// Hosts the device may reach; `None`: every host.
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    #[serde(default)]
    pub revoked: bool,
}

impl DeviceRecord {
    pub fn may_reach(&self, host_id: &str) -> bool {
        self.hosts
            .as_ref()
            .is_none_or(|hosts| hosts.iter().any(|h| h == host_id))
    }

    /// Whether every host of `hosts` (`None`: all hosts) is within this device's reach. A
    /// device sees, revokes and pairs only devices within its own reach, so a device granted
    /// some hosts cannot widen its grant through a device it pairs, nor act on broader ones.
    pub fn covers(&self, hosts: Option<&[String]>) -> bool {
        match (&self.hosts, hosts) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(hosts)) => hosts.iter().all(|h| self.may_reach(h)),
        }
    }

    /// The hosts a pairing token minted by this device grants: what was asked, which must be
    /// within this device's reach; when nothing was asked, this device's own reach.
    pub fn grant(&self, asked: Option<Vec<String>>) -> Result<Option<Vec<String>>, AppError> {
        let Some(asked) = asked else {
            return Ok(self.hosts.clone());
        };
        match asked.iter().find(|h| !self.may_reach(h)) {
            None => Ok(Some(asked)),
            Some(beyond) => Err(AppError::new(
                ErrorCode::Forbidden,
                "a device can grant only hosts it may reach itself",
            )
            .with_details(json!({"hostId": beyond, "reason": "host_not_granted"}))),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PairingRecord {
    tag: String,
    roles: Vec<Role>,
    #[serde(default)]
    hosts: Option<Vec<String>>,
    expires_at: u64,
    used: bool,
}

/// Who opened a connection, as the gateway knows it: what the protocol's [`Principal`] says
/// ([`Caller::principal`]), plus the device's record (its hosts) or the pairing token's id.
/// pi-host's `Caller` is the same concept.
#[derive(Debug, Clone)]
pub enum Caller {
    Device(DeviceRecord),
    Pairing { token_id: String },
}

impl Caller {
    /// The caller as the protocol's access rules see it.
    pub fn principal(&self) -> Principal {
        match self {
            Caller::Device(device) => Principal::Device {
                device_id: device.device_id.clone(),
                roles: device.roles.clone(),
            },
            Caller::Pairing { .. } => Principal::Pairing,
        }
    }

    pub fn device_id(&self) -> Option<&str> {
        match self {
            Caller::Device(device) => Some(&device.device_id),
            Caller::Pairing { .. } => None,
        }
    }

    /// The paired device calling; UNAUTHORIZED for a pairing connection.
    pub fn device(&self) -> Result<DeviceRecord, AppError> {
        match self {
            Caller::Device(device) => Ok(device.clone()),
            Caller::Pairing { .. } => Err(AppError::new(
                ErrorCode::Unauthorized,
                "a pairing connection may only call hello and pair",
            )),
        }
    }
}

pub struct Minted {
    pub id: String,
    pub token: String,
    tag: String,
}

fn mint(prefix: &str) -> Result<Minted, AppError> {
    let rng = ring::rand::SystemRandom::new();
    let mut id = [0u8; 9];
    let mut secret = [0u8; 32];
    rng.fill(&mut id)
        .and_then(|()| rng.fill(&mut secret))
        .map_err(|_| AppError::new(ErrorCode::Internal, "the system random source failed"))?;
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (id, secret) = (b64.encode(id), b64.encode(secret));
    Ok(Minted {
        token: format!("{prefix}{id}.{secret}"),
        tag: digest(&secret),
        id,
    })
}

fn digest(secret: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares in time independent of where the strings differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn refused() -> AppError {
    AppError::new(
        ErrorCode::RemoteAuthFailed,
        "the token is not valid on this gateway: pair again",
    )
}

pub fn unavailable(err: impl std::fmt::Display) -> AppError {
    AppError::new(
        ErrorCode::HostUnavailable,
        "the gateway cannot reach its NATS servers; retry shortly",
    )
    .with_details(json!({"reason": "nats_unavailable", "cause": err.to_string()}))
    .with_retry_after_ms(1_000)
}

fn internal(err: impl std::fmt::Display) -> AppError {
    racp_server::failure::internal("gateway's device registry", err)
}

pub struct Devices {
    devices: kv::Store,
    pairings: kv::Store,
    /// Every device record, kept current by a watch on the bucket: each call checks it, so a
    /// revoke made on any replica stops the device's calls on every replica.
    cache: DashMap<String, DeviceRecord>,
    removed: dashmap::DashSet<String>,
    /// The newest revision of the devices bucket the cache reflects.
    applied: AtomicU64,
}

impl Devices {
    pub fn new(devices: kv::Store, pairings: kv::Store) -> Self {
        Devices {
            devices,
            pairings,
            cache: DashMap::new(),
            removed: dashmap::DashSet::new(),
            applied: AtomicU64::new(0),
        }
    }

    /// The devices bucket's changes, from each device's current record on.
    pub async fn watch(&self) -> Result<kv::Watch, AppError> {
        self.devices
            .watch_with_history(">")
            .await
            .map_err(unavailable)
    }

    /// Applies one change from the watch; returns the device's id when the change revokes (or
    /// removes) it. An entry that does not parse counts as a removal: fail closed.
    pub fn apply(&self, entry: &kv::Entry) -> Option<String> {
        let record = serde_json::from_slice::<DeviceRecord>(&entry.value).ok();
        let revoked = match record {
            Some(record) if entry.operation == kv::Operation::Put => {
                let revoked = record.revoked.then(|| record.device_id.clone());
                self.cache.insert(entry.key.clone(), record);
                revoked
            }
            _ => {
                self.cache.remove(&entry.key);
                self.removed.insert(entry.key.clone());
                Some(entry.key.clone())
            }
        };
        self.applied.fetch_max(entry.revision, Ordering::AcqRel);
        revoked
    }

    /// The newest revision of the bucket applied so far.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// The bucket's newest revision now, asked of the stream's leader (the store's own
    /// `status` would answer from what it read when opened).
    pub async fn last_revision(&self, js: &jetstream::Context) -> Result<u64, AppError> {
        let stream = js
            .get_stream(format!("KV_{DEVICES_BUCKET}"))
            .await
            .map_err(unavailable)?;
        Ok(stream.cached_info().state.last_sequence)
    }

    /// Whether the watch has seen the device revoked (or its record removed). A device paired
    /// a moment ago on another replica may not be in the cache yet: that is not a revocation.
    pub fn is_revoked(&self, device_id: &str) -> bool {
        self.cache.get(device_id).is_some_and(|r| r.revoked) || self.removed.contains(device_id)
    }

    /// Checks a bearer token against the buckets (not the cache: a device paired a moment ago
    /// on another replica gets in).
    pub async fn authenticate(&self, token: &str, now: u64) -> Result<Caller, AppError> {
        if let Some(presented) = split(token, DEVICE_PREFIX) {
            let value = self
                .devices
                .get(device_key(presented.id))
                .await
                .map_err(unavailable)?
                .ok_or_else(refused)?;
            let device: DeviceRecord = serde_json::from_slice(&value).map_err(internal)?;
            if device.revoked || !same(&digest(presented.secret), &device.tag) {
                return Err(refused());
            }
            return Ok(Caller::Device(device));
        }
        if let Some(presented) = split(token, PAIRING_PREFIX) {
            let value = self
                .pairings
                .get(presented.id)
                .await
                .map_err(unavailable)?
                .ok_or_else(refused)?;
            let pairing: PairingRecord = serde_json::from_slice(&value).map_err(internal)?;
            if !same(&digest(presented.secret), &pairing.tag) {
                return Err(refused());
            }
            if pairing.used {
                return Err(AppError::new(
                    ErrorCode::PairingFailed,
                    "this pairing token was already used: mint a new one",
                ));
            }
            if pairing.expires_at <= now {
                return Err(AppError::new(
                    ErrorCode::PairingTokenExpired,
                    "this pairing token has expired: mint a new one",
                )
                .with_details(json!({"expiredAt": pairing.expires_at})));
            }
            return Ok(Caller::Pairing {
                token_id: presented.id.to_string(),
            });
        }
        Err(refused())
    }

    /// Mints a pairing token; the token is returned once and only its digest is kept.
    pub async fn mint_pairing(
        &self,
        roles: Vec<Role>,
        hosts: Option<Vec<String>>,
        expires_at: u64,
    ) -> Result<Minted, AppError> {
        let minted = mint(PAIRING_PREFIX)?;
        let record = PairingRecord {
            tag: minted.tag.clone(),
            roles,
            hosts,
            expires_at,
            used: false,
        };
        self.pairings
            .create(&minted.id, encode(&record)?)
            .await
            .map_err(unavailable)?;
        Ok(minted)
    }

    /// Trades a pairing token for a device credential, once: the token is marked used with a
    /// compare-and-set on its revision, so two replicas cannot both pair with it.
    pub async fn pair(
        &self,
        token_id: &str,
        name: String,
        now: u64,
    ) -> Result<PairResult, AppError> {
        let entry = self
            .pairings
            .entry(token_id)
            .await
            .map_err(unavailable)?
            .ok_or_else(refused)?;
        let mut pairing: PairingRecord = serde_json::from_slice(&entry.value).map_err(internal)?;
        if pairing.used || pairing.expires_at <= now {
            return Err(AppError::new(
                ErrorCode::PairingFailed,
                "this pairing token was already used or has expired: mint a new one",
            ));
        }
        pairing.used = true;
        self.pairings
            .update(token_id, encode(&pairing)?, entry.revision)
            .await
            .map_err(|_| {
                AppError::new(
                    ErrorCode::PairingFailed,
                    "this pairing token was already used: mint a new one",
                )
            })?;
        let minted = mint(DEVICE_PREFIX)?;
        let device = DeviceRecord {
            device_id: device_key(&minted.id),
            name,
            roles: pairing.roles,
            tag: minted.tag,
            created_at: now,
            hosts: pairing.hosts,
            revoked: false,
        };
        self.devices
            .create(&device.device_id, encode(&device)?)
            .await
            .map_err(unavailable)?;
        tracing::info!(device_id = %device.device_id, "device paired with the gateway");
        Ok(PairResult {
            device_token: minted.token,
            device_id: device.device_id,
            roles: device.roles,
        })
    }

    /// The devices `viewer` may see: not revoked, and within its reach.
    pub fn list(&self, viewer: &DeviceRecord) -> Vec<DeviceRecord> {
        let mut devices: Vec<_> = self
            .cache
            .iter()
            .map(|r| r.value().clone())
            .filter(|r| !r.revoked && viewer.covers(r.hosts.as_deref()))
            .collect();
        devices.sort_by(|a, b| (a.created_at, &a.device_id).cmp(&(b.created_at, &b.device_id)));
        devices
    }

    /// Marks a device revoked and returns the bucket's revision that says so. The write is a
    /// compare-and-set, retried when another write to the record came in between.
    pub async fn revoke(&self, device_id: &str, by: &DeviceRecord) -> Result<u64, AppError> {
        let not_found = || {
            AppError::new(ErrorCode::NotFound, "no such device")
                .with_details(json!({"deviceId": device_id}))
        };
        // Ids are made of one alphabet; any other names no device (and is no key to look up).
        if !racp_proto::gateway::is_subject_token(device_id) {
            return Err(not_found());
        }
        let mut attempts = 0;
        loop {
            let entry = self
                .devices
                .entry(device_id)
                .await
                .map_err(unavailable)?
                .ok_or_else(not_found)?;
            if entry.operation != kv::Operation::Put {
                return Err(not_found());
            }
            let mut device: DeviceRecord =
                serde_json::from_slice(&entry.value).map_err(internal)?;
            // A device beyond the revoker's reach is one it cannot see.
            if !by.covers(device.hosts.as_deref()) {
                return Err(not_found());
            }
            device.revoked = true;
            match self
                .devices
                .update(device_id, encode(&device)?, entry.revision)
                .await
            {
                Ok(revision) => return Ok(revision),
                Err(err) if attempts < 3 => {
                    tracing::debug!(error = %err, device_id, "revoke raced another write; again");
                    attempts += 1;
                }
                Err(err) => return Err(unavailable(err)),
            }
        }
    }
}

/// A device's id (its record's key) from its token's id part.
fn device_key(token_id: &str) -> String {
    format!("dev_{token_id}")
}

fn encode<T: Serialize>(value: &T) -> Result<bytes::Bytes, AppError> {
    serde_json::to_vec(value).map(Into::into).map_err(internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(hosts: Option<&[&str]>) -> DeviceRecord {
        DeviceRecord {
            device_id: "dev_x".into(),
            name: "x".into(),
            roles: vec![Role::Owner],
            tag: String::new(),
            created_at: 0,
            hosts: hosts.map(|h| h.iter().map(|s| s.to_string()).collect()),
            revoked: false,
        }
    }

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_device_covers_only_what_it_reaches() {
        let everywhere = device(None);
        let only_a = device(Some(&["a"]));
        assert!(everywhere.covers(None));
        assert!(everywhere.covers(Some(&hosts(&["a", "b"]))));
        assert!(!only_a.covers(None));
        assert!(only_a.covers(Some(&hosts(&["a"]))));
        assert!(only_a.covers(Some(&[])));
        assert!(!only_a.covers(Some(&hosts(&["a", "b"]))));
    }

    #[test]
    fn a_grant_is_at_most_the_granters_reach() {
        let only_a = device(Some(&["a"]));
        assert_eq!(only_a.grant(None).ok(), Some(Some(hosts(&["a"]))));
        assert_eq!(
            only_a.grant(Some(hosts(&["a"]))).ok(),
            Some(Some(hosts(&["a"])))
        );
        let refused = only_a.grant(Some(hosts(&["a", "b"]))).err();
        assert_eq!(refused.map(|e| e.code()), Some(ErrorCode::Forbidden));
        assert_eq!(device(None).grant(None).ok(), Some(None));
    }
}
