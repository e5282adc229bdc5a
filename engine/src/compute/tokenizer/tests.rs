//! Tests of the real tokenizers: toy GGUF vocabularies written in memory, chat templates,
//! and the default real model against llama.cpp's token ids when it is cached.

use super::*;
use crate::compute::model::gguf::test_writer::GgufWriter;
use crate::compute::model::gguf::{GgufFile, MetaArray, MetaValue};
use crate::compute::model::{KNOWN_MODELS, cached_model_or_skip};

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: content.into(),
    }
}

fn stream_all(tok: &dyn Tokenizer, ids: &[u32]) -> Vec<String> {
    let mut d = tok.stream_decoder();
    let mut pieces: Vec<String> = ids.iter().map(|&t| d.push(t)).collect();
    pieces.push(d.finish());
    pieces
}

// ---- a toy byte-level vocabulary in a GGUF file written in memory ----

/// The toy vocabulary: three control tokens, the 256 byte-level characters (id 3 + byte), a
/// user-defined token, then merged tokens.
const TOY_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const TOY_USER: &str = "<tool>";
const TOY_MERGES: [&str; 7] = ["a b", "Ġ a", "Ġa b", "1 2", "3 4", "12 34", "Ġ Ġ"];

/// The byte-level character of `b` (GPT-2's table).
fn byte_char(b: u8) -> char {
    let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable {
        return char::from(b);
    }
    let rank = (0..b)
        .filter(|&x| !((0x21..=0x7E).contains(&x) || (0xA1..=0xAC).contains(&x) || x >= 0xAE))
        .count() as u32;
    char::from_u32(0x100 + rank).unwrap()
}

fn toy_tokens() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = TOY_SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3; TOY_SPECIALS.len()];
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
        types.push(1);
    }
    tokens.push(TOY_USER.into());
    types.push(4);
    for m in TOY_MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    (tokens, types)
}

/// The id of a toy token by its vocabulary string.
fn toy_id(token: &str) -> u32 {
    toy_tokens().0.iter().position(|t| t == token).unwrap() as u32
}

/// The id of the toy token for one byte.
fn byte_id(b: u8) -> u32 {
    3 + u32::from(b)
}

fn toy_gguf(pre: Option<&str>, add_bos: Option<bool>, template: Option<&str>) -> GgufWriter {
    let (tokens, types) = toy_tokens();
    let mut w = GgufWriter::default()
        .kv("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            MetaValue::Array(MetaArray::String(tokens)),
        )
        .kv(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(types)),
        )
        .kv(
            "tokenizer.ggml.merges",
            MetaValue::Array(MetaArray::String(
                TOY_MERGES.iter().map(|m| m.to_string()).collect(),
            )),
        )
        .kv("tokenizer.ggml.bos_token_id", MetaValue::U32(1))
        .kv("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    if let Some(pre) = pre {
        w = w.kv("tokenizer.ggml.pre", MetaValue::String(pre.into()));
    }
    if let Some(add) = add_bos {
        w = w.kv("tokenizer.ggml.add_bos_token", MetaValue::Bool(add));
    }
    if let Some(t) = template {
        w = w.kv("tokenizer.chat_template", MetaValue::String(t.into()));
    }
    w
}

fn build(w: &GgufWriter) -> Result<BpeTokenizer, TokenizerError> {
    let bytes = w.to_bytes();
    let file = GgufFile::from_bytes(&bytes[..]).unwrap();
    BpeTokenizer::from_gguf(&file.tokenizer_metadata().unwrap())
}

fn toy(pre: &str) -> BpeTokenizer {
    build(&toy_gguf(Some(pre), None, None)).unwrap()
}

#[test]
fn toy_gguf_encodes_by_merge_rank_with_special_tokens() {
    let tok = toy("smollm");
    assert_eq!(tok.vocab_size(), 3 + 256 + 1 + TOY_MERGES.len());
    let (a, b, ab, g_a, g_ab) = (
        toy_id("a"),
        toy_id("b"),
        toy_id("ab"),
        toy_id("Ġa"),
        toy_id("Ġab"),
    );
    // "ab": the one merge. " ab": `a b` (rank 0) applies before `Ġ a` (rank 1), and
    // `Ġ ab` is no merge, so the space stays alone. " a": `Ġ a`. " a" + "b" after a
    // special token starts a new word.
    assert_eq!(tok.encode("ab", false), [ab]);
    assert_eq!(tok.encode(" ab", false), [byte_id(b' '), ab]);
    assert_eq!(tok.encode(" a", false), [g_a]);
    assert_eq!(
        tok.encode("ab ab<|im_end|>a<|im_start|>", false),
        [ab, byte_id(b' '), ab, 2, a, 1]
    );
    // A user-defined token is one id too, and a control token's text inside a word still
    // splits it.
    assert_eq!(tok.encode("a<tool>b", false), [a, toy_id(TOY_USER), b]);
    // Bytes outside ASCII are byte tokens.
    assert_eq!(tok.encode("é", false), [byte_id(0xC3), byte_id(0xA9)]);
    // `Ġa b` is reachable only through `Ġa`: `Ġ a` and `a b` compete for the `a`, and
    // rank 0 (`a b`) wins, so `Ġab` never forms from " ab".
    assert!(!tok.encode(" ab ab", false).contains(&g_ab));
    // Deterministic: the same text, the same ids, every time.
    let text = "ab  a b 1234 <|im_end|> é";
    let first = tok.encode(text, false);
    for _ in 0..3 {
        assert_eq!(tok.encode(text, false), first);
    }
    assert_eq!(tok.decode(&first), "ab  a b 1234  é");
}

#[test]
fn pre_tokenizers_split_digits_differently() {
    let (d1, d2, d3, d4) = (byte_id(b'1'), byte_id(b'2'), byte_id(b'3'), byte_id(b'4'));
    // smollm: every digit alone, so no digit merge applies.
    assert_eq!(toy("smollm").encode("1234", false), [d1, d2, d3, d4]);
    // gpt2: one number, merged as far as the merges go.
    assert_eq!(toy("gpt2").encode("1234", false), [toy_id("1234")]);
    assert_eq!(toy("gpt-2").encode("1234", false), [toy_id("1234")]);
    // Llama 3: numbers of at most three digits ("123", "4").
    assert_eq!(
        toy("llama-bpe").encode("1234", false),
        [toy_id("12"), d3, d4]
    );
    // Llama 3 keeps a run of spaces before a word apart from the word's own space;
    // GPT-2 does the same with `\s+(?!\S)`.
    let sp = byte_id(b' ');
    let g_g = toy_id("ĠĠ");
    assert_eq!(toy("llama-bpe").encode("   a", false), [g_g, toy_id("Ġa")]);
    assert_eq!(toy("gpt2").encode("   a", false), [g_g, toy_id("Ġa")]);
    assert_eq!(toy("gpt2").encode("a   ", false), [toy_id("a"), g_g, sp]);
}

#[test]
fn bos_is_added_only_when_asked_and_the_model_wants_it() {
    let with = build(&toy_gguf(Some("smollm"), Some(true), None)).unwrap();
    assert!(with.adds_bos());
    assert_eq!(with.encode("a", true), [1, toy_id("a")]);
    assert_eq!(with.encode("a", false), [toy_id("a")]);
    let without = build(&toy_gguf(Some("smollm"), Some(false), None)).unwrap();
    assert!(!without.adds_bos());
    assert_eq!(without.encode("a", true), [toy_id("a")]);
    // Absent: llama.cpp's defaults, true for Llama 3's pre-tokenizer only.
    assert!(!toy("smollm").adds_bos());
    assert!(toy("llama-bpe").adds_bos());
    assert_eq!(toy("llama-bpe").encode("a", true), [1, toy_id("a")]);
    assert_eq!(toy("smollm").bos_token_id(), Some(1));
    assert_eq!(toy("smollm").eos_token_id(), 2);
    // `<|im_end|>` is the EOS; `<|endoftext|>` also ends a turn for llama.cpp.
    assert_eq!(toy("smollm").eos_token_ids(), [2, 0]);
}

#[test]
fn stream_decoder_holds_back_split_characters_and_skips_specials() {
    let tok = toy("smollm");
    // "✓" is three bytes, hence three byte tokens; "é" two.
    let ids = tok.encode("a✓é", false);
    let check: Vec<u32> = "✓".bytes().map(byte_id).collect();
    assert_eq!(&ids[1..4], &check[..]);
    assert_eq!(stream_all(&tok, &ids), ["a", "", "", "✓", "", "é", ""]);
    // A control token in the middle of a character emits nothing and does not disturb it;
    // the user-defined token decodes to its text.
    let ids = [
        byte_id(0xE2),
        2,
        byte_id(0x9C),
        0,
        byte_id(0x93),
        toy_id(TOY_USER),
        1,
    ];
    assert_eq!(
        stream_all(&tok, &ids),
        ["", "", "", "", "✓", "<tool>", "", ""]
    );
    // An incomplete character at the end becomes U+FFFD; an id outside the vocabulary
    // produces nothing.
    assert_eq!(
        stream_all(&tok, &[toy_id("a"), byte_id(0xE2), 10_000]),
        ["a", "", "", "\u{fffd}"]
    );
    assert_eq!(tok.token_bytes(toy_id("Ġab")), Some(&b" ab"[..]));
    assert_eq!(tok.token_bytes(0), Some(&b""[..]));
    assert_eq!(tok.token_bytes(10_000), None);
}

#[test]
fn unsupported_tokenizers_are_clear_errors() {
    let err = build(&toy_gguf(Some("qwen2"), None, None)).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::UnsupportedPreTokenizer { name } if name == "qwen2"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "pre-tokenizer \"qwen2\" is not supported yet \
         (supported: smollm, gpt2, gpt-2, llama-bpe, llama3, llama-v3)"
    );

    let err = build(&toy_gguf(None, None, None)).unwrap_err();
    assert!(
        matches!(err, TokenizerError::MissingPreTokenizer),
        "{err:?}"
    );
    assert!(err.to_string().contains("tokenizer.ggml.pre is missing"));

    let mut spm = toy_gguf(Some("default"), None, None);
    spm.metadata[0].1 = MetaValue::String("llama".into());
    let err = build(&spm).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tokenizer model \"llama (SentencePiece)\" is not supported yet \
         (supported: \"gpt2\", byte-level BPE)"
    );
    let mut bert = toy_gguf(Some("default"), None, None);
    bert.metadata[0].1 = MetaValue::String("bert".into());
    assert!(matches!(
        build(&bert).unwrap_err(),
        TokenizerError::UnsupportedModel(m) if m == "bert"
    ));

    // A merge whose result is not in the vocabulary.
    let mut bad = toy_gguf(Some("smollm"), None, None);
    for (key, value) in &mut bad.metadata {
        if key == "tokenizer.ggml.merges" {
            *value = MetaValue::Array(MetaArray::String(vec!["b a".into()]));
        }
    }
    let err = build(&bad).unwrap_err();
    assert!(matches!(err, TokenizerError::Build(_)), "{err:?}");
    assert!(err.to_string().contains("ba"), "{err}");
    let mut bad = toy_gguf(Some("smollm"), None, None);
    for (key, value) in &mut bad.metadata {
        if key == "tokenizer.ggml.merges" {
            *value = MetaValue::Array(MetaArray::String(vec!["ab".into()]));
        }
    }
    let err = build(&bad).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tokenizer.ggml.merges: merge 0 (\"ab\") is not \"left right\""
    );
}

// ---- chat templates ----

/// SmolLM2-135M-Instruct's template, exactly as its GGUF file (and tokenizer_config.json)
/// has it.
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn multi_turn() -> Vec<ChatMessage> {
    vec![
        msg("system", "You are terse."),
        msg("user", "What is 2+2?"),
        msg("assistant", "4."),
        msg("user", "And 3+3?"),
    ]
}

#[test]
fn smollm2_template_renders_chatml() {
    let t = ChatTemplate::new(SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>").unwrap();
    assert_eq!(
        t.render(&multi_turn(), true).unwrap(),
        "<|im_start|>system\nYou are terse.<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n4.<|im_end|>\n\
         <|im_start|>user\nAnd 3+3?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // Without a system message the template supplies its own.
    assert_eq!(
        t.render(&[msg("user", "hi")], true).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nhi<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&[msg("system", "s"), msg("user", "u")], false)
            .unwrap(),
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
    );
    // With a system message and the built-in ChatML, the same text.
    assert_eq!(
        ChatTemplate::chatml("", "")
            .render(&multi_turn(), true)
            .unwrap(),
        t.render(&multi_turn(), true).unwrap()
    );
}

#[test]
fn template_features_of_larger_models() {
    // trim_blocks/lstrip_blocks as transformers sets them, loop controls, bos/eos tokens,
    // Python string methods, filters.
    let source = concat!(
        "{{ bos_token }}\n",
        "{% for m in messages %}\n",
        "    {% if m.role == 'tool' %}{% continue %}{% endif %}\n",
        "[{{ m.role | upper }}] {{ m.content.strip() }}{{ eos_token }}\n",
        "    {% if m.content.startswith('stop') %}{% break %}{% endif %}\n",
        "{% endfor %}\n",
        "{% if add_generation_prompt %}[{{ messages | length }}]{% endif %}",
    );
    let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    let out = t
        .render(
            &[
                msg("user", "  hi  "),
                msg("tool", "x"),
                msg("assistant", "stop here"),
                msg("user", "never"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(out, "<s>\n[USER] hi</s>\n[ASSISTANT] stop here</s>\n[4]");
}

#[test]
fn raise_exception_and_bad_templates_are_errors() {
    let source = "{% for m in messages %}\
        {% if (m.role == 'user') != (loop.index0 % 2 == 0) %}\
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
        {% endif %}{{ m.content }}{% endfor %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    assert_eq!(
        t.render(&[msg("user", "a"), msg("assistant", "b")], true),
        Ok("ab".into())
    );
    let err = t
        .render(&[msg("user", "a"), msg("user", "b")], true)
        .unwrap_err();
    assert_eq!(
        err,
        ChatTemplateError::Raised(
            "Conversation roles must alternate user/assistant/user/assistant/...".into()
        )
    );
    assert_eq!(
        err.to_string(),
        "the model's chat template rejected the messages: \
         Conversation roles must alternate user/assistant/user/assistant/..."
    );

    let err = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
    assert!(matches!(err, ChatTemplateError::Syntax(_)), "{err:?}");
    let t = ChatTemplate::new("{{ messages[0].content.no_such_method() }}", "", "").unwrap();
    let err = t.render(&[msg("user", "a")], true).unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render(_)), "{err:?}");

    // Through the tokenizer: the fallible method reports it, the infallible one falls back to
    // ChatML.
    let tok = build(&toy_gguf(Some("smollm"), None, Some(source))).unwrap();
    let turns = [msg("user", "a"), msg("user", "b")];
    assert!(matches!(
        tok.try_apply_chat_template(&turns),
        Err(ChatTemplateError::Raised(_))
    ));
    assert_eq!(
        tok.apply_chat_template(&turns),
        "<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n"
    );
    // A GGUF whose template does not compile is refused when the tokenizer is built.
    let err = build(&toy_gguf(Some("smollm"), None, Some("{% if %}"))).unwrap_err();
    assert!(matches!(err, TokenizerError::ChatTemplate(_)), "{err:?}");
}

#[test]
fn gguf_template_and_chatml_fallback() {
    let tok = build(&toy_gguf(Some("smollm"), None, Some(SMOLLM2_TEMPLATE))).unwrap();
    assert_eq!(
        tok.try_apply_chat_template(&[msg("user", "hi")]).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    // bos_token/eos_token are the texts of the model's BOS and EOS tokens.
    let tok = build(&toy_gguf(
        Some("smollm"),
        None,
        Some("{{ bos_token }}|{{ eos_token }}"),
    ))
    .unwrap();
    assert_eq!(tok.apply_chat_template(&[]), "<|im_start|>|<|im_end|>");
    let plain = toy("smollm");
    assert_eq!(plain.chat_template().source(), CHATML_TEMPLATE);
    assert_eq!(
        plain.apply_chat_template(&[msg("user", "hi")]),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    // The rendered prompt encodes its markers as single special tokens.
    let ids = plain.encode(&plain.apply_chat_template(&[msg("user", "ab")]), false);
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 2);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
}

// ---- Hugging Face tokenizer.json ----

/// The toy vocabulary as a Hugging Face tokenizer.json with the given pre-tokenizer.
fn toy_tokenizer_json(pre_tokenizer: serde_json::Value) -> String {
    let (tokens, types) = toy_tokens();
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), serde_json::json!(id)))
        .collect();
    let added: Vec<serde_json::Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty != 1)
        .map(|(id, (t, ty))| {
            serde_json::json!({
                "id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *ty == 3
            })
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": TOY_MERGES,
        }
    })
    .to_string()
}

#[test]
fn hugging_face_json_matches_the_gguf_path() {
    // SmolLM2's tokenizer.json pre-tokenizer.
    let smollm_pre = serde_json::json!({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
    ]});
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "chat_template": SMOLLM2_TEMPLATE,
    })
    .to_string();
    let hf =
        BpeTokenizer::from_hf_json(&toy_tokenizer_json(smollm_pre.clone()), Some(&config)).unwrap();
    let gguf = toy("smollm");
    for text in [
        "ab ab",
        "1234 a",
        "é✓ <|im_start|>x<tool>y<|im_end|>",
        "  a\n\tb  ",
        "",
    ] {
        let ids = gguf.encode(text, false);
        assert_eq!(hf.encode(text, false), ids, "{text:?}");
        assert_eq!(
            hf.encode(text, true),
            ids,
            "no post-processor, no BOS: {text:?}"
        );
        assert_eq!(hf.decode(&ids), gguf.decode(&ids));
    }
    assert_eq!(hf.vocab_size(), gguf.vocab_size());
    assert_eq!((hf.bos_token_id(), hf.eos_token_id()), (Some(1), 2));
    assert_eq!(hf.eos_token_ids(), [2, 0]);
    assert!(!hf.adds_bos(), "no post-processor");
    assert_eq!(
        hf.try_apply_chat_template(&[msg("user", "hi")]).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = hf.encode("é✓<|im_end|><tool>", false);
    assert_eq!(stream_all(&hf, &ids).concat(), "é✓<tool>");

    // No config: EOS is the first end-of-turn special token, the template ChatML.
    let bare = BpeTokenizer::from_hf_json(&toy_tokenizer_json(smollm_pre.clone()), None).unwrap();
    assert_eq!(bare.eos_token_id(), 0);
    assert_eq!(bare.eos_token_ids(), [0, 2]);
    assert_eq!(bare.bos_token_id(), None);
    assert_eq!(bare.chat_template().source(), CHATML_TEMPLATE);

    // Templates given as a list of named templates; a post-processor that adds the BOS.
    let mut json: serde_json::Value =
        serde_json::from_str(&toy_tokenizer_json(smollm_pre.clone())).unwrap();
    json["post_processor"] = serde_json::json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}
    });
    let config = serde_json::json!({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "default {{ messages | length }}"}
        ]
    })
    .to_string();
    let tok = BpeTokenizer::from_hf_json(&json.to_string(), Some(&config)).unwrap();
    assert!(tok.adds_bos());
    assert_eq!(tok.encode("ab", true), [1, toy_id("ab")]);
    assert_eq!(tok.encode("ab", false), [toy_id("ab")]);
    assert_eq!(tok.apply_chat_template(&[msg("user", "x")]), "default 1");

    // Not byte-level: refused.
    json["decoder"] = serde_json::json!({"type": "Fuse"});
    let err = BpeTokenizer::from_hf_json(&json.to_string(), None).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedModel(_)),
        "{err:?}"
    );
    let err = BpeTokenizer::from_hf_json("{}", None).unwrap_err();
    assert!(err.to_string().starts_with("tokenizer.json: "), "{err}");
    let err = BpeTokenizer::from_hf_json(
        &toy_tokenizer_json(smollm_pre),
        Some(r#"{"eos_token": "<nope>"}"#),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tokenizer_config.json: eos_token \"<nope>\" is not in the vocabulary"
    );
}

// ---- the default real model, when scripts/fetch-model.sh has cached it ----

/// The cached SmolLM2-135M file, or `None` (skip); see [`cached_model_or_skip`].
fn cached_smollm2() -> Option<std::path::PathBuf> {
    cached_model_or_skip(KNOWN_MODELS[0].name)
}

fn smollm2() -> Option<BpeTokenizer> {
    let path = cached_smollm2()?;
    let file = GgufFile::open(&path).unwrap();
    Some(BpeTokenizer::from_gguf(&file.tokenizer_metadata().unwrap()).unwrap())
}

/// llama.cpp's token ids for fixed strings (scripts/reference/tokenize_strings.py).
#[derive(Debug)]
struct Fixture {
    cases: Vec<(String, Vec<u32>)>,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/smollm2_tokens.json"
    );
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e}; run scripts/reference/tokenize_strings.py"));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["model"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        (json["add_bos"].as_bool(), json["special"].as_bool()),
        (Some(false), Some(true))
    );
    let cases = json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|id| id.as_u64().unwrap() as u32)
                .collect();
            (c["text"].as_str().unwrap().to_string(), ids)
        })
        .collect();
    Fixture { cases }
}

#[test]
fn smollm2_fixture_is_complete() {
    // Runs without the model: the fixture covers what the issue asks for.
    let f = fixture();
    assert!(f.cases.len() >= 15, "{} cases", f.cases.len());
    assert!(f.cases.iter().any(|(t, _)| t.is_empty()));
    assert!(f.cases.iter().any(|(t, _)| t.contains("<|im_start|>")));
    assert!(f.cases.iter().any(|(t, _)| t.contains('\t')));
    assert!(
        f.cases
            .iter()
            .any(|(t, _)| t.chars().any(|c| c > '\u{FFFF}'))
    );
}

#[test]
fn smollm2_matches_llama_cpp_when_cached() {
    let Some(tok) = smollm2() else {
        return;
    };
    assert_eq!(tok.vocab_size(), 49_152);
    assert_eq!((tok.bos_token_id(), tok.eos_token_id()), (Some(1), 2));
    assert_eq!(tok.eos_token_ids(), [2, 0]);
    assert!(!tok.adds_bos(), "SmolLM2's GGUF says add_bos_token = false");
    let f = fixture();
    let mut mismatches = Vec::new();
    for (text, want) in &f.cases {
        let got = tok.encode(text, false);
        if &got != want {
            mismatches.push(format!(
                "{text:?}:\n  ours      {got:?}\n  llama.cpp {want:?}"
            ));
        }
        assert_eq!(tok.encode(text, true), got, "no BOS for SmolLM2: {text:?}");
        if !text.contains("<|") {
            assert_eq!(tok.decode(&got), *text, "decode(encode(s)) == s");
            assert_eq!(stream_all(&tok, &got).concat(), *text, "streamed: {text:?}");
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn smollm2_template_when_cached() {
    let Some(path) = cached_smollm2() else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let meta = file.tokenizer_metadata().unwrap();
    assert_eq!(meta.chat_template, Some(SMOLLM2_TEMPLATE));
    let tok = BpeTokenizer::from_gguf(&meta).unwrap();
    let prompt = tok.try_apply_chat_template(&multi_turn()).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are terse.<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n4.<|im_end|>\n\
         <|im_start|>user\nAnd 3+3?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let ids = tok.encode(&prompt, false);
    assert_eq!(
        ids.iter().filter(|&&i| i == 1).count(),
        5,
        "five <|im_start|>"
    );
    assert_eq!(
        ids.iter().filter(|&&i| i == 2).count(),
        4,
        "four <|im_end|>"
    );
    assert_eq!(
        &ids[..3],
        [
            1,
            tok.token_to_id("system").unwrap(),
            tok.token_to_id("Ċ").unwrap()
        ]
    );
    // The special tokens produce no text when streamed back.
    assert_eq!(
        stream_all(&tok, &ids).concat(),
        "system\nYou are terse.\nuser\nWhat is 2+2?\nassistant\n4.\nuser\nAnd 3+3?\nassistant\n"
    );
}
