//! docs/error-codes.md, rendered from the registry.

use crate::error::{ErrorCode, Recovery, Retriable};
use std::fmt::Write;

pub fn render_error_codes_md() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!-- Generated from racp-proto/src/error/registry.rs by `{}`. Do not edit: a test fails when this file is stale. -->\n",
        super::REGENERATE
    );
    out.push_str(
        "# RACP-WS error codes\n\n\
         Every failure pi-host, the RACP client or the SSH bootstrapper reports carries one of these codes \
         in the `AppError` object (`code`, `message`, `retriable`, `recovery`, `details`, `source`, \
         `causeCode`, `traceId`, `retryAfterMs`). Codes are added, never removed or repurposed, so a client \
         may switch on the string.\n\n\
         - **retriable** says whether the failure is transient. `maybe` means the error's own `retriable` \
         flag decides for that occurrence.\n\
         - Retriable is not *safe to resend*: a client may send a call again only if the method is safe to \
         resend (reads, idempotent mutations, and `turn/start` with the same `idempotencyKey`; see the \
         method table in [protocol.md](protocol.md)).\n\
         - **close** is the WebSocket close code used when the error ends a connection; **HTTP** is the \
         status used when it refuses a WebSocket upgrade (the body is the error envelope `{\"error\": ...}`).\n\
         - Codes marked *(reserved)* are documented ahead of emission: nothing emits them yet, and their \
         meaning names the code used today.\n\n",
    );
    out.push_str("| code | retriable | recovery | close | HTTP | meaning |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for code in ErrorCode::ALL {
        let spec = code.spec();
        let retriable = match spec.retriable {
            Retriable::Yes => "yes",
            Retriable::No => "no",
            Retriable::Maybe => "maybe",
        };
        let _ = writeln!(
            out,
            "| `{}`{} | {} | `{}` | {} | {} | {} |",
            spec.name,
            if spec.reserved { " *(reserved)*" } else { "" },
            retriable,
            spec.recovery.as_str(),
            spec.close_code,
            spec.http_status,
            spec.meaning().replace('|', "\\|")
        );
    }
    out.push_str("\n## Recovery hints\n\n| recovery | what the client does |\n|---|---|\n");
    for recovery in Recovery::ALL {
        let _ = writeln!(out, "| `{}` | {} |", recovery.as_str(), recovery.advice());
    }
    out
}
