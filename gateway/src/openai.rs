//! What the gateway reads of an OpenAI request, and the OpenAI-shaped errors it answers
//! with when it routes nothing.
//!
//! The body is read once, whole, after its last chunk: the gateway needs `model` and the
//! prompt (completions and chat alike; the prompt for [prefix affinity](crate::prefix)),
//! but the whole body must be valid JSON, or an engine would refuse it anyway after a trip
//! across the network.

use serde::Deserialize;

/// What the gateway needs of a request body to route it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    /// The `model` field; `None` when the body has none (an engine then serves its own).
    pub model: Option<String>,
    /// The bytes of what the engine will tokenize first, in order: the prompt's text (the
    /// first of a batch), a token-id prompt's ids as 4 little-endian bytes each, or each
    /// chat message's role and text, each ended by a separator byte. Empty when the body
    /// has no prompt the gateway can read; the request is then routed on load alone.
    pub prompt: Vec<u8>,
}

/// The fields of the body the gateway reads; every other field is skipped, but the
/// whole body must still parse.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    model: Option<serde_json::Value>,
    #[serde(default)]
    prompt: Option<serde_json::Value>,
    #[serde(default)]
    messages: Option<serde_json::Value>,
}

/// Ends a chat message's role and each of its parts in [`Routing::prompt`]: a byte no
/// UTF-8 text contains.
const SEPARATOR: u8 = 0xff;

/// The prompt bytes of a completions `prompt`: text, token ids, or a batch of either
/// (its first).
fn prompt_bytes(prompt: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match prompt {
        Value::String(s) => out.extend_from_slice(s.as_bytes()),
        Value::Array(items) => match items.first() {
            Some(Value::Number(_)) => {
                for id in items.iter().map_while(Value::as_u64) {
                    out.extend_from_slice(&(id as u32).to_le_bytes());
                }
            }
            Some(first @ (Value::String(_) | Value::Array(_))) => prompt_bytes(first, out),
            _ => {}
        },
        _ => {}
    }
}

/// The prompt bytes of chat `messages`: each message's role, then its text (a string, or
/// the `text` of its parts), each ended by [`SEPARATOR`].
fn messages_bytes(messages: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    let Some(messages) = messages.as_array() else {
        return;
    };
    for m in messages {
        if let Some(role) = m.get("role").and_then(Value::as_str) {
            out.extend_from_slice(role.as_bytes());
        }
        out.push(SEPARATOR);
        match m.get("content") {
            Some(Value::String(text)) => out.extend_from_slice(text.as_bytes()),
            Some(Value::Array(parts)) => {
                for text in parts.iter().filter_map(|p| p.get("text")?.as_str()) {
                    out.extend_from_slice(text.as_bytes());
                    out.push(SEPARATOR);
                }
            }
            _ => {}
        }
        out.push(SEPARATOR);
    }
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
    let mut prompt = Vec::new();
    if let Some(messages) = &head.messages {
        messages_bytes(messages, &mut prompt);
    } else if let Some(p) = &head.prompt {
        prompt_bytes(p, &mut prompt);
    }
    Ok(Routing { model, prompt })
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
    fn reads_the_prompt_of_completions_and_chat() {
        let text = read(br#"{"model":"m","prompt":"You are kind."}"#).unwrap();
        assert_eq!(text.prompt, b"You are kind.");
        let batch = read(br#"{"prompt":["first","second"]}"#).unwrap();
        assert_eq!(batch.prompt, b"first");
        let ids = read(br#"{"prompt":[1,258]}"#).unwrap();
        assert_eq!(ids.prompt, [1, 0, 0, 0, 2, 1, 0, 0]);
        let id_batch = read(br#"{"prompt":[[7],[8]]}"#).unwrap();
        assert_eq!(id_batch.prompt, [7, 0, 0, 0]);
        let chat = read(
            br#"{"messages":[{"role":"system","content":"Be brief."},
                {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url"}]}]}"#,
        )
        .unwrap();
        assert_eq!(chat.prompt, b"system\xffBe brief.\xffuser\xffHi\xff\xff");
        // The same system message makes the same leading bytes whatever follows.
        let other = read(br#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Yo"}]}"#).unwrap();
        assert_eq!(chat.prompt[..17], other.prompt[..17]);
        for body in [
            &br#"{"prompt":7}"#[..],
            br#"{"prompt":[]}"#,
            br#"{"messages":"x"}"#,
            b"{}",
        ] {
            assert!(read(body).unwrap().prompt.is_empty(), "{body:?}");
        }
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
