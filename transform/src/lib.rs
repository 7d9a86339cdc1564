//! The one expression engine (docs/transformations.md): SQL scalar expressions, parsed
//! and planned by DataFusion and evaluated as its physical expressions over Arrow
//! arrays. A [`Program`] is compiled once from the columns an expression may read and
//! the features it computes; the join, the export, the server, `quiver online` and
//! Python all evaluate the same program on the same input types, so online and offline
//! agree bit for bit.
//!
//! The language is a closed list ([`check`]): what it names works, anything else is
//! refused when the program is compiled (at `apply`), naming the construct. A row whose
//! value cannot be computed (division by zero, overflow, an invalid cast, lists of
//! unequal length) gives null for that row and is counted; it never fails the batch.
//!
//! On nothing of ours, like `gpu-join`: columns and results are Arrow types.

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, Float64Array, RecordBatch, RecordBatchOptions, new_null_array};
use arrow::compute::{cast, concat};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, DataFusionError, TableReference};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, Operator, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::prelude::{SessionConfig, SessionContext};

mod chain;
mod check;
mod lenient;

pub use check::{FUNCTIONS, MAX_EXPR_CHARS, MAX_EXPR_DEPTH, MAX_EXPR_NODES};

/// A column an expression may read: `qualifier.name` (an input view's feature or its
/// `event_timestamp`) or a bare `name` (a request field, a join key, `request_time`).
/// A bare name in an expression is the bare column of that name when there is one, even
/// where a qualified column has the same name (`amount` beside `stats.amount`); else the
/// one qualified column of that name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub qualifier: Option<String>,
    pub name: String,
    pub dtype: DataType,
}

impl Column {
    pub fn qualified(qualifier: impl Into<String>, name: impl Into<String>, dtype: DataType) -> Column {
        Column { qualifier: Some(qualifier.into()), name: name.into(), dtype }
    }

    pub fn bare(name: impl Into<String>, dtype: DataType) -> Column {
        Column { qualifier: None, name: name.into(), dtype }
    }

    /// How the column is written in an expression.
    pub fn reference(&self) -> String {
        match &self.qualifier {
            Some(q) => format!("{q}.{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// One computed feature: its name, its declared type and its expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub name: String,
    pub dtype: DataType,
    pub expr: String,
}

/// Why an expression was refused, naming the feature and the expression (its first 80
/// characters when it is longer than 100, [`shown`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("feature `{feature}`: `{expr}`: {reason}")]
pub struct ExprError {
    pub feature: String,
    pub expr: String,
    pub reason: String,
}

/// A batch given to [`Program::evaluate`] that does not have the program's columns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expression input: {0}")]
pub struct InputError(pub String);

/// Compiled expressions over one set of input columns.
#[derive(Debug, Clone)]
pub struct Program {
    schema: SchemaRef,
    outputs: Vec<Compiled>,
}

#[derive(Debug, Clone)]
struct Compiled {
    name: String,
    dtype: DataType,
    expr: Arc<dyn PhysicalExpr>,
}

/// What [`Program::evaluate`] computed: a column per output, in order, and per output
/// how many rows are null because their value could not be computed.
#[derive(Debug, Clone)]
pub struct Evaluated {
    pub columns: Vec<ArrayRef>,
    pub failed: Vec<u64>,
}

/// The session expressions are planned in: DataFusion's functions plus the float
/// division that refuses a zero divisor, names case-sensitive as written, and a parser
/// that nests deeper than any expression within [`MAX_EXPR_DEPTH`] needs (its limit is
/// refused as nesting too deep).
static SESSION: LazyLock<SessionContext> = LazyLock::new(|| {
    let mut config = SessionConfig::new();
    config.options_mut().sql_parser.enable_ident_normalization = false;
    config.options_mut().sql_parser.recursion_limit =
        datafusion::common::config::ConfigNonZeroUsize::try_new(PARSE_DEPTH).expect("a positive parser depth");
    let session = SessionContext::new_with_config(config);
    session.register_udf(ScalarUDF::new_from_impl(FloatDivision::new(false)));
    session.register_udf(ScalarUDF::new_from_impl(FloatDivision::new(true)));
    session
});

impl Program {
    /// Compiles `outputs` against `columns`: parses each expression, refuses what is
    /// outside the language, resolves its names, type-checks it against its declared
    /// type, and plans it.
    ///
    /// # Errors
    /// The first refused expression, naming its feature: too long, not an expression,
    /// an unknown name (listing the known ones), a construct or function outside the
    /// language, or a type its declared type cannot hold.
    pub fn compile(columns: &[Column], outputs: &[Output]) -> Result<Program, ExprError> {
        // Parsing and checking recurse once per level of the text's nesting, bounded
        // only after parsing: on a thread whose stack any text within
        // `MAX_EXPR_CHARS` fits in.
        std::thread::scope(|s| {
            let compiling = std::thread::Builder::new()
                .name("quiver-expr".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(s, || Self::compile_here(columns, outputs))
                .expect("a thread to compile expressions on");
            compiling.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn compile_here(columns: &[Column], outputs: &[Output]) -> Result<Program, ExprError> {
        let refuse = |o: &Output, reason: String| ExprError { feature: o.name.clone(), expr: shown(&o.expr), reason };
        let schema: SchemaRef =
            Arc::new(Schema::new(columns.iter().map(|c| Field::new(&c.name, c.dtype.clone(), true)).collect::<Vec<_>>()));
        // Definitions that passed validation give names a schema holds; any other, the
        // first output is refused naming them.
        let (df_schema, positions) = planning_schema(columns).map_err(|e| match outputs.first() {
            Some(output) => refuse(output, format!("its input columns: {}", plain(&e))),
            None => ExprError { feature: String::new(), expr: String::new(), reason: format!("input columns: {}", plain(&e)) },
        })?;
        let mut compiled = Vec::with_capacity(outputs.len());
        for output in outputs {
            check::size(&output.expr).map_err(|r| refuse(output, r))?;
            let logical =
                SESSION.parse_sql_expr(&output.expr, &df_schema).map_err(|e| refuse(output, parse_reason(&e, &output.expr, columns)))?;
            check::language(&logical, &output.expr).map_err(|r| refuse(output, r))?;
            let logical = rewrite_functions(logical, &df_schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            // Typed as they will be computed, so the rewrite below sees each operand's type.
            let logical = ExprSimplifier::new(simplify_context(&df_schema))
                .coerce(logical, &df_schema)
                .map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let logical = safe_float_division(logical, &df_schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = SESSION.create_physical_expr(logical, &df_schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = reindex(physical, &positions).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = fail_on_overflow(physical).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = chain::flatten(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = fold_constants(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = settle_arguments(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = lenient::wrap(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let got = physical.data_type(&schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            if !holds(&output.dtype, &got) {
                return Err(refuse(
                    output,
                    format!("computes {}, which {} feature cannot hold", type_name(&got), with_article(&type_name(&output.dtype))),
                ));
            }
            compiled.push(Compiled { name: output.name.clone(), dtype: output.dtype.clone(), expr: physical });
        }
        Ok(Program { schema, outputs: compiled })
    }

    /// The columns a batch given to [`Program::evaluate`] must have, in order (their
    /// names are the columns' names without qualifiers).
    pub fn input_schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The outputs' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.outputs.iter().map(|o| o.name.as_str())
    }

    /// The input columns output `k` reads (positions in [`Program::input_schema`]),
    /// ascending, each once. A column no output reads may be all nulls: no value
    /// depends on it.
    pub fn reads(&self, k: usize) -> Vec<usize> {
        let mut read: Vec<usize> =
            datafusion::physical_expr::utils::collect_columns(&self.outputs[k].expr).iter().map(|c| c.index()).collect();
        read.sort_unstable();
        read.dedup();
        read
    }

    /// Every output for every row of `batch`, each of its declared type. A row whose
    /// value cannot be computed is null, and counted in [`Evaluated::failed`].
    ///
    /// # Errors
    /// [`InputError`] when `batch`'s columns are not [`Program::input_schema`]'s types.
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<Evaluated, InputError> {
        let (ours, theirs) = (self.schema.fields(), batch.schema_ref().fields());
        if ours.len() != theirs.len() || ours.iter().zip(theirs.iter()).any(|(a, b)| a.data_type() != b.data_type()) {
            return Err(InputError(format!(
                "expected columns of types [{}], got [{}]",
                ours.iter().map(|f| type_name(f.data_type())).collect::<Vec<_>>().join(", "),
                theirs.iter().map(|f| type_name(f.data_type())).collect::<Vec<_>>().join(", ")
            )));
        }
        let mut columns = Vec::with_capacity(self.outputs.len());
        let mut failed = Vec::with_capacity(self.outputs.len());
        for output in &self.outputs {
            let (column, n) = output.evaluate(batch);
            columns.push(column);
            failed.push(n);
        }
        Ok(Evaluated { columns, failed })
    }
}

impl Compiled {
    /// The whole batch at once, the rows its lenient parts could not compute null; when
    /// a part under a `CASE`, `AND` or `OR` fails, each half, down to single rows, each
    /// row that fails null: a few such rows among millions cost a few dozen evaluations
    /// each, not one per row. Every function of the language computes a
    /// row from that row alone, so every split gives the same values for the rows that
    /// compute.
    fn evaluate(&self, batch: &RecordBatch) -> (ArrayRef, u64) {
        let n = batch.num_rows();
        // Most failing rows are found where they fail (`lenient`): null, counted once.
        let (result, marked) = lenient::marking(n, || self.evaluate_exactly(batch));
        if let Ok(column) = result {
            let Some(rows) = marked else { return (column, 0) };
            let mut failed = vec![false; n];
            rows.into_iter().for_each(|r| failed[r] = true);
            let failed = arrow::array::BooleanArray::from(failed);
            let count = failed.true_count() as u64;
            return (arrow::compute::nullif(&column, &failed).expect("a mask of the column's length"), count);
        }
        if n <= 1 {
            return (new_null_array(&self.dtype, n), n as u64);
        }
        let (left, lf) = self.evaluate(&batch.slice(0, n / 2));
        let (right, rf) = self.evaluate(&batch.slice(n / 2, n - n / 2));
        (concat(&[left.as_ref(), right.as_ref()]).expect("columns of one type"), lf + rf)
    }

    fn evaluate_exactly(&self, batch: &RecordBatch) -> Result<ArrayRef, DataFusionError> {
        let value = self.expr.evaluate(batch)?.into_array(batch.num_rows())?;
        if value.data_type() == &self.dtype { Ok(value) } else { Ok(cast(&value, &self.dtype)?) }
    }
}

/// Whether a feature declared `declared` holds what an expression computes: the same
/// type, a wider integer (a count, unsigned, as int64), an integer or float32 as
/// float64, or nothing but nulls.
fn holds(declared: &DataType, got: &DataType) -> bool {
    use DataType::*;
    declared == got
        || matches!(got, Null)
        || matches!((declared, got), (Int64, Int8 | Int16 | Int32 | UInt8 | UInt16 | UInt32 | UInt64))
        || matches!((declared, got), (Int32, Int8 | Int16 | UInt8 | UInt16))
        || matches!((declared, got), (Float64, Float32 | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64))
        || matches!((declared, got), (Float32, Int8 | Int16 | UInt8 | UInt16))
        || matches!((declared, got), (Utf8, Utf8View | LargeUtf8))
        || matches!((declared, got), (Timestamp(u1, z1), Timestamp(u2, z2)) if u1 == u2 && z1.is_some() == z2.is_some())
        || matches!((declared, got), (List(a), List(b) | LargeList(b)) if a.data_type() == b.data_type())
}

/// The schema expressions are planned against, and per column of it the column's
/// position in `columns`: the bare columns first, then the qualified ones. DataFusion
/// resolves a bare name to the one unqualified column of that name where qualified ones
/// share it, and finds a column's position by the first of its name: so a bare name is
/// the bare column (`amount`, a request field), `view.name` the qualified one
/// (`stats.amount`). Its check that refuses such pairs as ambiguous is not run (a
/// merge does not run it).
fn planning_schema(columns: &[Column]) -> Result<(DFSchema, Vec<usize>), DataFusionError> {
    let (bare, qualified): (Vec<usize>, Vec<usize>) = (0..columns.len()).partition(|&i| columns[i].qualifier.is_none());
    let field = |i: usize| Arc::new(Field::new(&columns[i].name, columns[i].dtype.clone(), true));
    let mut schema = DFSchema::new_with_metadata(bare.iter().map(|&i| (None, field(i))).collect(), Default::default())?;
    let named: Vec<(Option<TableReference>, Arc<Field>)> =
        qualified.iter().map(|&i| (columns[i].qualifier.as_deref().map(TableReference::bare), field(i))).collect();
    schema.merge(&DFSchema::new_with_metadata(named, Default::default())?);
    Ok((schema, bare.into_iter().chain(qualified).collect()))
}

/// `expr` planned against [`planning_schema`]'s order, reading the columns where
/// `columns` has them (`positions[i]`: the position of the planning schema's column `i`).
fn reindex(expr: Arc<dyn PhysicalExpr>, positions: &[usize]) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
    use datafusion::physical_expr::expressions::Column as ColumnExpr;
    expr.transform_up(|e| {
        let Some(c) = e.downcast_ref::<ColumnExpr>() else { return Ok(Transformed::no(e)) };
        let at =
            positions.get(c.index()).copied().ok_or_else(|| DataFusionError::Internal(format!("column {} out of range", c.index())))?;
        Ok(Transformed::yes(Arc::new(ColumnExpr::new(c.name(), at)) as Arc<dyn PhysicalExpr>))
    })
    .map(|t| t.data)
}

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
fn plain(e: &DataFusionError) -> String {
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
fn parse_reason(e: &DataFusionError, text: &str, columns: &[Column]) -> String {
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
fn planning_reason(e: &DataFusionError, columns: &[Column]) -> String {
    let reason = plain(e);
    ambiguous(&reason, columns).unwrap_or(reason)
}

/// A bare name that DataFusion finds ambiguous, with the qualified names it may mean.
fn ambiguous(reason: &str, columns: &[Column]) -> Option<String> {
    let rest = reason.split("Ambiguous reference to unqualified field ").nth(1)?;
    let name = rest.trim_end_matches(['.', ' ']);
    let meant: Vec<String> = columns.iter().filter(|c| c.name == name).map(|c| format!("`{}`", c.reference())).collect();
    Some(format!("`{name}` is a feature of more than one input: write {}", meant.join(" or ")))
}

/// The parser's `message` (`Expected: X, found: Y at Line: 1, Column: 5`) as a sentence
/// with the line and column where `text` stops parsing (its end when the message gives
/// none).
fn unparsed(message: &str, text: &str) -> String {
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
fn end_of(text: &str) -> (usize, usize) {
    let line = text.split('\n').count();
    let column = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The deepest the parser recurses: an expression within [`MAX_EXPR_DEPTH`] needs a few
/// levels of it per level of its own (parentheses, operands, arguments); beyond it, the
/// text nests deeper than [`MAX_EXPR_DEPTH`].
const PARSE_DEPTH: usize = 10 * MAX_EXPR_DEPTH;

/// The stack expressions are compiled on.
const COMPILE_STACK: usize = 256 << 20;

/// Functions DataFusion computes by rewriting them (`COALESCE` into a `CASE` that
/// computes only the argument it returns), rewritten as its planner does; nothing else
/// of its simplifier runs (its constant folding would wrap an overflowing literal
/// instead of failing the row).
fn rewrite_functions(expr: Expr, schema: &DFSchema) -> Result<Expr, DataFusionError> {
    let context = simplify_context(schema);
    expr.transform_up(|e| {
        let Expr::ScalarFunction(f) = &e else { return Ok(Transformed::no(e)) };
        match f.func.simplify(f.args.clone(), &context)? {
            ExprSimplifyResult::Simplified(rewritten) => Ok(Transformed::yes(rewritten)),
            ExprSimplifyResult::Original(_) => Ok(Transformed::no(e)),
        }
    })
    .map(|t| t.data)
}

fn simplify_context(schema: &DFSchema) -> SimplifyContext {
    SimplifyContext::builder()
        .with_schema(Arc::new(schema.clone()))
        .with_config_options(Arc::clone(SESSION.state().config_options()))
        .build()
}

/// `/` and `%` with a float operand through [`FloatDivision`], so that a zero divisor
/// fails the row (and so gives null) as it does for integers, instead of infinity; and
/// an integer's negation as `0 - x`, which fails on overflow (`-x` wraps).
fn safe_float_division(expr: Expr, schema: &DFSchema) -> Result<Expr, DataFusionError> {
    expr.transform_up(|e| {
        if let Some(seconds) = duration_epoch(&e, schema)? {
            return Ok(Transformed::yes(seconds));
        }
        if let Expr::Negative(x) = &e
            && x.get_type(schema)?.is_integer()
        {
            let zero = datafusion::logical_expr::lit(datafusion::common::ScalarValue::new_zero(&x.get_type(schema)?)?);
            return Ok(Transformed::yes(Expr::BinaryExpr(datafusion::logical_expr::BinaryExpr::new(
                Box::new(zero),
                Operator::Minus,
                x.clone(),
            ))));
        }
        let Expr::BinaryExpr(b) = &e else { return Ok(Transformed::no(e)) };
        if !matches!(b.op, Operator::Divide | Operator::Modulo) {
            return Ok(Transformed::no(e));
        }
        let is_float = |x: &Expr| x.get_type(schema).map(|t| matches!(t, DataType::Float32 | DataType::Float64 | DataType::Float16));
        if !(is_float(&b.left)? || is_float(&b.right)?) {
            return Ok(Transformed::no(e));
        }
        let udf = FloatDivision::new(b.op == Operator::Modulo);
        let args = vec![(*b.left).clone(), (*b.right).clone()];
        Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(ScalarUDF::new_from_impl(udf)), args))))
    })
    .map(|t| t.data)
}

/// `date_part('epoch', d)` of a duration (a difference of timestamps) as its seconds
/// with their fraction, `d`'s count over its units per second: DataFusion's own keeps
/// the fraction only below about two seconds (its nanoseconds overflow an int32 beyond).
fn duration_epoch(e: &Expr, schema: &DFSchema) -> Result<Option<Expr>, DataFusionError> {
    use arrow::datatypes::TimeUnit;
    let Expr::ScalarFunction(f) = e else { return Ok(None) };
    let [Expr::Literal(part, _), value] = f.args.as_slice() else { return Ok(None) };
    if f.func.name() != "date_part" || !part.try_as_str().flatten().is_some_and(|p| p.eq_ignore_ascii_case("epoch")) {
        return Ok(None);
    }
    let DataType::Duration(unit) = value.get_type(schema)? else { return Ok(None) };
    let per_second = match unit {
        TimeUnit::Second => 1.0,
        TimeUnit::Millisecond => 1e3,
        TimeUnit::Microsecond => 1e6,
        TimeUnit::Nanosecond => 1e9,
    };
    let count = Expr::Cast(datafusion::logical_expr::Cast::new(Box::new(value.clone()), DataType::Int64));
    let count = Expr::Cast(datafusion::logical_expr::Cast::new(Box::new(count), DataType::Float64));
    let udf = Arc::new(ScalarUDF::new_from_impl(FloatDivision::new(false)));
    Ok(Some(Expr::ScalarFunction(ScalarFunction::new_udf(udf, vec![count, datafusion::logical_expr::lit(per_second)]))))
}

/// Integer `+`, `-` and `*` that overflow fail the row instead of wrapping around.
fn fail_on_overflow(expr: Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
    expr.transform_up(|e| {
        let Some(b) = e.downcast_ref::<BinaryExpr>() else { return Ok(Transformed::no(e)) };
        let checked = BinaryExpr::new(Arc::clone(b.left()), *b.op(), Arc::clone(b.right())).with_fail_on_overflow(true);
        Ok(Transformed::yes(Arc::new(checked) as Arc<dyn PhysicalExpr>))
    })
    .map(|t| t.data)
}

/// Every part of an expression that reads no column (a literal coerced to its
/// operand's type, a constant function call), computed once here by the same code and
/// replaced by its value: the same value every row would compute, without its cost per
/// batch. A part that cannot compute (an overflowing constant) is left as it is, to
/// fail each row as it would.
fn fold_constants(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
    use datafusion::common::ScalarValue;
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::physical_expr::expressions::Literal;
    let columns = schema.fields().iter().map(|f| new_null_array(f.data_type(), 1)).collect();
    let one_row = RecordBatch::try_new_with_options(Arc::clone(schema), columns, &RecordBatchOptions::new().with_row_count(Some(1)))?;
    expr.transform_down(|e| {
        if e.downcast_ref::<Literal>().is_some() || !datafusion::physical_expr::utils::collect_columns(&e).is_empty() {
            return Ok(Transformed::no(e));
        }
        let value = match e.evaluate(&one_row) {
            Ok(ColumnarValue::Scalar(s)) => s,
            Ok(ColumnarValue::Array(a)) if a.len() == 1 => ScalarValue::try_from_array(&a, 0)?,
            _ => return Ok(Transformed::no(e)),
        };
        if value.data_type() != e.data_type(schema)? {
            return Ok(Transformed::no(e));
        }
        Ok(Transformed::new(Arc::new(Literal::new(value)) as Arc<dyn PhysicalExpr>, true, TreeNodeRecursion::Jump))
    })
    .map(|t| t.data)
}

/// Every argument of a function call, its output field worked out once, here: DataFusion
/// asks each argument for its field at every evaluation, which for anything but a column
/// formats the argument's text and coerces its types again — most of a small batch's
/// cost — and for a column copies its name. The values are the same; only that
/// question is answered from memory.
fn settle_arguments(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
    expr.transform_up(|e| {
        if e.downcast_ref::<ScalarFunctionExpr>().is_none() {
            return Ok(Transformed::no(e));
        }
        let children = e
            .children()
            .into_iter()
            .map(|c| -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
                if c.downcast_ref::<Settled>().is_some() {
                    return Ok(Arc::clone(c));
                }
                Ok(Arc::new(Settled { field: c.return_field(schema)?, inner: Arc::clone(c) }))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Transformed::yes(Arc::clone(&e).with_new_children(children)?))
    })
    .map(|t| t.data)
}

/// An expression whose output field is known ([`settle_arguments`]).
#[derive(Debug)]
struct Settled {
    inner: Arc<dyn PhysicalExpr>,
    field: FieldRef,
}

impl PartialEq for Settled {
    fn eq(&self, other: &Settled) -> bool {
        self.inner.as_ref() == other.inner.as_ref() && self.field == other.field
    }
}

impl Eq for Settled {}

impl std::hash::Hash for Settled {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.as_ref().hash(state);
        self.field.hash(state);
    }
}

impl std::fmt::Display for Settled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl PhysicalExpr for Settled {
    fn data_type(&self, _schema: &arrow::datatypes::Schema) -> datafusion::common::Result<DataType> {
        Ok(self.field.data_type().clone())
    }

    fn nullable(&self, _schema: &arrow::datatypes::Schema) -> datafusion::common::Result<bool> {
        Ok(self.field.is_nullable())
    }

    fn return_field(&self, _schema: &arrow::datatypes::Schema) -> datafusion::common::Result<FieldRef> {
        Ok(Arc::clone(&self.field))
    }

    fn evaluate(&self, batch: &RecordBatch) -> datafusion::common::Result<ColumnarValue> {
        self.inner.evaluate(batch)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> datafusion::common::Result<Arc<dyn PhysicalExpr>> {
        let inner = children.into_iter().next().expect("one child");
        Ok(Arc::new(Settled { inner, field: Arc::clone(&self.field) }))
    }

    fn fmt_sql(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt_sql(f)
    }
}

/// Float division (`/`) or remainder (`%`) in float64 that fails on a zero divisor.
#[derive(Debug, PartialEq, Eq, Hash)]
struct FloatDivision {
    remainder: bool,
    signature: Signature,
}

impl FloatDivision {
    fn new(remainder: bool) -> FloatDivision {
        FloatDivision { remainder, signature: Signature::uniform(2, vec![DataType::Float64], Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for FloatDivision {
    fn name(&self) -> &str {
        if self.remainder { "quiver_float_remainder" } else { "quiver_float_division" }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::common::Result<ColumnarValue> {
        let n = args.number_rows;
        let [a, b] = &args.args[..] else {
            return Err(DataFusionError::Internal(format!("{} takes two arguments", self.name())));
        };
        let (a, b) = (a.to_array(n)?, b.to_array(n)?);
        let a = a.as_any().downcast_ref::<Float64Array>().ok_or_else(|| DataFusionError::Internal("float64 expected".into()))?;
        let b = b.as_any().downcast_ref::<Float64Array>().ok_or_else(|| DataFusionError::Internal("float64 expected".into()))?;
        let remainder = self.remainder;
        // Null where either is null; a zero divisor fails the batch (then the row).
        let out: Float64Array = arrow::compute::kernels::arity::try_binary(a, b, |x: f64, y: f64| {
            if y == 0.0 {
                return Err(arrow::error::ArrowError::DivideByZero);
            }
            Ok(if remainder { x % y } else { x / y })
        })?;
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

#[cfg(test)]
mod tests;
