//! Chains of one operator (docs/transformations.md#the-language): `a + b - c + ...`, `a * b * c`,
//! `p AND q AND r`, `p OR q OR r`. Parsed, such a chain is a tree as deep as the chain
//! is long, and a tree is evaluated by recursing once per level: a linear score of a
//! thousand terms would take a thousand nested calls on whichever thread computes it,
//! the server's included. A [`Chain`] computes it link by link instead, each link the
//! tree's own binary operation on the value so far and the link's operand, in the tree's
//! order: the same values bit for bit (an overflow, a float rounding, an `AND` or `OR`
//! that skips its right operand where the left decides), in a loop.

use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_expr_common::physical_expr::with_new_children_if_necessary;

/// The column a link reads the value so far from: the last of the batch it is given.
const SO_FAR: &str = "quiver_chain_so_far";

/// Which chain an operator makes: a run of `+` and `-`, of `*`, of `AND` or of `OR`.
/// `/` and `%` are not associative: they nest.
pub(crate) fn group(op: &Operator) -> Option<u8> {
    match op {
        Operator::Plus | Operator::Minus => Some(0),
        Operator::Multiply => Some(1),
        Operator::And => Some(2),
        Operator::Or => Some(3),
        _ => None,
    }
}

fn group_of(e: &Arc<dyn PhysicalExpr>) -> Option<u8> {
    e.downcast_ref::<BinaryExpr>().and_then(|b| group(b.op()))
}

/// Every chain of two links or more in `expr` (over `schema`'s columns) as a [`Chain`];
/// the rest as it is.
pub(crate) fn flatten(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>> {
    let Some(g) = group_of(&expr) else { return flatten_children(expr, schema) };
    // The chain's operations, from its top down its left side.
    let mut spine = vec![Arc::clone(&expr)];
    loop {
        let left = Arc::clone(binary(spine.last().expect("one at least"))?.left());
        if group_of(&left) != Some(g) {
            break;
        }
        spine.push(left);
    }
    if spine.len() < 2 {
        return flatten_children(expr, schema);
    }
    let first = flatten(Arc::clone(binary(spine.last().expect("two at least"))?.left()), schema)?;
    let mut links = Vec::with_capacity(spine.len());
    for node in spine.iter().rev() {
        let operand = flatten(Arc::clone(binary(node)?.right()), schema)?;
        links.push(Link::new(node, operand)?);
    }
    Ok(Arc::new(Chain::new(first, links, schema)?))
}

fn flatten_children(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Arc<dyn PhysicalExpr>> {
    let children = expr.children();
    if children.is_empty() {
        return Ok(expr);
    }
    let flat = children.into_iter().map(|c| flatten(Arc::clone(c), schema)).collect::<Result<Vec<_>>>()?;
    with_new_children_if_necessary(expr, flat)
}

fn binary(e: &Arc<dyn PhysicalExpr>) -> Result<&BinaryExpr> {
    e.downcast_ref::<BinaryExpr>().ok_or_else(|| DataFusionError::Internal("a chain's link is a binary operation".into()))
}

/// A chain of one operator, computed link by link over the value so far.
#[derive(Debug)]
pub(crate) struct Chain {
    first: Arc<dyn PhysicalExpr>,
    links: Vec<Link>,
    /// How each link is evaluated where every row reaches the chain: leniently (a link
    /// that cannot compute some rows, an overflow, gives them null and marks them), by
    /// the evaluator the lenient wrapping hands over. `None`: exactly.
    lenient: Option<PartEvaluator>,
    dtype: DataType,
    nullable: bool,
}

/// Evaluates one part of an expression over a batch (the lenient wrapping's).
pub(crate) type PartEvaluator = fn(Arc<dyn PhysicalExpr>, &RecordBatch) -> Result<ColumnarValue>;

#[derive(Debug, Clone)]
struct Link {
    /// The tree's binary operation, a placeholder on its left where the value so far goes.
    operation: Arc<dyn PhysicalExpr>,
    operand: Arc<dyn PhysicalExpr>,
}

impl Link {
    /// `node`'s operation (a binary expression) with `operand` on its right.
    fn new(node: &Arc<dyn PhysicalExpr>, operand: Arc<dyn PhysicalExpr>) -> Result<Link> {
        let placeholder: Arc<dyn PhysicalExpr> = Arc::new(Column::new(SO_FAR, 0));
        // A binary expression's new children keep its operator and overflow rule.
        let operation = Arc::clone(node).with_new_children(vec![placeholder, Arc::clone(&operand)])?;
        Ok(Link { operation, operand })
    }

    /// The operation reading the value so far from column `at`.
    fn at(&self, at: usize) -> Result<Arc<dyn PhysicalExpr>> {
        let so_far: Arc<dyn PhysicalExpr> = Arc::new(Column::new(SO_FAR, at));
        Arc::clone(&self.operation).with_new_children(vec![so_far, Arc::clone(&self.operand)])
    }

    fn op(&self) -> Operator {
        self.operation.downcast_ref::<BinaryExpr>().map_or(Operator::Plus, |b| *b.op())
    }
}

/// `fields`, then the value so far as `dtype`.
fn with_so_far(fields: &Fields, dtype: &DataType, nullable: bool) -> SchemaRef {
    let mut all: Vec<FieldRef> = fields.iter().cloned().collect();
    all.push(Arc::new(Field::new(SO_FAR, dtype.clone(), nullable)));
    Arc::new(Schema::new(all))
}

impl Chain {
    fn new(first: Arc<dyn PhysicalExpr>, links: Vec<Link>, schema: &SchemaRef) -> Result<Chain> {
        let (mut dtype, mut nullable) = (first.data_type(schema)?, first.nullable(schema)?);
        for link in &links {
            let extended = with_so_far(schema.fields(), &dtype, nullable);
            let operation = link.at(schema.fields().len())?;
            (dtype, nullable) = (operation.data_type(&extended)?, operation.nullable(&extended)?);
        }
        Ok(Chain { first, links, lenient: None, dtype, nullable })
    }

    /// Whether it is a chain of `AND` or `OR`: an operand is computed only for the rows
    /// the value so far does not decide.
    pub(crate) fn chooses(&self) -> bool {
        self.links.first().is_some_and(|l| matches!(l.op(), Operator::And | Operator::Or))
    }

    /// The chain with each operand made by `part`, its links evaluated by `evaluate`
    /// (where every row reaches it: leniently).
    pub(crate) fn leniently(
        &self,
        mut part: impl FnMut(Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>>,
        evaluate: PartEvaluator,
    ) -> Result<Chain> {
        let first = part(Arc::clone(&self.first))?;
        let links = self.links.iter().map(|l| Link::new(&l.operation, part(Arc::clone(&l.operand))?)).collect::<Result<Vec<_>>>()?;
        Ok(Chain { first, links, lenient: Some(evaluate), dtype: self.dtype.clone(), nullable: self.nullable })
    }
}

impl PartialEq for Chain {
    fn eq(&self, other: &Chain) -> bool {
        self.lenient.is_some() == other.lenient.is_some()
            && self.first.as_ref() == other.first.as_ref()
            && self.links.len() == other.links.len()
            && self.links.iter().zip(&other.links).all(|(a, b)| a.operation.as_ref() == b.operation.as_ref())
    }
}

impl Eq for Chain {}

impl std::hash::Hash for Chain {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.lenient.is_some().hash(state);
        self.first.as_ref().hash(state);
        for link in &self.links {
            link.operation.as_ref().hash(state);
        }
    }
}

impl std::fmt::Display for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.first)?;
        for link in &self.links {
            write!(f, " {} {}", link.op(), link.operand)?;
        }
        Ok(())
    }
}

impl PhysicalExpr for Chain {
    fn data_type(&self, _schema: &Schema) -> Result<DataType> {
        Ok(self.dtype.clone())
    }

    fn nullable(&self, _schema: &Schema) -> Result<bool> {
        Ok(self.nullable)
    }

    /// The first operand, then each link over the batch's columns and the value so far
    /// (after them, wherever the batch comes from: a `CASE` evaluates its parts over the
    /// columns they read, another chain's link over its columns and its value so far).
    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let (rows, at) = (batch.num_rows(), batch.num_columns());
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let mut value = self.first.evaluate(batch)?;
        let mut schema: Option<SchemaRef> = None;
        for link in &self.links {
            let so_far = value.into_array(rows)?;
            if schema.as_ref().is_none_or(|s| s.field(at).data_type() != so_far.data_type()) {
                schema = Some(with_so_far(batch.schema_ref().fields(), so_far.data_type(), true));
            }
            let mut columns = batch.columns().to_vec();
            columns.push(so_far);
            let extended = RecordBatch::try_new_with_options(Arc::clone(schema.as_ref().expect("set above")), columns, &options)?;
            let operation = link.at(at)?;
            value = match self.lenient {
                Some(evaluate) => evaluate(operation, &extended)?,
                None => operation.evaluate(&extended)?,
            };
        }
        Ok(value)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        std::iter::once(&self.first).chain(self.links.iter().map(|l| &l.operand)).collect()
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        let mut children = children.into_iter();
        let first = children.next().ok_or_else(|| DataFusionError::Internal("a chain's first operand".into()))?;
        let links = self.links.iter().zip(children).map(|(l, operand)| Link::new(&l.operation, operand)).collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Chain { first, links, lenient: self.lenient, dtype: self.dtype.clone(), nullable: self.nullable }))
    }

    fn fmt_sql(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.first.fmt_sql(f)?;
        for link in &self.links {
            write!(f, " {} ", link.op())?;
            link.operand.fmt_sql(f)?;
        }
        Ok(())
    }
}
