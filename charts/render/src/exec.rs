//! Executes parsed templates: a set of named templates (files and `define`s) sharing one
//! namespace, as Helm parses every file of a chart into one Go template set.

use std::collections::HashMap;
use std::sync::Arc;

use crate::Error;
use crate::Value;
use crate::funcs::{self, FuncError};
use crate::parse::{self, Cmd, List, Node, Operand, Pipe};

/// How many template calls (`template`, `include`) may nest before execution stops: a
/// template that includes itself ends with an error, not a stack overflow.
pub const MAX_CALL_DEPTH: usize = 100;

/// The most iterations of a `range` over an integer.
pub const MAX_RANGE: i64 = 1 << 24;

/// Stack size of the thread a render runs on: deep includes and expressions recurse.
const STACK: usize = 64 << 20;

#[derive(Debug, Clone)]
struct Named {
    /// The file the template is written in (for messages).
    source: String,
    body: Arc<List>,
}

/// A set of templates: each added source under its own name, plus every `define` and
/// `block` in it. A later definition of a name replaces an earlier one.
#[derive(Debug, Clone, Default)]
pub struct Templates {
    named: HashMap<String, Named>,
}

impl Templates {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `source` as template `name` and adds it and its `define`s to the set.
    pub fn add(&mut self, name: &str, source: &str) -> Result<(), Error> {
        let parsed = parse::parse(source).map_err(|(line, message)| Error::Parse {
            template: name.to_string(),
            line,
            message,
        })?;
        for (define, body) in parsed.defines {
            self.named.insert(
                define,
                Named {
                    source: name.to_string(),
                    body: Arc::new(body),
                },
            );
        }
        self.named.insert(
            name.to_string(),
            Named {
                source: name.to_string(),
                body: Arc::new(parsed.body),
            },
        );
        Ok(())
    }

    /// Whether a template of that name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.named.contains_key(name)
    }

    /// Executes template `name` with `dot` as `.` and `$`.
    pub fn execute(&self, name: &str, dot: &Value) -> Result<String, Error> {
        // On a thread of its own with a large stack: nested calls and expressions recurse.
        std::thread::scope(|scope| {
            let worker = std::thread::Builder::new()
                .name("template".into())
                .stack_size(STACK)
                .spawn_scoped(scope, || self.execute_here(name, dot))
                .map_err(|e| Error::Exec {
                    template: name.to_string(),
                    line: 0,
                    message: format!("cannot start the render thread: {e}"),
                })?;
            worker.join().unwrap_or_else(|_| {
                Err(Error::Exec {
                    template: name.to_string(),
                    line: 0,
                    message: "the renderer failed unexpectedly".into(),
                })
            })
        })
    }

    fn execute_here(&self, name: &str, dot: &Value) -> Result<String, Error> {
        let mut ex = Exec {
            set: self,
            vars: Vec::new(),
            depth: 0,
            source: name.to_string(),
            current: name.to_string(),
        };
        let mut out = String::new();
        ex.call(name, dot.clone(), &mut out, 0)?;
        Ok(out)
    }
}

/// What a list of nodes asks of the enclosing `range`.
enum Flow {
    Normal,
    Break,
    Continue,
}

struct Exec<'t> {
    set: &'t Templates,
    vars: Vec<(String, Value)>,
    depth: usize,
    /// The file of the running template, and the template's name.
    source: String,
    current: String,
}

type Res<T> = std::result::Result<T, Error>;

impl Exec<'_> {
    fn err(&self, line: usize, message: impl Into<String>) -> Error {
        let message = message.into();
        Error::Exec {
            template: self.source.clone(),
            line,
            message: if self.current == self.source {
                message
            } else {
                format!("in template {:?}: {message}", self.current)
            },
        }
    }

    /// Runs template `name` with a fresh variable scope.
    fn call(&mut self, name: &str, dot: Value, out: &mut String, line: usize) -> Res<()> {
        let Some(t) = self.set.named.get(name) else {
            return Err(self.err(line, format!("no template {name:?}")));
        };
        if self.depth >= MAX_CALL_DEPTH {
            return Err(self.err(
                line,
                format!("template {name:?}: more than {MAX_CALL_DEPTH} nested template calls"),
            ));
        }
        let body = Arc::clone(&t.body);
        let source = std::mem::replace(&mut self.source, t.source.clone());
        let current = std::mem::replace(&mut self.current, name.to_string());
        let vars = std::mem::replace(&mut self.vars, vec![("$".into(), dot.clone())]);
        self.depth += 1;
        let result = self.list(&body, &dot, out);
        self.depth -= 1;
        self.vars = vars;
        self.current = current;
        self.source = source;
        result.map(|_| ())
    }

    fn list(&mut self, nodes: &List, dot: &Value, out: &mut String) -> Res<Flow> {
        for node in nodes {
            match node {
                Node::Text(s) => out.push_str(s),
                Node::Action(pipe) => {
                    let v = self.pipe(pipe, dot)?;
                    if pipe.vars.is_empty() {
                        out.push_str(&v.to_output());
                    }
                }
                Node::If {
                    with,
                    branches,
                    otherwise,
                } => {
                    let mark = self.vars.len();
                    let mut chosen = None;
                    for (pipe, body) in branches {
                        let v = self.pipe(pipe, dot)?;
                        if v.truthy() {
                            chosen = Some((body, if *with { v } else { dot.clone() }));
                            break;
                        }
                    }
                    let flow = match (chosen, otherwise) {
                        (Some((body, d)), _) => self.list(body, &d, out)?,
                        (None, Some(body)) => self.list(body, dot, out)?,
                        (None, None) => Flow::Normal,
                    };
                    self.vars.truncate(mark);
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Range {
                    pipe,
                    key,
                    value,
                    declare,
                    body,
                    otherwise,
                } => {
                    let v = self.pipe(pipe, dot)?;
                    let items: Vec<(Value, Value)> = match v {
                        Value::List(l) => l
                            .into_iter()
                            .enumerate()
                            .map(|(i, v)| (Value::Int(i as i64), v))
                            .collect(),
                        Value::Map(m) => m.into_iter().map(|(k, v)| (Value::Str(k), v)).collect(),
                        Value::Files(f) => f
                            .iter()
                            .map(|(k, v)| (Value::str(k), Value::str(v)))
                            .collect(),
                        Value::Int(n) => {
                            if key.is_some() {
                                return Err(self.err(
                                    pipe.line,
                                    "can't use two variables when ranging over an integer",
                                ));
                            }
                            if n > MAX_RANGE {
                                return Err(self.err(
                                    pipe.line,
                                    format!("range over {n}: more than {MAX_RANGE} iterations"),
                                ));
                            }
                            (0..n.max(0))
                                .map(|i| (Value::Int(i), Value::Int(i)))
                                .collect()
                        }
                        Value::Nil => Vec::new(),
                        v => {
                            return Err(self.err(
                                pipe.line,
                                format!("range can't iterate over {}", v.to_go_string()),
                            ));
                        }
                    };
                    if items.is_empty() {
                        if let Some(body) = otherwise {
                            let mark = self.vars.len();
                            let flow = self.list(body, dot, out)?;
                            self.vars.truncate(mark);
                            if !matches!(flow, Flow::Normal) {
                                return Ok(flow);
                            }
                        }
                        continue;
                    }
                    for (k, v) in items {
                        let mark = self.vars.len();
                        for (name, val) in [(key, k), (value, v.clone())] {
                            if let Some(name) = name {
                                if *declare {
                                    self.vars.push((name.clone(), val));
                                } else {
                                    self.assign(name, val, pipe.line)?;
                                }
                            }
                        }
                        let flow = self.list(body, &v, out)?;
                        self.vars.truncate(mark);
                        if let Flow::Break = flow {
                            break;
                        }
                    }
                }
                Node::Template { line, name, pipe } => {
                    let d = match pipe {
                        Some(p) => self.pipe(p, dot)?,
                        None => Value::Nil,
                    };
                    self.call(name, d, out, *line)?;
                }
                Node::Break => return Ok(Flow::Break),
                Node::Continue => return Ok(Flow::Continue),
            }
        }
        Ok(Flow::Normal)
    }

    fn assign(&mut self, name: &str, v: Value, line: usize) -> Res<()> {
        match self.vars.iter_mut().rev().find(|(n, _)| n == name) {
            Some(slot) => {
                slot.1 = v;
                Ok(())
            }
            None => Err(self.err(line, format!("undefined variable {name:?}"))),
        }
    }

    fn pipe(&mut self, pipe: &Pipe, dot: &Value) -> Res<Value> {
        let mut value = None;
        for cmd in &pipe.cmds {
            value = Some(self.command(cmd, dot, value)?);
        }
        let v = value.unwrap_or_default();
        for name in &pipe.vars {
            if pipe.declare {
                self.vars.push((name.clone(), v.clone()));
            } else {
                self.assign(name, v.clone(), pipe.line)?;
            }
        }
        Ok(v)
    }

    fn command(&mut self, cmd: &Cmd, dot: &Value, piped: Option<Value>) -> Res<Value> {
        let rest = &cmd.args[1..];
        match &cmd.args[0] {
            Operand::Func(name) => self.function(name, rest, dot, piped, cmd.line),
            Operand::Field(chain) => {
                self.chain(dot.clone(), chain, ".", rest, dot, piped, cmd.line)
            }
            Operand::Var(name, chain) => {
                let base = self.var(name, cmd.line)?;
                self.chain(base, chain, name, rest, dot, piped, cmd.line)
            }
            Operand::Sub(pipe, chain) => {
                let base = self.pipe(pipe, dot)?;
                self.chain(base, chain, "(...)", rest, dot, piped, cmd.line)
            }
            op => {
                if !rest.is_empty() || piped.is_some() {
                    return Err(self.err(cmd.line, "can't give argument to non-function"));
                }
                self.arg(op, dot, cmd.line)
            }
        }
    }

    fn var(&self, name: &str, line: usize) -> Res<Value> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| self.err(line, format!("undefined variable {name:?}")))
    }

    /// An argument's value (a function name as an argument is called without arguments).
    fn arg(&mut self, op: &Operand, dot: &Value, line: usize) -> Res<Value> {
        match op {
            Operand::Dot => Ok(dot.clone()),
            Operand::Literal(v) => Ok(v.clone()),
            Operand::Field(chain) => self.chain(dot.clone(), chain, ".", &[], dot, None, line),
            Operand::Var(name, chain) => {
                let base = self.var(name, line)?;
                self.chain(base, chain, name, &[], dot, None, line)
            }
            Operand::Sub(pipe, chain) => {
                let base = self.pipe(pipe, dot)?;
                self.chain(base, chain, "(...)", &[], dot, None, line)
            }
            Operand::Func(name) => self.function(name, &[], dot, None, line),
        }
    }

    /// `base.a.b…`; the last name may be a method of `.Files` or
    /// `.Capabilities.APIVersions` taking `args` (and the piped value).
    #[allow(clippy::too_many_arguments)]
    fn chain(
        &mut self,
        base: Value,
        chain: &[String],
        start: &str,
        args: &[Operand],
        dot: &Value,
        piped: Option<Value>,
        line: usize,
    ) -> Res<Value> {
        let mut v = base;
        let mut path = if start == "." {
            String::new()
        } else {
            start.to_string()
        };
        for (i, name) in chain.iter().enumerate() {
            let last = i + 1 == chain.len();
            let method = matches!(
                (&v, name.as_str()),
                (Value::Files(_), "Get" | "Glob") | (Value::ApiVersions(_), "Has")
            );
            if method {
                let mut values = Vec::new();
                if last {
                    for a in args {
                        values.push(self.arg(a, dot, line)?);
                    }
                    values.extend(piped.clone());
                }
                if values.len() != 1 {
                    return Err(self.err(
                        line,
                        format!(
                            "wrong number of args for {name}: want 1 got {}",
                            values.len()
                        ),
                    ));
                }
                let Value::Str(s) = &values[0] else {
                    return Err(self.err(
                        line,
                        format!(
                            "error calling {name}: wrong type for value; expected string; got {}",
                            values[0].go_type()
                        ),
                    ));
                };
                v = match (&v, name.as_str()) {
                    (Value::Files(f), "Get") => Value::str(f.get(s).cloned().unwrap_or_default()),
                    (Value::Files(f), _) => Value::Files(Arc::new(
                        f.iter()
                            .filter(|(path, _)| glob_match(s, path))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    )),
                    (Value::ApiVersions(have), _) => Value::Bool(have.iter().any(|h| h == s)),
                    _ => unreachable!("matched above"),
                };
                path.push('.');
                path.push_str(name);
                if last {
                    return Ok(v);
                }
                continue;
            }
            v = match &v {
                Value::Map(m) => m.get(name).cloned().unwrap_or(Value::Nil),
                Value::Nil => {
                    return Err(self.err(
                        line,
                        format!(
                            "nil pointer evaluating interface {{}}.{name} ({} is not set)",
                            if path.is_empty() { "." } else { &path }
                        ),
                    ));
                }
                other => {
                    return Err(self.err(
                        line,
                        format!("can't evaluate field {name} in type {}", other.go_type()),
                    ));
                }
            };
            path.push('.');
            path.push_str(name);
        }
        if !args.is_empty() || piped.is_some() {
            let what = chain.last().map_or(start, String::as_str);
            return Err(self.err(line, format!("{what} is not a method but has arguments")));
        }
        Ok(v)
    }

    fn function(
        &mut self,
        name: &str,
        args: &[Operand],
        dot: &Value,
        piped: Option<Value>,
        line: usize,
    ) -> Res<Value> {
        if name == "and" || name == "or" {
            // Evaluated left to right, stopping at the first argument that decides.
            let total = args.len() + piped.is_some() as usize;
            if total == 0 {
                return Err(self.err(
                    line,
                    format!("wrong number of args for {name}: want at least 1 got 0"),
                ));
            }
            let mut last = Value::Nil;
            for a in args {
                let v = self.arg(a, dot, line)?;
                if v.truthy() == (name == "or") {
                    return Ok(v);
                }
                last = v;
            }
            if let Some(v) = piped {
                return Ok(v);
            }
            return Ok(last);
        }
        let mut values = Vec::with_capacity(args.len() + 1);
        for a in args {
            values.push(self.arg(a, dot, line)?);
        }
        values.extend(piped);
        if name == "include" {
            if values.len() != 2 {
                return Err(self.err(
                    line,
                    format!(
                        "error calling include: wrong number of args for include: want 2 got {}",
                        values.len()
                    ),
                ));
            }
            let data = values.pop().unwrap_or_default();
            let Value::Str(template) = values.pop().unwrap_or_default() else {
                return Err(self.err(
                    line,
                    "error calling include: the template name must be a string",
                ));
            };
            let mut out = String::new();
            self.call(&template, data, &mut out, line)?;
            return Ok(Value::Str(out));
        }
        funcs::call(name, values).map_err(|e| match e {
            FuncError::Call(m) => self.err(line, format!("error calling {name}: {m}")),
            FuncError::User(m) => self.err(line, m),
        })
    }
}

/// Helm's `.Files.Glob` matching (gobwas/glob with `/` as separator): `*` within a path
/// segment, `**` across segments, `?` one character, `[abc]` a class.
pub(crate) fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[char], s: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some('*') if p.get(1) == Some(&'*') => (0..=s.len()).any(|i| go(&p[2..], &s[i..])),
            Some('*') => {
                let mut i = 0;
                loop {
                    if go(&p[1..], &s[i..]) {
                        return true;
                    }
                    if i == s.len() || s[i] == '/' {
                        return false;
                    }
                    i += 1;
                }
            }
            Some('?') => !s.is_empty() && s[0] != '/' && go(&p[1..], &s[1..]),
            Some('[') => {
                let Some(end) = p.iter().position(|&c| c == ']') else {
                    return !s.is_empty() && s[0] == '[' && go(&p[1..], &s[1..]);
                };
                let class = &p[1..end];
                let (negate, class) = match class.first() {
                    Some('!' | '^') => (true, &class[1..]),
                    _ => (false, class),
                };
                let Some(&c) = s.first() else {
                    return false;
                };
                let mut hit = false;
                let mut i = 0;
                while i < class.len() {
                    if i + 2 < class.len() && class[i + 1] == '-' {
                        hit |= class[i] <= c && c <= class[i + 2];
                        i += 3;
                    } else {
                        hit |= class[i] == c;
                        i += 1;
                    }
                }
                hit != negate && go(&p[end + 1..], &s[1..])
            }
            Some(&c) => s.first() == Some(&c) && go(&p[1..], &s[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = path.chars().collect();
    go(&p, &s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn render(src: &str, dot: serde_json::Value) -> String {
        let mut t = Templates::new();
        t.add("t", src).unwrap();
        t.execute("t", &Value::from(dot)).unwrap()
    }

    fn fails(src: &str, dot: serde_json::Value) -> Error {
        let mut t = Templates::new();
        match t.add("t", src) {
            Err(e) => e,
            Ok(()) => t.execute("t", &Value::from(dot)).expect_err(src),
        }
    }

    fn message(e: Error) -> String {
        match e {
            Error::Parse { message, .. } | Error::Exec { message, .. } => message,
            e => panic!("{e}"),
        }
    }

    #[test]
    fn fields_variables_and_pipelines() {
        let dot = json!({"Values": {"a": {"b": "x"}, "n": 3}, "Release": {"Name": "r"}});
        let r = |s: &str| render(s, dot.clone());
        assert_eq!(r("{{ .Values.a.b }}-{{ .Release.Name }}"), "x-r");
        assert_eq!(r("{{ $.Values.n }}"), "3");
        assert_eq!(r("{{ $v := .Values.a }}{{ $v.b }}"), "x");
        assert_eq!(
            r("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}"),
            "2"
        );
        assert_eq!(r("{{ .Values.a.b | quote }}"), "\"x\"");
        assert_eq!(r("{{ .Values.n | printf \"%d-%v\" 7 }}"), "7-3");
        assert_eq!(r("{{ (.Values.a).b }}"), "x");
        assert_eq!(
            r("{{ .Values.missing }}|{{ .Values.missing | default \"d\" }}"),
            "|d"
        );
        assert_eq!(r("{{ . | len }}"), "2");
        assert_eq!(r("{{ \"a\" | printf \"%s%s\" \"b\" | quote }}"), "\"ba\"");
    }

    #[test]
    fn conditionals_follow_go_truth() {
        let dot = json!({"on": true, "zero": 0, "empty": [], "s": "x", "m": {"k": "v"}});
        let r = |s: &str| render(s, dot.clone());
        assert_eq!(r("{{ if .on }}a{{ end }}"), "a");
        assert_eq!(
            r("{{ if .zero }}a{{ else if .empty }}b{{ else if .s }}c{{ else }}d{{ end }}"),
            "c"
        );
        assert_eq!(r("{{ if .nope }}a{{ else }}b{{ end }}"), "b");
        assert_eq!(r("{{ with .m }}{{ .k }}{{ end }}"), "v");
        assert_eq!(r("{{ with .nope }}{{ .k }}{{ else }}none{{ end }}"), "none");
        assert_eq!(
            r("{{ with .nope }}a{{ else with .s }}{{ . }}{{ end }}"),
            "x"
        );
        assert_eq!(
            r("{{ if and .on .s }}y{{ end }}{{ if or .zero .empty }}n{{ end }}"),
            "y"
        );
        assert_eq!(
            r("{{ and .on .s }}|{{ or .zero .s }}|{{ and .zero .nope.x }}"),
            "x|x|0"
        );
        assert_eq!(r("{{ if not .zero }}t{{ end }}"), "t");
        assert_eq!(
            r("{{ if eq .s \"x\" }}eq{{ end }}{{ if ne .s \"y\" }}ne{{ end }}"),
            "eqne"
        );
    }

    #[test]
    fn range_over_lists_maps_and_numbers() {
        let dot = json!({"l": ["a", "b"], "m": {"z": 1, "a": 2, "B": 3}});
        let r = |s: &str| render(s, dot.clone());
        assert_eq!(r("{{ range .l }}[{{ . }}]{{ end }}"), "[a][b]");
        assert_eq!(
            r("{{ range $i, $v := .l }}{{ $i }}={{ $v }},{{ end }}"),
            "0=a,1=b,"
        );
        assert_eq!(r("{{ range $v := .l }}{{ $v }}{{ end }}"), "ab");
        assert_eq!(
            r("{{ range $k, $v := .m }}{{ $k }}={{ $v }},{{ end }}"),
            "B=3,a=2,z=1,"
        );
        assert_eq!(r("{{ range .none }}x{{ else }}empty{{ end }}"), "empty");
        assert_eq!(r("{{ range 3 }}{{ . }}{{ end }}"), "012");
        assert_eq!(
            r("{{ range .l }}{{ if eq . \"a\" }}{{ continue }}{{ end }}{{ . }}{{ end }}"),
            "b"
        );
        assert_eq!(r("{{ range .l }}{{ . }}{{ break }}{{ end }}"), "a");
        assert_eq!(r("{{ range .l }}{{ $.m.a }}{{ end }}"), "22");
        assert_eq!(
            r("{{ $last := \"\" }}{{ range .l }}{{ $last = . }}{{ end }}{{ $last }}"),
            "b"
        );
        assert_eq!(
            message(fails("{{ range .l.x }}{{ end }}", dot.clone())),
            "can't evaluate field x in type []interface {}"
        );
        assert_eq!(
            message(fails("{{ range \"s\" }}{{ end }}", dot.clone())),
            "range can't iterate over s"
        );
        assert!(message(fails("{{ range 100000000000 }}{{ end }}", dot)).contains("iterations"));
    }

    #[test]
    fn trimming_and_comments() {
        let src = "a:\n  {{- /* gone */}}\n  b: 1\n{{- if true }}\nc: 2\n{{- end }}\n";
        assert_eq!(render(src, json!({})), "a:\n  b: 1\nc: 2\n");
        assert_eq!(render("x {{- 1 -}} y", json!({})), "x1y");
    }

    #[test]
    fn define_include_and_template() {
        let mut t = Templates::new();
        t.add("_helpers.tpl", "{{- define \"name\" -}}{{ .n | trunc 3 }}{{- end -}}\n{{ define \"block\" }}k: {{ . }}{{ end }}").unwrap();
        t.add(
            "main",
            "{{ include \"name\" . }}|{{ template \"block\" \"v\" }}|{{ include \"block\" 1 | indent 2 }}|{{ block \"b2\" .n }}[{{ . }}]{{ end }}",
        )
        .unwrap();
        assert_eq!(
            t.execute("main", &Value::from(json!({"n": "abcdef"})))
                .unwrap(),
            "abc|k: v|  k: 1|[abcdef]"
        );
        assert!(t.contains("name"));
        let mut looped = Templates::new();
        looped
            .add(
                "t",
                "{{ define \"x\" }}{{ include \"x\" . }}{{ end }}{{ include \"x\" . }}",
            )
            .unwrap();
        let e = looped.execute("t", &Value::Nil).unwrap_err();
        assert!(e.to_string().contains("nested template calls"), "{e}");
        assert_eq!(
            message(fails("{{ include \"nope\" . }}", json!({}))),
            "no template \"nope\""
        );
        assert_eq!(
            message(fails("{{ template \"nope\" }}", json!({}))),
            "no template \"nope\""
        );
    }

    #[test]
    fn helm_objects_have_methods() {
        let files: BTreeMap<String, String> = [
            ("files/dashboards/a.json", "{\"a\":1}"),
            ("files/dashboards/b.json", "{}"),
            ("files/dashboards/sub/c.json", "{}"),
            ("files/alerts.yaml", "groups: []"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut m = BTreeMap::new();
        m.insert("Files".to_string(), Value::Files(Arc::new(files)));
        let mut caps = BTreeMap::new();
        caps.insert(
            "APIVersions".to_string(),
            Value::ApiVersions(Arc::new(vec!["monitoring.coreos.com/v1".into()])),
        );
        m.insert("Capabilities".to_string(), Value::Map(caps));
        let dot = Value::Map(m);
        let r = |src: &str| {
            let mut t = Templates::new();
            t.add("t", src).unwrap();
            t.execute("t", &dot)
        };
        assert_eq!(
            r("{{ .Files.Get \"files/alerts.yaml\" }}|{{ .Files.Get \"missing\" }}").unwrap(),
            "groups: []|"
        );
        assert_eq!(r("{{ range $p, $_ := .Files.Glob \"files/dashboards/*.json\" }}{{ base $p }},{{ end }}").unwrap(), "a.json,b.json,");
        assert_eq!(
            r("{{ range $p, $c := .Files.Glob \"files/**.json\" }}{{ $c }};{{ end }}").unwrap(),
            "{\"a\":1};{};{};"
        );
        assert_eq!(r("{{ .Capabilities.APIVersions.Has \"monitoring.coreos.com/v1\" }} {{ .Capabilities.APIVersions.Has \"x/v1\" }}").unwrap(), "true false");
        assert_eq!(r("{{ if and true (.Capabilities.APIVersions.Has \"monitoring.coreos.com/v1\") }}y{{ end }}").unwrap(), "y");
        assert_eq!(
            r("{{ \"files/alerts.yaml\" | .Files.Get }}").unwrap(),
            "groups: []"
        );
        let e = r("{{ .Files.Get }}").unwrap_err();
        assert_eq!(message(e), "wrong number of args for Get: want 1 got 0");
    }

    #[test]
    fn runtime_errors_name_template_and_line() {
        let dot = json!({"Values": {"a": null, "s": "str"}});
        let e = fails("ok\n\n{{ .Values.a.b }}", dot.clone());
        assert_eq!(
            e.to_string(),
            "t:3: nil pointer evaluating interface {}.b (.Values.a is not set)"
        );
        assert_eq!(
            message(fails("{{ .Values.s.x }}", dot.clone())),
            "can't evaluate field x in type string"
        );
        assert_eq!(
            message(fails("{{ .Values.s 1 }}", dot.clone())),
            "s is not a method but has arguments"
        );
        assert_eq!(
            message(fails("{{ 1 2 }}", dot.clone())),
            "can't give argument to non-function"
        );
        assert_eq!(
            message(fails(
                "{{ required \"a is required\" .Values.a }}",
                dot.clone()
            )),
            "a is required"
        );
        assert_eq!(message(fails("{{ fail \"stop\" }}", dot.clone())), "stop");
        assert_eq!(
            message(fails("{{ indent 2 .Values.a }}", dot.clone())),
            "error calling indent: invalid value; expected string"
        );
        let mut t = Templates::new();
        t.add(
            "helpers",
            "\n{{ define \"h\" }}{{ fail \"inner\" }}{{ end }}",
        )
        .unwrap();
        t.add("main", "{{ include \"h\" . }}").unwrap();
        assert_eq!(
            t.execute("main", &Value::Nil).unwrap_err().to_string(),
            "helpers:2: in template \"h\": inner"
        );
    }

    #[test]
    fn syntax_errors_are_errors_not_panics() {
        for (src, want) in [
            ("{{ nope }}", "function \"nope\" not defined"),
            ("a\n{{ .x", "unclosed action"),
            (
                "{{ if .x }}",
                "unexpected EOF: {{if}} started here has no {{end}}",
            ),
            (
                "{{ range .x }}",
                "unexpected EOF: {{range}} started here has no {{end}}",
            ),
            (
                "{{ define \"x\" }}",
                "unexpected EOF: {{define}} started here has no {{end}}",
            ),
            ("{{ end }}", "unexpected {{end}}"),
            ("{{ $x }}", "undefined variable \"$x\""),
            ("{{ \"a }}", "unterminated quoted string"),
            ("{{ .a | }}", "missing value for command"),
        ] {
            let e = fails(src, json!({}));
            assert!(matches!(e, Error::Parse { .. }), "{src}: {e}");
            assert_eq!(message(e), want, "{src}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match(
            "files/dashboards/*.json",
            "files/dashboards/a.json"
        ));
        assert!(!glob_match(
            "files/dashboards/*.json",
            "files/dashboards/x/a.json"
        ));
        assert!(!glob_match(
            "files/dashboards/*.json",
            "files/dashboards/a.yaml"
        ));
        assert!(glob_match("files/**.json", "files/dashboards/x/a.json"));
        assert!(glob_match("f?les/[a-c].txt", "files/b.txt"));
        assert!(!glob_match("f?les/[!a-c].txt", "files/b.txt"));
    }
}
