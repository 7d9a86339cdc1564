//! The language's closed list (docs/transformations.md#the-language): the constructs and
//! functions an expression may use, and its size bound. Checked on the parsed
//! expression, before it is planned.

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion, TreeNodeVisitor};
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, Operator};

/// The longest expression text: a bound checked before parsing, so a pathological
/// expression is refused at once.
pub const MAX_EXPR_CHARS: usize = 10_000;

/// The most nodes (names, literals, operators, calls) one expression may have.
pub const MAX_EXPR_NODES: usize = 1_000;

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

/// Refuses an expression text longer than [`MAX_EXPR_CHARS`].
pub(crate) fn size(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("empty expression".into());
    }
    if text.len() > MAX_EXPR_CHARS {
        return Err(format!("the expression is {} characters long; at most {MAX_EXPR_CHARS} are allowed", text.len()));
    }
    Ok(())
}

/// Refuses any construct outside the language, more than [`MAX_EXPR_NODES`] nodes and
/// nesting deeper than [`MAX_EXPR_DEPTH`].
pub(crate) fn language(expr: &Expr) -> Result<(), String> {
    let mut check = Check { nodes: 0, depth: 0, refused: None };
    let _ = expr.visit(&mut check);
    check.refused.map_or(Ok(()), Err)
}

/// The deepest an expression may nest (`a + b + c` is two deep): evaluation recurses
/// once per level, on the server's threads too.
pub const MAX_EXPR_DEPTH: usize = 100;

struct Check {
    nodes: usize,
    depth: usize,
    refused: Option<String>,
}

impl<'n> TreeNodeVisitor<'n> for Check {
    type Node = Expr;

    fn f_down(&mut self, e: &'n Expr) -> Result<TreeNodeRecursion> {
        self.nodes += 1;
        self.depth += 1;
        let refused = if self.nodes > MAX_EXPR_NODES {
            Err(format!("the expression has more than {MAX_EXPR_NODES} terms"))
        } else if self.depth > MAX_EXPR_DEPTH {
            Err(format!("the expression nests more than {MAX_EXPR_DEPTH} deep"))
        } else {
            allowed(e)
        };
        match refused {
            Ok(()) => Ok(TreeNodeRecursion::Continue),
            Err(reason) => {
                self.refused = Some(reason);
                Ok(TreeNodeRecursion::Stop)
            }
        }
    }

    fn f_up(&mut self, _e: &'n Expr) -> Result<TreeNodeRecursion, DataFusionError> {
        self.depth -= 1;
        Ok(TreeNodeRecursion::Continue)
    }
}

fn allowed(e: &Expr) -> Result<(), String> {
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
            if FUNCTIONS.contains(&name) { Ok(()) } else { refuse(&format!("the function `{name}`")) }
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
