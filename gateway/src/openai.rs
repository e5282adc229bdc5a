//! What the gateway reads of an OpenAI request, and the OpenAI-shaped errors it answers
//! with when it routes nothing.
//!
//! The body is read once, whole, after its last chunk: the gateway needs only `model`
//! (completions and chat alike), but the whole body must be valid JSON, or an engine
//! would refuse it anyway after a trip across the network.

use serde::Deserialize;

/// What the gateway needs of a request body to route it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    /// The `model` field; `None` when the body has none (an engine then serves its own).
    pub model: Option<String>,
}

/// The fields of the body the gateway reads; every other field is skipped, but the
/// whole body must still parse.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    model: Option<serde_json::Value>,
}

/// Reads `body` as an OpenAI request.
pub fn read(body: &[u8]) -> Result<Routing, Refusal> {
    // serde would take an array for a struct too (its fields in order).
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Refusal::malformed("the request body must be a JSON object"));
    }
    let head: Head = match serde_json::from_slice(body) {
        Ok(head) => head,
        Err(e) if e.is_data() => {
            return Err(Refusal::malformed("the request body must be a JSON object"));
        }
        Err(e) => {
            return Err(Refusal::malformed(format!(
                "the request body is not valid JSON: {e}"
            )));
        }
    };
    let model = match head.model {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(m)) => Some(m),
        Some(_) => {
            return Err(Refusal {
                status: 400,
                kind: "invalid_request_error",
                param: Some("model"),
                code: "invalid_value",
                message: "`model` must be a string".into(),
                retry_after: None,
            });
        }
    };
    Ok(Routing { model })
}

/// An answer the gateway gives itself instead of routing: its HTTP status, an
/// OpenAI-shaped JSON body (`{"error": {"message", "type", "param", "code"}}`) and, for
/// the answers that mean "later", a `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error type.
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// Stable machine-readable code; also the `reason` label of the refusal counter.
    pub code: &'static str,
    /// What went wrong, for a person.
    pub message: String,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u32>,
}

impl Refusal {
    /// 400: the body is not the JSON an OpenAI endpoint takes.
    pub fn malformed(message: impl Into<String>) -> Self {
        Refusal {
            status: 400,
            kind: "invalid_request_error",
            param: None,
            code: "invalid_json",
            message: message.into(),
            retry_after: None,
        }
    }

    /// 413: the body passed the gateway's cap.
    pub fn too_large(limit: usize) -> Self {
        Refusal {
            status: 413,
            kind: "invalid_request_error",
            param: None,
            code: "body_too_large",
            message: format!(
                "the request body is larger than the gateway's limit of {limit} bytes"
            ),
            retry_after: None,
        }
    }

    /// 404: a model the pool does not serve.
    pub fn unknown_model(model: &str, served: &[String]) -> Self {
        Refusal {
            status: 404,
            kind: "invalid_request_error",
            param: Some("model"),
            code: "model_not_found",
            message: format!(
                "the model `{model}` is not served here (served: {})",
                served.join(", ")
            ),
            retry_after: None,
        }
    }

    /// 400: a request header the gateway reads has a value it cannot use.
    pub fn bad_header(name: &str, expected: &str) -> Self {
        Refusal {
            status: 400,
            kind: "invalid_request_error",
            param: None,
            code: "invalid_header",
            message: format!("the header `{name}` must be {expected}"),
            retry_after: None,
        }
    }

    /// 429: the pool is saturated and the request is sheddable.
    pub fn shed(retry_after: u32) -> Self {
        Refusal {
            status: 429,
            kind: "rate_limit_exceeded",
            param: None,
            code: "shed",
            message: "every endpoint is saturated and this request's priority is sheddable".into(),
            retry_after: Some(retry_after),
        }
    }

    /// 503: no endpoint to send the request to.
    pub fn no_endpoint(code: &'static str, message: impl Into<String>, retry_after: u32) -> Self {
        Refusal {
            status: 503,
            kind: "service_unavailable",
            param: None,
            code,
            message: message.into(),
            retry_after: Some(retry_after),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }))
        .expect("a JSON value always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_model_of_completions_and_chat() {
        let r = read(br#"{"model":"m","prompt":"hi","max_tokens":4}"#).unwrap();
        assert_eq!(r.model.as_deref(), Some("m"));
        let r = read(br#"{"messages":[{"role":"user","content":"hi"}],"model":"chat"}"#).unwrap();
        assert_eq!(r.model.as_deref(), Some("chat"));
        assert_eq!(read(br#"{"prompt":"hi"}"#).unwrap().model, None);
        assert_eq!(read(br#"{"model":null}"#).unwrap().model, None);
    }

    #[test]
    fn refuses_what_is_not_an_openai_body() {
        for body in [&b"{\"model\":"[..], b"{\"model\":\"m\"} trailing", b"{]"] {
            let r = read(body).unwrap_err();
            assert_eq!((r.status, r.code), (400, "invalid_json"), "{body:?}");
        }
        for body in [&b"[1,2]"[..], b"\"text\"", b"42", b"", b"not json"] {
            let r = read(body).unwrap_err();
            assert_eq!(r.code, "invalid_json", "{body:?}");
            assert!(r.message.contains("JSON object"), "{}", r.message);
        }
        let r = read(br#"{"model":7}"#).unwrap_err();
        assert_eq!(
            (r.status, r.code, r.param),
            (400, "invalid_value", Some("model"))
        );
    }

    #[test]
    fn a_refusal_body_is_openai_shaped() {
        let r = Refusal::unknown_model("x", &["a".into(), "b".into()]);
        let v: serde_json::Value = serde_json::from_slice(&r.body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("a, b"));
    }
}
