// Pairing a new device (docs/protocol.md §5.3): connect with the pairing token, `pair`, and
// keep the device token with the endpoint and the pinned certificate fingerprint.

import type { Role } from "../racp.js";
import { RacpClient, type ClientOptions } from "./client.js";
import { parsePairingLink, type Endpoint, type PairingLinkOptions } from "./pairing.js";

export interface PairOptions extends PairingLinkOptions, Omit<ClientOptions, "url" | "token" | "certSha256"> {
  /** How the device is listed on the host (1–200 characters). */
  deviceName: string;
}

/** A paired device's credential: store it secretly (OS keychain, or a file only the user reads). */
export interface PairedDevice extends Endpoint {
  deviceId: string;
  roles: Role[];
}

/**
 * Pairs with a host from a pairing link (`racps://HOST:PORT/pair?cert=sha256:HEX#TOKEN`) or a
 * bare token (with `host` and `certSha256`). The result connects with `RacpClient.connect`.
 */
export async function pair(link: string, options: PairOptions): Promise<PairedDevice> {
  const endpoint = parsePairingLink(link, options);
  const { deviceName, host: _host, ...clientOptions } = options;
  const client = await RacpClient.connect({ ...clientOptions, ...endpoint });
  try {
    const paired = await client.call("pair", { deviceName });
    const device: PairedDevice = {
      url: endpoint.url,
      token: paired.deviceToken,
      deviceId: paired.deviceId,
      roles: paired.roles,
    };
    if (endpoint.certSha256 !== undefined) device.certSha256 = endpoint.certSha256;
    // The opt-in travels with the device it was given for.
    if (endpoint.url.startsWith("ws://")) device.allowPlainWs = true;
    return device;
  } finally {
    client.close();
  }
}
