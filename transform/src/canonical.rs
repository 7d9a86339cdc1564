//! One NaN (docs/transformations.md#the-language): a NaN an operation computes is the
//! one positive quiet NaN, whatever sign and payload the machine gave it.
//!
//! IEEE 754 leaves a computed NaN's sign to the hardware and the compiler: `inf / inf`
//! is a negative NaN on x86, and which operand's NaN `NaN + NaN` keeps depends on how a
//! loop was compiled — the vectorized body of an Arrow kernel and its scalar tail may
//! differ. Values are ordered with NaN's sign (a negative NaN below every number in
//! Arrow's total order: `greatest(0.1, inf / inf)` would be 0.1 or NaN), so every
//! operation that computes a float — arithmetic, a function, a cast, a negation, a
//! chain — gives its NaNs as [`f64::NAN`]: both evaluators, every batch, the same value.
//! A NaN read from a column is passed on as it is until an operation computes with it.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Float32Array, Float64Array};
use arrow::datatypes::{DataType, Float32Type, Float64Type, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, NegativeExpr};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

use crate::chain::Chain;

/// Every operation of `expr` that computes a float, its NaNs made the one NaN.
pub(crate) fn wrap(expr: Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<Arc<dyn PhysicalExpr>, DataFusionError> {
    expr.transform_up(|e| {
        let computes = e.downcast_ref::<BinaryExpr>().is_some()
            || e.downcast_ref::<NegativeExpr>().is_some()
            || e.downcast_ref::<ScalarFunctionExpr>().is_some()
            || e.downcast_ref::<CastExpr>().is_some()
            || e.downcast_ref::<Chain>().is_some();
        if !computes || !matches!(e.data_type(schema)?, DataType::Float64 | DataType::Float32) {
            return Ok(Transformed::no(e));
        }
        Ok(Transformed::yes(Arc::new(OneNan { inner: e }) as Arc<dyn PhysicalExpr>))
    })
    .map(|t| t.data)
}

/// `e` without the wrapper that makes its NaNs the one NaN (the row evaluator does
/// that itself).
pub(crate) fn unwrapped(e: &Arc<dyn PhysicalExpr>) -> &Arc<dyn PhysicalExpr> {
    e.downcast_ref::<OneNan>().map_or(e, |w| &w.inner)
}

/// `v` with a NaN made the one NaN.
pub(crate) fn scalar(v: ScalarValue) -> ScalarValue {
    match v {
        ScalarValue::Float64(Some(x)) if x.is_nan() => ScalarValue::Float64(Some(f64::NAN)),
        ScalarValue::Float32(Some(x)) if x.is_nan() => ScalarValue::Float32(Some(f32::NAN)),
        other => other,
    }
}

/// `a` with its NaNs made the one NaN (itself when it has none of another kind).
fn array(a: ArrayRef) -> ArrayRef {
    if let Some(floats) = a.as_primitive_opt::<Float64Type>() {
        if floats.values().iter().any(|x| x.is_nan() && x.to_bits() != f64::NAN.to_bits()) {
            let one: Float64Array = floats.unary(|x| if x.is_nan() { f64::NAN } else { x });
            return Arc::new(one);
        }
    } else if let Some(floats) = a.as_primitive_opt::<Float32Type>()
        && floats.values().iter().any(|x| x.is_nan() && x.to_bits() != f32::NAN.to_bits())
    {
        let one: Float32Array = floats.unary(|x| if x.is_nan() { f32::NAN } else { x });
        return Arc::new(one);
    }
    a
}

/// An operation whose NaNs are made the one NaN.
#[derive(Debug)]
struct OneNan {
    inner: Arc<dyn PhysicalExpr>,
}

impl PartialEq for OneNan {
    fn eq(&self, other: &OneNan) -> bool {
        self.inner.as_ref() == other.inner.as_ref()
    }
}

impl Eq for OneNan {}

impl std::hash::Hash for OneNan {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.as_ref().hash(state);
    }
}

impl std::fmt::Display for OneNan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl PhysicalExpr for OneNan {
    fn data_type(&self, schema: &Schema) -> datafusion::common::Result<DataType> {
        self.inner.data_type(schema)
    }

    fn nullable(&self, schema: &Schema) -> datafusion::common::Result<bool> {
        self.inner.nullable(schema)
    }

    fn return_field(&self, schema: &Schema) -> datafusion::common::Result<arrow::datatypes::FieldRef> {
        self.inner.return_field(schema)
    }

    fn evaluate(&self, batch: &arrow::array::RecordBatch) -> datafusion::common::Result<ColumnarValue> {
        Ok(match self.inner.evaluate(batch)? {
            ColumnarValue::Array(a) => ColumnarValue::Array(array(a)),
            ColumnarValue::Scalar(s) => ColumnarValue::Scalar(scalar(s)),
        })
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> datafusion::common::Result<Arc<dyn PhysicalExpr>> {
        let inner = children.into_iter().next().expect("one child");
        Ok(Arc::new(OneNan { inner }))
    }

    fn fmt_sql(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt_sql(f)
    }
}
