//! Parsing and validating OpenAI request bodies.
//!
//! Bodies are read as a JSON object and each field is decoded on its own, so a wrong type
//! produces a 400 that names the field. Fields this server does not implement are refused
//! when set to a non-default value, rather than silently ignored; unknown fields are
//! ignored, as OpenAI-compatible servers do.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::compute::tokenizer::ChatMessage;

/// Most prompts per completion request, and most choices (`n`).
pub const MAX_FAN_OUT: usize = 128;
/// Most sequences one request may start: prompts × `n`. Each is a request in the engine
/// with its own KV blocks, stream and text state.
pub const MAX_CHOICES: usize = 128;
/// Most stop strings.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes (each generated token is matched against every stop
/// string's prefixes).
pub const MAX_STOP_STRING_BYTES: usize = 256;
/// Most `stop_token_ids` (each is masked while `min_tokens` is not reached, and compared
/// with every generated token).
pub const MAX_STOP_TOKEN_IDS: usize = 128;
/// Longest tenant name (it keys an in-memory map).
pub const MAX_TENANT_LEN: usize = 256;

/// A JSON object body with typed, field-named access.
pub struct Fields(Map<String, Value>);

impl Fields {
    /// Parses a body; anything but a JSON object is a 400.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(Self(map)),
            Ok(_) => Err(ApiError::malformed("request body must be a JSON object")),
            Err(e) => Err(ApiError::malformed(format!(
                "request body is not valid JSON: {e}"
            ))),
        }
    }

    /// Field `name` decoded as `T`; absent and `null` are `None`.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ApiError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => T::deserialize(v)
                .map(Some)
                .map_err(|e| ApiError::invalid(name, format!("`{name}`: {e}"))),
        }
    }

    /// The raw value of a field.
    pub fn raw(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// Refuses a field set to anything but its neutral value.
    pub fn refuse_unless(
        &self,
        name: &str,
        neutral: impl Fn(&Value) -> bool,
    ) -> Result<(), ApiError> {
        match self.raw(name) {
            Some(v) if !neutral(v) => Err(ApiError::unsupported(
                name,
                format!("`{name}` is not supported by this server"),
            )),
            _ => Ok(()),
        }
    }
}

/// A completion prompt: text or token ids, one or many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    /// Text to tokenize.
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
}

/// Parses `prompt`: a string, an array of strings, an array of token ids, or an array of
/// token-id arrays.
pub fn parse_prompts(f: &Fields) -> Result<Vec<PromptInput>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, an array of strings, an array of token ids or an array of token-id arrays",
        )
    };
    let token = |v: &Value| v.as_u64().and_then(|t| u32::try_from(t).ok());
    let tokens = |items: &[Value]| items.iter().map(token).collect::<Option<Vec<u32>>>();
    let prompts = match f.raw("prompt") {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad()),
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|v| v.as_str().map(|s| PromptInput::Text(s.to_string())))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(bad)?,
            Value::Number(_) => vec![PromptInput::Tokens(tokens(items).ok_or_else(bad)?)],
            Value::Array(_) => items
                .iter()
                .map(|v| {
                    v.as_array()
                        .and_then(|a| tokens(a))
                        .map(PromptInput::Tokens)
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(bad)?,
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    if prompts.len() > MAX_FAN_OUT {
        return Err(ApiError::invalid(
            "prompt",
            format!("at most {MAX_FAN_OUT} prompts per request"),
        ));
    }
    Ok(prompts)
}

/// Parses chat `messages`: role and content, content as a string or an array of text parts.
pub fn parse_messages(f: &Fields) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Value::Array(items)) = f.raw("messages") else {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must be a non-empty array",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must be a non-empty array",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |what: &str| ApiError::invalid("messages", format!("`messages[{i}]`: {what}"));
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| at("`role` must be a string"))?;
            if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
                return Err(at(
                    "`role` must be one of system, developer, user, assistant, tool",
                ));
            }
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| {
                        match (
                            p.get("type").and_then(Value::as_str),
                            p.get("text").and_then(Value::as_str),
                        ) {
                            (Some("text"), Some(t)) => Ok(t),
                            _ => Err(at("only text content parts are supported")),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .concat(),
                Some(_) => return Err(at("`content` must be a string or an array of text parts")),
            };
            Ok(ChatMessage {
                role: role.to_string(),
                content,
            })
        })
        .collect()
}

/// Generation parameters shared by both endpoints, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Requested output tokens (`None`: endpoint default).
    pub max_tokens: Option<u32>,
    /// Sampling temperature (≥ 0; 0 is greedy).
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// Top-k (0: off).
    pub top_k: u32,
    /// Choices per prompt.
    pub n: usize,
    /// Server-sent events.
    pub stream: bool,
    /// Send a final usage chunk when streaming.
    pub include_usage: bool,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// Extra stop token ids.
    pub stop_token_ids: Vec<u32>,
    /// Per-request seed.
    pub seed: Option<u64>,
    /// OpenAI `user`.
    pub user: Option<String>,
    /// Keep going through EOS.
    pub ignore_eos: bool,
    /// EOS and stop tokens ignored before this many tokens.
    pub min_tokens: u32,
}

/// Reads and validates the shared generation fields; `max_tokens_fields` lists the names
/// that carry the output limit, first one present wins.
pub fn parse_gen_params(f: &Fields, max_tokens_fields: &[&str]) -> Result<GenParams, ApiError> {
    let mut max_tokens = None;
    for name in max_tokens_fields {
        if let Some(v) = f.get::<i64>(name)? {
            if v < 1 {
                return Err(ApiError::invalid(
                    name,
                    format!("`{name}` must be at least 1, got {v}"),
                ));
            }
            max_tokens = Some(u32::try_from(v).unwrap_or(u32::MAX));
            break;
        }
    }
    let temperature = f.get::<f32>("temperature")?.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::invalid(
            "temperature",
            "`temperature` must be a number ≥ 0",
        ));
    }
    let top_p = f.get::<f32>("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", "`top_p` must be in (0, 1]"));
    }
    let top_k = match f.get::<i64>("top_k")?.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
        k => {
            return Err(ApiError::invalid(
                "top_k",
                format!("`top_k` must be -1, 0 or positive, got {k}"),
            ));
        }
    };
    let n = f.get::<i64>("n")?.unwrap_or(1);
    if !(1..=MAX_FAN_OUT as i64).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be between 1 and {MAX_FAN_OUT}"),
        ));
    }
    let stream = f.get::<bool>("stream")?.unwrap_or(false);
    let include_usage = match f.raw("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid(
                    "stream_options",
                    "`stream_options.include_usage` must be a boolean",
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ));
        }
    };
    let stop = match f.raw("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::invalid("stop", "`stop` must be a string or an array of strings")
            })?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "`stop` must be a string or an array of strings",
            ));
        }
    };
    if stop.len() > MAX_STOP_STRINGS || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            format!("`stop` takes at most {MAX_STOP_STRINGS} non-empty strings"),
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_STRING_BYTES) {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "each `stop` string must have at most {MAX_STOP_STRING_BYTES} bytes, one has {}",
                long.len()
            ),
        ));
    }
    let stop_token_ids = f.get::<Vec<u32>>("stop_token_ids")?.unwrap_or_default();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!(
                "`stop_token_ids` takes at most {MAX_STOP_TOKEN_IDS} ids, got {}",
                stop_token_ids.len()
            ),
        ));
    }
    let user = f.get::<String>("user")?;
    if user.as_ref().is_some_and(|u| u.len() > MAX_TENANT_LEN) {
        return Err(ApiError::invalid(
            "user",
            format!("`user` is longer than {MAX_TENANT_LEN} bytes"),
        ));
    }
    // OpenAI seeds are signed 64-bit; keep their bits.
    let seed = f.get::<i64>("seed")?.map(|s| s as u64);
    let min_tokens = f.get::<u32>("min_tokens")?.unwrap_or(0);
    if max_tokens.is_some_and(|m| min_tokens > m) {
        return Err(ApiError::invalid(
            "min_tokens",
            "`min_tokens` must not exceed `max_tokens`",
        ));
    }
    for (name, neutral) in [
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repetition_penalty", 1.0),
    ] {
        f.refuse_unless(name, |v| v.as_f64() == Some(neutral))?;
    }
    f.refuse_unless("logit_bias", |v| v.as_object().is_some_and(Map::is_empty))?;
    f.refuse_unless("best_of", |v| v.as_u64() == Some(1))?;
    f.refuse_unless("echo", |v| v == &Value::Bool(false))?;
    f.refuse_unless("suffix", |_| false)?;
    f.refuse_unless("logprobs", |v| v == &Value::Bool(false))?;
    f.refuse_unless("top_logprobs", |v| v.as_u64() == Some(0))?;
    f.refuse_unless("tools", |v| v.as_array().is_some_and(Vec::is_empty))?;
    f.refuse_unless("response_format", |v| {
        v.get("type").and_then(Value::as_str) == Some("text")
    })?;
    Ok(GenParams {
        max_tokens,
        temperature,
        top_p,
        top_k,
        n: n as usize,
        stream,
        include_usage,
        stop,
        stop_token_ids,
        seed,
        user,
        ignore_eos: f.get::<bool>("ignore_eos")?.unwrap_or(false),
        min_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> Fields {
        Fields::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn prompts_in_every_shape() {
        let p = |j| parse_prompts(&fields(j));
        assert_eq!(
            p(r#"{"prompt":"hi"}"#).unwrap(),
            [PromptInput::Text("hi".into())]
        );
        assert_eq!(p(r#"{"prompt":["a","b"]}"#).unwrap().len(), 2);
        assert_eq!(
            p(r#"{"prompt":[1,2,3]}"#).unwrap(),
            [PromptInput::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(p(r#"{"prompt":[[1],[2,3]]}"#).unwrap().len(), 2);
        for bad in [
            r#"{}"#,
            r#"{"prompt":5}"#,
            r#"{"prompt":[]}"#,
            r#"{"prompt":[1,"a"]}"#,
            r#"{"prompt":[-1]}"#,
        ] {
            let e = p(bad).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("prompt"), "{bad}");
        }
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = parse_gen_params(&fields(r#"{"temperature":"hot"}"#), &["max_tokens"]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = parse_gen_params(&fields(r#"{"max_tokens":0}"#), &["max_tokens"]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = parse_gen_params(&fields(r#"{"stop":["a",3]}"#), &["max_tokens"]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
    }

    #[test]
    fn unsupported_features_are_refused_only_when_used() {
        let ok = parse_gen_params(
            &fields(r#"{"presence_penalty":0,"logprobs":false,"echo":false}"#),
            &["max_tokens"],
        );
        assert!(ok.is_ok());
        let e =
            parse_gen_params(&fields(r#"{"presence_penalty":0.5}"#), &["max_tokens"]).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            ("unsupported_parameter", Some("presence_penalty"))
        );
    }

    #[test]
    fn defaults_and_aliases() {
        let g = parse_gen_params(
            &fields(
                r#"{"max_completion_tokens":7,"top_k":-1,"stream_options":{"include_usage":true}}"#,
            ),
            &["max_completion_tokens", "max_tokens"],
        )
        .unwrap();
        assert_eq!(
            (g.max_tokens, g.top_k, g.n, g.include_usage),
            (Some(7), 0, 1, true)
        );
        assert_eq!(g.temperature, 1.0);
    }

    #[test]
    fn messages_accept_text_parts_and_refuse_others() {
        let m = parse_messages(&fields(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#)).unwrap();
        assert_eq!(m[0].content, "ab");
        assert!(
            parse_messages(&fields(r#"{"messages":[{"role":"wizard","content":"x"}]}"#)).is_err()
        );
        assert!(parse_messages(&fields(r#"{"messages":[]}"#)).is_err());
        assert!(
            parse_messages(&fields(
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#
            ))
            .is_err()
        );
    }

    #[test]
    fn non_object_bodies_are_malformed() {
        assert_eq!(Fields::parse(b"[1]").err().unwrap().code, "invalid_json");
        assert_eq!(
            Fields::parse(b"{not json").err().unwrap().code,
            "invalid_json"
        );
    }
}
