//! Splits a template into text and the tokens of its actions, applying the `{{-` and `-}}`
//! whitespace trimming and dropping `{{/* comments */}}`, as Go's text/template lexer does.

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// Text between actions (already trimmed).
    Text(String),
    /// `{{`.
    Left,
    /// `}}`.
    Right,
    /// A keyword or function name.
    Ident(String),
    /// `.Name` (the name without the dot).
    Field(String),
    /// `.` alone.
    Dot,
    /// `$` or `$name`, with the `$`.
    Var(String),
    /// A quoted or raw string, unescaped.
    Str(String),
    /// A number literal as written.
    Num(String),
    /// A character constant (`'a'`), as its code point.
    Char(i64),
    /// `(`.
    LParen,
    /// `)`.
    RParen,
    /// `|`.
    Pipe,
    /// `:=`.
    Declare,
    /// `=`.
    Assign,
    /// `,`.
    Comma,
    /// The end of the template.
    Eof,
}

/// A token with where it is.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub tok: Tok,
    /// 1-based line of its first character.
    pub line: usize,
    /// Whether whitespace separates it from the previous token of the same action.
    pub space_before: bool,
}

/// A lexing error: line and message.
pub(crate) type LexError = (usize, String);

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_alnum(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    line: usize,
    out: Vec<Token>,
}

/// Tokenizes `src`.
pub(crate) fn lex(src: &str) -> Result<Vec<Token>, LexError> {
    let mut l = Lexer {
        src,
        pos: 0,
        line: 1,
        out: Vec::new(),
    };
    let mut trim_next = false;
    loop {
        let rest = &src[l.pos..];
        let start = rest.find("{{").map_or(src.len(), |i| l.pos + i);
        let after = &src[start.min(src.len())..];
        let trim_left = after.starts_with("{{-") && after[3..].starts_with(is_space);
        let mut text = &src[l.pos..start];
        if trim_next {
            text = text.trim_start_matches(is_space);
        }
        if trim_left {
            text = text.trim_end_matches(is_space);
        }
        if !text.is_empty() {
            // The text's line is where it starts after trimming.
            let skipped =
                src[l.pos..start].len() - src[l.pos..start].trim_start_matches(is_space).len();
            let skipped_lines = if trim_next {
                src[l.pos..l.pos + skipped].matches('\n').count()
            } else {
                0
            };
            l.out.push(Token {
                tok: Tok::Text(text.to_string()),
                line: l.line + skipped_lines,
                space_before: false,
            });
        }
        l.line += src[l.pos..start].matches('\n').count();
        if start >= src.len() {
            l.out.push(Token {
                tok: Tok::Eof,
                line: l.line,
                space_before: false,
            });
            return Ok(l.out);
        }
        let action_line = l.line;
        l.pos = start + 2;
        if trim_left {
            l.pos += 2;
        }
        trim_next = l.action(action_line)?;
    }
}

impl Lexer<'_> {
    fn push(&mut self, tok: Tok, line: usize, space_before: bool) {
        self.out.push(Token {
            tok,
            line,
            space_before,
        });
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// At `}}` or ` -}}` (whitespace before the dash): its length and whether it trims.
    fn at_right(&self) -> Option<(usize, bool)> {
        let rest = &self.src[self.pos..];
        if rest.starts_with("}}") {
            return Some((2, false));
        }
        let mut chars = rest.char_indices();
        if let Some((_, c)) = chars.next()
            && is_space(c)
            && rest[c.len_utf8()..].starts_with("-}}")
        {
            return Some((c.len_utf8() + 3, true));
        }
        None
    }

    /// Lexes one action after its `{{`; returns whether its end trims the next text.
    fn action(&mut self, start_line: usize) -> Result<bool, LexError> {
        // A comment is the whole action: `{{/* … */}}`, with optional trim markers.
        if self.src[self.pos..].starts_with("/*") {
            let Some(end) = self.src[self.pos + 2..].find("*/") else {
                return Err((start_line, "unclosed comment".into()));
            };
            let body_end = self.pos + 2 + end + 2;
            self.line += self.src[self.pos..body_end].matches('\n').count();
            self.pos = body_end;
            return match self.at_right() {
                Some((len, trim)) => {
                    self.pos += len;
                    Ok(trim)
                }
                None => Err((self.line, "comment ends before closing delimiter".into())),
            };
        }
        self.push(Tok::Left, start_line, false);
        let mut space = false;
        loop {
            if let Some((len, trim)) = self.at_right() {
                let line = self.line;
                self.line += self.src[self.pos..self.pos + len].matches('\n').count();
                self.pos += len;
                self.push(Tok::Right, line, space);
                return Ok(trim);
            }
            let line = self.line;
            let Some(c) = self.peek() else {
                return Err((start_line, "unclosed action".into()));
            };
            if is_space(c) {
                self.bump();
                space = true;
                continue;
            }
            if self.src[self.pos..].starts_with("{{") {
                return Err((
                    line,
                    "unclosed action (a new action starts inside it)".into(),
                ));
            }
            let tok = match c {
                '(' => {
                    self.bump();
                    Tok::LParen
                }
                ')' => {
                    self.bump();
                    Tok::RParen
                }
                '|' => {
                    self.bump();
                    Tok::Pipe
                }
                ',' => {
                    self.bump();
                    Tok::Comma
                }
                '=' => {
                    self.bump();
                    Tok::Assign
                }
                ':' => {
                    self.bump();
                    if self.peek() != Some('=') {
                        return Err((line, "expected :=".into()));
                    }
                    self.bump();
                    Tok::Declare
                }
                '"' => Tok::Str(self.quoted(start_line)?),
                '`' => Tok::Str(self.raw(start_line)?),
                '\'' => Tok::Char(self.char_const()?),
                '$' => {
                    self.bump();
                    let name = self.word();
                    Tok::Var(format!("${name}"))
                }
                '.' => {
                    let next = self.src[self.pos + 1..].chars().next();
                    match next {
                        Some(d) if d.is_ascii_digit() => Tok::Num(self.number()?),
                        Some(n) if is_alnum(n) => {
                            self.bump();
                            Tok::Field(self.word())
                        }
                        _ => {
                            self.bump();
                            Tok::Dot
                        }
                    }
                }
                '+' | '-' | '0'..='9' => Tok::Num(self.number()?),
                c if is_alnum(c) => Tok::Ident(self.word()),
                c => return Err((line, format!("unexpected {c:?} in action"))),
            };
            self.push(tok, line, space);
            space = false;
        }
    }

    fn word(&mut self) -> String {
        let start = self.pos;
        while self.peek().is_some_and(is_alnum) {
            self.bump();
        }
        self.src[start..self.pos].to_string()
    }

    fn number(&mut self) -> Result<String, LexError> {
        let line = self.line;
        let start = self.pos;
        if matches!(self.peek(), Some('+' | '-')) {
            self.bump();
        }
        let digits_start = self.pos;
        while let Some(c) = self.peek() {
            let prev = self.src[..self.pos].chars().next_back();
            let exp_sign =
                matches!(c, '+' | '-') && matches!(prev, Some('e' | 'E' | 'p' | 'P')) && {
                    // Only an exponent's sign, not a hex digit 'e' in 0x1e-2 (Go rejects that).
                    !self.src[digits_start..].starts_with("0x")
                        && !self.src[digits_start..].starts_with("0X")
                };
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || exp_sign {
                self.bump();
            } else {
                break;
            }
        }
        let text = &self.src[start..self.pos];
        if self.pos == digits_start || parse_number(text).is_none() {
            return Err((line, format!("bad number syntax: {text:?}")));
        }
        Ok(text.to_string())
    }

    fn quoted(&mut self, start_line: usize) -> Result<String, LexError> {
        self.bump();
        let mut out = String::new();
        loop {
            let line = self.line;
            match self.bump() {
                None | Some('\n') => {
                    return Err((start_line, "unterminated quoted string".into()));
                }
                Some('"') => return Ok(out),
                Some('\\') => {
                    let c = self
                        .bump()
                        .ok_or((line, "unterminated quoted string".into()))?;
                    match c {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'a' => out.push('\u{7}'),
                        'b' => out.push('\u{8}'),
                        'f' => out.push('\u{c}'),
                        'v' => out.push('\u{b}'),
                        '\\' => out.push('\\'),
                        '"' => out.push('"'),
                        '\'' => out.push('\''),
                        'x' => out.push(self.hex_escape(2, line)?),
                        'u' => out.push(self.hex_escape(4, line)?),
                        'U' => out.push(self.hex_escape(8, line)?),
                        '0'..='7' => {
                            let mut v = c.to_digit(8).unwrap_or(0);
                            for _ in 0..2 {
                                let d = self
                                    .bump()
                                    .and_then(|d| d.to_digit(8))
                                    .ok_or((line, "invalid octal escape".into()))?;
                                v = v * 8 + d;
                            }
                            out.push(
                                char::from_u32(v).ok_or((line, "invalid octal escape".into()))?,
                            );
                        }
                        c => return Err((line, format!("unknown escape sequence \\{c}"))),
                    }
                }
                Some(c) => out.push(c),
            }
        }
    }

    fn hex_escape(&mut self, n: usize, line: usize) -> Result<char, LexError> {
        let mut v = 0u32;
        for _ in 0..n {
            let d = self
                .bump()
                .and_then(|d| d.to_digit(16))
                .ok_or((line, "invalid hex escape".into()))?;
            v = v * 16 + d;
        }
        char::from_u32(v).ok_or((line, "escape is not a valid character".into()))
    }

    fn raw(&mut self, start_line: usize) -> Result<String, LexError> {
        self.bump();
        let start = self.pos;
        let Some(end) = self.src[start..].find('`') else {
            return Err((start_line, "unterminated raw quoted string".into()));
        };
        let s = self.src[start..start + end].to_string();
        self.line += s.matches('\n').count();
        self.pos = start + end + 1;
        Ok(s)
    }

    fn char_const(&mut self) -> Result<i64, LexError> {
        let line = self.line;
        self.bump();
        let c = match self.bump() {
            Some('\\') => match self.bump() {
                Some('n') => '\n',
                Some('t') => '\t',
                Some('\\') => '\\',
                Some('\'') => '\'',
                _ => return Err((line, "unsupported escape in character constant".into())),
            },
            Some(c) if c != '\n' && c != '\'' => c,
            _ => return Err((line, "bad character constant".into())),
        };
        if self.bump() != Some('\'') {
            return Err((line, "unterminated character constant".into()));
        }
        Ok(c as i64)
    }
}

/// A number literal's value: an integer when it is one (decimal, 0x, 0o, 0b or leading-0
/// octal, underscores allowed), else a float.
pub(crate) fn parse_number(text: &str) -> Option<crate::Value> {
    let (neg, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let clean = body.replace('_', "");
    let lower = clean.to_ascii_lowercase();
    let int = if let Some(h) = lower.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = lower.strip_prefix("0o") {
        i64::from_str_radix(o, 8).ok()
    } else if let Some(b) = lower.strip_prefix("0b") {
        i64::from_str_radix(b, 2).ok()
    } else if lower.len() > 1 && lower.starts_with('0') && lower.bytes().all(|b| b.is_ascii_digit())
    {
        i64::from_str_radix(&lower[1..], 8).ok()
    } else if !lower.is_empty() && lower.bytes().all(|b| b.is_ascii_digit()) {
        lower.parse::<i64>().ok()
    } else {
        None
    };
    if let Some(i) = int {
        return Some(crate::Value::Int(if neg { -i } else { i }));
    }
    let valid_float = !lower.is_empty()
        && lower
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'+' | b'-'))
        && lower.bytes().any(|b| b.is_ascii_digit());
    if !valid_float {
        return None;
    }
    let f: f64 = lower.parse().ok()?;
    Some(crate::Value::Float(if neg { -f } else { f }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(src: &str) -> Vec<Tok> {
        lex(src).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn trim_markers_remove_whitespace_on_their_side_only() {
        assert_eq!(
            toks("a  \n{{- 1 -}}\n  b {{2}} c"),
            vec![
                Tok::Text("a".into()),
                Tok::Left,
                Tok::Num("1".into()),
                Tok::Right,
                Tok::Text("b ".into()),
                Tok::Left,
                Tok::Num("2".into()),
                Tok::Right,
                Tok::Text(" c".into()),
                Tok::Eof,
            ]
        );
        // `{{-3}}` is the number -3, not a trim marker.
        assert_eq!(toks("x {{-3}}")[2], Tok::Num("-3".into()));
    }

    #[test]
    fn comments_vanish_and_may_trim() {
        assert_eq!(
            toks("a \n{{- /* a comment\n over lines */ -}}\n b"),
            vec![Tok::Text("a".into()), Tok::Text("b".into()), Tok::Eof]
        );
        assert!(lex("{{/* open").is_err());
        assert!(lex("{{/* x */ 1}}").is_err());
    }

    #[test]
    fn action_tokens() {
        assert_eq!(
            toks(r#"{{ $x := .Values.a | printf "%s\n" `raw` (len $) 'a' 0x1F 1.5e3 }}"#),
            vec![
                Tok::Left,
                Tok::Var("$x".into()),
                Tok::Declare,
                Tok::Field("Values".into()),
                Tok::Field("a".into()),
                Tok::Pipe,
                Tok::Ident("printf".into()),
                Tok::Str("%s\n".into()),
                Tok::Str("raw".into()),
                Tok::LParen,
                Tok::Ident("len".into()),
                Tok::Var("$".into()),
                Tok::RParen,
                Tok::Char(97),
                Tok::Num("0x1F".into()),
                Tok::Num("1.5e3".into()),
                Tok::Right,
                Tok::Eof,
            ]
        );
    }

    #[test]
    fn lines_are_counted() {
        let t = lex("a\nb\n{{ 1 }}\n\n{{\n2 }}").unwrap();
        let lines: Vec<_> = t
            .iter()
            .filter(|t| matches!(t.tok, Tok::Num(_)))
            .map(|t| t.line)
            .collect();
        assert_eq!(lines, [3, 6]);
    }

    #[test]
    fn unclosed_things_are_errors() {
        assert_eq!(lex("a\n{{ .x").unwrap_err(), (2, "unclosed action".into()));
        assert!(lex(r#"{{ "abc }}"#).is_err());
        assert!(lex("{{ 1x }}").is_err());
        assert!(lex("{{ # }}").is_err());
        assert!(lex("{{ .a {{ .b }}").is_err());
    }
}
