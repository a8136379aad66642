//! A provider's refusal (HTTP status and error body) as the [`LlmError`] the run records.

use reqwest::StatusCode;
use serde::Deserialize;

use crate::llm::LlmError;

/// The most of an error body kept in a message, so that an HTML error page does not end up
/// in the run record whole.
const MAX_BODY_IN_MESSAGE: usize = 300;

/// OpenAI's error envelope, `{"error": {"message", "type", "code"}}`; compatible servers
/// fill some of it, and some send `error` as a bare string.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(default)]
    pub(crate) message: Option<String>,
    #[serde(default, rename = "type")]
    pub(crate) kind: Option<String>,
    /// A string (`context_length_exceeded`) or, on some servers, the HTTP status.
    #[serde(default)]
    pub(crate) code: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Envelope {
    error: ErrorField,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ErrorField {
    Object(ErrorBody),
    Text(String),
}

impl ErrorBody {
    /// Reads an error body; text that is not an error envelope becomes the message.
    pub(crate) fn parse(body: &str) -> Self {
        match serde_json::from_str::<Envelope>(body) {
            Ok(Envelope {
                error: ErrorField::Object(error),
            }) => error,
            Ok(Envelope {
                error: ErrorField::Text(message),
            }) => Self {
                message: Some(message),
                ..Self::default()
            },
            Err(_) => Self {
                message: Some(body.trim().to_string()).filter(|text| !text.is_empty()),
                ..Self::default()
            },
        }
    }

    /// The provider's message, shortened, or what is known instead.
    pub(crate) fn message(&self) -> String {
        let text = self
            .message
            .as_deref()
            .or(self.kind.as_deref())
            .unwrap_or("no error message");
        shorten(text)
    }

    /// Whether this says the conversation does not fit the context window. Providers agree
    /// on no code: OpenAI sends `context_length_exceeded`, others only say so in words.
    pub(crate) fn is_context_length(&self) -> bool {
        let code = self.code.as_ref().and_then(serde_json::Value::as_str);
        if code == Some("context_length_exceeded") {
            return true;
        }
        let message = self.message.as_deref().unwrap_or_default().to_lowercase();
        [
            "context length",
            "context_length",
            "maximum context",
            "context window",
        ]
        .iter()
        .any(|phrase| message.contains(phrase))
    }
}

/// The error for a refused attempt (after its retries, for a retryable status).
pub(crate) fn from_status(status: StatusCode, body: &str) -> LlmError {
    let error = ErrorBody::parse(body);
    let message = format!("http {status}: {}", error.message());
    match status.as_u16() {
        429 => LlmError::RateLimited(message),
        401 | 403 => LlmError::Auth(message),
        400 | 413 if error.is_context_length() => LlmError::ContextLengthExceeded(message),
        _ => LlmError::Provider(message),
    }
}

/// An error event inside a `200 OK` stream (OpenRouter and vLLM send one when generation
/// fails midway).
pub(crate) fn in_stream(error: &ErrorBody) -> LlmError {
    if error.is_context_length() {
        return LlmError::ContextLengthExceeded(error.message());
    }
    let status = error.code.as_ref().and_then(|code| match code {
        serde_json::Value::Number(number) => number.as_u64(),
        serde_json::Value::String(text) => text.parse().ok(),
        _ => None,
    });
    match status {
        Some(429) => {
            return LlmError::RateLimited(format!("provider error in stream: {}", error.message()))
        }
        Some(401 | 403) => {
            return LlmError::Auth(format!("provider error in stream: {}", error.message()))
        }
        _ => {}
    }
    LlmError::Provider(format!("provider error in stream: {}", error.message()))
}

/// `text` cut to a few hundred bytes at a character boundary.
pub(crate) fn shorten(text: &str) -> String {
    if text.len() <= MAX_BODY_IN_MESSAGE {
        return text.to_string();
    }
    let mut end = MAX_BODY_IN_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A transport error with its causes, without the URL (which may carry a query secret).
pub(crate) fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).expect("valid status")
    }

    #[test]
    fn statuses_map_to_the_run_error_codes() {
        let body =
            r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert_eq!(
            from_status(status(429), body),
            LlmError::RateLimited("http 429 Too Many Requests: slow down".into())
        );
        assert!(matches!(from_status(status(401), "{}"), LlmError::Auth(_)));
        assert!(matches!(from_status(status(403), ""), LlmError::Auth(_)));
        assert!(matches!(
            from_status(status(404), ""),
            LlmError::Provider(_)
        ));
        let overloaded = from_status(status(503), "<html>busy</html>");
        assert_eq!(
            overloaded,
            LlmError::Provider("http 503 Service Unavailable: <html>busy</html>".into())
        );
    }

    #[test]
    fn context_length_is_told_by_code_or_by_words() {
        let coded = r#"{"error":{"message":"too long","code":"context_length_exceeded"}}"#;
        assert!(matches!(
            from_status(status(400), coded),
            LlmError::ContextLengthExceeded(_)
        ));
        let worded = r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":null}}"#;
        assert!(matches!(
            from_status(status(400), worded),
            LlmError::ContextLengthExceeded(_)
        ));
        let other = r#"{"error":{"message":"unknown parameter: foo","code":"unknown_parameter"}}"#;
        assert!(matches!(
            from_status(status(400), other),
            LlmError::Provider(_)
        ));
        let bare = r#"{"error":"the request exceeds the available context window"}"#;
        assert!(matches!(
            from_status(status(400), bare),
            LlmError::ContextLengthExceeded(_)
        ));
    }

    #[test]
    fn long_bodies_are_shortened_at_a_character_boundary() {
        let text = "é".repeat(400);
        let short = shorten(&text);
        assert!(short.len() <= MAX_BODY_IN_MESSAGE + "…".len());
        assert!(short.ends_with('…'));
    }
}
