// racp-client: a reconnecting RACP-WS client for pi-host (docs/protocol.md).

export * from "../racp.js";
export { Backoff } from "./backoff.js";
export { RacpClient, CLIENT_VERSION, type ClientOptions, type ClientState, type SubscribeOptions } from "./client.js";
export type { CallOptions } from "./connection.js";
export { RacpError, isFatal, isKnownCode, type RacpErrorInit } from "./errors.js";
export { isHistoryEntry, messageOf, messagesOf, type HistoryOptions, type HistoryPagesOptions, type PiMessage } from "./history.js";
export { pair, type PairOptions, type PairedDevice } from "./pair.js";
export { checkUrl, parsePairingLink, type Endpoint, type PairingLinkOptions } from "./pairing.js";
export { StreamState, singleText, skipLines, type JsonObject, type JsonValue } from "./stream.js";
export { Subscription, eventData, type SubscriptionItem } from "./subscription.js";
export { webSocketTransport, type LinkRequest, type LinkSocket, type Transport, type WebSocketConstructor } from "./transport.js";
