//! Builds the tree of a template from its tokens: text, actions, `if`/`with`/`range`
//! (with `else`, `else if`, `else with`), `define`, `template`, `block`, `break` and
//! `continue`. Variables are checked as Go's parser does: using one that no enclosing
//! scope declared is an error even in a branch that never runs, and so is calling a
//! function that does not exist.

use crate::Value;
use crate::funcs;
use crate::lex::{Tok, Token, lex, parse_number};

/// A parsed template body.
pub(crate) type List = Vec<Node>;

/// One node of a template.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Text(String),
    /// `{{ pipeline }}`: prints its value unless it declares or assigns variables.
    Action(Pipe),
    /// `if`/`with`: the branches in order (`else if`/`else with` add one), then `else`.
    If {
        with: bool,
        branches: Vec<(Pipe, List)>,
        otherwise: Option<List>,
    },
    Range {
        pipe: Pipe,
        /// `$i, $v :=` (both), `$v :=` (value only), or none.
        key: Option<String>,
        value: Option<String>,
        /// `:=` declares them for the body; `=` assigns variables declared outside.
        declare: bool,
        body: List,
        otherwise: Option<List>,
    },
    Template {
        line: usize,
        name: String,
        pipe: Option<Pipe>,
    },
    Break,
    Continue,
}

/// A pipeline: commands joined by `|`, optionally declaring or assigning variables.
#[derive(Debug, Clone)]
pub(crate) struct Pipe {
    pub line: usize,
    /// Variables set by the pipeline, and whether they are declared (`:=`) or assigned.
    pub vars: Vec<String>,
    pub declare: bool,
    pub cmds: Vec<Cmd>,
}

/// One command: an operand or a function call with arguments.
#[derive(Debug, Clone)]
pub(crate) struct Cmd {
    pub line: usize,
    pub args: Vec<Operand>,
}

/// An argument or the head of a command.
#[derive(Debug, Clone)]
pub(crate) enum Operand {
    Dot,
    Literal(Value),
    /// `.a.b`: fields of dot.
    Field(Vec<String>),
    /// `$x.a.b`.
    Var(String, Vec<String>),
    /// A function name.
    Func(String),
    /// `(pipeline).a.b`.
    Sub(Box<Pipe>, Vec<String>),
}

/// What a parse produced: the named templates (each `define` and `block`) and the body.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub body: List,
    pub defines: Vec<(String, List)>,
}

/// A parse error: line and message.
pub(crate) type ParseError = (usize, String);

/// How deep controls and parentheses may nest.
const MAX_DEPTH: usize = 100;

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    vars: Vec<String>,
    depth: usize,
    in_range: usize,
    defines: Vec<(String, List)>,
}

/// How a list of nodes ended.
enum Stop {
    Eof,
    End(usize),
    Else(usize),
}

/// Parses a template source.
pub(crate) fn parse(src: &str) -> Result<Parsed, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks,
        pos: 0,
        vars: vec!["$".into()],
        depth: 0,
        in_range: 0,
        defines: Vec::new(),
    };
    let (body, end) = p.list(true)?;
    match end {
        Stop::Eof => Ok(Parsed {
            body,
            defines: p.defines,
        }),
        Stop::End(line) => Err((line, "unexpected {{end}}".into())),
        Stop::Else(line) => Err((line, "unexpected {{else}}".into())),
    }
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn peek_at(&self, n: usize) -> &Tok {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].tok
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn expect_right(&mut self, context: &str) -> Result<(), ParseError> {
        let t = self.next();
        match t.tok {
            Tok::Right => Ok(()),
            other => Err((
                t.line,
                format!("unexpected {} in {context}", describe(&other)),
            )),
        }
    }

    fn enter(&mut self, line: usize) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err((line, "template nests too deeply".into()));
        }
        Ok(())
    }

    /// Nodes up to `{{end}}`, `{{else…` (left unconsumed after `else`) or the end.
    fn list(&mut self, top: bool) -> Result<(List, Stop), ParseError> {
        let mut nodes = Vec::new();
        loop {
            let t = self.next();
            match t.tok {
                Tok::Text(s) => nodes.push(Node::Text(s)),
                Tok::Eof => return Ok((nodes, Stop::Eof)),
                Tok::Left => {
                    let head = self.peek().clone();
                    match &head.tok {
                        Tok::Ident(k) if k == "end" => {
                            self.next();
                            self.expect_right("{{end}}")?;
                            return Ok((nodes, Stop::End(head.line)));
                        }
                        Tok::Ident(k) if k == "else" => {
                            self.next();
                            return Ok((nodes, Stop::Else(head.line)));
                        }
                        Tok::Ident(k) if k == "if" || k == "with" => {
                            self.next();
                            let with = k == "with";
                            nodes.push(self.if_with(with, head.line)?);
                        }
                        Tok::Ident(k) if k == "range" => {
                            self.next();
                            nodes.push(self.range(head.line)?);
                        }
                        Tok::Ident(k) if k == "define" => {
                            self.next();
                            if !top || self.depth > 0 {
                                return Err((head.line, "{{define}} inside a control".into()));
                            }
                            let name = self.template_name("define")?;
                            self.expect_right("{{define}}")?;
                            let body = self.named_body(head.line, "define")?;
                            self.defines.push((name, body));
                        }
                        Tok::Ident(k) if k == "block" => {
                            self.next();
                            let name = self.template_name("block")?;
                            let pipe = self.pipeline("block", false)?;
                            self.expect_right("{{block}}")?;
                            let body = self.named_body(head.line, "block")?;
                            self.defines.push((name.clone(), body));
                            nodes.push(Node::Template {
                                line: head.line,
                                name,
                                pipe: Some(pipe),
                            });
                        }
                        Tok::Ident(k) if k == "template" => {
                            self.next();
                            let name = self.template_name("template")?;
                            let pipe = if self.peek().tok == Tok::Right {
                                None
                            } else {
                                Some(self.pipeline("template", false)?)
                            };
                            self.expect_right("{{template}}")?;
                            nodes.push(Node::Template {
                                line: head.line,
                                name,
                                pipe,
                            });
                        }
                        Tok::Ident(k) if k == "break" || k == "continue" => {
                            self.next();
                            if self.in_range == 0 {
                                return Err((
                                    head.line,
                                    format!("{{{{{k}}}}} outside {{{{range}}}}"),
                                ));
                            }
                            self.expect_right(k)?;
                            nodes.push(if k == "break" {
                                Node::Break
                            } else {
                                Node::Continue
                            });
                        }
                        _ => {
                            let pipe = self.pipeline("command", true)?;
                            self.expect_right("command")?;
                            nodes.push(Node::Action(pipe));
                        }
                    }
                }
                other => {
                    return Err((t.line, format!("unexpected {}", describe(&other))));
                }
            }
        }
    }

    /// The body of a `define` or `block` up to its `{{end}}`, with its own variables.
    fn named_body(&mut self, line: usize, what: &str) -> Result<List, ParseError> {
        let saved = std::mem::replace(&mut self.vars, vec!["$".into()]);
        let saved_range = std::mem::take(&mut self.in_range);
        self.enter(line)?;
        let (body, end) = self.list(false)?;
        self.depth -= 1;
        self.vars = saved;
        self.in_range = saved_range;
        match end {
            Stop::End(_) => Ok(body),
            Stop::Else(l) => Err((l, format!("unexpected {{{{else}}}} in {{{{{what}}}}}"))),
            Stop::Eof => Err((
                line,
                format!("unexpected EOF: {{{{{what}}}}} started here has no {{{{end}}}}"),
            )),
        }
    }

    fn template_name(&mut self, what: &str) -> Result<String, ParseError> {
        let t = self.next();
        match t.tok {
            Tok::Str(s) => Ok(s),
            other => Err((
                t.line,
                format!(
                    "unexpected {} in {{{{{what}}}}}: expected a quoted name",
                    describe(&other)
                ),
            )),
        }
    }

    fn if_with(&mut self, with: bool, line: usize) -> Result<Node, ParseError> {
        let what = if with { "with" } else { "if" };
        self.enter(line)?;
        let mark = self.vars.len();
        let mut branches = Vec::new();
        let mut pipe = self.pipeline(what, true)?;
        self.expect_right(what)?;
        let otherwise = loop {
            let (body, end) = self.list(false)?;
            branches.push((pipe, body));
            match end {
                Stop::End(_) => break None,
                Stop::Eof => {
                    return Err((
                        line,
                        format!("unexpected EOF: {{{{{what}}}}} started here has no {{{{end}}}}"),
                    ));
                }
                Stop::Else(else_line) => {
                    if matches!(self.peek().tok, Tok::Ident(ref k) if k == what) {
                        self.next();
                        pipe = self.pipeline(what, true)?;
                        self.expect_right(what)?;
                        continue;
                    }
                    self.expect_right("{{else}}")?;
                    let (body, end) = self.list(false)?;
                    match end {
                        Stop::End(_) => break Some(body),
                        Stop::Else(l) => {
                            return Err((l, format!("a second {{{{else}}}} in {{{{{what}}}}}")));
                        }
                        Stop::Eof => {
                            return Err((
                                else_line,
                                format!(
                                    "unexpected EOF: {{{{{what}}}}} started at line {line} has no {{{{end}}}}"
                                ),
                            ));
                        }
                    }
                }
            }
        };
        self.vars.truncate(mark);
        self.depth -= 1;
        Ok(Node::If {
            with,
            branches,
            otherwise,
        })
    }

    fn range(&mut self, line: usize) -> Result<Node, ParseError> {
        self.enter(line)?;
        let mark = self.vars.len();
        // `$v :=` or `$k, $v :=` (also `=`, assigning existing variables).
        let (mut key, mut value) = (None, None);
        let mut declare = true;
        match (self.peek_at(0).clone(), self.peek_at(1).clone()) {
            (Tok::Var(v), Tok::Declare | Tok::Assign) => {
                declare = *self.peek_at(1) == Tok::Declare;
                self.pos += 2;
                value = Some(v);
            }
            (Tok::Var(k), Tok::Comma) => {
                let (Tok::Var(v), Tok::Declare | Tok::Assign) =
                    (self.peek_at(2).clone(), self.peek_at(3).clone())
                else {
                    return Err((line, "range can only declare `$k, $v :=`".into()));
                };
                declare = *self.peek_at(3) == Tok::Declare;
                self.pos += 4;
                key = Some(k);
                value = Some(v);
            }
            _ => {}
        }
        let pipe = self.pipeline("range", false)?;
        self.expect_right("range")?;
        for v in key.iter().chain(value.iter()) {
            if declare {
                self.vars.push(v.clone());
            } else if !self.vars.contains(v) {
                return Err((line, format!("undefined variable {v:?}")));
            }
        }
        self.in_range += 1;
        let (body, end) = self.list(false)?;
        self.in_range -= 1;
        let otherwise = match end {
            Stop::End(_) => None,
            Stop::Eof => {
                return Err((
                    line,
                    "unexpected EOF: {{range}} started here has no {{end}}".into(),
                ));
            }
            Stop::Else(_) => {
                self.expect_right("{{else}}")?;
                let (body, end) = self.list(false)?;
                match end {
                    Stop::End(_) => Some(body),
                    Stop::Else(l) => return Err((l, "a second {{else}} in {{range}}".into())),
                    Stop::Eof => {
                        return Err((
                            line,
                            "unexpected EOF: {{range}} started here has no {{end}}".into(),
                        ));
                    }
                }
            }
        };
        self.vars.truncate(mark);
        self.depth -= 1;
        Ok(Node::Range {
            pipe,
            key,
            value,
            declare,
            body,
            otherwise,
        })
    }

    /// A pipeline up to (not including) `}}` or `)`.
    fn pipeline(&mut self, context: &str, allow_decl: bool) -> Result<Pipe, ParseError> {
        let line = self.peek().line;
        let mut vars = Vec::new();
        let mut declare = false;
        if let (Tok::Var(v), Tok::Declare | Tok::Assign) = (self.peek_at(0), self.peek_at(1)) {
            if !allow_decl {
                return Err((line, format!("cannot declare a variable in {context}")));
            }
            declare = *self.peek_at(1) == Tok::Declare;
            vars.push(v.clone());
            self.pos += 2;
        }
        let mut cmds = Vec::new();
        loop {
            let cmd = self.command()?;
            if cmd.args.is_empty() {
                return Err((self.peek().line, format!("missing value for {context}")));
            }
            cmds.push(cmd);
            if self.peek().tok == Tok::Pipe {
                self.next();
                continue;
            }
            break;
        }
        for v in &vars {
            if declare {
                self.vars.push(v.clone());
            } else if !self.vars.contains(v) {
                return Err((line, format!("undefined variable {v:?}")));
            }
        }
        for (i, c) in cmds.iter().enumerate() {
            if let Some(Operand::Literal(Value::Nil)) = c.args.first()
                && (c.args.len() == 1 || i > 0)
            {
                return Err((c.line, "nil is not a command".into()));
            }
            if i > 0 && !matches!(c.args[0], Operand::Func(_)) && !is_method_like(&c.args[0]) {
                return Err((c.line, "non executable command in pipeline stage".into()));
            }
        }
        Ok(Pipe {
            line,
            vars,
            declare,
            cmds,
        })
    }

    fn command(&mut self) -> Result<Cmd, ParseError> {
        let line = self.peek().line;
        let mut args = Vec::new();
        loop {
            match self.peek().tok {
                Tok::Right | Tok::RParen | Tok::Pipe | Tok::Eof => break,
                _ => {}
            }
            let t = self.peek().clone();
            if !args.is_empty() && !t.space_before {
                return Err((t.line, format!("missing space before {}", describe(&t.tok))));
            }
            args.push(self.operand()?);
        }
        Ok(Cmd { line, args })
    }

    fn operand(&mut self) -> Result<Operand, ParseError> {
        let t = self.next();
        let term = match t.tok {
            Tok::Dot => Operand::Dot,
            Tok::Field(f) => {
                let mut chain = vec![f];
                self.chain(&mut chain);
                return Ok(Operand::Field(chain));
            }
            Tok::Var(v) => {
                if !self.vars.contains(&v) {
                    return Err((t.line, format!("undefined variable {v:?}")));
                }
                let mut chain = Vec::new();
                self.chain(&mut chain);
                return Ok(Operand::Var(v, chain));
            }
            Tok::Str(s) => Operand::Literal(Value::Str(s)),
            Tok::Char(c) => Operand::Literal(Value::Int(c)),
            Tok::Num(n) => Operand::Literal(
                parse_number(&n).ok_or((t.line, format!("bad number syntax: {n:?}")))?,
            ),
            Tok::Ident(i) => match i.as_str() {
                "true" => Operand::Literal(Value::Bool(true)),
                "false" => Operand::Literal(Value::Bool(false)),
                "nil" => Operand::Literal(Value::Nil),
                "if" | "else" | "end" | "range" | "with" | "define" | "template" | "block"
                | "break" | "continue" => {
                    return Err((t.line, format!("unexpected keyword {i:?} in operand")));
                }
                _ if funcs::exists(&i) => Operand::Func(i),
                _ => return Err((t.line, format!("function {i:?} not defined"))),
            },
            Tok::LParen => {
                self.enter(t.line)?;
                let pipe = self.pipeline("parenthesized pipeline", true)?;
                self.depth -= 1;
                let close = self.next();
                if close.tok != Tok::RParen {
                    return Err((
                        close.line,
                        format!("unclosed left paren: found {}", describe(&close.tok)),
                    ));
                }
                let mut chain = Vec::new();
                self.chain(&mut chain);
                return Ok(Operand::Sub(Box::new(pipe), chain));
            }
            other => {
                return Err((
                    t.line,
                    format!("unexpected {} in operand", describe(&other)),
                ));
            }
        };
        if let Tok::Field(_) = self.peek().tok
            && !self.peek().space_before
        {
            return Err((self.peek().line, "unexpected . after term".into()));
        }
        Ok(term)
    }

    /// Field names directly following (no space) the current term.
    fn chain(&mut self, chain: &mut Vec<String>) {
        while let Tok::Field(f) = &self.peek().tok {
            if self.peek().space_before {
                break;
            }
            chain.push(f.clone());
            self.next();
        }
    }
}

/// Whether an operand can take piped input (a field chain may end in a method).
fn is_method_like(op: &Operand) -> bool {
    match op {
        Operand::Field(_) => true,
        Operand::Var(_, chain) | Operand::Sub(_, chain) => !chain.is_empty(),
        _ => false,
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Text(_) => "text".into(),
        Tok::Left => "\"{{\"".into(),
        Tok::Right => "\"}}\"".into(),
        Tok::Ident(i) => format!("{i:?}"),
        Tok::Field(f) => format!("\".{f}\""),
        Tok::Dot => "\".\"".into(),
        Tok::Var(v) => format!("{v:?}"),
        Tok::Str(s) => format!("{s:?}"),
        Tok::Num(n) => n.clone(),
        Tok::Char(_) => "character constant".into(),
        Tok::LParen => "\"(\"".into(),
        Tok::RParen => "\")\"".into(),
        Tok::Pipe => "\"|\"".into(),
        Tok::Declare => "\":=\"".into(),
        Tok::Assign => "\"=\"".into(),
        Tok::Comma => "\",\"".into(),
        Tok::Eof => "end of template".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(src: &str) -> ParseError {
        parse(src).expect_err(src)
    }

    #[test]
    fn structures_parse() {
        let p = parse(
            r#"{{ define "a" }}x{{ end }}{{ if .a }}1{{ else if .b }}2{{ else }}3{{ end }}{{ range $i, $v := .l }}{{ $i }}{{ else }}none{{ end }}{{ with $x := .c }}{{ $x }}{{ end }}"#,
        )
        .unwrap();
        assert_eq!(p.defines.len(), 1);
        assert_eq!(p.body.len(), 3);
        match &p.body[0] {
            Node::If {
                with: false,
                branches,
                otherwise: Some(_),
            } => assert_eq!(branches.len(), 2),
            n => panic!("{n:?}"),
        }
    }

    #[test]
    fn structural_errors_name_the_line() {
        assert_eq!(
            err("a\n{{ if .x }}b"),
            (
                2,
                "unexpected EOF: {{if}} started here has no {{end}}".into()
            )
        );
        assert_eq!(err("{{ end }}").1, "unexpected {{end}}");
        assert_eq!(err("{{ else }}").1, "unexpected {{else}}");
        assert_eq!(
            err("\n{{ nope 1 }}"),
            (2, "function \"nope\" not defined".into())
        );
        assert_eq!(err("{{ $x }}").1, "undefined variable \"$x\"");
        assert_eq!(
            err("{{ if 1 }}{{ $x := 1 }}{{ end }}{{ $x }}").1,
            "undefined variable \"$x\""
        );
        assert_eq!(err("{{ $x = 1 }}").1, "undefined variable \"$x\"");
        assert!(err("{{ (1 }}").1.starts_with("unclosed left paren"));
        assert_eq!(err("{{ }}").1, "missing value for command");
        assert_eq!(err("{{ break }}").1, "{{break}} outside {{range}}");
        assert_eq!(
            err("{{ if 1 }}{{ define \"x\" }}{{ end }}{{ end }}").1,
            "{{define}} inside a control"
        );
        assert_eq!(
            err("{{ template .x }}").1,
            "unexpected \".x\" in {{template}}: expected a quoted name"
        );
        assert_eq!(err("{{ nil }}").1, "nil is not a command");
        assert_eq!(
            err("{{ 1 | 2 }}").1,
            "non executable command in pipeline stage"
        );
        assert!(
            err("{{ if 1 }}{{ else }}{{ else }}{{ end }}")
                .1
                .contains("second {{else}}")
        );
        let deep = "{{ if 1 }}".repeat(200);
        assert_eq!(err(&deep).1, "template nests too deeply");
        let parens = format!("{{{{ {}1{} }}}}", "(".repeat(300), ")".repeat(300));
        assert_eq!(err(&parens).1, "template nests too deeply");
    }

    #[test]
    fn variables_are_scoped_to_their_control() {
        parse("{{ $x := 1 }}{{ if 1 }}{{ $x = 2 }}{{ $y := 3 }}{{ $y }}{{ end }}{{ $x }}").unwrap();
        parse("{{ range $k, $v := . }}{{ $k }}{{ $v }}{{ end }}").unwrap();
        assert!(parse("{{ range $v := . }}{{ end }}{{ $v }}").is_err());
        assert!(parse("{{ $x := 1 }}{{ define \"d\" }}{{ $x }}{{ end }}").is_err());
    }
}
