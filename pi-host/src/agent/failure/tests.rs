//! One row per rule of docs/protocol.md §8.7, with the messages pi 0.73 really produces: pi-ai
//! stores the provider SDK's `error.message`, which the OpenAI and Anthropic SDKs format as
//! `"<status> <provider message>"` (or `"<status> status code (no body)"`); transport failures
//! arrive as undici's / the SDK's text ("terminated", "Connection error.", "fetch failed").

use super::*;
use racp_proto::Recovery;

fn failed(message: &str) -> RunEnd {
    RunEnd {
        stop_reason: StopReason::Error,
        error_message: Some(message.to_string()),
        provider: Some("openai".into()),
        model: Some("gpt-4o".into()),
        empty: false,
    }
}

fn error_of(verdict: &Verdict) -> &AppError {
    match verdict {
        Verdict::Aborted(e) | Verdict::Failed(e) | Verdict::FailedUnlessRetried(e) => e,
        Verdict::Completed => panic!("completed"),
    }
}

/// pi's errorMessage, code, retriable, pi may retry it, providerStatus, providerCode/networkCode.
type Row = (
    &'static str,
    ErrorCode,
    bool,
    bool,
    Option<u16>,
    Option<&'static str>,
);

#[test]
fn one_row_per_rule() {
    use ErrorCode::*;
    #[rustfmt::skip]
    let rows: &[Row] = &[
        // A cut stream: undici's exact "terminated", and the other premature-close wordings.
        ("terminated", StreamFailed, true, true, None, None),
        ("Premature close", StreamFailed, true, false, None, None),
        ("stream aborted", StreamFailed, true, false, None, None),
        ("request ended without sending any chunks", StreamFailed, true, true, None, None),
        // The fixed abort phrases only.
        ("Request aborted", TurnAborted, false, false, None, None),
        ("The operation was aborted.", TurnAborted, false, false, None, None),
        ("Turn aborted", TurnAborted, false, false, None, None),
        ("Request was aborted", TurnAborted, false, false, None, None),
        // Connection-abort wording is a network failure, not an abort.
        ("write ECONNABORTED: software caused connection abort", NetworkError, true, false, None, Some("ECONNABORTED")),
        ("software caused connection abort", NetworkError, true, false, None, None),
        ("Connection error.", NetworkError, true, true, None, None),
        ("fetch failed", NetworkError, true, true, None, None),
        ("getaddrinfo ENOTFOUND api.openai.com", NetworkError, true, false, None, Some("ENOTFOUND")),
        ("read ECONNRESET", NetworkError, true, false, None, Some("ECONNRESET")),
        ("request to https://x failed, reason: unable to verify the first certificate UNABLE_TO_VERIFY_LEAF_SIGNATURE", NetworkError, false, false, None, Some("UNABLE_TO_VERIFY_LEAF_SIGNATURE")),
        // Billing exhaustion is terminal, even as a 429.
        ("429 You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.", ProviderError, false, true, Some(429), None),
        (r#"429 {"error":{"message":"insufficient quota","type":"insufficient_quota","code":"insufficient_quota"}}"#, ProviderError, false, true, Some(429), Some("insufficient_quota")),
        (r#"400 {"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#, ProviderError, false, false, Some(400), Some("invalid_request_error")),
        ("403 credit_balance_exhausted", ProviderError, false, false, Some(403), None),
        ("429 Your organization has reached its monthly spend limit", ProviderError, false, true, Some(429), None),
        // Throughput limits.
        ("429 Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 1200. Please try again in 2.4s.", ProviderRateLimited, true, true, Some(429), None),
        ("429 status code (no body)", ProviderRateLimited, true, true, Some(429), None),
        ("Throttling error: Too many tokens, please wait before trying again.", ProviderRateLimited, true, false, None, None),
        // Malformed requests are terminal.
        ("400 Invalid value for 'tool_choice'", ProviderError, false, false, Some(400), None),
        ("422 Unprocessable Entity", ProviderError, false, false, Some(422), None),
        // Gateway failures are transient.
        ("500 Internal server error", ProviderError, true, true, Some(500), None),
        ("502 Bad Gateway", ProviderError, true, true, Some(502), None),
        ("503 status code (no body)", ProviderError, true, true, Some(503), None),
        (r#"529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#, ProviderError, true, true, Some(529), Some("overloaded_error")),
        // Credentials.
        ("401 Incorrect API key provided: sk-abc12*****. You can find your API key at https://platform.openai.com/account/api-keys.", ProviderUnauthorized, false, false, Some(401), None),
        ("403 Forbidden", ProviderUnauthorized, false, false, Some(403), None),
        ("No API key found for openai.", ProviderUnauthorized, false, false, None, None),
        // Unknown model.
        ("404 The model `gpt-9` does not exist or you do not have access to it.", ModelNotConfigured, false, false, Some(404), None),
        ("404 status code (no body)", ModelNotConfigured, false, false, Some(404), None),
        // Context overflow: 413, and every wording pi-ai's isContextOverflow knows.
        ("413 Request Entity Too Large", ContextTooLarge, false, false, Some(413), None),
        (r#"413 {"error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}"#, ContextTooLarge, false, false, Some(413), Some("request_too_large")),
        ("400 This model's maximum context length is 32000 tokens. However, your messages resulted in 40000 tokens.", ContextTooLarge, false, false, Some(400), None),
        (r#"400 {"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 213462 tokens > 200000 maximum"}}"#, ContextTooLarge, false, false, Some(400), Some("invalid_request_error")),
        ("400 Your input exceeds the context window of this model", ContextTooLarge, false, false, Some(400), None),
        ("Input is too long for requested model.", ContextTooLarge, false, false, None, None),
        ("This model's maximum prompt length is 131072 but the request contains 537812 tokens", ContextTooLarge, false, false, None, None),
        ("the request exceeds the available context size, try increasing it", ContextTooLarge, false, false, None, None),
        ("400 status code (no body)", ContextTooLarge, false, false, Some(400), None),
        // Timeouts.
        ("Request timed out.", Timeout, true, true, None, None),
        // Unrecognised wording: a provider error, transient when pi would retry it.
        ("Provider returned error", ProviderError, true, true, None, None),
        ("An unknown error occurred", ProviderError, false, false, None, None),
    ];
    for (message, code, retriable, pi_retry, status, cause) in rows {
        let end = failed(message);
        let verdict = verdict(&end, &RetryTrail::default(), "t1");
        let error = error_of(&verdict);
        assert_eq!(error.code(), *code, "{message}");
        assert_eq!(error.retriable(), *retriable, "{message}");
        assert_eq!(error.trace_id(), Some("t1"), "{message}");
        if *code == TurnAborted {
            assert!(matches!(verdict, Verdict::Aborted(_)), "{message}");
            continue;
        }
        let may_retry = matches!(verdict, Verdict::FailedUnlessRetried(_));
        let overflow = is_context_overflow(message);
        assert_eq!(may_retry, *pi_retry || overflow, "pi retries {message}?");
        let details = error.details().expect("details");
        assert_eq!(details["provider"], "openai");
        assert_eq!(details["model"], "gpt-4o");
        assert_eq!(
            details.get("providerStatus").and_then(Value::as_u64),
            status.map(u64::from),
            "{message}"
        );
        let found = details
            .get("networkCode")
            .or_else(|| details.get("providerCode"))
            .and_then(Value::as_str);
        assert_eq!(found, *cause, "{message}");
    }
}

#[test]
fn registry_rows_of_the_agent_codes() {
    let row = |code: ErrorCode| (code.spec().retriable, code.spec().recovery);
    use racp_proto::Retriable::*;
    assert_eq!(
        row(ErrorCode::ProviderRateLimited),
        (Yes, Recovery::RetryAfter)
    );
    assert_eq!(row(ErrorCode::StreamFailed), (Yes, Recovery::Retry));
    assert_eq!(row(ErrorCode::ProviderError), (Maybe, Recovery::Retry));
    assert_eq!(row(ErrorCode::NetworkError), (Maybe, Recovery::Retry));
    assert_eq!(row(ErrorCode::ContextTooLarge).0, No);
    assert_eq!(row(ErrorCode::ProviderUnauthorized).0, No);
    assert_eq!(row(ErrorCode::ModelNotConfigured).0, No);
    assert_eq!(row(ErrorCode::EmptyModelResponse).0, Yes);
}

#[test]
fn a_retry_wait_in_the_message_becomes_retry_after_ms() {
    let end = failed("429 Rate limit reached for requests. Please try again in 2.4s.");
    let error = error_of(&verdict(&end, &RetryTrail::default(), "t")).clone();
    assert_eq!(error.retry_after_ms(), Some(2400));
    let end = failed("429 Too many requests, retry after 20 seconds");
    let error = error_of(&verdict(&end, &RetryTrail::default(), "t")).clone();
    assert_eq!(error.retry_after_ms(), Some(20_000));
    let end = failed("429 Too many requests");
    let error = error_of(&verdict(&end, &RetryTrail::default(), "t")).clone();
    assert_eq!(error.retry_after_ms(), None);
}

#[test]
fn gave_up_retries_are_final_and_counted() {
    let trail = RetryTrail {
        attempts: 3,
        gave_up: true,
    };
    let verdict = verdict(&failed("503 Service Unavailable"), &trail, "t");
    let Verdict::Failed(error) = verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(error.code(), ErrorCode::ProviderError);
    assert!(error.retriable());
    assert_eq!(error.details().unwrap()["retryAttempt"], 3);
}

#[test]
fn structured_abort_empty_and_finished_runs() {
    let mut end = failed("whatever");
    end.stop_reason = StopReason::Aborted;
    assert!(matches!(
        verdict(&end, &RetryTrail::default(), "t"),
        Verdict::Aborted(_)
    ));
    end.stop_reason = StopReason::Finished;
    assert_eq!(
        verdict(&end, &RetryTrail::default(), "t"),
        Verdict::Completed
    );
    end.empty = true;
    let v = verdict(&end, &RetryTrail::default(), "t");
    assert_eq!(error_of(&v).code(), ErrorCode::EmptyModelResponse);
    assert!(error_of(&v).retriable());
}

#[test]
fn credentials_are_redacted_and_the_message_capped() {
    let message = "401 Incorrect API key provided: sk-proj-abcdefghijklmnop1234. \
        Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig api-key: hunter2secret \
        x-api-key:abcdef123456 key=AIzaSyA1234567890abcdefgh";
    let redacted = redact(message);
    for secret in [
        "abcdefghijklmnop1234",
        "eyJhbGciOiJIUzI1NiJ9",
        "hunter2secret",
        "abcdef123456",
        "AIzaSyA1234567890",
    ] {
        assert!(!redacted.contains(secret), "{secret} in {redacted}");
    }
    assert!(redacted.starts_with("401 Incorrect API key provided: sk-[redacted]."));
    assert!(
        redacted.contains("Authorization: Bearer [redacted]"),
        "{redacted}"
    );
    let long = "x".repeat(5000);
    assert_eq!(redact(&long).chars().count(), PROVIDER_MESSAGE_CAP + 1);
    let end = failed(message);
    let error = error_of(&verdict(&end, &RetryTrail::default(), "t")).clone();
    let shown = error.details().unwrap()["providerMessage"]
        .as_str()
        .unwrap();
    assert!(!shown.contains("hunter2secret"));
    assert!(!error.message().contains("sk-proj"));
}

#[test]
fn heap_banner() {
    assert!(is_heap_exhausted(
        "<--- Last few GCs --->\nFATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory\n"
    ));
    assert!(!is_heap_exhausted("stand-in-agent: scripted crash"));
}
