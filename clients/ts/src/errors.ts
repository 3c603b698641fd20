// Errors as the registry defines them (docs/error-codes.md, docs/protocol.md §3.2): one class,
// switched on by `code`, carrying what a UI needs to decide whether to retry or resend.

import {
  ERROR_CODES,
  METHODS,
  type AppError,
  type ErrorCode,
  type ErrorSource,
  type RacpMethodName,
  type Recovery,
} from "../racp.js";

/** Codes that refuse a call before it starts: any call may be sent again after the wait (§6.3). */
const REFUSED_BEFORE_START: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  "HOST_SHUTTING_DOWN",
  "HOST_OVERLOADED",
  "RATE_LIMITED",
]);

/** Codes meaning "this credential or client will never work here": stop reconnecting (§9.3). */
const FATAL: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  "REMOTE_AUTH_FAILED",
  "PAIRING_FAILED",
  "PAIRING_TOKEN_EXPIRED",
  "PROTOCOL_MISMATCH",
  "FORBIDDEN",
  "HOST_IDENTITY_MISMATCH",
]);

export function isKnownCode(code: unknown): code is ErrorCode {
  return typeof code === "string" && Object.hasOwn(ERROR_CODES, code);
}

/** Whether a connection that failed with this code must not be retried. */
export function isFatal(code: ErrorCode): boolean {
  return FATAL.has(code);
}

export interface RacpErrorInit {
  code: ErrorCode;
  message: string;
  /** Defaults to the registry row; a `maybe` row defaults to true. */
  retriable?: boolean;
  recovery?: Recovery;
  source?: ErrorSource;
  details?: unknown;
  causeCode?: string;
  traceId?: string;
  retryAfterMs?: number;
  /** The method whose call failed, when it was a call. */
  method?: RacpMethodName;
}

/** A failure with a registered code. UI code switches on `code`. */
export class RacpError extends Error {
  readonly code: ErrorCode;
  readonly retriable: boolean;
  readonly recovery: Recovery;
  readonly source: ErrorSource;
  readonly details?: unknown;
  readonly causeCode?: string;
  readonly traceId?: string;
  readonly retryAfterMs?: number;
  readonly method?: RacpMethodName;

  constructor(init: RacpErrorInit) {
    super(init.message);
    this.name = "RacpError";
    const row = ERROR_CODES[init.code];
    this.code = init.code;
    this.retriable = init.retriable ?? row.retriable !== "no";
    this.recovery = init.recovery ?? row.recovery;
    this.source = init.source ?? "client";
    if (init.details !== undefined) this.details = init.details;
    if (init.causeCode !== undefined) this.causeCode = init.causeCode;
    if (init.traceId !== undefined) this.traceId = init.traceId;
    if (init.retryAfterMs !== undefined) this.retryAfterMs = init.retryAfterMs;
    if (init.method !== undefined) this.method = init.method;
  }

  /** Whether the failed method may be sent a second time without doing something twice. */
  get safeToResend(): boolean {
    return this.method !== undefined && METHODS[this.method].safeToResend;
  }

  /** Retriable and safe to resend, or refused before it started: sending it again is fine. */
  get mayResend(): boolean {
    if (REFUSED_BEFORE_START.has(this.code)) return true;
    return this.retriable && this.safeToResend;
  }

  /** The same error, attributed to a call of `method`. */
  forMethod(method: RacpMethodName): RacpError {
    return new RacpError({ ...this.toInit(), method });
  }

  toJSON(): AppError {
    const out: AppError = {
      code: this.code,
      message: this.message,
      retriable: this.retriable,
      recovery: this.recovery,
      source: this.source,
    };
    if (this.details !== undefined) out.details = this.details;
    if (this.causeCode !== undefined) out.causeCode = this.causeCode;
    if (this.traceId !== undefined) out.traceId = this.traceId;
    if (this.retryAfterMs !== undefined) out.retryAfterMs = this.retryAfterMs;
    return out;
  }

  private toInit(): RacpErrorInit {
    return { ...this.toJSON(), ...(this.method ? { method: this.method } : {}) } as RacpErrorInit;
  }

  /**
   * Reads an error object off the wire. A code this client version does not know becomes
   * INTERNAL with the original in `causeCode`; its `retriable` and `recovery` are kept, since
   * they are what a client acts on for a code it does not know (§14).
   */
  static fromWire(value: unknown, method?: RacpMethodName): RacpError {
    const wire = (typeof value === "object" && value !== null ? value : {}) as Record<string, unknown>;
    const text = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
    const known = isKnownCode(wire.code);
    const init: RacpErrorInit = {
      code: known ? (wire.code as ErrorCode) : "INTERNAL",
      message: text(wire.message) ?? "the host sent an error without a message",
      source: (text(wire.source) as ErrorSource | undefined) ?? "host",
    };
    if (typeof wire.retriable === "boolean") init.retriable = wire.retriable;
    const recovery = text(wire.recovery);
    if (recovery !== undefined) init.recovery = recovery as Recovery;
    if (wire.details !== undefined && wire.details !== null) init.details = wire.details;
    const causeCode = known ? text(wire.causeCode) : (text(wire.code) ?? "missing");
    if (causeCode !== undefined) init.causeCode = causeCode;
    const traceId = text(wire.traceId);
    if (traceId !== undefined) init.traceId = traceId;
    if (typeof wire.retryAfterMs === "number") init.retryAfterMs = wire.retryAfterMs;
    if (method !== undefined) init.method = method;
    return new RacpError(init);
  }
}

/** The link to the host dropped; the client reconnects (§9.3). */
export function hostDisconnected(reason: string, method?: RacpMethodName): RacpError {
  return new RacpError({
    code: "HOST_DISCONNECTED",
    message: `the connection to the host dropped (${reason}); the client is reconnecting`,
    ...(method ? { method } : {}),
  });
}

/** The code whose close code this is, for a 4xxx close without its connection error (§13). */
export function codeForCloseCode(closeCode: number): ErrorCode | undefined {
  for (const [code, row] of Object.entries(ERROR_CODES)) {
    if (row.closeCode === closeCode) return code as ErrorCode;
  }
  return undefined;
}
