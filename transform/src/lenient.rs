//! Rows that cannot be computed, found where they fail (docs/transformations.md#the-language).
//!
//! A value that cannot be computed makes its row null, as if the row were computed
//! alone. Arrow's kernels fail a whole batch for one such row, and splitting the batch
//! until the failing rows stand alone re-evaluates the whole expression a few dozen
//! times per failing row: fine for a few, slow when a tenth of the rows divide by zero.
//! So each part of an expression that may fail and that every row reaches — no `CASE`,
//! `AND` or `OR` above it, which may not compute it for a row alone — is wrapped in a
//! [`Lenient`]: when it fails, it computes only its own operation again over its
//! arguments' values (a zero divisor replaced, else split until the failing rows stand
//! alone), gives null for the rows that fail and marks them, and the whole expression's
//! value for a marked row is null and counted. Rows that compute get the values they
//! get alone: every operation computes a row from that row alone.

use std::cell::RefCell;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, Scalar, new_null_array};
use arrow::compute::{cast, concat, nullif};
use arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::expressions::{BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, NegativeExpr};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

use crate::chain::Chain;

thread_local! {
    /// During one evaluation of a whole expression: its batch's rows, and those a
    /// [`Lenient`] part could not compute.
    static MARKED: RefCell<Option<(usize, Vec<usize>)>> = const { RefCell::new(None) };
}

/// Runs `evaluate` (of a whole expression over `rows` rows), and returns what it
/// returned with the rows its lenient parts could not compute, when there are any.
pub(crate) fn marking<T>(rows: usize, evaluate: impl FnOnce() -> T) -> (T, Option<Vec<usize>>) {
    let outer = MARKED.with(|m| m.replace(Some((rows, Vec::new()))));
    let out = evaluate();
    let marked = MARKED.with(|m| m.replace(outer)).map(|(_, rows)| rows).filter(|rows| !rows.is_empty());
    (out, marked)
}

/// Wraps every part of `expr` that may fail and that every row reaches in a [`Lenient`]
/// (a chain's links: lenient themselves, [`Chain`]).
pub(crate) fn wrap(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
    if let Some(chain) = expr.downcast_ref::<Chain>() {
        if chain.chooses() {
            return Ok(expr);
        }
        return Ok(Arc::new(chain.leniently(|part| wrap(part, schema), evaluate_part)?));
    }
    // `IN (...)` stops at the first item equal to the value: a later item is computed
    // for a row only if the earlier ones are not.
    let chooses = expr.downcast_ref::<CaseExpr>().is_some()
        || expr.downcast_ref::<InListExpr>().is_some()
        || expr.downcast_ref::<BinaryExpr>().is_some_and(|b| matches!(b.op(), Operator::And | Operator::Or));
    let children = expr.children();
    if chooses || children.is_empty() {
        return Ok(expr);
    }
    let wrapped = children.into_iter().map(|c| wrap(Arc::clone(c), schema)).collect::<Result<Vec<_>, _>>()?;
    let expr = Arc::clone(&expr).with_new_children(wrapped)?;
    if !may_fail(&expr) {
        return Ok(expr);
    }
    Ok(Arc::new(Lenient::new(expr, schema)?))
}

fn may_fail(expr: &Arc<dyn PhysicalExpr>) -> bool {
    expr.downcast_ref::<BinaryExpr>()
        .is_some_and(|b| matches!(b.op(), Operator::Divide | Operator::Modulo | Operator::Plus | Operator::Minus | Operator::Multiply))
        || expr.downcast_ref::<CastExpr>().is_some()
        || expr.downcast_ref::<ScalarFunctionExpr>().is_some()
        || expr.downcast_ref::<NegativeExpr>().is_some()
}

/// `part` — an operation every row of `batch` reaches, a link of a [`Chain`] — over
/// `batch`, as a [`Lenient`] part computes it: null for the rows it cannot compute, and
/// those rows marked.
pub(crate) fn evaluate_part(part: Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<ColumnarValue, DataFusionError> {
    let error = match part.evaluate(batch) {
        Ok(value) => return Ok(value),
        Err(e) => e,
    };
    Lenient::new(part, batch.schema_ref())?.recovered(batch, error)
}

/// A part of an expression that gives null for the rows it cannot compute, and marks
/// them ([`marking`]).
#[derive(Debug)]
pub(crate) struct Lenient {
    inner: Arc<dyn PhysicalExpr>,
    /// `inner`'s own operation over its arguments' values (column `i`: argument `i`).
    operation: Arc<dyn PhysicalExpr>,
    arguments: SchemaRef,
    dtype: DataType,
    /// A division or remainder: its second argument is the divisor.
    divides: bool,
}

impl Lenient {
    fn new(inner: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Lenient, DataFusionError> {
        let children = inner.children();
        let mut fields = Vec::with_capacity(children.len());
        let mut columns: Vec<Arc<dyn PhysicalExpr>> = Vec::with_capacity(children.len());
        for (i, child) in children.iter().enumerate() {
            fields.push(Field::new(format!("arg{i}"), child.data_type(schema)?, true));
            columns.push(Arc::new(Column::new(&format!("arg{i}"), i)));
        }
        let operation = Arc::clone(&inner).with_new_children(columns)?;
        let divides = inner.downcast_ref::<BinaryExpr>().is_some_and(|b| matches!(b.op(), Operator::Divide | Operator::Modulo))
            || inner.downcast_ref::<ScalarFunctionExpr>().is_some_and(|f| f.name().starts_with("quiver_float_"));
        let dtype = inner.data_type(schema)?;
        Ok(Lenient { inner, operation, arguments: Arc::new(Schema::new(fields)), dtype, divides })
    }

    /// `inner` over `batch` again, giving null for the rows it cannot compute; their
    /// positions in `failed`. `None` when an argument itself fails, or outside a
    /// [`marking`] of this batch's rows: the caller's error stands.
    fn recover(&self, batch: &RecordBatch, failed: &mut Vec<usize>) -> Option<ArrayRef> {
        let n = batch.num_rows();
        if MARKED.with(|m| m.borrow().as_ref().map(|(rows, _)| *rows)) != Some(n) {
            return None;
        }
        let arguments: Vec<ArrayRef> =
            self.inner.children().iter().map(|c| c.evaluate(batch).and_then(|v| v.into_array(n))).collect::<Result<_, _>>().ok()?;
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        let arguments = RecordBatch::try_new_with_options(Arc::clone(&self.arguments), arguments, &options).ok()?;
        if self.divides
            && let Some(out) = self.without_zero_divisors(&arguments, failed)
        {
            return Some(out);
        }
        failed.clear();
        self.split(&arguments, 0, failed).ok()
    }

    /// The division over its arguments with each zero divisor (beside a dividend) taken
    /// as one and its row null: `None` when there is none, or another row fails too.
    fn without_zero_divisors(&self, arguments: &RecordBatch, failed: &mut Vec<usize>) -> Option<ArrayRef> {
        let (dividend, divisor) = (arguments.column(0), arguments.column(1));
        // Zero as the division's own test sees it (IEEE: -0.0 is zero), whatever the type.
        let divisor_f64 = cast(divisor, &DataType::Float64).ok()?;
        let values = divisor_f64.as_primitive::<Float64Type>();
        let zero: BooleanArray =
            (0..arguments.num_rows()).map(|r| Some(dividend.is_valid(r) && values.is_valid(r) && values.value(r) == 0.0)).collect();
        if zero.true_count() == 0 {
            return None;
        }
        let one = ScalarValue::new_one(divisor.data_type()).ok()?.to_array().ok()?;
        let safe = arrow::compute::kernels::zip::zip(&zero, &Scalar::new(one), divisor).ok()?;
        let mut columns = arguments.columns().to_vec();
        columns[1] = safe;
        let options = RecordBatchOptions::new().with_row_count(Some(arguments.num_rows()));
        let safe = RecordBatch::try_new_with_options(Arc::clone(&self.arguments), columns, &options).ok()?;
        let out = self.operation.evaluate(&safe).and_then(|v| v.into_array(safe.num_rows())).ok()?;
        failed.extend(zero.iter().enumerate().filter(|(_, z)| *z == Some(true)).map(|(r, _)| r));
        nullif(&out, &zero).ok()
    }

    /// The operation over its arguments; a part that fails split in two, down to single
    /// rows, each that fails null and recorded (offset by `offset`).
    fn split(&self, arguments: &RecordBatch, offset: usize, failed: &mut Vec<usize>) -> Result<ArrayRef, DataFusionError> {
        let n = arguments.num_rows();
        if let Ok(out) = self.operation.evaluate(arguments).and_then(|v| v.into_array(n)) {
            return Ok(out);
        }
        if n <= 1 {
            failed.extend(offset..offset + n);
            return Ok(new_null_array(&self.dtype, n));
        }
        let left = self.split(&arguments.slice(0, n / 2), offset, failed)?;
        let right = self.split(&arguments.slice(n / 2, n - n / 2), offset + n / 2, failed)?;
        Ok(concat(&[left.as_ref(), right.as_ref()])?)
    }
}

impl PartialEq for Lenient {
    fn eq(&self, other: &Lenient) -> bool {
        self.inner.as_ref() == other.inner.as_ref()
    }
}

impl Eq for Lenient {}

impl std::hash::Hash for Lenient {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.as_ref().hash(state);
    }
}

impl std::fmt::Display for Lenient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl PhysicalExpr for Lenient {
    fn data_type(&self, schema: &Schema) -> datafusion::common::Result<DataType> {
        self.inner.data_type(schema)
    }

    fn nullable(&self, _schema: &Schema) -> datafusion::common::Result<bool> {
        Ok(true)
    }

    fn return_field(&self, schema: &Schema) -> datafusion::common::Result<arrow::datatypes::FieldRef> {
        Ok(Arc::new(self.inner.return_field(schema)?.as_ref().clone().with_nullable(true)))
    }

    fn evaluate(&self, batch: &RecordBatch) -> datafusion::common::Result<ColumnarValue> {
        match self.inner.evaluate(batch) {
            Ok(value) => Ok(value),
            Err(error) => self.recovered(batch, error),
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> datafusion::common::Result<Arc<dyn PhysicalExpr>> {
        let inner = children.into_iter().next().expect("one child");
        Ok(Arc::new(Lenient { inner, ..Lenient::clone_parts(&self) }))
    }

    fn fmt_sql(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt_sql(f)
    }
}

impl Lenient {
    /// After `inner` failed with `error` over `batch`: its value with the rows it cannot
    /// compute null, those rows marked; `error` when it cannot tell them.
    fn recovered(&self, batch: &RecordBatch, error: DataFusionError) -> datafusion::common::Result<ColumnarValue> {
        let mut failed = Vec::new();
        let Some(out) = self.recover(batch, &mut failed) else { return Err(error) };
        MARKED.with(|m| {
            if let Some((_, marked)) = m.borrow_mut().as_mut() {
                marked.extend(failed);
            }
        });
        Ok(ColumnarValue::Array(out))
    }

    fn clone_parts(&self) -> Lenient {
        Lenient {
            inner: Arc::clone(&self.inner),
            operation: Arc::clone(&self.operation),
            arguments: Arc::clone(&self.arguments),
            dtype: self.dtype.clone(),
            divides: self.divides,
        }
    }
}
