//! Errors in OpenAI's JSON shape, each with its HTTP status and a stable `code`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::runtime::admission::RejectReason;
use crate::runtime::engine::SubmitError;

/// An error response: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// Stable machine-readable code.
    pub code: &'static str,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: &'a str,
}

impl ApiError {
    /// 400 for a field with a bad value.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: "invalid_value",
        }
    }

    /// 400 for a body that is not the JSON we expect.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: "invalid_json",
        }
    }

    /// 400 for a feature this server does not implement.
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self {
            code: "unsupported_parameter",
            ..Self::invalid(param, message)
        }
    }

    /// 400 when prompt plus output exceed the context; `param` is `prompt` or `messages`.
    pub fn context_length(param: &str, message: impl Into<String>) -> Self {
        Self {
            code: "context_length_exceeded",
            ..Self::invalid(param, message)
        }
    }

    /// 404 for a model this server does not serve.
    pub fn unknown_model(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: "model_not_found",
        }
    }

    /// 404 for an unknown route.
    pub fn no_route(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("no route for {path}"),
            kind: "invalid_request_error",
            param: None,
            code: "not_found",
        }
    }

    /// 405 for a known route with the wrong method.
    pub fn method_not_allowed() -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: "method not allowed on this route".into(),
            kind: "invalid_request_error",
            param: None,
            code: "method_not_allowed",
        }
    }

    /// 413 for a body over the size limit.
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("request body exceeds {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: "body_too_large",
        }
    }

    /// 408 for a body that did not arrive within `--http-body-timeout`.
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "the request body did not arrive within {} s (--http-body-timeout)",
                limit.as_secs_f64()
            ),
            kind: "invalid_request_error",
            param: None,
            code: "request_timeout",
        }
    }

    /// 429 at the front door.
    pub fn rejected(reason: RejectReason) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "request rejected: {reason} ({}); retry later",
                reason.label()
            ),
            kind: "rate_limit_exceeded",
            param: None,
            code: reason.label(),
        }
    }

    /// 503 while draining or when the core is gone.
    pub fn unavailable(message: impl Into<String>, code: &'static str) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable",
            param: None,
            code,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        serde_json::to_string(&Body {
            error: Detail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .expect("serialisable")
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Draining => ApiError::unavailable(e.to_string(), "draining"),
            SubmitError::Rejected(reason) => ApiError::rejected(reason),
            SubmitError::CoreStopped => ApiError::unavailable(e.to_string(), "engine_stopped"),
            SubmitError::TooLarge(why) => ApiError {
                code: "exceeds_queue_limit",
                ..ApiError::invalid("prompt", why)
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, self.body()).into_response();
        resp.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body is not read: the connection cannot carry another request.
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        if self.status == StatusCode::TOO_MANY_REQUESTS
            || self.status == StatusCode::SERVICE_UNAVAILABLE
        {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        resp
    }
}
