//! How refusals read: an expression shown short, types named as the language names
//! them, DataFusion's errors as sentences with line and column.

use arrow::datatypes::DataType;
use datafusion::common::DataFusionError;

use crate::{Column, check};

/// An expression as a refusal shows it: whole up to 100 characters, else its first 80
/// and `…` (a refusal of a 26,000-character expression does not repeat it).
pub fn shown(expr: &str) -> String {
    if expr.chars().count() <= 100 {
        return expr.to_string();
    }
    let mut cut: String = expr.chars().take(80).collect();
    cut.push('…');
    cut
}

/// `name` (a type as users write it) after its article: `an int64`, `a float64`.
pub fn with_article(name: &str) -> String {
    let vowel = name.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {name}", if vowel { "an" } else { "a" })
}

/// A type as users write it.
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::Float32 => "float32".into(),
        DataType::Float64 => "float64".into(),
        DataType::Boolean => "bool".into(),
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => "string".into(),
        DataType::Timestamp(..) => "timestamp".into(),
        DataType::List(f) | DataType::LargeList(f) => format!("list<{}>", type_name(f.data_type())),
        DataType::Null => "null".into(),
        other => other.to_string().to_lowercase(),
    }
}

/// DataFusion's message without its error-kind prefixes and backtrace.
pub(crate) fn plain(e: &DataFusionError) -> String {
    let text = e.strip_backtrace();
    let mut text = text.as_str();
    for prefix in ["Error during planning: ", "Schema error: ", "Execution error: ", "SQL error: ", "Arrow error: ", "Internal error: "] {
        if let Some(rest) = text.strip_prefix(prefix) {
            text = rest;
        }
    }
    text.lines().next().unwrap_or(text).trim().to_string()
}

/// A parse or name error as a sentence: where the text does not parse (line and
/// column), an unknown function (with the language's), an unknown name (with the names
/// an expression may use), an ambiguous one (with the names it may mean).
pub(crate) fn parse_reason(e: &DataFusionError, text: &str, columns: &[Column]) -> String {
    use datafusion::sql::sqlparser::parser::ParserError;
    if let DataFusionError::SQL(error, _) = e.find_root() {
        return match error.as_ref() {
            ParserError::RecursionLimitExceeded => check::too_deep(),
            ParserError::TokenizerError(message) | ParserError::ParserError(message) => unparsed(message, text),
        };
    }
    let reason = plain(e);
    if let Some(rest) = reason.strip_prefix("Invalid function '") {
        let name = rest.split('\'').next().unwrap_or(rest);
        return format!("unknown function `{name}` (the functions of the expression language: {})", check::WRITTEN);
    }
    if let Some(ambiguous) = ambiguous(&reason, columns) {
        return ambiguous;
    }
    if reason.contains("No field named") || reason.contains("not found") {
        let known: Vec<String> = columns.iter().map(Column::reference).collect();
        let name = reason.split("No field named ").nth(1).and_then(|r| r.split(". ").next()).unwrap_or("").trim_end_matches(['.', ':']);
        let what = if name.is_empty() { "an unknown name".to_string() } else { format!("unknown name {name}") };
        return format!("{what} (known: {})", known.join(", "));
    }
    reason
}

/// A planning error as a sentence: a bare name more than one input has a feature of
/// (with the names it may mean), else DataFusion's message.
pub(crate) fn planning_reason(e: &DataFusionError, columns: &[Column]) -> String {
    let reason = plain(e);
    ambiguous(&reason, columns).unwrap_or(reason)
}

/// A bare name that DataFusion finds ambiguous, with the qualified names it may mean.
pub(crate) fn ambiguous(reason: &str, columns: &[Column]) -> Option<String> {
    let rest = reason.split("Ambiguous reference to unqualified field ").nth(1)?;
    let name = rest.trim_end_matches(['.', ' ']);
    let meant: Vec<String> = columns.iter().filter(|c| c.name == name).map(|c| format!("`{}`", c.reference())).collect();
    Some(format!("`{name}` is a feature of more than one input: write {}", meant.join(" or ")))
}

/// The parser's `message` (`Expected: X, found: Y at Line: 1, Column: 5`) as a sentence
/// with the line and column where `text` stops parsing (its end when the message gives
/// none).
pub(crate) fn unparsed(message: &str, text: &str) -> String {
    let (message, place) = match message.rsplit_once(" at Line: ") {
        Some((m, at)) => {
            let mut numbers = at.split(", Column: ").map(|n| n.trim().parse::<usize>().ok());
            match (numbers.next().flatten(), numbers.next().flatten()) {
                (Some(line), Some(column)) => (m, (line, column)),
                _ => (message, end_of(text)),
            }
        }
        None => (message, end_of(text)),
    };
    let (line, column) = place;
    let detail = match message.strip_prefix("Expected: ").and_then(|m| m.split_once(", found: ")) {
        Some((expected, "EOF")) => format!("expected {expected}, found the end of the expression"),
        Some((expected, found)) => format!("expected {expected}, found `{found}`"),
        None => {
            let mut chars = message.chars();
            chars.next().map_or_else(String::new, |c| c.to_lowercase().chain(chars).collect())
        }
    };
    format!("it does not parse at line {line}, column {column}: {detail}")
}

/// The line and column just after `text`'s last character (both from 1).
pub(crate) fn end_of(text: &str) -> (usize, usize) {
    let line = text.split('\n').count();
    let column = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
