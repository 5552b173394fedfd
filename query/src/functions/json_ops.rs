//! Postgres' JSON operators in SQL: `json -> key_or_index` gives the value as JSON text and
//! `json ->> key_or_index` as text (a string without its quotes, JSON `null` as NULL), on any
//! JSON text column (`events.args`, `runs.metadata`). They chain left to right
//! (`args -> 'a' -> 0 ->> 'b'`). An expression planner turns them into calls of
//! `json_get_json` (`->`) and `json_get` (`->>`) ([`super::json`]), a chain into one call with
//! the whole path, so the text is parsed once per row.
//!
//! As in Postgres they bind tighter than comparisons, `LIKE`, `IS`, `IN` and `BETWEEN`
//! (`args ->> 'name' = 'x'` compares the name). The SQL parser's generic dialect ranks them
//! below those, so the planner regroups what it parsed as `args ->> ('name' = 'x')`: a test
//! (a boolean) is never a key or an index, so the regrouping changes no meaningful query.

use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::expr::{BinaryExpr, ScalarFunction};
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::sqlparser::ast::BinaryOperator;
use datafusion::logical_expr::{Expr, Operator, ScalarUDF};
use std::sync::Arc;

/// Plans `->` and `->>`; other operators go on to DataFusion's own planning.
#[derive(Debug, Default)]
pub struct JsonOperators;

/// What an operator gives: the value as JSON text (`->`) or as text (`->>`).
#[derive(Debug, Clone, Copy)]
enum Access {
    Json,
    Text,
}

impl ExprPlanner for JsonOperators {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        _schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let access = match expr.op {
            BinaryOperator::Arrow => Access::Json,
            BinaryOperator::LongArrow => Access::Text,
            _ => return Ok(PlannerResult::Original(expr)),
        };
        Ok(PlannerResult::Planned(regroup(
            access, expr.left, expr.right,
        )))
    }
}

/// Comparisons and pattern tests, which Postgres ranks below `->` and `->>`.
fn is_test(op: Operator) -> bool {
    matches!(
        op,
        Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq
            | Operator::IsDistinctFrom
            | Operator::IsNotDistinctFrom
            | Operator::RegexMatch
            | Operator::RegexIMatch
            | Operator::RegexNotMatch
            | Operator::RegexNotIMatch
            | Operator::LikeMatch
            | Operator::ILikeMatch
            | Operator::NotLikeMatch
            | Operator::NotILikeMatch
    )
}

/// `left OP right`, with a test that the parser grouped into an operand moved outside:
/// `a OP (k = v)` becomes `(a OP k) = v`, and `(v = a) OP k` becomes `v = (a OP k)`.
fn regroup(access: Access, left: Expr, right: Expr) -> Expr {
    let inner = |key: Expr| Box::new(regroup(access, left.clone(), key));
    match right {
        Expr::BinaryExpr(BinaryExpr {
            left: k,
            op,
            right: v,
        }) if is_test(op) => return Expr::BinaryExpr(BinaryExpr::new(inner(*k), op, v)),
        Expr::Like(mut like) => {
            like.expr = inner(*like.expr);
            return Expr::Like(like);
        }
        Expr::SimilarTo(mut like) => {
            like.expr = inner(*like.expr);
            return Expr::SimilarTo(like);
        }
        Expr::Between(mut between) => {
            between.expr = inner(*between.expr);
            return Expr::Between(between);
        }
        Expr::InList(mut list) => {
            list.expr = inner(*list.expr);
            return Expr::InList(list);
        }
        Expr::IsNull(k) => return Expr::IsNull(inner(*k)),
        Expr::IsNotNull(k) => return Expr::IsNotNull(inner(*k)),
        Expr::IsTrue(k) => return Expr::IsTrue(inner(*k)),
        Expr::IsFalse(k) => return Expr::IsFalse(inner(*k)),
        Expr::IsUnknown(k) => return Expr::IsUnknown(inner(*k)),
        Expr::IsNotTrue(k) => return Expr::IsNotTrue(inner(*k)),
        Expr::IsNotFalse(k) => return Expr::IsNotFalse(inner(*k)),
        Expr::IsNotUnknown(k) => return Expr::IsNotUnknown(inner(*k)),
        _ => {}
    }
    let outer = |json: Expr| Box::new(regroup(access, json, right.clone()));
    match left {
        Expr::BinaryExpr(BinaryExpr {
            left: v,
            op,
            right: a,
        }) if is_test(op) => Expr::BinaryExpr(BinaryExpr::new(v, op, outer(*a))),
        Expr::Like(mut like) => {
            like.pattern = outer(*like.pattern);
            Expr::Like(like)
        }
        Expr::SimilarTo(mut like) => {
            like.pattern = outer(*like.pattern);
            Expr::SimilarTo(like)
        }
        Expr::Between(mut between) => {
            between.high = outer(*between.high);
            Expr::Between(between)
        }
        left => call(access, left, right),
    }
}

/// The function call for `json OP key`; `a -> 'x'` on the left (planned already as
/// `json_get_json(a, 'x')`) gets its path extended instead of its result parsed again.
fn call(access: Access, json: Expr, key: Expr) -> Expr {
    let (func, symbol) = match access {
        Access::Json => (ScalarUDF::from(super::json::JsonGetJson::new()), "->"),
        Access::Text => (ScalarUDF::from(super::json::JsonGet::new()), "->>"),
    };
    let name = format!("{} {symbol} {key}", display(&json));
    let mut args = match json.unalias() {
        Expr::ScalarFunction(f) if f.func.name() == "json_get_json" => f.args,
        json => vec![json],
    };
    args.push(key);
    Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(func), args)).alias(name)
}

/// How an operand shows in a column name: a chain by the name it was given.
fn display(e: &Expr) -> String {
    match e {
        Expr::Alias(a) => a.name.clone(),
        other => other.to_string(),
    }
}
