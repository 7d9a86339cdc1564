//! The language's closed list (docs/transformations.md#the-language): the constructs and
//! functions an expression may use, and its size bound. Checked on the parsed
//! expression, before it is planned.

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, Operator};

use crate::chain;

/// The longest expression text: a bound checked before parsing, so a pathological
/// expression is refused at once.
pub const MAX_EXPR_CHARS: usize = 10_000;

/// The most terms — names, literals, operators and function calls — one expression may
/// have: a linear score of 1,000 weighted features has about 4,000.
pub const MAX_EXPR_NODES: usize = 5_000;

/// The functions of the language, by DataFusion's name for them (their aliases, such as
/// `length`, `pow`, `substring`, `extract`, `dot_product`, parse to these; a list
/// literal `[1.0, 2.0]` is `make_array`). The last two are the engine's own float `/`
/// and `%` (a zero divisor gives null).
pub const FUNCTIONS: &[&str] = &[
    "coalesce",
    "nullif",
    "abs",
    "ln",
    "log10",
    "exp",
    "sqrt",
    "power",
    "round",
    "floor",
    "ceil",
    "least",
    "greatest",
    "lower",
    "upper",
    "character_length",
    "substr",
    "concat",
    "starts_with",
    "date_part",
    "make_array",
    "array_length",
    "array_element",
    "inner_product",
    "cosine_distance",
    "array_distance",
    "quiver_float_division",
    "quiver_float_remainder",
];

/// The functions of the language as an expression writes them, aliases included.
pub(crate) const WRITTEN: &str = "abs, array_distance, array_element, array_length, ceil, character_length, coalesce, concat, \
    cosine_distance, date_part, dot_product, exp, extract, floor, greatest, inner_product, least, length, ln, log10, lower, \
    nullif, pow, power, round, sqrt, starts_with, substr, substring, upper";

/// Refuses an empty expression text, and one longer than [`MAX_EXPR_CHARS`].
pub(crate) fn size(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("empty expression".into());
    }
    let chars = text.chars().count();
    if chars > MAX_EXPR_CHARS {
        return Err(format!("the expression is {chars} characters long; at most {MAX_EXPR_CHARS} are allowed"));
    }
    Ok(())
}

/// Refuses any construct outside the language (`text` is the expression as written,
/// for the names of its functions), more than [`MAX_EXPR_NODES`] terms and nesting
/// deeper than [`MAX_EXPR_DEPTH`].
pub(crate) fn language(expr: &Expr, text: &str) -> Result<(), String> {
    Check { nodes: 0, text }.walk(expr, 1)
}

/// The deepest an expression may nest: each operand, argument or `CASE` part is one
/// level below its operator, function or `CASE`, except that a chain of one operator
/// (`a + b - c + ...`, `a * b * c`, `p AND q AND r`) is one level however long it is.
/// Evaluation recurses once per level, on the server's threads too (a chain is
/// computed in a loop, `chain::Chain`).
pub const MAX_EXPR_DEPTH: usize = 100;

/// Why an expression nesting deeper than [`MAX_EXPR_DEPTH`] is refused.
pub(crate) fn too_deep() -> String {
    format!(
        "the expression nests more than {MAX_EXPR_DEPTH} levels deep (each operand, argument or CASE part is a level below \
         its operator, function or CASE; a chain of one operator, `a + b - c + ...`, is one level)"
    )
}

struct Check<'t> {
    nodes: usize,
    text: &'t str,
}

impl Check<'_> {
    /// `e`, at nesting level `depth`, and all it holds; a chain of one operator (a
    /// left-deep tree as parsed) walked down its left side without recursing.
    fn walk(&mut self, e: &Expr, depth: usize) -> Result<(), String> {
        let mut e = e;
        loop {
            self.node(e, depth)?;
            let Expr::BinaryExpr(b) = e else { break };
            let Some(g) = chain::group(&b.op) else { break };
            self.walk(&b.right, depth + 1)?;
            match b.left.as_ref() {
                Expr::BinaryExpr(left) if chain::group(&left.op) == Some(g) => e = b.left.as_ref(),
                left => return self.walk(left, depth + 1),
            }
        }
        let mut result = Ok(());
        e.apply_children(|child| {
            result = self.walk(child, depth + 1);
            Ok(if result.is_ok() { TreeNodeRecursion::Continue } else { TreeNodeRecursion::Stop })
        })
        .expect("walking does not fail");
        result
    }

    fn node(&mut self, e: &Expr, depth: usize) -> Result<(), String> {
        self.nodes += 1;
        if self.nodes > MAX_EXPR_NODES {
            return Err(format!("the expression has more than {MAX_EXPR_NODES} terms (names, literals, operators and function calls)"));
        }
        if depth > MAX_EXPR_DEPTH {
            return Err(too_deep());
        }
        allowed(e, self.text)
    }
}

fn allowed(e: &Expr, text: &str) -> Result<(), String> {
    let refuse = |what: &str| Err(format!("{what} is not part of the expression language (see docs/transformations.md)"));
    match e {
        Expr::Column(_) | Expr::Literal(..) | Expr::Not(_) | Expr::IsNull(_) | Expr::IsNotNull(_) | Expr::Negative(_) => Ok(()),
        Expr::Between(_) | Expr::Case(_) | Expr::Cast(_) | Expr::InList(_) => Ok(()),
        // The name the parser gives a call by an alias (`length(s)`); no meaning.
        Expr::Alias(_) => Ok(()),
        Expr::BinaryExpr(b) => match b.op {
            Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq
            | Operator::Plus
            | Operator::Minus
            | Operator::Multiply
            | Operator::Divide
            | Operator::Modulo
            | Operator::And
            | Operator::Or => Ok(()),
            op => refuse(&format!("the operator `{op}`")),
        },
        Expr::Like(like) if !like.case_insensitive => Ok(()),
        Expr::Like(_) => refuse("ILIKE"),
        Expr::ScalarFunction(f) => {
            let name = f.func.name();
            if FUNCTIONS.contains(&name) {
                Ok(())
            } else {
                Err(format!("the function `{}` is not part of the expression language (its functions: {WRITTEN})", written(text, name)))
            }
        }
        Expr::AggregateFunction(f) => Err(format!("the aggregate `{}` is not allowed: an expression reads one row", f.func.name())),
        Expr::WindowFunction(_) => Err("window functions are not allowed: an expression reads one row".into()),
        Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_) | Expr::SetComparison(_) => {
            Err("subqueries are not allowed: an expression reads one row".into())
        }
        Expr::TryCast(_) => refuse("TRY_CAST (CAST gives null when it cannot convert a value)"),
        Expr::Placeholder(_) => refuse("a placeholder"),
        Expr::ScalarVariable(..) => refuse("a variable"),
        Expr::SimilarTo(_) => refuse("SIMILAR TO"),
        Expr::IsTrue(_) | Expr::IsFalse(_) | Expr::IsUnknown(_) | Expr::IsNotTrue(_) | Expr::IsNotFalse(_) | Expr::IsNotUnknown(_) => {
            refuse("IS TRUE / IS FALSE / IS UNKNOWN")
        }
        other => refuse(&format!("`{}`", other.variant_name())),
    }
}

/// The name `text` calls DataFusion's function `name` by, as written (`trim` for
/// `btrim`, an alias); `name` when no call in `text` resolves to it.
fn written(text: &str, name: &str) -> String {
    use datafusion::execution::FunctionRegistry;
    let calls = |word: &str| crate::SESSION.udf(word).is_ok_and(|f| f.name() == name);
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let tail = &rest[start..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let (word, after) = tail.split_at(end);
        if after.trim_start().starts_with('(') && (calls(word) || calls(&word.to_lowercase())) {
            return word.to_string();
        }
        rest = after;
    }
    name.to_string()
}
