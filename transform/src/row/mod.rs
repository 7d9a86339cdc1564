//! The row evaluator (docs/transformations.md#which-evaluator-runs-where): a
//! [`Program`](crate::Program)'s outputs computed for one row at a time, from the same
//! checked plan the vectorized path runs — the same parse, language check, type check and
//! rewrites, compiled from the same physical expression — without an Arrow array per
//! operator. A lookup of a few entities costs what its operations cost, not what
//! building a batch costs.
//!
//! Each operation of the plan becomes a [`Node`]. The operations a request's features
//! spend their time in are computed here, by the very functions Arrow's kernels apply
//! to each element (`ArrowNativeTypeOp`'s checked integer arithmetic and total float
//! order, `str::to_uppercase`): column reads, literals, arithmetic and comparisons of
//! one type (floats compared with -0.0 as 0.0, as DataFusion's operators do),
//! `AND`/`OR`/`NOT`, `IS [NOT] NULL`, `CASE` (and so `COALESCE`), `IN` over items that
//! are not all constant, the numeric widenings, float division, `nullif` and
//! `upper`/`lower`. A NaN any of them computes is the one NaN (`canonical`), as in the
//! vectorized plan. Every other operation is
//! computed by its own DataFusion code over a one-row batch holding its operands'
//! values, its literal operands kept literal: the code the vectorized path runs, on the
//! row's values (an `IN` list DataFusion planned as a set of constants: by its code over
//! the whole row). Nothing is parsed again and no construct is left out: a plan that
//! holds an operation this module does not know is refused when it is compiled.
//!
//! A row whose value cannot be computed (division by zero, overflow, an invalid cast)
//! is null and counted, as the vectorized path makes it: that path gives every row the
//! value it gets when computed alone, which is what this one computes. `AND`, `OR` and
//! `CASE` compute an operand only for a row that needs it, and `IN` stops at the first
//! equal item, as DataFusion does for a row alone. The differential fuzzer
//! (`row_fuzz.rs`) holds the two equal.

use std::borrow::Cow;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal, NegativeExpr, NotExpr,
};

use crate::{canonical, chain};

mod cell;
mod typed;
mod values;

pub(crate) use cell::{Cell, Computed, Failed};
pub(crate) use typed::Typed;
use values::{arithmetic, compare, is_comparison, is_true, of_type, one_nan, widen, widens};
pub(crate) use values::{declared, null_of};

/// One operation of an output's plan, for one row.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Column(usize),
    Literal(ScalarValue),
    Binary(Box<Binary>),
    /// A chain of one operator (`a + b - c + ...`, `p AND q AND r`) computed link by
    /// link over the value so far, in the plan's order: no recursion per link.
    Chain {
        first: Box<Node>,
        links: Vec<Binary>,
    },
    Not(Box<Node>),
    IsNull(Box<Node>),
    IsNotNull(Box<Node>),
    Case(Box<Case>),
    /// A cast between numeric types that Arrow computes with `as` (an integer to a wider
    /// one or to a float, float32 to float64) or a duration's count: exact, never fails.
    Widen {
        input: Box<Node>,
        to: DataType,
    },
    /// Float `/` or `%` that fails on a zero divisor (the plan's `quiver_float_*`).
    FloatDivision {
        remainder: bool,
        left: Box<Node>,
        right: Box<Node>,
    },
    /// `upper` or `lower` of a string.
    Letters {
        upper: bool,
        input: Box<Node>,
    },
    /// `nullif(a, b)`: null where `a = b` (Arrow's order: -0.0 is not 0.0), else `a`;
    /// its own code for types not compared here.
    NullIf {
        left: Box<Node>,
        right: Box<Node>,
        own: Box<Own>,
    },
    /// `x [NOT] IN (...)` over items that are not all constant, which DataFusion computes
    /// item by item, stopping at the first equal.
    InList(Box<InList>),
    /// Any other operation: computed by its own code over a one-row batch.
    Own(Box<Own>),
    /// An operation (and its operands) computed by DataFusion's code over the whole row.
    Whole(Box<Whole>),
}

#[derive(Debug, Clone)]
pub(crate) struct Binary {
    /// Integer `+`, `-` and `*` fail on overflow: the plan's rule for every operation.
    op: Operator,
    left: Node,
    right: Node,
    /// The plan's operation, for operand types computed by its own code.
    own: Own,
}

#[derive(Debug, Clone)]
pub(crate) struct Case {
    base: Option<Node>,
    /// Each `WHEN` and its `THEN`, with (a `CASE` with a base) `base = when` computed
    /// by DataFusion's code, for types not compared here.
    whens: Vec<(Node, Node, Option<Own>)>,
    otherwise: Option<Node>,
    /// The case's type: a branch of another is cast to it, as DataFusion does.
    dtype: DataType,
    /// The null of the case's type, when no branch is taken and there is no `ELSE`.
    null: ScalarValue,
}

#[derive(Debug, Clone)]
pub(crate) struct InList {
    value: Node,
    /// Each item, with `value = item` by DataFusion's code for types not compared here.
    items: Vec<(Node, Own)>,
    negated: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Whole {
    expr: Arc<dyn PhysicalExpr>,
    /// The program's input.
    schema: SchemaRef,
}

impl Whole {
    #[inline(never)]
    fn evaluate(&self, row: &[ScalarValue]) -> Computed<ScalarValue> {
        let columns = row.iter().map(|v| v.to_array_of_size(1)).collect::<Result<Vec<ArrayRef>>>()?;
        let batch =
            RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &RecordBatchOptions::new().with_row_count(Some(1)))?;
        Ok(canonical::scalar(match self.expr.evaluate(&batch)? {
            ColumnarValue::Scalar(s) => s,
            ColumnarValue::Array(a) => ScalarValue::try_from_array(&a, 0)?,
        }))
    }
}

/// An operation computed by its own DataFusion code: its operands that are not literals
/// read from the columns of a one-row batch.
#[derive(Debug, Clone)]
pub(crate) struct Own {
    expr: Arc<dyn PhysicalExpr>,
    /// Per operand of the operation: whether it is read from the batch (else it is a
    /// literal, kept in the operation as the vectorized path keeps it).
    read: Vec<bool>,
    /// The operands read, compiled (when this node computes them itself), in the
    /// batch's column order.
    operands: Vec<Node>,
    schema: SchemaRef,
}

/// Compiling's result: an `Err` names what cannot be compiled.
type Result<T> = std::result::Result<T, DataFusionError>;

/// Compiles `expr` (a plan over `schema`, before its chains and lenient parts are
/// wrapped) for one row at a time.
///
/// # Errors
/// An operation this evaluator does not know, naming it.
pub(crate) fn compile(expr: &Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Node> {
    // Every node makes the NaNs it computes the one NaN itself.
    let expr = canonical::unwrapped(expr);
    // A chain of one operator, walked down its left side without recursing.
    if let Some(b) = expr.downcast_ref::<BinaryExpr>()
        && let Some(g) = chain::group(b.op())
    {
        let mut spine = vec![Arc::clone(expr)];
        loop {
            let left = Arc::clone(canonical::unwrapped(
                spine.last().and_then(|e| e.downcast_ref::<BinaryExpr>()).expect("a binary operation").left(),
            ));
            if left.downcast_ref::<BinaryExpr>().and_then(|l| chain::group(l.op())) != Some(g) {
                break;
            }
            spine.push(left);
        }
        if spine.len() >= 2 {
            let last = spine.last().and_then(|e| e.downcast_ref::<BinaryExpr>()).expect("a binary operation");
            let first = compile(canonical::unwrapped(last.left()), schema)?;
            let links = spine
                .iter()
                .rev()
                .map(|e| {
                    let b = e.downcast_ref::<BinaryExpr>().expect("a binary operation");
                    binary(e, b, Node::Literal(ScalarValue::Null), schema)
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(Node::Chain { first: Box::new(first), links });
        }
    }
    if let Some(c) = expr.downcast_ref::<Column>() {
        return Ok(Node::Column(c.index()));
    }
    if let Some(l) = expr.downcast_ref::<Literal>() {
        // As the vectorized plan folds a constant: its NaN the one NaN.
        return Ok(Node::Literal(canonical::scalar(l.value().clone())));
    }
    if let Some(b) = expr.downcast_ref::<BinaryExpr>() {
        let left = compile(b.left(), schema)?;
        return Ok(Node::Binary(Box::new(binary(expr, b, left, schema)?)));
    }
    if let Some(n) = expr.downcast_ref::<NotExpr>() {
        return Ok(Node::Not(Box::new(compile(n.arg(), schema)?)));
    }
    if let Some(n) = expr.downcast_ref::<IsNullExpr>() {
        return Ok(Node::IsNull(Box::new(compile(n.arg(), schema)?)));
    }
    if let Some(n) = expr.downcast_ref::<IsNotNullExpr>() {
        return Ok(Node::IsNotNull(Box::new(compile(n.arg(), schema)?)));
    }
    if let Some(c) = expr.downcast_ref::<CaseExpr>() {
        let base = c.expr().map(|b| compile(b, schema)).transpose()?;
        let whens = c
            .when_then_expr()
            .iter()
            .map(|(w, t)| {
                let equal = match c.expr() {
                    Some(b) => {
                        let eq: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(Arc::clone(b), Operator::Eq, Arc::clone(w)));
                        Some(own(&eq, schema, false)?)
                    }
                    None => None,
                };
                Ok((compile(w, schema)?, compile(t, schema)?, equal))
            })
            .collect::<Result<Vec<_>>>()?;
        let otherwise = c.else_expr().map(|e| compile(e, schema)).transpose()?;
        let dtype = expr.data_type(schema)?;
        let null = null_of(&dtype);
        return Ok(Node::Case(Box::new(Case { base, whens, otherwise, dtype, null })));
    }
    if let Some(c) = expr.downcast_ref::<CastExpr>() {
        let from = c.expr().data_type(schema)?;
        if widens(&from, c.cast_type()) {
            return Ok(Node::Widen { input: Box::new(compile(c.expr(), schema)?), to: c.cast_type().clone() });
        }
        return Ok(Node::Own(Box::new(own(expr, schema, true)?)));
    }
    if let Some(f) = expr.downcast_ref::<ScalarFunctionExpr>() {
        let args = f.args();
        let input = |i: usize| compile(&args[i], schema).map(Box::new);
        match f.name() {
            "quiver_float_division" | "quiver_float_remainder" if args.len() == 2 => {
                return Ok(Node::FloatDivision { remainder: f.name() == "quiver_float_remainder", left: input(0)?, right: input(1)? });
            }
            "nullif" if args.len() == 2 => {
                let own = Box::new(own(expr, schema, false)?);
                return Ok(Node::NullIf { left: input(0)?, right: input(1)?, own });
            }
            "upper" | "lower" if args.len() == 1 && args[0].data_type(schema)? == DataType::Utf8 => {
                return Ok(Node::Letters { upper: f.name() == "upper", input: input(0)? });
            }
            _ => return Ok(Node::Own(Box::new(own(expr, schema, true)?))),
        }
    }
    if let Some(list) = expr.downcast_ref::<InListExpr>() {
        return in_list(expr, list, schema);
    }
    let known = expr.downcast_ref::<NegativeExpr>().is_some() || expr.downcast_ref::<LikeExpr>().is_some();
    if known {
        return Ok(Node::Own(Box::new(own(expr, schema, true)?)));
    }
    Err(DataFusionError::NotImplemented(format!("the row evaluator has no operation `{expr}`")))
}

/// `x [NOT] IN (...)`: with items that are all constant (DataFusion then looks the value
/// up in a set of them) by its own code; else item by item.
fn in_list(expr: &Arc<dyn PhysicalExpr>, list: &InListExpr, schema: &SchemaRef) -> Result<Node> {
    // DataFusion's test for a constant list: every item computes a value without a row,
    // and the values make one array.
    let empty = RecordBatch::new_empty(Arc::clone(schema));
    let scalars: Option<Vec<ScalarValue>> = list
        .list()
        .iter()
        .map(|item| match item.evaluate(&empty) {
            Ok(ColumnarValue::Scalar(ScalarValue::Dictionary(_, v))) => Some(*v),
            Ok(ColumnarValue::Scalar(v)) => Some(v),
            _ => None,
        })
        .collect();
    let constant = scalars.is_some_and(|s| ScalarValue::iter_to_array(s).is_ok());
    let value_type = list.expr().data_type(schema)?;
    if constant {
        // DataFusion looks the value up in a set it built of the items when it planned
        // the list (its test above): the whole operation by its own code, over the row.
        return Ok(Node::Whole(Box::new(Whole { expr: Arc::clone(expr), schema: Arc::clone(schema) })));
    }
    let items = list
        .list()
        .iter()
        .map(|item| {
            let fields = vec![Field::new("value", value_type.clone(), true), Field::new("item", item.data_type(schema)?, true)];
            let pair = Arc::new(Schema::new(fields));
            let (value, one): (Arc<dyn PhysicalExpr>, Arc<dyn PhysicalExpr>) =
                (Arc::new(Column::new("value", 0)), Arc::new(Column::new("item", 1)));
            let equal: Arc<dyn PhysicalExpr> = Arc::new(InListExpr::try_new(value, vec![one], false, &pair)?);
            Ok((compile(item, schema)?, Own { expr: equal, read: vec![true, true], operands: Vec::new(), schema: pair }))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Node::InList(Box::new(InList { value: compile(list.expr(), schema)?, items, negated: list.negated() })))
}

impl InList {
    #[inline(never)]
    fn evaluate<'a>(&'a self, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
        let value = self.value.evaluate(row)?;
        let mut found: Option<bool> = Some(false);
        for (k, (item, equal)) in self.items.iter().enumerate() {
            // Every row already found: the rest is not computed.
            if k > 0 && found == Some(true) {
                break;
            }
            let item = item.evaluate(row)?;
            let same = if value.is_null() || item.is_null() {
                None
            } else {
                match compare(Operator::Eq, &value, &item, false) {
                    Some(Cell::Bool(b)) => b,
                    _ => match equal.apply_read(vec![value.clone().into_scalar(), item.into_scalar()])? {
                        ScalarValue::Boolean(b) => b,
                        _ => return Err(Failed),
                    },
                }
            };
            found = match (found, same) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (None, _) | (_, None) => None,
                _ => Some(false),
            };
        }
        Ok(Cell::Bool(if self.negated { found.map(|f| !f) } else { found }))
    }
}

/// `b` (the plan's node `e`) with its left operand already compiled as `left`.
fn binary(e: &Arc<dyn PhysicalExpr>, b: &BinaryExpr, left: Node, schema: &SchemaRef) -> Result<Binary> {
    let right = compile(b.right(), schema)?;
    Ok(Binary { op: *b.op(), left, right, own: own(e, schema, false)? })
}

/// `expr` to be computed by its own code over a one-row batch: each operand that is
/// not a literal read from a column of it. With `compile_operands`, the operands are
/// compiled here; else the caller computes them (a binary operation's two, a case's
/// base and value) and gives them in order.
fn own(expr: &Arc<dyn PhysicalExpr>, schema: &SchemaRef, compile_operands: bool) -> Result<Own> {
    let mut operands = Vec::new();
    let mut fields = Vec::new();
    let mut children = Vec::new();
    let mut read = Vec::new();
    for (i, child) in expr.children().into_iter().enumerate() {
        read.push(child.downcast_ref::<Literal>().is_none());
        if child.downcast_ref::<Literal>().is_some() {
            children.push(Arc::clone(child));
            continue;
        }
        let at = fields.len();
        fields.push(Field::new(format!("operand_{i}"), child.data_type(schema)?, true));
        children.push(Arc::new(Column::new(&format!("operand_{i}"), at)) as Arc<dyn PhysicalExpr>);
        if compile_operands {
            operands.push(compile(child, schema)?);
        }
    }
    let expr = if children.is_empty() { Arc::clone(expr) } else { Arc::clone(expr).with_new_children(children)? };
    Ok(Own { expr, read, operands, schema: Arc::new(Schema::new(fields)) })
}

impl Own {
    /// Computes the operation for one row whose operands are `values`, every operand in
    /// order (those kept literal are passed over).
    fn apply(&self, values: Vec<ScalarValue>) -> Computed<ScalarValue> {
        let read = values.into_iter().zip(&self.read).filter(|(_, r)| **r).map(|(v, _)| v).collect();
        self.apply_read(read)
    }

    /// Computes the operation for one row whose operands read from the batch are
    /// `values`, in order.
    fn apply_read(&self, values: Vec<ScalarValue>) -> Computed<ScalarValue> {
        let columns = values.iter().map(|v| v.to_array_of_size(1)).collect::<Result<Vec<ArrayRef>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(1));
        let batch = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?;
        // Any NaN it computes is the one NaN, as in the vectorized plan.
        Ok(canonical::scalar(match self.expr.evaluate(&batch)? {
            ColumnarValue::Scalar(s) => s,
            ColumnarValue::Array(a) => ScalarValue::try_from_array(&a, 0)?,
        }))
    }

    #[inline(never)]
    fn evaluate(&self, row: &[ScalarValue]) -> Computed<ScalarValue> {
        let values = self.operands.iter().map(|o| o.evaluate(row).map(Cell::into_scalar)).collect::<Computed<Vec<_>>>()?;
        self.apply_read(values)
    }
}

impl Node {
    /// The value of this operation for `row` (one value per input column): a value
    /// of the row or the plan passed on borrowed (a column, a literal, the branch a
    /// `CASE` takes).
    ///
    /// # Errors
    /// When the row's value cannot be computed.
    #[inline(always)]
    pub(crate) fn evaluate<'a>(&'a self, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
        // A column or a literal (most operands) read where it is used, not by a call.
        match self {
            Node::Column(i) => Ok(Cell::of(&row[*i])),
            Node::Literal(v) => Ok(Cell::of(v)),
            _ => self.compute(row),
        }
    }

    /// [`Node::evaluate`] of an operation.
    #[inline(never)]
    fn compute<'a>(&'a self, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
        match self {
            Node::Column(i) => Ok(Cell::of(&row[*i])),
            Node::Literal(v) => Ok(Cell::of(v)),
            Node::Binary(b) => {
                let left = b.left.evaluate(row)?;
                b.apply(left, row)
            }
            Node::Chain { first, links } => {
                let mut so_far = first.evaluate(row)?;
                for link in links {
                    so_far = link.apply(so_far, row)?;
                }
                Ok(so_far)
            }
            Node::Not(n) => match n.evaluate(row)?.boolean() {
                Some(b) => Ok(Cell::Bool(b.map(|b| !b))),
                None => Err(Failed),
            },
            Node::IsNull(n) => Ok(Cell::Bool(Some(n.evaluate(row)?.is_null()))),
            Node::IsNotNull(n) => Ok(Cell::Bool(Some(!n.evaluate(row)?.is_null()))),
            Node::Case(c) => c.evaluate(row),
            Node::Widen { input, to } => Ok(one_nan(widen(input.evaluate(row)?, to)?)),
            Node::FloatDivision { remainder, left, right } => float_division(*remainder, left, right, row),
            Node::Letters { upper, input } => letters(*upper, input, row),
            Node::NullIf { left, right, own } => null_if(left, right, own, row),
            Node::InList(list) => list.evaluate(row),
            Node::Own(o) => Ok(Cell::owned(o.evaluate(row)?)),
            Node::Whole(w) => Ok(Cell::owned(w.evaluate(row)?)),
        }
    }
}

/// Float `/` or `%` that fails on a zero divisor. (Each operation but the commonest
/// is a function of its own, out of line: [`Node::evaluate`] stays small, and so does
/// what each call of it costs.)
#[inline(never)]
fn float_division<'a>(remainder: bool, left: &'a Node, right: &'a Node, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
    match (left.evaluate(row)?, right.evaluate(row)?) {
        (Cell::F64(Some(x)), Cell::F64(Some(y))) => {
            if y == 0.0 {
                return Err(Failed);
            }
            Ok(one_nan(Cell::F64(Some(if remainder { x % y } else { x / y }))))
        }
        (Cell::F64(_), Cell::F64(_)) => Ok(Cell::F64(None)),
        _ => Err(Failed),
    }
}

#[inline(never)]
fn letters<'a>(upper: bool, input: &'a Node, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
    match input.evaluate(row)? {
        Cell::Str(s) => Ok(Cell::Str(s.map(|s| Cow::Owned(values::letters(&s, upper))))),
        _ => Err(Failed),
    }
}

#[inline(never)]
fn null_if<'a>(left: &'a Node, right: &'a Node, own: &Own, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
    let (a, b) = (left.evaluate(row)?, right.evaluate(row)?);
    // The value passed on is a NaN it computes, as the vectorized plan takes it.
    if a.is_null() || b.is_null() {
        return Ok(one_nan(a));
    }
    match compare(Operator::Eq, &a, &b, false) {
        Some(Cell::Bool(Some(true))) => Ok(a.null()),
        Some(_) => Ok(one_nan(a)),
        None => Ok(Cell::owned(own.apply(vec![a.into_scalar(), b.into_scalar()])?)),
    }
}

impl Case {
    #[inline(never)]
    fn evaluate<'a>(&'a self, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
        let value = self.branch(row)?;
        if of_type(&value, &self.dtype) {
            return Ok(value);
        }
        if value.is_untyped_null() {
            return Ok(Cell::of(&self.null));
        }
        match ColumnarValue::Scalar(value.into_scalar()).cast_to(&self.dtype, None)? {
            ColumnarValue::Scalar(v) => Ok(Cell::owned(v)),
            ColumnarValue::Array(a) => Ok(Cell::owned(ScalarValue::try_from_array(&a, 0)?)),
        }
    }

    /// The value of the branch the row takes.
    fn branch<'a>(&'a self, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
        let base = self.base.as_ref().map(|b| b.evaluate(row)).transpose()?;
        // A null base matches no `WHEN`, which DataFusion then does not compute.
        if base.as_ref().is_some_and(Cell::is_null) {
            return match &self.otherwise {
                Some(e) => e.evaluate(row),
                None => Ok(Cell::of(&self.null)),
            };
        }
        for (when, then, equal) in &self.whens {
            let w = when.evaluate(row)?;
            let taken = match (&base, equal) {
                // `CASE x WHEN v`: x = v; a null on either side never matches.
                (Some(b), Some(equal)) => {
                    !w.is_null()
                        && match compare(Operator::Eq, b, &w, false) {
                            Some(v) => is_true(&v),
                            None => {
                                matches!(equal.apply(vec![b.clone().into_scalar(), w.into_scalar()])?, ScalarValue::Boolean(Some(true)))
                            }
                        }
                }
                _ => is_true(&w),
            };
            if taken {
                return then.evaluate(row);
            }
        }
        match &self.otherwise {
            Some(e) => e.evaluate(row),
            None => Ok(Cell::of(&self.null)),
        }
    }
}

impl Binary {
    /// This operation on `left` (computed) and its right operand, for `row`.
    fn apply<'a>(&'a self, left: Cell<'a>, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
        match self.op {
            // The right operand only where the left does not decide (DataFusion's
            // short circuit for a row alone).
            Operator::And | Operator::Or => self.logical(&left, row),
            op => {
                let right = self.right.evaluate(row)?;
                let native = if is_comparison(op) { compare(op, &left, &right, true).map(Ok) } else { arithmetic(op, &left, &right) };
                // Any NaN it computes is the one NaN, as in the vectorized plan.
                match native {
                    Some(v) => Ok(one_nan(v?)),
                    None => self.by_own_code(left, right),
                }
            }
        }
    }

    /// `AND` or `OR`, Kleene's logic.
    #[inline(never)]
    fn logical<'a>(&'a self, left: &Cell<'a>, row: &'a [ScalarValue]) -> Computed<Cell<'a>> {
        let and = self.op == Operator::And;
        let l = left.boolean().ok_or(Failed)?;
        if l == Some(!and) {
            return Ok(Cell::Bool(l));
        }
        let r = self.right.evaluate(row)?.boolean().ok_or(Failed)?;
        if l == Some(and) {
            return Ok(Cell::Bool(r));
        }
        // The left is null.
        Ok(Cell::Bool(match (and, r) {
            (true, Some(false)) => Some(false),
            (false, Some(true)) => Some(true),
            _ => None,
        }))
    }

    #[inline(never)]
    fn by_own_code<'a>(&self, left: Cell<'a>, right: Cell<'a>) -> Computed<Cell<'a>> {
        Ok(Cell::owned(self.own.apply(vec![left.into_scalar(), right.into_scalar()])?))
    }
}
