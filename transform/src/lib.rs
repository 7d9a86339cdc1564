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

use arrow::array::{Array, ArrayRef, RecordBatch, new_null_array};
use arrow::compute::{cast, concat};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, DataFusionError, TableReference};
use datafusion::logical_expr::ScalarUDF;
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::{SessionConfig, SessionContext};

mod canonical;
mod chain;
mod check;
mod lenient;
mod messages;
mod rewrite;
mod row;

pub use check::{FUNCTIONS, MAX_EXPR_CHARS, MAX_EXPR_DEPTH, MAX_EXPR_NODES};
/// The value of one cell, as [`Program::evaluate_row`] takes and gives them.
pub use datafusion::common::ScalarValue;
use messages::{parse_reason, plain, planning_reason};
pub use messages::{shown, type_name, with_article};
use rewrite::{
    FloatDivision, fail_on_overflow, fold_constants, rewrite_functions, safe_float_division, settle_arguments, simplify_context,
};

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
    /// The same plan for one row at a time (the row evaluator).
    row: row::Node,
    /// `row` compiled for its types.
    typed: row::Typed,
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
        Self::compile_with(columns, outputs, true)
    }

    /// [`Program::compile`], with or without the parts that read no column computed
    /// once at compile time (without: each is computed per row, by both evaluators —
    /// how the differential fuzzer runs, so that neither is tested only on columns).
    ///
    /// # Errors
    /// As [`Program::compile`].
    pub fn compile_with(columns: &[Column], outputs: &[Output], fold: bool) -> Result<Program, ExprError> {
        // Parsing and checking recurse once per level of the text's nesting, bounded
        // only after parsing: on a thread whose stack any text within
        // `MAX_EXPR_CHARS` fits in.
        std::thread::scope(|s| {
            let compiling = std::thread::Builder::new()
                .name("quiver-expr".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(s, || Self::compile_here(columns, outputs, fold))
                .expect("a thread to compile expressions on");
            compiling.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn compile_here(columns: &[Column], outputs: &[Output], fold: bool) -> Result<Program, ExprError> {
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
            let physical = fail_on_overflow(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let folded = |p: Arc<dyn PhysicalExpr>| if fold { fold_constants(p, &schema) } else { Ok(p) };
            // The row evaluator's plan: the same (its NaNs the one NaN before constants
            // are folded), before chains and lenient parts are wrapped for batches.
            let row = canonical::wrap(Arc::clone(&physical), &schema)
                .and_then(folded)
                .and_then(|p| row::compile(&p, &schema))
                .map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = chain::flatten(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = canonical::wrap(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = folded(physical).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = settle_arguments(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let physical = lenient::wrap(physical, &schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            let got = physical.data_type(&schema).map_err(|e| refuse(output, planning_reason(&e, columns)))?;
            if !holds(&output.dtype, &got) {
                return Err(refuse(
                    output,
                    format!("computes {}, which {} feature cannot hold", type_name(&got), with_article(&type_name(&output.dtype))),
                ));
            }
            let typed = row::Typed::of(&row, &schema);
            compiled.push(Compiled { name: output.name.clone(), dtype: output.dtype.clone(), expr: physical, row, typed });
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

    /// Every output for one row by the row evaluator: `row` holds one value per column
    /// of [`Program::input_schema`], of its type; the outputs' values, each of its
    /// declared type, are appended to `out`. Returns how many could not be computed
    /// (null). The same values as [`Program::evaluate`] over a batch holding the row.
    ///
    /// # Errors
    /// [`InputError`] when `row` does not have one value per column.
    pub fn evaluate_row(&self, row: &[ScalarValue], out: &mut Vec<ScalarValue>) -> Result<u64, InputError> {
        if row.len() != self.schema.fields().len() {
            return Err(InputError(format!("expected {} values, got {}", self.schema.fields().len(), row.len())));
        }
        let mut failed = 0;
        for output in &self.outputs {
            let pushed = match output.typed.push(row, &output.dtype, out) {
                Some(pushed) => pushed,
                None => output.row.evaluate(row).and_then(|v| row::declared(v, &output.dtype)).map(|v| out.push(v)),
            };
            if pushed.is_err() {
                failed += 1;
                out.push(row::null_of(&output.dtype));
            }
        }
        Ok(failed)
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

/// The deepest the parser recurses: an expression within [`MAX_EXPR_DEPTH`] needs a few
/// levels of it per level of its own (parentheses, operands, arguments); beyond it, the
/// text nests deeper than [`MAX_EXPR_DEPTH`].
const PARSE_DEPTH: usize = 10 * MAX_EXPR_DEPTH;

/// The stack expressions are compiled on.
const COMPILE_STACK: usize = 256 << 20;

#[cfg(test)]
mod row_fuzz;
#[cfg(test)]
mod tests;
