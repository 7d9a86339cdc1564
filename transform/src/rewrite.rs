//! What planning rewrites in an expression before it runs: functions DataFusion
//! computes by rewriting, float division that never divides by zero silently, integer
//! arithmetic that fails a row on overflow, constants folded without wrapping, and
//! arguments settled to the types the functions take.

use std::sync::Arc;

use arrow::array::{Array, Float64Array, RecordBatch, RecordBatchOptions, new_null_array};
use arrow::datatypes::{DataType, FieldRef, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, DataFusionError};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, Operator, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

use crate::SESSION;

/// Functions DataFusion computes by rewriting them (`COALESCE` into a `CASE` that
/// computes only the argument it returns), rewritten as its planner does; nothing else
/// of its simplifier runs (its constant folding would wrap an overflowing literal
/// instead of failing the row).
pub(crate) fn rewrite_functions(expr: Expr, schema: &DFSchema) -> Result<Expr, DataFusionError> {
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

pub(crate) fn simplify_context(schema: &DFSchema) -> SimplifyContext {
    SimplifyContext::builder()
        .with_schema(Arc::new(schema.clone()))
        .with_config_options(Arc::clone(SESSION.state().config_options()))
        .build()
}

/// `/` and `%` with a float operand through [`FloatDivision`], so that a zero divisor
/// fails the row (and so gives null) as it does for integers, instead of infinity; and
/// an integer's negation as `0 - x`, which fails on overflow (`-x` wraps).
pub(crate) fn safe_float_division(expr: Expr, schema: &DFSchema) -> Result<Expr, DataFusionError> {
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
pub(crate) fn duration_epoch(e: &Expr, schema: &DFSchema) -> Result<Option<Expr>, DataFusionError> {
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

/// Integer `+`, `-` and `*` that overflow fail the row instead of wrapping around; an
/// `IN` list planned again over its checked items (its set of constant items was
/// computed when it was planned, with the wrapping arithmetic: an item that overflows
/// makes the list not constant, and the row fails as anywhere else).
pub(crate) fn fail_on_overflow(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
    use datafusion::physical_expr::expressions::InListExpr;
    expr.transform_up(|e| {
        if let Some(list) = e.downcast_ref::<InListExpr>() {
            let checked = InListExpr::try_new(Arc::clone(list.expr()), list.list().to_vec(), list.negated(), schema)?;
            return Ok(Transformed::yes(Arc::new(checked) as Arc<dyn PhysicalExpr>));
        }
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
pub(crate) fn fold_constants(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
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
pub(crate) fn settle_arguments(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
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
pub(crate) struct FloatDivision {
    remainder: bool,
    signature: Signature,
}

impl FloatDivision {
    pub(crate) fn new(remainder: bool) -> FloatDivision {
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
