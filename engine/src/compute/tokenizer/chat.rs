//! Chat templates: the Jinja template a model ships with (`tokenizer.chat_template` in GGUF,
//! `chat_template` in `tokenizer_config.json`), rendered by `minijinja` the way Hugging Face
//! transformers and vLLM render it.

use std::fmt;

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};

/// One chat message after the HTTP layer has validated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// The template used when a model ships none: ChatML, the format of the SmolLM2, Qwen and
/// many other instruct models (and transformers' former default). Each message is
/// `<|im_start|>{role}\n{content}<|im_end|>\n`; the generation prompt is
/// `<|im_start|>assistant\n`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The template's name inside its environment (appears in error locations).
const NAME: &str = "chat_template";

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template is not valid Jinja (or uses a construct minijinja lacks).
    #[error("the model's chat template does not compile: {0}")]
    Syntax(String),
    /// The template rejected the conversation by calling `raise_exception(message)`, as many
    /// do for roles that do not alternate or a system message where none is allowed. The
    /// request is at fault, so this is a client error.
    #[error("the model's chat template rejected the messages: {0}")]
    Raised(String),
    /// Rendering failed otherwise (an undefined method, a type error, …).
    #[error("the model's chat template failed to render: {0}")]
    Render(String),
}

/// A compiled chat template. Rendering is thread-safe and allocation-light; compile once per
/// model.
///
/// The environment matches transformers' `apply_chat_template`: `trim_blocks` and
/// `lstrip_blocks` on, loop controls (`{% break %}`), `raise_exception(msg)`, the
/// builtin filters (including `tojson`) and Python string/dict methods such as
/// `.strip()`, `.startswith()` and `.items()`. The context is `messages` (a list of
/// `{role, content}` maps), `add_generation_prompt`, `bos_token` and `eos_token`.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// What `raise_exception` raises; found again by walking the error's sources.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles `source`. `bos_token` and `eos_token` are the texts of the model's BOS and EOS
    /// tokens (empty when it has none), available to the template under those names.
    pub fn new(
        source: &str,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("raise_exception: {message}"),
                )
                .with_source(Raised(message)))
            },
        );
        let source = source.to_string();
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        Ok(Self {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// [`CHATML_TEMPLATE`], for models that ship no template.
    pub fn chatml(bos_token: impl Into<String>, eos_token: impl Into<String>) -> Self {
        Self::new(CHATML_TEMPLATE, bos_token, eos_token)
            .expect("the built-in ChatML template compiles")
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the template appends the header of
    /// the assistant's turn (the engine always asks for it).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                minijinja::context! {
                    role => m.role.as_str(),
                    content => m.content.as_str(),
                }
            })
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatTemplateError::Render(e.to_string()))?;
        template.render(ctx).map_err(|e| {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = source {
                if let Some(Raised(message)) = err.downcast_ref::<Raised>() {
                    return ChatTemplateError::Raised(message.clone());
                }
                source = err.source();
            }
            ChatTemplateError::Render(e.to_string())
        })
    }
}
